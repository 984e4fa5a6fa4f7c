package rules

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSPRTErrorsAndCost runs the re-admission test many times on
// simulated chunks (a server at a reduced weight: chunk requests a
// step), and checks Wald's bounds: a healthy server found faulty in at
// most about alpha of the runs, a still-faulty one found healthy in at
// most about beta, and the mean 5xx a still-faulty server pays before
// the verdict under ErrorBound.
func TestSPRTErrorsAndCost(t *testing.T) {
	tests := []struct {
		name           string
		p0, p1, pf     float64
		chunk          uint64
		alpha, beta    float64
		runs           int
		wantMinFaultyX float64 // the mean cost is at least this: the bound is not met by a test that never looks
	}{
		{"5% fault, weight 4 of 16 at 10 req/s, 10 s steps", 0.005, 0.05, 0.05, 100, 1e-3, 1e-3, 4000, 2},
		{"5% fault, chunks of 8 requests (1 s checks)", 0.005, 0.05, 0.05, 8, 1e-3, 1e-3, 4000, 2},
		{"5% fault, chunks of 400", 0.005, 0.05, 0.05, 400, 1e-3, 1e-3, 2000, 2},
		{"5% fault, one request a chunk", 0.005, 0.05, 0.05, 1, 1e-3, 1e-3, 4000, 2},
		{"20% fault, chunks of 40", 0.02, 0.2, 0.2, 40, 1e-3, 1e-3, 4000, 1},
		{"1.5% fault, looser errors", 0.0015, 0.015, 0.015, 100, 1e-2, 1e-2, 4000, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			run := func(p float64) (Verdict, uint64) {
				s, err := NewSPRT(tc.p0, tc.p1, tc.alpha, tc.beta)
				if err != nil {
					t.Fatal(err)
				}
				for range 100000 {
					var x uint64
					for range tc.chunk {
						if rng.Float64() < p {
							x++
						}
					}
					if v := s.Feed(tc.chunk, x); v != Undecided {
						return v, s.X
					}
				}
				t.Fatalf("undecided after 100,000 chunks: %+v", s)
				return Undecided, 0
			}
			var wrongHealthy, wrongFaulty int
			var paid float64
			for range tc.runs {
				if v, _ := run(tc.p0); v == Faulty {
					wrongFaulty++
				}
				v, x := run(tc.pf)
				if v == Healthy {
					wrongHealthy++
				}
				paid += float64(x)
			}
			mean := paid / float64(tc.runs)
			s, _ := NewSPRT(tc.p0, tc.p1, tc.alpha, tc.beta)
			bound := s.ErrorBound(tc.pf, float64(tc.chunk))
			// Wald's error bounds hold up to the overshoot; three sigma
			// of the count expected at the bound, plus one, for the
			// sampling.
			limit := func(e float64) int {
				m := e * float64(tc.runs)
				return int(m + 3*math.Sqrt(m) + 1)
			}
			t.Logf("p0 %v p1 %v, %d requests a chunk: faulty at %v: mean %.2f 5xx (bound %.2f), found healthy %d/%d; healthy: found faulty %d/%d", tc.p0, tc.p1, tc.chunk, tc.pf, mean, bound, wrongHealthy, tc.runs, wrongFaulty, tc.runs)
			if mean > bound || mean < tc.wantMinFaultyX {
				t.Errorf("a still-faulty server paid %.2f 5xx on average, bound %.2f", mean, bound)
			}
			if wrongHealthy > limit(tc.beta) {
				t.Errorf("a still-faulty server passed %d of %d times, beta %v", wrongHealthy, tc.runs, tc.beta)
			}
			if wrongFaulty > limit(tc.alpha) {
				t.Errorf("a healthy server failed %d of %d times, alpha %v", wrongFaulty, tc.runs, tc.alpha)
			}
		})
	}
}

func TestNewSPRTRejectsBadRates(t *testing.T) {
	for _, c := range [][4]float64{{0, 0.05, 1e-3, 1e-3}, {0.05, 0.05, 1e-3, 1e-3}, {0.01, 1, 1e-3, 1e-3}, {0.01, 0.05, 0, 1e-3}, {0.01, 0.05, 1e-3, 0.5}, {math.NaN(), 0.05, 1e-3, 1e-3}} {
		if _, err := NewSPRT(c[0], c[1], c[2], c[3]); err == nil {
			t.Errorf("NewSPRT%v: no error", c)
		}
	}
}
