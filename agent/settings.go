package agent

import (
	"errors"
	"fmt"
	"time"
)

// Settings are the loop's own: its cadence, its evidence checks between
// ticks, where it keeps its changes, and how long an operator's undo
// stands. They own each step's time budget, which every policy takes its
// time from.
type Settings struct {
	// Interval is the time between steps.
	Interval time.Duration
	// EvidenceCheck is how often, between steps, the windows are checked
	// with the policy's own test (Policy.Evidence): a server it finds that
	// the last step did not runs a step at once, marked triggered, so that
	// a drain waits for the evidence, not for the tick. At most
	// MaxTriggered such steps run between two ticks; recovery and every
	// other part of the cadence stay on the interval. 0 turns it off.
	EvidenceCheck time.Duration
	// StateFile keeps the agent's changes across its own restarts
	// (replaced atomically on every change); "" keeps them in memory.
	StateFile string
	// OperatorHold is how long an operator's undo of the agent's change
	// stands (see Ledger.OperatorHold); 0: only as long as the server
	// differs from its configured state.
	OperatorHold time.Duration
	// ReapplyWithin is how recent a change read from the state file at
	// start must be for the agent to apply it again when a reload lost it
	// (see Ledger.ReapplyWithin); 0: DefaultReapplyWithin.
	ReapplyWithin time.Duration
	// HashBackends are the hash-balanced backends (balance uri, source,
	// hdr, url_param, rdp-cookie, hash) the operator lets the agent
	// govern; every other hash-balanced backend is left alone, since its
	// servers see different request mixes and the test's premise fails.
	HashBackends []string
	// Mode is enforce (the zero value reads so) or observe: in observe,
	// every vetted action is recorded as a would-action and none is sent.
	Mode Mode
}

// MinInterval is the shortest interval an agent runs at.
const MinInterval = 250 * time.Millisecond

// DefaultSettings are `hapilot run`'s.
func DefaultSettings() Settings {
	return Settings{Interval: 10 * time.Second, EvidenceCheck: time.Second, OperatorHold: DefaultOperatorHold,
		ReapplyWithin: DefaultReapplyWithin, Mode: ModeEnforce}
}

// Validate checks the settings an operator may give.
func (s Settings) Validate() error {
	var errs []error
	if s.Interval < MinInterval {
		errs = append(errs, fmt.Errorf("interval %v is below %v", s.Interval, MinInterval))
	}
	if s.EvidenceCheck != 0 && s.EvidenceCheck < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("evidence-check %v: want 0 (off) or at least 100ms", s.EvidenceCheck))
	}
	if s.Mode != "" && s.Mode != ModeEnforce && s.Mode != ModeObserve {
		errs = append(errs, fmt.Errorf("mode %q: want enforce or observe", s.Mode))
	}
	if s.OperatorHold < 0 {
		errs = append(errs, fmt.Errorf("operator-hold %v is negative", s.OperatorHold))
	}
	if s.ReapplyWithin < 0 {
		errs = append(errs, fmt.Errorf("reapply-within %v is negative", s.ReapplyWithin))
	}
	return errors.Join(errs...)
}

// The step's budget, in tenths of the interval: the whole step (reading
// HAProxy, deciding, applying) must end within StepTenths of its slot,
// and the policy's call within PolicyTenths, which leaves the rest of the
// step for the commands. They are the only shares of the interval in the
// agent: every policy takes its time from the context the loop gives it.
const (
	StepTenths   = 9
	PolicyTenths = 8
)

// StepBudget is how long a step may take from its slot.
func (s Settings) StepBudget() time.Duration { return s.Interval * StepTenths / 10 }

// PolicyBudget is how long a step's policy call may take from the step's
// start: a model call's deadline, a Lua script's, and calibration's,
// which scores a model at the deadline the loop would give it.
func (s Settings) PolicyBudget() time.Duration { return s.Interval * PolicyTenths / 10 }

// DefaultOperatorHold is how long an operator's undo stands by default.
const DefaultOperatorHold = 30 * time.Minute

// DefaultReapplyWithin is how recent a state file's change must be for a
// restarted agent to apply it again when a reload lost it.
const DefaultReapplyWithin = 30 * time.Minute
