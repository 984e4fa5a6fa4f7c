package stats

import (
	"math"
	"testing"
)

// exact sums the binomial pmf directly, for small n.
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

// bySum is the earlier implementation, the tail summed term by term in
// log space: the reference for moderate n.
func bySum(n, k uint64, p float64) float64 {
	lnN1, _ := math.Lgamma(float64(n) + 1)
	lp, lq := math.Log(p), math.Log1p(-p)
	logPMF := func(i uint64) float64 {
		a, _ := math.Lgamma(float64(i) + 1)
		b, _ := math.Lgamma(float64(n-i) + 1)
		return lnN1 - a - b + float64(i)*lp + float64(n-i)*lq
	}
	mode := float64(n+1) * p
	first := logPMF(k)
	sum := 0.0
	for i := k; i <= n; i++ {
		term := math.Exp(logPMF(i) - first)
		sum += term
		if float64(i) > mode && term < sum*1e-17 {
			break
		}
	}
	return math.Min(math.Exp(first+math.Log(sum)), 1)
}

func close(got, want float64) bool {
	return math.Abs(got-want) <= 1e-9*math.Max(want, 1e-300) || math.Abs(got-want) <= 1e-13
}

func TestBinomialUpperTail(t *testing.T) {
	tests := []struct {
		n, k uint64
		p    float64
	}{
		{10, 0, 0.5}, {10, 5, 0.5}, {10, 10, 0.5}, {12, 12, 1.0 / 6}, {40, 3, 0.01}, {25, 12, 1.0 / 6}, {60, 30, 0.3}, {5, 6, 0.5},
		{15, 6, 0.0625}, {30, 1, 0.9}, {50, 49, 0.99},
	}
	for _, tc := range tests {
		if got, want := BinomialUpperTail(tc.n, tc.k, tc.p), exact(tc.n, tc.k, tc.p); !close(got, want) {
			t.Errorf("P(X>=%d | n=%d p=%v) = %g, want %g", tc.k, tc.n, tc.p, got, want)
		}
	}
	// Moderate n against the term-by-term sum, tails down to 1e-85.
	for _, tc := range []struct {
		n, k uint64
		p    float64
	}{
		{100000, 50000, 0.5}, {3000, 150, 0.2}, {6000, 300, 1.0 / 6}, {870, 11, 0.2}, {20000, 60, 0.001}, {9600, 6, 0.0625},
	} {
		if got, want := BinomialUpperTail(tc.n, tc.k, tc.p), bySum(tc.n, tc.k, tc.p); !close(got, want) {
			t.Errorf("P(X>=%d | n=%d p=%v) = %g, the sum gives %g", tc.k, tc.n, tc.p, got, want)
		}
	}
	if got := BinomialUpperTail(100, 10, 0); got != 0 {
		t.Errorf("p=0: %g", got)
	}
	if got := BinomialUpperTail(100, 10, math.NaN()); got != 0 {
		t.Errorf("p=NaN: %g", got)
	}
}

// Counts near 2^31 (2,001 counted lines of 2^20 responses each) give a
// finite probability with bounded work, on both sides of the mean.
func TestBinomialUpperTailHugeCounts(t *testing.T) {
	const n = 2001 << 20
	for _, tc := range []struct {
		k    uint64
		p    float64
		want func(float64) bool
	}{
		{n / 2, 0.5, func(v float64) bool { return math.Abs(v-0.5) < 0.01 }},
		{n / 4, 0.5, func(v float64) bool { return v == 1 }},
		{n / 10, 0.01, func(v float64) bool { return v == 0 }},
		{n/100 + 200000, 0.01, func(v float64) bool { return v < 1e-6 }},
	} {
		if got := BinomialUpperTail(n, tc.k, tc.p); math.IsNaN(got) || !tc.want(got) {
			t.Errorf("P(X>=%d | n=%d p=%v) = %g", tc.k, uint64(n), tc.p, got)
		}
	}
}

// BenchmarkBinomialHuge is the rule test's cost on counts near 2^31; the
// term-by-term sum took tens of seconds a step on them.
func BenchmarkBinomialHuge(b *testing.B) {
	for i := 0; i < b.N; i++ {
		BinomialUpperTail(2001<<20, 2001<<19+1000, 0.5)
	}
}
