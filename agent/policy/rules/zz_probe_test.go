package rules

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestZZColdDetect(t *testing.T) {
	for _, tt := range []struct {
		rate  float64
		rates []float64
	}{
		{33, []float64{0.05, 0.002, 0.002}},
		{5, []float64{0.05, 0.002, 0.002}},
		{33, []float64{0.05, 0.002, 0.002, 0.002, 0.002, 0.002, 0.002, 0.002, 0.002}},
		{33, []float64{0.02, 0.002, 0.002}},
		{5, []float64{0.2, 0.002, 0.002}},
		{1, []float64{0.05, 0.002, 0.002}},
		{33, []float64{0.05, 0.01, 0.01}},
		{50, []float64{0.05, 0.0, 0.0, 0.0}},
	} {
		var ds []float64
		for seed := range uint64(200) {
			rng := rand.New(rand.NewPCG(seed, 31))
			q := NewSequential(DefaultConfig())
			srv, in, serving := backendOf(len(tt.rates))
			var idx []int
			d := -1.0
			for sec := range 3600 {
				idx = stepAtRates(q, rng, tt.rate, tt.rates, srv, in, serving, idx)
				if slices.Contains(idx, 0) {
					d = float64(sec + 1)
					break
				}
			}
			ds = append(ds, d)
		}
		slices.Sort(ds)
		miss := 0
		for _, d := range ds {
			if d < 0 {
				miss++
			}
		}
		fmt.Printf("COLD %g req/s %v: median %.0f p90 %.0f missed %d\n", tt.rate, tt.rates[:min(3, len(tt.rates))], ds[100], ds[180], miss)
	}
}
