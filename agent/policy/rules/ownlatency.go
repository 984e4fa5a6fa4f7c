package rules

import (
	"math"
	"sync"
	"time"

	"github.com/hapilot/hapilot/agent"
)

// OwnLatency keeps each server's own latency baseline as the latency test
// keeps it (SlowBaseline: the log of its window median, learned over
// latencyLearn of judged time, a median more than half the margin above a
// learned baseline not taught), for a policy that judges latency by
// looser thresholds than the rules': the LLM policy's latency candidates.
// A p95 twice its peers' is ordinary for a server that was always that
// much slower (an older machine, a colder cache), and a model shown it
// among its peers alone cannot tell it from one that slowed down; its
// own history can. Safe for concurrent use.
type OwnLatency struct {
	cfg  Config
	mu   sync.Mutex
	at   time.Time
	base map[agent.Key]*latBaseline
}

// NewOwnLatency keeps baselines with c's span, minimum requests and
// margin (LatencyBaselineRatio).
func NewOwnLatency(c Config) *OwnLatency {
	return &OwnLatency{cfg: c, base: map[agent.Key]*latBaseline{}}
}

// Observe teaches each judged server's baseline its window median now
// (a serving server with at least half MinRequests answers in its
// window), weighed by the time since the last observation (at most a
// window's 60 s), and forgets the servers obs no longer holds.
func (o *OwnLatency) Observe(obs agent.Observation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	dt := 1.0
	if !o.at.IsZero() {
		if !obs.Time.After(o.at) {
			return // this observation's second is in already
		}
		dt = min(obs.Time.Sub(o.at).Seconds(), 60)
	}
	o.at = obs.Time
	span := o.cfg.BaselineSpan.Seconds()
	if span <= 0 {
		span = DefaultConfig().BaselineSpan.Seconds()
	}
	seen := map[agent.Key]bool{}
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			k := s.Key()
			seen[k] = true
			if !s.Serving() || s.Window.Requests < max(o.cfg.MinRequests/2, 1) || s.Window.P50Ms <= 0 {
				continue
			}
			bl := o.base[k]
			if bl == nil {
				bl = &latBaseline{}
				o.base[k] = bl
			}
			x := logMs(float64(s.Window.P50Ms))
			if !bl.learned() || x < bl.mean()+o.cfg.slowMargin(bl)/2 {
				bl.add(x, dt, span)
			}
		}
	}
	for k := range o.base {
		if !seen[k] {
			delete(o.base, k)
		}
	}
}

// Departed tells whether a window median of p50 ms is slower than server
// k's own usual: past half the margin above its learned baseline (√3×
// at the defaults, the line above which the baseline stops learning).
// A server whose baseline is not learned yet has departed, so that it is
// judged against its peers alone, as the rules judge it then.
func (o *OwnLatency) Departed(k agent.Key, p50 int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	bl := o.base[k]
	if bl == nil || !bl.learned() || o.cfg.LatencyBaselineRatio <= 0 {
		return true
	}
	return logMs(float64(p50)) >= bl.mean()+o.cfg.slowMargin(bl)/2
}

// Learned tells whether server k's baseline is learned: ten minutes of
// its answers judged.
func (o *OwnLatency) Learned(k agent.Key) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	bl := o.base[k]
	return bl != nil && bl.learned()
}

// Usual is server k's learned median in ms, 0 while it is not learned.
func (o *OwnLatency) Usual(k agent.Key) float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if bl := o.base[k]; bl != nil && bl.learned() {
		return math.Exp(bl.mean())
	}
	return 0
}
