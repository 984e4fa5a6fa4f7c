package soak

import (
	"slices"

	"github.com/hapilot/hapilot/internal/lib/stats"
)

// BinomialInterval is the exact (Clopper-Pearson) two-sided 1-alpha
// interval of a share from k successes in n trials, by bisection on the
// binomial tails.
func BinomialInterval(k, n int, alpha float64) (lo, hi float64) {
	if n <= 0 {
		return 0, 1
	}
	upper := func(p float64) float64 { return stats.BinomialUpperTail(uint64(n), uint64(k), p) }       // P(X >= k)
	below := func(p float64) float64 { return 1 - stats.BinomialUpperTail(uint64(n), uint64(k+1), p) } // P(X <= k)
	lo, hi = 0, 1
	if k > 0 {
		lo = bisect(func(p float64) bool { return upper(p) < alpha/2 })
	}
	if k < n {
		hi = bisect(func(p float64) bool { return below(p) > alpha/2 })
	}
	return lo, hi
}

// bisect finds the p in [0, 1] where below turns from true to false.
func bisect(below func(p float64) bool) float64 {
	a, b := 0.0, 1.0
	for range 60 {
		m := (a + b) / 2
		if below(m) {
			a = m
		} else {
			b = m
		}
	}
	return (a + b) / 2
}

// MedianInterval is a distribution-free interval of the median with at
// least 1-alpha coverage: the order statistics x(j) and x(n+1-j), j the
// largest with P(B < j) <= alpha/2 for B ~ Binomial(n, 1/2). Below six
// values no such j exists: the least and the greatest are given.
func MedianInterval(v []float64, alpha float64) (lo, hi float64) {
	if len(v) == 0 {
		return 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	j := 1
	for c := 2; c <= (n+1)/2; c++ {
		if 1-stats.BinomialUpperTail(uint64(n), uint64(c), 0.5) > alpha/2 {
			break
		}
		j = c
	}
	return s[j-1], s[n-j]
}
