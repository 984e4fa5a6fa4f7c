package agent

import (
	"time"
)

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

// Record is one step's audit line (--audit-steps): an event of type
// step, with every server's snapshot.
type Record struct {
	Schema int       `json:"schema"`
	Type   EventType `json:"type"`
	Identity
	Time   time.Time `json:"time"`
	Cycle  uint64    `json:"cycle"`
	Policy string    `json:"policy"`
	// TriggeredBy lists the servers whose new evidence ran this step
	// between ticks (see Loop.EvidenceCheck); empty for a scheduled step.
	TriggeredBy []Key `json:"triggered_by,omitempty"`
	// Woken says why this step ran between ticks at another's word (the
	// stats path saw HAProxy reload); empty for any other step.
	Woken        string          `json:"woken,omitempty"`
	DurationMs   float64         `json:"duration_ms"`
	Servers      []ServerSummary `json:"servers"`
	Plan         Plan            `json:"plan"`
	PolicyError  string          `json:"policy_error,omitempty"`
	PolicyReport any             `json:"policy_report,omitempty"`
	Verdicts     []Verdict       `json:"verdicts"`
	Commands     []CommandResult `json:"commands"`
	// Would lists the vetted actions held back (observe mode, a pause),
	// each with what it would have done and why it was not sent.
	Would []Would `json:"would,omitempty"`
	// Partial lists actions some HAProxy processes took and others did
	// not: never silently half-done.
	Partial []string `json:"partial,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// Would is a vetted action held back: what it would have done, and why
// it was not sent.
type Would struct {
	Kind   WouldKind `json:"kind"`
	Action Action    `json:"action"`
	Why    string    `json:"why"`
}

// Decision is a verdict with its time, for /status.
type Decision struct {
	Time  time.Time `json:"time"`
	Cycle uint64    `json:"cycle"`
	// Outcome says what was done: applied, failed, refused, or observed
	// (vetted and held back, nothing sent).
	Outcome Outcome `json:"outcome"`
	Verdict
	Error string `json:"error,omitempty"`
	// Would, on an accepted verdict, says why it was held back (observe
	// mode, a pause) instead of sent; WouldKind what it would have done;
	// WouldApply the vetted action it would have sent (Applied stays
	// empty: nothing was).
	Would      string    `json:"would,omitempty"`
	WouldKind  WouldKind `json:"would_kind,omitempty"`
	WouldApply *Action   `json:"would_apply,omitempty"`

	Repeat bool `json:"-"` // the same refusal as the step before: counted, not listed again
}

// Outcome is what came of a vetted proposal.
type Outcome string

const (
	OutcomeApplied  Outcome = "applied"  // sent, and every HAProxy took it
	OutcomeFailed   Outcome = "failed"   // sent, and a command failed (Error)
	OutcomeRefused  Outcome = "refused"  // the guardrails refused it (Code, Reason)
	OutcomeObserved Outcome = "observed" // accepted, held back (observe mode, a pause): nothing sent
)

// Counters are the loop's running totals, for /metrics.
type Counters struct {
	Cycles, Skipped, Applied, Refused, CommandErrors, PolicyErrors, StateErrors uint64
	// Triggered counts the steps new evidence ran between ticks.
	Triggered uint64
	// Step durations in seconds.
	DurationSum, DurationLast, DurationMax float64
	// StateUnsaved: the last write of the state file failed;
	// StateFailedWrites counts the failed writes.
	StateUnsaved      bool
	StateFailedWrites uint64
	// Would counts the actions held back by what they would have done,
	// each once while it repeats step after step; RefusedBy the
	// guardrails' refusals by code, each step's.
	Would     map[WouldKind]uint64
	RefusedBy map[Refusal]uint64
	// LastOK is when the last step that read HAProxy ended.
	LastOK time.Time
	// Durations is the step durations' histogram over DurationBuckets.
	Durations [len(DurationBuckets)]uint64
}

// DurationBuckets are the upper bounds, in seconds, of the step
// duration histogram: from a quick rules step to a model's call at a
// 10 s interval's budget.
var DurationBuckets = [...]float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

func (m *Counters) Count(rec *Record, decisions []Decision, seconds float64) {
	m.Cycles++
	if len(rec.TriggeredBy) > 0 {
		m.Triggered++
	}
	m.DurationSum += seconds
	m.DurationLast = seconds
	m.DurationMax = max(m.DurationMax, seconds)
	for i, le := range DurationBuckets {
		if seconds <= le {
			m.Durations[i]++
		}
	}
	if rec.Error != "" {
		m.StateErrors++
	} else {
		m.LastOK = rec.Time.Add(time.Duration(seconds * float64(time.Second)))
	}
	if rec.PolicyError != "" {
		m.PolicyErrors++
	}
	for _, d := range decisions {
		switch {
		case d.Would != "":
			if !d.Repeat {
				if m.Would == nil {
					m.Would = map[WouldKind]uint64{}
				}
				m.Would[d.WouldKind]++
			}
		case d.Accepted:
			m.Applied++
		default:
			m.Refused++
			if m.RefusedBy == nil {
				m.RefusedBy = map[Refusal]uint64{}
			}
			m.RefusedBy[d.Code]++
		}
	}
	for _, c := range rec.Commands {
		if c.Error != "" {
			m.CommandErrors++
		}
	}
}
