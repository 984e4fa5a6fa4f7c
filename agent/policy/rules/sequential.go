package rules

import (
	"math"
	"slices"

	"github.com/hapilot/hapilot/internal/lib/stats"
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
// The regions, in the operator's terms (regions.go), per backend whose
// healthy median (the lower median of the servers' long baselines) is m:
//
//	healthy:  at most max(HealthyFloor, HealthyRatio × m)  (0.5%, 3×)
//	degraded: at least max(Floor, DegradedRatio × m)       (1%, 6×)
//	the zone: between them.
//
// The hypotheses, per server and chunk:
//
//	H0: the server fails at p0, the larger of the backend's healthy median
//	    and an upper bound of its own long baseline, but never above the
//	    healthy region's upper end: that end is the null's least
//	    favourable point, so a server anywhere in the healthy region has
//	    a negative drift, whatever the fleet's spread; a server with no
//	    history is judged at that point.
//	H1: the server fails at p1 = p1min × m, for m in a small bank
//	    (1, 3, 10, 30), p1min the degraded region's lower end. A bank of
//	    CUSUMs stands for the GLR over the fault's unknown size (Lai
//	    1995): the threshold grows by ln(bank size), the delay is within a
//	    few percent of the CUSUM tuned to the fault.
//
// Degraded means sustained. A burst of errors shorter than MinDuration
// touches at most W chunks (window), whatever its size and however it is
// spread. Each CUSUM keeps its own values over the last W chunks, and a
// chunk whose window (S now less S W chunks ago) brought more than
// windowCredit·h is cut back to bring exactly that: a burst adds at most
// the credit, and the rest of h must come from outside it, from healthy
// traffic only, a chance of about e^-(1-windowCredit)h a burst. The cut
// lasts W chunks in a row at most, and W a burst in an episode (which
// ends with a whole window uncut and the statistic back at zero, or with
// a minute of windows that brought no more than the credit), so
// that a sustained fault is forgiven one window's worth at most and
// found about W chunks later (at low traffic, where a cut takes an error
// the fault needs seconds to bring again, later: two windows at 11
// req/s); a fault whose windows bring more than the credit now and then,
// not in a row, is not forgiven longer. A burst that begins after a
// quiet gap (quietGap chunks that brought no evidence) and brings more
// than the credit in its first chunk, or after two windows that brought
// none, is a burst of its own, with W
// chunks of its own, up to episodeBursts in an episode: two
// bursts seconds apart, which Poisson bursts an hour apart make every few
// hundred, are both forgiven. (Before, the cut compared each window with
// the largest before it: once the window slid past a first burst, a
// second one seconds later counted in full, and bursts of 45 errors an
// hour apart drained 31 healthy servers per 1,000 server-days.) A window
// that brings no more than the credit is never cut: a slow fault (2% at 5
// req/s) brings an error or two a window, window after window, and all of
// it counts. Errors that go on for longer than the minimum duration, one
// burst or overlapping ones, are a fault by definition.
//
// The statistic is bounded at h: a refused or delayed drain (the floor,
// the cap, observe mode) leaves a server at h, not hours of evidence
// above it, and after it heals the evidence falls below h as the healthy
// drift takes it down.
//
// Checks more frequent than a second pool their counts into one-second
// chunks: h bounds the false alarms per chunk, and so per unit of time
// whatever --evidence-check is.
//
// A server whose CUSUM reaches h is condemned only if it fails more than
// its serving peers over the same chunks, by a conditional two-sample
// test (peerCheck) that weighs the peers' uncertainty: a fleet-wide
// failure, where every server fails alike, drains nothing at any N from 2
// and any rate, and a second faulty peer cannot hide the first (peers
// significantly above the others are left out). Then, if its rate over
// its evidence's span is not shown above the degraded line, it is in the
// zone: condemned at most once a ZoneEvery, left serving after.

// bank is the multiples of p1min the CUSUMs test.
var bank = [...]float64{1, 3, 10, 30}

const (
	// recentChunks is the span of the peers' rate now, and of the peer
	// check up to that, in chunks.
	recentChunks = 64
	// coarseChunks and coarseBuckets: beyond recentChunks the peer check
	// reads a ring of coarseBuckets buckets of coarseChunks chunks each
	// (17 minutes), so that a fault whose evidence takes minutes (2% at
	// 5 req/s) is compared with its peers over all of it. Capped at 64
	// chunks, the check needed errors a 2% server at 5 req/s rarely makes
	// in a minute: at N=3 it was found in 116 of 200 trials, after a
	// median 1,541 s (hapilot-bench soak --servers 3 --rate 5 --fault 0.02).
	coarseChunks  = 16
	coarseBuckets = 64
	// peerRateChunks: the peers' rate now is read over this many of the
	// last chunks (the ring's first ones), so that a fleet-wide failure
	// lifts it within seconds.
	peerRateChunks = 40
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
	// minChunk is the shortest chunk the test takes, in seconds: checks
	// more frequent than this pool their counts, so that the threshold,
	// set in chunks, bounds the false drains per unit of time whatever
	// the cadence.
	minChunk = 1.0
	// maxSplit bounds the chunks one check is fed as: a check longer than
	// ten minutes (a stalled loop) is fed as longer chunks, not as a
	// stall's worth of work.
	maxSplit = 600
	// maxWindow bounds the minimum duration's window, in chunks.
	maxWindow = 32
	// windowCredit is the share of h that any one window of the minimum
	// duration may bring: a burst inside it adds at most that, and the
	// rest of the evidence must come from outside it.
	windowCredit = 0.2
	// burstTokens and burstRefill: a server may have up to burstTokens
	// bursts forgiven in a row, and one more every burstRefill seconds.
	// Rare bursts (a restart, a deploy, a GC pause: hours apart) are all
	// forgiven; a burst that comes back every minute is a flapping fault.
	burstTokens = 6
	// quietGap and episodeBursts: bursts apart by quietGap chunks that
	// brought no evidence are each forgiven as a burst, up to
	// episodeBursts in an episode (two bursts seconds apart: Poisson
	// bursts an hour apart make a pair every few hundred).
	quietGap      = 3
	episodeBursts = 2
	burstRefill   = 600.0
	// episodeCalm: this many chunks in a row whose window brought no
	// more than the credit end an episode, whatever the statistic. At
	// low traffic the statistic takes minutes to fall back to zero (at
	// 0.5 req/s the smallest alternative's drift takes about 5 minutes
	// from the credit, and a healthy error now and then lifts it again),
	// so that Poisson bursts minutes apart were one episode: the third,
	// or a second whose first check brought less than the credit,
	// counted in full. N=70 at 0.5 req/s, bursts of 17 errors over 4.95 s
	// every 2.76 h: 56 false drains per 1,000 server-days, 8 since (the
	// rest: bursts that overlap). A fault whose windows bring more than
	// the credit (the only kind the cut touches) does so every few
	// seconds; one whose windows stay under it for a minute counts in
	// full meanwhile, and a fresh allowance costs it a window at most
	// (5% at 5 req/s: found in 60.9-67.9 s before, 61.8-67.3 s since).
	episodeCalm = 60
	// ownGapWindows: a burst after this many windows of chunks without
	// evidence is a burst of its own whatever its first chunk brings.
	ownGapWindows = 2
	// peerAlpha is the peer check's level: the chance that a server
	// failing no more than its peers, over the same chunks, passes it.
	peerAlpha = 1e-6
	// degradedAlpha: a condemned server is degraded (not in the zone)
	// when its rate over its evidence's span is above the degraded
	// region's lower end at this level.
	degradedAlpha = 1e-3
)

// Counts are one chunk's new requests and 5xx of one server.
type Counts struct{ N, X uint64 }

// SeqServer is the sequential test's state for one server.
type SeqServer struct {
	// S is the CUSUM of each alternative of the bank, bounded by h.
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
	// window: the sums of the last peerRateChunks entries of recent, by
	// the parity of their place in the ring (recentChunks and
	// peerRateChunks are even, so a place's parity is its chunk's), kept
	// as each chunk is written: peerRate reads every server of a backend
	// at every chunk, and summing 40 chunks each time was half a soak's
	// time.
	window [2]Counts
	// coarse: the last coarseBuckets buckets of the peer check's long
	// span (a ring at cpos), cur the bucket being filled; the buckets'
	// bounds are the backend's (Sequential.chunks), the same for every
	// server, so that a server and its peers are read over the same time.
	coarse [coarseBuckets]Counts
	cpos   int
	cur    Counts
	// loud: a chunk of the bucket held evidence (quiet or more); fed:
	// the bucket went to the baseline as it came (the warm-up). After
	// the warm-up the baseline learns each bucket as it leaves the ring,
	// 17 minutes late, unless it was loud: a slow fault (2% at 5 req/s,
	// whose evidence stays under quiet for minutes) has that long to be
	// found before the baseline takes it for the server's normal.
	loud, fed       [coarseBuckets]bool
	curLoud, curFed bool
	// pend: counts of checks shorter than minChunk, not yet a chunk.
	pend Counts
	// win: each alternative's S over the last chunks of the evidence's
	// run (a ring at wpos, W long), so that S now less its oldest is what
	// the minimum duration's window brought. The episode of bursts under
	// way: cuts, the chunks cut in it, allow, how many it may have cut
	// (W a burst), inRow, the chunks cut in a row now, clean, the chunks
	// since the last cut (W of them end the episode), quiet, the chunks in
	// a row that brought no evidence, gap, the most of them since the
	// last cut, and calm, the chunks in a row whose window brought no
	// more than the credit (episodeCalm of them end the episode).
	// tokened: the burst under way took a token. The tokens are the
	// bursts the server may still have forgiven (burstTokens at most, one
	// back every burstRefill seconds), spent = burstTokens minus tokens
	// so that a new server starts with all of them.
	win     [maxWindow][len(bank)]float64
	wpos    int
	cuts    [len(bank)]int8
	clean   [len(bank)]int8
	inRow   [len(bank)]int8
	allow   [len(bank)]int8
	quiet   [len(bank)]int8
	calm    [len(bank)]int8
	gap     [len(bank)]int8
	tokened [len(bank)]bool
	spent   [len(bank)]float64
	// run counts the chunks since the CUSUMs were last all at zero: the
	// span of the evidence now, Page's estimate of when a change began;
	// runN and runX its requests and 5xx, less those of the runCut
	// chunks a burst's cut touched. A burst forgiven by the minimum
	// duration is no evidence of the server's rate either: counted, a
	// burst inside the span of a server in the zone showed it above the
	// degraded line, and it was drained twice in a day.
	run        int
	runCut     int
	runN, runX uint64
	// Chunks counts the chunks seen; Flagged is whether the CUSUM is at
	// h now.
	Chunks  uint64
	Flagged bool
	// Zone: the server's evidence crossed h, but its rate over the
	// evidence's span is not shown above the degraded region's lower
	// end: it is in the zone. zoneAt is when it was last condemned so
	// (the test's clock, seconds), zoned whether it ever was.
	Zone   bool
	zoneAt float64
	zoned  bool
	// Left: a zone server condemned again within ZoneEvery of the last
	// time: it is left serving, not cycled.
	Left bool
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

// RunCounts are the requests and 5xx over the evidence's span now, less
// those of the chunks a burst's cut touched.
func (s *SeqServer) RunCounts() (n, x uint64) { return s.runN, s.runX }

// Baseline is the server's long error rate (0 with no history).
func (s *SeqServer) Baseline() float64 {
	if s.en <= 0 {
		return 0
	}
	return s.ex / s.en
}

// Reset forgets the server's evidence but not its baseline, nor when it
// was last condemned in the zone: what a drain or a re-admission does.
func (s *SeqServer) Reset() {
	s.S = [len(bank)]float64{}
	s.recent = [recentChunks]Counts{}
	s.window = [2]Counts{}
	s.coarse = [coarseBuckets]Counts{}
	s.loud, s.fed = [coarseBuckets]bool{}, [coarseBuckets]bool{}
	s.cur, s.curLoud, s.curFed = Counts{}, false, false
	s.pend = Counts{}
	s.endRun()
	s.Flagged, s.Zone, s.Left = false, false, false
}

// endRun forgets the run's window and counts.
func (s *SeqServer) endRun() {
	s.win = [maxWindow][len(bank)]float64{}
	s.cuts = [len(bank)]int8{}
	s.clean = [len(bank)]int8{}
	s.inRow = [len(bank)]int8{}
	s.allow = [len(bank)]int8{}
	s.quiet = [len(bank)]int8{}
	s.calm = [len(bank)]int8{}
	s.gap = [len(bank)]int8{}
	s.tokened = [len(bank)]bool{}
	s.run, s.runCut, s.runN, s.runX = 0, 0, 0, 0
}

// span is the server's counts over about its last k chunks: exactly k up
// to recentChunks; beyond, the bucket being filled and as many whole
// buckets before it as cover k, at most coarseBuckets. Every server of
// the backend is read over the same chunks for the same k.
func (q *Sequential) span(s *SeqServer, k int) (n, x uint64) {
	if k <= recentChunks {
		return s.lastSum(k)
	}
	n, x = s.cur.N, s.cur.X
	covered := int(q.chunks % coarseChunks)
	for j := 0; covered < k && j < coarseBuckets; j++ {
		c := s.coarse[(s.cpos-1-j+2*coarseBuckets)%coarseBuckets]
		n += c.N
		x += c.X
		covered += coarseChunks
	}
	return n, x
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
	h       float64
	credit  float64
	w       int
	median  float64
	chunks  uint64
	clock   float64
	pendDt  float64
	split   []Counts // Step's copy of a long check's counts, reused
	scratch []float64
	peers   []Counts
	order   []int
	ea, eb  [len(bank)]float64
}

// NewSequential returns the test of one backend under cfg.
func NewSequential(cfg Config) *Sequential {
	h := cfg.Threshold()
	return &Sequential{cfg: cfg, h: h, credit: windowCredit * h, w: cfg.window()}
}

// window is the minimum duration's window in chunks of minChunk: a burst
// shorter than MinDuration, wherever it falls, touches at most this many.
func (c Config) window() int {
	d := c.MinDuration.Seconds() / minChunk
	return min(max(int(math.Ceil(d-1e-9))+1, 1), maxWindow)
}

// Threshold is the CUSUM's h: ln of the mean chunks between false alarms
// a server may have (ARLDays of one-second chunks), plus ln of the bank's
// size, which keeps that bound for the bank as a whole.
func (c Config) Threshold() float64 {
	return math.Log(c.ARLDays*86400/minChunk) + math.Log(float64(len(bank)))
}

// H is the threshold in use.
func (q *Sequential) H() float64 { return q.h }

// Median is the backend's healthy median rate as last computed.
func (q *Sequential) Median() float64 { return q.median }

// P1Min is the smallest error rate the test calls degraded now.
func (q *Sequential) P1Min() float64 { return q.cfg.DegradedMin(q.median) }

// HealthyMax is the healthy region's upper end now.
func (q *Sequential) HealthyMax() float64 { return q.cfg.HealthyMax(q.median) }

// Step feeds one check of dt seconds: in[i] is the new counts of srv[i],
// serving[i] whether it takes traffic (a server that does not is reset
// and left out). Checks shorter than minChunk pool until they make one.
// It sets each server's Flagged and returns the indexes of the servers
// it condemns: evidence at h, the peer check passed, and not a zone
// server condemned within ZoneEvery of its last time.
func (q *Sequential) Step(dt float64, srv []*SeqServer, in []Counts, serving []bool, out []int) []int {
	out = out[:0]
	for i, s := range srv {
		if !serving[i] {
			if s.Flagged || s.Chunks > 0 || s.pend != (Counts{}) {
				s.Reset()
				s.Chunks = 0
			}
			continue
		}
		s.pend.N += in[i].N
		s.pend.X += min(in[i].X, in[i].N)
	}
	q.pendDt += max(dt, 0)
	if q.pendDt < minChunk-1e-6 {
		// not a chunk yet: the last chunk's verdicts stand
		for i, s := range srv {
			if serving[i] && s.Flagged && !s.Left && q.passes(srv, serving, i) {
				out = append(out, i)
			}
		}
		return out
	}
	dt, q.pendDt = q.pendDt, 0
	// A check longer than two chunks (a step that waited on a model's
	// call, a loop without evidence checks) is fed as that many chunks of
	// a second, its counts spread evenly over them: the minimum duration's
	// window, the tokens and the rings are counted in chunks, and so keep
	// their meaning in seconds whatever the checks' cadence. As one chunk,
	// a 3 s check made the 5-chunk window 15 s long, and a fault was found
	// that much later.
	n := min(max(1, int(dt/minChunk+1e-6)), maxSplit)
	if n == 1 {
		q.chunk(dt, srv, serving)
	} else {
		q.split = q.split[:0]
		for _, s := range srv {
			q.split = append(q.split, s.pend)
		}
		for j := range n {
			for i, s := range srv {
				if serving[i] {
					t := q.split[i]
					s.pend = Counts{N: share(t.N, j, n), X: share(t.X, j, n)}
				}
			}
			q.chunk(dt/float64(n), srv, serving)
		}
	}
	for i, s := range srv {
		if !serving[i] {
			continue
		}
		s.Left = false
		if !s.Flagged {
			s.Zone = false
			continue
		}
		if !q.peerCheck(srv, serving, i) {
			continue
		}
		s.Zone = stats.BinomialUpperTail(s.runN, s.runX, q.P1Min()) >= degradedAlpha
		if s.Zone {
			if s.zoned && q.clock-s.zoneAt < q.cfg.ZoneEvery.Seconds() {
				s.Left = true
				continue
			}
			s.zoned, s.zoneAt = true, q.clock
		}
		out = append(out, i)
	}
	return out
}

// share is the j-th of n near-equal integer parts of t (they sum to t).
func share(t uint64, j, n int) uint64 {
	return t*uint64(j+1)/uint64(n) - t*uint64(j)/uint64(n)
}

// chunk feeds one chunk of dt seconds, each serving server's counts in
// its pend, and sets each server's Flagged.
func (q *Sequential) chunk(dt float64, srv []*SeqServer, serving []bool) {
	q.clock += dt
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
			continue
		}
		s.Chunks++
		// The chunk peerRateChunks back leaves the window's sum of its
		// parity as this one enters it.
		gone := s.recent[(s.pos-peerRateChunks+recentChunks)%recentChunks]
		sum := &s.window[s.pos%2]
		sum.N += s.pend.N - gone.N
		sum.X += s.pend.X - gone.X
		s.recent[s.pos] = s.pend
		s.pos = (s.pos + 1) % recentChunks
		s.cur.N += s.pend.N
		s.cur.X += s.pend.X
		if q.chunks%coarseChunks == 0 {
			if old := s.coarse[s.cpos]; !s.loud[s.cpos] && !s.fed[s.cpos] {
				s.en += float64(old.N) // the baseline, 17 minutes late
				s.ex += float64(old.X)
			}
			s.coarse[s.cpos], s.loud[s.cpos], s.fed[s.cpos] = s.cur, s.curLoud, s.curFed
			s.cur, s.curLoud, s.curFed = Counts{}, false, false
			s.cpos = (s.cpos + 1) % coarseBuckets
		}
	}
	peers := q.peerRate(srv, serving)
	quiet := q.h / 3
	for i, s := range srv {
		if !serving[i] {
			continue
		}
		c := s.pend
		s.pend = Counts{}
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
		for k := range s.spent {
			s.spent[k] = max(0, s.spent[k]-dt/burstRefill)
		}
		top, cut := 0.0, false
		// The fast path: no error and no evidence held; each alternative's
		// successes only lower a CUSUM at zero.
		if c.X != 0 || s.S != [len(bank)]float64{} {
			x, ok := float64(c.X), float64(c.N-c.X)
			// The ring holds each alternative's S over the last W chunks:
			// slot is S a window ago, overwritten with S now.
			slot := &s.win[s.wpos]
			for k := range s.S {
				l := x*a[k] + ok*b[k]
				v := max(0, s.S[k]+l)
				if l <= 0 {
					s.quiet[k] = min(s.quiet[k]+1, ownGapWindows*maxWindow) // counted up to what it is for
					s.gap[k] = max(s.gap[k], s.quiet[k])
				} else {
					s.quiet[k] = 0
				}
				// The minimum duration: gain is what the last W chunks
				// brought.
				gain := v - slot[k]
				if gain <= q.credit {
					s.calm[k] = min(s.calm[k]+1, episodeCalm)
					// No burst under way. A minute without one ends the
					// episode (episodeCalm), and so does a whole window
					// without one with the statistic back at zero: a fault
					// of a few errors a window brings more than the credit
					// in some windows and not in others, and forgiven
					// afresh after each run of quiet windows it was found
					// at 11 req/s in a median 35 s, 19 s before the
					// episodes (TestLowRateFaultForgivenOnce).
					s.tokened[k], s.inRow[k] = false, 0
					if s.clean[k] = min(s.clean[k]+1, int8(q.w)); int(s.clean[k]) >= q.w && v == 0 || s.calm[k] >= episodeCalm {
						s.cuts[k], s.allow[k] = 0, 0
					}
				} else {
					s.calm[k] = 0
					if s.inRow[k] == 0 {
						// A burst begins: the episode's first, or one after
						// a quiet gap (chunks that brought no evidence at
						// all), which is a burst of its own.
						switch {
						case s.cuts[k] == 0:
							s.allow[k] = int8(q.w)
						case q.cfg.everyBurst:
							// slow answers: stalls are each their own burst
							// (a GC pause coming back is the server's
							// normal), however many and however close: a
							// pause's slow answers left out (StallCounts)
							// leave its edges, which may come a check apart
							s.allow[k] = int8(min(int(s.cuts[k])+q.w, math.MaxInt8))
						case s.gap[k] >= quietGap && (l > q.credit || int(s.gap[k]) >= ownGapWindows*q.w):
							// A burst of its own brings more than the
							// credit in its first chunk, or comes after
							// two windows without evidence: a fault of
							// an error or two a second has quiet gaps of
							// a few chunks too, and is not forgiven once
							// more for each (at 11 req/s, 5%, twelve
							// quiet chunks in a row have a chance of
							// e^-6.6, 1 in 700); a burst at low traffic
							// may begin with a check of an error or
							// two, and a second one was not forgiven.
							s.allow[k] = int8(min(int(s.allow[k])+q.w, episodeBursts*q.w))
						}
					}
					if int(s.inRow[k]) < q.w && s.cuts[k] < s.allow[k] {
						// A burst under way: what the window brought
						// beyond the credit is taken out, so that it
						// brings the credit and no more, for W chunks in a
						// row at most (a burst shorter than the minimum
						// duration touches no more), and for W a burst in
						// an episode (chunks cut, with no whole window
						// between them uncut): a fault whose windows bring
						// more than the credit now and then, not in a row,
						// is not forgiven longer than one burst would be.
						excess := gain - q.credit
						if v >= q.h && !s.tokened[k] {
							// Without the cut this burst would convict: it
							// takes one of the server's tokens. Bursts that
							// come back again and again (a flapping fault)
							// run out of them and count in full.
							if q.cfg.everyBurst || s.spent[k] <= burstTokens-1 {
								s.spent[k]++
								s.tokened[k] = true
							} else {
								excess = 0
							}
						}
						v -= excess
						cut = cut || excess > 0
						s.cuts[k]++
						s.inRow[k]++
						s.clean[k], s.gap[k] = 0, 0
					}
				}
				// Otherwise the windows have brought more than the credit
				// for longer than W chunks: not a burst shorter than the
				// minimum duration, and it counts in full.
				v = min(v, q.h) // bounded: the statistic stops at h
				slot[k] = v
				s.S[k] = v
				top = max(top, v)
			}
			s.wpos = (s.wpos + 1) % q.w
		}
		// The baseline: at once in the warm-up (a new server, or one back
		// from a drain, is judged against what it serves), later from the
		// buckets leaving the ring (above); either way only while quiet.
		warm, loud := s.Chunks <= coarseChunks*coarseBuckets, top >= quiet
		switch {
		case warm && !loud:
			s.en = s.en*w + float64(c.N)
			s.ex = s.ex*w + float64(c.X)
		case !warm:
			s.en *= w
			s.ex *= w
		}
		if q.chunks%coarseChunks == 0 {
			j := (s.cpos - 1 + coarseBuckets) % coarseBuckets // this chunk's bucket, just pushed
			s.loud[j], s.fed[j] = s.loud[j] || loud, s.fed[j] || warm
		} else {
			s.curLoud, s.curFed = s.curLoud || loud, s.curFed || warm
		}
		if top == 0 {
			if s.run > 0 {
				s.endRun()
			}
		} else {
			s.run++
			if cut {
				s.runCut++
			} else {
				s.runN += c.N
				s.runX += c.X
			}
		}
		s.Flagged = top >= q.h
	}
}

// passes: between chunks, a flagged server stays condemned while it
// passed the peer check on its last chunk (Left false).
func (q *Sequential) passes(srv []*SeqServer, serving []bool, i int) bool {
	return q.peerCheck(srv, serving, i)
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
			// even: the newest chunk and every second one before it
			// (the ring's place pos-1 and its parity), odd the others.
			q.peers = append(q.peers, s.window[(s.pos+1)%2], s.window[s.pos%2])
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
	for _, i := range q.order[:max(n/2, 1)] {
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

// elevated is the coefficients against the peers' rate r: H0 at the
// healthy region's upper end for peers failing at r, the alternatives
// from the degraded region's lower end.
func (q *Sequential) elevated(r float64) (a, b *[len(bank)]float64) {
	p1min := q.cfg.DegradedMin(r)
	for k, m := range bank {
		p1 := min(p1min*m, maxP1)
		p0 := min(q.cfg.HealthyMax(r), p1/2)
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
// p0 is the larger of the backend's healthy median and an upper bound of
// the server's own baseline, but never above the healthy region's upper
// end: the null's least favourable point. A server anywhere in the
// healthy region then has a negative drift against it, whatever the
// fleet's spread, and one with no history is judged at that point.
func (q *Sequential) coefficients(s *SeqServer) {
	p1min := q.P1Min()
	own := 1.0 // no history: judged against the cap below
	if s.en > 0 {
		// An upper bound of the baseline (about 3 sigma of its errors):
		// the estimate's own noise must not read as a change.
		own = (s.ex + 3*math.Sqrt(s.ex) + 3) / s.en
	}
	p0 := min(max(q.median, own), q.HealthyMax(), p1min/2)
	s.p0 = p0
	for k, m := range bank {
		p1 := min(p1min*m, maxP1)
		s.a[k] = math.Log(p1 / p0)
		s.b[k] = math.Log((1 - p1) / (1 - p0))
	}
	s.ready = true
}

// peerCheck: server i fails more than its serving peers over the same
// chunks (the span of its evidence, at most about 17 minutes), with the
// peers' own uncertainty: a conditional two-sample test (given the
// errors of both, the server's share of them is binomial in its share of
// the requests when both fail alike) at peerAlpha. So a fleet-wide
// failure drains nothing at any N from 2 and any rate, where a point
// median of few requests reads 0. Peers significantly above the healthy
// region of the others' lower median are left out, so that a second
// faulty peer cannot hide the first. The server must also be above the
// healthy region of its peers' rate, and above the healthy floor.
func (q *Sequential) peerCheck(srv []*SeqServer, serving []bool, i int) bool {
	k := min(max(srv[i].run, 1), coarseChunks*coarseBuckets)
	n, x := q.span(srv[i], k)
	if n == 0 {
		return false
	}
	rate := float64(x) / float64(n)
	if rate <= q.cfg.HealthyFloor {
		return false
	}
	q.scratch = q.scratch[:0]
	q.peers = q.peers[:0]
	for j, s := range srv {
		if j != i && serving[j] {
			pn, px := q.span(s, k)
			if pn > 0 {
				q.scratch = append(q.scratch, float64(px)/float64(pn))
				q.peers = append(q.peers, Counts{N: pn, X: px})
			}
		}
	}
	if len(q.peers) == 0 {
		return rate >= q.cfg.Floor // no peer: only the floor applies
	}
	limit := q.cfg.HealthyMax(lowerMedian(q.scratch))
	var m, y uint64
	for _, c := range q.peers {
		if c.X > 0 && stats.BinomialUpperTail(c.N, c.X, limit) < degradedAlpha {
			continue // a faulty peer of its own
		}
		m += c.N
		y += c.X
	}
	if m == 0 {
		return rate >= q.cfg.Floor
	}
	if rate <= q.cfg.HealthyMax(float64(y)/float64(m)) {
		return false
	}
	share := float64(n) / float64(n+m)
	return stats.BinomialUpperTail(x+y, x, share) < peerAlpha
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
