package soak

// Re-admission: how long a healed server takes to come back to full
// weight, and what a server costs clients while it comes back, through
// the agent's real loop (loop.Loop, its guardrails and ledger, a fake
// runtime socket) and the real recovery (agent/recovery), on an injected
// clock. What is simulated: the traffic (Poisson, split by weight among
// the serving servers, binomial 5xx), the probe bursts (each probe fails
// at the server's rate now, the burst stops at the first failure), and
// the rules' sequential test, which the real loop runs every second
// between its steps: here it is fed each second's counts, and a server
// it condemns is drained at once by a step without recovery, as the
// loop's triggered step does.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/agent/recovery"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// ReadmitCell is one re-admission experiment: a backend of Servers at
// Noise, one of which fails at Fault, is drained, and heals (or not).
type ReadmitCell struct {
	Servers int
	Rate    float64 // requests per second per server at full weight
	Noise   float64 // the healthy servers' 5xx rate, and the healed one's
	Fault   float64 // the drained server's 5xx rate until it heals
	Weight  int     // every server's configured weight
	// Heal: the server heals at a time drawn uniformly in [0, HealWithin)
	// after its drain. Without it, it never heals.
	Heal       bool
	HealWithin time.Duration
	// Blind: the probes pass while clients still fail (the probe path is
	// healthy, the application is not).
	Blind bool
	// Horizon: a run ends this long after the heal (or the drain, for a
	// server that never heals).
	Horizon  time.Duration
	Interval time.Duration // the loop's step
	Mode     recovery.Mode
	Trials   int // per seed
	Seeds    []uint64
	Rules    rules.Config
}

// Validate checks a cell's settings.
func (c ReadmitCell) Validate() error {
	var errs []error
	if c.Servers < 3 || c.Servers > 1000 {
		errs = append(errs, fmt.Errorf("servers %d outside [3, 1000]", c.Servers))
	}
	if !(c.Rate > 0 && c.Rate <= 1e4) || !(c.Noise >= 0 && c.Noise < c.Fault && c.Fault < 1) {
		errs = append(errs, fmt.Errorf("rate %v outside (0, 1e4], or not 0 <= noise %v < fault %v < 1", c.Rate, c.Noise, c.Fault))
	}
	if c.Weight < 1 || c.Weight > haproxy.MaxWeight {
		errs = append(errs, fmt.Errorf("weight %d outside [1, %d]", c.Weight, haproxy.MaxWeight))
	}
	if c.Heal && c.HealWithin <= 0 || c.Horizon <= 0 || c.Interval < time.Second {
		errs = append(errs, fmt.Errorf("heal within %v, horizon %v, interval %v (at least 1 s)", c.HealWithin, c.Horizon, c.Interval))
	}
	if c.Trials < 1 || len(c.Seeds) < 1 {
		errs = append(errs, fmt.Errorf("trials %d, seeds %v", c.Trials, c.Seeds))
	}
	return errors.Join(errs...)
}

// ReadmitResult is a cell's figures.
type ReadmitResult struct {
	Path   string  `json:"path"` // the recovery mode
	Case   string  `json:"case"` // heals, never heals, probe-blind
	Cell   string  `json:"cell"`
	Fault  float64 `json:"fault"`
	Trials int     `json:"trials"`
	// Full: runs whose healed server was back at full weight within the
	// horizon; FullMedian and FullP90 the time from its heal to there,
	// over all runs, -1 where that quantile fell beyond the horizon.
	Full       int     `json:"full,omitempty"`
	FullMedian float64 `json:"heal_to_full_median_s,omitempty"`
	FullP90    float64 `json:"heal_to_full_p90_s,omitempty"`
	// RampMedian is the median time from the last ready to full weight:
	// the ramp's share of FullMedian, the rest being cooldowns and bursts.
	RampMedian float64 `json:"ready_to_full_median_s,omitempty"`
	// PaidFaulty: the server's 5xx to clients while it still failed
	// (before its heal), per run; PaidHealed after its heal, until full
	// weight. Readmits: the times it was let back (a ready) per run, and
	// Redrains the times it was drained again after a ready.
	PaidFaulty float64 `json:"errors_paid_faulty_per_run"`
	PaidHealed float64 `json:"errors_paid_healed_per_run,omitempty"`
	Readmits   float64 `json:"readmits_per_run"`
	Redrains   float64 `json:"redrains_per_run"`
	// Probes: the agent's own probe requests to the server per run, the
	// load re-admission puts on a server that may still be sick.
	Probes float64 `json:"probes_per_run"`
	// RunSeconds: how long each run lasted on average (simulated).
	RunSeconds  float64 `json:"run_s"`
	WallSeconds float64 `json:"wall_s"`
}

// RunReadmit runs a cell's trials, the seeds on up to workers goroutines
// (perSeed).
func RunReadmit(c ReadmitCell, workers int) (ReadmitResult, error) {
	if err := c.Validate(); err != nil {
		return ReadmitResult{}, err
	}
	began := time.Now()
	type out struct {
		full, ramp              []float64
		paidF, paidH, secs      float64
		probes                  int
		readmits, redrains, run int
		err                     error
	}
	outs := make([]out, len(c.Seeds))
	perSeed(c.Seeds, workers, 0x7ead, func(si int, rng *rand.Rand) {
		o := &outs[si]
		for range c.Trials {
			t, err := readmitTrial(c, rng)
			if err != nil {
				o.err = err
				return
			}
			o.run++
			o.paidF += float64(t.paidFaulty)
			o.paidH += float64(t.paidHealed)
			o.readmits += t.readmits
			o.redrains += t.redrains
			o.secs += t.secs
			o.probes += t.probes
			switch {
			case t.full >= 0:
				o.full = append(o.full, t.full)
				o.ramp = append(o.ramp, t.ramp)
			case c.Heal:
				o.full = append(o.full, math.Inf(1)) // not back within the horizon
			}
		}
	})
	r := ReadmitResult{Path: string(c.Mode), Case: c.caseName(), Fault: c.Fault,
		Cell: fmt.Sprintf("N=%d %g req/s %.2g%% weight %d", c.Servers, c.Rate, 100*c.Noise, c.Weight)}
	var full, ramp []float64
	var runs int
	for _, o := range outs {
		if o.err != nil {
			return ReadmitResult{}, o.err
		}
		runs += o.run
		full = append(full, o.full...)
		ramp = append(ramp, o.ramp...)
		r.PaidFaulty += o.paidF
		r.PaidHealed += o.paidH
		r.Readmits += float64(o.readmits)
		r.Redrains += float64(o.redrains)
		r.RunSeconds += o.secs
		r.Probes += float64(o.probes)
	}
	r.Trials, r.Full = runs, len(ramp)
	k := 1 / float64(runs)
	r.PaidFaulty, r.PaidHealed, r.Readmits, r.Redrains = r.PaidFaulty*k, r.PaidHealed*k, r.Readmits*k, r.Redrains*k
	r.RunSeconds, r.Probes = r.RunSeconds*k, r.Probes*k
	if len(full) > 0 {
		r.FullMedian, r.FullP90, r.RampMedian = censored(quantile(full, 0.5)), censored(quantile(full, 0.9)), quantile(ramp, 0.5)
	}
	r.WallSeconds = time.Since(began).Seconds()
	return r, nil
}

// censored is q, or -1 for a quantile beyond the horizon.
func censored(q float64) float64 {
	if math.IsInf(q, 1) {
		return -1
	}
	return q
}

func (c ReadmitCell) caseName() string {
	switch {
	case c.Blind && c.Heal:
		return "probe-blind, heals"
	case c.Blind:
		return "probe-blind, never heals"
	case c.Heal:
		return "heals"
	}
	return "never heals"
}

// trial is one run's figures; full is -1 when the healed server was not
// back at full weight within the horizon (or never healed).
type trial struct {
	full, ramp             float64
	paidFaulty, paidHealed uint64
	readmits, redrains     int
	probes                 int
	secs                   float64
}

// simWindows is the loop's windows over the simulated traffic: the last
// 60 s for the long window, the last 10 s for the recent one, and the
// running totals the sequential tests read.
type simWindows struct {
	names []string
	long  [][60]rules.Counts
	total []rules.Counts
	now   int // the second being filled
}

func (w *simWindows) Snapshot(last time.Duration) []window.Stats {
	span := 60
	if last > 0 && last <= 10*time.Second {
		span = 10
	}
	out := make([]window.Stats, len(w.names))
	for i, name := range w.names {
		var n, x uint64
		for j := 1; j <= span; j++ {
			c := w.long[i][(w.now-j+600)%60]
			n, x = n+c.N, x+c.X
		}
		// Answer times are not simulated: every server alike, so that
		// no latency check tells them apart.
		out[i] = window.Stats{Backend: "app", Server: name, Requests: n, Err5xx: x, P50Ms: 10, P95Ms: 20, P99Ms: 30, Seconds: span,
			RatePerSec: float64(n) / float64(span), TotalRequests: w.total[i].N, TotalErr5xx: w.total[i].X}
	}
	return out
}

// condemned is the policy of the soak: it drains the servers the rules'
// sequential test condemned since its last call.
type condemned struct{ keys []string }

func (c *condemned) Name() string { return "rules-sequential" }
func (c *condemned) Decide(context.Context, agent.Observation) (agent.Plan, error) {
	var p agent.Plan
	for _, s := range c.keys {
		p = append(p, agent.Action{Kind: agent.Drain, Backend: "app", Server: s, Reason: "sequential test"})
	}
	c.keys = c.keys[:0]
	return p, nil
}

// readmitTrial runs one drain of srv1 and what follows.
func readmitTrial(c ReadmitCell, rng *rand.Rand) (trial, error) {
	n := c.Servers
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("srv%d", i+1)
	}
	rt := fakes.NewRuntime(names...)
	for _, name := range names {
		rt.Set(name, func(s *haproxy.ServerState) {
			s.Weight, s.Initial, s.Addr, s.Port = c.Weight, c.Weight, "10.0.0.1", 80
		})
	}
	w := &simWindows{names: names, long: make([][60]rules.Counts, n), total: make([]rules.Counts, n)}
	rate := make([]float64, n)
	for i := range rate {
		rate[i] = c.Noise
	}
	q := rules.NewSequential(c.Rules)
	seq := make([]*rules.SeqServer, n)
	for i := range seq {
		seq[i] = &rules.SeqServer{}
	}
	in := make([]rules.Counts, n)
	serving := make([]bool, n)
	var idx []int
	states := make([]haproxy.ServerState, n)
	// one second of traffic, fed to the windows and the sequential test;
	// it returns srv1's 5xx.
	second := func() uint64 {
		total := 0
		for i, name := range names {
			states[i] = rt.State(name)
			serving[i] = states[i].Serving()
			if serving[i] {
				total += states[i].Weight
			}
		}
		for i := range names {
			in[i] = rules.Counts{}
			if serving[i] && total > 0 {
				req := poisson(rng, c.Rate*float64(n)*float64(states[i].Weight)/float64(total))
				in[i] = rules.Counts{N: req, X: binomial(rng, req, rate[i])}
			}
			w.long[i][w.now%60] = in[i]
			w.total[i].N += in[i].N
			w.total[i].X += in[i].X
		}
		w.now++
		idx = q.Step(1, seq, in, serving, idx)
		return in[0].X
	}
	// A steady state: an hour of healthy traffic teaches the baselines.
	for range 3600 {
		second()
	}
	// srv1 fails for a minute, long enough to fill its window.
	rate[0] = c.Fault
	for range 60 {
		second()
	}
	clk := fakes.NewClock(time.Unix(1_000_000, 0))
	rec := recovery.New(func() recovery.Config {
		cfg := recovery.DefaultConfig()
		cfg.Mode = c.Mode
		return cfg
	}(), nil, zerolog.Nop())
	defer rec.Close()
	rec.Now = clk.Now
	rec.Seed(rng.Uint64())
	healed := false
	tr := trial{full: -1}
	rec.Prober = func(s agent.ServerView, k int) recovery.BurstResult {
		p := c.Noise
		if s.Server == names[0] && !healed && !c.Blind {
			p = c.Fault
		}
		for j := range k {
			if rng.Float64() < p {
				tr.probes += j + 1
				return recovery.BurstResult{Sent: j + 1, Failed: 1, MedianMs: 10}
			}
		}
		tr.probes += k
		return recovery.BurstResult{Sent: k, MedianMs: 10}
	}
	pol := &condemned{keys: []string{names[0]}}
	l := &loop.Loop{Clock: clk, Settings: agent.Settings{Interval: c.Interval, Mode: agent.ModeEnforce, OperatorHold: time.Hour},
		Policy: agent.PolicyOf(pol), Guard: guard.DefaultGuardrails(), Runtimes: []agent.Runtime{rt}, Windows: w,
		Recovery: rec, Log: zerolog.Nop()}
	ctx := context.Background()
	l.Step(ctx) // drains srv1
	if st := rt.State(names[0]); !st.Drain() {
		return trial{}, fmt.Errorf("readmit: srv1 not drained at the start: %s", st.Label())
	}
	rt.TakeCommands()
	heal := math.Inf(1)
	if c.Heal {
		heal = rng.Float64() * c.HealWithin.Seconds()
	}
	end := c.Horizon.Seconds()
	if c.Heal {
		end += heal
	}
	ready := 0.0
	step := int(c.Interval / time.Second)
	for t := 1; float64(t) < end; t++ {
		if !healed && float64(t) >= heal {
			healed, rate[0] = true, c.Noise
		}
		x := second()
		if healed {
			tr.paidHealed += x
		} else {
			tr.paidFaulty += x
		}
		clk.Advance(time.Second)
		pol.keys = pol.keys[:0]
		for _, i := range idx {
			if i == 0 {
				pol.keys = append(pol.keys, names[0])
			}
		}
		switch {
		case t%step == 0:
			l.Step(ctx)
		case len(pol.keys) > 0:
			// The loop's triggered step: the policy's drain, recovery
			// left to the ticks.
			l.Recovery = nil
			l.Step(ctx)
			l.Recovery = rec
		default:
			continue
		}
		for _, cmd := range rt.TakeCommands() {
			switch cmd {
			case "set server app/srv1 state ready":
				tr.readmits++
				ready = float64(t)
			case "set server app/srv1 state drain":
				tr.redrains++
			}
		}
		if st := rt.State(names[0]); healed && st.Serving() && st.Weight == st.Initial {
			tr.full, tr.ramp, tr.secs = float64(t)-heal, float64(t)-ready, float64(t)
			return tr, nil
		}
	}
	tr.secs = end
	return tr, nil
}
