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
	base map[agent.Key]*ownBaseline
}

// ownBaseline is one server's baseline, and the last observation that
// held the server (Observe forgets those an observation no longer holds).
type ownBaseline struct {
	latBaseline
	seen time.Time
}

// NewOwnLatency keeps baselines with c's span, minimum requests and
// margin (LatencyBaselineRatio).
func NewOwnLatency(c Config) *OwnLatency {
	return &OwnLatency{cfg: c, base: map[agent.Key]*ownBaseline{}}
}

// Observe teaches each judged server's baseline its window median now, as
// SlowBaseline teaches the rules' (Config.latencyJudged, Config.teach),
// weighed by the time since the last observation (at most a window's
// 60 s), and forgets the servers obs no longer holds. A server no longer
// judged (drained) keeps its baseline.
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
	span := o.cfg.baselineSpan()
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			k := s.Key()
			bl := o.base[k]
			if bl == nil {
				bl = &ownBaseline{}
				o.base[k] = bl
			}
			bl.seen = obs.Time
			if o.cfg.latencyJudged(s) && s.Window.P50Ms > 0 {
				o.cfg.teach(&bl.latBaseline, logMs(float64(s.Window.P50Ms)), dt, span)
			}
		}
	}
	for k, bl := range o.base {
		if !bl.seen.Equal(obs.Time) {
			delete(o.base, k)
		}
	}
}

// Departed tells whether a window median of p50 ms is slower than server
// k's own usual: past half the margin above its learned baseline (√3×
// at the defaults, the line above which the baseline stops learning:
// Config.departed). A server whose baseline is not learned yet has
// departed, so that it is judged against its peers alone, as the rules
// judge it then.
func (o *OwnLatency) Departed(k agent.Key, p50 int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	bl := o.base[k]
	if bl == nil || !bl.learned() || o.cfg.LatencyBaselineRatio <= 0 {
		return true
	}
	return o.cfg.departed(&bl.latBaseline, logMs(float64(p50)))
}

// Learned tells whether server k's baseline is learned: LatencyLearn of
// its answers judged.
func (o *OwnLatency) Learned(k agent.Key) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	bl := o.base[k]
	return bl != nil && bl.learned()
}

// usual is server k's learned median in ms, 0 while it is not learned
// (for tests).
func (o *OwnLatency) usual(k agent.Key) float64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if bl := o.base[k]; bl != nil && bl.learned() {
		return math.Exp(bl.mean())
	}
	return 0
}
