package agent

import "time"

// EventSchema is the event log's schema version: every line carries it,
// and it changes only when a field changes meaning or goes away
// (docs/reference/events.md).
const EventSchema = 1

// EventType names what happened.
type EventType string

const (
	// EventStep is the per-step snapshot of every server (--audit-steps).
	EventStep EventType = "step"
	// EventStart: the agent started, in its mode.
	EventStart EventType = "start"
	// EventDrain, EventCut, EventRestore: an action sent to HAProxy (a
	// restore is the agent readying a server or raising its weight back).
	EventDrain   EventType = "drain"
	EventCut     EventType = "cut"
	EventRestore EventType = "restore"
	// EventRefused: the guardrails refused an action (each once while it
	// repeats step after step).
	EventRefused EventType = "refused"
	// EventWould: an action held back by observe mode or a pause.
	EventWould EventType = "would"
	// EventRelease: the operator brought a server back through the agent
	// (hapilot ctl release or restore).
	EventRelease EventType = "release"
	// EventPause and EventResume: hapilot ctl pause and resume.
	EventPause  EventType = "pause"
	EventResume EventType = "resume"
	// EventUnknownServer: a server found out of rotation at start with
	// no record of who set it.
	EventUnknownServer EventType = "unknown_server"
	// EventTelemetrySilent: no response has reached the windows for a
	// while (the daemon's telemetry watch calls Loop.TelemetrySilent).
	EventTelemetrySilent EventType = "telemetry_silent"
	// EventFallback: the model's policy fell back to the rules.
	EventFallback EventType = "fallback"
	// EventCalibration: a model's calibration verdict, as the agent read
	// it at start.
	EventCalibration EventType = "calibration"
)

// EventTypes lists every type, for docs/reference/events.md's test.
var EventTypes = []EventType{EventStep, EventStart, EventDrain, EventCut, EventRestore, EventRefused, EventWould, EventRelease,
	EventPause, EventResume, EventUnknownServer, EventTelemetrySilent, EventFallback, EventCalibration}

// Identity is what every event says of the agent that wrote it.
type Identity struct {
	Host    string `json:"host"`
	Version string `json:"version"`
}

// Event is one line of the event log, and one webhook payload.
type Event struct {
	Schema int       `json:"schema"`
	Type   EventType `json:"type"`
	Time   time.Time `json:"time"`
	Identity
	Mode  Mode   `json:"mode,omitempty"`
	Cycle uint64 `json:"cycle,omitempty"`
	// Server is the server it is about (none for the agent's own events).
	Server *Key `json:"server,omitempty"`
	// Backend: a pause's scope (AllBackends for every one).
	Backend string `json:"backend,omitempty"`
	// Action is the action sent, refused or held back.
	Action *Action `json:"action,omitempty"`
	// Code is a refusal's code (verdict.go).
	Code Refusal `json:"code,omitempty"`
	// Reason says why: the policy's reason for an action, the guard's for
	// a refusal, the pause for a would-action.
	Reason string `json:"reason,omitempty"`
	// Evidence is the server's window at the time.
	Evidence *Evidence `json:"evidence,omitempty"`
	// By names who asked (hapilot ctl's peer) for operator events.
	By string `json:"by,omitempty"`
	// Until bounds a pause or a release's hold.
	Until time.Time `json:"until,omitzero"`
	// Detail holds a few type-specific words (a calibration's figures,
	// a silent telemetry's paths).
	Detail map[string]string `json:"detail,omitempty"`
}

// Evidence is a server's figures behind an event: its window against
// its serving peers', and the p-value of the action's test where it has
// one (the windowed test's; the test's other figures are the action's
// own, in Action.Test).
type Evidence struct {
	Requests      uint64   `json:"requests"`
	Err5xx        uint64   `json:"err_5xx"`
	ErrorRate     float64  `json:"error_rate"`
	PeersRequests uint64   `json:"peers_requests,omitempty"`
	PeersErr5xx   uint64   `json:"peers_err_5xx,omitempty"`
	P50Ms         int      `json:"p50_ms"`
	P99Ms         int      `json:"p99_ms"`
	PValue        *float64 `json:"p_value,omitempty"`
	State         string   `json:"state"`
	Weight        int      `json:"weight"`
}

// EventSink receives the loop's events. Emit must not block: the loop
// calls it from its step.
type EventSink interface {
	Emit(Event)
}

// EvidenceOf is s's window against its backend's other serving servers,
// with the p-value of test, the action's, where it has one.
func EvidenceOf(b *BackendView, s *ServerView, test *TestFigures) *Evidence {
	if s == nil {
		return nil
	}
	e := &Evidence{Requests: s.Window.Requests, Err5xx: s.Window.Err5xx, ErrorRate: s.Window.ErrorRate(),
		P50Ms: s.Window.P50Ms, P99Ms: s.Window.P99Ms, State: s.State.Label(), Weight: s.State.Weight}
	if b != nil {
		for _, p := range b.Servers {
			if p.Server != s.Server && p.Serving() {
				e.PeersRequests += p.Window.Requests
				e.PeersErr5xx += p.Window.Err5xx
			}
		}
	}
	if test != nil && test.PValue != nil {
		p := *test.PValue
		e.PValue = &p
	}
	return e
}
