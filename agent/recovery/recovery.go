// Package recovery brings servers the agent drained back into rotation
// without risking client traffic on them.
//
// A drained server gets no client traffic, so its windows cannot show
// whether it healed. After a cooldown (30 s by default, doubled for every
// failed probe burst and every new drain of the same server, capped at
// 10 minutes, with ±10% jitter) the agent sends a burst of its own
// requests straight to the server's address. The burst is sized from the
// error rate that got the server drained, so that a server still failing
// at that rate passes with probability below 0.01%. A clean burst brings
// the server back: first at a quarter of its weight (when its weight is 4
// or more), then at full weight once its live window stays clean. A
// server that still fails stays drained and is never flipped. With probing
// off, the canary weight ramp alone is the test.
//
// In slow-start mode (ModeSlowStart) the same clean burst is followed by
// a ramp judged on the server's live traffic by a sequential probability
// ratio test (rules.SPRT, "healthy" against "still at the drained rate"):
// the weight doubles from a share of its configured value each time the
// test says healthy, and the server goes back to drain at once when it
// says faulty, so that a still-faulty server costs a bounded number of
// errors (rules.SPRT.ErrorBound). A failed burst, which cost no client
// anything, then waits the drain's cooldown again instead of doubling it:
// the backoff grows with the drains, each of which cost clients errors.
//
// Which phase a server is in (drained, cut, canary) is the ledger's to
// say; recovery keeps only the progress of a drained server's probes and
// the backoff history of its drains.
package recovery

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lib/enum"
	"github.com/rs/zerolog"
)

// Mode is how drained servers come back.
type Mode string

const (
	// ModeProbe: a burst of the agent's own requests, then a canary weight.
	ModeProbe Mode = "probe"
	// ModeSlowStart: a burst of the agent's own requests, then a weight
	// ramp judged on live traffic by a sequential test.
	ModeSlowStart Mode = "slowstart"
	// ModeCanary: the canary weight ramp alone is the test.
	ModeCanary Mode = "canary"
	// ModeOff: drained servers stay drained until an operator acts.
	ModeOff Mode = "off"
)

// Modes lists the modes, for usage lines.
var Modes = []Mode{ModeProbe, ModeSlowStart, ModeCanary, ModeOff}

func (m *Mode) String() string { return string(*m) }

// Set implements flag.Value.
func (m *Mode) Set(s string) (err error) {
	*m, err = enum.Parse("readmit", s, Modes...)
	return err
}

// Config tunes re-admission.
type Config struct {
	Mode        Mode
	Path        string        // probe request path
	Host        string        // Host header; "" uses the address
	Rate        float64       // probe requests per second
	Timeout     time.Duration // per probe request
	Cooldown    time.Duration // first wait after a drain
	MaxCooldown time.Duration
	MinBurst    int
	MaxBurst    int
	// CanaryFor is how long the live window must stay clean at the
	// reduced weight before full weight returns.
	CanaryFor time.Duration
	// P99Guard: when a drain leaves the backend's recent p99 above this
	// many times its p99 before the drain, in every step for TailFor (and
	// in two steps at least), the server comes back at a reduced weight
	// and is not drained again for TailHold. 0 is off.
	P99Guard float64
	// TailFor is how long the p99 must stay over the guard. Undoing a
	// fault's drain brings its errors back, and a passing slowdown (a
	// neighbour's load, a GC storm) that two 1 s steps catch is not the
	// drain's harm. The default, 20 s, is twice the recent window the p99
	// is taken over, so that one burst, which keeps that window's p99 up
	// for the window's whole span, is not enough. The study's 10 s pace
	// makes two steps 20 s anyway.
	TailFor  time.Duration
	TailHold time.Duration
	// SlowRatio, SlowMinMs: a burst whose median answer time is this many
	// times the serving peers' median, and this many ms above it, fails
	// as a 5xx would, so that a server drained for slowness is not let
	// back while still slow (0: errors only). The rules' latency test
	// uses the same figures by default.
	SlowRatio float64
	SlowMinMs int
	// RampShare is the share of its configured weight a server comes back
	// at in slow-start mode (at least weight 1); each healthy verdict
	// doubles it, up to the configured weight.
	RampShare float64
	// RampAlpha and RampBeta are the slow start's test errors: a healthy
	// server sent back to drain, a still-faulty one let a step up.
	RampAlpha, RampBeta float64
}

// DefaultConfig is what `hapilot run` uses.
func DefaultConfig() Config {
	return Config{Mode: ModeSlowStart, Path: "/", Rate: 50, Timeout: 2 * time.Second, Cooldown: 30 * time.Second,
		MaxCooldown: 10 * time.Minute, MinBurst: 20, MaxBurst: 1000, CanaryFor: 10 * time.Second,
		P99Guard: 2.5, TailFor: 20 * time.Second, TailHold: 10 * time.Minute, SlowRatio: 5, SlowMinMs: 50,
		RampShare: 0.25, RampAlpha: 1e-3, RampBeta: 1e-3}
}

// Validate checks the settings an operator may give.
func (c Config) Validate() error {
	var errs []error
	if _, err := enum.Parse("readmit", string(c.Mode), Modes...); err != nil {
		errs = append(errs, err)
	}
	if !(c.Rate > 0 && c.Rate <= 10000) || c.Cooldown <= 0 || c.Timeout <= 0 { // NaN and Inf fail too
		errs = append(errs, fmt.Errorf("probe-rate (up to 10000/s), probe-cooldown and the probe timeout must be positive"))
	}
	if c.MaxCooldown < c.Cooldown {
		errs = append(errs, fmt.Errorf("the longest cooldown %v is below the first %v", c.MaxCooldown, c.Cooldown))
	}
	if c.MinBurst < 1 || c.MaxBurst < c.MinBurst {
		errs = append(errs, fmt.Errorf("burst sizes %d..%d: want 1 <= min <= max", c.MinBurst, c.MaxBurst))
	}
	if !(c.P99Guard >= 0 && c.P99Guard < 1000) {
		errs = append(errs, fmt.Errorf("p99-guard %v: want a finite number from 0", c.P99Guard))
	}
	if c.Mode == ModeSlowStart && (!(c.RampShare > 0 && c.RampShare <= 1) || !(c.RampAlpha > 0 && c.RampAlpha < 0.5) || !(c.RampBeta > 0 && c.RampBeta < 0.5)) {
		errs = append(errs, fmt.Errorf("slow start: ramp share %v in (0, 1] and test errors %v, %v in (0, 0.5)", c.RampShare, c.RampAlpha, c.RampBeta))
	}
	if c.TailFor < 0 || c.TailFor > time.Hour {
		errs = append(errs, fmt.Errorf("p99-guard-for %v: want 0 to 1h", c.TailFor))
	}
	return errors.Join(errs...)
}

// probeState is where a drained server stands in its probe cycle. Whether
// it is drained, reweighted or a canary is the ledger's to say (its
// Change.Phase); this is only the burst's progress.
type probeState int

const (
	waiting probeState = iota // cooldown running
	probing                   // a burst is in flight
	passed                    // the last burst was clean: re-admit
)

// server is what recovery remembers of a server the agent drained: its
// probe cycle, and the backoff history that outlives one drain.
type server struct {
	probe     probeState
	next      time.Time // when the next burst may start
	cooldown  time.Duration
	drainedAt time.Time // the ledger's Change.At of the drain being handled
	faultRate float64   // error rate seen when it was drained
	slowMs    int       // for a drain for a slow tail: an answer this slow fails a probe (Change.SlowMs)
	slowMean  bool      // slowMs was judged on a mean (Change.SlowMean)
	meanShare float64   // for such a drain: the share its last burst was sized on (MeanShare)
	drains    int       // times the agent drained it
	lastBurst string
	failed    int // bursts of this drain that failed
	result    chan BurstResult
	ramp      ramp
}

// ramp is a slow start's progress: the test of the stage in force, and
// the counters it reads its chunks from.
type ramp struct {
	at   time.Time // the ledger's Change.At of the stage being judged
	test rules.SPRT
	// base: the server's running totals when its chunk was last read;
	// next: those at the step that proposed the stage to come.
	base, next rules.Counts
}

// BurstResult is how a probe burst went.
type BurstResult struct {
	Sent, Failed int
	// Slow counts the answers of Failed that failed by their time alone:
	// at or over the slow answer time of a drain for a slow tail.
	Slow     int
	MedianMs float64 // of the answers' times
	Err      error
}

// Readmitter implements agent.Recovery. It owns its probe bursts: Close
// stops them and waits for them.
type Readmitter struct {
	Config Config
	Log    zerolog.Logger
	Now    func() time.Time

	// Prober, when set, replaces the HTTP burst and runs inline at the
	// step that starts it: the lab's simulated servers answer in no real
	// time (internal/lab/soak). Nil: bursts go out over HTTP.
	Prober func(s agent.ServerView, n int) BurstResult

	client *http.Client
	ctx    context.Context // ends at Close: every burst runs under it
	cancel context.CancelFunc
	bursts sync.WaitGroup

	mu      sync.Mutex // guards the fields below: the loop's steps and the probe bursts
	servers map[agent.Key]*server
	// strikes counts, per server, steps in a row with the backend's p99
	// over the tail guard, since the first of them.
	strikes map[agent.Key]strike
	rng     *rand.Rand
}

// New returns a Readmitter whose probes go out through client (nil: one
// built from cfg).
func New(cfg Config, client *http.Client, log zerolog.Logger) *Readmitter {
	if client == nil {
		client = &http.Client{
			Timeout: cfg.Timeout,
			Transport: &http.Transport{
				TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, // a health probe to a backend, as HAProxy's check-ssl without verify
				MaxIdleConnsPerHost: 8,
				DisableCompression:  true,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Readmitter{Config: cfg, Log: log, Now: time.Now, client: client, ctx: ctx, cancel: cancel,
		servers: map[agent.Key]*server{}, strikes: map[agent.Key]strike{}, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))}
}

// Seed makes the cooldowns' jitter repeatable (the lab's runs).
func (r *Readmitter) Seed(seed uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rng = rand.New(rand.NewPCG(seed, 7))
}

// Close stops every probe burst in flight and waits for them to end.
func (r *Readmitter) Close() {
	r.cancel()
	r.bursts.Wait()
}

func (r *Readmitter) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.9 + 0.2*r.rng.Float64()))
}

// BurstSize is how many clean answers make a server still failing at
// rate pass with probability below 0.01%.
func (c Config) BurstSize(rate float64) int {
	if rate <= 0 {
		return c.MinBurst
	}
	if rate >= 1 {
		return c.MinBurst
	}
	n := int(math.Ceil(math.Log(1e-4) / math.Log1p(-rate)))
	return min(max(n, c.MinBurst), c.MaxBurst)
}

// MeanShare is the least share of answers that lifts a mean answer time
// to slowMs ms over a body at peerMs: answers slower than the probe's
// Timeout fail a probe anyway, so the slowest a tail can be and still
// pass unseen is the timeout, and a mean of slowMs then needs
// (slowMs − peerMs) / (timeout − peerMs) of the answers there. A server
// drained for a slow mean (the stats path: HAProxy's rtime, no answer's
// own time) gets the burst a fault at that share would: 348 probes for a
// 64 ms mean over 12 ms peers at the default 2 s, where a 5% tail at 1.5
// s fails one of its first 20 or so. 1 where no share can (slowMs at or
// over the timeout, or not over the peers).
func (c Config) MeanShare(slowMs, peerMs int) float64 {
	t := float64(c.Timeout) / float64(time.Millisecond)
	lift, span := float64(slowMs-peerMs), t-float64(peerMs)
	if lift <= 0 || span <= lift {
		return 1
	}
	return lift / span
}

// Plan proposes this step's re-admissions, reading each server's phase
// from the ledger (Changed.Phase).
func (r *Readmitter) Plan(_ context.Context, obs agent.Observation) agent.Plan {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.Now()
	var plan agent.Plan
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			if s.Owner != agent.OwnerAgent || s.Changed == nil {
				continue
			}
			k := s.Key()
			var a agent.Action
			var ok bool
			switch s.Changed.Phase {
			case agent.PhaseDrained:
				st := r.servers[k]
				if st == nil || !st.drainedAt.Equal(s.Changed.At) {
					st = r.drained(k, st, s)
				}
				if a, ok = r.tailGuard(b, k, s, now); !ok {
					a, ok = r.whileDrained(k, st, s, peersP50(b, s.Server), now)
				}
			case agent.PhaseCut, agent.PhaseCanary:
				// Back at a reduced weight: after a re-admission, a
				// capacity-aware cut or the tail guard. Full weight
				// returns once its live traffic is clean.
				if s.Changed.Phase == agent.PhaseCut {
					a, ok = r.tailGuard(b, k, s, now)
				}
				switch {
				case ok || !s.Serving():
				case r.Config.Mode == ModeSlowStart && s.Changed.Phase == agent.PhaseCanary:
					a, ok = r.whileRamp(b, k, s, now)
				default:
					a, ok = r.whileCanary(b, s, now)
				}
			}
			if ok {
				plan = append(plan, a)
			}
		}
	}
	return plan
}

// strike is a run of steps with the backend's p99 over the tail guard.
type strike struct {
	steps int
	since time.Time
}

// tailGuard undoes a drain or a weight cut that left the backend's p99
// far above its level before the change, in every step for TailFor and
// in two steps at least: a drained
// server comes back at a reduced weight first, then ready; a cut server
// goes back to its configured weight. Either way it is held from being
// drained again for TailHold.
func (r *Readmitter) tailGuard(b agent.BackendView, k agent.Key, s agent.ServerView, now time.Time) (agent.Action, bool) {
	base := s.Changed.BaselineP99Ms
	if r.Config.P99Guard <= 0 || base <= 0 {
		return agent.Action{}, false
	}
	p99, n := b.RecentP99()
	if n < 100 || p99 <= r.Config.P99Guard*base {
		delete(r.strikes, k)
		return agent.Action{}, false
	}
	st := r.strikes[k]
	if st.steps == 0 {
		st.since = now
	}
	st.steps++
	r.strikes[k] = st
	if st.steps < 2 || now.Sub(st.since) < r.Config.TailFor {
		return agent.Action{}, false
	}
	what := "the drain"
	if s.Changed.Phase != agent.PhaseDrained {
		what = "the weight cut"
	}
	why := fmt.Sprintf("tail-latency guard: p99 %.0f ms is %.1fx the %.0f ms before %s, over the guard for %v", p99, p99/base, base, what, now.Sub(st.since).Round(time.Second))
	if w := max(s.State.Initial/4, 1); s.Changed.Phase == agent.PhaseDrained && s.State.Initial >= 4 && s.State.Weight != w {
		return agent.Action{Kind: agent.SetWeight, Backend: s.Backend, Server: s.Server, Weight: w, Reason: why + ": reduced weight first"}, true
	}
	delete(r.strikes, k)
	return agent.Action{Kind: agent.Ready, Backend: s.Backend, Server: s.Server, Reason: why, NoDrainFor: r.Config.TailHold, Origin: agent.OriginRecovery}, true
}

// RequestProbe lets a drained server's next burst start now, when no
// burst of its current drain has failed yet: a policy that thinks the
// server healed shortens the first cooldown, never the backoff earned by
// a failed burst.
func (r *Readmitter) RequestProbe(k agent.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.servers[k]
	if st == nil || st.probe != waiting || st.failed > 0 {
		return
	}
	if now := r.Now(); now.Before(st.next) {
		st.next = now
		r.Log.Info().Stringer("server", k).Msg("a policy asked for a probe: the first burst starts at the next step")
	}
}

// drained starts (or restarts) the cooldown of a server the agent
// drained, keeping the backoff of its earlier drains.
func (r *Readmitter) drained(k agent.Key, prev *server, s agent.ServerView) *server {
	st := &server{probe: waiting, drainedAt: s.Changed.At, cooldown: r.Config.Cooldown, drains: 1,
		faultRate: max(s.Window.ErrorRate(), s.Changed.ErrorRate), slowMs: s.Changed.SlowMs, slowMean: s.Changed.SlowMean}
	if prev != nil {
		st.drains = prev.drains + 1
		st.cooldown = min(2*prev.cooldown, r.Config.MaxCooldown)
		st.faultRate = max(st.faultRate, prev.faultRate)
	}
	st.next = s.Changed.At.Add(r.jitter(st.cooldown))
	r.servers[k] = st
	r.Log.Info().Stringer("server", k).Int("drains", st.drains).Dur("cooldown", st.cooldown).Float64("fault_rate", st.faultRate).
		Msg("drained server waits before re-admission")
	return st
}

// peersP50 is the median of the other serving servers' median answer
// times, 0 when none has answered.
func peersP50(b agent.BackendView, self string) int {
	var p50 []int
	for _, p := range b.Servers {
		if p.Server != self && p.Serving() && p.Window.Requests > 0 {
			p50 = append(p50, p.Window.P50Ms)
		}
	}
	if len(p50) == 0 {
		return 0
	}
	sort.Ints(p50)
	return p50[len(p50)/2]
}

// tooSlow tells whether a burst's answers are far slower than the peers'.
func (c Config) tooSlow(medianMs float64, peerMs int) bool {
	return c.SlowRatio > 0 && peerMs > 0 && medianMs >= c.SlowRatio*float64(peerMs) && medianMs-float64(peerMs) >= float64(c.SlowMinMs)
}

func (r *Readmitter) whileDrained(k agent.Key, st *server, s agent.ServerView, peerMs int, now time.Time) (agent.Action, bool) {
	switch st.probe {
	case waiting:
		if now.Before(st.next) {
			return agent.Action{}, false
		}
		if (r.Config.Mode != ModeProbe && r.Config.Mode != ModeSlowStart) || s.State.Addr == "" || s.State.Port == 0 {
			st.probe = passed
			st.lastBurst = "probing off: canary ramp"
			break
		}
		r.startBurst(st, s, peerMs)
		return agent.Action{}, false
	case probing:
		select {
		case res := <-st.result:
			st.lastBurst = fmt.Sprintf("%d/%d probes failed, median %.0f ms (peers %d ms)", res.Failed, res.Sent, res.MedianMs, peerMs)
			switch {
			case st.slowMs > 0 && st.slowMean:
				st.lastBurst += fmt.Sprintf("; drained for a slow mean, an answer at %d ms or more fails a probe (%d did), %d probes for the %.1f%% of answers at the probe's timeout that make such a mean",
					st.slowMs, res.Slow, r.Config.BurstSize(st.meanShare), 100*st.meanShare)
			case st.slowMs > 0:
				st.lastBurst += fmt.Sprintf("; drained for a slow tail, an answer at %d ms or more fails a probe (%d did)", st.slowMs, res.Slow)
			}
			if res.Err != nil || res.Failed > 0 || res.Sent == 0 || r.Config.tooSlow(res.MedianMs, peerMs) {
				// A failed burst cost no client anything. In slow-start
				// mode the drain's cooldown (doubled per drain, each of
				// which did cost clients) is waited again, so that a
				// server that heals is found within one cooldown.
				if r.Config.Mode != ModeSlowStart {
					st.cooldown = min(2*st.cooldown, r.Config.MaxCooldown)
				}
				st.next = now.Add(r.jitter(st.cooldown))
				st.probe = waiting
				st.failed++
				r.Log.Info().Stringer("server", k).Str("burst", st.lastBurst).AnErr("error", res.Err).Dur("next_in", st.cooldown).
					Msg("probe burst failed: the server stays drained")
				return agent.Action{}, false
			}
			st.probe = passed
		default:
			return agent.Action{}, false
		}
	}
	// passed: a reduced weight first, while still drained; then ready.
	canaryW, reduce := s.State.Initial/4, s.State.Initial >= 4
	if r.Config.Mode == ModeSlowStart {
		canaryW = r.Config.rampStart(s.State.Initial)
		reduce = canaryW < s.State.Initial
		// The first stage's chunk is read from here: a drained server
		// takes no traffic until the ready.
		st.ramp = ramp{next: totals(s)}
	}
	if reduce && s.State.Weight != canaryW {
		return agent.Action{Kind: agent.SetWeight, Backend: s.Backend, Server: s.Server, Weight: canaryW,
			Reason: "re-admission: canary weight before ready (" + st.lastBurst + ")"}, true
	}
	return agent.Action{Kind: agent.Ready, Backend: s.Backend, Server: s.Server, Reason: "re-admission: " + st.lastBurst, Origin: agent.OriginRecovery}, true
}

// startBurst sends a probe burst in a goroutine of the Readmitter's own,
// which Close stops: a step's deadline does not cut a burst short, and
// no burst outlives the agent.
func (r *Readmitter) startBurst(st *server, s agent.ServerView, peerMs int) {
	st.probe = probing
	res := make(chan BurstResult, 1)
	st.result = res
	n, slowMs := r.Config.BurstSize(st.faultRate), st.slowMs
	if st.slowMean && slowMs > 0 {
		// drained for its mean: the share that mean implies, not the
		// window's 5xx rate, which is not why it was drained
		st.meanShare = r.Config.MeanShare(slowMs, peerMs)
		n = r.Config.BurstSize(st.meanShare)
	}
	if r.Prober != nil {
		res <- r.Prober(s, n)
		return
	}
	r.bursts.Add(1)
	go func() {
		defer r.bursts.Done()
		res <- r.burst(r.ctx, s, n, slowMs)
	}()
}

// whileCanary returns full weight once the live (recent) window has
// enough traffic, no excess errors and no excess latency, CanaryFor after
// the reduced weight began.
func (r *Readmitter) whileCanary(b agent.BackendView, s agent.ServerView, now time.Time) (agent.Action, bool) {
	since := s.Changed.At
	if now.Sub(since) < r.Config.CanaryFor || s.Recent.Requests < 50 {
		return agent.Action{}, false
	}
	if now.Before(s.NoDrainUntil) {
		return agent.Action{}, false // the tail guard holds it here
	}
	var peerN, peerX uint64
	var p95 []int
	for _, p := range b.Servers {
		if p.Server != s.Server && p.Serving() {
			peerN += p.Recent.Requests
			peerX += p.Recent.Err5xx
			if p.Recent.Requests > 0 {
				p95 = append(p95, p.Recent.P95Ms)
			}
		}
	}
	peer := 0.0
	if peerN > 0 {
		peer = float64(peerX) / float64(peerN)
	}
	if s.Recent.ErrorRate() > 2*peer+0.005 {
		return agent.Action{}, false // still failing: the policy judges it
	}
	if len(p95) > 0 {
		sort.Ints(p95)
		if s.Recent.P95Ms > 2*p95[len(p95)/2]+5 {
			return agent.Action{}, false
		}
	}
	return agent.Action{Kind: agent.SetWeight, Backend: s.Backend, Server: s.Server, Weight: s.State.Initial,
		Reason: fmt.Sprintf("re-admission: live traffic clean for %v (%d recent requests)", now.Sub(since).Round(time.Second), s.Recent.Requests)}, true
}

// rampStart is the weight a slow start begins at: RampShare of the
// configured weight, at least 1.
func (c Config) rampStart(initial int) int {
	return min(max(int(math.Round(float64(initial)*c.RampShare)), 1), initial)
}

// totals is the server's running request and 5xx counts.
func totals(s agent.ServerView) rules.Counts {
	return rules.Counts{N: s.Window.TotalRequests, X: s.Window.TotalErr5xx}
}

// RampTest is the slow start's test of a server drained at faultRate
// among peers failing at peerRate now: "healthy" is the peers' rate,
// "faulty" the drained rate (at least the rules' 1% floor, what they call
// degraded). The healthy rate is kept within [p1/10, p1/2]: above the
// tenth, so that one error of a healthy server is not near proof
// (ln 10 of the threshold's ln 999); below the half, so that the two
// stay apart when the peers fail too.
func (c Config) RampTest(faultRate, peerRate float64) (rules.SPRT, error) {
	p1 := min(max(faultRate, rules.DefaultConfig().Floor), 0.6)
	p0 := min(max(peerRate, p1/10), p1/2)
	t, err := rules.NewSPRT(p0, p1, c.RampAlpha, c.RampBeta)
	if err != nil {
		return t, fmt.Errorf("slow start: %w", err)
	}
	return t, nil
}

// whileRamp judges a slow start's stage on the live traffic since it
// began: one chunk a step, the server's requests and 5xx since the last.
// Healthy doubles the weight (up to the configured one, where the ledger
// ends the change); faulty drains the server again at once, which the
// ledger counts as a new drain and recovery backs off from.
func (r *Readmitter) whileRamp(b agent.BackendView, k agent.Key, s agent.ServerView, now time.Time) (agent.Action, bool) {
	st := r.servers[k]
	if st == nil {
		// A canary recovery did not start (the agent restarted): judged
		// against the rules' floor as the drained rate.
		st = &server{drainedAt: s.Changed.At, cooldown: r.Config.Cooldown, drains: 1}
		st.ramp.next = totals(s)
		r.servers[k] = st
	}
	rp := &st.ramp
	if now.Before(s.NoDrainUntil) {
		// The tail guard holds it here; once the hold ends, a new test
		// starts from the counts then.
		rp.at, rp.next = time.Time{}, totals(s)
		return agent.Action{}, false
	}
	peerN, peerX, p95 := peers(b, s.Server)
	peer := 0.0
	if peerN > 0 {
		peer = float64(peerX) / float64(peerN)
	}
	cur := totals(s)
	if !rp.at.Equal(s.Changed.At) {
		// A new stage is in force: its test starts from the counts at
		// the step that proposed it.
		t, err := r.Config.RampTest(st.faultRate, peer)
		if err != nil {
			r.Log.Error().Err(err).Stringer("server", k).Msg("slow start: no test; the server stays at its weight")
			return agent.Action{}, false
		}
		rp.at, rp.test, rp.base = s.Changed.At, t, rp.next
	}
	if cur.N < rp.base.N || cur.X < rp.base.X {
		rp.base = rules.Counts{} // the ready forgot its series: counted from zero
	}
	v := rp.test.Feed(cur.N-rp.base.N, cur.X-rp.base.X)
	rp.base = cur
	t := &rp.test
	stage := fmt.Sprintf("weight %d of %d, %d/%d 5xx since %v, log-ratio %.1f in (%.1f, %.1f), healthy %.2g%% against drained %.2g%%",
		s.State.Weight, s.State.Initial, t.X, t.N, now.Sub(s.Changed.At).Round(time.Second), t.LLR, t.B, t.A, 100*t.P0, 100*t.P1)
	switch v {
	case rules.Faulty:
		return agent.Action{Kind: agent.Drain, Backend: s.Backend, Server: s.Server, Origin: agent.OriginRecovery,
			Reason: "slow start: live traffic still at the drained rate (" + stage + ")"}, true
	case rules.Healthy:
		if len(p95) > 0 {
			sort.Ints(p95)
			if s.Recent.Requests > 0 && s.Recent.P95Ms > 2*p95[len(p95)/2]+5 {
				return agent.Action{}, false // errors clean, answers slow: the rules' latency test judges it
			}
		}
		next := min(2*s.State.Weight, s.State.Initial)
		rp.next = cur
		return agent.Action{Kind: agent.SetWeight, Backend: s.Backend, Server: s.Server, Weight: next,
			Reason: "slow start: live traffic healthy (" + stage + ")"}, true
	}
	return agent.Action{}, false
}

// peers pools the other serving servers' recent counts, and lists their
// recent p95.
func peers(b agent.BackendView, self string) (n, x uint64, p95 []int) {
	for _, p := range b.Servers {
		if p.Server != self && p.Serving() {
			n += p.Recent.Requests
			x += p.Recent.Err5xx
			if p.Recent.Requests > 0 {
				p95 = append(p95, p.Recent.P95Ms)
			}
		}
	}
	return n, x, p95
}

// burst sends n probe requests at the configured rate, straight to the
// server; any 5xx or transport error fails it, and it stops at the first.
//
// slowMs > 0 (a drain for a slow tail): an answer at or over slowMs
// fails the burst as a 5xx does. A slow tail leaves the median a healthy
// server's, and the burst judged on the median alone let such a server
// back while still slow, to be drained again seconds later.
func (r *Readmitter) burst(ctx context.Context, s agent.ServerView, n, slowMs int) (res BurstResult) {
	scheme := "http"
	if s.State.UseSSL {
		scheme = "https"
	}
	url := scheme + "://" + net.JoinHostPort(s.State.Addr, strconv.Itoa(s.State.Port)) + r.Config.Path
	period := time.Duration(float64(time.Second) / r.Config.Rate)
	var times []float64
	defer func() { // on every return: the median of what answered
		if len(times) > 0 {
			sort.Float64s(times)
			res.MedianMs = times[len(times)/2]
		}
	}()
	c := r.client
	for i := 0; i < n; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				res.Err = ctx.Err()
				return res
			case <-time.After(period):
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			res.Err = err
			return res
		}
		if r.Config.Host != "" {
			req.Host = r.Config.Host
		}
		req.Header.Set("User-Agent", "hapilot-probe")
		res.Sent++
		t0 := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			res.Failed++
			res.Err = err
			return res
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		took := float64(time.Since(t0)) / float64(time.Millisecond)
		times = append(times, took)
		if resp.StatusCode >= 500 {
			res.Failed++
			return res
		}
		if slowMs > 0 && took >= float64(slowMs) {
			res.Failed++
			res.Slow++
			return res
		}
	}
	return res
}

// Probe says where k's re-admission stands, for hapilot ctl explain:
// when its next probe burst may start, how the last went, how many of
// this drain's bursts failed. ok is false for a server recovery does not
// follow.
func (r *Readmitter) Probe(k agent.Key) (p agent.ProbeStatus, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.servers[k]
	if st == nil {
		return p, false
	}
	return agent.ProbeStatus{Next: st.next, LastBurst: st.lastBurst, FailedBursts: st.failed, Drains: st.drains}, true
}
