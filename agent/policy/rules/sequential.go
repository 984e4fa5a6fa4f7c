package rules

import (
	"math"
	"slices"
)

// The sequential test: a CUSUM (Page 1954) of the binomial log-likelihood
// ratio of each server's new requests, run on every chunk of evidence the
// loop reads (about one a second).
//
// Why sequential: the windowed test (Test) ran every second on a 60 s
// window at a per-step alpha, so its false alarms added up over 86,400
// correlated tests a day, and a fault that begins mid-window was diluted
// by a minute of healthy history. A CUSUM accumulates evidence from the
// change on, and its threshold h bounds the mean time between false
// alarms at e^h chunks (Lorden 1971) whatever the traffic.
//
// The hypotheses, per server and chunk:
//
//	H0: the server fails at p0, the larger of the backend's healthy median
//	    (the lower median of the servers' long baselines) and an upper
//	    bound of its own long baseline, but never above half of p1min: a
//	    server that has always been a little worse than its peers is not
//	    degraded, and a healthy fleet's spread cannot convict it.
//	H1: the server fails at p1 = p1min × m, for m in a small bank
//	    (1, 3, 10, 30), where p1min = max(Floor, Ratio × healthy median)
//	    is the operator's "degraded": above an absolute floor and a
//	    ratio of the backend's healthy median. A bank of CUSUMs stands for
//	    the GLR over the fault's unknown size (Lai 1995): the threshold
//	    grows by ln(bank size), the delay is within a few percent of the
//	    CUSUM tuned to the fault.
//
// Each chunk's contribution is capped at BurstCap·h, so that one burst of
// errors (a restart, a GC pause) cannot convict: it takes evidence that
// persists over several chunks. Unless the chunk holds more errors than
// a burst can bring: then it counts what it would say with BurstErrors
// errors fewer (the largest burst forgiven), if that is more; and so for
// the last 2 to poolChunks chunks pooled, from the CUSUM before them. A
// burst (at most BurstErrors errors within one second, so over two
// one-second chunks at most) is forgiven in every span that holds it, and
// adds at most BurstCap·h a chunk through the cap; forgiving errors only
// lowers a span's evidence, so on healthy traffic the statistic stays
// under the uncapped CUSUM, whose false alarms Lorden's bound counts.
// A fault at 20% and 300 req/s (60 errors a second) is no longer held to
// four chunks, nor one at 5% and 300 req/s (15 a second) to three.
//
// A server whose CUSUM crosses h is condemned only if its errors over
// the last recentChunks chunks are also above Floor and Ratio times the
// lower median of its serving peers' over the same chunks: a fleet-wide
// failure, where every server fails alike, drains nothing, and a second
// faulty peer cannot hide the first (the lower median ignores up to half
// the peers).

// bank is the multiples of p1min the CUSUMs test.
var bank = [...]float64{1, 3, 10, 30}

const (
	// recentChunks is the span of the peer check and of the peers' rate
	// now, in chunks.
	recentChunks = 40
	// refreshEvery: the backend's healthy median and each server's
	// coefficients are recomputed every this many chunks: baselines move
	// over hours, and the per-chunk update is then a multiply-add.
	refreshEvery = 30
	// minBaseline is the fewest requests a server's baseline must weigh
	// to count in the backend's healthy median.
	minBaseline = 1000
	// minPeerRequests: the peers' rate now is trusted from this many
	// recent requests.
	minPeerRequests = 100
	// maxP1 bounds an alternative below certainty (its log would be -Inf).
	maxP1 = 0.6
	// poolChunks: the burst allowance also pools the last 2 to this many
	// chunks, so that a fault with fewer errors a chunk than a burst but
	// more over a few chunks (20% at 33 req/s: 6.6 a second) is not held
	// to the cap either. Four: past four chunks the cap alone reaches h.
	poolChunks = 4
)

// Counts are one chunk's new requests and 5xx of one server.
type Counts struct{ N, X uint64 }

// SeqServer is the sequential test's state for one server.
type SeqServer struct {
	// S is the CUSUM of each alternative of the bank.
	S [len(bank)]float64
	// en, ex: the server's long baseline, exponentially weighted sums of
	// its requests and 5xx (time constant BaselineSpan), fed only while
	// the server is under no suspicion, so that a fault does not teach
	// the baseline that it is normal.
	en, ex float64
	// a, b: each alternative's log-likelihood ratio per error and per
	// success against p0, refreshed every refreshEvery chunks.
	a, b   [len(bank)]float64
	p0     float64
	ready  bool
	recent [recentChunks]Counts
	pos    int
	// half: the ring's sums on its even and odd slots, kept as chunks
	// come and go.
	half [2]Counts
	// run counts the chunks since the CUSUMs were last all at zero: the
	// span of the evidence now, Page's estimate of when a change began.
	run int
	// past: the CUSUMs after each of the last poolChunks chunks (at pp
	// the oldest), where a pooled span's evidence starts from.
	past [poolChunks][len(bank)]float64
	pp   int
	// Chunks counts the chunks seen; Flagged is whether the CUSUM is at
	// or over h now.
	Chunks  uint64
	Flagged bool
	// lat is the server's latency baseline (latency.go): kept across
	// drains, as en and ex are.
	lat latBaseline
}

// Max is the largest of the server's CUSUMs.
func (s *SeqServer) Max() float64 {
	m := s.S[0]
	for _, v := range s.S[1:] {
		m = max(m, v)
	}
	return m
}

// P0 is the error rate the server is judged against now.
func (s *SeqServer) P0() float64 { return s.p0 }

// Baseline is the server's long error rate (0 with no history).
func (s *SeqServer) Baseline() float64 {
	if s.en <= 0 {
		return 0
	}
	return s.ex / s.en
}

// Reset forgets the server's evidence but not its baseline: what a drain
// or a re-admission does.
func (s *SeqServer) Reset() {
	s.S = [len(bank)]float64{}
	s.past = [poolChunks][len(bank)]float64{}
	s.recent = [recentChunks]Counts{}
	s.half = [2]Counts{}
	s.run = 0
	s.Flagged = false
}

// lastSum is the server's counts over its last k chunks (k <= recentChunks).
func (s *SeqServer) lastSum(k int) (n, x uint64) {
	for j := range k {
		c := s.recent[(s.pos-1-j+2*recentChunks)%recentChunks]
		n += c.N
		x += c.X
	}
	return n, x
}

// Sequential is the test of one backend: its servers' states and the
// backend's healthy median. The soak (internal/lab/soak) drives it with
// simulated counts exactly as Policy does with the windows' counts.
type Sequential struct {
	cfg     Config
	h, cap  float64
	median  float64
	chunks  uint64
	scratch []float64
	peers   []Counts
	order   []int
	ea, eb  [len(bank)]float64
}

// NewSequential returns the test of one backend under cfg.
func NewSequential(cfg Config) *Sequential {
	h := cfg.Threshold()
	return &Sequential{cfg: cfg, h: h, cap: cfg.BurstCap * h}
}

// Threshold is the CUSUM's h: ln of the mean chunks between false alarms
// a server may have (ARLDays of one-second chunks), plus ln of the bank's
// size, which keeps that bound for the bank as a whole.
func (c Config) Threshold() float64 {
	return math.Log(c.ARLDays*86400) + math.Log(float64(len(bank)))
}

// H is the threshold in use.
func (q *Sequential) H() float64 { return q.h }

// Median is the backend's healthy median rate as last computed.
func (q *Sequential) Median() float64 { return q.median }

// P1Min is the smallest error rate the test calls degraded now.
func (q *Sequential) P1Min() float64 { return max(q.cfg.Floor, q.cfg.DegradedRatio*q.median) }

// Step feeds one chunk of dt seconds: in[i] is the new counts of srv[i],
// serving[i] whether it takes traffic (a server that does not is reset
// and left out). It sets each server's Flagged and returns the indexes
// of the servers it condemns: CUSUM at or over h, and the peer check
// passed.
func (q *Sequential) Step(dt float64, srv []*SeqServer, in []Counts, serving []bool, out []int) []int {
	out = out[:0]
	if q.chunks%refreshEvery == 0 {
		q.refresh(srv, serving)
	}
	q.chunks++
	w := 1.0
	if q.cfg.BaselineSpan > 0 {
		w = math.Exp(-dt / q.cfg.BaselineSpan.Seconds())
	}
	// First the recent rings, for the peers' rate now.
	for i, s := range srv {
		if !serving[i] {
			if s.Flagged || s.Chunks > 0 {
				s.Reset()
				s.Chunks = 0
			}
			continue
		}
		s.Chunks++
		h, old := &s.half[s.pos%2], s.recent[s.pos]
		h.N, h.X = h.N-old.N+in[i].N, h.X-old.X+in[i].X
		s.recent[s.pos] = in[i]
		s.pos = (s.pos + 1) % recentChunks
	}
	peers := q.peerRate(srv, serving)
	quiet := q.h / 3
	for i, s := range srv {
		if !serving[i] {
			continue
		}
		c := in[i]
		if !s.ready {
			q.coefficients(s)
		}
		a, b := &s.a, &s.b
		if peers > s.p0 {
			// The peers fail more than this server's H0 now: a
			// fleet-wide failure, judged against the peers' rate (the
			// coefficients of this chunk only).
			a, b = q.elevated(peers)
		}
		// The fast path: no error and no evidence held; each alternative's
		// successes only lower a CUSUM at zero.
		top := 0.0
		if c.X != 0 || s.S != [len(bank)]float64{} {
			x, ok := float64(c.X), float64(c.N-min(c.X, c.N))
			// Past the burst's errors: what the chunk would say had a
			// whole burst landed in it (BurstErrors errors fewer).
			burst := uint64(q.cfg.BurstErrors)
			d := float64(min(c.X, burst))
			// The same over the last w chunks pooled, from the CUSUM
			// before them: one burst forgiven in each span.
			var wn, wx [poolChunks + 1]float64
			if burst > 0 {
				for w := 2; w <= poolChunks; w++ {
					pn, px := s.lastSum(w)
					wn[w], wx[w] = float64(pn), float64(px)
				}
			}
			for k := range s.S {
				l := min(x*a[k]+ok*b[k], q.cap)
				if x > d && d > 0 {
					l = max(l, (x-d)*a[k]+(ok+d)*b[k])
				}
				v := s.S[k] + l
				for w := 2; w <= poolChunks; w++ {
					if wx[w] > float64(burst) && burst > 0 {
						e := wx[w] - float64(burst)
						from := s.past[(s.pp+poolChunks-w)%poolChunks][k]
						v = max(v, from+e*a[k]+(wn[w]-wx[w]+float64(burst))*b[k])
					}
				}
				s.S[k] = max(0, v)
				top = max(top, s.S[k])
			}
		}
		s.past[s.pp] = s.S
		s.pp = (s.pp + 1) % poolChunks
		if top < quiet {
			s.en = s.en*w + float64(c.N)
			s.ex = s.ex*w + float64(c.X)
		}
		if top == 0 {
			s.run = 0
		} else {
			s.run++
		}
		s.Flagged = top >= q.h
		if s.Flagged && q.peerCheck(srv, serving, i) {
			out = append(out, i)
		}
	}
	return out
}

// peerRate is the backend's error rate now: the pooled recent counts of
// the better half of the serving servers (the lower N/2, at least one),
// so that faults on up to half of them leave it alone (two of three
// faulty included) and a fleet-wide failure raises it within seconds.
// The half is chosen on the ring's even chunks and pooled on its odd
// ones: chosen and measured on the same counts, the better half of a
// fleet failing alike reads low (its members were picked for their luck).
func (q *Sequential) peerRate(srv []*SeqServer, serving []bool) float64 {
	q.peers = q.peers[:0]
	for i, s := range srv {
		if serving[i] {
			q.peers = append(q.peers, s.half[0], s.half[1])
		}
	}
	n := len(q.peers) / 2
	if n < 2 {
		return 0 // no peer: the server's own baseline alone
	}
	q.order = q.order[:0]
	for i := range n {
		q.order = append(q.order, i)
	}
	slices.SortFunc(q.order, func(i, j int) int {
		a, b := q.peers[2*i], q.peers[2*j]
		// a.X/a.N < b.X/b.N without division; no request sorts last
		l, r := a.X*b.N, b.X*a.N
		switch {
		case a.N == 0 && b.N == 0:
			return 0
		case a.N == 0:
			return 1
		case b.N == 0:
			return -1
		case l < r:
			return -1
		case l > r:
			return 1
		}
		return 0
	})
	var tn, tx uint64
	for _, i := range q.order[:n/2] {
		tn += q.peers[2*i+1].N
		tx += q.peers[2*i+1].X
	}
	// Only a rate beyond the healthy median's noise (three sigma of the
	// errors it would give) counts: otherwise a quiet backend's few
	// errors would lift every H0 and slow the detection of a real fault.
	// Past that, the estimate itself, not a lower bound of it: a bound
	// reads a fleet failing at 5% on a few requests as 2%, against which
	// 5% is still evidence.
	expect := float64(tn) * max(q.median, 1e-4)
	if tn < minPeerRequests || float64(tx) <= expect+3*math.Sqrt(expect)+1 {
		return 0
	}
	return float64(tx) / float64(tn)
}

// elevated is the coefficients against the peers' rate r: H0 at r, the
// alternatives DegradedRatio and more times it.
func (q *Sequential) elevated(r float64) (a, b *[len(bank)]float64) {
	p1min := max(q.cfg.Floor, q.cfg.DegradedRatio*r)
	for k, m := range bank {
		p1 := min(p1min*m, maxP1)
		p0 := min(r, p1/2)
		q.ea[k] = math.Log(p1 / p0)
		q.eb[k] = math.Log((1 - p1) / (1 - p0))
	}
	return &q.ea, &q.eb
}

// refresh recomputes the healthy median and every serving server's
// coefficients.
func (q *Sequential) refresh(srv []*SeqServer, serving []bool) {
	q.scratch = q.scratch[:0]
	for i, s := range srv {
		if serving[i] && s.en >= minBaseline {
			q.scratch = append(q.scratch, s.ex/s.en)
		}
	}
	q.median = lowerMedian(q.scratch)
	for i, s := range srv {
		if serving[i] {
			q.coefficients(s)
		}
	}
}

// coefficients sets s's p0 and each alternative's log-likelihood ratios.
func (q *Sequential) coefficients(s *SeqServer) {
	p1min := q.P1Min()
	own := 1.0 // no history: judged against the cap below
	if s.en > 0 {
		// An upper bound of the baseline (about 3 sigma of its errors):
		// the estimate's own noise must not read as a change.
		own = (s.ex + 3*math.Sqrt(s.ex) + 3) / s.en
	}
	p0 := min(max(q.median, own), p1min/2)
	s.p0 = p0
	for k, m := range bank {
		p1 := min(p1min*m, maxP1)
		s.a[k] = math.Log(p1 / p0)
		s.b[k] = math.Log((1 - p1) / (1 - p0))
	}
	s.ready = true
}

// peerCheck: server i's errors since its evidence began (its last run
// of chunks, at most recentChunks) are above Floor and Ratio times the
// lower median of its serving peers' rates over the same chunks. Over
// the same chunks: when every server begins to fail at once, each one's
// new errors are compared with its peers' new errors, not with their
// history. With no serving peer, only the floor applies.
func (q *Sequential) peerCheck(srv []*SeqServer, serving []bool, i int) bool {
	k := min(max(srv[i].run, 1), recentChunks)
	n, x := srv[i].lastSum(k)
	if n == 0 {
		return false
	}
	rate := float64(x) / float64(n)
	if rate < q.cfg.Floor {
		return false
	}
	q.scratch = q.scratch[:0]
	for j, s := range srv {
		if j != i && serving[j] {
			pn, px := s.lastSum(k)
			if pn > 0 {
				q.scratch = append(q.scratch, float64(px)/float64(pn))
			}
		}
	}
	return rate >= q.cfg.DegradedRatio*lowerMedian(q.scratch)
}

// lowerMedian is the median of v, the lower of the two middle values for
// an even count; 0 for none. It sorts v.
func lowerMedian(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[(len(v)-1)/2]
}
