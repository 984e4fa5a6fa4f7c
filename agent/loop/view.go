package loop

import (
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/ledger"
)

// View is the read side of the loop, for /status, /metrics and `ctl
// status`: it reads what the last step kept and changes nothing. Get it
// with Loop.View.
type View struct{ l *Loop }

// View is the loop's read side.
func (l *Loop) View() View { return View{l} }

// Status is what GET /status answers.
type Status struct {
	Policy string `json:"policy"`
	// PolicyStatus is the policy's own state (a model loading, say).
	PolicyStatus any `json:"policy_status,omitempty"`
	// PolicyNotes is the policy's word on servers it judges but leaves
	// as they are, and why.
	PolicyNotes map[agent.Key]string       `json:"policy_notes,omitempty"`
	Interval    string                     `json:"interval"`
	Cycle       uint64                     `json:"cycle"`
	Observed    time.Time                  `json:"observed"`
	Backends    []agent.BackendView        `json:"backends"`
	Changes     map[agent.Key]agent.Change `json:"changes"`
	Decisions   []agent.Decision           `json:"decisions"`
	// Candidates are the servers the policy's own test finds now, drained
	// or refused or not: empty for a policy that cannot tell without
	// deciding (the LLM, a Lua script).
	Candidates []agent.Key `json:"candidates"`
	// StateFile is where the state file stands (saved, or unsaved since
	// a failed write); absent without --state-file.
	StateFile *ledger.SaveStatus `json:"state_file,omitempty"`
	// LeftAlone are the servers the agent neither judges nor acts on, and
	// why: backups, agent-checked servers, hash-balanced backends.
	LeftAlone map[agent.Key]string `json:"left_alone,omitempty"`
	// Mode is observe or enforce; Pauses the pauses in force. While
	// either holds an action back, it is a decision with "would" set.
	Mode   agent.Mode    `json:"mode"`
	Pauses []agent.Pause `json:"pauses"`
	// Inventory is every server the first step found in drain or maint,
	// or at a weight the agent set, and who holds it.
	Inventory []Held `json:"inventory"`
	// Scope is how each backend stands against the config's backend
	// blocks: in scope or not, its floor, caps and action.
	Scope []guard.BackendScope `json:"scope"`
}

// Status is a copy of the loop's latest view, for people and scripts.
func (v View) Status() Status {
	l := v.l
	changes := v.Ledger()
	var saved *ledger.SaveStatus
	if l.StateFile != "" {
		st := l.theLedger().Saved()
		saved = &st
	}
	var ps any
	if l.Policy.Status != nil {
		ps = l.Policy.Status()
	}
	var notes map[agent.Key]string
	if l.Policy.Notes != nil {
		notes = l.Policy.Notes()
	}
	alone := v.LeftAlone()
	pauses := l.theLedger().Pauses(l.Clock.Now())
	scopes := v.Scopes()
	l.st.mu.Lock()
	defer l.st.mu.Unlock()
	return Status{
		Policy: l.Policy.Name(), PolicyStatus: ps, PolicyNotes: notes, Interval: l.Interval.String(), Cycle: l.st.cycle, Observed: l.st.last.Time,
		Backends: l.st.last.Backends, Changes: changes, Decisions: append([]agent.Decision(nil), l.st.recent...),
		Candidates: append([]agent.Key{}, l.st.candidates...), StateFile: saved, LeftAlone: alone,
		Mode: l.mode(), Pauses: append([]agent.Pause{}, pauses...), Inventory: append([]Held{}, l.st.inventory...), Scope: scopes,
	}
}

// Metrics is a copy of the loop's counters, with the state file's.
func (v View) Metrics() agent.Counters {
	l := v.l
	saved := l.theLedger().Saved()
	l.st.mu.Lock()
	defer l.st.mu.Unlock()
	m := l.st.metrics
	m.RefusedBy = make(map[agent.Refusal]uint64, len(l.st.metrics.RefusedBy))
	for c, n := range l.st.metrics.RefusedBy {
		m.RefusedBy[c] = n
	}
	m.Would = make(map[agent.WouldKind]uint64, len(l.st.metrics.Would))
	for k, n := range l.st.metrics.Would {
		m.Would[k] = n
	}
	m.StateUnsaved, m.StateFailedWrites = !saved.Saved, saved.FailedWrites
	return m
}

// WouldNow is every action the last step vetted and held back (observe
// mode, a pause), for a per-server metric to alert on.
func (v View) WouldNow() []agent.Would {
	l := v.l
	l.st.mu.Lock()
	defer l.st.mu.Unlock()
	return append([]agent.Would(nil), l.st.wouldNow...)
}

// Pauses are the pauses in force now.
func (v View) Pauses() []agent.Pause { return v.l.theLedger().Pauses(v.l.Clock.Now()) }

// Scopes is how each backend of the last step stands against the
// config's backend blocks and the caps.
func (v View) Scopes() []guard.BackendScope {
	l := v.l
	l.st.mu.Lock()
	backends := l.st.last.Backends
	hour := l.st.lastHour
	l.st.mu.Unlock()
	out := make([]guard.BackendScope, 0, len(backends))
	for _, b := range backends {
		bs := l.Guard.Scope.For(b.Name)
		sc := guard.BackendScope{Backend: b.Name, InScope: bs.InScope(), Blocks: bs.Pattern, Action: guard.ActionDrain, LeaveAlone: bs.LeaveAlone,
			Drains: hour[b.Name]}
		if bs.Maint() {
			sc.Action = guard.ActionMaint
		}
		if bs.MinServing != nil {
			sc.MinServing = *bs.MinServing
		}
		if bs.MaxDrained != nil {
			sc.MaxDrained = bs.MaxDrained.String()
		}
		if l.Guard.DrainsPerHour > 0 {
			sc.Rates = &guard.RateSummary{PerHour: l.Guard.DrainsPerHour, Used: hour[b.Name]}
		}
		out = append(out, sc)
	}
	return out
}

// Ledger returns the agent's changes in force.
func (v View) Ledger() map[agent.Key]agent.Change { return v.l.theLedger().Changes() }

// StateWarning is what /status must warn of the state file ("" when
// nothing): one found at start that could not be read (SaveStatus.Warning).
func (v View) StateWarning() string {
	l := v.l
	if l.StateFile == "" {
		return ""
	}
	return l.theLedger().Saved().Warning()
}

// LeftAlone lists the servers the agent leaves alone, with the reason for
// each, as of the last step.
func (v View) LeftAlone() map[agent.Key]string {
	l := v.l
	l.st.alone.mu.Lock()
	defer l.st.alone.mu.Unlock()
	out := make(map[agent.Key]string, len(l.st.alone.why))
	for k, v := range l.st.alone.why {
		out[k] = v
	}
	return out
}

// Holding is one change the agent holds, for `hapilot ctl list`.
type Holding struct {
	Server agent.Key `json:"server"`
	agent.Change
}

// List is every change the agent holds, by server.
func (v View) List() []Holding { return listChanges(v.Ledger()) }
