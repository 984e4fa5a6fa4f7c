package window

import (
	"fmt"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

func ev(b, s string, status, ms int) Event {
	return Event{Backend: []byte(b), Server: []byte(s), Status: status, ResponseMs: ms}
}

func TestLatencyBinsCoverEveryValueInOrder(t *testing.T) {
	prev := -1
	for ms := 0; ms <= maxLatencyMs; ms++ {
		b := latencyBin(ms)
		if b < prev || b >= latencyBins {
			t.Fatalf("latencyBin(%d)=%d after %d", ms, b, prev)
		}
		if ms > binUpper(b) {
			t.Fatalf("ms %d above its bin %d upper bound %d", ms, b, binUpper(b))
		}
		if b > 0 && ms <= binUpper(b-1) {
			t.Fatalf("ms %d belongs to bin %d, not %d", ms, b-1, b)
		}
		prev = b
	}
	if got := latencyBin(10 * maxLatencyMs); got != latencyBins-1 {
		t.Fatalf("huge latency went to bin %d", got)
	}
}

func TestSnapshotCountsAndQuantiles(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s := New(60*time.Second, 10, clk.Now)
	for i := 0; i < 100; i++ {
		status := 200
		switch {
		case i < 5:
			status = 503
		case i < 8:
			status = 404
		}
		s.Record(ev("be", "a", status, i)) // latencies 0..99 ms
	}
	st := s.Snapshot(0)
	if len(st) != 1 {
		t.Fatalf("got %d series", len(st))
	}
	got := st[0]
	if got.Requests != 100 || got.Err5xx != 5 || got.Err4xx != 3 {
		t.Fatalf("counts %+v", got)
	}
	// Bins are at most 12.5% wide; the reported value is the bin's upper bound.
	for _, c := range []struct {
		name      string
		got, true int
	}{{"p50", got.P50Ms, 49}, {"p95", got.P95Ms, 94}, {"p99", got.P99Ms, 98}} {
		if c.got < c.true || float64(c.got) > float64(c.true)*1.13 {
			t.Errorf("%s = %d, true %d", c.name, c.got, c.true)
		}
	}
	if r := got.ErrorRate(); r != 0.05 {
		t.Errorf("error rate %v", r)
	}
	if got.Seconds != 1 || got.RatePerSec != 0 {
		t.Errorf("seconds %d, rate %v: one second still filling has no rate yet", got.Seconds, got.RatePerSec)
	}
	for i := 0; i < 2; i++ {
		clk.t = clk.t.Add(time.Second)
		for j := 0; j < 40; j++ {
			s.Record(ev("be", "a", 200, 1))
		}
	}
	// Seconds: 100 (oldest), 40 (complete), 40 (current): the rate rests
	// on the complete one alone.
	if got := s.Snapshot(0)[0]; got.Seconds != 3 || got.RatePerSec != 40 {
		t.Errorf("seconds %d, rate %v", got.Seconds, got.RatePerSec)
	}
}

// An event with a Count stands for that many identical responses: the
// same figures as recording each one.
func TestCountedEventEqualsItsResponses(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	one, counted := New(60*time.Second, 10, clk.Now), New(60*time.Second, 10, clk.Now)
	for _, e := range []struct{ status, ms, n int }{{200, 3, 70}, {503, 40, 7}, {404, 1, 1}, {200, 250, 22}} {
		for i := 0; i < e.n; i++ {
			one.Record(ev("be", "a", e.status, e.ms))
		}
		c := ev("be", "a", e.status, e.ms)
		c.Count = e.n
		counted.Record(c)
	}
	a, b := one.Snapshot(0)[0], counted.Snapshot(0)[0]
	if a != b || a.Requests != 100 || counted.Events() != 100 {
		t.Fatalf("one by one %+v\ncounted    %+v (events %d)", a, b, counted.Events())
	}
	big := ev("be", "a", 200, 1)
	big.Count = 1 << 40 // beyond a bucket's 32-bit counters: clamped
	counted.Record(big)
	if got := counted.Snapshot(0)[0].Requests; got != 100+MaxCount {
		t.Fatalf("requests %d after a huge count, want %d", got, 100+MaxCount)
	}
}

func TestWindowSlides(t *testing.T) {
	clk := &fakeClock{t: time.Unix(5000, 0)}
	s := New(10*time.Second, 10, clk.Now)
	for i := 0; i < 20; i++ { // one 5xx per second for 20 s
		s.Record(ev("be", "a", 500, 1))
		clk.t = clk.t.Add(time.Second)
	}
	clk.t = clk.t.Add(-time.Second) // now = last second written
	tests := []struct {
		last time.Duration
		want uint64
	}{
		{0, 10}, {10 * time.Second, 10}, {time.Minute, 10}, {3 * time.Second, 3}, {time.Second, 1},
	}
	for _, tc := range tests {
		if got := s.Snapshot(tc.last)[0].Err5xx; got != tc.want {
			t.Errorf("Snapshot(%v) 5xx = %d, want %d", tc.last, got, tc.want)
		}
	}
	clk.t = clk.t.Add(11 * time.Second)
	if got := s.Snapshot(0)[0].Requests; got != 0 {
		t.Errorf("after the span passed: %d requests", got)
	}
	// A late event older than the bucket now in its slot is ignored.
	s.Record(ev("be", "a", 200, 1))
	s.RecordAt(clk.t.Unix()-10, ev("be", "a", 500, 1))
	if got := s.Snapshot(0)[0]; got.Requests != 1 || got.Err5xx != 0 {
		t.Errorf("late event counted: %+v", got)
	}
}

func TestForget(t *testing.T) {
	s := New(time.Minute, 10, nil)
	s.Record(ev("be", "a", 500, 1))
	s.Record(ev("be", "b", 500, 1))
	s.Forget("be", "a")
	s.Forget("be", "nope")
	st := s.Snapshot(0)
	if st[0].Requests != 0 || st[1].Err5xx != 1 {
		t.Fatalf("%+v", st)
	}
	s.Record(ev("be", "a", 200, 1))
	if got := s.Snapshot(0)[0]; got.Requests != 1 || got.Err5xx != 0 {
		t.Fatalf("after forget: %+v", got)
	}
}

func TestMaxSeriesBoundsMemory(t *testing.T) {
	s := New(time.Minute, 3, nil)
	for _, srv := range []string{"a", "b", "c", "d", "e", "a"} {
		s.Record(ev("be", srv, 200, 1))
	}
	if s.Len() != 3 || s.Dropped() != 2 || s.Events() != 4 {
		t.Fatalf("len %d dropped %d events %d", s.Len(), s.Dropped(), s.Events())
	}
	counted := ev("be", "f", 200, 1)
	counted.Count = 7 // dropped as the 7 responses it stands for
	s.Record(counted)
	if s.Dropped() != 9 {
		t.Fatalf("dropped %d after a counted event of 7, want 9", s.Dropped())
	}
}

func TestSnapshotSorted(t *testing.T) {
	s := New(time.Minute, 10, nil)
	for _, p := range [][2]string{{"b", "x"}, {"a", "z"}, {"a", "y"}} {
		s.Record(ev(p[0], p[1], 200, 1))
	}
	got := s.Snapshot(0)
	want := [][2]string{{"a", "y"}, {"a", "z"}, {"b", "x"}}
	for i := range want {
		if got[i].Backend != want[i][0] || got[i].Server != want[i][1] {
			t.Fatalf("order %v", got)
		}
	}
}

func TestRecordAllocatesNothing(t *testing.T) {
	s := New(time.Minute, 10, nil)
	e := ev("be", "srv1", 200, 12)
	s.Record(e)
	if n := testing.AllocsPerRun(1000, func() { s.Record(e) }); n != 0 {
		t.Fatalf("%v allocations per event", n)
	}
}

// BenchmarkRecord measures the per-event ingest cost on one goroutine,
// spread over 64 series and a moving clock, as the hot path sees it.
func BenchmarkRecord(b *testing.B) {
	clk := &fakeClock{t: time.Unix(1, 0)}
	s := New(time.Minute, DefaultMaxSeries, clk.Now)
	events := make([]Event, 64)
	for i := range events {
		events[i] = ev("backend"+string(rune('a'+i%4)), "srv"+string(rune('a'+i)), 200+300*(i%20/19), 5+i%40)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i&0xffff == 0 {
			clk.t = clk.t.Add(time.Second)
		}
		s.RecordAt(clk.t.Unix(), events[i&63])
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkRecordParallel(b *testing.B) {
	s := New(time.Minute, DefaultMaxSeries, nil)
	e := ev("be", "srv1", 200, 12)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s.Record(e)
		}
	})
}

// Names are bounded, and series HAProxy does not report can be dropped:
// a flood of made-up names once shut every real server out until a
// restart.
func TestNamesBoundedAndFloodsRetained(t *testing.T) {
	s := New(time.Minute, 4, func() time.Time { return time.Unix(1000, 0) })
	long := make([]byte, MaxName+1)
	for i := range long {
		long[i] = 'x'
	}
	s.Record(Event{Backend: []byte("app"), Server: long, Status: 200})
	s.Record(Event{Backend: []byte(""), Server: []byte("s1"), Status: 200})
	if s.BadNames() != 2 || s.Len() != 0 {
		t.Fatalf("bad names %d, series %d", s.BadNames(), s.Len())
	}
	for i := 0; i < 10; i++ {
		s.Record(Event{Backend: []byte("app"), Server: []byte(fmt.Sprintf("fake%d", i)), Status: 200})
	}
	s.Record(Event{Backend: []byte("app"), Server: []byte("s1"), Status: 200})
	if s.Len() != 4 || s.Dropped() < 7 {
		t.Fatalf("series %d, dropped %d", s.Len(), s.Dropped())
	}
	if n := s.Retain(func(b, srv string) bool { return b == "app" && srv == "s1" }); n != 4 || s.Len() != 0 {
		t.Fatalf("retained away %d, left %d", n, s.Len())
	}
	s.Record(Event{Backend: []byte("app"), Server: []byte("s1"), Status: 500})
	if st := s.Snapshot(0); len(st) != 1 || st[0].Server != "s1" || st[0].Err5xx != 1 {
		t.Fatalf("after the flood: %+v", st)
	}
}

// A retried attempt is a request and a 5xx of its server, with no answer
// time: the latency quantiles are the answers' alone.
func TestRetriedAttemptsCountAsFailures(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s := New(60*time.Second, 10, clk.Now)
	for i := 0; i < 10; i++ {
		s.Record(ev("be", "a", 200, 5))
	}
	s.Record(Event{Backend: []byte("be"), Server: []byte("a"), Retried: true, Count: 4})
	got := s.Snapshot(0)[0]
	if got.Requests != 14 || got.Err5xx != 4 || got.Retried != 4 || got.P99Ms != 5 {
		t.Fatalf("%+v, want 14 requests, 4 5xx, 4 retried, p99 5 ms", got)
	}
	clk.t = clk.t.Add(61 * time.Second)
	s.Record(ev("be", "a", 200, 5)) // second 1000 is now outside the window
	if got := s.Snapshot(0)[0]; got.Retried != 0 || got.Requests != 1 {
		t.Fatalf("after the window slid: %+v", got)
	}
}

func TestPerSecond(t *testing.T) {
	clk := &fakeClock{t: time.Unix(2000, 0)}
	s := New(60*time.Second, 10, clk.Now)
	for i := 0; i < 10; i++ {
		s.Record(ev("be", "a", 200, 4))
	}
	s.Record(ev("be", "a", 500, 40))
	clk.t = clk.t.Add(2 * time.Second)
	s.Record(ev("be", "a", 200, 7))
	got := s.PerSecond(3)
	if len(got) != 1 {
		t.Fatalf("%d series", len(got))
	}
	g := got[0]
	// 40 ms reads as 43: the top of its bin, as every quantile does.
	if fmt.Sprint(g.Requests, g.Err5xx, g.P99Ms) != "[11 0 1] [1 0 0] [43 0 7]" {
		t.Fatalf("requests %v 5xx %v p99 %v", g.Requests, g.Err5xx, g.P99Ms)
	}
}

// Each failure class is a request and a 5xx of its server, counted in its
// own figure and total, with no answer time; a 5xx answer is class
// FailAnswer; an event's Retried is FailRetry.
func TestFailureClassesCountOnce(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	s := New(60*time.Second, 10, clk.Now)
	for i := 0; i < 10; i++ {
		s.Record(ev("be", "a", 200, 5))
	}
	s.Record(ev("be", "a", 503, 5))
	for _, e := range []Event{
		{Fail: FailRetry, Count: 2},
		{Retried: true, Count: 1},
		{Fail: FailProxy, Count: 3},
		{Fail: FailAbort, Count: 4},
		{Fail: NumFails + 3, Status: 200}, // an unknown class is an answer
	} {
		e.Backend, e.Server = []byte("be"), []byte("a")
		s.Record(e)
	}
	got := s.Snapshot(0)[0]
	want := map[Fail]uint64{FailAnswer: 1, FailRetry: 3, FailProxy: 3, FailAbort: 4}
	for f, n := range want {
		if got.Failed(f) != n {
			t.Errorf("%v: %d in the window, want %d", f, got.Failed(f), n)
		}
		if f != FailAnswer && got.TotalFailed[f] != n {
			t.Errorf("%v: %d in the total, want %d", f, got.TotalFailed[f], n)
		}
	}
	if got.Requests != 22 || got.Err5xx != 11 || got.TotalErr5xx != 11 || got.P99Ms != 5 {
		t.Fatalf("%+v, want 22 requests, 11 5xx, p99 5 ms", got)
	}
	clk.t = clk.t.Add(61 * time.Second)
	s.Record(ev("be", "a", 200, 5))
	if got := s.Snapshot(0)[0]; got.Proxy5xx != 0 || got.Aborted != 0 || got.Retried != 0 || got.TotalFailed[FailAbort] != 4 {
		t.Fatalf("after the window slid: %+v", got)
	}
}

// Delivered5xx is the 5xx the per-response paths reported: the stats
// path's (Counted) answers and failures are left out.
func TestDelivered5xx(t *testing.T) {
	s := New(60*time.Second, 10, nil)
	for _, e := range []Event{
		{Status: 504, Count: 3},                // a path's
		{Status: 200, Count: 9},                // a path's, not a 5xx
		{Status: 500, Count: 4, Counted: true}, // the counters'
		{Fail: FailProxy, Count: 2, Counted: true},
	} {
		e.Backend, e.Server = []byte("be"), []byte("a")
		s.Record(e)
	}
	if got := s.Delivered5xx("be", "a"); got != 3 {
		t.Fatalf("delivered 5xx %d, want 3", got)
	}
	if got := s.Delivered5xx("be", "none"); got != 0 {
		t.Fatalf("an unknown server: %d", got)
	}
}

// TestTailSlots: each slot's floor is the least answer time tallied in
// it, slots are a quarter octave from 32 ms, and a series' tallies count
// every timed answer in its slot, untimed ones (no answer) nowhere.
func TestTailSlots(t *testing.T) {
	for ms := range 70000 {
		k := TailSlot(ms)
		if k < 0 || k >= TailSlots || TailSlotFloorMs(k) > ms || (k+1 < TailSlots && TailSlotFloorMs(k+1) <= ms) {
			t.Fatalf("%d ms in slot %d, floor %d, next floor %d", ms, k, TailSlotFloorMs(k), TailSlotFloorMs(k+1))
		}
	}
	for _, c := range []struct{ slot, floor int }{{0, 0}, {1, 32}, {2, 40}, {4, 56}, {5, 64}, {9, 128}, {TailSlots - 1, 57344}} {
		if got := TailSlotFloorMs(c.slot); got != c.floor {
			t.Errorf("slot %d floor %d ms, want %d", c.slot, got, c.floor)
		}
	}
	now := time.Unix(1000, 0)
	s := New(time.Minute, 8, func() time.Time { return now })
	for _, ms := range []int{5, 31, 32, 70, 70, 1500, 100000} {
		s.Record(Event{Backend: []byte("b"), Server: []byte("s"), Status: 200, ResponseMs: ms})
	}
	s.Record(Event{Backend: []byte("b"), Server: []byte("s"), Fail: FailProxy, ResponseMs: -1})
	st := s.Snapshot(time.Minute)[0]
	want := [TailSlots]uint32{}
	want[0], want[1], want[TailSlot(70)], want[TailSlot(1500)], want[TailSlots-1] = 2, 1, 2, 1, 1
	if st.TotalTail != want {
		t.Errorf("tallies %v, want %v", st.TotalTail, want)
	}
}
