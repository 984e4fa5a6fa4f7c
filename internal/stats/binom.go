// Package stats holds the small statistical tests the policies use.
package stats

import "math"

// BinomialUpperTail is P(X >= k) for X ~ Binomial(n, p), summed in log
// space so that large n neither overflows nor loses the tail.
func BinomialUpperTail(n, k uint64, p float64) float64 {
	switch {
	case k == 0:
		return 1
	case k > n || p <= 0:
		return 0
	case p >= 1:
		return 1
	}
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
	r := math.Exp(first + math.Log(sum))
	if r > 1 {
		r = 1
	}
	return r
}
