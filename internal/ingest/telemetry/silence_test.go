package telemetry

import (
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/ingest/counters"
	"github.com/hapilot/hapilot/internal/ingest/logs"
	"github.com/hapilot/hapilot/internal/ingest/spoe"
	"github.com/hapilot/hapilot/internal/lib/netx"
)

func addr(t *testing.T, s string) netx.Address {
	t.Helper()
	a, err := netx.ParseAddress("listen", s, netx.TCP, netx.Unix, netx.Abstract)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The likely cause of a silence is read from the paths' own counters,
// one case per way a path breaks.
func TestSilenceCause(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(p *Paths)
		want string
	}{
		{"a unix socket a chrooted HAProxy cannot reach", func(p *Paths) { p.SPOEAt = addr(t, "unix:/run/hapilot/spoe.sock") },
			"looks for that path inside its chroot"},
		{"never connected", func(p *Paths) {}, "HAProxy never connected to SPOE at 127.0.0.1:12345"},
		{"connected, no message", func(p *Paths) { p.SPOE.Counters.Connections.Add(1) }, "sends no message"},
		{"other servers reported", func(p *Paths) {
			p.SPOE.Counters.Connections.Add(1)
			p.SPOE.Counters.Frames.Add(5)
			p.notePathActivity(time.Now())
		}, "SPOE reports other servers"},
		{"messages before, none now", func(p *Paths) {
			p.SPOE.Counters.Connections.Add(1)
			p.SPOE.Counters.Frames.Add(5)
			p.spoeSeen = pathActivity{frames: 5, lastGrew: time.Now().Add(-time.Hour)}
		}, "SPOE delivered messages before and none now"},
		{"the Lua companion never sent", func(p *Paths) {
			p.SPOEAt = netx.Address{}
			p.LuaAt, p.Lua = addr(t, "unix:/run/hapilot/lua.sock"), &logs.LineServer{}
		}, "the Lua companion at unix:/run/hapilot/lua.sock never received a batch (a chrooted HAProxy"},
		{"peers refused", func(p *Paths) {
			var r netx.Refusals
			r.Count.Add(2)
			p.refused = append(p.refused, refusals{"spoe", &r})
		}, `refused 2 connection(s) or datagram(s) from a process not allowed to send evidence (last: `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Paths{SPOEAt: addr(t, "127.0.0.1:12345"), SPOE: &spoe.Server{}, PeerGroup: "haproxy"}
			tc.set(p)
			s := counters.Silence{Covered: 1}
			if got := p.SilenceCause(s); !strings.Contains(got, tc.want) {
				t.Fatalf("cause %q, want %q in it", got, tc.want)
			}
			if w := p.SilenceWarning(s); !strings.HasPrefix(w, "telemetry silent: ") || !strings.Contains(w, tc.want) {
				t.Fatalf("warning %q", w)
			}
		})
	}
}

// What the per-response paths cannot see, and who makes up for it.
func TestUnseen(t *testing.T) {
	for _, tc := range []struct {
		name      string
		spoe, lua string
		stats     bool
		want      string
	}{
		{"no per-response path", "off", "off", true, ""},
		{"SPOE with the stats path", "127.0.0.1:1", "off", true, "the per-response paths cannot see HAProxy's own 502/503/504"},
		{"SPOE alone: blind", "127.0.0.1:1", "off", false, "telemetry blind: the per-response paths cannot see HAProxy's own 502/503/504"},
		{"the Lua companion sees HAProxy's own answers", "off", "127.0.0.1:2", true, "the per-response paths cannot see the attempts HAProxy retried"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Paths{SPOEAt: addr(t, tc.spoe), LuaAt: addr(t, tc.lua), SPOE: &spoe.Server{}}
			if tc.stats {
				p.Stats = &counters.StatPoller{}
			}
			got := p.Unseen()
			if (tc.want == "") != (got == "") || !strings.HasPrefix(got, tc.want) {
				t.Fatalf("unseen %q, want it to start %q", got, tc.want)
			}
		})
	}
}
