package agent

// Refusal says why the guardrails refused an action, as a code that
// behaviour may depend on; the verdict's Reason is its text for people.
type Refusal string

const (
	RefusedUnknownServer Refusal = "unknown_server"
	RefusedTouched       Refusal = "one_per_server"
	RefusedOperator      Refusal = "operator"
	RefusedActionCap     Refusal = "action_cap"
	RefusedDrainCap      Refusal = "drain_cap"
	RefusedFloor         Refusal = "floor"
	RefusedCapacity      Refusal = "capacity"
	RefusedTailHold      Refusal = "tail_hold"
	RefusedNoChange      Refusal = "no_change"
	RefusedNotAgents     Refusal = "not_agents"
	// RefusedNeedsProbe: a ready of a drained server that did not come
	// from recovery; the loop passes it on to recovery as a request to
	// probe the server.
	RefusedNeedsProbe  Refusal = "needs_probe"
	RefusedAboveConfig Refusal = "above_config"
	RefusedUnknownKind Refusal = "unknown_kind"
	// RefusedOutOfScope: the backend's block says enabled false; the
	// agent observes it and only undoes its own changes there.
	RefusedOutOfScope Refusal = "out_of_scope"
	// RefusedLeftAlone: the server is one its backend's block leaves
	// alone.
	RefusedLeftAlone Refusal = "left_alone"
	// RefusedMaxDrained: the backend's max-drained, or --max-drained
	// across every backend, is reached.
	RefusedMaxDrained Refusal = "max_drained"
	// RefusedRateCap: --max-drains-per-hour is reached on the backend.
	RefusedRateCap Refusal = "rate_cap"
)

// Verdict is the guardrails' answer to one proposed action. Applied is the
// action as it will run (a weight may be clamped).
type Verdict struct {
	Proposed Action `json:"proposed"`
	Accepted bool   `json:"accepted"`
	Applied  Action `json:"applied,omitzero"` // absent when refused
	// Code and Reason say why it was refused.
	Code   Refusal `json:"code,omitempty"`
	Reason string  `json:"reason,omitempty"`
}
