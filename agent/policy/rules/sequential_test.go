package rules

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// poissonDraw draws a Poisson count by inversion (small means) or the
// normal approximation.
func poissonDraw(rng *rand.Rand, mean float64) uint64 {
	if mean >= 12 {
		return uint64(max(0, math.Round(mean+math.Sqrt(mean)*rng.NormFloat64())))
	}
	u, p := rng.Float64(), math.Exp(-mean)
	k, cdf := uint64(0), p
	for u > cdf && k < 500 {
		k++
		p *= mean / float64(k)
		cdf += p
	}
	return k
}

// errorsOf draws the 5xx among n requests at rate p.
func errorsOf(rng *rand.Rand, n uint64, p float64) uint64 {
	if p < 0.05 {
		return min(poissonDraw(rng, float64(n)*p), n)
	}
	var x uint64
	for range n {
		if rng.Float64() < p {
			x++
		}
	}
	return x
}

// phase is a stretch of seconds at given error rates (and extra errors
// in given seconds, a burst).
type phase struct {
	secs  int
	rates []float64
	burst map[int]uint64 // server -> errors added in the phase's first second
}

// noneCondemned fails the test for each server runPhases found
// condemned, before the last phase or after its start (`after` names it).
func noneCondemned(t *testing.T, seed uint64, first, early []int, after string) {
	t.Helper()
	if len(early) > 0 {
		t.Errorf("seed %d: %v condemned", seed, early)
	}
	for i, at := range first {
		if at >= 0 {
			t.Errorf("seed %d: server %d condemned %d s after %s", seed, i, at, after)
		}
	}
}

// runPhases drives one backend's test with per-second counts and returns,
// per server, the first second (from the start of the last phase) it was
// condemned, -1 if never; and whether any was condemned before the last
// phase.
func runPhases(t *testing.T, cfg Config, rate float64, phases []phase, seed uint64) (first []int, early []int) {
	t.Helper()
	return runPhasesOn(t, NewSequential(cfg), rate, phases, seed)
}

// runPhasesOn is runPhases on a test the caller made.
func runPhasesOn(t *testing.T, q *Sequential, rate float64, phases []phase, seed uint64) (first []int, early []int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 7))
	n := len(phases[0].rates)
	srv, in, serving := backendOf(n)
	first = make([]int, n)
	for i := range first {
		first[i] = -1
	}
	var idx []int
	for pi, ph := range phases {
		last := pi == len(phases)-1
		for s := range ph.secs {
			for i := range n {
				req := poissonDraw(rng, rate)
				x := errorsOf(rng, req, ph.rates[i])
				if s == 0 {
					x += ph.burst[i]
					req += ph.burst[i]
				}
				in[i] = Counts{N: req, X: x}
			}
			idx = q.Step(1, srv, in, serving, idx)
			for _, i := range idx {
				if !last {
					early = append(early, i)
				} else if first[i] < 0 {
					first[i] = s + 1
				}
			}
		}
	}
	return first, early
}

// backendOf is a backend of n new servers, all serving, and a buffer for
// each check's counts.
func backendOf(n int) (srv []*SeqServer, in []Counts, serving []bool) {
	srv, in, serving = make([]*SeqServer, n), make([]Counts, n), make([]bool, n)
	for i := range srv {
		srv[i], serving[i] = &SeqServer{}, true
	}
	return srv, in, serving
}

func rates(n int, p float64, set map[int]float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = p
		if v, ok := set[i]; ok {
			out[i] = v
		}
	}
	return out
}

// TestSequential: what the test condemns, and how soon, after two hours
// of steady healthy traffic (each row several seeds).
func TestSequential(t *testing.T) {
	const warm = 7200
	tests := []struct {
		name string
		rate float64
		n    int
		last phase
		// want: the servers condemned in the last phase, each within
		// seconds of its start; everyone else never.
		want   map[int]bool
		within int
		always bool // the last phase's rates in the steady one too
	}{
		{name: "5% among 9 at 33 req/s, mid-stream", rate: 33, n: 9,
			last: phase{secs: 120, rates: rates(9, 0.002, map[int]float64{4: 0.05})}, want: map[int]bool{4: true}, within: 25},
		{name: "5% among 3 at 5 req/s", rate: 5, n: 3,
			last: phase{secs: 300, rates: rates(3, 0.002, map[int]float64{0: 0.05})}, want: map[int]bool{0: true}, within: 240},
		{name: "two servers: the faulty one", rate: 33, n: 2,
			last: phase{secs: 120, rates: rates(2, 0.002, map[int]float64{1: 0.05})}, want: map[int]bool{1: true}, within: 20},
		{name: "a second fault does not hide the first", rate: 33, n: 9,
			last: phase{secs: 120, rates: rates(9, 0.002, map[int]float64{2: 0.05, 6: 0.05})}, want: map[int]bool{2: true, 6: true}, within: 25},
		// The 5% server is the median of the three: it is compared with
		// the third once its 20% peer is shown above the healthy region
		// of that median and left out (peerCheck), 33 and 71 s after the
		// onset in two of the seeds.
		{name: "two of three faulty: both", rate: 33, n: 3,
			last: phase{secs: 240, rates: rates(3, 0.002, map[int]float64{0: 0.05, 1: 0.2})}, want: map[int]bool{0: true, 1: true}, within: 120},
		// Two of three failing alike are the backend's median, as the
		// regions define it: neither is condemned against the third.
		{name: "two of three failing alike: nobody", rate: 33, n: 3,
			last: phase{secs: 600, rates: rates(3, 0.002, map[int]float64{0: 0.05, 1: 0.05})}},
		{name: "fleet-wide 5%: nobody", rate: 33, n: 9,
			last: phase{secs: 600, rates: rates(9, 0.05, nil)}},
		{name: "fleet-wide 20%, two servers: nobody", rate: 33, n: 2,
			last: phase{secs: 600, rates: rates(2, 0.2, nil)}},
		{name: "one burst of 10 errors: nobody", rate: 33, n: 9,
			last: phase{secs: 600, rates: rates(9, 0.002, nil), burst: map[int]uint64{3: 10}}},
		{name: "a healthy server at 2x the median: not degraded", rate: 300, n: 9,
			last: phase{secs: 3600, rates: rates(9, 0.002, map[int]float64{5: 0.004})}},
		{name: "a server always at 2x the median", rate: 300, n: 9, always: true,
			last: phase{secs: 3600, rates: rates(9, 0.002, map[int]float64{5: 0.004})}},
		{name: "fleet-wide 5% at 5 req/s: nobody", rate: 5, n: 9,
			last: phase{secs: 1800, rates: rates(9, 0.05, nil)}},
		{name: "fleet-wide 20% at 300 req/s: nobody", rate: 300, n: 3,
			last: phase{secs: 600, rates: rates(3, 0.2, nil)}},
		{name: "one burst of 10 errors at 300 req/s: nobody", rate: 300, n: 9,
			last: phase{secs: 600, rates: rates(9, 0.002, nil), burst: map[int]uint64{3: 10}}},
		{name: "20% at 300 req/s: far above a burst, a window after its onset", rate: 300, n: 9,
			last: phase{secs: 60, rates: rates(9, 0.002, map[int]float64{7: 0.2})}, want: map[int]bool{7: true}, within: 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for seed := range uint64(3) {
				steady := phase{secs: warm, rates: rates(tt.n, 0.002, nil)}
				if tt.always {
					steady.rates = tt.last.rates
				}
				first, early := runPhases(t, DefaultConfig(), tt.rate, []phase{steady, tt.last}, seed)
				if len(early) > 0 {
					t.Fatalf("seed %d: healthy servers %v condemned in the steady phase", seed, early)
				}
				for i, at := range first {
					switch {
					case tt.want[i] && (at < 0 || at > tt.within):
						t.Errorf("seed %d: server %d condemned at %d s, want within %d s", seed, i, at, tt.within)
					case !tt.want[i] && at >= 0:
						t.Errorf("seed %d: healthy server %d condemned at %d s", seed, i, at)
					}
				}
			}
		})
	}
}

// TestSequentialWithoutHistory: a fault there from the first second (the
// benchmark's) is found before any baseline is learned.
func TestSequentialWithoutHistory(t *testing.T) {
	for _, n := range []int{3, 9} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			first, _ := runPhases(t, DefaultConfig(), 33, []phase{{secs: 60, rates: rates(n, 0.002, map[int]float64{0: 0.05})}}, 1)
			if first[0] < 0 || first[0] > 30 {
				t.Errorf("faulty server condemned at %d s, want within 30 s", first[0])
			}
			for i, at := range first[1:] {
				if at >= 0 {
					t.Errorf("healthy server %d condemned", i+1)
				}
			}
		})
	}
}

// TestMinimumDuration: a burst of errors shorter than MinDuration never
// drains, whatever its size and however it is spread, at any traffic;
// and a fault far above any burst is found about a window after its
// onset, not held to its size.
func TestMinimumDuration(t *testing.T) {
	if underRace {
		t.Skip("72 cells of an hour each, one goroutine: ten times slower under -race (make unit runs it without -race)")
	}
	cfg := DefaultConfig()
	for _, rate := range []float64{1, 5, 33, 300} {
		for _, size := range []uint64{3, 10, 17, 30, 100, 1000} {
			for _, spread := range []int{1, 3, 5} { // seconds it touches
				t.Run(fmt.Sprintf("%g req/s, %d errors over %d s", rate, size, spread), func(t *testing.T) {
					for seed := range uint64(3) {
						phases := []phase{{secs: 3600, rates: rates(9, 0.002, nil)}}
						// spread-1 whole seconds and a share of the next, as
						// a burst that starts mid-check does
						per := size / uint64(spread)
						for k := range spread {
							n := per
							if k == spread-1 {
								n = size - per*uint64(spread-1)
							}
							phases = append(phases, phase{secs: 1, rates: rates(9, 0.002, nil), burst: map[int]uint64{2: n}})
						}
						phases = append(phases, phase{secs: 600, rates: rates(9, 0.002, nil)})
						first, early := runPhases(t, cfg, rate, phases, seed)
						noneCondemned(t, seed, first, early, "the burst")
					}
				})
			}
		}
	}
	// Far above a burst: 20% at 300 req/s is found about a window after
	// its onset (MinDuration plus a chunk), never sooner.
	w := int(cfg.MinDuration.Seconds())
	for seed := range uint64(3) {
		first, early := runPhases(t, cfg, 300, []phase{{secs: 3600, rates: rates(9, 0.002, nil)},
			{secs: 60, rates: rates(9, 0.002, map[int]float64{0: 0.2})}}, seed)
		if len(early) > 0 || first[0] <= w || first[0] > w+3 {
			t.Errorf("seed %d: 20%% at 300 req/s condemned at %d s (early %v), want within (%d, %d] s", seed, first[0], early, w, w+3)
		}
	}
}

// TestBurstAfterHealthyErrors: a burst shorter than the minimum duration
// that touches every one of its window's W checks is forgiven even when a
// few healthy errors came in the seconds before it, lifting a window
// over the credit already. Before, the minimum duration was a budget of W
// checks cut in an episode: the healthy errors' check spent one, the
// burst's last check counted in full: the soak's `--bursts 3:30-50
// --burst-spread 5` at 33 req/s (bursts of 30-50 errors spread over 5 s)
// drained 31 healthy servers per 1,000 server-days, 8 since (two bursts
// that overlap).
func TestBurstAfterHealthyErrors(t *testing.T) {
	cfg := DefaultConfig()
	w := cfg.window() // the checks a burst shorter than MinDuration touches
	healthy := rates(9, 0.002, nil)
	for _, rate := range []float64{5, 33, 300} {
		for _, before := range [][]int{{1}, {4, 2, 1}, {5, 4, 2, 1}} { // seconds before the burst with an extra error
			for _, size := range []uint64{20, 50, 200} {
				t.Run(fmt.Sprintf("%g req/s, errors %v s before, %d errors over %d checks", rate, before, size, w), func(t *testing.T) {
					for seed := range uint64(3) {
						phases := []phase{{secs: 3600, rates: healthy}}
						for sec := -6; sec < 0; sec++ {
							var x uint64
							if slices.Contains(before, -sec) {
								x = 1
							}
							phases = append(phases, phase{secs: 1, rates: healthy, burst: map[int]uint64{2: x}})
						}
						for k := range w {
							phases = append(phases, phase{secs: 1, rates: healthy, burst: map[int]uint64{2: share(size, k, w)}})
						}
						phases = append(phases, phase{secs: 600, rates: healthy})
						first, early := runPhases(t, cfg, rate, phases, seed)
						if len(early) > 0 {
							t.Fatalf("seed %d: %v condemned", seed, early)
						}
						if first[2] >= 0 {
							t.Errorf("seed %d: condemned %d s after the burst", seed, first[2])
						}
					}
				})
			}
		}
	}
}

// TestBurstPairAfterHealthyErrors: a few healthy errors in the seconds
// before a burst lift the smallest alternative's window over the credit,
// a burst of the episode to the test; a burst follows, then a second one
// after a quiet gap of a few seconds. Both bursts are forgiven: a burst
// of the episode whose cut never kept the statistic from h (the healthy
// errors') gives its place to the next one, so that an episode's two
// bursts are the two the cut forgave. Before, the healthy errors and the
// first burst were the episode's two, and the second burst counted in
// full for the smallest alternative: the soak's bursts of 40-50 errors
// spread over 5 s every hour at 33 req/s drained such servers (t=8135 of
// seed 603 in `hapilot-bench soak --servers 9 --rate 33 --bursts 1:40-50
// --burst-spread 5 --seeds 601-620`).
func TestBurstPairAfterHealthyErrors(t *testing.T) {
	cfg := DefaultConfig()
	w := cfg.window() // the checks a burst shorter than MinDuration touches
	healthy := rates(9, 0.002, nil)
	for _, rate := range []float64{33, 100} {
		for _, gap := range []int{8, 11} { // quiet checks between the bursts
			for _, size := range []uint64{30, 45} {
				t.Run(fmt.Sprintf("%g req/s, %d errors twice, %d checks apart", rate, size, gap), func(t *testing.T) {
					for seed := range uint64(4) {
						phases := []phase{{secs: 3600, rates: healthy}}
						for sec := -9; sec < 0; sec++ {
							var x uint64
							if slices.Contains([]int{9, 6, 5, 4}, -sec) {
								x = 1
							}
							phases = append(phases, phase{secs: 1, rates: healthy, burst: map[int]uint64{2: x}})
						}
						for range 2 {
							for k := range w {
								phases = append(phases, phase{secs: 1, rates: healthy, burst: map[int]uint64{2: share(size, k, w)}})
							}
							phases = append(phases, phase{secs: gap, rates: rates(9, 0.002, map[int]float64{2: 0})})
						}
						phases = append(phases, phase{secs: 600, rates: healthy})
						first, early := runPhases(t, cfg, rate, phases, seed)
						noneCondemned(t, seed, first, early, "the bursts")
					}
				})
			}
		}
	}
}

// TestTwoBurstsSecondsApart: two bursts shorter than the minimum
// duration, with a quiet gap of a few seconds between them (Poisson
// bursts an hour apart make such a pair every few hundred), are each
// forgiven, at any size, gap and traffic; errors that go on without a
// gap for longer than the minimum duration are a fault and are found.
// Before, once the window slid past the first burst, the second counted
// in full: the soak's bursts of 45 errors an hour apart drained 31
// healthy servers per 1,000 server-days.
func TestTwoBurstsSecondsApart(t *testing.T) {
	if underRace {
		t.Skip("45 cells of two hours each, one goroutine: ten times slower under -race (make unit runs it without -race)")
	}
	cfg := DefaultConfig()
	quiet := rates(9, 0.0005, nil)
	for _, rate := range []float64{5, 33, 300} {
		for _, size := range []uint64{20, 45, 200} {
			for _, gap := range []int{2, 3, 4, 5, 10} {
				t.Run(fmt.Sprintf("%g req/s, %d errors twice, %d s apart", rate, size, gap), func(t *testing.T) {
					for seed := range uint64(3) {
						// Two hours first, so that the baseline is learned
						// (after the warm-up, 17 minutes late). Each burst
						// straddles two checks: the first mostly in its
						// first, the second in both (as in the soak).
						phases := []phase{{secs: 7200, rates: quiet},
							{secs: 1, rates: quiet, burst: map[int]uint64{2: size * 9 / 10}},
							{secs: 1, rates: quiet, burst: map[int]uint64{2: size - size*9/10}},
							{secs: gap, rates: quiet},
							{secs: 1, rates: quiet, burst: map[int]uint64{2: size * 7 / 10}},
							{secs: 1, rates: quiet, burst: map[int]uint64{2: size - size*7/10}}}
						phases = append(phases, phase{secs: 600, rates: quiet})
						first, early := runPhases(t, cfg, rate, phases, seed)
						noneCondemned(t, seed, first, early, "the second burst")
					}
				})
			}
		}
	}
	// An outage of twice the minimum duration (every request to the
	// server fails, as a refused connection's retries report it) is found
	// before it ends.
	d := int(2 * cfg.MinDuration.Seconds())
	for _, rate := range []float64{5, 33, 300} {
		for seed := range uint64(3) {
			first, early := runPhases(t, cfg, rate, []phase{{secs: 3600, rates: quiet},
				{secs: d, rates: rates(9, 0.0005, map[int]float64{2: 1})}}, seed)
			if len(early) > 0 || first[2] < 0 {
				t.Errorf("%g req/s, seed %d: an outage of %d s not found (found at %d s, early %v)", rate, seed, d, first[2], early)
			}
		}
	}
}

// TestOverlappingBurstsOnABurstyServer: two bursts shorter than the
// minimum duration that overlap, or follow each other with fewer quiet
// checks between them than make two bursts, are one event longer than
// the minimum duration. On a server that had a burst forgiven in the
// hour before, or whose peer had, they are forgiven: it is the service
// that makes bursts. On a backend that had none, they are a fault by the
// minimum duration, and those that bring h beyond their best window are
// found. Before (the same rule for both), the soak's random fleets
// drained 1.66-4.30 healthy servers per 1,000 server-days on three sets
// of seeds, such pairs nearly all; 0-0.47 since. Before the backend's
// memory (a peer's burst), the soak's bursts of 20-60 errors spread over
// 4 s every hour drained 2.28 per 1,000, half in a day's first hour.
func TestOverlappingBurstsOnABurstyServer(t *testing.T) {
	if underRace {
		t.Skip("36 cells of two hours, two histories, one goroutine: ten times slower under -race (make unit runs it without -race)")
	}
	w := DefaultConfig().window() // the checks a burst shorter than MinDuration touches
	// burst adds size errors evenly over w checks from check at
	burst := func(x map[int]uint64, at int, size uint64) {
		for j := range w {
			x[at+j] += share(size, j, w)
		}
	}
	// condemned runs six servers at rate, 0.2% each, for two hours and
	// ten minutes with server 2's extra errors (and server 4's, peer),
	// and says whether server 2 was condemned before check from and after
	// it (none other may be).
	condemned := func(seed uint64, rate float64, extra, peer map[int]uint64, from int) (before, after bool) {
		rng := rand.New(rand.NewPCG(seed, 5))
		q := NewSequential(DefaultConfig())
		srv, in, serving := backendOf(6)
		var idx []int
		for sec := range 7800 {
			for i := range in {
				r := poissonDraw(rng, rate)
				in[i] = Counts{N: r, X: errorsOf(rng, r, 0.002)}
			}
			in[2].N += extra[sec]
			in[2].X += extra[sec]
			in[4].N += peer[sec]
			in[4].X += peer[sec]
			idx = q.Step(1, srv, in, serving, idx)
			if slices.ContainsFunc(idx, func(i int) bool { return i != 2 }) {
				t.Fatalf("seed %d: %v condemned at %d s", seed, idx, sec)
			}
			if slices.Contains(idx, 2) {
				if sec < from {
					before = true
				} else {
					after = true
				}
			}
		}
		return before, after
	}
	for _, rate := range []float64{5, 33, 300} {
		for _, size := range []uint64{30, 50, 200} {
			// the second burst's first check, counted from the first's:
			// overlapping (w/2), touching (w), one or two quiet checks
			// between (w+1, w+2)
			for _, second := range []int{w / 2, w, w + 1, w + 2} {
				name := fmt.Sprintf("%g req/s, %d errors twice, the second from check %d of the first", rate, size, second)
				t.Run(name, func(t *testing.T) {
					const pairAt = 7200
					found := 0
					for seed := range uint64(3) {
						pair := map[int]uint64{}
						burst(pair, pairAt, size)
						burst(pair, pairAt+second, size)
						// quiet: no burst before the pair
						if before, after := condemned(seed, rate, pair, nil, pairAt); before {
							t.Fatalf("seed %d: condemned before the pair", seed)
						} else if after {
							found++
						}
						// a bursty backend: one burst like them forgiven
						// on a peer an hour before
						peer := map[int]uint64{}
						burst(peer, pairAt-3600, size)
						if before, after := condemned(seed, rate, pair, peer, pairAt); before || after {
							t.Errorf("seed %d, a peer bursty: condemned before the pair %v, at or after it %v", seed, before, after)
						}
						// bursty: one burst like them forgiven an hour before
						burst(pair, pairAt-3600, size)
						if before, after := condemned(seed, rate, pair, nil, pairAt); before || after {
							t.Errorf("seed %d, a bursty server: condemned before the pair %v, at or after it %v", seed, before, after)
						}
					}
					// The same pair on a quiet server is a fault where it
					// brings h beyond its best window and leaves no quiet
					// gap that makes it two bursts (50 errors or more at
					// 33 and 300 req/s, at most a check between them; at 5
					// req/s, or 30 errors at 300, it may not, and at 300
					// req/s a healthy check is often quiet): the history is
					// what makes the difference.
					t.Logf("found on a quiet server in %d of 3 seeds", found)
					if rate >= 33 && size >= 50 && second <= w+1 && found == 0 {
						t.Errorf("never found on a server without bursts before it: the history made no difference")
					}
				})
			}
		}
	}
}

// TestBurstsMinutesApartAtLowTraffic: bursts of 8, 17 or 40 errors spread
// over six checks (the first with an eighth of them), two of them 20 s,
// 90 s or 300 s apart, or three or four 90 s apart, at traffic low enough
// that the statistic
// takes minutes to fall back to zero: none is condemned. Before, the
// episode lasted until it did, and a second burst whose first check
// brought less than the credit, or a third, counted in full (the soak:
// N=70 at 0.5 req/s, bursts every 2.76 h, 56 false drains per 1,000
// server-days).
func TestBurstsMinutesApartAtLowTraffic(t *testing.T) {
	if underRace {
		t.Skip("24 cells of two hours or more, three seeds each, one goroutine: ten times slower under -race (make unit runs it without -race)")
	}
	quiet := rates(9, 0.0026, nil)
	// size errors over six checks, the first with an eighth of them
	burst := func(size uint64) []phase {
		first := max(size/8, 1)
		var out []phase
		for j := range uint64(6) {
			x := first
			if j > 0 {
				x = share(size-first, int(j-1), 5)
			}
			out = append(out, phase{secs: 1, rates: quiet, burst: map[int]uint64{2: x}})
		}
		return out
	}
	for _, rate := range []float64{0.5, 1.4, 5} {
		for _, tt := range []struct {
			size          uint64
			bursts, apart int
		}{{17, 2, 20}, {17, 2, 90}, {17, 2, 300}, {17, 3, 90}, {17, 4, 90}, {8, 3, 90}, {40, 2, 20}, {40, 3, 90},
			{17, 3, 20}, {17, 3, 40}, {40, 3, 20}, {40, 3, 40}} {
			t.Run(fmt.Sprintf("%g req/s, %d bursts of %d errors %d s apart", rate, tt.bursts, tt.size, tt.apart), func(t *testing.T) {
				for seed := range uint64(3) {
					phases := []phase{{secs: 7200, rates: quiet}}
					for b := range tt.bursts {
						if b > 0 {
							phases = append(phases, phase{secs: tt.apart - 6, rates: quiet})
						}
						phases = append(phases, burst(tt.size)...)
					}
					phases = append(phases, phase{secs: 600, rates: quiet})
					first, early := runPhases(t, DefaultConfig(), rate, phases, seed)
					noneCondemned(t, seed, first, early, "the last burst")
				}
			})
		}
	}
}

// TestFaultLeftServingStaysCondemned: a 5% fault left serving for ten
// minutes after it is first condemned (observe mode, a refused drain)
// stays condemned on all but a few of its checks (5% allowed; 0-3%
// measured): bounded at h, its statistic dips under h on every check
// that brings fewer errors than its alternative's rate, and its
// would-drain and the /metrics gauge flickered with them (let go on
// 19-24% of its checks at 33 req/s, 7-10% at 50, and an e2e scrape
// found the gauge at 0). At 5 req/s its errors come 4 s apart on
// average, further than the minimum duration's window of checks the
// hold lasted, and it was let go on 17-33% of its checks, until the hold
// also waited for the requests that would show the fault (holdN) and a
// span once shown degraded stayed so (SeqServer.shown): 0.2-3.1% since.
func TestFaultLeftServingStaysCondemned(t *testing.T) {
	for _, rate := range []float64{5, 33, 50, 300} {
		t.Run(fmt.Sprintf("%g req/s", rate), func(t *testing.T) {
			for seed := range uint64(4) {
				rng := rand.New(rand.NewPCG(seed, 77))
				q := NewSequential(DefaultConfig())
				srv, in, serving := backendOf(6)
				var idx []int
				const onset, after = 1200, 600
				first, off := -1, 0
				for sec := range onset + after {
					for i := range in {
						p := 0.002
						if i == 2 && sec >= onset {
							p = 0.05
						}
						r := poissonDraw(rng, rate)
						in[i] = Counts{N: r, X: errorsOf(rng, r, p)}
					}
					idx = q.Step(1, srv, in, serving, idx)
					got := slices.Contains(idx, 2)
					if slices.ContainsFunc(idx, func(i int) bool { return i != 2 }) {
						t.Fatalf("seed %d: %v condemned at %d s", seed, idx, sec)
					}
					switch {
					case got && first < 0:
						first = sec
					case first >= 0 && !got:
						off++
					}
				}
				if first < 0 {
					t.Fatalf("seed %d: never condemned", seed)
				}
				t.Logf("seed %d: condemned %d s after the onset; let go on %d of %d checks after", seed, first-onset, off, onset+after-first)
				if off*20 > onset+after-first {
					t.Errorf("seed %d: let go on %d of %d checks after it was condemned", seed, off, onset+after-first)
				}
			}
		})
	}
}

// TestBoundedAfterARefusedDrain: a fault left serving for ten minutes
// (its drain refused: the floor, observe mode) holds the statistic at h,
// not above it, so that once the server heals it is not condemned again
// on its normal errors.
func TestBoundedAfterARefusedDrain(t *testing.T) {
	for _, tt := range []struct {
		n    int
		rate float64
	}{{3, 5}, {9, 33}, {2, 1}} {
		t.Run(fmt.Sprintf("N=%d %g req/s", tt.n, tt.rate), func(t *testing.T) {
			for seed := range uint64(5) {
				rng := rand.New(rand.NewPCG(seed, 9))
				q := NewSequential(DefaultConfig())
				srv := make([]*SeqServer, tt.n)
				for i := range srv {
					srv[i] = &SeqServer{}
				}
				in, serving := make([]Counts, tt.n), make([]bool, tt.n)
				for i := range serving {
					serving[i] = true
				}
				var idx []int
				faultFor, after := 600, 3600
				holdBound := 2*math.Log(1/holdAlpha)/0.05/tt.rate + float64(q.w)
				letGo := false
				for sec := range 3600 + faultFor + after {
					for i := range in {
						p := 0.002
						if i == 0 && sec >= 3600 && sec < 3600+faultFor {
							p = 0.05
						}
						r := poissonDraw(rng, tt.rate)
						in[i] = Counts{N: r, X: errorsOf(rng, r, p)}
					}
					idx = q.Step(1, srv, in, serving, idx)
					if m := srv[0].Max(); m > q.H() {
						t.Fatalf("seed %d: the statistic %v passed h %v", seed, m, q.H())
					}
					// healed: let go within the hold (twice its requests
					// at the fault's 5%, for the estimate of the rate it
					// was condemned on) and the window, and never
					// condemned again once let go
					healed := sec - 3600 - faultFor
					switch {
					case healed < 0:
					case len(idx) == 0:
						letGo = true
					case letGo || float64(healed) > holdBound:
						t.Fatalf("seed %d: %v condemned %d s after healing (let go before: %v; the bound %.0f s)", seed, idx, healed, letGo, holdBound)
					}
				}
			}
		})
	}
}

// TestCadence: checks every 100 ms or 250 ms pool into one-second
// chunks, so that the false alarms per unit of time are what they are
// at one check a second, and a fault is found as soon. On the wall
// clock each check is woken a little late (up to 2 ms here), so their
// spacing is the cadence give or take that: the chunks still keep time,
// one a second. Before the slack (chunkSlack), a check that came under
// its cadence pooled with the next: checks a second apart made 2,684
// chunks in 3,622 s, and the fault was found after 22 s, not 14.
func TestCadence(t *testing.T) {
	for _, tt := range []struct {
		dt, late float64
	}{{0.1, 0}, {0.25, 0}, {1, 0}, {1, 0.002}, {0.25, 0.002}, {0.1, 0.002}} {
		t.Run(fmt.Sprintf("every %v s, up to %v s late", tt.dt, tt.late), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(4, 4))
			q := NewSequential(DefaultConfig())
			n := 9
			srv, in, serving := backendOf(n)
			var idx []int
			steps := int(math.Round(1 / tt.dt))
			found, late, secs := -1.0, 0.0, 0
			for sec := 0; sec < 3600+60 && found < 0; sec++ {
				secs = sec + 1
				for k := range steps {
					for i := range in {
						p := 0.002
						if i == 4 && sec >= 3600 {
							p = 0.05
						}
						r := poissonDraw(rng, 33*tt.dt)
						in[i] = Counts{N: r, X: errorsOf(rng, r, p)}
					}
					woken := tt.late * rng.Float64()
					idx = q.Step(tt.dt+woken-late, srv, in, serving, idx)
					late = woken
					for _, i := range idx {
						if i != 4 || sec < 3600 {
							t.Fatalf("server %d condemned at %d s", i, sec)
						}
						found = float64(sec-3600) + float64(k+1)*tt.dt
					}
				}
			}
			if got := int(q.chunks); got > secs+1 || got < secs-1 {
				t.Errorf("%d chunks in %d s of checks every %v s: want one a second", got, secs, tt.dt)
			}
			if found < 0 || found > 30 {
				t.Errorf("the fault found at %v s", found)
			}
			t.Logf("%d chunks in %d s; the fault found at %.2f s", q.chunks, secs, found)
		})
	}
}

// TestLongChecks: checks longer than a chunk (a step that waited on a
// model's call, a loop without evidence checks) find a fault as soon as
// one-second checks do, but for the check's own length: the same
// seconds, pooled into checks of k seconds, after an hour's healthy
// traffic (which condemns no one), over 20 seeds; the median time to
// find it grows by no more than k. Fed as one chunk, a check of k
// seconds made the minimum duration's 5-chunk window 5k seconds long
// (10 s checks: a median of 70 s against 13 s).
func TestLongChecks(t *testing.T) {
	const n, faulty, rate, start, seeds = 9, 4, 33.0, 3600, 20
	lengths := []int{1, 2, 3, 5, 10}
	found := map[int][]int{}
	for seed := range uint64(seeds) {
		rng := rand.New(rand.NewPCG(seed, 11))
		secs := make([][]Counts, start+120)
		for sec := range secs {
			secs[sec] = make([]Counts, n)
			for i := range n {
				p := 0.002
				if i == faulty && sec >= start {
					p = 0.05
				}
				r := poissonDraw(rng, rate)
				secs[sec][i] = Counts{N: r, X: errorsOf(rng, r, p)}
			}
		}
		for _, k := range lengths {
			q := NewSequential(DefaultConfig())
			srv, in, serving := backendOf(n)
			var idx []int
			at := -1
			for end := k; end <= len(secs) && at < 0; end += k {
				clear(in)
				for _, c := range secs[end-k : end] {
					for i := range n {
						in[i].N += c[i].N
						in[i].X += c[i].X
					}
				}
				idx = q.Step(float64(k), srv, in, serving, idx)
				for _, i := range idx {
					if i != faulty || end <= start {
						t.Fatalf("seed %d, checks of %d s: server %d condemned at %d s", seed, k, i, end)
					}
					at = end - start
				}
				if want := uint64(end); q.chunks != want {
					t.Fatalf("seed %d, checks of %d s: %d chunks after %d s", seed, k, q.chunks, end)
				}
			}
			if at < 0 {
				t.Fatalf("seed %d, checks of %d s: the fault never found", seed, k)
			}
			found[k] = append(found[k], at)
		}
	}
	base := median(found[1])
	for _, k := range lengths[1:] {
		if m := median(found[k]); m > base+k {
			t.Errorf("checks of %d s: found in a median %v s, against %v s with checks of 1 s (%v, %v)", k, m, base, found[k], found[1])
		}
	}
	t.Logf("found after (s), by check length, over %d seeds: %v", seeds, found)
}

// TestZoneOnceADay: a server in the zone (above the healthy region, not
// shown above the degraded line) is condemned once, and condemned again
// within ZoneEvery it is left serving, with Left set, not cycled; a
// degraded one is condemned every time.
func TestZoneOnceADay(t *testing.T) {
	for _, tt := range []struct {
		name  string
		p     float64
		again bool // condemned the second time
	}{
		{"zone: 0.9% among 0.2%", 0.009, false},
		{"degraded: 5% among 0.2%", 0.05, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			q := NewSequential(DefaultConfig())
			n := 9
			srv := make([]*SeqServer, n)
			for i := range srv {
				srv[i] = &SeqServer{}
			}
			in, serving := make([]Counts, n), make([]bool, n)
			var idx []int
			condemned, left := 0, false
			for sec := range 4 * 3600 {
				for i := range in {
					serving[i] = true
					p := 0.002
					if i == 0 && sec >= 3600 {
						p = tt.p
					}
					r := poissonDraw(rng, 300)
					in[i] = Counts{N: r, X: errorsOf(rng, r, p)}
				}
				idx = q.Step(1, srv, in, serving, idx)
				left = left || srv[0].Left
				for _, i := range idx {
					if i != 0 {
						t.Fatalf("healthy server %d condemned", i)
					}
					condemned++
					// drained, then back after its cooldown: its evidence
					// starts afresh, as a re-admission makes it
					srv[0].Reset()
				}
			}
			switch {
			case tt.again && condemned < 2:
				t.Errorf("condemned %d times in three hours, want again and again", condemned)
			case !tt.again && (condemned != 1 || !left):
				t.Errorf("condemned %d times (left serving: %v), want once, then left", condemned, left)
			}
		})
	}
}

// TestFleetWideFewAndQuiet: every server stepping from 0.2% to 5%
// together drains nothing, with two or three servers and at a request a
// second, where the peers' point median is often 0.
func TestFleetWideFewAndQuiet(t *testing.T) {
	for _, tt := range []struct {
		n    int
		rate float64
	}{{2, 1}, {2, 5}, {3, 1}, {3, 5}, {9, 1}} {
		t.Run(fmt.Sprintf("N=%d %g req/s", tt.n, tt.rate), func(t *testing.T) {
			for seed := range uint64(10) {
				first, early := runPhases(t, DefaultConfig(), tt.rate, []phase{{secs: 3600, rates: rates(tt.n, 0.002, nil)},
					{secs: 3600, rates: rates(tt.n, 0.05, nil)}}, seed)
				if len(early) > 0 {
					t.Fatalf("seed %d: %v condemned before the incident", seed, early)
				}
				for i, at := range first {
					if at >= 0 {
						t.Errorf("seed %d: server %d condemned %d s into a fleet-wide incident", seed, i, at)
					}
				}
			}
		})
	}
}

func TestThreshold(t *testing.T) {
	c := DefaultConfig()
	// ln(1000 days of seconds) + ln(4 alternatives)
	if got, want := c.Threshold(), math.Log(1000*86400*4); math.Abs(got-want) > 1e-9 {
		t.Errorf("h = %v, want %v", got, want)
	}
	c.ARLDays = 10
	if c.Threshold() >= DefaultConfig().Threshold() {
		t.Errorf("a shorter ARL must lower h")
	}
}

func TestValidateSequential(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Config)
	}{
		{"floor 0", func(c *Config) { c.Floor = 0 }},
		{"floor NaN", func(c *Config) { c.Floor = math.NaN() }},
		{"ratio under 2x the healthy ratio", func(c *Config) { c.DegradedRatio = 5 }},
		{"ARL 0", func(c *Config) { c.ARLDays = 0 }},
		{"healthy floor 0", func(c *Config) { c.HealthyFloor = 0 }},
		{"healthy floor over half the floor", func(c *Config) { c.HealthyFloor = 0.008 }},
		{"healthy ratio over half the degraded ratio", func(c *Config) { c.HealthyRatio = 4 }},
		{"healthy ratio under 1", func(c *Config) { c.HealthyRatio = 0.5 }},
		{"min duration -1s", func(c *Config) { c.MinDuration = -time.Second }},
		{"min duration a minute", func(c *Config) { c.MinDuration = time.Minute }},
		{"zone every -1h", func(c *Config) { c.ZoneEvery = -time.Hour }},
		{"baseline span 1s", func(c *Config) { c.BaselineSpan = time.Second }},
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.edit(&c)
			if c.Validate() == nil {
				t.Errorf("%+v accepted", c)
			}
		})
	}
}

// TestPolicyFeedsChunksFromTotals: the policy reads the windows' running
// totals; the first read of a server only sets its mark, a step's Decide
// and Evidence on one observation feed one chunk, and a server an
// operator drained is neither judged nor kept.
func TestPolicyFeedsChunksFromTotals(t *testing.T) {
	p := New(DefaultConfig())
	names := []string{"s1", "s2", "s3"}
	tot := map[string]*window.Stats{}
	for _, n := range names {
		tot[n] = &window.Stats{}
	}
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	obsAt := func(sec int, admin map[string]int) agent.Observation {
		b := agent.BackendView{Name: "app"}
		for _, n := range names {
			s := server(n, 0, 0)
			s.Window.TotalRequests, s.Window.TotalErr5xx = tot[n].TotalRequests, tot[n].TotalErr5xx
			s.State.AdminState = admin[n]
			b.Servers = append(b.Servers, s)
		}
		return agent.Observation{Time: at.Add(time.Duration(sec) * time.Second), Backends: []agent.BackendView{b}}
	}
	// A big history before the first read: not evidence.
	tot["s2"].TotalRequests, tot["s2"].TotalErr5xx = 1e6, 5e5
	if got := p.Evidence(obsAt(0, nil)); len(got) != 0 {
		t.Fatalf("first read condemned %v", got)
	}
	var found []agent.Key
	sec := 0
	for sec < 30 && len(found) == 0 {
		sec++
		for _, n := range names {
			tot[n].TotalRequests += 100
		}
		tot["s2"].TotalErr5xx += 10 // 10% from now on
		obs := obsAt(sec, nil)
		plan, err := p.Decide(context.Background(), obs)
		if err != nil {
			t.Fatal(err)
		}
		found = p.Evidence(obs) // the same chunk: no double count
		if len(plan) != len(found) {
			t.Fatalf("second %d: Decide drains %v, Evidence finds %v", sec, plan, found)
		}
	}
	if len(found) != 1 || found[0].Server != "s2" {
		t.Fatalf("found %v, want app/s2", found)
	}
	st := p.seq["app"].servers["s2"]
	chunks := st.Chunks
	p.Evidence(obsAt(sec, nil)) // same time as the last: no chunk
	if st.Chunks != chunks {
		t.Errorf("a second call at one time fed another chunk")
	}
	// Drained by an operator: reset, and not condemned.
	if got := p.Evidence(obsAt(sec+1, map[string]int{"s2": haproxy.AdminForcedDrain})); len(got) != 0 {
		t.Errorf("a drained server condemned: %v", got)
	}
	if st.Max() != 0 || st.Flagged {
		t.Errorf("a drained server keeps its evidence: %v", st.S)
	}
}

// TestZoneServerLeftWithItsReason: through the policy, a zone server
// drained once and back is condemned again within ZoneEvery: it is not
// proposed again, and the policy's notes say why it is left serving.
func TestZoneServerLeftWithItsReason(t *testing.T) {
	p := New(DefaultConfig())
	rng := rand.New(rand.NewPCG(5, 5))
	names := []string{"s1", "s2", "s3", "s4", "s5", "s6"}
	tot := make([]Counts, len(names))
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	outUntil, drains := -1, 0
	for sec := range 4 * 3600 {
		b := agent.BackendView{Name: "app"}
		for i, n := range names {
			p0 := 0.002
			if i == 0 && sec >= 3600 {
				p0 = 0.009 // the zone: above 0.6%, under 1.2%
			}
			r := poissonDraw(rng, 300)
			tot[i].N += r
			tot[i].X += errorsOf(rng, r, p0)
			s := server(n, 0, 0)
			s.Window.TotalRequests, s.Window.TotalErr5xx = tot[i].N, tot[i].X
			if i == 0 && sec < outUntil {
				s.State.AdminState = haproxy.AdminForcedDrain
			}
			b.Servers = append(b.Servers, s)
		}
		obs := agent.Observation{Time: at.Add(time.Duration(sec) * time.Second), Backends: []agent.BackendView{b}}
		plan, err := p.Decide(context.Background(), obs)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range plan {
			if a.Server != "s1" {
				t.Fatalf("healthy %s proposed: %s", a.Server, a.Reason)
			}
			if sec >= outUntil {
				drains++
				outUntil = sec + 60 // drained, then back: its evidence starts afresh
			}
		}
	}
	note := p.Notes()[agent.Key{Backend: "app", Server: "s1"}]
	if drains != 1 || !strings.Contains(note, "in the zone") {
		t.Fatalf("drained %d times, note %q; want once, then left with its reason", drains, note)
	}
}

// TestPeerCheckOverMinutes: a 2% server at 5 req/s beside two peers at
// 0.2% makes about six errors a minute. Three things kept it serving, each
// now gone: the peer check read only the last 64 one-second chunks, too
// few errors for its 10⁻⁶ (it now reads back over the evidence's minutes);
// the minimum duration's credit was the run's, so once spent every later
// window's error was cut and the evidence stood still (a window under the
// credit is now never cut); and the baseline learned the fault as it came
// (it now learns each bucket 17 minutes late, unless it held evidence).
// Before, 4 of these 10 seeds never found it in half an hour, and the
// others took 208 to 890 s.
func TestPeerCheckOverMinutes(t *testing.T) {
	var times []int
	for seed := range uint64(10) {
		first, early := runPhases(t, DefaultConfig(), 5, []phase{{secs: 7200, rates: rates(3, 0.002, nil)},
			{secs: 1800, rates: rates(3, 0.002, map[int]float64{1: 0.02})}}, seed)
		if len(early) > 0 {
			t.Fatalf("seed %d: %v condemned in the steady state", seed, early)
		}
		if first[0] >= 0 || first[2] >= 0 {
			t.Errorf("seed %d: a healthy peer condemned: %v", seed, first)
		}
		if first[1] < 0 {
			t.Errorf("seed %d: the 2%% server not found in 30 minutes", seed)
		}
		times = append(times, first[1])
	}
	t.Logf("found after %v s", times)
}

// TestLowRateFaultForgivenOnce: a sustained fault of an error or two a
// second brings more than the credit in some windows and not in others,
// with quiet seconds between its errors. The burst cut forgives it as it
// would one burst, or two, not once more after every quiet run: its
// median time to be found, mid-stream, is within 3 windows of the
// evidence alone (the same test with no cut). Before, a run of quiet
// windows ended the episode and a quiet gap began a burst of its own, so
// that at 11 req/s a 5% fault was found in a median 35 s against 13 s.
// At 5 req/s (an error every 4 s) each cut takes an error's worth, which
// the fault takes 4 s or more to bring again: 68 s against 29 s, before
// and after this change alike.
func TestLowRateFaultForgivenOnce(t *testing.T) {
	const n, faulty, start, seeds = 9, 2, 600, 30
	cfg := DefaultConfig()
	w := cfg.window()
	for _, rate := range []float64{11, 33} {
		var cut, alone []int
		for _, noCut := range []bool{false, true} {
			for seed := range uint64(seeds) {
				q := NewSequential(cfg)
				if noCut {
					q.credit = math.Inf(1)
				}
				first, early := runPhasesOn(t, q, rate, []phase{{secs: start, rates: rates(n, 0, nil)},
					{secs: 1200, rates: rates(n, 0, map[int]float64{faulty: 0.05})}}, seed)
				if len(early) > 0 {
					t.Fatalf("%g req/s, seed %d: %v condemned before the fault", rate, seed, early)
				}
				for i, at := range first {
					if i != faulty && at >= 0 {
						t.Fatalf("%g req/s, seed %d: healthy server %d condemned %d s after the onset", rate, seed, i, at)
					}
				}
				at := first[faulty]
				if at < 0 {
					t.Fatalf("%g req/s, seed %d: the fault never found", rate, seed)
				}
				if noCut {
					alone = append(alone, at)
				} else {
					cut = append(cut, at)
				}
			}
		}
		mc, ma := median(cut), median(alone)
		t.Logf("%g req/s: found in a median %v s, %v s on the evidence alone (window %d chunks)", rate, mc, ma, w)
		if mc > ma+3*w {
			t.Errorf("%g req/s: found in a median %v s, more than 3 windows (%d chunks) after the evidence alone (%v s)", rate, mc, w, ma)
		}
	}
}

// TestPeerWindowSums: the running sums peerRate reads are, after any run
// of chunks, a server leaving service and coming back, and resets, the
// sums of its last peerRateChunks chunks by their parity, newest first.
func TestPeerWindowSums(t *testing.T) {
	q := NewSequential(DefaultConfig())
	r := rand.New(rand.NewPCG(7, 7))
	srv := []*SeqServer{{}, {}, {}}
	serving := []bool{true, true, true}
	in := make([]Counts, len(srv))
	var out []int
	for step := range 3000 {
		for i := range srv {
			n := uint64(r.IntN(60))
			in[i] = Counts{N: n, X: uint64(r.IntN(int(n)/10 + 1))}
			serving[i] = r.IntN(200) != 0
		}
		if step%777 == 0 {
			srv[1].Reset()
		}
		out = q.Step(1, srv, in, serving, out)
		for i, s := range srv {
			var want [2]Counts // newest chunk's parity, then the other
			for j := range peerRateChunks {
				c := s.recent[(s.pos-1-j+2*recentChunks)%recentChunks]
				want[j%2].N += c.N
				want[j%2].X += c.X
			}
			got := [2]Counts{s.window[(s.pos+1)%2], s.window[s.pos%2]}
			if got != want {
				t.Fatalf("step %d server %d: window sums %+v, the ring's last %d chunks %+v", step, i, got, peerRateChunks, want)
			}
		}
	}
}

// restart is a server refusing its requests for down seconds, as phases:
// an edge second it is down for 40% of, the seconds it is down for all
// of, and an edge second of 60%.
func restart(rates []float64, i, down int) []phase {
	at := func(p float64) []float64 {
		r := slices.Clone(rates)
		r[i] = p
		return r
	}
	return []phase{{secs: 1, rates: at(0.4)}, {secs: down - 1, rates: at(1)}, {secs: 1, rates: at(0.6)}}
}

// TestRestartsSecondsApart: two restarts of a healthy server a few
// seconds apart, each no longer than the minimum duration, are two
// outages, not a fault: their errors together last longer than the
// minimum duration (with 0-2 s between them, 5-14 s), and the best
// windows could take out no more than one window of them. The soak's
// Poisson restarts make such pairs: --restarts 3:5 drained 9.92 healthy
// servers per 1,000 server-days, 1:2 7.94. From 17 requests a check,
// where a check can show an outage (sequential.go, outage).
func TestRestartsSecondsApart(t *testing.T) {
	quiet := []float64{0.002, 0.002, 0.002, 0.002, 0.002, 0.002}
	for _, rate := range []float64{20, 33, 300} {
		for _, down := range []int{2, 3, 5} {
			for _, gap := range []int{0, 1, 2} {
				t.Run(fmt.Sprintf("%g req/s %d s %d s apart", rate, down, gap), func(t *testing.T) {
					for seed := range uint64(3) {
						phases := []phase{{secs: 1800, rates: quiet}}
						phases = append(phases, restart(quiet, 2, down)...)
						if gap > 0 {
							phases = append(phases, phase{secs: gap, rates: quiet})
						}
						phases = append(phases, restart(quiet, 2, down)...)
						phases = append(phases, phase{secs: 300, rates: quiet})
						first, early := runPhases(t, DefaultConfig(), rate, phases, seed)
						noneCondemned(t, seed, first, early, "the restarts")
					}
				})
			}
		}
	}
}

// TestServerDownIsFound: an outage is judged afresh from its first
// check, a few in a row, not for ever: a server that fails every request
// from its onset, or 60% of them, is condemned within twice the minimum
// duration, and one that is down three seconds in six, or fails 80% of
// its requests (at 300 req/s its checks begin outage after outage),
// within six outages' time and a little more (the tokens).
func TestServerDownIsFound(t *testing.T) {
	for _, rate := range []float64{10, 33, 300} {
		for _, tt := range []struct {
			name   string
			fails  func(sec int) float64 // its error rate in its sec-th second since the onset
			within int
		}{
			{"down", func(int) float64 { return 1 }, 10},
			{"flapping", func(sec int) float64 { return float64(1 - sec%6/3) }, 45},
			{"failing 60%", func(int) float64 { return 0.6 }, 10},
			{"failing 80%", func(int) float64 { return 0.8 }, 45},
		} {
			t.Run(fmt.Sprintf("%g req/s %s", rate, tt.name), func(t *testing.T) {
				for seed := range uint64(3) {
					rng := rand.New(rand.NewPCG(seed, 5))
					q := NewSequential(DefaultConfig())
					srv, in, serving := backendOf(6)
					var idx []int
					const onset = 1800
					found := -1
					for sec := 0; sec < onset+300 && found < 0; sec++ {
						for i := range in {
							p := 0.002
							if i == 2 && sec >= onset {
								p = max(p, tt.fails(sec-onset))
							}
							r := poissonDraw(rng, rate)
							in[i] = Counts{N: r, X: errorsOf(rng, r, p)}
						}
						idx = q.Step(1, srv, in, serving, idx)
						for _, i := range idx {
							if i != 2 || sec < onset {
								t.Fatalf("seed %d: server %d condemned at %d s", seed, i, sec)
							}
							found = sec - onset
						}
					}
					t.Logf("seed %d: condemned %d s after the onset", seed, found)
					if found < 0 || found > tt.within {
						t.Errorf("seed %d: condemned %d s after the onset (-1: never), want within %d", seed, found, tt.within)
					}
				}
			})
		}
	}
}

// TestColdFaultIsDegraded: servers at 5% from the agent's first check (a
// restart while the fault is on) are degraded, not in the zone: once
// condemned, they stay condemned. An alternative whose statistic fell back
// to zero kept the windows it had cut before in the evidence's cut, and at
// 50 req/s the 10% alternative, climbing on a chunk of five errors and
// falling back, had cut 8 to 27 of the first 40 chunks, those with the
// most errors: the rest showed 1-2%, and the server was judged in the zone
// and left serving for up to 30 s. TestObserveModeOnPaperFault, the real
// agent in observe mode, failed 4 runs of 4. Here, at 33 and 50 req/s, it
// was let go at 15.6% and 11.7% of the checks after its first
// condemnation, 7.0% and 4.8% from 10 s after it; since, at 0.24% and
// 0.01%, and 1 check in 8,316 and none from 10 s after. A server
// condemned on its first seconds of evidence may still be judged in the
// zone for a few seconds (6 of 163 answers failed, at 33 req/s): that is
// evidence too short to show it above the degraded line, not evidence
// cut away.
func TestColdFaultIsDegraded(t *testing.T) {
	for _, tt := range []struct {
		rate, healthy float64
	}{{33, 0}, {50, 0}, {50, 0.002}, {300, 0.002}} {
		t.Run(fmt.Sprintf("%g req/s, healthy %g", tt.rate, tt.healthy), func(t *testing.T) {
			checks, off, late := 0, 0, 0
			for seed := range uint64(200) {
				rng := rand.New(rand.NewPCG(seed, 99))
				q := NewSequential(DefaultConfig())
				srv, in, serving := backendOf(6)
				var idx []int
				first := -1
				for sec := range 60 {
					for i := range in {
						p := tt.healthy
						if i == 2 || i == 5 {
							p = 0.05
						}
						r := poissonDraw(rng, tt.rate)
						in[i] = Counts{N: r, X: errorsOf(rng, r, p)}
					}
					idx = q.Step(1, srv, in, serving, idx)
					if slices.ContainsFunc(idx, func(i int) bool { return i != 2 && i != 5 }) {
						t.Fatalf("seed %d: %v condemned at %d s", seed, idx, sec)
					}
					got := slices.Contains(idx, 2)
					switch {
					case got && first < 0:
						first = sec
					case first >= 0:
						checks++
						if !got {
							off++
							if sec > first+10 {
								late++
							}
						}
					}
				}
				if first < 0 {
					t.Fatalf("seed %d: never condemned", seed)
				}
			}
			t.Logf("let go at %d of %d checks after its first condemnation, %d from 10 s after it", off, checks, late)
			if off*50 > checks || late*200 > checks {
				t.Errorf("let go at %d of %d checks after its first condemnation, %d from 10 s after it: want under 2%% and 0.5%%", off, checks, late)
			}
		})
	}
}
