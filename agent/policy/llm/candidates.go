package llm

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
)

// The candidates are what the model is asked about: the servers the
// rules cannot decide alone. Their errors come from the rules' own test,
// the sequential one that --policy rules and the floor drain on, run at
// a looser threshold (CandidateARLDays): a server whose evidence has
// risen that far, and which the floor does not drain, is in the grey
// zone. Latency and overload are flagged on the windows, as before.

// CandidateARLDays is the candidates' test's mean time between false
// alarms per server, in days: a healthy server is a candidate about once
// a day, and the threshold h is about two thirds of the rules' own at
// their default (ln(86400)+ln 4 = 12.7 against 19.7 for 1,000 days).
const CandidateARLDays = 1

// CandidateHold is how long a server the candidates' test flagged stays
// a candidate. A CUSUM at its threshold dips below it at each second
// without an error, and a fault in the grey zone has many: without the
// hold, a candidate would come and go from one step to the next, and no
// proposal of the model's would be confirmed.
const CandidateHold = 30 * time.Second

// flag is what the candidates' test last said of a server.
type flag struct {
	at         time.Time
	why, brief string
}

// candidateConfig is the operator's rules relaxed to find the grey zone:
// the same test and regions, the threshold at CandidateARLDays (never
// above the operator's), no latency test (the suspects' own signal
// finds latency), and no zone memory: a server in the zone stays a
// candidate while its evidence holds, where the rules leave it alone.
func candidateConfig(rc rules.Config) rules.Config {
	c := rc
	c.ARLDays = min(rc.ARLDays, CandidateARLDays)
	c.LatencyRatio = 0
	c.ZoneEvery = 0
	return c
}

// feedCandidates gives the candidates' test an observation, as the
// floor's evidence hook gives the floor: both read every observation.
func (p *Policy) feedCandidates(obs agent.Observation) {
	p.ownLat.Observe(obs)
	found := p.loose.Evidence(obs)
	p.flagMu.Lock()
	defer p.flagMu.Unlock()
	for _, k := range found {
		f := p.flags[k]
		f.at = obs.Time
		p.flags[k] = f
	}
}

// evidenceHook is the policy's evidence hook: the floor's, which the loop
// steps on, with the candidates' test fed the same observation.
func (p *Policy) evidenceHook(obs agent.Observation) []agent.Key {
	p.feedCandidates(obs)
	return p.Floor.Evidence(obs)
}

// candidates are this step's suspects: errors the candidates' test
// condemns and latency or overload the windows show. Servers the floor
// acts on are the rules' already. It sets p.brief, the errors
// candidates' reasons in a few words. The caller holds p.mu.
func (p *Policy) candidates(ctx context.Context, obs agent.Observation, floor agent.Plan) map[agent.Key]rules.Suspect {
	decided := map[agent.Key]bool{}
	for _, a := range floor {
		decided[a.Key()] = true
	}
	out := map[agent.Key]rules.Suspect{}
	p.brief = map[agent.Key]string{}
	add := func(k agent.Key, sig rules.Signal, why string) {
		if decided[k] {
			return
		}
		s, seen := out[k]
		if !seen {
			s.Why = why
		}
		s.Signals = append(s.Signals, sig)
		out[k] = s
	}
	plan, err := p.loose.Decide(ctx, obs)
	p.flagMu.Lock()
	if err == nil {
		for _, a := range plan {
			if a.Kind == agent.Drain {
				p.flags[a.Key()] = flag{at: obs.Time, why: p.errorsWhy(a.Reason), brief: p.errorsBrief(a.Reason)}
			}
		}
	}
	serving := map[agent.Key]bool{}
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			serving[s.Key()] = s.Serving()
		}
	}
	for k, f := range p.flags {
		switch {
		case !serving[k] || obs.Time.Sub(f.at) > CandidateHold:
			delete(p.flags, k) // gone, drained, or its evidence long fallen
		case f.why != "":
			add(k, rules.SignalErrors, f.why)
			if c, ok := out[k]; ok && c.Why == f.why {
				p.brief[k] = f.brief
			}
		default: // flagged by a check between steps only
			add(k, rules.SignalErrors, fmt.Sprintf("errors: CUSUM past %.1f of the rules' h %.1f %.0fs ago", p.looseH, p.rules.Threshold(), obs.Time.Sub(f.at).Seconds()))
		}
	}
	p.flagMu.Unlock()
	for _, b := range obs.Backends {
		for _, w := range windowSignals(b, p.rules.Loose().MinRequests, p.ownLat.Departed) {
			add(w.key, w.sig, w.why)
		}
	}
	return out
}

// errorsWhy is a candidate's errors as the prompt shows them: the
// sequential test's own figures (its rate over the evidence's span, the
// rate it is judged against, the degraded line), after how far its
// evidence has come against the rules' threshold.
func (p *Policy) errorsWhy(reason string) string {
	figures, _, _ := strings.Cut(reason, ";") // the region's long words go
	if _, f, ok := strings.Cut(figures, ": "); ok {
		figures = f // "5xx CUSUM at h 12.7" is said below
	}
	return fmt.Sprintf("errors: CUSUM past %.1f of the rules' h %.1f: %s", p.looseH, p.rules.Threshold(), figures)
}

// errorsBrief is errorsWhy in a few words, for the compact forms: how
// far the evidence is against the rules' h (at least the candidates'
// threshold), the rate over its span, the rate it is judged against (p0)
// and the degraded line. Just "errors" when the rules' words cannot be
// read.
func (p *Policy) errorsBrief(reason string) string {
	var h, rate, p0, deg float64
	var x, n, checks int
	figures, _, _ := strings.Cut(reason, ";")
	if _, err := fmt.Sscanf(figures, "5xx CUSUM at h %f: %f%% (%d/%d) over its evidence's %d checks, judged against %f%%, degraded from %f%%",
		&h, &rate, &x, &n, &checks, &p0, &deg); err != nil {
		return "errors"
	}
	return fmt.Sprintf("errors S>=%.2fh %.2f%% over %d checks p0 %.2f%% deg %.2f%%", p.looseH/p.rules.Threshold(), rate, checks, p0, deg)
}

type windowSignal struct {
	key agent.Key
	sig rules.Signal
	why string
}

// windowSignals are a backend's latency and overload suspects: a p95
// over rules.SuspectLatencyRatio times the serving servers' median plus
// rules.SuspectLatencyMinMs, on at least enough requests, whose median
// has departed from its own usual (departed: rules.OwnLatency's, true
// until a baseline is learned), and a server keeping rules.SuspectBusy of
// its maxconn busy. These are rules.Config.Suspects' own thresholds and
// words; its errors signal, the windowed test, is left out. Without the
// server's own history, a fleet whose servers' medians differ by σ 0.5
// (lognormal) showed the models a healthy server twice its peers' p95
// at every step, and both models trained here drained healthy servers
// where the rules touched none (docs/lab/llm-scoreboard.md).
func windowSignals(b agent.BackendView, enough uint64, departed func(agent.Key, int) bool) []windowSignal {
	var out []windowSignal
	var p95 []int
	for _, s := range b.Servers {
		if s.Serving() && s.Window.Requests >= enough {
			p95 = append(p95, s.Window.P95Ms)
		}
	}
	med := 0
	if len(p95) > 0 {
		sort.Ints(p95)
		med = p95[len(p95)/2]
	}
	for _, s := range b.Servers {
		if len(p95) >= 2 && s.Serving() && s.Window.Requests >= enough && s.Window.P95Ms > rules.SuspectLatencyRatio*med+rules.SuspectLatencyMinMs &&
			departed(s.Key(), s.Window.P50Ms) {
			out = append(out, windowSignal{s.Key(), rules.SignalLatency, fmt.Sprintf("latency: p95 %d ms vs the median %d ms", s.Window.P95Ms, med)})
		}
		if u := s.Busy(s.Recent.RatePerSec); u >= rules.SuspectBusy && s.Serving() {
			out = append(out, windowSignal{s.Key(), rules.SignalOverload, fmt.Sprintf("overload: %.0f%% of maxconn %d busy", 100*u, s.MaxConn)})
		}
	}
	return out
}
