package loop

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/auditlog"
)

// emit stamps ev and hands it to the sink, if any.
func (l *Loop) emit(ev agent.Event) {
	if l.Events == nil {
		return
	}
	ev.Schema, ev.Identity = agent.EventSchema, l.Identity
	if ev.Time.IsZero() {
		ev.Time = l.Clock.Now()
	}
	if ev.Mode == "" {
		ev.Mode = l.mode()
	}
	l.Events.Emit(ev)
}

// Emit records an event from outside the loop (the daemon's telemetry
// watch, a model's fallback, a calibration verdict), stamped like the
// loop's own.
func (l *Loop) Emit(ev agent.Event) { l.emit(ev) }

// TelemetrySilent records that no response has reached the windows for
// silentFor, with the paths the agent listens on: the hook the
// telemetry watch calls.
func (l *Loop) TelemetrySilent(silentFor time.Duration, why string) {
	l.emit(agent.Event{Type: agent.EventTelemetrySilent, Reason: why, Detail: map[string]string{"silent_for": silentFor.String()}})
}

// Start records the agent's start, in its mode.
func (l *Loop) Start() {
	l.emit(agent.Event{Type: agent.EventStart, Reason: "hapilot starting in " + string(l.mode()) + " mode"})
}

// actionEvent is the event of an action sent.
func actionEvent(a agent.Action) agent.EventType {
	switch a.Kind {
	case agent.Drain:
		return agent.EventDrain
	case agent.SetWeight:
		return agent.EventCut
	}
	return agent.EventRestore
}

func summarize(obs *agent.Observation) []agent.ServerSummary {
	n := 0
	for _, b := range obs.Backends {
		n += len(b.Servers)
	}
	if n == 0 {
		return nil // the audit line's "servers": null, as before
	}
	out := make([]agent.ServerSummary, 0, n)
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			out = append(out, agent.ServerSummary{
				Backend: s.Backend, Server: s.Server, State: s.State.Label(), Owner: s.Owner, Weight: s.State.Weight,
				Requests: s.Window.Requests, Err5xx: s.Window.Err5xx, P99Ms: s.Window.P99Ms,
			})
		}
	}
	return out
}

// writeAudit appends rec to the audit log as one JSON line.
func (l *Loop) writeAudit(rec *agent.Record) {
	if l.Audit == nil {
		return
	}
	rec.Schema, rec.Type, rec.Identity = agent.EventSchema, agent.EventStep, l.Identity
	b, err := json.Marshal(rec)
	if err == nil {
		b = append(b, '\n')
		_, err = l.Audit.Write(b)
	}
	if err != nil && !errors.Is(err, auditlog.ErrLost) { // a queue that drops counts and logs its own
		l.Log.Error().Err(fmt.Errorf("audit record of step %d: %w", rec.Cycle, err)).Msg("cannot write audit record")
	}
}
