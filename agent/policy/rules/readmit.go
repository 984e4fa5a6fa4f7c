package rules

import (
	"fmt"
	"math"
)

// Re-admission's test: Wald's sequential probability ratio test (SPRT) of
// the same binomial log-likelihood ratio the CUSUM of sequential.go sums,
// on the live traffic of a server coming back at a reduced weight.
//
// The CUSUM asks "has a healthy server changed?" and must stay quiet for
// 1,000 days; a server coming back asks a different question, with two
// answers wanted soon: "healthy again (p0)" or "still at the rate it was
// drained for (p1)". The SPRT answers it with both errors bounded (Wald
// 1945): it says Faulty when the ratio reaches A = ln((1-β)/α) and Healthy
// when it falls to B = ln(β/(1-α)), so that a healthy server is sent back
// to drain with probability at most about α, and a still-faulty one passes
// with probability at most about β. Its expected cost to a still-faulty
// server is bounded too (ErrorBound).

// Verdict is what the SPRT says so far.
type Verdict int

const (
	// Undecided: keep feeding it.
	Undecided Verdict = iota
	// Healthy: the traffic is at p0's level (the lower threshold).
	Healthy
	// Faulty: the traffic is still at p1's level (the upper threshold).
	Faulty
)

func (v Verdict) String() string {
	switch v {
	case Healthy:
		return "healthy"
	case Faulty:
		return "faulty"
	}
	return "undecided"
}

// SPRT is one run of the test. The zero value is not usable: NewSPRT.
type SPRT struct {
	P0, P1 float64 // the healthy rate and the drained one
	A, B   float64 // the upper (faulty) and lower (healthy) thresholds
	a, b   float64 // the ratio's step per error and per success
	// LLR is the log-likelihood ratio of p1 against p0 so far; N and X
	// the requests and 5xx it was fed.
	LLR  float64
	N, X uint64
}

// NewSPRT tests p0 against p1 (0 < p0 < p1 < 1) with errors alpha (a
// healthy server found faulty) and beta (a faulty server found healthy).
func NewSPRT(p0, p1, alpha, beta float64) (SPRT, error) {
	if !(p0 > 0 && p0 < p1 && p1 < 1) || !(alpha > 0 && alpha < 0.5) || !(beta > 0 && beta < 0.5) {
		return SPRT{}, fmt.Errorf("sprt: want 0 < p0 %v < p1 %v < 1 and alpha %v, beta %v in (0, 0.5)", p0, p1, alpha, beta)
	}
	return SPRT{P0: p0, P1: p1, A: math.Log((1 - beta) / alpha), B: math.Log(beta / (1 - alpha)),
		a: math.Log(p1 / p0), b: math.Log((1 - p1) / (1 - p0))}, nil
}

// Feed adds a chunk of n requests with x 5xx and says where the test
// stands. Once decided, it stays decided.
func (s *SPRT) Feed(n, x uint64) Verdict {
	if v := s.Verdict(); v != Undecided {
		return v
	}
	x = min(x, n)
	s.N += n
	s.X += x
	s.LLR += float64(x)*s.a + float64(n-x)*s.b
	return s.Verdict()
}

// Verdict is the test's answer so far.
func (s *SPRT) Verdict() Verdict {
	switch {
	case s.LLR >= s.A:
		return Faulty
	case s.LLR <= s.B:
		return Healthy
	}
	return Undecided
}

// KL is the ratio's mean step per request for a server failing at p: its
// drift, positive when p is nearer p1.
func (s *SPRT) KL(p float64) float64 { return p*s.a + (1-p)*s.b }

// ErrorBound is the most 5xx a server still failing at pf (KL(pf) > 0)
// pays, on average, before the test says Faulty, when each chunk fed
// holds chunk requests. By Wald's identity the ratio at the stop is
// E[N]·KL(pf) on average. It stops past A by less than the last chunk's
// errors times a (its successes only lower it), and the chunk that
// crosses holds at least one error: pf·chunk + 1 on average, the
// size-biased draw of a Poisson count. So E[N] <= (A + a·(pf·chunk +
// 1))/KL(pf) and E[5xx] = pf·E[N]. The chunk is where the reduced weight
// enters: a server at a share w of its traffic, r requests a second at
// full weight, judged every d seconds, is fed chunks of w·r·d. A stop at
// B instead (probability under β) ends lower still, so the bound holds
// for every stop; TestSPRTErrorsAndCost checks it by simulation.
func (s *SPRT) ErrorBound(pf, chunk float64) float64 {
	kl := s.KL(pf)
	if kl <= 0 {
		return math.Inf(1)
	}
	return pf * (s.A + s.a*(pf*chunk+1)) / kl
}
