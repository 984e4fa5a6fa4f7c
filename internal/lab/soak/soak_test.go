package soak

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent/policy/rules"
)

func cell(servers int, rate float64) Cell {
	return Cell{Servers: servers, Rate: rate, Noise: 0.002, Seeds: []uint64{1, 2}, Trials: 10,
		Warmup: time.Hour, DrainFor: 30 * time.Second, Config: rules.DefaultConfig()}
}

// TestShortSoak: a few hundred server-days of the noise models
// through the sequential test, and a fault found near the bound; the
// windowed test, on the same heterogeneous fleet, drains healthy servers (so the soak
// can tell a bad test from a good one).
func TestShortSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("a few seconds of simulation")
	}
	bursts := cell(9, 33)
	bursts.Bursts, bursts.ServerDays = Bursts{EveryHours: 6, Min: 3, Max: 10}, 150*scale
	// at 300 req/s a burst holds about as much evidence as h: the burst
	// allowance must still forgive it
	bursts300 := cell(9, 300)
	bursts300.Bursts, bursts300.ServerDays = bursts.Bursts, 60*scale
	hetero := cell(9, 300)
	hetero.Hetero, hetero.ServerDays = 0.3, 60*scale
	large := cell(100, 5)
	large.ServerDays = 200 * scale
	fault := cell(9, 33)
	fault.Fault, fault.Warmup, fault.Trials = 0.05, 2*time.Hour, 40
	// The windowed test on the heterogeneous fleet at 300 req/s (issue
	// 37: about 50 false drains a server-day): one seed, one day of nine
	// servers, for the windowed test is the slow one.
	windowed := hetero
	windowed.Windowed, windowed.ServerDays, windowed.Seeds = true, 9, []uint64{1}
	tests := []struct {
		name      string
		c         Cell
		maxFalse  int     // at most this many false drains
		minFalse  int     // at least
		maxDetect float64 // median time to detect over the bound, at most
		// plus the minimum duration's cost: a window of MinDuration and
		// a chunk, taken out beyond its credit
	}{
		{"bursts of 3-10 errors every 6 h", bursts, 0, 0, 0},
		{"bursts of 3-10 errors every 6 h at 300 req/s", bursts300, 0, 0, 0},
		{"heterogeneous, sigma 0.3, 300 req/s", hetero, 0, 0, 0},
		{"N=100 at 5 req/s", large, 0, 0, 0},
		{"a 5% fault after two steady hours", fault, 0, 0, 1.5},
		{"the windowed test on the same heterogeneous fleet", windowed, 1 << 30, 10, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Run(tt.c, 2)
			if err != nil {
				t.Fatal(err)
			}
			if r.FalseDrains > tt.maxFalse || r.FalseDrains < tt.minFalse {
				t.Errorf("%d false drains in %.0f server-days, want %d to %d", r.FalseDrains, r.ServerDays, tt.minFalse, tt.maxFalse)
			}
			if tt.c.Fault > 0 {
				if r.Missed > 0 {
					t.Errorf("%d of %d faults missed", r.Missed, r.Trials)
				}
				cost := tt.c.Config.MinDuration.Seconds() + 1
				if r.DetectMedian > tt.maxDetect*r.Bound+cost {
					t.Errorf("median %.1f s, over %.1f x the bound %.1f s and the minimum duration's %.0f s", r.DetectMedian, tt.maxDetect, r.Bound, cost)
				}
				if r.FaultFalseDrains > 0 {
					t.Errorf("%d healthy servers drained during the fault trials", r.FaultFalseDrains)
				}
			}
		})
	}
}

func TestPoissonInterval(t *testing.T) {
	// Garwood's exact 95% intervals (Ulm 1990's table).
	for _, tc := range []struct {
		k      int
		lo, hi float64
	}{{0, 0, 3.689}, {1, 0.0253, 5.572}, {3, 0.619, 8.767}, {10, 4.795, 18.39}} {
		lo, hi := PoissonInterval(tc.k, 0.05)
		if math.Abs(lo-tc.lo) > 0.01*max(tc.lo, 0.1) || math.Abs(hi-tc.hi) > 0.01*tc.hi {
			t.Errorf("k=%d: [%.4f, %.4f], want [%.4f, %.4f]", tc.k, lo, hi, tc.lo, tc.hi)
		}
	}
}

func TestBound(t *testing.T) {
	// The figure: ln(2.85e9)/0.114 = 191 requests, 5.8 s at 33 req/s.
	if b := Bound(0.05, 0.002, 33, 1000); math.Abs(b-5.8) > 0.1 {
		t.Errorf("bound %.2f s, want 5.8", b)
	}
}

// TestSoakAgreesWithTheLoop: the real loop (loop.Loop, the rules
// policy, the guardrails, the window store, evidence checks every second
// under Run) drains a 5% server that starts failing after a steady
// state, in about the time the soak finds for the same cell, and no
// healthy one.
func TestSoakAgreesWithTheLoop(t *testing.T) {
	const onset = 600 // seconds after the rig's start
	r, err := newRigWith(9, 1, 33, func(i int, sec int64) float64 {
		if i == 4 && sec >= onset {
			return 0.05
		}
		return 0.002
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tc := &trafficClock{Clock: r.clk, feed: r.feed, fed: r.sec, stop: time.Unix(r.start+onset+120, 0), cancel: cancel}
	r.loop.Clock = tc
	var drainedAt time.Time
	if err := r.loop.Run(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range r.loop.View().Status().Decisions {
		if d.Verdict.Accepted && d.Verdict.Applied.Kind == "drain" {
			if d.Verdict.Applied.Server != "srv4" {
				t.Errorf("healthy %s drained at %v", d.Verdict.Applied.Server, d.Time)
			} else if drainedAt.IsZero() {
				drainedAt = d.Time
			}
		}
	}
	if drainedAt.IsZero() {
		t.Fatal("the faulty server was not drained in 120 s")
	}
	got := drainedAt.Sub(time.Unix(r.start+onset, 0)).Seconds()
	c := cell(9, 33)
	c.Fault, c.Trials, c.Seeds, c.Warmup = 0.05, 40, []uint64{1}, 2*time.Hour
	res, err := Run(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	// One draw against the soak's distribution: within its p90 plus the
	// check's second.
	if got > res.DetectP90+1 {
		t.Errorf("the loop drained at %.0f s after the onset; the soak's p90 is %.1f s", got, res.DetectP90)
	}
	t.Logf("loop: %.0f s; soak: median %.1f s, p90 %.1f s", got, res.DetectMedian, res.DetectP90)
}

func TestBinomialInterval(t *testing.T) {
	// Clopper-Pearson 95% intervals (R's binom.test).
	for _, tc := range []struct {
		k, n   int
		lo, hi float64
	}{{0, 10, 0, 0.3085}, {10, 10, 0.6915, 1}, {5, 10, 0.1871, 0.8129}, {95, 100, 0.8872, 0.9836}} {
		lo, hi := BinomialInterval(tc.k, tc.n, 0.05)
		if math.Abs(lo-tc.lo) > 0.001 || math.Abs(hi-tc.hi) > 0.001 {
			t.Errorf("%d/%d: [%.4f, %.4f], want [%.4f, %.4f]", tc.k, tc.n, lo, hi, tc.lo, tc.hi)
		}
	}
}

func TestMedianInterval(t *testing.T) {
	v := make([]float64, 100)
	for i := range v {
		v[i] = float64(100 - i) // 1..100, unsorted
	}
	// n=100: the order statistics 40 and 61 (P(B < 40) = 0.018)
	if lo, hi := MedianInterval(v, 0.05); lo != 40 || hi != 61 {
		t.Errorf("[%v, %v], want [40, 61]", lo, hi)
	}
	if lo, hi := MedianInterval([]float64{3, 1, 2}, 0.05); lo != 1 || hi != 3 {
		t.Errorf("three values: [%v, %v], want [1, 3]", lo, hi)
	}
}
