// Package stats holds the small statistical tests the policies use.
package stats

import "math"

// BinomialUpperTail is P(X >= k) for X ~ Binomial(n, p), through the
// regularized incomplete beta function: P(X >= k) = I_p(k, n-k+1). Its
// continued fraction converges in about the square root of n steps and is
// capped, so the work is bounded whatever counts the windows hold (summing
// the tail term by term took tens of seconds on counts near 2^31).
func BinomialUpperTail(n, k uint64, p float64) float64 {
	switch {
	case k == 0:
		return 1
	case k > n || p <= 0 || math.IsNaN(p):
		return 0
	case p >= 1:
		return 1
	}
	return regIncBeta(float64(k), float64(n-k+1), p)
}

// regIncBeta is I_x(a, b), evaluated by the continued fraction on the
// side where it converges fast (Numerical Recipes, 6.4).
func regIncBeta(a, b, x float64) float64 {
	la, _ := math.Lgamma(a)
	lb, _ := math.Lgamma(b)
	lab, _ := math.Lgamma(a + b)
	front := math.Exp(lab - la - lb + a*math.Log(x) + b*math.Log1p(-x))
	var r float64
	if x < (a+1)/(a+b+2) {
		r = front * betaCF(a, b, x) / a
	} else {
		r = 1 - front*betaCF(b, a, 1-x)/b
	}
	return math.Min(math.Max(r, 0), 1)
}

// maxCFSteps bounds the continued fraction: about the square root of the
// largest count it meets (2^42 and more) with room to spare.
const maxCFSteps = 1 << 22

// betaCF is the continued fraction of the incomplete beta, by the
// modified Lentz method.
func betaCF(a, b, x float64) float64 {
	const eps, tiny = 1e-15, 1e-300
	clamp := func(v float64) float64 {
		if math.Abs(v) < tiny {
			return tiny
		}
		return v
	}
	qab, qap, qam := a+b, a+1, a-1
	c, d := 1.0, 1/clamp(1-qab*x/qap)
	h := d
	for m := 1.0; m <= maxCFSteps; m++ {
		m2 := 2 * m
		aa := m * (b - m) * x / ((qam + m2) * (a + m2))
		d = 1 / clamp(1+aa*d)
		c = clamp(1 + aa/c)
		h *= d * c
		aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
		d = 1 / clamp(1+aa*d)
		c = clamp(1 + aa/c)
		del := d * c
		h *= del
		if math.Abs(del-1) < eps {
			break
		}
	}
	return h
}
