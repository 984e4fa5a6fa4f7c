package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/window"
	"github.com/rs/zerolog"
)

// Runtime is the part of the runtime API the loop uses; *haproxy.Client
// implements it, tests use a recording fake.
type Runtime interface {
	Addr() string
	ShowServersState(ctx context.Context) ([]haproxy.ServerState, error)
	SetServerState(ctx context.Context, backend, server string, st haproxy.AdminState) error
	SetWeight(ctx context.Context, backend, server string, weight int) error
	ShowInfo(ctx context.Context) (haproxy.Info, error)
	ShowStat(ctx context.Context) ([]haproxy.StatRow, error)
}

// Windows is where observations come from; *window.Store implements it.
type Windows interface {
	Snapshot(last time.Duration) []window.Stats
}

// Recovery proposes re-admissions each step (see agent/recovery). Its
// actions pass the guardrails like any policy's.
type Recovery interface {
	Plan(ctx context.Context, obs Observation) Plan
}

// forgetter is a Windows that can drop a series' history.
type forgetter interface {
	Forget(backend, server string)
}

// Clock is the loop's time: real in production, driven by hand in tests.
type Clock interface {
	Now() time.Time
	// SleepUntil returns at t, or early with ctx's error.
	SleepUntil(ctx context.Context, t time.Time) error
}

// RealClock is the wall clock.
type RealClock struct{}

func (RealClock) Now() time.Time { return time.Now() }

func (RealClock) SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}

// Change is a change the agent made and still holds.
type Change struct {
	Kind   Kind      `json:"kind"`
	Weight int       `json:"weight,omitempty"` // for set_weight
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
	// ErrorRate is the server's 5xx rate when it was drained, which sizes
	// the probe burst that may bring it back.
	ErrorRate float64 `json:"error_rate,omitempty"`
	// BaselineP99Ms is the backend's recent p99 just before a drain, what
	// the tail-latency guard compares against.
	BaselineP99Ms float64 `json:"baseline_p99_ms,omitempty"`
	// NoDrainUntil: the tail-latency guard brought the server back at a
	// reduced weight; it is not drained again before this.
	NoDrainUntil time.Time `json:"no_drain_until,omitempty"`
	// Epoch names the HAProxy processes the change was applied to (see
	// haproxy.Info.Instance). A server back at its configured state under
	// a new epoch lost the change to a reload or restart; under the same
	// epoch, someone undid it.
	Epoch string `json:"epoch"`
}

// CommandResult is one command sent to one HAProxy.
type CommandResult struct {
	Socket  string `json:"socket"`
	Command string `json:"command"`
	Error   string `json:"error,omitempty"`
}

// ServerSummary is a server's line in the audit log.
type ServerSummary struct {
	Backend  string `json:"backend"`
	Server   string `json:"server"`
	State    string `json:"state"`
	Owner    Owner  `json:"owner"`
	Weight   int    `json:"weight"`
	Requests uint64 `json:"requests"`
	Err5xx   uint64 `json:"err_5xx"`
	P99Ms    int    `json:"p99_ms"`
}

// Record is one step's audit line.
type Record struct {
	Time         time.Time       `json:"time"`
	Cycle        uint64          `json:"cycle"`
	Policy       string          `json:"policy"`
	DurationMs   float64         `json:"duration_ms"`
	Servers      []ServerSummary `json:"servers"`
	Plan         Plan            `json:"plan"`
	PolicyError  string          `json:"policy_error,omitempty"`
	PolicyReport any             `json:"policy_report,omitempty"`
	Verdicts     []Verdict       `json:"verdicts"`
	Commands     []CommandResult `json:"commands"`
	// Partial lists actions some HAProxy processes took and others did
	// not: never silently half-done.
	Partial []string `json:"partial,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// Decision is a verdict with its time, for /status.
type Decision struct {
	Time  time.Time `json:"time"`
	Cycle uint64    `json:"cycle"`
	Verdict
	Error string `json:"error,omitempty"`

	repeat bool // the same refusal as the step before: counted, not listed again
}

// Loop is the decision goroutine. Set the exported fields, then call Run,
// or Step to drive it by hand.
type Loop struct {
	Clock    Clock
	Interval time.Duration
	Lookback time.Duration // how much of the windows a policy sees; 0 = all
	// RecentSpan is the short window for load and tail latency (default
	// 10 s): the long one still holds the time before the last action.
	RecentSpan time.Duration
	Policy     Policy
	Guard      Guardrails
	Runtimes   []Runtime
	Windows    Windows
	Recovery   Recovery  // nil: drained servers stay drained
	Audit      io.Writer // one JSON line per step; nil for none
	Log        zerolog.Logger
	// StateFile keeps the agent's changes across its own restarts
	// (replaced atomically on every change); "" keeps them in memory.
	StateFile string
	// NoStepBudget lets a step run as long as its policy takes, as the
	// study's loop did: the cadence slips instead of the call being cut
	// short. Only `hapilot bench` sets it, to show what deadlines buy.
	NoStepBudget bool

	mu      sync.Mutex // guards what follows, read by Status and Metrics
	cycle   uint64
	loaded  bool
	epoch   string
	restore Plan // changes lost to a reload, found by observe
	ledger  map[string]*Change
	last    Observation
	recent  []Decision
	metrics counters
	// lastRefusals: what was refused last step and why, so that a policy
	// repeating a refused proposal is logged once at warn, then at debug.
	lastRefusals map[string]string
}

type counters struct {
	cycles, applied, refused, commandErrors, policyErrors, stateErrors, skipped uint64
	durationSum, durationLast, durationMax                                      float64
}

const recentDecisions = 64

// Run steps at start + k·interval until ctx ends. A step that overruns
// its slot makes the loop skip the slots it missed (counted), never queue
// them: steps do not pile up.
func (l *Loop) Run(ctx context.Context) error {
	if l.Interval <= 0 {
		return errors.New("agent: interval must be positive")
	}
	start := l.Clock.Now()
	for k := int64(0); ; k++ {
		slot := start.Add(time.Duration(k) * l.Interval)
		if err := l.Clock.SleepUntil(ctx, slot); err != nil {
			return nil
		}
		// A step ends before the next slot, however stuck a socket or a
		// policy is: 90% of the interval is its whole budget.
		sctx, cancel := context.WithDeadline(ctx, slot.Add(l.Interval*9/10))
		if l.NoStepBudget {
			sctx, cancel = context.WithCancel(ctx)
		}
		l.Step(sctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if late := l.Clock.Now().Sub(slot); late >= l.Interval {
			missed := int64(late / l.Interval) // slots whose time passed during this step
			l.mu.Lock()
			l.metrics.skipped += uint64(missed)
			l.mu.Unlock()
			l.Log.Warn().Dur("step", late).Int64("slots_skipped", missed).Msg("step overran its interval")
			k += missed
		}
	}
}

func key(backend, server string) string { return backend + "/" + server }

// Step runs one observe-decide-vet-apply-audit cycle.
func (l *Loop) Step(ctx context.Context) Record {
	began := l.Clock.Now()
	l.mu.Lock()
	l.cycle++
	rec := Record{Time: began, Cycle: l.cycle, Policy: l.Policy.Name(), Plan: Plan{}, Verdicts: []Verdict{}, Commands: []CommandResult{}}
	if !l.loaded {
		l.loaded = true
		l.ledger = map[string]*Change{}
		if err := l.loadState(); err != nil {
			l.Log.Error().Err(err).Str("file", l.StateFile).Msg("cannot read the state file; starting with no record of earlier changes")
		}
	}
	l.mu.Unlock()

	obs, err := l.observe(ctx, began, rec.Cycle)
	if err != nil {
		rec.Error = err.Error()
		l.Log.Error().Err(err).Uint64("cycle", rec.Cycle).Msg("cannot read server states; not acting this step")
		l.finish(&rec, began, nil)
		return rec
	}
	rec.Servers = summarize(&obs)

	plan, err := l.Policy.Decide(ctx, obs)
	if err != nil {
		rec.PolicyError = err.Error()
		l.Log.Warn().Err(err).Str("policy", rec.Policy).Msg("policy failed; no action this step")
		plan = nil
	}
	l.mu.Lock()
	restores := l.restore
	l.restore = nil
	l.mu.Unlock()
	if l.Recovery != nil {
		restores = append(restores, l.Recovery.Plan(ctx, obs)...)
	}
	plan = append(restores, plan...)
	if plan != nil {
		rec.Plan = plan
	}
	if r, ok := l.Policy.(Reporter); ok {
		rec.PolicyReport = r.Report()
	}
	rec.Verdicts = l.Guard.Vet(&obs, plan)
	decisions := make([]Decision, 0, len(rec.Verdicts))
	refusals := map[string]string{}
	for _, v := range rec.Verdicts {
		d := Decision{Time: began, Cycle: rec.Cycle, Verdict: v}
		if !v.Accepted {
			rk := string(v.Proposed.Kind) + " " + key(v.Proposed.Backend, v.Proposed.Server)
			refusals[rk] = v.Reason
			ev := l.Log.Warn()
			if l.lastRefusals[rk] == v.Reason {
				ev = l.Log.Debug() // the same refusal as last step
				d.repeat = true
			}
			ev.Str("action", string(v.Proposed.Kind)).Str("server", key(v.Proposed.Backend, v.Proposed.Server)).
				Str("reason", v.Reason).Msg("guardrail refused action")
			decisions = append(decisions, d)
			continue
		}
		results := l.apply(ctx, &obs, v.Applied)
		rec.Commands = append(rec.Commands, results...)
		var errs []string
		for _, r := range results {
			if r.Error != "" {
				errs = append(errs, r.Socket+": "+r.Error)
			}
		}
		if len(errs) > 0 {
			d.Error = fmt.Sprint(errs)
			if len(errs) < len(results) {
				d.Error = fmt.Sprintf("partial: applied on %d of %d HAProxy: %v", len(results)-len(errs), len(results), errs)
				rec.Partial = append(rec.Partial, fmt.Sprintf("%s %s", v.Applied.Kind, key(v.Applied.Backend, v.Applied.Server)))
				l.Log.Error().Str("action", string(v.Applied.Kind)).Str("server", key(v.Applied.Backend, v.Applied.Server)).
					Strs("errors", errs).Msg("action applied on some HAProxy processes only")
			}
		}
		l.Log.Info().Str("action", string(v.Applied.Kind)).Str("server", key(v.Applied.Backend, v.Applied.Server)).
			Int("weight", v.Applied.Weight).Str("reason", v.Applied.Reason).Strs("errors", errs).Msg("applied action")
		decisions = append(decisions, d)
	}
	l.lastRefusals = refusals
	l.finish(&rec, began, decisions)
	l.mu.Lock()
	l.last = obs
	l.mu.Unlock()
	return rec
}

func (l *Loop) finish(rec *Record, began time.Time, decisions []Decision) {
	dur := l.Clock.Now().Sub(began).Seconds()
	rec.DurationMs = dur * 1000
	l.mu.Lock()
	m := &l.metrics
	m.cycles++
	m.durationSum += dur
	m.durationLast = dur
	m.durationMax = max(m.durationMax, dur)
	if rec.Error != "" {
		m.stateErrors++
	}
	if rec.PolicyError != "" {
		m.policyErrors++
	}
	for _, d := range decisions {
		if d.Accepted {
			m.applied++
		} else {
			m.refused++
		}
	}
	for _, c := range rec.Commands {
		if c.Error != "" {
			m.commandErrors++
		}
	}
	for _, d := range decisions {
		if !d.repeat {
			l.recent = append(l.recent, d)
		}
	}
	if n := len(l.recent); n > recentDecisions {
		l.recent = append(l.recent[:0], l.recent[n-recentDecisions:]...)
	}
	l.mu.Unlock()
	if l.Audit != nil {
		b, err := json.Marshal(rec)
		if err == nil {
			b = append(b, '\n')
			_, err = l.Audit.Write(b)
		}
		if err != nil {
			l.Log.Error().Err(err).Msg("cannot write audit record")
		}
	}
}

// observe merges every HAProxy's server states with the windows and works
// out who holds each server.
func (l *Loop) observe(ctx context.Context, now time.Time, cycle uint64) (Observation, error) {
	if len(l.Runtimes) == 0 {
		return Observation{}, errors.New("no runtime socket")
	}
	merged := map[string]*haproxy.ServerState{}
	seenBy := map[string]int{}
	var order []string
	var instances []string
	maxconn := map[string]int{}
	respTime := map[string]int{}
	for _, rt := range l.Runtimes {
		info, err := rt.ShowInfo(ctx)
		if err != nil {
			return Observation{}, fmt.Errorf("read info from %s: %w", rt.Addr(), err)
		}
		instances = append(instances, info.Instance())
		rows, err := rt.ShowStat(ctx)
		if err != nil {
			return Observation{}, fmt.Errorf("read stats from %s: %w", rt.Addr(), err)
		}
		for _, r := range rows {
			if r["svname"] == "BACKEND" || r["svname"] == "FRONTEND" {
				continue
			}
			k := key(r["pxname"], r["svname"])
			if lim := int(r.Int("slim")); lim > 0 {
				if cur, ok := maxconn[k]; !ok || lim < cur {
					maxconn[k] = lim
				}
			}
			if rt := int(r.Int("rtime")); rt > respTime[k] {
				respTime[k] = rt
			}
		}
		states, err := rt.ShowServersState(ctx)
		if err != nil {
			return Observation{}, fmt.Errorf("read states from %s: %w", rt.Addr(), err)
		}
		for _, s := range states {
			k := key(s.Backend, s.Server)
			seenBy[k]++
			m, ok := merged[k]
			if !ok {
				c := s
				merged[k] = &c
				order = append(order, k)
				continue
			}
			// A server serves only if every HAProxy lets it.
			m.AdminState |= s.AdminState
			m.Weight = min(m.Weight, s.Weight)
			if s.OpState != haproxy.OpRunning {
				m.OpState = s.OpState
			}
		}
	}
	stats := map[string]window.Stats{}
	for _, st := range l.Windows.Snapshot(l.Lookback) {
		stats[key(st.Backend, st.Server)] = st
	}
	span := l.RecentSpan
	if span <= 0 {
		span = 10 * time.Second
	}
	recent := map[string]window.Stats{}
	for _, st := range l.Windows.Snapshot(span) {
		recent[key(st.Backend, st.Server)] = st
	}
	obs := Observation{Time: now, Cycle: cycle, Lookback: l.Lookback, RecentSpan: span}
	index := map[string]int{}
	l.mu.Lock()
	defer l.mu.Unlock()
	if epoch := strings.Join(instances, ","); epoch != l.epoch {
		if l.epoch != "" {
			l.Log.Warn().Str("was", l.epoch).Str("now", epoch).Msg("HAProxy reloaded or restarted")
		}
		l.epoch = epoch
	}
	forgotten := len(l.ledger)
	seen := map[string]bool{}
	for _, k := range order {
		if seenBy[k] != len(l.Runtimes) {
			continue // only servers every HAProxy knows can be acted on
		}
		s := *merged[k]
		seen[k] = true
		v := ServerView{Backend: s.Backend, Server: s.Server, State: s, Window: stats[k], Recent: recent[k], MaxConn: maxconn[k], RespTimeMs: respTime[k]}
		v.Window.Backend, v.Window.Server = s.Backend, s.Server
		v.Recent.Backend, v.Recent.Server = s.Backend, s.Server
		v.Owner, v.Changed = l.reconcile(k, s)
		bi, ok := index[s.Backend]
		if !ok {
			bi = len(obs.Backends)
			index[s.Backend] = bi
			obs.Backends = append(obs.Backends, BackendView{Name: s.Backend})
		}
		obs.Backends[bi].Servers = append(obs.Backends[bi].Servers, v)
	}
	for k := range l.ledger {
		if !seen[k] {
			l.Log.Warn().Str("server", k).Msg("server the agent changed is gone from HAProxy; forgetting the change")
			delete(l.ledger, k)
		}
	}
	if len(l.ledger) != forgotten {
		l.saveState()
	}
	sort.Slice(obs.Backends, func(i, j int) bool { return obs.Backends[i].Name < obs.Backends[j].Name })
	return obs, nil
}

// reconcile decides who holds a server. An agent change that a reload
// lost (the server is back at its configured state under a new epoch) is
// queued to be applied again; one that someone else undid or replaced is
// forgotten, and the server left to them. Called with l.mu held.
func (l *Loop) reconcile(k string, s haproxy.ServerState) (Owner, *Change) {
	if ch := l.ledger[k]; ch != nil {
		ours := false
		switch ch.Kind {
		case Drain:
			ours = s.AdminState == haproxy.AdminForcedDrain
		case SetWeight:
			ours = s.AdminState == 0 && s.Weight == ch.Weight
		}
		pristine := s.AdminState == 0 && s.Weight == s.Initial
		switch {
		case ours:
			ch.Epoch = l.epoch
			c := *ch
			return OwnerAgent, &c
		case pristine && ch.Epoch != l.epoch:
			l.Log.Warn().Str("server", k).Str("change", string(ch.Kind)).Msg("a reload lost the agent's change; applying it again")
			l.restore = append(l.restore, Action{Kind: ch.Kind, Backend: s.Backend, Server: s.Server, Weight: ch.Weight,
				Reason: "re-applied after a reload: " + ch.Reason, Restore: true})
			c := *ch
			return OwnerAgent, &c
		}
		l.Log.Warn().Str("server", k).Str("change", string(ch.Kind)).Str("now", s.Label()).Int("weight", s.Weight).
			Msg("the agent's change was overridden outside the agent; leaving the server to the operator")
		delete(l.ledger, k)
	}
	if s.AdminState != 0 || s.Weight != s.Initial {
		return OwnerOperator, nil
	}
	return OwnerNone, nil
}

// apply sends one vetted action to every HAProxy and records it in the
// ledger when at least one took it.
func (l *Loop) apply(ctx context.Context, obs *Observation, a Action) []CommandResult {
	_, sv := obs.Find(a.Backend, a.Server)
	var results []CommandResult
	okCount := 0
	for _, rt := range l.Runtimes {
		var cmd string
		var err error
		switch a.Kind {
		case Drain:
			cmd = fmt.Sprintf("set server %s/%s state drain", a.Backend, a.Server)
			err = rt.SetServerState(ctx, a.Backend, a.Server, haproxy.StateDrain)
		case Ready:
			if sv.Changed != nil && sv.Changed.Kind == SetWeight {
				cmd = fmt.Sprintf("set weight %s/%s %d", a.Backend, a.Server, sv.State.Initial)
				err = rt.SetWeight(ctx, a.Backend, a.Server, sv.State.Initial)
			} else {
				cmd = fmt.Sprintf("set server %s/%s state ready", a.Backend, a.Server)
				err = rt.SetServerState(ctx, a.Backend, a.Server, haproxy.StateReady)
			}
		case SetWeight:
			cmd = fmt.Sprintf("set weight %s/%s %d", a.Backend, a.Server, a.Weight)
			err = rt.SetWeight(ctx, a.Backend, a.Server, a.Weight)
		}
		r := CommandResult{Socket: rt.Addr(), Command: cmd}
		if err != nil {
			r.Error = err.Error()
		} else {
			okCount++
		}
		results = append(results, r)
	}
	if okCount == 0 {
		return results
	}
	k := key(a.Backend, a.Server)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.Clock.Now()
	switch {
	case a.Restore:
		if ch := l.ledger[k]; ch != nil {
			ch.Epoch = l.epoch
		}
	case a.Kind == Ready && sv.Changed != nil && sv.Changed.Kind == Drain && sv.State.Weight != sv.State.Initial:
		// Back in rotation at a reduced (canary) weight: the weight is
		// still the agent's to raise.
		l.ledger[k] = &Change{Kind: SetWeight, Weight: sv.State.Weight, At: now, Reason: a.Reason, Epoch: l.epoch}
		if a.NoDrainFor > 0 {
			l.ledger[k].NoDrainUntil = now.Add(a.NoDrainFor)
		}
	case a.Kind == Ready, a.Kind == SetWeight && a.Weight == sv.State.Initial && sv.Changed != nil && sv.Changed.Kind == SetWeight:
		delete(l.ledger, k)
	case a.Kind == Drain:
		b, _ := obs.Find(a.Backend, a.Server)
		p99, _ := b.RecentP99()
		l.ledger[k] = &Change{Kind: Drain, At: now, Reason: a.Reason, Epoch: l.epoch, ErrorRate: sv.Window.ErrorRate(), BaselineP99Ms: p99}
	case a.Kind == SetWeight && (sv.Changed == nil || sv.Changed.Kind == SetWeight):
		l.ledger[k] = &Change{Kind: SetWeight, Weight: a.Weight, At: now, Reason: a.Reason, Epoch: l.epoch}
	}
	l.saveState()
	if a.Kind == Ready && sv.Changed != nil && sv.Changed.Kind == Drain {
		if f, ok := l.Windows.(forgetter); ok {
			f.Forget(a.Backend, a.Server) // its pre-drain errors are history
		}
	}
	return results
}

// Undo readies every server the agent drained and puts back every weight
// it changed, on every HAProxy (`--on-exit restore`).
func (l *Loop) Undo(ctx context.Context) []CommandResult {
	l.mu.Lock()
	if !l.loaded {
		l.loaded, l.ledger = true, map[string]*Change{}
		_ = l.loadState()
	}
	cycle := l.cycle
	l.mu.Unlock()
	obs, err := l.observe(ctx, l.Clock.Now(), cycle)
	if err != nil {
		l.Log.Error().Err(err).Msg("cannot read server states: the agent's changes stay in place")
		return nil
	}
	var out []CommandResult
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			if s.Owner == OwnerAgent {
				out = append(out, l.apply(ctx, &obs, Action{Kind: Ready, Backend: s.Backend, Server: s.Server, Reason: "agent exit"})...)
			}
		}
	}
	return out
}

func summarize(obs *Observation) []ServerSummary {
	var out []ServerSummary
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			out = append(out, ServerSummary{
				Backend: s.Backend, Server: s.Server, State: s.State.Label(), Owner: s.Owner, Weight: s.State.Weight,
				Requests: s.Window.Requests, Err5xx: s.Window.Err5xx, P99Ms: s.Window.P99Ms,
			})
		}
	}
	return out
}

// Ledger returns the agent's changes in force, keyed "backend/server".
func (l *Loop) Ledger() map[string]Change {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]Change, len(l.ledger))
	for k, c := range l.ledger {
		out[k] = *c
	}
	return out
}
