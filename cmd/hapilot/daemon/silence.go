package daemon

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/ingest/counters"
	"github.com/hapilot/hapilot/internal/ingest/logs"

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

// refusals is one listener's count of peers refused (abstract sockets).
type refusals struct {
	path string
	r    *netx.Refusals
}

// watchPeers keeps the count of refused peers of an abstract listener,
// for the silence's cause and /metrics.
func (d *Daemon) watchPeers(path string, l any) {
	switch v := l.(type) {
	case *netx.PeerListener:
		d.refused = append(d.refused, refusals{path, &v.Refused})
	case *netx.PeerPacketConn:
		d.refused = append(d.refused, refusals{path, &v.Refused})
	}
}

// coverage sets up the silent-path check where it means something: a
// per-response path listens and the stats path reads the counters
// beside it.
func (d *Daemon) coverage() {
	if d.Stats == nil || d.Stats.Mode != counters.StatRetries {
		return
	}
	d.Stats.Coverage = &counters.Coverage{
		After: counters.DefaultSilentAfter,
		MinAnswers: func() int64 {
			if d.SPOE.Counters.Sampled.Load() > 0 {
				return SampledMinAnswers
			}
			return counters.DefaultMinAnswers
		},
		Delivered: d.Store.Delivered,
	}
	if !slices.Contains(d.Stats.Unseen, window.FailProxy) && d.Stats.Unseen != nil {
		// The Lua companion or the logs listen: their stanzas see
		// HAProxy's own 5xx, or should.
		d.Stats.Sight = &counters.Sight{Delivered5xx: d.Store.Delivered5xx}
	}
}

// Blindness is what the blind-path check found; the zero value when it
// does not run.
func (d *Daemon) Blindness() counters.Blindness {
	if d.Stats == nil || d.Stats.Sight == nil {
		return counters.Blindness{}
	}
	return d.Stats.Sight.Blindness()
}

// blindWarning names the servers whose HAProxy 5xx no path reports.
func (d *Daemon) blindWarning(b counters.Blindness) string {
	return fmt.Sprintf("telemetry blind: HAProxy answered 502/503/504 itself for %d server(s) (%s), and %s reported fewer than half of them; likely cause: the Lua companion's stanza hooks http-response, which HAProxy never runs for its own answers (a timeout, an answer that is not HTTP): write http-after-response, as examples/haproxy-lua.cfg does. Meanwhile the agent records them from HAProxy's counters",
		len(b.Blind), strings.Join(keyNames(b.Blind, 5), ", "), d.pathNames())
}

// Unseen says what the per-response paths cannot see, by design, and who
// makes up for it: "" when no per-response path listens.
func (d *Daemon) Unseen() string {
	ls, _ := d.Config.Listeners()
	if ls.SPOE.Off() && ls.Lua.Off() && ls.Syslog.Off() {
		return ""
	}
	var classes []string
	if ls.Lua.Off() && ls.Syslog.Off() {
		classes = append(classes, "HAProxy's own 502/503/504 (SPOE's http-response rule does not run for them)")
	}
	classes = append(classes, "the attempts HAProxy retried or redispatched", "transfers a server aborted under a keep-alive client")
	if d.Stats == nil {
		return "telemetry blind: the per-response paths cannot see " + strings.Join(classes, ", ") + ", and the stats path is off (--stats-poll 0): a server that fails so is never drained; set --stats-poll"
	}
	return "the per-response paths cannot see " + strings.Join(classes, ", ") + ": the stats path records them from HAProxy's counters (docs/explanation/telemetry.md)"
}

// Silence is what the silent-path check found; the zero value when it
// does not run.
func (d *Daemon) Silence() counters.Silence {
	if d.Stats == nil || d.Stats.Coverage == nil {
		return counters.Silence{}
	}
	return d.Stats.Coverage.Silence()
}

// watchSilence says, once per silence, at error level, which servers
// HAProxy counts answers for that no telemetry path reports, and the
// likely cause; the warning stays on /status and the live page while the
// silence lasts, and the end of it is logged too.
func (d *Daemon) watchSilence(ctx context.Context) error {
	t := time.NewTicker(SilenceCheck)
	defer t.Stop()
	var was []haproxy.ServerKey
	var said string // the cause last logged, this silence
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			d.notePathActivity(now)
		}
		if b := d.Blindness(); len(b.Blind) > 0 {
			w := d.blindWarning(b)
			if old := d.blind.Swap(&w); old == nil {
				d.log.Error().Strs("servers", keyNames(b.Blind, 20)).Msg(w)
			}
		} else if d.blind.Swap(nil) != nil {
			d.log.Info().Msg("telemetry: the paths report HAProxy's own 5xx again")
		}
		s := d.Silence()
		switch {
		case len(s.Silent) == 0 && len(was) > 0:
			d.silence.Store(nil)
			said = ""
			d.log.Info().Int("servers", len(was)).Msg("telemetry: every server HAProxy counts answers for is reported again; judged from its responses")
		case len(s.Silent) > 0:
			w := d.silenceWarning(s)
			d.silence.Store(&w)
			// Once per silence, and again only if its likely cause
			// changes: servers going silent one poll after another do not
			// each make a line.
			if cause := d.silenceCause(s); cause != said {
				said = cause
				d.log.Error().Strs("servers", keyNames(s.Silent, 20)).Int("silent", len(s.Silent)).Int("reported", s.Covered).Msg(w)
				// The event log and the webhook get it too (docs/reference/events.md).
				d.Loop.TelemetrySilent(time.Since(s.Since)+counters.DefaultSilentAfter, w)
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
func (d *Daemon) notePathActivity(now time.Time) {
	if f := d.SPOE.Counters.Frames.Load(); f != d.spoeSeen.frames || d.spoeSeen.lastGrew.IsZero() {
		d.spoeSeen = pathActivity{frames: f, lastGrew: now}
	}
}

// silenceWarning names the silent servers, the paths that should report
// them, the likely cause, and what the agent does meanwhile.
func (d *Daemon) silenceWarning(s counters.Silence) string {
	return fmt.Sprintf("telemetry silent: HAProxy counts answers for %d server(s) (%s) that %s reported for %v or more; likely cause: %s. Meanwhile the agent judges them from HAProxy's counters, as with --spoe-listen off",
		len(s.Silent), strings.Join(keyNames(s.Silent, 5), ", "), d.pathNames(), counters.DefaultSilentAfter, d.silenceCause(s))
}

// pathNames lists the configured per-response paths.
func (d *Daemon) pathNames() string {
	c := d.Config
	ls, _ := c.Listeners() // validated in New
	var p []string
	if !ls.SPOE.Off() {
		p = append(p, "SPOE at "+ls.SPOE.String())
	}
	if !ls.Lua.Off() {
		p = append(p, "the Lua companion at "+ls.Lua.String())
	}
	if !ls.Syslog.Off() {
		p = append(p, "logs at "+ls.Syslog.String())
	}
	return "no telemetry path (" + strings.Join(p, ", ") + ") has"
}

// silenceCause reads the paths' own counters for the likeliest reason.
func (d *Daemon) silenceCause(s counters.Silence) string {
	var why []string
	for _, r := range d.refused {
		if n := r.r.Count.Load(); n > 0 {
			last, _ := r.r.Last()
			why = append(why, fmt.Sprintf("the %s socket refused %d connection(s) or datagram(s) from a process not allowed to send evidence (last: %s): run HAProxy as a user of --peer-group %q, or name its group there", r.path, n, last, d.Config.PeerGroup))
		}
	}
	ls, _ := d.Config.Listeners()
	if !ls.SPOE.Off() {
		c := &d.SPOE.Counters
		switch {
		case c.Connections.Load() == 0 && ls.SPOE.Network == netx.Unix:
			why = append(why, fmt.Sprintf("HAProxy never connected to SPOE at %s: a chrooted HAProxy (Debian's and Ubuntu's stock config: chroot /var/lib/haproxy) looks for that path inside its chroot; listen on abns@hapilot-spoe and write `server agent1 abns@hapilot-spoe` in the stanza, or check that HAProxy's user may open the socket (mode 0660, the agent's group)", ls.SPOE.Addr))
		case c.Connections.Load() == 0:
			why = append(why, "HAProxy never connected to SPOE at "+ls.SPOE.String()+": the stanza's agents' backend does not name this address, or its server is down, so the nbsrv guard skips SPOE (show servers state of the agents' backend)")
		case c.Frames.Load() == 0:
			why = append(why, "HAProxy connects to SPOE but sends no message: the frontend serving these backends lacks `filter spoe` and `http-response send-spoe-group`, or the nbsrv guard skips them")
		case time.Since(d.spoeSeen.lastGrew) < counters.DefaultSilentAfter && s.Covered > 0:
			why = append(why, "SPOE reports other servers: the frontend that serves these lacks the stanza")
		default:
			why = append(why, "SPOE delivered messages before and none now: the agents' backend went down (nbsrv guard), or HAProxy reloaded without the stanza")
		}
	}
	for _, p := range []struct {
		name string
		c    *logs.Counters
		a    netx.Address
	}{{"the Lua companion", d.luaCounters(), ls.Lua}, {"logs", d.syslogCounters(), ls.Syslog}} {
		if p.c == nil {
			continue
		}
		if p.c.Batches.Load() == 0 {
			hint := ""
			if p.a.Network == netx.Unix || p.a.Network == netx.Unixgram {
				hint = " (a chrooted HAProxy looks for " + p.a.Addr + " inside its chroot: use an abns@ name)"
			}
			why = append(why, p.name+" at "+p.a.String()+" never received a batch"+hint)
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

// silenceFigures are the silent-path check's and the abstract sockets'
// figures, for /metrics and /status.
func (d *Daemon) silenceFigures() []promtext.Figure {
	var fs []promtext.Figure
	if d.Stats != nil && d.Stats.Coverage != nil {
		s := d.Silence()
		fs = append(fs,
			promtext.Figure{Metric: "hapilot_telemetry_silent_servers", Help: "Servers HAProxy counts answers for that no telemetry path reports; judged from HAProxy's counters meanwhile.", Gauge: true, V: uint64(len(s.Silent))},
			promtext.Figure{Metric: "hapilot_telemetry_silences_total", Help: "Times a server went silent on every telemetry path.", V: s.Episodes})
	}
	for _, r := range d.refused {
		fs = append(fs, promtext.Figure{Metric: "hapilot_" + r.path + "_peers_refused_total", Help: "Connections or datagrams to the " + r.path + " abstract socket refused: the sender's user and group are not allowed.", V: r.r.Count.Load()})
	}
	return fs
}
