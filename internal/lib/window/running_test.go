package window

import (
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// naive is a read as the window was read before it kept running sums:
// every bucket of the last secs seconds summed, every latency bin
// visited, each quantile found on its own.
func naive(ms Merged, secs int64) []Stats {
	now := ms[0].now().Unix()
	type key struct{ b, s string }
	acc := map[key]*struct {
		st     Stats
		hist   [latencyBins]uint64
		timed  uint64
		perSec []uint64
		held   []bool
	}{}
	var order []key
	for _, s := range ms {
		for b, srv := range *s.series.Load() {
			for name, sr := range srv {
				k := key{b, name}
				a := acc[k]
				if a == nil {
					a = &struct {
						st     Stats
						hist   [latencyBins]uint64
						timed  uint64
						perSec []uint64
						held   []bool
					}{st: Stats{Backend: b, Server: name}, perSec: make([]uint64, secs), held: make([]bool, secs)}
					acc[k] = a
					order = append(order, k)
				}
				a.st.TotalRequests += sr.totalReq.Load()
				a.st.TotalErr5xx += sr.total5xx.Load()
				for _, f := range Fails {
					a.st.TotalFailed[f] += sr.totalFailed[f].Load()
				}
				for k := range sr.totalTail {
					a.st.TotalTail[k] += sr.totalTail[k].Load()
				}
				a.st.TotalCounted += sr.counted.Load()
				for sec := now - secs + 1; sec <= now; sec++ {
					bk := &sr.buckets[uint64(sec)%uint64(len(sr.buckets))]
					if bk.sec.Load() != sec {
						continue
					}
					c := uint64(bk.requests.Load())
					a.st.Requests += c
					a.st.Err5xx += uint64(bk.err5xx.Load())
					a.st.Err4xx += uint64(bk.err4xx.Load())
					for _, f := range Fails {
						a.st.addFailed(f, uint64(bk.failed[f].Load()))
					}
					a.perSec[now-sec] += c
					a.held[now-sec] = true
					for j := range bk.latency {
						a.hist[j] += uint64(bk.latency[j].Load())
						a.timed += uint64(bk.latency[j].Load())
					}
				}
			}
		}
	}
	out := make([]Stats, 0, len(order))
	for _, k := range order {
		a := acc[k]
		st := a.st
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
		st.P50Ms = quantile(&a.hist, a.timed, 0.50)
		st.P95Ms = quantile(&a.hist, a.timed, 0.95)
		st.P99Ms = quantile(&a.hist, a.timed, 0.99)
		st.Untimed = st.Requests - min(st.Requests, a.timed)
		out = append(out, st)
	}
	sortStats(out)
	return out
}

func sortStats(st []Stats) {
	for i := 1; i < len(st); i++ { // insertion sort: a handful of series
		for j := i; j > 0 && (st[j].Backend < st[j-1].Backend || st[j].Backend == st[j-1].Backend && st[j].Server < st[j-1].Server); j-- {
			st[j], st[j-1] = st[j-1], st[j]
		}
	}
}

// bucketSums is what the buckets of sr hold, summed whatever their
// second: the running sums must equal it after any mix of writes,
// expiries and forgets.
func bucketSums(sr *Series) (req, e5, e4, retried uint64, held int64, lat [latencyBins]uint64) {
	for i := range sr.buckets {
		b := &sr.buckets[i]
		req += uint64(b.requests.Load())
		e5 += uint64(b.err5xx.Load())
		e4 += uint64(b.err4xx.Load())
		retried += uint64(b.failed[FailRetry].Load())
		if b.sec.Load() != -1 {
			held++
		}
		for j := range b.latency {
			lat[j] += uint64(b.latency[j].Load())
		}
	}
	return
}

// The running sums give what summing the buckets gives, read after read,
// under random writes (late ones, ones ahead of the clock, retried ones,
// a peer's seconds), clock jumps past the window, and forgets.
func TestRunningSumsEqualANaiveResum(t *testing.T) {
	tests := []struct {
		name      string
		span      time.Duration
		stores    int     // read merged when more than one
		lateSecs  int     // how far back a write may land
		aheadSecs int     // how far ahead of the clock
		gap       float64 // chance a second has no traffic at all
		jump      float64 // chance the clock jumps past the window
		forget    float64 // chance a series is forgotten after a step
	}{
		{name: "steady", span: time.Minute, stores: 1},
		{name: "sparse", span: time.Minute, stores: 1, gap: 0.7},
		{name: "late writes", span: 10 * time.Second, stores: 1, lateSecs: 15},
		{name: "writes ahead of the clock", span: 10 * time.Second, stores: 1, aheadSecs: 2},
		{name: "jumps and forgets", span: 10 * time.Second, stores: 1, gap: 0.3, jump: 0.05, forget: 0.05},
		{name: "merged stores", span: 10 * time.Second, stores: 2, lateSecs: 3, gap: 0.3},
		{name: "everything", span: 5 * time.Second, stores: 2, lateSecs: 8, aheadSecs: 1, gap: 0.4, jump: 0.03, forget: 0.03},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(tc.name))))
			clk := &fakeClock{t: time.Unix(100000, 0)}
			stores := make(Merged, tc.stores)
			for i := range stores {
				stores[i] = New(tc.span, 16, clk.Now)
			}
			servers := []string{"a", "b", "c"}
			secs := int64(tc.span / time.Second)
			for step := range 400 {
				if rng.Float64() < tc.jump {
					clk.t = clk.t.Add(tc.span + time.Duration(rng.IntN(3))*time.Second)
				} else {
					clk.t = clk.t.Add(time.Duration(rng.IntN(3)) * time.Second)
				}
				now := clk.t.Unix()
				for range rng.IntN(20) {
					if rng.Float64() < tc.gap {
						continue
					}
					s := stores[rng.IntN(len(stores))]
					sec := now - int64(rng.IntN(tc.lateSecs+1)) + int64(rng.IntN(tc.aheadSecs+1))
					e := ev("be", servers[rng.IntN(len(servers))], []int{200, 200, 200, 404, 503}[rng.IntN(5)], rng.IntN(3000)-1)
					e.Count = 1 + rng.IntN(4)
					switch rng.IntN(10) {
					case 0:
						e.Retried = true
						s.RecordAt(sec, e)
					case 1:
						err := s.Add("be", string(e.Server), Second{Ago: uint8(rng.IntN(int(secs))), Requests: 3, Err5xx: 1, Latency: []Bin{{Index: uint8(rng.IntN(latencyBins)), Count: 2}}})
						if err != nil {
							t.Fatal(err)
						}
					default:
						s.RecordAt(sec, e)
					}
				}
				for _, last := range []time.Duration{0, tc.span / 2} {
					got, want := stores.Snapshot(last), naive(stores, int64(max(last, tc.span/2)/time.Second))
					if last == 0 {
						want = naive(stores, secs)
					}
					if !reflect.DeepEqual(got, want) {
						t.Fatalf("step %d, last %v:\n got %+v\nwant %+v", step, last, got, want)
					}
				}
				if len(stores) == 1 {
					// both spans in one pass give the two reads'
					x, y := stores[0].Snapshots(0, tc.span/2)
					if wx, wy := naive(stores, secs), naive(stores, secs/2); !reflect.DeepEqual(x, wx) || !reflect.DeepEqual(y, wy) {
						t.Fatalf("step %d: Snapshots\n got %+v\n     %+v\nwant %+v\n     %+v", step, x, y, wx, wy)
					}
				}
				for _, s := range stores {
					for _, srv := range *s.series.Load() {
						for _, sr := range srv {
							req, e5, e4, retried, held, lat := bucketSums(sr)
							r := &sr.run
							var run [latencyBins]uint64
							for j := range run {
								run[j] = r.latency[j].Load()
							}
							if req != r.requests.Load() || e5 != r.err5xx.Load() || e4 != r.err4xx.Load() || retried != r.failed[FailRetry].Load() || held != r.held.Load() || lat != run {
								t.Fatalf("step %d %s: buckets hold %d %d %d %d in %d, running sums %d %d %d %d in %d", step, sr.Server,
									req, e5, e4, retried, held, r.requests.Load(), r.err5xx.Load(), r.err4xx.Load(), r.failed[FailRetry].Load(), r.held.Load())
							}
						}
					}
				}
				if rng.Float64() < tc.forget {
					stores[rng.IntN(len(stores))].Forget("be", servers[rng.IntN(len(servers))])
				}
			}
		})
	}
}

// Writers racing the clears of new seconds, a reader's sweeps and
// forgets may lose counts (as the package says), but never leave the
// running sums apart from the buckets: once they stop, the two agree.
func TestRunningSumsDoNotDriftUnderRaces(t *testing.T) {
	var now atomic.Int64
	now.Store(5000)
	s := New(5*time.Second, 4, func() time.Time { return time.Unix(now.Load(), 0) })
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() { // owned by the test: stops when stop closes
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				e := ev("be", []string{"a", "b"}[rng.IntN(2)], []int{200, 404, 503}[rng.IntN(3)], rng.IntN(200))
				e.Retried = rng.IntN(10) == 0
				s.RecordAt(now.Load()-int64(rng.IntN(7)), e)
			}
		}()
	}
	for i := range 3000 {
		if i%10 == 0 {
			now.Add(int64(1 + i%3))
		}
		s.Snapshot(0)
		if i%500 == 0 {
			s.Forget("be", "a")
		}
	}
	close(stop)
	wg.Wait()
	s.Snapshot(0) // a last sweep, with no writer left
	for _, srv := range *s.series.Load() {
		for _, sr := range srv {
			req, e5, e4, retried, held, lat := bucketSums(sr)
			r := &sr.run
			var run [latencyBins]uint64
			for j := range run {
				run[j] = r.latency[j].Load()
			}
			if req != r.requests.Load() || e5 != r.err5xx.Load() || e4 != r.err4xx.Load() || retried != r.failed[FailRetry].Load() || held != r.held.Load() || lat != run {
				t.Fatalf("%s: buckets hold %d %d %d %d in %d, running sums %d %d %d %d in %d", sr.Server,
					req, e5, e4, retried, held, r.requests.Load(), r.err5xx.Load(), r.err4xx.Load(), r.failed[FailRetry].Load(), r.held.Load())
			}
		}
	}
}
