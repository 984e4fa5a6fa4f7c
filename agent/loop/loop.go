package loop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/ledger"
	"github.com/rs/zerolog"
)

// Loop is the decision goroutine. Set the exported fields, then call Run,
// or Step to drive it by hand.
type Loop struct {
	agent.Settings
	Clock    agent.Clock
	Lookback time.Duration // how much of the windows a policy sees; 0 = all
	// RecentSpan is the short window for load and tail latency (default
	// 10 s): the long one still holds the time before the last action.
	RecentSpan time.Duration
	Policy     agent.Policy
	// Guard bounds every plan; the policy's Needs may widen its drain cap.
	Guard    guard.Guardrails
	Runtimes []agent.Runtime
	Windows  agent.Windows
	Recovery agent.Recovery // nil: drained servers stay drained
	Audit    io.Writer      // one JSON line per step (--audit-steps); nil for none
	// Events receives what happened (actions, refusals, would-actions,
	// operator commands), each once; nil for none. Identity stamps them.
	Events   agent.EventSink
	Identity agent.Identity
	Log      zerolog.Logger
	// NoStepBudget lets a step, and its policy call, run as long as the
	// policy takes: the cadence slips instead of the call being cut short.
	// No setting of the agent sets it; the lab's rerun of the study's
	// unguarded loop does (internal/lab/bench.StudyLoop).
	NoStepBudget bool

	// st is what the loop keeps from one step to the next, which its
	// Control and View share.
	st state
}

// state is the loop's memory between steps, and its locks.
type state struct {
	ledgerOnce sync.Once
	ledger     *ledger.Ledger
	// alone: the servers the last step left alone, and why (kinds.go).
	alone alone
	// addrs: each server's address at the last step (readdress); only
	// Step touches it.
	addrs map[agent.Key]string
	// lastRefusals: what was refused last step and why, so that a policy
	// repeating a refused proposal is logged once at warn, then at debug;
	// refusedServers, the same by server, for the next observation. Only
	// Step touches them.
	lastRefusals   map[agent.ActionID]string
	refusedServers map[agent.Key]string
	// reapplyLogged: the HAProxy epoch each lost change was last logged
	// under, so that one held back step after step is logged once.
	reapplyLogged map[agent.Key]string
	// fallingBack: the last step's report named a fallback (the model's
	// policy left the step to the rules), so that a run of them is one
	// event.
	fallingBack bool
	// lastWould: the would-actions of the last step, so that one held
	// back step after step is logged once at info, then at debug.
	lastWould map[agent.ActionID]string

	// stepMu makes a step and an operator's command (release, restore)
	// take turns: both read the servers and change them through the
	// ledger. It guards inventoried and drains below.
	stepMu sync.Mutex
	// places: each server's place in the windows' last read, kept from
	// step to step. Only observe touches it, under stepMu.
	places viewPlaces
	// inventoried: the first step that read HAProxy listed every server
	// found in drain or maint and who holds it.
	inventoried bool
	// drains is each backend's drains of the last hour, for the rate
	// cap. Only Step and the operator's commands touch it, under stepMu.
	drains guard.DrainLog

	// wakeMu guards woken and wakeSleep: Wake (any goroutine) ends the
	// loop's sleep between ticks, so that a reload's lost changes go back
	// at once, not at the next tick.
	wakeMu    sync.Mutex
	woken     string             // why the next sleep ends at once; "" for none
	wakeSleep context.CancelFunc // ends the sleep under way; nil while not sleeping

	mu    sync.Mutex // guards what follows: Step writes, Status and Metrics read
	cycle uint64
	// candidates: the servers the policy's test found at the last step
	// or check. A check steps only for a server not in it; /status shows
	// it.
	candidates []agent.Key
	last       agent.Observation
	recent     []agent.Decision
	metrics    agent.Counters
	// inventory is what the first step found held (drain, maint, or a
	// weight the agent set), and by whom.
	inventory []Held
	// wouldNow is what the last step held back, for /metrics.
	wouldNow []agent.Would
	// lastHour is the last step's drains of the last hour, by backend.
	lastHour map[string]int
}

const recentDecisions = 64

// MaxTriggered bounds the steps evidence may run between two ticks.
const MaxTriggered = 3

// theLedger is the loop's ledger, read from StateFile on first use
// unless OpenState read it before.
func (l *Loop) theLedger() *ledger.Ledger {
	l.st.ledgerOnce.Do(func() { l.setLedger(ledger.New(l.StateFile, l.Log)) })
	return l.st.ledger
}

func (l *Loop) setLedger(lg *ledger.Ledger) {
	lg.OperatorHold = l.OperatorHold
	if l.ReapplyWithin > 0 { // else the ledger's default
		lg.ReapplyWithin = l.ReapplyWithin
	}
	if l.Clock != nil {
		lg.Now = l.Clock.Now
	}
	l.st.ledger = lg
}

// OpenState reads the state file before the loop runs: a path that is
// not a regular file (a FIFO, a link, a directory) is an error here, for
// the agent to refuse to start (see ledger.Open). Without it, the first
// use reads the file and keeps such a path aside.
func (l *Loop) OpenState() error {
	var err error
	l.st.ledgerOnce.Do(func() {
		var lg *ledger.Ledger
		if lg, err = ledger.Open(l.StateFile, l.Log); err == nil {
			l.setLedger(lg)
		}
	})
	if err != nil {
		l.st.ledgerOnce = sync.Once{} // nothing was read: a later use reads again
	}
	return err
}

// FlushState writes the state file again if a write failed, and says
// where it stands: each step starts with it, and the agent's exit.
func (l *Loop) FlushState() ledger.SaveStatus { return l.theLedger().Flush() }

// WriteStateInBackground writes the state file from a goroutine of its
// own from now on (Ledger.WriteInBackground): a hung disk never stops
// the loop. stop writes the latest state and ends it, waiting at most
// its bound.
func (l *Loop) WriteStateInBackground() (stop func(wait time.Duration) ledger.SaveStatus) {
	return l.theLedger().WriteInBackground()
}

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
		if err := l.waitFor(ctx, slot); err != nil {
			return nil
		}
		l.stepIn(ctx, slot)
		if ctx.Err() != nil {
			return nil
		}
		if late := l.Clock.Now().Sub(slot); late >= l.Interval {
			missed := int64(late / l.Interval) // slots whose time passed during this step
			l.st.mu.Lock()
			l.st.metrics.Skipped += uint64(missed)
			l.st.mu.Unlock()
			l.Log.Warn().Dur("step", late).Int64("slots_skipped", missed).Msg("step overran its interval")
			k += missed
		}
	}
}

// Wake runs a step now, between ticks, for why (the stats path saw a new
// HAProxy process: a reload or restart put back every server's configured
// state, and the agent's drains must go back in the same step, not at
// the next tick). Wakes that come while a step runs are one more step
// after it. Safe from any goroutine.
func (l *Loop) Wake(why string) {
	l.st.wakeMu.Lock()
	defer l.st.wakeMu.Unlock()
	l.st.woken = why
	if l.st.wakeSleep != nil {
		l.st.wakeSleep()
	}
}

// sleep sleeps until t, or until Wake: then it returns why.
func (l *Loop) sleep(ctx context.Context, t time.Time) (woken string, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l.st.wakeMu.Lock()
	if woken = l.st.woken; woken != "" {
		l.st.woken = ""
		l.st.wakeMu.Unlock()
		return woken, nil
	}
	l.st.wakeSleep = cancel
	l.st.wakeMu.Unlock()
	err = l.Clock.SleepUntil(sctx, t)
	l.st.wakeMu.Lock()
	l.st.wakeSleep = nil
	woken, l.st.woken = l.st.woken, ""
	l.st.wakeMu.Unlock()
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	if woken != "" {
		return woken, nil
	}
	return "", err
}

// waitFor sleeps until slot, checking the evidence every EvidenceCheck on
// the way when the policy can tell it, and stepping at once on Wake.
func (l *Loop) waitFor(ctx context.Context, slot time.Time) error {
	evidence := l.Policy.Evidence != nil && l.EvidenceCheck > 0
	for triggered := 0; ; {
		next, check := slot, false
		// A check so close to the tick would only run its step early.
		if n := l.Clock.Now().Add(l.EvidenceCheck); evidence && !n.Add(l.EvidenceCheck/2).After(slot) {
			next, check = n, true
		}
		woken, err := l.sleep(ctx, next)
		if err != nil {
			return err
		}
		if woken != "" {
			l.Log.Info().Str("why", woken).Msg("stepping now, between ticks")
			sctx, cancel := context.WithDeadline(ctx, slot)
			l.stepWoken(sctx, woken)
			cancel()
			continue
		}
		if !check {
			return nil
		}
		if triggered >= MaxTriggered {
			continue
		}
		if fresh := l.newEvidence(); len(fresh) > 0 {
			triggered++
			sctx, cancel := context.WithDeadline(ctx, slot)
			l.step(sctx, fresh)
			cancel()
		}
	}
}

// newEvidence runs the policy's test on the last step's servers with the
// windows as they are now, and returns the servers it finds that the last
// step or check did not.
func (l *Loop) newEvidence() []agent.Key {
	l.st.mu.Lock()
	last, known := l.st.last, toSet(l.st.candidates)
	l.st.mu.Unlock()
	if last.Time.IsZero() {
		return nil // no step yet: nothing known of the servers' states
	}
	var fresh []agent.Key
	found := l.Policy.Evidence(l.refreshed(last))
	for _, k := range found {
		if !known[k] {
			fresh = append(fresh, k)
		}
	}
	l.setCandidates(found)
	return fresh
}

// setCandidates keeps what the policy's test found, for the next check
// and for /status.
func (l *Loop) setCandidates(found []agent.Key) {
	l.st.mu.Lock()
	l.st.candidates = found
	l.st.mu.Unlock()
}

// refreshed is a copy of obs with the windows read again.
func (l *Loop) refreshed(obs agent.Observation) agent.Observation {
	windows := l.readWindows(obs.Lookback, obs.RecentSpan)
	obs.Time = l.Clock.Now()
	backends := make([]agent.BackendView, len(obs.Backends))
	for i, b := range obs.Backends {
		servers := make([]agent.ServerView, len(b.Servers))
		for j, s := range b.Servers {
			windows.set(&s)
			servers[j] = s
		}
		b.Servers = servers
		backends[i] = b
	}
	obs.Backends = backends
	return obs
}

func toSet(keys []agent.Key) map[agent.Key]bool {
	m := make(map[agent.Key]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// stepIn runs the step of one slot. It ends before the next slot, however
// stuck a socket or a policy is: StepBudget is its whole budget, unless
// NoStepBudget is set (the lab's study loop).
func (l *Loop) stepIn(ctx context.Context, slot time.Time) {
	sctx, cancel := context.WithDeadline(ctx, slot.Add(l.StepBudget()))
	if l.NoStepBudget {
		sctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	l.Step(sctx)
}

// Step runs one observe-decide-vet-apply-audit cycle.
func (l *Loop) Step(ctx context.Context) agent.Record { return l.step(ctx, nil) }

// step runs one cycle; triggeredBy names the servers whose evidence ran
// it between ticks, nil for a scheduled step. A triggered step leaves
// recovery to the ticks.
func (l *Loop) step(ctx context.Context, triggeredBy []agent.Key) agent.Record {
	return l.stepFor(ctx, triggeredBy, "")
}

// stepWoken is the step Wake asks for: like a triggered one, it leaves
// recovery to the ticks.
func (l *Loop) stepWoken(ctx context.Context, why string) agent.Record {
	return l.stepFor(ctx, nil, why)
}

func (l *Loop) stepFor(ctx context.Context, triggeredBy []agent.Key, woken string) agent.Record {
	l.st.stepMu.Lock()
	defer l.st.stepMu.Unlock()
	began := l.Clock.Now()
	// A state file a write failed on is written again before anything
	// else: its changes must not wait for the next one.
	l.FlushState()
	// The step's transitions are one write of the state file, at its end.
	defer l.theLedger().Batch()()
	rec := l.begin(began)
	rec.TriggeredBy, rec.Woken = triggeredBy, woken
	obs, reapply, found, err := l.observe(ctx, began, rec.Cycle)
	if err != nil {
		rec.Error = err.Error()
		l.Log.Error().Err(err).Uint64("cycle", rec.Cycle).Msg("cannot read server states; not acting this step")
		l.finish(&rec, nil, began, nil)
		return rec
	}
	l.settle(found)
	rec.Servers = summarize(&obs)
	obs.Refused = l.st.refusedServers
	rec.Plan = append(rec.Plan, l.plan(ctx, obs, reapply, &rec)...)
	if l.Policy.Evidence != nil {
		l.setCandidates(l.Policy.Evidence(obs))
	}
	obs.DrainsLastHour = l.drainsLastHour(obs, began)
	rec.Verdicts = l.Guard.For(l.Policy.Needs).Vet(&obs, rec.Plan)
	decisions := l.act(ctx, &obs, &rec)
	l.finish(&rec, &obs, began, decisions)
	return rec
}

// begin numbers the step and opens its record.
func (l *Loop) begin(now time.Time) agent.Record {
	l.st.mu.Lock()
	l.st.cycle++
	cycle := l.st.cycle
	l.st.mu.Unlock()
	return agent.Record{Time: now, Cycle: cycle, Policy: l.Policy.Name(), Plan: agent.Plan{}, Verdicts: []agent.Verdict{}, Commands: []agent.CommandResult{}}
}

// plan is the step's whole proposal: changes a reload lost first, then
// recovery's re-admissions, then the policy's plan. The policy's call
// ends by PolicyBudget from the step's start, and always leaves the
// commands their share of the time the step has left (StepTenths −
// PolicyTenths of StepTenths, a tenth of the interval in a step on its
// tick): that context is the one budget every policy keeps to. A step
// between ticks (new evidence) must end by the next tick, and its
// policy's call was once given all of that time: a model call that ran to
// the tick left the floor's drain no time to be sent (`runtime socket
// unreachable: … i/o timeout`), and the drain waited two more steps
// (TestRealOllamaRandomModelUnderTheGuards: 29.5 s against the rules'
// 16.5 s at a 5 s interval).
func (l *Loop) plan(ctx context.Context, obs agent.Observation, reapply agent.Plan, rec *agent.Record) agent.Plan {
	pctx, cancel := ctx, context.CancelFunc(func() {})
	if !l.NoStepBudget {
		end := rec.Time.Add(l.PolicyBudget())
		if d, ok := ctx.Deadline(); ok {
			left := d.Sub(rec.Time)
			if e := d.Add(-left * (agent.StepTenths - agent.PolicyTenths) / agent.StepTenths); e.Before(end) {
				end = e
			}
		}
		pctx, cancel = context.WithDeadline(ctx, end)
	}
	decided, err := l.Policy.Decide(pctx, obs)
	cancel()
	if err != nil {
		rec.PolicyError = err.Error()
		l.Log.Warn().Err(err).Str("policy", rec.Policy).Msg("policy failed; no action this step")
		decided = nil
	}
	if l.Policy.Report != nil {
		rec.PolicyReport = l.Policy.Report()
		l.noteFallback(rec)
	}
	plan := reapply
	if l.Recovery != nil && len(rec.TriggeredBy) == 0 && rec.Woken == "" {
		plan = append(plan, l.Recovery.Plan(ctx, obs)...)
	}
	return append(plan, decided...)
}

// act applies every accepted verdict and logs every refusal.
func (l *Loop) act(ctx context.Context, obs *agent.Observation, rec *agent.Record) []agent.Decision {
	decisions := make([]agent.Decision, 0, len(rec.Verdicts))
	refusals, woulds := map[agent.ActionID]string{}, map[agent.ActionID]string{}
	for _, v := range rec.Verdicts {
		d := agent.Decision{Time: rec.Time, Cycle: rec.Cycle, Verdict: v}
		b, sv := obs.Find(v.Proposed.Backend, v.Proposed.Server)
		if !v.Accepted {
			d.Outcome = agent.OutcomeRefused
			d.Repeat = l.refused(v, refusals)
			if v.Code == agent.RefusedNeedsProbe && l.Recovery != nil {
				l.Recovery.RequestProbe(v.Proposed.Key())
			}
			if !d.Repeat {
				a, k := v.Proposed, v.Proposed.Key()
				l.emit(agent.Event{Type: agent.EventRefused, Time: rec.Time, Cycle: rec.Cycle, Server: &k, Action: &a, Code: v.Code, Reason: v.Reason,
					Evidence: agent.EvidenceOf(b, sv, a.Test)})
			}
		} else if why := l.holdBack(v.Applied, rec.Time); why != "" {
			applied := v.Applied
			d.Outcome, d.Would, d.WouldKind, d.WouldApply = agent.OutcomeObserved, why, agent.WouldKindOf(applied), &applied
			d.Verdict.Applied = agent.Action{} // nothing was: what it would have sent is WouldApply
			d.Repeat = l.would(v.Applied, why, woulds)
			rec.Would = append(rec.Would, agent.Would{Kind: d.WouldKind, Action: v.Applied, Why: why})
			if !d.Repeat {
				a, k := v.Applied, v.Applied.Key()
				l.emit(agent.Event{Type: agent.EventWould, Time: rec.Time, Cycle: rec.Cycle, Server: &k, Action: &a, Reason: why,
					Detail: map[string]string{"would": string(d.WouldKind)}, Evidence: agent.EvidenceOf(b, sv, a.Test)})
			}
		} else {
			var ev *agent.Evidence
			typ := actionEvent(v.Applied)
			if sv != nil {
				ev = agent.EvidenceOf(b, sv, v.Applied.Test) // before the command changes the view
				if v.Applied.Kind == agent.SetWeight && v.Applied.Weight > sv.State.Weight {
					typ = agent.EventRestore // a canary's ramp back up
				}
			}
			results := l.apply(ctx, obs, v.Applied)
			rec.Commands = append(rec.Commands, results...)
			d.Error = l.applied(v.Applied, results, rec)
			d.Outcome = agent.OutcomeApplied
			if d.Error != "" {
				d.Outcome = agent.OutcomeFailed
			}
			a, k := v.Applied, v.Applied.Key()
			e := agent.Event{Type: typ, Time: rec.Time, Cycle: rec.Cycle, Server: &k, Action: &a, Reason: a.Reason, Evidence: ev}
			if d.Error != "" {
				e.Detail = map[string]string{"error": d.Error}
			}
			l.emit(e)
			if v.Applied.Kind == agent.Drain && v.Applied.Counted() && tookAny(results) {
				l.st.drains.Add(v.Applied.Backend, rec.Time) // a partial drain is one too
			}
		}
		decisions = append(decisions, d)
	}
	l.st.lastRefusals, l.st.lastWould = refusals, woulds
	l.st.mu.Lock()
	l.st.wouldNow = append([]agent.Would(nil), rec.Would...)
	l.st.mu.Unlock()
	l.st.refusedServers = map[agent.Key]string{}
	for _, v := range rec.Verdicts {
		if !v.Accepted {
			l.st.refusedServers[v.Proposed.Key()] = v.Reason
		}
	}
	return decisions
}

// drainsLastHour counts each backend's drains in the hour before now.
func (l *Loop) drainsLastHour(obs agent.Observation, now time.Time) map[string]int {
	if l.st.drains == nil {
		l.st.drains = guard.DrainLog{}
	}
	out := map[string]int{}
	for _, b := range obs.Backends {
		out[b.Name] = l.st.drains.Within(b.Name, now)
	}
	return out
}

// noteFallback writes a fallback event when a step's policy report
// names one ("fallback": why, as the model's policy reports it) after a
// step that did not: a run of fallbacks is one event.
func (l *Loop) noteFallback(rec *agent.Record) {
	b, err := json.Marshal(rec.PolicyReport)
	var r struct {
		Fallback string `json:"fallback"`
	}
	if err != nil || json.Unmarshal(b, &r) != nil {
		r.Fallback = "" // a report that is no object names no fallback
	}
	if r.Fallback != "" && !l.st.fallingBack {
		l.emit(agent.Event{Type: agent.EventFallback, Time: rec.Time, Cycle: rec.Cycle, Reason: r.Fallback, Detail: map[string]string{"policy": rec.Policy}})
	}
	l.st.fallingBack = r.Fallback != ""
}

// tookAny reports whether some HAProxy took the command.
func tookAny(results []agent.CommandResult) bool {
	for _, r := range results {
		if r.Error == "" {
			return true
		}
	}
	return false
}

// holdBack says why a vetted action is not sent ("" when it is): the
// observe mode, or a pause of its backend or of every backend.
func (l *Loop) holdBack(a agent.Action, now time.Time) string {
	if l.Mode.Observing() {
		return "observe mode"
	}
	if p, ok := l.theLedger().PausedFor(a.Backend, now); ok {
		return p.Why()
	}
	return ""
}

// would logs an action held back, with what it would have done and
// why: at info the first time, at debug while it repeats.
func (l *Loop) would(a agent.Action, why string, woulds map[agent.ActionID]string) (repeat bool) {
	k := a.ID()
	woulds[k] = why
	repeat = l.st.lastWould[k] == why
	ev := l.Log.Info()
	if repeat {
		ev = l.Log.Debug()
	}
	ev.Str("would", string(agent.WouldKindOf(a))).Str("server", a.Key().String()).Int("weight", a.Weight).Str("reason", a.Reason).
		Str("held_back", why).Msg("would " + string(agent.WouldKindOf(a)) + "; not sent")
	return repeat
}

// refused logs a refusal with its reason: at warn the first time, at
// debug while the same refusal repeats step after step.
func (l *Loop) refused(v agent.Verdict, refusals map[agent.ActionID]string) (repeat bool) {
	server := v.Proposed.Key().String()
	rk := v.Proposed.ID()
	refusals[rk] = v.Reason
	repeat = l.st.lastRefusals[rk] == v.Reason
	ev := l.Log.Warn()
	if repeat {
		ev = l.Log.Debug()
	}
	ev.Str("action", string(v.Proposed.Kind)).Str("server", server).Str("reason", v.Reason).Msg("guardrail refused action")
	return repeat
}

// applied logs an applied action and returns its error, if any process
// failed it; one that some processes took and others did not is marked
// partial in the record, never silently half-done.
func (l *Loop) applied(a agent.Action, results []agent.CommandResult, rec *agent.Record) string {
	server := a.Key().String()
	var errs []string
	for _, r := range results {
		if r.Error != "" {
			errs = append(errs, r.Socket+": "+r.Error)
		}
	}
	l.Log.Info().Str("action", string(a.Kind)).Str("server", server).Int("weight", a.Weight).Str("reason", a.Reason).
		Strs("errors", errs).Msg("applied action")
	switch {
	case len(errs) == 0:
		return ""
	case len(errs) == len(results):
		return fmt.Sprint(errs)
	}
	rec.Partial = append(rec.Partial, a.ID().String())
	l.Log.Error().Str("action", string(a.Kind)).Str("server", server).Strs("errors", errs).Msg("action applied on some HAProxy processes only")
	return fmt.Sprintf("partial: applied on %d of %d HAProxy: %v", len(results)-len(errs), len(results), errs)
}

// finish counts the step, keeps its view for /status and writes its
// audit record.
func (l *Loop) finish(rec *agent.Record, obs *agent.Observation, began time.Time, decisions []agent.Decision) {
	dur := l.Clock.Now().Sub(began).Seconds()
	rec.DurationMs = dur * 1000
	l.st.mu.Lock()
	l.st.metrics.Count(rec, decisions, dur)
	for _, d := range decisions {
		if !d.Repeat {
			l.st.recent = append(l.st.recent, d)
		}
	}
	if n := len(l.st.recent); n > recentDecisions {
		l.st.recent = append(l.st.recent[:0], l.st.recent[n-recentDecisions:]...)
	}
	if obs != nil {
		l.st.last = *obs
		l.st.lastHour = obs.DrainsLastHour
	}
	l.st.mu.Unlock()
	l.writeAudit(rec)
}

// mode is the mode in force; a Loop built without one enforces.
func (l *Loop) mode() agent.Mode {
	if l.Mode == "" {
		return agent.ModeEnforce
	}
	return l.Mode
}
