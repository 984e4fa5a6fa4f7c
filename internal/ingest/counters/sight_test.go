package counters

import (
	"context"
	"testing"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// Beside a path that should see HAProxy's own 5xx (the Lua companion,
// logs), a server whose 504s the path reports keeps them from the path
// alone; one whose path reports none of them (the Lua stanza on
// http-response) is found blind once HAProxy counted DefaultMinProxy of
// them, and they are recorded from the counters from then on. Before,
// such a server's hangs reached no window.
func TestSightFindsAPathBlindToHAProxys5xx(t *testing.T) {
	for _, tt := range []struct {
		name      string
		reports   bool // the path reports HAProxy's 504s
		wantBlind bool
	}{
		{"a path that reports them", true, false},
		{"a path blind to them", false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(60_000, 0)
			store := window.New(time.Minute, 16, func() time.Time { return now })
			src := &statSource{addr: "s", info: haproxy.Info{Pid: 1, StartTime: 1}}
			p := &StatPoller{Sources: []StatSource{src}, Sink: store, Mode: StatRetries, Log: zerolog.Nop(), Now: func() time.Time { return now },
				Unseen: []window.Fail{window.FailRetry, window.FailAbort}, Sight: &Sight{Delivered5xx: store.Delivered5xx}}
			var c haproxy.StatCounters
			ev := func(status, n int) {
				store.Record(window.Event{Backend: []byte("app"), Server: []byte("a"), Status: status, Count: n})
			}
			for i := 0; i < 12; i++ {
				// Each second: 48 answers, 2 HAProxy 504s (timeouts).
				c.ReqTot, c.Stot, c.Eresp = c.ReqTot+48, c.Stot+50, c.Eresp+2
				c.Hrsp[1] += 48
				ev(200, 48)
				if tt.reports {
					ev(504, 2)
				}
				src.rows = []haproxy.ServerStat{{Backend: "app", Server: "a", Counters: c}}
				p.Poll(context.Background())
				now = now.Add(time.Second)
			}
			b := p.Sight.Blindness()
			if (len(b.Blind) == 1) != tt.wantBlind {
				t.Fatalf("blind %v, want %v", b.Blind, tt.wantBlind)
			}
			st := store.Snapshot(0)[0]
			// Poll 0 is the baseline; the round ends at poll 5, its 10th
			// 504 since: polls 5 to 11 record theirs from the counters.
			want := uint64(0)
			if tt.wantBlind {
				want = 7 * 2
			}
			if st.Proxy5xx != want {
				t.Errorf("HAProxy 5xx from the counters %d, want %d (%+v)", st.Proxy5xx, want, st)
			}
		})
	}
}
