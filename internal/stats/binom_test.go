package stats

import (
	"math"
	"testing"
)

// exact sums the binomial pmf directly with big-enough float64 for small n.
func exact(n, k uint64, p float64) float64 {
	s := 0.0
	for i := k; i <= n; i++ {
		c := 1.0
		for j := uint64(0); j < i; j++ {
			c *= float64(n-j) / float64(j+1)
		}
		s += c * math.Pow(p, float64(i)) * math.Pow(1-p, float64(n-i))
	}
	return s
}

func TestBinomialUpperTail(t *testing.T) {
	tests := []struct {
		n, k uint64
		p    float64
	}{
		{10, 0, 0.5}, {10, 5, 0.5}, {10, 10, 0.5}, {12, 12, 1.0 / 6}, {40, 3, 0.01}, {25, 12, 1.0 / 6}, {60, 30, 0.3}, {5, 6, 0.5},
	}
	for _, tc := range tests {
		got, want := BinomialUpperTail(tc.n, tc.k, tc.p), exact(tc.n, tc.k, tc.p)
		if math.Abs(got-want) > 1e-9*math.Max(want, 1e-300) && math.Abs(got-want) > 1e-15 {
			t.Errorf("P(X>=%d | n=%d p=%v) = %g, want %g", tc.k, tc.n, tc.p, got, want)
		}
	}
	if got := BinomialUpperTail(100000, 50000, 0.5); math.Abs(got-0.5) > 0.01 {
		t.Errorf("large n: %g", got)
	}
	if got := BinomialUpperTail(100, 10, 0); got != 0 {
		t.Errorf("p=0: %g", got)
	}
}
