// Package telemetry judges the telemetry paths as a whole: which
// per-response paths listen, whether HAProxy's counters show servers
// none of them reports (silent) or HAProxy's own 5xx they miss (blind),
// the likely cause read from the paths' own counters, what the paths
// cannot see by design, and which path to advise on the running
// HAProxy. The daemon builds it and runs its watch; the decisions are
// here, beside the paths they judge.
package telemetry

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/ingest/counters"
	"github.com/hapilot/hapilot/internal/ingest/logs"
	"github.com/hapilot/hapilot/internal/ingest/spoe"
	"github.com/rs/zerolog"

	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/hapilot/hapilot/internal/lib/promtext"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// SampledMinAnswers is Coverage's MinAnswers once the sampled stanza's
// events arrive: it reports one answer in 16 (sample=int(16)), so a
// silence needs 25 times that many answers, as an unsampled one needs 25.
const SampledMinAnswers = 16 * counters.DefaultMinAnswers

// SilenceCheck is how often the agent looks at what Coverage found.
const SilenceCheck = time.Second

// Paths is the agent's telemetry paths, as the silent-path check and the
// advice see them.
type Paths struct {
	// SPOEAt, LuaAt and SyslogAt are each per-response path's address,
	// Off when it does not listen.
	SPOEAt, LuaAt, SyslogAt netx.Address
	// PeerGroup is --peer-group, named in the fix for refused peers.
	PeerGroup string
	SPOE      *spoe.Server
	Lua       *logs.LineServer     // nil unless LuaAt listens
	Syslog    *logs.SyslogServer   // nil unless SyslogAt listens
	Stats     *counters.StatPoller // nil with --stats-poll 0
	Log       zerolog.Logger
	// OnSilent hears of each silence once, and again when its likely
	// cause changes: the event log's and the webhook's hook.
	OnSilent func(silentFor time.Duration, why string)
	// Runtimes are the runtime sockets, whose HAProxy version the advice
	// is for; AdviceEvery is Advise's period (0: AdviceEvery).
	Runtimes    []InfoSource
	AdviceEvery time.Duration
	// Sockets are the runtime sockets' addresses, named when no
	// response arrives through the counters.
	Sockets []string
	// store is where the paths deliver (Cover's).
	store *window.Store

	silence atomic.Pointer[string] // what WatchSilence found
	blind   atomic.Pointer[string] // the blind-path check's finding
	advice  atomic.Pointer[string] // what Advise found
	none    atomic.Pointer[string] // what WatchFirstResponse found
	// spoeSeen: when SPOE last received frames; only WatchSilence
	// touches it.
	spoeSeen pathActivity
	// refused are the abstract listeners' counts of peers turned away.
	refused []refusals
}

// refusals is one listener's count of peers refused (abstract sockets).
type refusals struct {
	path string
	r    *netx.Refusals
}

// WatchPeers keeps the count of refused peers of an abstract listener,
// for the silence's cause and /metrics; other listeners have none.
func (p *Paths) WatchPeers(path string, l any) {
	switch v := l.(type) {
	case *netx.PeerListener:
		p.refused = append(p.refused, refusals{path, &v.Refused})
	case *netx.PeerPacketConn:
		p.refused = append(p.refused, refusals{path, &v.Refused})
	}
}

// Cover sets up the silent-path check where it means something: a
// per-response path listens and the stats path reads the counters
// beside it. store is where the paths deliver.
func (p *Paths) Cover(store *window.Store) {
	p.store = store
	if p.Stats == nil || p.Stats.Mode != counters.StatRetries {
		return
	}
	p.Stats.Coverage = &counters.Coverage{
		After: counters.DefaultSilentAfter,
		MinAnswers: func() int64 {
			if p.SPOE.Counters.Sampled.Load() > 0 {
				return SampledMinAnswers
			}
			return counters.DefaultMinAnswers
		},
		Delivered: store.Delivered,
	}
	if !slices.Contains(p.Stats.Unseen, window.FailProxy) && p.Stats.Unseen != nil {
		// The Lua companion or the logs listen: their stanzas see
		// HAProxy's own 5xx, or should.
		p.Stats.Sight = &counters.Sight{Delivered5xx: store.Delivered5xx}
	}
}

// Covered reports whether the silent-path check runs (Cover set it up):
// WatchSilence is worth running.
func (p *Paths) Covered() bool { return p.Stats != nil && p.Stats.Coverage != nil }

// Blindness is what the blind-path check found; the zero value when it
// does not run.
func (p *Paths) Blindness() counters.Blindness {
	if p.Stats == nil || p.Stats.Sight == nil {
		return counters.Blindness{}
	}
	return p.Stats.Sight.Blindness()
}

// BlindWarning names the servers whose HAProxy 5xx no path reports.
func (p *Paths) BlindWarning(b counters.Blindness) string {
	return fmt.Sprintf("telemetry blind: HAProxy answered 502/503/504 itself for %d server(s) (%s), and %s reported fewer than half of them; likely cause: the Lua companion's stanza hooks http-response, which HAProxy never runs for its own answers (a timeout, an answer that is not HTTP): write http-after-response, as examples/haproxy-lua.cfg does. Meanwhile the agent records them from HAProxy's counters",
		len(b.Blind), strings.Join(keyNames(b.Blind, 5), ", "), p.pathNames())
}

// Unseen says what the per-response paths cannot see, by design, and who
// makes up for it: "" when no per-response path listens.
func (p *Paths) Unseen() string {
	if p.SPOEAt.Off() && p.LuaAt.Off() && p.SyslogAt.Off() {
		return ""
	}
	var classes []string
	if p.LuaAt.Off() && p.SyslogAt.Off() {
		classes = append(classes, "HAProxy's own 502/503/504 (SPOE's http-response rule does not run for them)")
	}
	classes = append(classes, "the attempts HAProxy retried or redispatched", "transfers a server aborted under a keep-alive client")
	if p.Stats == nil {
		return "telemetry blind: the per-response paths cannot see " + strings.Join(classes, ", ") + ", and the stats path is off (--stats-poll 0): a server that fails so is never drained; set --stats-poll"
	}
	return "the per-response paths cannot see " + strings.Join(classes, ", ") + ": the stats path records them from HAProxy's counters (docs/explanation/telemetry.md)"
}

// Silence is what the silent-path check found; the zero value when it
// does not run.
func (p *Paths) Silence() counters.Silence {
	if !p.Covered() {
		return counters.Silence{}
	}
	return p.Stats.Coverage.Silence()
}

// Warnings are what the paths' watches found while it lasts (a silence,
// a blindness, no response at all), and the advice once given, for
// /status and the live page.
func (p *Paths) Warnings() []string {
	var ws []string
	for _, w := range []*string{p.silence.Load(), p.blind.Load(), p.none.Load(), p.advice.Load()} {
		if w != nil {
			ws = append(ws, *w)
		}
	}
	return ws
}

// WatchSilence says, once per silence, at error level, which servers
// HAProxy counts answers for that no telemetry path reports, and the
// likely cause; the warning stays on /status and the live page while the
// silence lasts, and the end of it is logged too.
func (p *Paths) WatchSilence(ctx context.Context) error {
	t := time.NewTicker(SilenceCheck)
	defer t.Stop()
	var was []haproxy.ServerKey
	var said string // the cause last logged, this silence
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			p.notePathActivity(now)
		}
		if b := p.Blindness(); len(b.Blind) > 0 {
			w := p.BlindWarning(b)
			if old := p.blind.Swap(&w); old == nil {
				p.Log.Error().Strs("servers", keyNames(b.Blind, 20)).Msg(w)
			}
		} else if p.blind.Swap(nil) != nil {
			p.Log.Info().Msg("telemetry: the paths report HAProxy's own 5xx again")
		}
		s := p.Silence()
		switch {
		case len(s.Silent) == 0 && len(was) > 0:
			p.silence.Store(nil)
			said = ""
			p.Log.Info().Int("servers", len(was)).Msg("telemetry: every server HAProxy counts answers for is reported again; judged from its responses")
		case len(s.Silent) > 0:
			w := p.SilenceWarning(s)
			p.silence.Store(&w)
			// Once per silence, and again only if its likely cause
			// changes: servers going silent one poll after another do not
			// each make a line.
			if cause := p.SilenceCause(s); cause != said {
				said = cause
				p.Log.Error().Strs("servers", keyNames(s.Silent, 20)).Int("silent", len(s.Silent)).Int("reported", s.Covered).Msg(w)
				// The event log and the webhook get it too (docs/reference/events.md).
				if p.OnSilent != nil {
					p.OnSilent(time.Since(s.Since)+counters.DefaultSilentAfter, w)
				}
			}
		}
		was = s.Silent
	}
}

// pathActivity is when each per-response path last received anything,
// for the silence's cause: a path that still receives messages for other
// servers is not the one that broke.
type pathActivity struct {
	frames   uint64
	lastGrew time.Time
}

// notePathActivity records whether SPOE received frames since the last
// look.
func (p *Paths) notePathActivity(now time.Time) {
	if f := p.SPOE.Counters.Frames.Load(); f != p.spoeSeen.frames || p.spoeSeen.lastGrew.IsZero() {
		p.spoeSeen = pathActivity{frames: f, lastGrew: now}
	}
}

// SilenceWarning names the silent servers, the paths that should report
// them, the likely cause, and what the agent does meanwhile.
func (p *Paths) SilenceWarning(s counters.Silence) string {
	return fmt.Sprintf("telemetry silent: HAProxy counts answers for %d server(s) (%s) that %s reported for %v or more; likely cause: %s. Meanwhile the agent judges them from HAProxy's counters, as with --spoe-listen off",
		len(s.Silent), strings.Join(keyNames(s.Silent, 5), ", "), p.pathNames(), counters.DefaultSilentAfter, p.SilenceCause(s))
}

// pathNames lists the configured per-response paths.
func (p *Paths) pathNames() string {
	var n []string
	if !p.SPOEAt.Off() {
		n = append(n, "SPOE at "+p.SPOEAt.String())
	}
	if !p.LuaAt.Off() {
		n = append(n, "the Lua companion at "+p.LuaAt.String())
	}
	if !p.SyslogAt.Off() {
		n = append(n, "logs at "+p.SyslogAt.String())
	}
	return "no telemetry path (" + strings.Join(n, ", ") + ") has"
}

// SilenceCause reads the paths' own counters for the likeliest reason.
func (p *Paths) SilenceCause(s counters.Silence) string {
	var why []string
	for _, r := range p.refused {
		if n := r.r.Count.Load(); n > 0 {
			last, _ := r.r.Last()
			why = append(why, fmt.Sprintf("the %s socket refused %d connection(s) or datagram(s) from a process not allowed to send evidence (last: %s): run HAProxy as a user of --peer-group %q, or name its group there", r.path, n, last, p.PeerGroup))
		}
	}
	if !p.SPOEAt.Off() {
		c := &p.SPOE.Counters
		switch {
		case c.Connections.Load() == 0 && p.SPOEAt.Network == netx.Unix:
			why = append(why, fmt.Sprintf("HAProxy never connected to SPOE at %s: a chrooted HAProxy (Debian's and Ubuntu's stock config: chroot /var/lib/haproxy) looks for that path inside its chroot; listen on abns@hapilot-spoe and write `server agent1 abns@hapilot-spoe` in the stanza, or check that HAProxy's user may open the socket (mode 0660, the agent's group)", p.SPOEAt.Addr))
		case c.Connections.Load() == 0:
			why = append(why, "HAProxy never connected to SPOE at "+p.SPOEAt.String()+": the stanza's agents' backend does not name this address, or its server is down, so the nbsrv guard skips SPOE (show servers state of the agents' backend)")
		case c.Frames.Load() == 0:
			why = append(why, "HAProxy connects to SPOE but sends no message: the frontend serving these backends lacks `filter spoe` and `http-response send-spoe-group`, or the nbsrv guard skips them")
		case time.Since(p.spoeSeen.lastGrew) < counters.DefaultSilentAfter && s.Covered > 0:
			why = append(why, "SPOE reports other servers: the frontend that serves these lacks the stanza")
		default:
			why = append(why, "SPOE delivered messages before and none now: the agents' backend went down (nbsrv guard), or HAProxy reloaded without the stanza")
		}
	}
	for _, l := range []struct {
		name string
		c    *logs.Counters
		a    netx.Address
	}{{"the Lua companion", p.luaCounters(), p.LuaAt}, {"logs", p.syslogCounters(), p.SyslogAt}} {
		if l.c == nil {
			continue
		}
		if l.c.Batches.Load() == 0 {
			hint := ""
			if l.a.Network == netx.Unix || l.a.Network == netx.Unixgram {
				hint = " (a chrooted HAProxy looks for " + l.a.Addr + " inside its chroot: use an abns@ name)"
			}
			why = append(why, l.name+" at "+l.a.String()+" never received a batch"+hint)
		}
	}
	if len(why) == 0 {
		return "unknown"
	}
	return strings.Join(why, "; ")
}

func keyNames(ks []haproxy.ServerKey, most int) []string {
	var out []string
	for i, k := range ks {
		if i == most {
			out = append(out, fmt.Sprintf("and %d more", len(ks)-most))
			break
		}
		out = append(out, k.Backend+"/"+k.Server)
	}
	return out
}

// Figures are the silent-path check's and the abstract sockets'
// figures, for /metrics and /status.
func (p *Paths) Figures() []promtext.Figure {
	var fs []promtext.Figure
	if p.Covered() {
		s := p.Silence()
		fs = append(fs,
			promtext.Figure{Metric: "hapilot_telemetry_silent_servers", Help: "Servers HAProxy counts answers for that no telemetry path reports; judged from HAProxy's counters meanwhile.", Gauge: true, V: uint64(len(s.Silent))},
			promtext.Figure{Metric: "hapilot_telemetry_silences_total", Help: "Times a server went silent on every telemetry path.", V: s.Episodes})
	}
	for _, r := range p.refused {
		fs = append(fs, promtext.Figure{Metric: "hapilot_" + r.path + "_peers_refused_total", Help: "Connections or datagrams to the " + r.path + " abstract socket refused: the sender's user and group are not allowed.", V: r.r.Count.Load()})
	}
	return fs
}

func (p *Paths) luaCounters() *logs.Counters {
	if p.Lua == nil {
		return nil
	}
	return &p.Lua.Counters
}

func (p *Paths) syslogCounters() *logs.Counters {
	if p.Syslog == nil {
		return nil
	}
	return &p.Syslog.Counters
}
