package rules

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestZoneServerWithBurstsOnceADay: a server in the zone (2.1% where its
// peers fail 0.5%: above the healthy region's 1.5%, under the degraded
// line's 3%) that also has bursts now and then is condemned once in half
// a day and then left serving: a burst inside its evidence's span is no
// evidence that its rate is degraded. Before, the burst's errors counted
// in the span's rate, showed it above the degraded line, and it was
// drained again and again (random fleets, `hapilot-bench soak
// --random-fleets --seeds 5-12`: zone servers at 43 and 168 req/s with
// bursts of 28 and 47 errors, drained twice in a day). Now the chunks a
// burst's cut touched are left out of the span's counts. On 863adfe, the
// tree before, 1 cell of the 14 fails (40 req/s, bursts of 60 over 1 s,
// seed 1: condemned twice). The first hour is at the peers' rate: from
// a cold start the backend's median is not known yet, and a 2.1% server
// is degraded by the floors alone.
func TestZoneServerWithBurstsOnceADay(t *testing.T) {
	if underRace {
		t.Skip("14 cells of 10 seeds of 13 hours each: ten times slower under -race (make unit runs it without -race)")
	}
	const (
		n     = 9
		warm  = 3600 // an hour at its peers' rate first: the backend's median is learned
		secs  = warm + 12*3600
		every = 1200 // a burst every 20 minutes on average: rarer than the burst tokens refill (burstRefill)
	)
	type shape struct {
		errors uint64 // a burst's
		spread int    // over this many seconds
	}
	shapes := []shape{{0, 1}} // no bursts: the zone server alone
	for _, errors := range []uint64{15, 30, 60} {
		for _, spread := range []int{1, 3} {
			shapes = append(shapes, shape{errors, spread})
		}
	}
	for _, rate := range []float64{40, 170} {
		for _, sh := range shapes {
			t.Run(fmt.Sprintf("%g req/s, bursts of %d over %d s", rate, sh.errors, sh.spread), func(t *testing.T) {
				t.Parallel()
				for seed := range uint64(10) {
					rng := rand.New(rand.NewPCG(seed, 11))
					q := NewSequential(DefaultConfig())
					srv, in, serving := backendOf(n)
					var idx []int
					condemned, left, burstLeft := 0, false, 0
					for sec := range secs {
						if sec >= warm && burstLeft == 0 && rng.IntN(every) == 0 {
							burstLeft = sh.spread
						}
						for i := range n {
							p := 0.005
							if i == 0 && sec >= warm {
								p = 0.021
							}
							r := poissonDraw(rng, rate)
							x := errorsOf(rng, r, p)
							if i == 0 && burstLeft > 0 {
								b := sh.errors / uint64(sh.spread)
								r, x = r+b, x+b
							}
							in[i] = Counts{N: r, X: x}
						}
						if burstLeft > 0 {
							burstLeft--
						}
						idx = q.Step(1, srv, in, serving, idx)
						left = left || srv[0].Left
						for _, i := range idx {
							if i != 0 {
								t.Fatalf("seed %d: healthy server %d condemned at %d s", seed, i, sec)
							}
							condemned++
							n0, x0 := srv[0].RunCounts()
							t.Logf("seed %d: condemned at %d s: zone %v, %d/%d over %d checks (%d cut), p0 %.4f p1 %.4f", seed, sec, srv[0].Zone, x0, n0, srv[0].run, srv[0].runCut(), srv[0].P0(), q.P1Min())
							srv[0].Reset() // drained, and back after its cooldown
						}
					}
					if condemned > 1 {
						t.Errorf("seed %d: the zone server condemned %d times in 12 h (left serving: %v), want once", seed, condemned, left)
					}
				}
			})
		}
	}
}

// TestZoneServerFromAColdStart: a server in the zone from the agent's
// first check (1.56% among peers at 0.36%: degraded from 2.16%) is judged
// in the zone on its first condemnation, not degraded by the floor alone
// while no server has a baseline to give the backend's median, and so it
// is condemned once in the day, then left serving. Before, it was
// condemned as degraded within seconds and again, in the zone, once the
// median was known (the soak's random fleets, seeds 21-24 and 37-40: a
// zone server drained twice in a day at 310 and 340 req/s).
func TestZoneServerFromAColdStart(t *testing.T) {
	for _, rate := range []float64{40, 300} {
		t.Run(fmt.Sprintf("%g req/s", rate), func(t *testing.T) {
			for seed := range uint64(20) {
				rng := rand.New(rand.NewPCG(seed, 13))
				q := NewSequential(DefaultConfig())
				srv, in, serving := backendOf(9)
				var idx []int
				condemned := 0
				for sec := range 3600 {
					for i := range in {
						p := 0.0036
						if i == 0 {
							p = 0.0156
						}
						r := poissonDraw(rng, rate)
						in[i] = Counts{N: r, X: errorsOf(rng, r, p)}
					}
					idx = q.Step(1, srv, in, serving, idx)
					for _, i := range idx {
						if i != 0 {
							t.Fatalf("seed %d: healthy server %d condemned at %d s", seed, i, sec)
						}
						condemned++
						if !srv[0].Zone {
							t.Errorf("seed %d: condemned at %d s as degraded, want in the zone", seed, sec)
						}
					}
				}
				if condemned > 1 {
					t.Errorf("seed %d: condemned %d times in an hour, want once at most", seed, condemned)
				}
			}
		})
	}
}

// TestZoneServerNearTheLine: a server in the zone just under the degraded
// line (1.18% where the line is 1.2%, six times the peers' lower median of
// 0.2%, the peers spread from 0.08% to 0.5%), from the agent's start, is
// condemned at most once in a day at 5 and 33 req/s. The backend's median
// is an estimate: learned in the first minutes it is tens of percent off,
// and later the zone server, loud from its start, fell out of it as its
// first minutes' baseline faded (0.2% became 0.17%). Judged against the
// estimate's line, the server's hours of evidence showed it above it, and
// it was drained again (the soak, `--servers 9 --rate 33 --hetero 0.6
// --seeds 201-204`). Now every server with traffic counts in the median
// (medianCounts), and a server is shown degraded only three sigma of the
// line's own uncertainty above it (lineZ). On 844d57e, the tree before,
// 39 of the 40 seeds fail (the zone server condemned 2 to 5 times); with
// the median's fix alone, 18.
func TestZoneServerNearTheLine(t *testing.T) {
	if underRace {
		t.Skip("40 server-days of a fleet of nine: ten times slower under -race (make unit runs it without -race)")
	}
	rates := []float64{0.0118, 0.0008, 0.001, 0.0014, 0.0017, 0.002, 0.0026, 0.0035, 0.005}
	for _, rate := range []float64{5, 33} {
		t.Run(fmt.Sprintf("%g req/s", rate), func(t *testing.T) {
			t.Parallel()
			for seed := range uint64(20) {
				rng := rand.New(rand.NewPCG(seed, 17))
				q := NewSequential(DefaultConfig())
				srv, in, serving := backendOf(len(rates))
				var idx []int
				var at []int
				for sec := range 86400 {
					idx = stepAtRates(q, rng, rate, rates, srv, in, serving, idx)
					for _, i := range idx {
						if i != 0 {
							t.Fatalf("seed %d: healthy server %d condemned at %d s", seed, i, sec)
						}
						at = append(at, sec)
						srv[0].Reset() // drained, and back after its cooldown
					}
				}
				if len(at) > 1 {
					t.Errorf("seed %d: the zone server condemned %d times in a day (at %v s; median %.5f), want once at most", seed, len(at), at, q.Median())
				}
			}
		})
	}
}

// TestNoisyBackendAtLowTraffic: in a noisy backend at a few requests a
// second, a healthy server at 2.7 times the median (1% among peers at
// 0.5% to 1.5%) is never condemned in its day, from the agent's start.
// The median takes 1,000 requests a server to learn, and the quietest
// servers get there first: judged against a line under them, such
// servers were drained, 17 to 78 times per 1,000 server-days in the
// soak's noisy cells at 0.5 to 3 req/s on 844d57e (--seeds 401-404;
// 2 to 61 with medianCounts). Now a server
// must be shown above the healthy region of its peers' rate, one sigma
// up (peerCheck). On 0e67ed0, the tree before, 6 of the 10 seeds fail at
// 3 req/s (N=2) and 1 at 1 req/s (N=5). The rows at N=3 are the median
// of all the servers' (peerCheck's and refresh's): on 7f3c8fb, 10 and 2
// of the 10 seeds fail.
func TestNoisyBackendAtLowTraffic(t *testing.T) {
	if underRace {
		t.Skip("20 server-days of small fleets: ten times slower under -race (make unit runs it without -race)")
	}
	for _, tt := range []struct {
		rate  float64
		rates []float64
	}{
		{3, []float64{0.027, 0.01}},
		{1, []float64{0.027, 0.005, 0.008, 0.01, 0.015}},
		// the loudest of three, beside its equal: the peer check's
		// median counts the server's own rate (peerCheck)
		{2, []float64{0.0461, 0.0054, 0.0434}},
		// at 0.5 req/s, twice the median: the backend's median is of
		// all three (refresh, medianCounts)
		{0.5, []float64{0.0327, 0.0158, 0.0091}},
	} {
		t.Run(fmt.Sprintf("N=%d at %g req/s", len(tt.rates), tt.rate), func(t *testing.T) {
			t.Parallel()
			failed := 0
			for seed := range uint64(10) {
				at, median := condemnedInADay(rand.New(rand.NewPCG(seed, 19)), tt.rate, tt.rates)
				for i, a := range at {
					if len(a) > 0 {
						t.Errorf("seed %d: server %d condemned at %v s (median %.4f at the day's end)", seed, i, a, median)
						failed++
						break
					}
				}
			}
			t.Logf("%d of 10 seeds condemned a healthy server", failed)
		})
	}
}

// TestZoneServerOfThree: in a backend of three at a few requests a
// second or less, a zone server (4 to 5 times the median, under the
// degraded line of 6) is condemned at most once in a day from the
// agent's start, drained for 30 s each time as the soak drains it. The
// backend's median was learned from the quietest servers first (the
// lower median of one or two), and a server back from a drain is in its
// warm-up again: the zone server was shown degraded against the line of
// the quietest server and drained again and again (the soak's --servers
// 3 --hetero 0.5, --rate 2 --noise 0.012 --seeds 501-504 and --rate 0.5
// --noise 0.015 --seeds 701-704: 7 and 14 drains of one server in a
// day). Now the median is of all the servers (refresh), the line never
// under that of the backend's median over the span, and a condemnation
// before the median is known is the zone's one in a day (Step). At 33
// req/s, a second drain in a day was shown against a median learned low
// in the first minutes: now against the span's median itself (Step).
func TestZoneServerOfThree(t *testing.T) {
	if underRace {
		t.Skip("20 server-days: ten times slower under -race (make unit runs it without -race)")
	}
	for _, tt := range []struct {
		rate  float64
		rates []float64
		seeds uint64
	}{
		{2, []float64{0.0808, 0.006, 0.0175}, 10},
		{0.5, []float64{0.0382, 0.0094, 0.0031}, 10},
		// drained cold in its first minute, and shown degraded a minute
		// later against a median learned low (Step's line for a second
		// drain in a day): 3 of 200 seeds on 464d92d
		{33, []float64{0.038, 0.0081, 0.0034}, 200},
		// N=2: the lower server is the median, and never condemned
		// beside a peer in the zone (peerCheck: before, that peer left
		// out as a fault of its own, only the floor applied)
		{2, []float64{0.164, 0.036}, 10},
	} {
		t.Run(fmt.Sprintf("N=%d at %g req/s", len(tt.rates), tt.rate), func(t *testing.T) {
			t.Parallel()
			failed := 0
			for seed := range tt.seeds {
				at, median := condemnedInADay(rand.New(rand.NewPCG(seed, 23)), tt.rate, tt.rates)
				for i, a := range at[1:] {
					if len(a) > 0 {
						t.Fatalf("seed %d: healthy server %d condemned at %v s", seed, i+1, a)
					}
				}
				if len(at[0]) > 1 {
					t.Errorf("seed %d: the zone server condemned %d times in a day (at %v s; median %.4f), want once at most", seed, len(at[0]), at[0], median)
					failed++
				}
			}
			t.Logf("%d of %d seeds condemned the zone server more than once", failed, tt.seeds)
		})
	}
}

// condemnedInADay runs a backend from the agent's start through a day of
// Poisson traffic at rate requests a server a second, server i failing
// at rates[i], and returns when each server was condemned (in seconds)
// and the backend's median at the day's end. A condemned server is
// drained for 30 s, as the soak drains it, and comes back afresh.
func condemnedInADay(rng *rand.Rand, rate float64, rates []float64) (at [][]int, median float64) {
	q := NewSequential(DefaultConfig())
	srv, in, serving := backendOf(len(rates))
	at = make([][]int, len(rates))
	back := make([]int, len(rates))
	var idx []int
	for sec := range 86400 {
		for i := range serving {
			serving[i] = sec >= back[i]
		}
		idx = stepAtRates(q, rng, rate, rates, srv, in, serving, idx)
		for _, i := range idx {
			at[i] = append(at[i], sec)
			back[i] = sec + 30
		}
	}
	return at, q.Median()
}

// stepAtRates feeds q one second of Poisson traffic at rate requests a
// server, server i failing at rates[i], and returns what it condemns.
func stepAtRates(q *Sequential, rng *rand.Rand, rate float64, rates []float64, srv []*SeqServer, in []Counts, serving []bool, idx []int) []int {
	for i, p := range rates {
		r := poissonDraw(rng, rate)
		in[i] = Counts{N: r, X: errorsOf(rng, r, p)}
	}
	return q.Step(1, srv, in, serving, idx)
}

// TestPeerCheckAgainstTheMedian: the peer check holds a server to the
// healthy region of the backend's median, not of its peers' pooled rate.
// At N=3 the loudest server's peers pool to their mean, under the median
// where the quiet one is quieter: a server at 2.5% beside peers at 1%
// (the median) and 0.4% is 3.6 times their mean and healthy, at 2.5
// times the median; one at 4% is above the healthy region. At N=2 the
// lower server is the median, and a peer far above it does not leave it
// to the floor alone. Steady traffic, its errors spread evenly (no
// chance), for 20 minutes at 40 requests a second.
func TestPeerCheckAgainstTheMedian(t *testing.T) {
	for _, tt := range []struct {
		name  string
		rates []float64
		want  bool
	}{
		{"N=3: 2.5 times the median, 3.6 times the peers' mean", []float64{0.025, 0.01, 0.004}, false},
		{"N=3: 4 times the median", []float64{0.04, 0.01, 0.004}, true},
		{"N=2: the median, beside a peer in the zone", []float64{0.036, 0.164}, false},
		{"N=2: 5 times its peer", []float64{0.05, 0.01}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q := NewSequential(DefaultConfig())
			srv, in, serving := backendOf(len(tt.rates))
			owed := make([]float64, len(tt.rates))
			var idx []int
			for range 1200 {
				for i, p := range tt.rates {
					in[i] = Counts{N: 40, X: evenErrors(&owed[i], 40, p)}
				}
				idx = q.Step(1, srv, in, serving, idx)
			}
			// asked over the whole ring, as for a server at h for 17
			// minutes (its own baseline would have ended its run)
			srv[0].run = ringChunks
			got, _, _ := q.peerCheck(srv, serving, 0)
			n, x := q.span(srv[0], srv[0].run)
			if got != tt.want {
				t.Errorf("peer check of server 0 (%d of %d over its span) = %v, want %v", x, n, got, tt.want)
			}
		})
	}
}

// TestPeerCheckWithItsPeersUncertainty: the peer check holds a server to
// the healthy region of its peers' rate with the peers' own uncertainty.
// N=2 at 0.5 req/s: for two hours the server fails at 3.75%, two and a
// half times its peer at 1.5%; then, over the ring's 17 minutes, it has
// 25 errors in its 512 requests and the peer 1, by chance. Three times
// the peer's rate one sigma up (3 in 512) is 1.8%, which the server's
// 4.9% stands far above; with the peer's uncertainty, and its history,
// which its quiet span does not stand above, it is not condemned. At
// 10% over the span (6.7 times the peer's history) it is. And the
// history is set aside where the span stands above it, as in a
// fleet-wide incident: after two hours at 0.2% each, the peer's 8
// errors in 512 over the span stand above its history, and the server's
// 55 are not shown above three times those (with its peer's history,
// three times 0.4%, they would be). Errors spread evenly (no chance).
func TestPeerCheckWithItsPeersUncertainty(t *testing.T) {
	for _, tt := range []struct {
		name        string
		before, now [2]float64 // the server's and its peer's rates
		want        bool
	}{
		{"2.5 times its peer's history, 25 times its span", [2]float64{0.0375, 0.015}, [2]float64{25.0 / 512, 1.0 / 512}, false},
		{"6.7 times its peer's history", [2]float64{0.0375, 0.015}, [2]float64{0.1, 1.0 / 512}, true},
		{"its peer above its history, judged on its span", [2]float64{0.002, 0.002}, [2]float64{55.0 / 512, 8.0 / 512}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			q := NewSequential(DefaultConfig())
			srv, in, serving := backendOf(2)
			var owed [2]float64
			var idx []int
			for sec := range 7200 + ringChunks {
				rates := tt.before
				if sec >= 7200 {
					rates = tt.now
				}
				n := uint64(sec % 2) // 0.5 req/s
				for i, p := range rates {
					in[i] = Counts{N: n, X: evenErrors(&owed[i], n, p)}
				}
				idx = q.Step(1, srv, in, serving, idx)
			}
			if !q.known {
				t.Fatal("the backend's median is not known after two hours")
			}
			srv[0].run = ringChunks // asked over the whole ring
			got, _, _ := q.peerCheck(srv, serving, 0)
			n, x := q.span(srv[0], srv[0].run)
			pn, px := q.span(srv[1], srv[0].run)
			if got != tt.want {
				t.Errorf("peer check of server 0 (%d of %d over its span, its peer %d of %d, history %.0f of %.0f) = %v, want %v",
					x, n, px, pn, srv[1].ex, srv[1].en, got, tt.want)
			}
		})
	}
}

// TestPeerHistoryCountsOnce: a peer's long baseline counts in place of
// its span, not beside it. Early in a day the baseline holds the span's
// own chunks (it learns each quiet chunk at once in the warm-up), and
// both at once counted a quiet peer's few errors twice: a healthy
// server at 2.6 times the median, loud over its span (44 in 1,515)
// beside peers quiet over theirs (the median's 5 in 1,494), was
// condemned 759 s into its day (the soak, --servers 3 --rate 2
// --hetero 0.5 --noise 0.012 --seeds 401-404). These counts are the
// test's, with the server past its own warm-up and its peer back from
// a drain 760 s ago: in the server's warm-up the check's level is a
// tenth (warmAlpha), and there these counts pass either way.
func TestPeerHistoryCountsOnce(t *testing.T) {
	q := NewSequential(DefaultConfig())
	srv, in, serving := backendOf(3)
	rates := [3]float64{44.0 / 1520, 5.0 / 1520, 3.0 / 1520}
	var owed [3]float64
	var idx []int
	const away = 400 // the peer's drain, at the day's start
	for sec := range away + 760 {
		serving[1] = sec >= away
		for i, p := range rates {
			in[i] = Counts{N: 2, X: evenErrors(&owed[i], 2, p)} // 2 req/s
		}
		idx = q.Step(1, srv, in, serving, idx)
	}
	if !q.known {
		t.Fatal("the backend's median is not known")
	}
	if srv[0].warm() || !srv[1].warm() || srv[1].en < 1000 {
		t.Fatalf("server 0 warm %v; its peer's baseline: warm %v, %.0f requests; want the server past its warm-up, its peer in its own, over the span",
			srv[0].warm(), srv[1].warm(), srv[1].en)
	}
	srv[0].run = 760 // asked over the whole day
	if got, _, _ := q.peerCheck(srv, serving, 0); got {
		n, x := q.span(srv[0], srv[0].run)
		pn, px := q.span(srv[1], srv[0].run)
		t.Errorf("peer check of server 0 (%d of %d over its span, the median's peer %d of %d: not three times its rate at the check's level) = true, want false",
			x, n, px, pn)
	}
}

// TestPeerHistoryInAnIncident: a peer lends its history only where
// neither its span nor its last 17 minutes stand above it. In a
// fleet-wide incident the peers' short spans may be quiet by chance: at
// N=3 and 5 req/s, 2 errors in 338 requests where 5% gives 17, and a
// server beside them (20 in 191) was condemned against their histories
// 666 s into the incident (the soak, --servers 3 --rate 5 --fleet-fault
// 0.05 --trials 50 --seeds 1-4). Against their spans it is not: it is
// no more than three times their rate at the check's level. At N=3 the
// edge, which reads the lending peers' minutes, stands above it too; at
// N=2 the edge reads the one peer's span, and the minutes' test alone
// keeps a server at three times the incident's rate (30 in 200 beside 1
// in 200) from being judged against the peer's history.
func TestPeerHistoryInAnIncident(t *testing.T) {
	for _, tt := range []struct {
		servers int
		errors  float64 // server 0's in the span's 200 requests
	}{
		{3, 19},
		{2, 30},
	} {
		t.Run(fmt.Sprintf("N=%d", tt.servers), func(t *testing.T) {
			const steady, incident, span = 7200, 600, 40
			q, srv, serving := stepAt(t, tt.servers, 5, steady+incident+span, func(sec, i int) float64 {
				switch {
				case sec >= steady+incident && i == 0: // the span: the peers quiet by chance
					return tt.errors / 200
				case sec >= steady+incident:
					return 2.0 / 400
				case sec >= steady:
					return 0.05
				}
				return 0.002
			})
			srv[0].run = span
			n, x := q.span(srv[0], span)
			pn, px := q.span(srv[1], span)
			if pn == 0 || px*100 > pn || x*20 < n {
				t.Fatalf("spans: server 0 %d of %d, its peer %d of %d; want it loud and its peer quiet", x, n, px, pn)
			}
			if got, _, _ := q.peerCheck(srv, serving, 0); got {
				t.Errorf("peer check of server 0 (%d of %d over its span, its peers quiet over theirs and at 5%% for the 10 minutes before) = true, want false", x, n)
			}
		})
	}
}

// TestPeerCheckInTheWarmUp: in its warm-up the server is held to a
// tenth of the check's level (warmAlpha). A healthy server a little loud
// over its first minutes beside peers quiet over theirs (15 errors in
// 255 requests beside none in 510, 4.7·10⁻⁴ at three times) is not
// condemned at its first look; at 10⁻³ it would be, as one was in the
// soak (--servers 3 --rate 1 --hetero 0.6 --noise 0.01 --seeds 901-908,
// 15 in 266 beside none in 469, 255 s into its day). A fault in the
// warm-up (40 in 255 beside none, 1.3·10⁻⁹) is condemned.
func TestPeerCheckInTheWarmUp(t *testing.T) {
	for _, tt := range []struct {
		errors uint64 // server 0's in its 255 requests
		want   bool
	}{
		{15, false},
		{40, true},
	} {
		t.Run(fmt.Sprintf("%d errors", tt.errors), func(t *testing.T) {
			q := NewSequential(DefaultConfig())
			srv, in, serving := backendOf(3)
			owed := 0.0
			var idx []int
			for range 255 {
				in[0], in[1], in[2] = Counts{N: 1, X: evenErrors(&owed, 1, float64(tt.errors)/255)}, Counts{N: 1}, Counts{N: 1}
				idx = q.Step(1, srv, in, serving, idx)
			}
			if q.known || !srv[0].warm() {
				t.Fatalf("median known %v, server 0 warm %v; want a cold start", q.known, srv[0].warm())
			}
			srv[0].run, srv[0].coldLooks = 255, 1 // its first look, over the whole day
			n, x := q.span(srv[0], srv[0].run)
			if x != tt.errors || n != 255 {
				t.Fatalf("server 0's span: %d of %d, want %d of 255", x, n, tt.errors)
			}
			if got, _, _ := q.peerCheck(srv, serving, 0); got != tt.want {
				t.Errorf("peer check of server 0 in its warm-up (%d of 255, its peers none of 510) = %v, want %v", x, got, tt.want)
			}
		})
	}
}

// TestLineOfAQuietMedian: the degraded line's uncertainty is taken
// through the floor with a Poisson bound that holds for few errors. At
// N=2 and 0.5 req/s, a peer with none in its last 17 minutes' requests
// is a median of 0, but of up to 1.3% three sigma up, a line of up to
// 7.9%: a server at 5% must not be shown above it. With one sigma up
// scaled by three, the line three sigma up was 1.5%, and a zone server
// (5.1% beside 1.1%) was shown degraded and drained twice in a day (the
// soak, --servers 2 --rate 0.5 --hetero 0.6 --noise 0.02 --seeds
// 801-804).
func TestLineOfAQuietMedian(t *testing.T) {
	q := NewSequential(DefaultConfig())
	srv, in, serving := backendOf(2)
	owed := 0.0
	var idx []int
	for sec := range 1600 {
		n := uint64(sec % 2) // 0.5 req/s
		in[0], in[1] = Counts{N: n, X: evenErrors(&owed, n, 0.05)}, Counts{N: n}
		idx = q.Step(1, srv, in, serving, idx)
	}
	if !q.known || q.Median() != 0 {
		t.Fatalf("median %.4f (known %v), want a known 0", q.Median(), q.known)
	}
	if top := q.cfg.DegradedMin(q.Median()) + lineZ*q.lineSD; top < 0.05 {
		t.Errorf("the line three sigma up is %.4f, want above 5%%", top)
	}
}

// evenErrors is the errors of n requests at rate p spread evenly, no
// chance: owed carries the fraction of an error from one call to the
// next.
func evenErrors(owed *float64, n uint64, p float64) uint64 {
	*owed += float64(n) * p
	x := math.Floor(*owed)
	*owed -= x
	return uint64(x)
}

// TestPeerEdgeOverTheirMinutes: the edge above the median reads the
// lending peers' last 17 minutes, not their spans alone, where two peers
// or more lend. After two hours at 0.2% and 5 req/s, a 5% fault's first
// 80 s (20 errors in 400 requests) beside peers with 2 chance errors
// each over the same span: on the spans, one sigma up (0.88%), the edge
// was three times that, 2.6%, and the fault not shown above it at the
// check's level (0.005); their minutes put it at 0.8%. A server at 1.5%
// is under the edge either way. Beside one peer (N=2) its span is read,
// one sigma up, as before: a single server's rate is the whole edge
// there, and its span's sigma the margin that keeps healthy servers at
// two or three times it from being condemned look after look. So a
// server at 3% over 400 s (60 in 2,000) beside a peer with 10 errors
// over them waits (0.006 at three times the span's rate one sigma up,
// 0.71%); on the peer's minutes it would not.
func TestPeerEdgeOverTheirMinutes(t *testing.T) {
	for _, tt := range []struct {
		name    string
		servers int
		span    int    // seconds, at 5 req/s
		errors  uint64 // server 0's over the span
		peer    uint64 // each peer's over the span
		want    bool
	}{
		{"a 5% fault beside two peers", 3, 80, 20, 2, true},
		{"a server at 1.5% beside two peers", 3, 80, 6, 2, false},
		{"3% beside one peer: its span", 2, 400, 60, 10, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// two hours at 0.2%, then the span
			const steady = 7200
			total := 5 * float64(tt.span)
			q, srv, serving := stepAt(t, tt.servers, 5, steady+tt.span, func(sec, i int) float64 {
				switch {
				case sec >= steady && i == 0:
					return float64(tt.errors) / total
				case sec >= steady:
					return float64(tt.peer) / total
				}
				return 0.002
			})
			srv[0].run = tt.span
			n, x := q.span(srv[0], tt.span)
			pn, px := q.span(srv[1], tt.span)
			if x != tt.errors || px != tt.peer {
				t.Fatalf("spans: server 0 %d of %d, its peer %d of %d; want %d and %d", x, n, px, pn, tt.errors, tt.peer)
			}
			if got, _, _ := q.peerCheck(srv, serving, 0); got != tt.want {
				t.Errorf("peer check of server 0 (%d of %d over its span, beside %d peer(s), each %d of %d over its span and 0.2%% for two hours before) = %v, want %v",
					x, n, tt.servers-1, px, pn, got, tt.want)
			}
		})
	}
}

// stepAt steps a backend of servers through secs one-second checks,
// each server answering perSec requests a second and failing rate(sec,
// i) of them, its errors spread evenly; the backend's median must be
// known after them.
func stepAt(t *testing.T, servers int, perSec uint64, secs int, rate func(sec, i int) float64) (*Sequential, []*SeqServer, []bool) {
	t.Helper()
	q := NewSequential(DefaultConfig())
	srv, in, serving := backendOf(servers)
	owed := make([]float64, servers)
	var idx []int
	for sec := range secs {
		for i := range servers {
			in[i] = Counts{N: perSec, X: evenErrors(&owed[i], perSec, rate(sec, i))}
		}
		idx = q.Step(1, srv, in, serving, idx)
	}
	if !q.known {
		t.Fatalf("the backend's median is not known after %d s", secs)
	}
	return q, srv, serving
}
