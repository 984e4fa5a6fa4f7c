// Package window keeps per backend/server sliding windows of response
// counts and latencies, written from the ingest hot path without locks.
//
// Each series is a ring of one-second buckets. A writer finds its bucket by
// the event's second; the first writer of a new second claims the bucket
// with a compare-and-swap and clears it. Writers racing that clear at a
// second boundary can lose a handful of counts: the windows are statistics
// for a control loop, not an accounting ledger, and the price of exactness
// (a lock per event) is what the hot path cannot pay.
package window

import (
	"fmt"
	"math/bits"

	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hapilot/hapilot/internal/lib/promtext"
)

// Defaults for a Store.
const (
	DefaultSpan      = 60 * time.Second
	DefaultMaxSeries = 4096
)

// Latency histogram layout: milliseconds 0..15 are exact, above that each
// power of two is split into 8 sub-buckets (at most 12.5% wide), up to 2^16 ms.
const (
	exactBins    = 16
	subBins      = 8
	octaves      = 12 // 2^4 .. 2^16
	latencyBins  = exactBins + octaves*subBins
	maxLatencyMs = 1<<16 - 1
)

// Event is one observed response, the single type every ingest path
// (SPOE, Lua companion, logs) produces. Names are byte slices so that a
// decoder can point into its frame buffer without allocating.
type Event struct {
	Backend    []byte
	Server     []byte
	Status     int
	ResponseMs int // HAProxy's %Tr; negative when the server never answered
	// Count is how many identical responses the event stands for (the Lua
	// companion sends each distinct line once per flush with its count);
	// 0 means 1.
	Count int
	// Retried marks attempts HAProxy retried instead of passing on their
	// answer (its per-server wretr and wredis): each is a request and a
	// 5xx of this server, counted in Stats.Retried too, with no answer
	// time. No per-response path sees them; the stats path reads them.
	// It is Fail FailRetry, kept for the callers that set it.
	Retried bool
	// Fail is the class of a failure that carries no answer of the
	// server's (the stats path reads them from HAProxy's counters): a
	// request and a 5xx of the server, counted by class too, with no
	// answer time. FailAnswer (0) is an answer, judged by its Status.
	Fail Fail
	// Counted marks events the stats path made from HAProxy's counters,
	// as opposed to responses a per-response path (SPOE, Lua, logs)
	// reported: Delivered counts only the latter, so that the agent can
	// tell a telemetry path that has gone silent.
	Counted bool
}

// Fail is a class of failure of a server's that no answer of its own
// carries: HAProxy retried the attempt, answered for the server, or saw
// the server abort. docs/explanation/telemetry.md says where HAProxy
// records each and why it counts.
type Fail uint8

const (
	// FailAnswer is no such failure: the event is an answer, a 5xx or
	// not by its Status.
	FailAnswer Fail = iota
	// FailRetry is an attempt HAProxy retried on this server or
	// redispatched to another (wretr, wredis): the client may never see
	// it, so a policy may weigh it less than a 5xx.
	FailRetry
	// FailProxy is HAProxy's own 502, 503 or 504 on the server's behalf:
	// no answer before timeout server, an answer that is not HTTP, a
	// connection that failed on its last try (eresp less srv_abrt, econ).
	FailProxy
	// FailAbort is a transfer the server aborted (srv_abrt): a reset, for
	// a keep-alive client a connection closed without an answer.
	FailAbort
	// NumFails bounds the classes, for arrays indexed by Fail.
	NumFails
)

// Fails lists the failure classes (not FailAnswer), in order.
var Fails = []Fail{FailRetry, FailProxy, FailAbort}

// String names the class as /status and the docs do.
func (f Fail) String() string {
	switch f {
	case FailAnswer:
		return "answer"
	case FailRetry:
		return "retry"
	case FailProxy:
		return "haproxy-5xx"
	case FailAbort:
		return "abort"
	}
	return fmt.Sprintf("fail(%d)", uint8(f))
}

// class is the event's failure class: Retried is FailRetry, an unknown
// class an answer's.
func (ev *Event) class() Fail {
	switch {
	case ev.Fail > FailAnswer && ev.Fail < NumFails:
		return ev.Fail
	case ev.Retried:
		return FailRetry
	}
	return FailAnswer
}

// Sink takes events. *Store is the sink of the agent; tests use others.
type Sink interface {
	Record(Event)
}

type bucket struct {
	sec      atomic.Int64
	requests atomic.Uint32
	err5xx   atomic.Uint32
	err4xx   atomic.Uint32
	// failed counts the requests of each failure class (FailAnswer's
	// slot unused).
	failed [NumFails]atomic.Uint32
	// used marks the latency bins written this second, so that readers
	// visit those only (a server's answers fall in a few bins of 112).
	// It sits beside the counts, in the cache line a read loads anyway.
	used    [usedWords]atomic.Uint64
	latency [latencyBins]atomic.Uint32
}

const usedWords = (latencyBins + 63) / 64

// addLatency counts n answers in bin i, marking the bin used: a load
// first, so that only its first answer of the second pays the atomic OR.
func (b *bucket) addLatency(i int, n uint32) {
	b.latency[i].Add(n)
	w, bit := &b.used[i>>6], uint64(1)<<(i&63)
	if w.Load()&bit == 0 {
		w.Or(bit)
	}
}

// eachLatency calls f with every used bin and its count.
func (b *bucket) eachLatency(f func(i int, c uint32)) {
	for w := range b.used {
		for set := b.used[w].Load(); set != 0; set &= set - 1 {
			i := w<<6 | bits.TrailingZeros64(set)
			f(i, b.latency[i].Load())
		}
	}
}

// BytesPerSeries is the memory one series takes for a window of span:
// one bucket a second, allocated when the series is first seen.
func BytesPerSeries(span time.Duration) int64 {
	return max(int64(span/time.Second), 1) * int64(unsafe.Sizeof(bucket{}))
}

// Series is the window of one backend/server pair.
type Series struct {
	Backend, Server string
	buckets         []bucket
	// counted is the part of totalReq the stats path made from HAProxy's
	// counters (events marked Counted): Delivered is the rest. Kept on the
	// stats path's few events rather than on every response's.
	counted atomic.Uint64
	// counted5xx is the part of total5xx made so: Delivered5xx is the
	// rest.
	counted5xx atomic.Uint64
	// totalReq and total5xx count every request and 5xx since the series
	// was made, never cleared: a sequential test reads the difference
	// between two reads as the new evidence, each request exactly once,
	// however the reads fall against the one-second buckets.
	totalReq, total5xx atomic.Uint64
	// totalFailed is the part of total5xx of each failure class.
	totalFailed [NumFails]atomic.Uint64
	// totalTail counts every timed answer since the series was made by
	// its slot (TailSlot), never cleared, modulo 2^32: the rules' tail
	// test reads the difference between two reads as the new answers
	// over its threshold, exact while fewer than 2^32 come between them.
	totalTail [TailSlots]atomic.Uint32
	// run is the sum of the buckets that hold a second, kept by the
	// writers and the clears, so that a read of the whole window costs
	// the same whatever its span (see running).
	run running
}

// running is what a series' buckets hold, summed: every write adds to it
// before its bucket, and every clear takes a bucket's counts out with a
// swap and subtracts what it took, so that the sums never drift from the
// buckets', however writers race the clears. Old seconds leave the sums
// when a reader sweeps their buckets (sweep).
type running struct {
	// The fields a read loads come first, in one cache line.
	requests, err5xx, err4xx atomic.Uint64
	failed                   [NumFails]atomic.Uint64
	// used marks the latency bins ever written, so that a read visits
	// those only.
	used [usedWords]atomic.Uint64
	// held is how many buckets hold a second (sec not -1).
	held atomic.Int64
	// newest is the latest second a bucket was claimed for: a read at a
	// clock behind it falls back to summing the buckets.
	newest atomic.Int64
	// swept is the latest second a reader swept to: every bucket of a
	// second at or before swept-span has left the sums.
	swept   atomic.Int64
	latency [latencyBins]atomic.Uint64
}

// addLatency counts n answers in bin i of the running histogram.
func (r *running) addLatency(i int, n uint32) {
	r.latency[i].Add(uint64(n))
	w, bit := &r.used[i>>6], uint64(1)<<(i&63)
	if w.Load()&bit == 0 {
		w.Or(bit)
	}
}

// sub takes v from c: the running sums are unsigned and never fall
// below what the buckets hold, as writers add to them first.
func sub(c *atomic.Uint64, v uint32) {
	if v != 0 {
		c.Add(^uint64(v - 1))
	}
}

type seriesMap map[string]map[string]*Series

// Store holds every series, at most MaxSeries of them.
type Store struct {
	now       func() time.Time
	span      int64
	maxSeries int

	series atomic.Pointer[seriesMap] // read without locks, replaced on insert
	// sorted is the series of one seriesMap in the order reads return
	// them, kept until the map is replaced: the loop reads every series
	// twice a step, and sorting 10,000 names each time was a tenth of it.
	sorted atomic.Pointer[sortedSeries]
	// mu serialises the writers of series (insert, Retain) and guards
	// count; readers never take it.
	mu       sync.Mutex
	count    int
	events   atomic.Uint64
	dropped  atomic.Uint64
	badNames atomic.Uint64
}

// New returns a store with a window of span (whole seconds, at least one)
// and room for maxSeries series. now is the clock; nil means time.Now.
func New(span time.Duration, maxSeries int, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	secs := int64(span / time.Second)
	if secs < 1 {
		secs = 1
	}
	if maxSeries < 1 {
		maxSeries = DefaultMaxSeries
	}
	s := &Store{now: now, span: secs, maxSeries: maxSeries}
	empty := seriesMap{}
	s.series.Store(&empty)
	return s
}

// Span is the length of the window.
func (s *Store) Span() time.Duration { return time.Duration(s.span) * time.Second }

// Record adds one event at the store's current time.
func (s *Store) Record(ev Event) {
	s.RecordAt(s.now().Unix(), ev)
}

// RecordAt adds one event that happened in the given Unix second.
func (s *Store) RecordAt(sec int64, ev Event) {
	n := uint32(1)
	if ev.Count > 1 {
		n = uint32(min(ev.Count, MaxCount))
	}
	if len(ev.Backend) == 0 || len(ev.Backend) > MaxName || len(ev.Server) == 0 || len(ev.Server) > MaxName {
		s.badNames.Add(uint64(n))
		s.dropped.Add(uint64(n))
		return
	}
	sr := s.lookup(ev.Backend, ev.Server)
	if sr == nil {
		s.dropped.Add(uint64(n))
		return
	}
	s.events.Add(uint64(n))
	f := ev.class()
	if ev.Counted {
		sr.counted.Add(uint64(n))
		if f != FailAnswer || ev.Status >= 500 && ev.Status <= 599 {
			sr.counted5xx.Add(uint64(n))
		}
	}
	if f != FailAnswer {
		sr.recordFailed(sec, f, n)
		return
	}
	sr.record(sec, ev.Status, ev.ResponseMs, n)
}

// Delivered is how many responses the per-response paths reported for
// backend/server since its series was made: its requests less those
// recorded Counted. 0 for a server with no series. The figure is exact
// when read by the goroutine that records the Counted events (the stats
// path, which asks between its polls' records); another reader may see a
// Counted event's count before its request, and reads too few, for a
// moment.
func (s *Store) Delivered(backend, server string) uint64 {
	sr, ok := (*s.series.Load())[backend][server]
	if !ok {
		return 0
	}
	counted := sr.counted.Load()
	total := sr.totalReq.Load()
	if counted > total {
		return 0
	}
	return total - counted
}

// Delivered5xx is how many 5xx answers the per-response paths reported
// for backend/server since its series was made: its 5xx less those
// recorded Counted. Exact as Delivered is.
func (s *Store) Delivered5xx(backend, server string) uint64 {
	sr, ok := (*s.series.Load())[backend][server]
	if !ok {
		return 0
	}
	counted, total := sr.counted5xx.Load(), sr.total5xx.Load()
	if counted > total {
		return 0
	}
	return total - counted
}

// MaxCount bounds one event's Count: a bucket's counters are 32 bits.
const MaxCount = 1 << 20

// MaxName bounds a backend's or a server's name, as the runtime client
// does (haproxy.ValidName): an event with a longer or empty name is
// dropped and counted, so names cannot swell the store.
const MaxName = 255

func (s *Store) lookup(backend, server []byte) *Series {
	m := *s.series.Load()
	if srv, ok := m[string(backend)]; ok {
		if sr, ok := srv[string(server)]; ok {
			return sr
		}
	}
	return s.insert(string(backend), string(server))
}

// insert copies the map with the new series in it: inserts are rare (once
// per server for the life of the process), lookups are every event.
func (s *Store) insert(backend, server string) *Series {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.series.Load()
	if sr, ok := old[backend][server]; ok {
		return sr
	}
	if s.count >= s.maxSeries {
		return nil
	}
	next := make(seriesMap, len(old)+1)
	for b, srv := range old {
		next[b] = srv
	}
	srv := make(map[string]*Series, len(old[backend])+1)
	for name, sr := range old[backend] {
		srv[name] = sr
	}
	sr := &Series{Backend: backend, Server: server, buckets: make([]bucket, s.span)}
	for i := range sr.buckets {
		sr.buckets[i].sec.Store(-1)
	}
	sr.run.newest.Store(-1)
	sr.run.swept.Store(-1)
	srv[server] = sr
	next[backend] = srv
	s.count++
	s.series.Store(&next)
	return sr
}

// bucketAt is the bucket of second sec, claimed and cleared by the first
// writer of that second; nil when sec is older than the bucket now in its
// slot, or than the window at the last reader's sweep (outside the window:
// a bucket claimed for it would stay in the running sums until its slot's
// next sweep).
func (sr *Series) bucketAt(sec int64) *bucket {
	n := int64(len(sr.buckets))
	if sec <= sr.run.swept.Load()-n {
		return nil
	}
	b := &sr.buckets[uint64(sec)%uint64(n)]
	if cur := b.sec.Load(); cur != sec {
		if cur > sec {
			return nil
		}
		if b.sec.CompareAndSwap(cur, sec) {
			if cur == -1 {
				sr.run.held.Add(1)
			}
			for {
				newest := sr.run.newest.Load()
				if sec <= newest || sr.run.newest.CompareAndSwap(newest, sec) {
					break
				}
			}
			sr.clear(b)
		}
	}
	return b
}

// clear empties b, taking what it held out of the running sums.
func (sr *Series) clear(b *bucket) {
	r := &sr.run
	sub(&r.requests, b.requests.Swap(0))
	sub(&r.err5xx, b.err5xx.Swap(0))
	sub(&r.err4xx, b.err4xx.Swap(0))
	for f := range b.failed {
		sub(&r.failed[f], b.failed[f].Swap(0))
	}
	for w := range b.used {
		// A writer adds to its bin before it marks it, so a bin whose mark
		// this swap misses keeps its count and its writer's mark to come.
		for set := b.used[w].Swap(0); set != 0; set &= set - 1 {
			i := w<<6 | bits.TrailingZeros64(set)
			sub(&r.latency[i], b.latency[i].Swap(0))
		}
	}
}

// expire takes b, found holding second cur, out of the window.
func (sr *Series) expire(b *bucket, cur int64) {
	if cur != -1 && b.sec.CompareAndSwap(cur, -1) {
		sr.run.held.Add(-1)
		sr.clear(b)
	}
}

// sweep expires the buckets of seconds that have left the window at now:
// each second since the last sweep retires the one slot that second will
// use, so a reader that sweeps every second visits one bucket.
func (sr *Series) sweep(now int64) {
	n := int64(len(sr.buckets))
	from := sr.run.swept.Load()
	if from >= now {
		return
	}
	for t := max(from+1, now-n+1); t <= now; t++ {
		b := &sr.buckets[uint64(t)%uint64(n)]
		switch cur := b.sec.Load(); {
		case cur == -1 && b.requests.Load() != 0:
			// a writer that found its second before a sweep took it
			// out wrote here after: its counts leave the sums too
			sr.clear(b)
		case cur != -1 && cur <= t-n:
			sr.expire(b, cur)
		}
	}
	for from < now && !sr.run.swept.CompareAndSwap(from, now) {
		from = sr.run.swept.Load()
	}
}

// recordFailed counts requests of failure class f: each a request and a
// 5xx, with no answer time.
func (sr *Series) recordFailed(sec int64, f Fail, count uint32) {
	sr.totalReq.Add(uint64(count))
	sr.total5xx.Add(uint64(count))
	sr.totalFailed[f].Add(uint64(count))
	if b := sr.bucketAt(sec); b != nil {
		sr.run.requests.Add(uint64(count))
		sr.run.err5xx.Add(uint64(count))
		sr.run.failed[f].Add(uint64(count))
		b.requests.Add(count)
		b.err5xx.Add(count)
		b.failed[f].Add(count)
	}
}

func (sr *Series) record(sec int64, status, ms int, count uint32) {
	sr.totalReq.Add(uint64(count))
	if ms >= 0 {
		sr.totalTail[TailSlot(ms)].Add(count)
	}
	is5xx := status >= 500 && status <= 599
	if is5xx {
		sr.total5xx.Add(uint64(count))
	}
	b := sr.bucketAt(sec)
	if b == nil {
		return
	}
	// The running sums first: a clear racing this write then never takes
	// out of them more than was put in.
	sr.run.requests.Add(uint64(count))
	b.requests.Add(count)
	switch {
	case is5xx:
		sr.run.err5xx.Add(uint64(count))
		b.err5xx.Add(count)
	case status >= 400 && status <= 499:
		sr.run.err4xx.Add(uint64(count))
		b.err4xx.Add(count)
	}
	if ms >= 0 {
		i := latencyBin(ms)
		sr.run.addLatency(i, count)
		b.addLatency(i, count)
	}
}

// TailSlots is how many ranges of answer time the series' running
// tallies (Stats.TotalTail) hold: under 32 ms, then each quarter of an
// octave (32, 40, 48, 56, 64, 80 ms ...) up to the histogram's top, 2^16
// ms, whose last quarter takes every longer answer too. A quarter octave
// (at most 25% wide) keeps the tail test's threshold, rounded up to a
// slot's floor, within 25% of where it was set, for every server alike.
const TailSlots = 1 + 11*4

// TailSlot is the slot an answer of ms milliseconds is tallied in.
func TailSlot(ms int) int {
	if ms < 32 {
		return 0
	}
	ms = min(ms, maxLatencyMs)
	top := bits.Len(uint(ms)) - 1 // 5..15
	return 1 + (top-5)*4 + (ms>>(top-2))&3
}

// TailSlotFloorMs is the least answer time tallied in slot k (0 for the
// first): every answer of slot k or above is at least that long.
func TailSlotFloorMs(k int) int {
	if k <= 0 {
		return 0
	}
	k = min(k, TailSlots-1) - 1
	top := 5 + k/4
	return 1<<top + (k%4)<<(top-2)
}

func latencyBin(ms int) int {
	if ms < exactBins {
		return ms
	}
	if ms > maxLatencyMs {
		ms = maxLatencyMs
	}
	top := bits.Len(uint(ms)) - 1 // 4..15
	sub := (ms >> (top - 3)) & (subBins - 1)
	return exactBins + (top-4)*subBins + sub
}

// binUpper is the largest millisecond value that falls into bin i.
func binUpper(i int) int {
	if i < exactBins {
		return i
	}
	i -= exactBins
	top := i/subBins + 4
	sub := i % subBins
	lo := (1 << top) + sub<<(top-3)
	return lo + 1<<(top-3) - 1
}

// Stats are one series' figures over a window.
type Stats struct {
	Backend  string `json:"backend"`
	Server   string `json:"server"`
	Requests uint64 `json:"requests"`
	Err5xx   uint64 `json:"err_5xx"`
	Err4xx   uint64 `json:"err_4xx"`
	// Retried is attempts HAProxy retried or redispatched, Proxy5xx
	// HAProxy's own 502/503/504 for the server, Aborted transfers the
	// server aborted: the failure classes (Fail), each in Requests and
	// Err5xx too. Err5xx less the three is the 5xx answers.
	Retried  uint64 `json:"retried,omitempty"`
	Proxy5xx uint64 `json:"proxy_5xx,omitempty"`
	Aborted  uint64 `json:"aborted,omitempty"`
	P50Ms    int    `json:"p50_ms"`
	P95Ms    int    `json:"p95_ms"`
	P99Ms    int    `json:"p99_ms"`
	// Untimed is the part of Requests with no answer time (a failure
	// with no answer): the quantiles are over the others.
	Untimed uint64 `json:"-"`
	// Seconds is how many of the window's one-second buckets hold data.
	Seconds int `json:"seconds"`
	// RatePerSec is requests per second over the seconds that hold data,
	// leaving out the current one (still filling) and the oldest (perhaps
	// begun mid-second): the series' rate even when it is younger than
	// the window. 0 until three seconds hold data.
	RatePerSec float64 `json:"rate_per_sec"`
	// TotalRequests and TotalErr5xx are the series' counts since it was
	// made (summed over the merged stores), whatever the window: the
	// rules' sequential test takes the difference between two reads.
	TotalRequests uint64 `json:"total_requests,omitempty"`
	TotalErr5xx   uint64 `json:"total_err_5xx,omitempty"`
	// TotalFailed is the part of TotalErr5xx of each failure class
	// (FailAnswer's slot: none), for a test that weighs the classes.
	TotalFailed [NumFails]uint64 `json:"-"`
	// TotalTail is the series' timed answers since it was made, by slot
	// of answer time (TailSlot), modulo 2^32 (the difference of two
	// reads, in uint32, is the answers between them), and TotalCounted the part of
	// TotalRequests the stats path made from HAProxy's counters, whose
	// answer time is a mean read out of HAProxy's rtime, not each
	// answer's: the
	// rules' tail test reads both as differences between two reads.
	TotalTail    [TailSlots]uint32 `json:"-"`
	TotalCounted uint64            `json:"-"`
}

// Failed is the window's requests of failure class f: Retried, Proxy5xx
// or Aborted; for FailAnswer, the 5xx answers.
func (st Stats) Failed(f Fail) uint64 {
	switch f {
	case FailRetry:
		return st.Retried
	case FailProxy:
		return st.Proxy5xx
	case FailAbort:
		return st.Aborted
	case FailAnswer:
		return st.Err5xx - min(st.Err5xx, st.Retried+st.Proxy5xx+st.Aborted)
	}
	return 0
}

// addFailed adds n to the window's count of class f.
func (st *Stats) addFailed(f Fail, n uint64) {
	switch f {
	case FailRetry:
		st.Retried += n
	case FailProxy:
		st.Proxy5xx += n
	case FailAbort:
		st.Aborted += n
	}
}

// ErrorRate is the share of requests that ended in 5xx.
func (st Stats) ErrorRate() float64 {
	if st.Requests == 0 {
		return 0
	}
	return float64(st.Err5xx) / float64(st.Requests)
}

// Snapshot sums the last `last` seconds (capped at the store's span, the
// current second included) of every series, sorted by backend then server.
func (s *Store) Snapshot(last time.Duration) []Stats {
	return Merged{s}.Snapshot(last)
}

type sortedSeries struct {
	of     *seriesMap
	series []*Series
}

// inOrder is every series of m, the store's current map, sorted by
// backend then server.
func (s *Store) inOrder(m *seriesMap) []*Series {
	if c := s.sorted.Load(); c != nil && c.of == m {
		return c.series
	}
	var out []*Series
	for _, srv := range *m {
		for _, sr := range srv {
			out = append(out, sr)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Backend != out[j].Backend {
			return out[i].Backend < out[j].Backend
		}
		return out[i].Server < out[j].Server
	})
	s.sorted.Store(&sortedSeries{of: m, series: out})
	return out
}

// Snapshots is Snapshot of two spans at one moment, both over the same
// series in the same order: a single pass, so that each series is
// loaded once for both reads (the loop reads its long and its recent
// window together, twice a step and every second).
func (s *Store) Snapshots(a, b time.Duration) (x, y []Stats) {
	ms := Merged{s}
	sa, sb := ms.secs(a), ms.secs(b)
	now := s.now().Unix()
	all := s.inOrder(s.series.Load())
	x, y = make([]Stats, 0, len(all)), make([]Stats, 0, len(all))
	accA, accB := newAccumulator(sa), newAccumulator(sb)
	for _, sr := range all {
		accA.reset(sr.Backend, sr.Server)
		accA.add(sr, now, true)
		x = append(x, accA.stats())
		accB.reset(sr.Backend, sr.Server)
		accB.add(sr, now, true)
		y = append(y, accB.stats())
	}
	return x, y
}

// secs is the seconds a read of last covers: the first store's span
// when last is under a second or over the span.
func (ms Merged) secs(last time.Duration) int64 {
	secs := int64(last / time.Second)
	if secs < 1 || secs > ms[0].span {
		secs = ms[0].span
	}
	return secs
}

// Merged is several stores read as one: a series' figures are the sums
// of its buckets in every store, its quantiles those of the merged
// histograms. A fleet's agent reads its own store and what its peers
// sent through one.
type Merged []*Store

// Snapshot sums the last `last` seconds (capped at the first store's
// span) of every series in any of the stores, sorted by backend then
// server.
func (ms Merged) Snapshot(last time.Duration) []Stats {
	return ms.SnapshotOf(last, nil)
}

// SnapshotOf is Snapshot of the backends in only (all when nil).
func (ms Merged) SnapshotOf(last time.Duration, only map[string]bool) []Stats {
	if len(ms) == 0 {
		return nil
	}
	secs := ms.secs(last)
	now := ms[0].now().Unix()
	if len(ms) == 1 {
		return ms[0].snapshotOf(secs, now, only)
	}
	maps := make([]seriesMap, len(ms))
	for i, s := range ms {
		maps[i] = *s.series.Load()
	}
	count := 0
	for _, m := range maps {
		for backend, srv := range m {
			if only == nil || only[backend] {
				count += len(srv)
			}
		}
	}
	out := make([]Stats, 0, count)
	acc := newAccumulator(secs) // reused: one series at a time
	for i, m := range maps {
		for backend, srv := range m {
			if only != nil && !only[backend] {
				continue
			}
			for server, sr := range srv {
				if inAny(maps[:i], backend, server) {
					continue // summed with the store it was first found in
				}
				acc.reset(backend, server)
				alone := true
				for _, other := range maps[i+1:] {
					if other[backend][server] != nil {
						alone = false
					}
				}
				acc.add(sr, now, alone)
				for _, other := range maps[i+1:] {
					if o := other[backend][server]; o != nil {
						acc.add(o, now, false)
					}
				}
				out = append(out, acc.stats())
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Backend != out[j].Backend {
			return out[i].Backend < out[j].Backend
		}
		return out[i].Server < out[j].Server
	})
	return out
}

// snapshotOf is SnapshotOf of one store: its series in their kept order,
// with no sort.
func (s *Store) snapshotOf(secs, now int64, only map[string]bool) []Stats {
	all := s.inOrder(s.series.Load())
	n := len(all)
	if only != nil {
		n = 0
		for b := range only {
			n += len((*s.series.Load())[b])
		}
	}
	out := make([]Stats, 0, n)
	acc := newAccumulator(secs)
	for _, sr := range all {
		if only != nil && !only[sr.Backend] {
			continue
		}
		acc.reset(sr.Backend, sr.Server)
		acc.add(sr, now, true)
		out = append(out, acc.stats())
	}
	return out
}

func inAny(maps []seriesMap, backend, server string) bool {
	for _, m := range maps {
		if m[backend][server] != nil {
			return true
		}
	}
	return false
}

// accumulator sums one series' buckets over the last secs seconds, from
// one store or several.
type accumulator struct {
	st    Stats
	secs  int64
	hist  [latencyBins]uint64
	timed uint64
	// perSec[i] is the requests of second now-i; held[i] whether any
	// store has a bucket for it. Filled only where a read visits the
	// buckets (seen): a read of one store's whole window takes its
	// seconds from the running sums instead (held, the current second's
	// and the oldest second's requests in fast).
	perSec []uint64
	held   []bool
	seen   bool
	fast   struct {
		on              bool
		held            int
		current, oldest uint64
	}
	// touched marks the histogram's bins written since the last reset,
	// which clears those only (a series fills a few of 112).
	touched [usedWords]uint64
}

func newAccumulator(secs int64) *accumulator {
	return &accumulator{secs: secs, perSec: make([]uint64, secs), held: make([]bool, secs)}
}

func (a *accumulator) reset(backend, server string) {
	a.st = Stats{Backend: backend, Server: server}
	for w := range a.touched {
		for set := a.touched[w]; set != 0; set &= set - 1 {
			a.hist[w<<6|bits.TrailingZeros64(set)] = 0
		}
		a.touched[w] = 0
	}
	a.timed = 0
	if a.seen {
		clear(a.perSec)
		clear(a.held)
		a.seen = false
	}
	a.fast.on = false
}

// add sums sr's window into the series' figures; alone says no other
// store holds the series, so that its seconds need not be merged.
func (a *accumulator) add(sr *Series, now int64, alone bool) {
	a.st.TotalRequests += sr.totalReq.Load()
	a.st.TotalErr5xx += sr.total5xx.Load()
	for _, f := range Fails {
		a.st.TotalFailed[f] += sr.totalFailed[f].Load()
	}
	for k := range sr.totalTail {
		a.st.TotalTail[k] += sr.totalTail[k].Load()
	}
	a.st.TotalCounted += sr.counted.Load()
	n := int64(len(sr.buckets))
	if a.secs == n {
		sr.sweep(now)
		if sr.run.newest.Load() <= now {
			a.addRunning(sr, now, alone)
			return
		}
	}
	// Visit only the window's buckets, each at its second's slot: a 10 s
	// read of a 60 s ring touches 10 buckets, not 60 (the loop reads both
	// spans of every series every second).
	a.seen = true
	for sec := now - min(a.secs, n) + 1; sec <= now; sec++ {
		b := &sr.buckets[uint64(sec)%uint64(n)]
		if b.sec.Load() != sec {
			continue
		}
		c := uint64(b.requests.Load())
		a.st.Requests += c
		a.perSec[now-sec] += c
		a.held[now-sec] = true
		a.st.Err5xx += uint64(b.err5xx.Load())
		a.st.Err4xx += uint64(b.err4xx.Load())
		for _, f := range Fails {
			a.st.addFailed(f, uint64(b.failed[f].Load()))
		}
		b.eachLatency(func(j int, c uint32) {
			a.hist[j] += uint64(c)
			a.timed += uint64(c)
			a.touched[j>>6] |= 1 << (j & 63)
		})
	}
}

// addRunning is add for a read of sr's whole window, swept to now and
// with no bucket ahead of it: every bucket that holds a second is in the
// window, so the running sums are the window's. Its seconds are found
// without summing: the current one's bucket, and the oldest held one's,
// the first slot from the window's start in a series with traffic every
// second.
func (a *accumulator) addRunning(sr *Series, now int64, alone bool) {
	r := &sr.run
	a.st.Requests += r.requests.Load()
	a.st.Err5xx += r.err5xx.Load()
	a.st.Err4xx += r.err4xx.Load()
	for _, f := range Fails {
		a.st.addFailed(f, r.failed[f].Load())
	}
	for w := range r.used {
		for set := r.used[w].Load(); set != 0; set &= set - 1 {
			j := w<<6 | bits.TrailingZeros64(set)
			c := r.latency[j].Load()
			a.hist[j] += c
			a.timed += c
			a.touched[w] |= set & -set
		}
	}
	n := int64(len(sr.buckets))
	if alone {
		a.fast.on = true
		a.fast.held = int(max(r.held.Load(), 0))
		a.fast.current, a.fast.oldest = 0, 0
		if a.fast.held == 0 {
			return
		}
		if b := &sr.buckets[uint64(now)%uint64(n)]; b.sec.Load() == now {
			a.fast.current = uint64(b.requests.Load())
		}
		for sec := now - n + 1; sec <= now; sec++ {
			if b := &sr.buckets[uint64(sec)%uint64(n)]; b.sec.Load() == sec {
				a.fast.oldest = uint64(b.requests.Load())
				break
			}
		}
		return
	}
	// Merged with another store: the seconds any of them holds.
	a.seen = true
	for sec := now - n + 1; sec <= now; sec++ {
		b := &sr.buckets[uint64(sec)%uint64(n)]
		if b.sec.Load() == sec {
			a.perSec[now-sec] += uint64(b.requests.Load())
			a.held[now-sec] = true
		}
	}
}

func (a *accumulator) stats() Stats {
	st := a.st
	if a.fast.on {
		st.Seconds = a.fast.held
		if st.Seconds >= 3 {
			st.RatePerSec = float64(st.Requests-a.fast.current-a.fast.oldest) / float64(st.Seconds-2)
		}
	} else {
		oldest := -1
		for i, h := range a.held {
			if h {
				st.Seconds++
				oldest = i
			}
		}
		if st.Seconds >= 3 {
			st.RatePerSec = float64(st.Requests-a.perSec[0]-a.perSec[oldest]) / float64(st.Seconds-2)
		}
	}
	st.P50Ms, st.P95Ms, st.P99Ms = quantiles(&a.hist, a.timed)
	st.Untimed = st.Requests - min(st.Requests, a.timed)
	return st
}

// quantiles is quantile at 0.50, 0.95 and 0.99 in one pass over the
// histogram.
func quantiles(hist *[latencyBins]uint64, total uint64) (p50, p95, p99 int) {
	if total == 0 {
		return 0, 0, 0
	}
	var ranks [3]uint64
	for k, q := range [3]float64{0.50, 0.95, 0.99} {
		ranks[k] = max(uint64(q*float64(total)+0.5), 1)
	}
	var out [3]int
	k := 0
	var seen uint64
	for i, c := range hist {
		seen += c
		for k < 3 && seen >= ranks[k] {
			out[k] = binUpper(i)
			k++
		}
		if k == 3 {
			break
		}
	}
	for ; k < 3; k++ {
		out[k] = binUpper(latencyBins - 1)
	}
	return out[0], out[1], out[2]
}

// quantile returns the upper bound of the bin holding the q-th sample, so a
// reported p99 is never below the true one by more than a bin's width.
func quantile(hist *[latencyBins]uint64, total uint64, q float64) int {
	if total == 0 {
		return 0
	}
	rank := uint64(q*float64(total) + 0.5)
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, c := range hist {
		seen += c
		if seen >= rank {
			return binUpper(i)
		}
	}
	return binUpper(latencyBins - 1)
}

// Forget clears a series' history: after a drained server is re-admitted
// its pre-drain errors describe a fault that is gone, and must not count
// against it. Writers racing the clear may lose a few counts.
func (s *Store) Forget(backend, server string) {
	sr := (*s.series.Load())[backend][server]
	if sr == nil {
		return
	}
	for i := range sr.buckets {
		b := &sr.buckets[i]
		if cur := b.sec.Load(); cur == -1 {
			sr.clear(b)
		} else {
			sr.expire(b, cur)
		}
	}
}

// Retain drops every series keep rejects, and returns how many went. The
// loop keeps the servers HAProxy reports each step, so that names that
// only ever arrive in events (a typo, or a flood of made-up ones) cannot
// fill the store for good and shut the real servers out.
func (s *Store) Retain(keep func(backend, server string) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := *s.series.Load()
	gone := 0
	for b, srv := range old {
		for name := range srv {
			if !keep(b, name) {
				gone++
			}
		}
	}
	if gone == 0 {
		return 0
	}
	next := make(seriesMap, len(old))
	for b, srv := range old {
		kept := make(map[string]*Series, len(srv))
		for name, sr := range srv {
			if keep(b, name) {
				kept[name] = sr
			}
		}
		if len(kept) > 0 {
			next[b] = kept
		}
	}
	s.count -= gone
	s.series.Store(&next)
	return gone
}

// BadNames is how many events were dropped for an empty or overlong name.
func (s *Store) BadNames() uint64 { return s.badNames.Load() }

// Events is how many events were recorded; Dropped how many found no room.
func (s *Store) Events() uint64  { return s.events.Load() }
func (s *Store) Dropped() uint64 { return s.dropped.Load() }

// Len is the number of series held.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// Seconds is one series' last seconds, oldest first, for the live page's
// sparklines: requests, 5xx and the p99 of each second (0 with no timed
// answer).
type Seconds struct {
	Backend  string   `json:"backend"`
	Server   string   `json:"server"`
	Requests []uint32 `json:"requests"`
	Err5xx   []uint32 `json:"err_5xx"`
	P99Ms    []int    `json:"p99_ms"`
}

// PerSecond returns every series' last n seconds (at most the span), the
// current one last, sorted by backend then server.
func (s *Store) PerSecond(n int) []Seconds {
	n = min(max(n, 1), int(s.span))
	now := s.now().Unix()
	m := *s.series.Load()
	out := make([]Seconds, 0, len(m))
	var hist [latencyBins]uint64
	for _, srv := range m {
		for _, sr := range srv {
			ps := Seconds{Backend: sr.Backend, Server: sr.Server, Requests: make([]uint32, n), Err5xx: make([]uint32, n), P99Ms: make([]int, n)}
			for i := 0; i < n; i++ {
				sec := now - int64(n-1-i)
				b := &sr.buckets[uint64(sec)%uint64(len(sr.buckets))]
				if b.sec.Load() != sec {
					continue
				}
				ps.Requests[i], ps.Err5xx[i] = b.requests.Load(), b.err5xx.Load()
				var timed uint64
				hist = [latencyBins]uint64{}
				b.eachLatency(func(j int, c uint32) {
					hist[j], timed = uint64(c), timed+uint64(c)
				})
				ps.P99Ms[i] = quantile(&hist, timed, 0.99)
			}
			out = append(out, ps)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Backend != out[j].Backend {
			return out[i].Backend < out[j].Backend
		}
		return out[i].Server < out[j].Server
	})
	return out
}

// Figures are the store's counters, for /metrics and /status.
func (s *Store) Figures() []promtext.Figure {
	return []promtext.Figure{
		{Metric: "hapilot_window_series", Help: "Backend/server series held.", Gauge: true, V: uint64(s.Len())},
		{Metric: "hapilot_window_bad_names_total", Help: "Events dropped for an empty name or one over 255 bytes.", V: s.BadNames()},
		{Metric: "hapilot_window_dropped_events_total", Help: "Events dropped because max-servers series were held.", V: s.Dropped()},
	}
}
