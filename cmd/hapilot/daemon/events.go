package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/auditlog"
	"github.com/rs/zerolog"
)

// eventLog writes each event as one JSON line to the audit log.
type eventLog struct {
	w   io.Writer
	log zerolog.Logger
}

func (e eventLog) Emit(ev agent.Event) {
	b, err := json.Marshal(ev)
	if err == nil {
		_, err = e.w.Write(append(b, '\n'))
	}
	if err != nil && !errors.Is(err, auditlog.ErrLost) { // the queue counts and logs its own
		e.log.Error().Err(fmt.Errorf("event %s: %w", ev.Type, err)).Msg("cannot write to the audit log")
	}
}

// fanout hands each event to every sink.
type fanout []agent.EventSink

func (f fanout) Emit(ev agent.Event) {
	for _, s := range f {
		s.Emit(ev)
	}
}

// identity is what every event says of this agent.
func identity() agent.Identity {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return agent.Identity{Host: host, Version: Version}
}
