package counters

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// statSource serves one scripted reading per poll.
type statSource struct {
	addr string
	info haproxy.Info
	rows []haproxy.ServerStat
	err  error
}

func (s *statSource) Addr() string { return s.addr }
func (s *statSource) ShowInfo(context.Context) (haproxy.Info, error) {
	return s.info, s.err
}
func (s *statSource) ServerStats(context.Context) ([]haproxy.ServerStat, error) {
	return s.rows, s.err
}

// row is one server's counters: ok 2xx answers, bad 5xx, retried attempts
// (each retried and redispatched, as retry-on with option redispatch 1
// counts them: in wretr and wredis both).
func row(server string, ok, bad, retried int64, rtime int) haproxy.ServerStat {
	c := haproxy.StatCounters{ReqTot: ok + bad, Wretr: retried, Wredis: retried, Stot: satAdd(ok+bad, retried)}
	c.Hrsp[1], c.Hrsp[4] = ok, bad
	return haproxy.ServerStat{Backend: "app", Server: server, RespTimeMs: rtime, Counters: c}
}

// reading is one poll: the process behind the socket and its rows.
type reading struct {
	pid   int
	start int64 // Unix seconds
	rows  []haproxy.ServerStat
	err   error
}

// totals is what the windows hold for one server after a poll.
type totals struct{ requests, err5xx, retried uint64 }

func TestStatPollerCountsWhatGrew(t *testing.T) {
	const t0 = 10_000 // the first poll's second; processes start before it
	tests := []struct {
		name     string
		mode     StatMode
		readings []reading
		want     map[string]totals // after the last reading
		reloads  uint64
		resets   uint64
	}{
		{
			name: "first sight is a baseline, then the gains count",
			readings: []reading{
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 1000, 50, 3, 4), row("b", 900, 0, 0, 4)}},
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 1090, 60, 5, 4), row("b", 1000, 0, 0, 4)}},
			},
			want: map[string]totals{"a": {90 + 10 + 2, 10 + 2, 2}, "b": {100, 0, 0}},
		},
		{
			name: "retries mode records only the retried attempts",
			mode: StatRetries,
			readings: []reading{
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 0, 0, 0, 0)}},
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 0, 0, 20, 0)}},
			},
			want: map[string]totals{"a": {20, 20, 20}},
		},
		{
			name: "clear counters: what the row holds now counts",
			readings: []reading{
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 5000, 100, 0, 4)}},
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 40, 2, 0, 4)}},
			},
			want:   map[string]totals{"a": {42, 2, 0}},
			resets: 1,
		},
		{
			name: "a reload after the last read counts the new process from zero",
			readings: []reading{
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 5000, 100, 0, 4)}},
				{pid: 2, start: t0, rows: []haproxy.ServerStat{row("a", 30, 3, 1, 4)}},
			},
			want:    map[string]totals{"a": {34, 4, 1}},
			reloads: 1,
		},
		{
			name: "a process that started before the last read is a baseline",
			readings: []reading{
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 5000, 100, 0, 4)}},
				{pid: 2, start: t0 - 50, rows: []haproxy.ServerStat{row("a", 700, 7, 0, 4)}},
			},
			want:    map[string]totals{},
			reloads: 1,
		},
		{
			name: "a server added at runtime counts from zero; one removed is forgotten",
			readings: []reading{
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 100, 0, 0, 4), row("gone", 100, 0, 0, 4)}},
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 110, 0, 0, 4), row("new", 12, 1, 0, 4)}},
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 120, 0, 0, 4), row("new", 14, 1, 0, 4), row("gone", 100, 0, 0, 4)}},
			},
			// "gone" came back in a known process: from zero, like any new server.
			want: map[string]totals{"a": {20, 0, 0}, "new": {15, 1, 0}, "gone": {100, 0, 0}},
		},
		{
			name: "a failed read records nothing and loses no baseline",
			readings: []reading{
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 100, 0, 0, 4)}},
				{err: errors.New("connection refused")},
				{pid: 1, start: t0 - 100, rows: []haproxy.ServerStat{row("a", 130, 3, 0, 4)}},
			},
			want: map[string]totals{"a": {33, 3, 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(t0, 0)
			store := window.New(time.Minute, 16, func() time.Time { return now })
			src := &statSource{addr: "unix:/run/haproxy/admin.sock"}
			p := &StatPoller{Sources: []StatSource{src}, Sink: store, Mode: tt.mode, Period: time.Second,
				Log: zerolog.Nop(), Now: func() time.Time { return now }}
			// Each new process is reported as its poll finds it, and only then.
			var heard uint64
			p.OnReload = func(addr string) {
				if addr == src.addr {
					heard++
				}
			}
			if p.Mode == "" {
				p.Mode = StatCounts
			}
			for _, r := range tt.readings {
				src.info, src.rows, src.err = haproxy.Info{Pid: r.pid, StartTime: r.start}, r.rows, r.err
				p.Poll(context.Background())
				now = now.Add(time.Second)
			}
			got := map[string]totals{}
			for _, st := range store.Snapshot(0) {
				if st.Requests > 0 {
					got[st.Server] = totals{st.Requests, st.Err5xx, st.Retried}
				}
			}
			if len(got) != len(tt.want) {
				t.Errorf("windows %v, want %v", got, tt.want)
			}
			for s, w := range tt.want {
				if got[s] != w {
					t.Errorf("%s: %+v, want %+v", s, got[s], w)
				}
			}
			if p.Counters.Reloads.Load() != tt.reloads || p.Counters.Resets.Load() != tt.resets {
				t.Errorf("reloads %d resets %d, want %d %d", p.Counters.Reloads.Load(), p.Counters.Resets.Load(), tt.reloads, tt.resets)
			}
			if heard != tt.reloads {
				t.Errorf("OnReload heard %d reloads, want %d", heard, tt.reloads)
			}
		})
	}
}

// Several processes each keep their own baseline, and their gains add up.
func TestStatPollerSumsProcesses(t *testing.T) {
	now := time.Unix(20_000, 0)
	store := window.New(time.Minute, 16, func() time.Time { return now })
	one := &statSource{addr: "unix:/run/haproxy/one.sock", info: haproxy.Info{Pid: 1, StartTime: 1}}
	two := &statSource{addr: "unix:/run/haproxy/two.sock", info: haproxy.Info{Pid: 2, StartTime: 1}}
	p := &StatPoller{Sources: []StatSource{one, two}, Sink: store, Mode: StatCounts, Log: zerolog.Nop(), Now: func() time.Time { return now }}
	one.rows = []haproxy.ServerStat{row("a", 1000, 0, 0, 3)}
	two.rows = []haproxy.ServerStat{row("a", 7, 0, 0, 3)}
	p.Poll(context.Background())
	one.rows = []haproxy.ServerStat{row("a", 1040, 4, 0, 3)}
	two.rows = []haproxy.ServerStat{row("a", 37, 2, 0, 3)}
	p.Poll(context.Background())
	st := store.Snapshot(0)
	if len(st) != 1 || st[0].Requests != 76 || st[0].Err5xx != 6 || st[0].P99Ms != 3 {
		t.Fatalf("windows %+v, want 76 requests, 6 5xx, p99 3 ms (the processes' rtime)", st)
	}
}

// A long period's gains are spread over the seconds they accrued in, so
// the windows hold a rate, not one burst (the capacity guard reads it).
func TestStatPollerSpreadsALongPeriod(t *testing.T) {
	now := time.Unix(30_000, 0)
	store := window.New(time.Minute, 16, func() time.Time { return now })
	src := &statSource{addr: "unix:/run/haproxy/admin.sock", info: haproxy.Info{Pid: 1, StartTime: 1}}
	p := &StatPoller{Sources: []StatSource{src}, Sink: store, Mode: StatCounts, Log: zerolog.Nop(), Now: func() time.Time { return now }}
	src.rows = []haproxy.ServerStat{row("a", 1000, 0, 0, 3)}
	p.Poll(context.Background())
	now = now.Add(15 * time.Second)
	src.rows = []haproxy.ServerStat{row("a", 1152, 3, 0, 3)}
	p.Poll(context.Background())
	got := store.PerSecond(16)[0]
	// 152 answers and 3 5xx over 15 s, each class spread on its own, its
	// remainder to the latest seconds.
	want := "[0 10 10 10 10 10 10 10 10 10 10 10 10 11 12 12]"
	if fmt.Sprint(got.Requests) != want {
		t.Fatalf("per second %v, want %s", got.Requests, want)
	}
	if st := store.Snapshot(0)[0]; st.Requests != 155 || st.Err5xx != 3 || st.RatePerSec < 9 || st.RatePerSec > 12 {
		t.Fatalf("window %+v: want 155 requests, 3 5xx, about 10 a second", st)
	}
}

// A counter that jumps by 2^62 between two reads one second apart is
// recorded at what a second can hold (MaxGainPerSecond) and counted, and
// the poll returns at once. Before, the gain was recorded 2^20 at a time:
// 2^42 passes, the stats path stalled for every socket.
func TestStatPollerClampsImpossibleGains(t *testing.T) {
	tests := []struct {
		name                  string
		gap                   time.Duration
		ok, retried           int64 // app/a's gains
		wantOK, wantRetried   uint64
		wantClamped, wantRest uint64 // app/b gains 50 answers each time
	}{
		{"2^62 answers and retries in a second", time.Second, 1 << 62, 1 << 62, MaxGainPerSecond, MaxGainPerSecond, 1, 50},
		{"just within a second's bound", time.Second, MaxGainPerSecond, 0, MaxGainPerSecond, 0, 0, 50},
		// Two hours between reads: only the last hour can land in a
		// window, and the poll does not walk the seconds before it.
		{"two hours between reads", 2 * time.Hour, 7200, 0, 3600, 0, 0, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(40_000, 0)
			store := window.New(time.Hour, 16, func() time.Time { return now })
			src := &statSource{addr: "unix:/run/haproxy/admin.sock", info: haproxy.Info{Pid: 1, StartTime: 1}}
			p := &StatPoller{Sources: []StatSource{src}, Sink: store, Mode: StatCounts, Log: zerolog.Nop(), Now: func() time.Time { return now }}
			src.rows = []haproxy.ServerStat{row("a", 0, 0, 0, 3), row("b", 100, 0, 0, 3)}
			p.Poll(context.Background())
			now = now.Add(tt.gap)
			src.rows = []haproxy.ServerStat{row("a", tt.ok, 0, tt.retried, 3), row("b", 150, 0, 0, 3)}
			done := make(chan struct{})
			go func() { p.Poll(context.Background()); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the poll did not return in 10 s")
			}
			got := map[string]window.Stats{}
			for _, st := range store.Snapshot(0) {
				got[st.Server] = st
			}
			if a := got["a"]; a.Requests != tt.wantOK+tt.wantRetried || a.Retried != tt.wantRetried {
				t.Errorf("a: %d requests, %d retried; want %d and %d", a.Requests, a.Retried, tt.wantOK+tt.wantRetried, tt.wantRetried)
			}
			if b := got["b"]; b.Requests != tt.wantRest {
				t.Errorf("b: %d requests, want %d: a clamp elsewhere must not change it", b.Requests, tt.wantRest)
			}
			if n := p.Counters.Clamped.Load(); n != tt.wantClamped {
				t.Errorf("clamped %d, want %d", n, tt.wantClamped)
			}
		})
	}
}

// In retries mode with Coverage, a server no per-response path reports
// is judged from the counters once silent: its answers reach the windows
// (marked Counted, so that they do not count as delivered), while a
// server the path reports keeps its answers from the path alone.
func TestStatPollerFallsBackForSilentServers(t *testing.T) {
	now := time.Unix(20_000, 0)
	store := window.New(time.Minute, 16, func() time.Time { return now })
	src := &statSource{addr: "s", info: haproxy.Info{Pid: 1, StartTime: 10_000}}
	p := &StatPoller{Sources: []StatSource{src}, Sink: store, Mode: StatRetries, Log: zerolog.Nop(), Now: func() time.Time { return now },
		Coverage: &Coverage{After: DefaultSilentAfter, Delivered: store.Delivered}}
	var okA, badA, okB int64
	for i := 0; i <= 8; i++ {
		okA, badA, okB = okA+100, badA+5, okB+100
		src.rows = []haproxy.ServerStat{row("reported", okB, 0, 0, 4), row("silent", okA, badA, 0, 4)}
		// The path reports "reported" (100 answers a second), never "silent".
		store.Record(window.Event{Backend: []byte("app"), Server: []byte("reported"), Status: 200, Count: 100})
		p.Poll(context.Background())
		now = now.Add(time.Second)
	}
	got := map[string]window.Stats{}
	for _, s := range store.Snapshot(time.Minute) {
		got[s.Server] = s
	}
	// Poll 0 sets the baseline and poll 1 starts the watch; 5 s and 500
	// answers later (poll 6) the server is silent, and the gains of polls
	// 6, 7 and 8 are recorded.
	if s := got["silent"]; s.Requests != 3*105 || s.Err5xx != 15 {
		t.Errorf("silent: %+v, want 315 requests, 15 5xx from the counters", s)
	}
	if s := got["reported"]; s.Requests != 9*100 {
		t.Errorf("reported: %d requests, want the path's 900 alone", s.Requests)
	}
	if d := store.Delivered("app", "silent"); d != 0 {
		t.Errorf("the counters' answers counted as delivered: %d", d)
	}
	if sil := p.Coverage.Silence(); len(sil.Silent) != 1 || sil.Silent[0].Server != "silent" {
		t.Errorf("%+v", sil)
	}
}

// A hang's session (stot) is counted when HAProxy connects, its 504
// (eresp) timeout server later, often a poll or more after: the room
// its session made is kept across polls while in flight (scur), so the
// failure is counted once it shows, and a second eresp for the same
// attempt finds no room. Sessions that ended with no answer and no
// failure (clients that gave up) leave no room behind: a reset HAProxy
// counts twice in eresp later still counts once.
func TestStatPollerKeepsRoomAcrossPolls(t *testing.T) {
	now := time.Unix(50_000, 0)
	store := window.New(time.Minute, 16, func() time.Time { return now })
	src := &statSource{addr: "s", info: haproxy.Info{Pid: 1, StartTime: 1}}
	p := &StatPoller{Sources: []StatSource{src}, Sink: store, Mode: StatCounts, Log: zerolog.Nop(), Now: func() time.Time { return now }}
	c := haproxy.StatCounters{ReqTot: 100, Stot: 103, Eresp: 3} // history: a baseline
	c.Hrsp[1] = 100
	for i, step := range []func(){
		func() {},
		func() { c.Stot += 10; c.ReqTot += 9; c.Hrsp[1] += 9; c.Scur = 1 }, // one attempt in flight
		func() { c.Eresp++; c.Scur = 0 },                                   // its 504
		func() { c.Eresp++ },                                               // counted again: no room left
		func() { c.Stot += 5 },                                             // 5 clients gave up: no failure
		func() { c.Stot++; c.Eresp += 2 },                                  // a reset counted twice (3.0)
	} {
		step()
		src.rows = []haproxy.ServerStat{{Backend: "app", Server: "a", Counters: c}}
		p.Poll(context.Background())
		now = now.Add(time.Second)
		if i == 1 && p.Counters.Proxy.Load() != 0 {
			t.Fatalf("an attempt in flight counted as a failure")
		}
	}
	st := store.Snapshot(0)[0]
	if st.Proxy5xx != 2 || st.Requests != 11 || st.Err5xx != 2 {
		t.Fatalf("%+v, want 9 answers and two HAProxy 5xx: the hang's and the reset's, once each", st)
	}
}

// timesSink records each event's answer time.
type timesSink struct{ ms []int }

func (s *timesSink) Record(ev window.Event) { s.ms = append(s.ms, ev.ResponseMs) }

// The stats path records a period's answers at the mean of the server's
// last 10 s of answers, read out of rtime's moves (haproxy.RecentMean),
// not at rtime itself: 15 s after every answer went from 11 to 85 ms,
// HAProxy's rtime (sliding over 512 answers) reads 62 ms, and the
// answers are recorded at 85.
func TestStatPollerRecordsTheRecentMean(t *testing.T) {
	now := time.Unix(30_000, 0)
	sink := &timesSink{}
	src := &statSource{addr: "unix:/run/haproxy/admin.sock", info: haproxy.Info{Pid: 1, StartTime: 1}}
	p := &StatPoller{Sources: []StatSource{src}, Sink: sink, Mode: StatCounts, Log: zerolog.Nop(), Now: func() time.Time { return now }}
	var sum uint32
	var answers int64
	poll := func(n int, ms uint32) {
		for range n {
			w := uint32(0)
			if answers >= haproxy.TimeSamples {
				w = haproxy.TimeSamples
			}
			sum = haproxy.SwrateAdd(sum, w, ms)
			answers++
		}
		src.rows = []haproxy.ServerStat{row("a", answers, 0, 0, int(haproxy.RTimeOf(sum, answers)))}
		sink.ms = sink.ms[:0]
		p.Poll(context.Background())
		now = now.Add(500 * time.Millisecond)
	}
	poll(2000, 11) // a baseline
	for range 60 {
		poll(25, 11)
	}
	if got := sink.ms; len(got) != 1 || got[0] < 9 || got[0] > 13 {
		t.Fatalf("steady at 11 ms: recorded at %v", got)
	}
	for range 30 {
		poll(25, 85)
	}
	rtime := int(haproxy.RTimeOf(sum, answers))
	if got := sink.ms; len(got) != 1 || got[0] < 80 || got[0] > 90 || rtime > 70 {
		t.Fatalf("15 s after a step to 85 ms: recorded at %v, HAProxy's rtime %d", got, rtime)
	}
}
