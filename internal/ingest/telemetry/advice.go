package telemetry

import (
	"context"
	"fmt"
	"time"

	"github.com/hapilot/hapilot/haproxy"
)

// pathCost is what one telemetry path cost HAProxy in hapilot's own
// benchmarks (docs/lab/telemetry-cost.md, "Cost per HAProxy version", with the
// commands that printed them): its CPU per response as a multiple of a
// plain HAProxy's, on HAProxy before 3.1 (2.6 and 3.0: SPOE as one applet
// per connection) and from 3.1 on (SPOE rewritten over a multiplexer,
// with a stream of its own for every message), and how long the rules
// took to isolate the paper fault through it.
type pathCost struct {
	name, how     string
	before31, v31 float64
	isolated      time.Duration
}

// pathCosts are the paths the advice compares, from the most detail to
// the least; the figures are docs/lab/telemetry-cost.md's, rounded to two places:
// the CPU the median of three runs of `make bench-overhead-matrix` (before
// 3.1, the dearer median of 2.6's and 3.0's), since one run's noise is
// about ±0.07 and the dearest run would let it decide; the isolation the
// slower of two runs of `bench --telemetry` on 3.2 (docs/lab/results/spoe26).
var pathCosts = []pathCost{
	{"spoe", "SPOE (examples/haproxy.cfg)", 1.22, 1.80, 3600 * time.Millisecond},
	{"spoe-sampled", "sampled SPOE, k=16 (examples/haproxy-sampled.cfg)", 1.08, 1.14, 4500 * time.Millisecond},
	{"ring", "the ring (examples/haproxy-syslog-ring.cfg with --syslog-listen abns@hapilot-ring)", 1.12, 1.21, 4100 * time.Millisecond},
	{"stats", "HAProxy's counters alone (no stanza: --spoe-listen off)", 1.00, 1.02, 4100 * time.Millisecond},
}

// The advice's thresholds, the issue's own bars (issue 26): a path is
// worth advising against past AdviseAbove times plain HAProxy's CPU, for
// one costing at most CheapAtMost that isolates the paper fault within
// SameDetection of it.
const (
	AdviseAbove   = 1.35
	CheapAtMost   = 1.10
	SameDetection = time.Second
)

func (p pathCost) on(v haproxy.Version) float64 {
	if v.AtLeast(3, 1) {
		return p.v31
	}
	return p.before31
}

// Advice is the one line the agent logs when the telemetry path
// in use costs the running HAProxy more than AdviseAbove its plain CPU
// while another costs at most CheapAtMost and isolates the paper fault
// within SameDetection of it; "" otherwise, or for a path or version it
// does not know.
func Advice(version, path string) string {
	v, ok := haproxy.ParseVersion(version)
	if !ok {
		return ""
	}
	var cur *pathCost
	for i := range pathCosts {
		if pathCosts[i].name == path {
			cur = &pathCosts[i]
		}
	}
	if cur == nil || cur.on(v) <= AdviseAbove {
		return ""
	}
	// pathCosts runs from the most detail to the least: the first cheap
	// path that detects as fast is the one to name.
	var best *pathCost
	for i := range pathCosts {
		p := &pathCosts[i]
		if p != cur && p.on(v) <= CheapAtMost && p.isolated <= cur.isolated+SameDetection {
			best = p
			break
		}
	}
	if best == nil {
		return ""
	}
	return fmt.Sprintf("telemetry: %s costs HAProxy %s about %.2fx a plain HAProxy's CPU per response in hapilot's benchmark, "+
		"where %s costs %.2fx and isolated the paper fault %.1f s after it; docs/lab/telemetry-cost.md#cost-per-haproxy-version has the figures per version",
		cur.how, v, cur.on(v), best.how, best.on(v), (best.isolated - cur.isolated).Seconds())
}

// SPOEPath names the SPOE stanza in use from what the agent received:
// "spoe-sampled" once a message carried a sample above 1, "spoe" once
// messages came without, "" before any.
func SPOEPath(events, sampled uint64) string {
	switch {
	case sampled > 0:
		return "spoe-sampled"
	case events > 0:
		return "spoe"
	}
	return ""
}

// AdviceEvery is how often the agent looks again for telemetry advice
// until it has given it.
const AdviceEvery = 30 * time.Second

// InfoSource is a runtime socket's `show info`: the HAProxy version the
// advice is for.
type InfoSource interface {
	ShowInfo(ctx context.Context) (haproxy.Info, error)
}

// AdviceNow is the advice for what the agent receives now and the
// HAProxy versions its sockets report; "" when there is none (yet).
func (p *Paths) AdviceNow(ctx context.Context) string {
	path := SPOEPath(p.SPOE.Counters.Events.Load(), p.SPOE.Counters.Sampled.Load())
	if path == "" {
		return ""
	}
	for _, c := range p.Runtimes {
		ictx, cancel := context.WithTimeout(ctx, 3*time.Second)
		info, err := c.ShowInfo(ictx)
		cancel()
		if err != nil {
			continue
		}
		if a := Advice(info.Version, path); a != "" {
			return a
		}
	}
	return ""
}

// Advise looks every p.AdviceEvery (AdviceEvery by default) for advice;
// the first it finds is logged once and kept for /status and the live
// page (Advised) from then on.
func (p *Paths) Advise(ctx context.Context) error {
	every := p.AdviceEvery
	if every <= 0 {
		every = AdviceEvery
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if a := p.AdviceNow(ctx); a != "" {
			p.advice.Store(&a)
			p.Log.Warn().Msg(a)
			return nil
		}
	}
}

// Advised is the advice Advise gave, "" before any.
func (p *Paths) Advised() string {
	if a := p.advice.Load(); a != nil {
		return *a
	}
	return ""
}
