package telemetry

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/hapilot/hapilot/internal/ingest/counters"
	"github.com/hapilot/hapilot/internal/ingest/logs"
)

// NoEventsAfter is how long the agent waits for its first response from
// HAProxy before it warns that none arrives.
const NoEventsAfter = 30 * time.Second

// Events is how many responses every path recorded together.
func (p *Paths) Events() uint64 {
	n := p.SPOE.Counters.Events.Load()
	for _, c := range []*logs.Counters{p.luaCounters(), p.syslogCounters()} {
		if c != nil {
			n += c.Events.Load()
		}
	}
	if p.Stats != nil {
		n += p.Stats.Counters.Answers.Load()
	}
	return n
}

// WatchFirstResponse warns, once in the log and for as long as it holds in
// /status, when no response has reached the windows NoEventsAfter after
// the start: the stanza is missing from haproxy.cfg, or HAProxy cannot
// reach the agent.
func (p *Paths) WatchFirstResponse(ctx context.Context) error {
	const wait = NoEventsAfter
	t := time.NewTicker(wait)
	defer t.Stop()
	for logged := false; ; {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		w := p.NoResponse(wait)
		if w == "" {
			p.none.Store(nil)
			continue
		}
		p.none.Store(&w)
		if !logged {
			p.Log.Warn().Msg(w)
			logged = true
		}
	}
}

// NoResponse is the warning while no response has been recorded, ""
// once one has.
func (p *Paths) NoResponse(waited time.Duration) string {
	if p.Events() > 0 || (p.store != nil && p.store.Events() > 0) {
		return ""
	}
	var paths []string
	if !p.SPOEAt.Off() {
		paths = append(paths, "SPOE at "+p.SPOEAt.String()+" (the stanza of examples/haproxy.cfg)")
	}
	if !p.LuaAt.Off() {
		paths = append(paths, "the Lua companion at "+p.LuaAt.String()+" (examples/haproxy-lua.cfg)")
	}
	if !p.SyslogAt.Off() {
		paths = append(paths, "logs at "+p.SyslogAt.String()+" (examples/haproxy-syslog*.cfg)")
	}
	if p.Stats != nil && p.Stats.Mode == counters.StatCounts {
		paths = append(paths, "HAProxy's counters through "+strings.Join(p.Sockets, ", ")+" (no traffic yet, or the socket does not answer)")
	}
	msg := fmt.Sprintf("no response reported by HAProxy in %v, through %s: ", waited, strings.Join(paths, "; "))
	if !p.SPOEAt.Off() || !p.LuaAt.Off() || !p.SyslogAt.Off() {
		msg += "check that haproxy.cfg holds the stanza and that HAProxy can reach the agent's socket (its group, mode 0660); " +
			"with no access to the frontend, run with --spoe-listen off and the agent reads HAProxy's own counters"
	} else {
		msg += "check that the backends take traffic"
	}
	return msg
}
