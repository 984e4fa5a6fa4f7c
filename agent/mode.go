package agent

import (
	"fmt"
	"time"

	"github.com/hapilot/hapilot/internal/lib/enum"
)

// Mode says whether the agent's vetted actions reach HAProxy.
type Mode string

const (
	// ModeEnforce sends every vetted action to HAProxy.
	ModeEnforce Mode = "enforce"
	// ModeObserve runs everything (telemetry, windows, policy,
	// guardrails, fleet mode, recovery's judgement) and sends nothing that
	// changes a server's state: each action enforce would have applied is
	// recorded as a would-action, with its reason.
	ModeObserve Mode = "observe"
)

// Modes lists the modes.
var Modes = []Mode{ModeEnforce, ModeObserve}

func (m *Mode) String() string { return string(*m) }

// Set implements flag.Value.
func (m *Mode) Set(s string) (err error) {
	*m, err = enum.Parse("mode", s, Modes...)
	return err
}

// Observing reports whether m holds every action back. The zero value
// is enforce: a Loop built without settings acts, as it always did.
func (m Mode) Observing() bool { return m == ModeObserve }

// AllBackends is the scope of a pause that holds every backend.
// HAProxy's proxy names cannot hold '*', so it names no backend.
const AllBackends = "*"

// Pause holds the agent's actions back, everywhere or on one backend,
// until Until (zero: until resumed). It is kept in the state file, so
// that it survives the agent's restarts.
type Pause struct {
	Backend string    `json:"backend"`
	Since   time.Time `json:"since"`
	Until   time.Time `json:"until,omitzero"`
	// By says who asked (the ctl peer's uid, say).
	By string `json:"by,omitempty"`
}

// Active reports whether the pause holds at now.
func (p Pause) Active(now time.Time) bool { return p.Until.IsZero() || now.Before(p.Until) }

// Why is the pause's reason, for a would-action's record.
func (p Pause) Why() string {
	scope := "backend " + p.Backend
	if p.Backend == AllBackends {
		scope = "every backend"
	}
	if p.Until.IsZero() {
		return fmt.Sprintf("paused (%s, since %s, until resumed)", scope, p.Since.UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("paused (%s, until %s)", scope, p.Until.UTC().Format(time.RFC3339))
}

// WouldKind names what a held-back action would have done: "drain",
// "cut" or "restore" (the words of the event log and the metric).
type WouldKind string

const (
	WouldDrain   WouldKind = "drain"
	WouldCut     WouldKind = "cut"
	WouldRestore WouldKind = "restore"
)

// WouldKinds lists them, for the metric's labels.
var WouldKinds = []WouldKind{WouldDrain, WouldCut, WouldRestore}

// WouldKindOf is what a held-back a would have done.
func WouldKindOf(a Action) WouldKind {
	switch a.Kind {
	case Drain:
		return WouldDrain
	case SetWeight:
		return WouldCut
	}
	return WouldRestore
}
