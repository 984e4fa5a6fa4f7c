package rules

import (
	"cmp"
	"math"
	"math/bits"
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
// spread. Each CUSUM keeps the uncut sums of its log-likelihood ratios
// over the last chunks, and so what every window of up to W chunks
// brought. Once a window brings more than windowCredit·h, a burst is
// under way, and S has taken out what the burst's best windows brought
// beyond the credit: the best one window of W chunks, or the best two
// (W chunks in all, within 2W, with pairGap chunks that brought no
// evidence between them: two bursts seconds apart). A burst adds at most
// the credit, and the rest of h must come from outside it, from healthy
// traffic only, a chance of about e^-(1-windowCredit)h a burst; a
// sustained fault is forgiven W chunks of its evidence and found about W
// chunks later. What is taken out is the windows that brought the most,
// wherever they lie in the burst, not the first chunks cut: before (a
// budget of W chunks cut in an episode), healthy errors that lifted a
// window over the credit a few seconds before a burst spent the budget,
// and the burst's last chunk counted in full (TestBurstAfterHealthyErrors;
// the soak's `--bursts 3:30-50 --burst-spread 5` at 33 req/s, 31 false
// drains per 1,000 server-days, 8 since, two bursts that overlap). A
// burst that begins after a quiet gap (quietGap chunks that brought no
// evidence since the last burst's chunk) and brings more than the credit
// in its first chunk, or after two windows that brought none, is a burst
// of its own, whose windows begin at it, up to episodeBursts in an
// episode (which ends with the statistic back at zero, or a minute of
// windows that brought no more than the credit): two bursts seconds
// apart, which Poisson bursts an hour apart make every few hundred, are
// both forgiven, farther apart than the best two windows reach. A third
// after two windows of chunks without evidence (ownGapWindows) is its own
// too, for one of the server's tokens: at low traffic the statistic stays
// up for minutes after a burst, and three Poisson bursts a minute or two
// apart were one episode whose third counted in full. A window that
// brings no more than the credit takes nothing out: a slow fault (2% at 5
// req/s) brings an error or two a window, window after window, and all of
// it counts. Errors that go on for longer than the minimum duration, one
// burst or overlapping ones, are a fault by definition, unless the server
// is bursty (bursty): one whose backend had a burst forgiven in the last
// day has two forgiven however close, overlapping ones included. The
// episode's bursts are those the cut forgave: a burst of its own whose
// cut never kept the statistic from h (a few healthy errors that lifted
// a window over the credit) gives its place to the next one (kept).
//
// The statistic is bounded at h: a refused or delayed drain (the floor,
// the cap, observe mode) leaves a server at h, not hours of evidence
// above it, and after it heals the evidence falls below h as the healthy
// drift takes it down.
//
// Checks more frequent than a second pool their counts into one-second
// chunks, on a grid of seconds that tolerates a late wake-up
// (chunkSlack): h bounds the false alarms per chunk, and so per unit of
// time whatever --evidence-check is.
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
	// ringChunks is the ring's reach in chunks: a server's warm-up, the
	// peer check's longest span, and a peer's last 17 minutes.
	ringChunks = coarseChunks * coarseBuckets
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
	// minChunk is a chunk's length, in seconds: checks more frequent
	// than this pool their counts, so that the threshold, set in chunks,
	// bounds the false drains per unit of time whatever the cadence.
	minChunk = 1.0
	// chunkSlack: a check up to this much short of the chunk grid's next
	// line, and nearer to it than the next check would be (half its own
	// length: checks of 100 ms still make chunks of ten), closes a chunk;
	// the grid's phase (Sequential.ahead) carries the difference, so that
	// the chunks average minChunk. The loop's steps are a second apart on
	// the wall clock, each woken a little late: their spacing is 1 s give
	// or take a millisecond, and without the slack the half of them under
	// a second pooled with the next into 2 s chunks. The agent's test
	// then ran at a chunk every 1.5 s or so, and the minimum duration's
	// window of W chunks was that much longer in seconds, where the soak,
	// on exact seconds, saw neither.
	chunkSlack = 0.1
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
	// burstMemory: a backend that had a burst forgiven within this many
	// seconds is bursty (Sequential.bursty).
	burstMemory = 86400.0
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
	// evidence is a burst of its own whatever its first chunk brings, and
	// may be one more than the episode's episodeBursts, for a token: a
	// fault whose windows bring more than the credit (the only kind the
	// cut touches) rarely falls silent that long (at 0.55 errors a
	// second, 1 in 700). One more, not any number: with any number, a
	// flapping fault under the degraded line on average (5% for 5 s in
	// every 30 s at 33 req/s) was found in 151 of 200 trials of an hour,
	// with one more in 173 (183 before). What it costs: a flapping fault
	// whose bursts would each convict (20% for 4 s in every 19 s) is found
	// once the tokens run out, 115 s after its onset against 79.
	ownGapWindows = 2
	// pairGap: two windows are two bursts when this many chunks that
	// brought no evidence lie between them.
	pairGap = 2
	// outageAlpha: a chunk begins an outage when its requests failed
	// significantly more than three quarters of the time, at this level
	// (17 of 17, 31 of 33, 45 of 50, 243 of 300).
	outageAlpha = 0.01
	// peerAlpha is the peer check's level: the chance that a server
	// failing no more than its peers, over the same chunks, passes it.
	peerAlpha = 1e-6
	// holdAlpha: a condemned server is held (see chunk's hysteresis)
	// until a fault at the rate it was condemned on would have shown an
	// error since its evidence last stood at h but for this chance.
	holdAlpha = 0.01
	// degradedAlpha: a condemned server is degraded (not in the zone)
	// when its rate over its evidence's span is above the degraded
	// region's lower end at this level.
	degradedAlpha = 1e-3
	// warmAlpha: the peer check's level while the server checked is in
	// its warm-up (peerCheck).
	warmAlpha = degradedAlpha / 10
	// historyAlpha: the peer check takes a peer's long baseline in place
	// of its counts over the span unless they, or its last 17 minutes,
	// stand above the baseline's upper bound at this level. Set aside, a
	// history only makes the check slower; taken for a span above it,
	// it would hide a fleet-wide failure.
	historyAlpha = 0.01
	// lineZ: the sigmas of the degraded line's own uncertainty by which
	// a server's rate must stand above it to be shown degraded (Step).
	// Too few, and a zone server cycles (at two, 2 of 40 seeds of
	// TestZoneServerNearTheLine); too many, and a degraded server is
	// left serving after its first drain: at three, 2% at 1 req/s
	// against a line of 1.2% is shown once that line is known to
	// ±0.27%, after about six hours of traffic at 0.2% (the baseline's
	// span); at two, after about three.
	lineZ = 3
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
	// The minimum duration, per alternative k (the header above): u is
	// the uncut sum of its log-likelihood ratios since its evidence last
	// started (its statistic at zero), cnt the chunks since, and uw the
	// last W sums (a ring at wpos), so that u now less u m chunks ago is
	// what the last m brought; pb, for each of the last 3W chunks and
	// each length up to W, the window of at most that length that brought
	// the most by then (Sequential.windows), and pw the same for the
	// length W alone over the bursty pair's reach (pairReach). Windows
	// begin after lo, the episode's or the burst's start, where the sum
	// was loU. excess: what
	// the burst's best windows brought beyond the credit, which is what S
	// has had taken out for it; segs counts the episode's bursts. qmask:
	// which of the last 64 chunks brought no evidence (bit 0 the latest;
	// its trailing ones are the quiet chunks in a row now); gap: the most
	// of them in a row since the last burst's chunk; calm: the chunks in a row whose window
	// brought no more than the credit (episodeCalm of them end the
	// episode). tokened: the burst under way took a token. The tokens are
	// the bursts the server may still have forgiven (burstTokens at most,
	// one back every burstRefill seconds), spent = burstTokens minus
	// tokens so that a new server starts with all of them.
	uw      [maxWindow][len(bank)]float64
	wpos    int
	u       [len(bank)]float64
	cnt     [len(bank)]int32
	lo      [len(bank)]int32
	loU     [len(bank)]float64
	pb      []piece
	pw      []piece
	excess  [len(bank)]float64
	segs    [len(bank)]int8
	qmask   [len(bank)]uint64
	calm    [len(bank)]int8
	gap     [len(bank)]int8
	tokened [len(bank)]bool
	// kept: the cut of the burst under way kept the statistic from h
	// (without it, it would have stood there). A burst of its own whose
	// cut never did is none the cut forgave, and the next burst of its
	// own takes its place among the episode's episodeBursts: healthy
	// errors in the seconds before a burst (for the smallest
	// alternative, whose drift is the slowest and whose windows a few
	// healthy errors lift over the credit) were the episode's first
	// burst, the burst its second, and a second burst a few seconds
	// later counted in full (TestBurstPairAfterHealthyErrors).
	kept  [len(bank)]bool
	carry [len(bank)]bool
	spent [len(bank)]float64
	// forgave: in the run under way, the minimum duration's cut kept a
	// burst from convicting; convicted: the run ended condemned. A run
	// that ends forgave and not convicted is a burst forgiven
	// (Sequential.burstAt); a fault, condemned, leaves no such mark.
	forgave, convicted bool
	// run counts the chunks since the CUSUMs were last all at zero: the
	// span of the evidence now, Page's estimate of when a change began;
	// runN and runX its requests and 5xx. cut holds, per alternative, the
	// counts of the windows taken out of earlier bursts of the run, curCut
	// the burst under way's: RunCounts leaves them out. A burst forgiven
	// by the minimum duration is no evidence of the server's rate either:
	// counted, a burst inside the span of a server in the zone showed it
	// above the degraded line, and it was drained twice in a day.
	run         int
	runN, runX  uint64
	cut, curCut [len(bank)]cutCounts
	// Chunks counts the chunks seen; Flagged is whether the CUSUM is at
	// h now, or, for a server condemned at the last step (held), was
	// within the minimum duration's window (sinceH chunks ago; see chunk).
	Chunks  uint64
	Flagged bool
	held    bool
	sinceH  int32
	// quiet: the requests since the evidence last stood at h; holdN: the
	// requests a condemned server is held for after that (holdAlpha).
	quiet uint64
	holdN float64
	// outRun: the outage's chunks in a row now; outSpent: the outages
	// judged afresh, less one every burstRefill seconds (q.outage).
	outRun   int32
	outSpent float64
	// Zone: the server's evidence crossed h, but its rate over the
	// evidence's span is not shown above the degraded region's lower
	// end: it is in the zone. zoneAt is when it was last condemned so,
	// or before the backend's median was known (Step; the test's clock,
	// seconds), zoned whether it ever was.
	Zone   bool
	zoneAt float64
	zoned  bool
	// shown: the run's evidence has shown the server above the degraded
	// line at some step; it stays so for the rest of the run. Judged
	// afresh each step, a 5% server at 5 req/s, whose span shows it
	// above the line at 10⁻³ only just (14 errors in 456 requests against
	// 1.2%), went from degraded to the zone and back with every error,
	// and left serving it was let go at 8% of its checks
	// (TestFaultLeftServingStaysCondemned).
	shown bool
	// shownKnown: shown at a step whose median was known (Sequential's
	// known); zonedRun: the run under way set zoneAt (see Step).
	shownKnown, zonedRun bool
	// coldLooks: the chunks of the run at which the peer check was asked
	// while the backend's median was not known (Step, peerCheck).
	coldLooks int32
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
// those of the windows a burst's cut took out (the alternative's that
// took out the most since its statistic was last at zero). A burst
// forgiven is no evidence of the server's rate; and a server near the
// degraded line, whose windows over the credit an alternative takes out
// now and then over hours of evidence, is judged on the rest, so that it
// is not shown degraded by the hours' weight alone and drained again and
// again in a day (issue 41's noisy
// service, median 1% with σ 0.5: a server at 5.7% against an estimated
// line of 5.2%, drained 8 times in a day when only the largest
// statistic's windows were left out).
func (s *SeqServer) RunCounts() (n, x uint64) {
	c := s.cutOf(s.mostCut())
	return s.runN - min(c.n, s.runN), s.runX - min(c.x, s.runX)
}

// runCut is how many of the evidence's chunks RunCounts leaves out.
func (s *SeqServer) runCut() int { return int(s.cutOf(s.mostCut()).chunks) }

// mostCut is the alternative whose cut took out the most chunks.
func (s *SeqServer) mostCut() int {
	t := 0
	for k := range s.S {
		if s.cutOf(k).chunks > s.cutOf(t).chunks {
			t = k
		}
	}
	return t
}

// cutCounts are the requests, 5xx and chunks of windows a burst's cut
// took out.
type cutCounts struct {
	n, x   uint64
	chunks int32
}

func (s *SeqServer) cutOf(k int) cutCounts {
	a, b := s.cut[k], s.curCut[k]
	return cutCounts{n: a.n + b.n, x: a.x + b.x, chunks: a.chunks + b.chunks}
}

// piece is a window of chunks: what it brought, its last chunk (counted
// as SeqServer.cnt) and its length.
type piece struct {
	v   float64
	end int32
	n   int8
}

// windows reads alternative k of s at its latest chunk n: q.sB[m] is
// what the last m chunks brought (m up to W, none before s.lo), and it
// returns the most that two disjoint windows of W chunks in all, within
// 2W chunks (of W chunks each, within pairReach, for a bursty server),
// the later one ending now, brought (the later alone where no earlier one
// adds), keeping the two in q.cutB (the later's length) and q.cutA. It
// keeps at n, for later chunks, the window of each length up to W that
// brought the most by n, and u now in the ring.
func (q *Sequential) windows(s *SeqServer, k int) float64 {
	w, r, rw := q.w, 3*q.w, q.pairReach() // r, rw: the positions pb and pw keep
	if len(s.pb) != len(bank)*r*(w+1) {
		s.pb = make([]piece, len(bank)*r*(w+1))
	}
	if len(s.pw) != len(bank)*rw {
		s.pw = make([]piece, len(bank)*rw)
	}
	n, lo := s.cnt[k], s.lo[k]
	at := func(pos int32, l int) *piece { return &s.pb[(k*r+int(pos)%r)*(w+1)+l] }
	atW := func(pos int32) *piece { return &s.pw[k*rw+int(pos)%rw] }
	span := min(w, int(n-lo))
	for m := 1; m <= span; m++ {
		base := s.loU[k]
		if int32(m) < n-lo {
			base = s.uw[(s.wpos-m+w)%w][k]
		}
		q.sB[m] = s.u[k] - base
	}
	s.uw[s.wpos][k] = s.u[k]
	// the best window of each length by n: by n-1, or one ending at n
	var cur piece
	for l := 1; l <= w; l++ {
		if l <= span && q.sB[l] > cur.v {
			cur = piece{v: q.sB[l], end: n, n: int8(l)}
		}
		e := cur
		if n-1 > lo {
			if p := *at(n-1, l); p.v > e.v {
				e = p
			}
		}
		*at(n, l) = e
		if l == w {
			*atW(n) = e
		}
	}
	best := math.Inf(-1)
	q.cutB, q.cutA = 0, piece{}
	// A bursty server has two bursts forgiven, overlapping or not: the
	// earlier window may be W chunks long and touch the later one.
	gapNeed, reach, bursty := q.pairGap, 2*w, q.bursty()
	if bursty {
		gapNeed, reach = 0, rw
	}
	for m := 1; m <= span; m++ {
		// The earlier window: the best of at most W-m chunks (W where
		// bursty) that ends gapNeed quiet chunks or more before this one
		// begins, within 2W chunks of now (pairReach): the best by each
		// position, going back, until one is apart (a lesser one behind a
		// better that is not apart is not looked for: less is taken out, never
		// more).
		el := w - m
		if bursty {
			el = w
		}
		var a piece
		for p := n - int32(m) - int32(gapNeed); el > 0 && p > lo && p > n-int32(reach); p-- {
			var c piece
			if bursty {
				c = *atW(p)
			} else {
				c = *at(p, el)
			}
			if c.n == 0 {
				break
			}
			if c.end-int32(c.n) < n-int32(reach) {
				break // begins more than 2W (pairReach) back
			}
			if gap := int(n - c.end - int32(m)); bits.OnesCount64(s.qmask[k]>>m&(1<<gap-1)) >= gapNeed {
				a = c
				break
			}
		}
		if v := q.sB[m] + a.v; v > best {
			best, q.cutB, q.cutA = v, m, a
		}
	}
	return best
}

// bursty: a server of the backend, the one judged or a peer, had a
// burst forgiven (Sequential.burstAt) within burstMemory. Each of its
// servers then has two bursts forgiven in an episode however close: the
// best two windows of W chunks each, within pairReach, overlapping
// bursts included. Two bursts of a few
// seconds each that overlap, or that have fewer quiet chunks between them
// than make two bursts, are one event longer than the minimum duration, a
// fault by that measure alone, and Poisson bursts every few hours make
// such a pair every few hundred server-days (the soak's random fleets:
// 1.66-4.30 false drains per 1,000 server-days on three sets of seeds,
// nearly all such pairs; 0-0.47 since). A backend whose servers have had
// bursts forgiven lately is a service that makes them (a GC pause, a
// deploy, a shared dependency's blip come to every server); one that has
// not is judged by the minimum duration alone, so a fault that begins in
// a quiet backend is found as soon as before, one in a bursty backend
// about a window later. The server's own bursts alone made a server
// bursty only after its first burst of the day, so that a first burst
// that was a pair was drained: bursts of 20-60 errors spread over 4 s
// every hour at 33 req/s, 2.28 false drains per 1,000 server-days, half
// of them in the first hour of a day, 0.69 with the backend's memory
// (`hapilot-bench soak --servers 9 --rate 33 --bursts 1:20-60
// --burst-spread 4 --server-days 10000 --seeds 601-620`). The burst under
// way never counts for itself: the backend's memory is of runs that
// ended.
func (q *Sequential) bursty() bool {
	return q.burstAt > 0 && q.clock-q.burstAt < burstMemory && !q.cfg.everyBurst
}

// pairReach: the chunks back from now within which a bursty server's two
// windows lie, as far as their counts can be read (recentChunks, for the
// run's counts less the cut: cutOfWindows), and at least 3W. Two bursts
// of a few seconds each with a few seconds between them are not always
// two bursts of their own: a few healthy errors in the gap give the
// smallest alternative, whose statistic takes the longest to fall back,
// a window over the credit, and the gap is not quiet. Within 3W, bursts
// of 20-60 errors spread over 4 s every hour at 5 req/s drained 0.99
// healthy servers per 1,000 server-days, at 2 req/s and N=30 (10-30
// errors over 5 s) 1.76; within this reach, 0.30 and 0.39
// (docs/lab/detection.md). pw keeps these positions for windows of W
// chunks alone, not for every length as pb does: the state a server keeps
// grows by a few kilobytes, not threefold.
func (q *Sequential) pairReach() int {
	return max(3*q.w, recentChunks-q.w)
}

// cutOfWindows is the requests, 5xx and chunks of the windows that
// windows last chose, for alternative k of s.
func (q *Sequential) cutOfWindows(s *SeqServer, k int) cutCounts {
	n, x := s.lastSum(q.cutB)
	c := cutCounts{n: n, x: x, chunks: int32(q.cutB)}
	if a := q.cutA; a.n > 0 && int(s.cnt[k]-a.end)+int(a.n) <= recentChunks {
		back := int(s.cnt[k] - a.end) // chunks after its last
		n1, x1 := s.lastSum(back + int(a.n))
		n0, x0 := s.lastSum(back)
		c.n, c.x, c.chunks = c.n+n1-n0, c.x+x1-x0, c.chunks+int32(a.n)
	}
	return c
}

// outage: a chunk in which the server failed significantly more than
// three quarters of its requests (at outageAlpha) begins an outage, a
// restart's shape or a server down; the chunks after it that failed
// three quarters or more go on with it (the edges between two restarts
// seconds apart end the first, and the second is an outage of its own).
// At an outage's first chunk the server is judged afresh, as when HAProxy
// marks it down: its evidence is forgotten (what came before, the
// outage's first edge in the chunk before included), its baseline and
// tokens kept, and the chunk's counts go nowhere (the rings, the
// baseline, the CUSUMs). The rest of the outage is evidence as any burst
// is, forgiven shorter than the minimum duration (taking a token where
// the cut keeps it from convicting) and found longer (an outage of twice
// the minimum duration before it ends). Two restarts seconds apart are
// then two bursts, where their errors were one event longer than the
// minimum duration: the soak's --restarts 3:5 drained 9.92 healthy
// servers per 1,000 server-days, 1:2 7.94. A check needs 17 requests or
// more to show an outage (0.75^17 < 0.01); under that, a restart is a
// burst as before. A server is judged afresh at burstTokens outages in a
// row at most, one more every burstRefill seconds (outSpent), and not
// while its burst tokens are spent: a server that flaps down and up
// every few seconds is a fault, and so is one that fails 80% of its
// requests at 300 req/s, whose checks begin outage after outage.
func (q *Sequential) outage(s *SeqServer, dt float64) {
	s.outSpent = max(0, s.outSpent-dt/burstRefill)
	c := s.pend
	switch {
	case c.X*4 < c.N*3:
		s.outRun = 0
		return
	case s.outRun > 0:
		s.outRun = min(s.outRun, math.MaxInt32-1) + 1
		return
	case stats.BinomialUpperTail(c.N, c.X, 0.75) >= outageAlpha:
		return
	}
	s.outRun = 1
	if s.outSpent > burstTokens-1 {
		return
	}
	for k := range s.spent {
		if !s.tokenLeft(k) {
			return
		}
	}
	s.outSpent++
	tokened := s.tokened
	s.Reset()
	// The outage's first edge, in the chunk before, and its rest are one
	// burst: a token its edge took is not taken again by the rest (the
	// episode's first burst after this chunk). Two a restart ran the
	// tokens out where restarts come every hour: --restarts 1:2, 11 false
	// drains in 1,008 server-days, 8 without outages.
	s.outRun, s.carry = 1, tokened
}

// zoneLeft: s was condemned in the zone, or before the backend's median
// was known, within ZoneEvery (Step).
func (q *Sequential) zoneLeft(s *SeqServer) bool {
	return s.zoned && q.clock-s.zoneAt < q.cfg.ZoneEvery.Seconds()
}

// newSegment begins a burst of its own for alternative k at its latest
// chunk, which brought l: its windows reach no further back than it.
func (s *SeqServer) newSegment(k int, l float64, replace bool) {
	s.freezeCut(k)
	if !replace && s.segs[k] < math.MaxInt8 {
		s.segs[k]++
	}
	s.lo[k], s.loU[k] = s.cnt[k]-1, s.u[k]-l
	s.excess[k], s.tokened[k], s.kept[k] = 0, false, false
}

// freezeCut keeps the burst under way's cut windows in the run's.
func (s *SeqServer) freezeCut(k int) {
	c, d := &s.cut[k], s.curCut[k]
	c.n, c.x, c.chunks = c.n+d.n, c.x+d.x, c.chunks+d.chunks
	s.curCut[k] = cutCounts{}
}

// tokenLeft: alternative k has a burst token left (SeqServer.spent).
func (s *SeqServer) tokenLeft(k int) bool { return s.spent[k] <= burstTokens-1 }

// takeToken spends one of alternative k's burst tokens on the burst under
// way.
func (s *SeqServer) takeToken(k int) {
	s.spent[k]++
	s.tokened[k] = true
}

// endEpisode forgets alternative k's bursts: the next one is the first
// of an episode, and its windows begin after now.
func (s *SeqServer) endEpisode(k int) {
	s.freezeCut(k)
	s.segs[k], s.excess[k], s.tokened[k], s.kept[k], s.carry[k] = 0, 0, false, false, false
	s.lo[k], s.loU[k] = s.cnt[k], s.u[k]
}

// restart: alternative k's statistic is back at zero; its evidence and
// bursts start afresh, and so does its cut: healthy chunks outweighed what
// its windows cut, so they were no burst of the evidence that stands.
// Kept, the cuts of an alternative that climbs on a chunk's errors and
// falls back grew with every climb, always the chunks with the most
// errors: a server at 5% from a cold start, at 50 req/s, was judged on
// the 40% of its chunks that were left, at 1-2.5%, and held in the zone
// for up to 30 s (TestColdFaultIsDegraded).
func (s *SeqServer) restart(k int) {
	s.endEpisode(k)
	s.cut[k] = cutCounts{}
	s.u[k], s.cnt[k], s.lo[k], s.loU[k] = 0, 0, 0, 0
}

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
	s.Flagged, s.Zone, s.Left, s.held = false, false, false, false
	s.quiet, s.holdN = 0, 0
	s.outRun = 0
}

// endRun forgets the run's windows and counts.
func (s *SeqServer) endRun() {
	s.uw = [maxWindow][len(bank)]float64{}
	s.u = [len(bank)]float64{}
	s.cnt, s.lo = [len(bank)]int32{}, [len(bank)]int32{}
	s.loU, s.excess = [len(bank)]float64{}, [len(bank)]float64{}
	s.segs = [len(bank)]int8{}
	s.qmask = [len(bank)]uint64{}
	s.calm = [len(bank)]int8{}
	s.gap = [len(bank)]int8{}
	s.tokened, s.kept = [len(bank)]bool{}, [len(bank)]bool{}
	s.cut, s.curCut = [len(bank)]cutCounts{}, [len(bank)]cutCounts{}
	s.run, s.runN, s.runX = 0, 0, 0
	s.shown, s.forgave, s.convicted = false, false, false
	s.shownKnown, s.zonedRun = false, false
	s.coldLooks = 0
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
	cfg    Config
	h      float64
	credit float64
	w      int
	median float64
	// lineSD is the degraded line's own uncertainty, as an error rate:
	// the line of the lower median of the servers' rates lineZ sigmas
	// up (medianCounts), less the line of the median, over lineZ.
	lineSD float64
	// known: the median is the backend's: the servers that count in it
	// reach the backend's middle rank (refresh); until then it is 0,
	// and Step is cold.
	known  bool
	chunks uint64
	clock  float64
	// burstAt: when a run of a server of the backend last ended in which
	// the minimum duration's cut kept a burst from convicting and the
	// server was not condemned (the test's clock, 0 never): a burst
	// forgiven, which makes the backend bursty (bursty)
	burstAt float64
	pendDt  float64
	// ahead is the chunk grid's phase: the seconds fed beyond the chunks
	// taken, in [-chunkSlack, minChunk-chunkSlack).
	ahead   float64
	split   []Counts // Step's copy of a long check's counts, reused
	scratch []float64
	// scratchHi: refresh's servers' rates lineZ sigmas up, beside scratch
	scratchHi []float64
	peers     []Counts
	peerOf    []*SeqServer // peerCheck's: the server behind each of peers
	all       []Counts     // peerCheck's: the peers and the server
	refs      []spanCounts // peerCheck's: those not failing of their own
	edges     []Counts     // peerCheck's: the edge's counts of each of refs
	order     []int
	ea, eb    [len(bank)]float64
	// pairGap: the quiet chunks that make two windows two bursts
	pairGap int
	// windows' scratch: what the last m chunks brought, and the windows
	// it last chose
	sB   [maxWindow + 1]float64
	cutB int
	cutA piece
}

// NewSequential returns the test of one backend under cfg.
func NewSequential(cfg Config) *Sequential {
	h := cfg.Threshold()
	q := &Sequential{cfg: cfg, h: h, credit: windowCredit * h, w: cfg.window(), pairGap: pairGap}
	if cfg.everyBurst {
		// stalls: a pause's slow answers left out (StallCounts) leave its
		// edges, which may come a check apart
		q.pairGap = 0
	}
	return q
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
	total := q.pendDt + q.ahead
	if minChunk-total > min(chunkSlack, max(dt, 0)/2) {
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
	n := min(max(1, int(total/minChunk+chunkSlack)), maxSplit)
	q.ahead = min(max(total-float64(n)*minChunk, -chunkSlack), minChunk-chunkSlack)
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
		s.Left, s.held = false, false
		if !s.Flagged {
			s.Zone = false
			continue
		}
		if !q.known {
			s.coldLooks++
		}
		ok, peers, now := q.peerCheck(srv, serving, i)
		if !ok {
			continue
		}
		n, x := s.RunCounts()
		if s.sinceH == 0 {
			// at h now: the hold is set by the rate it stands there on
			s.holdN = 0
			if x > 0 {
				s.holdN = math.Log(1/holdAlpha) * float64(n) / float64(x)
			}
		}
		// The degraded line is the backend's healthy median's; before
		// any server has a baseline to give one (a cold start: 1,000
		// requests a server, 17 minutes at 1 req/s), it is that of a
		// lower bound of the peers' rate over the same span (about three
		// sigma of their errors: a few requests' chance errors must not
		// lift the line over a real fault). Against the floor alone, a
		// zone server of a noisy backend (1.56% among peers at 0.36%)
		// was shown degraded on its first seconds and drained, then
		// drained again in the zone once the median was known: twice in
		// a day (the soak's random fleets, seeds 21-24 and 37-40).
		//
		// And the run's rate must stand above the line by lineZ times
		// the line's own uncertainty (lineSD): the median is an
		// estimate, a few percent off the fleet's at 33 req/s after
		// hours and tens of percent in the first hour at 5 req/s, and
		// hours of a zone server's evidence show it above an estimate's
		// line a little under its rate (1.18% where the line is 1.2%
		// and the estimate's 1.14%): drained again in its day. So was
		// one shown degraded on its first condemnation against a line
		// learned in 17 minutes at 5 req/s, in the zone once the median
		// was known (TestZoneServerNearTheLine).
		//
		// And the line is never under that of the backend's lower median
		// over the span, the server's own rate among the rates, one sigma
		// of its errors down (now, peerCheck). In a small backend the
		// median is learned from few servers: a server's baseline takes
		// 1,000 requests of quiet chunks, and one back from a drain is
		// in its warm-up again, so that at N=3 and 2 req/s it was often
		// one server's, the quietest's, and a zone server (8% among
		// peers at 0.6% and 1.75%) was shown degraded against it and
		// drained up to seven times in its day (the soak, --servers 3
		// --rate 2 --hetero 0.5 --noise 0.012 --seeds 501-504; once at
		// most since, with refresh's median of all the servers). One
		// sigma, as the line's own uncertainty (lineSD) is taken. Its
		// cost: a real fault at N=3 whose louder healthy peer had a few
		// chance errors in the span is judged in the zone, and drained
		// all the same.
		line, sd := q.median, q.lineSD
		if !q.known {
			line, sd = peers, 0
		}
		// A server drained today already, in an earlier run, in the zone
		// or cold, is drained again only where shown degraded against
		// the line of that median itself, not of a bound under it: the
		// median learned in the first minutes reads low (a baseline
		// learns its quiet chunks), and at N=3 and 33 req/s a zone
		// server (3.8% among peers at 0.8% and 0.3%) drained cold in its
		// first minute was shown degraded a minute later against a
		// learned median of 0.26% and drained again.
		z := 1.0
		if q.zoneLeft(s) && !s.zonedRun {
			z = 0
		}
		line = max(line, lowerRate(float64(now.N), float64(now.X), z))
		l := q.cfg.DegradedMin(line)
		shown := stats.BinomialUpperTail(n, x, l) < degradedAlpha &&
			float64(x)-float64(n)*l > lineZ*float64(n)*sd
		// Cold: the median is not yet the backend's (too few of its
		// servers count in it to reach the middle rank: a baseline takes
		// 1,000 requests, and a server back from a drain is in its
		// warm-up again), and the line rests on a few minutes' spans. A
		// server not shown degraded against a known median in its run
		// counts its drain as the zone's one in a day, whatever a cold
		// step showed: in the zone, or shown only cold in a later run
		// within the day, it is left serving. At N=3 and 2 req/s, a zone server shown degraded
		// in its first minute and in the zone later, or the other way
		// round, or shown cold and condemned again as the median was
		// learned, was drained twice in its day (TestZoneServerOfThree:
		// 10 of 10 seeds before). Within one run (observe mode, where
		// nothing is drained) a server shown cold stays condemned
		// (TestColdFaultIsDegraded), and one shown against a known
		// median is drained as before.
		s.shown = s.shown || shown
		s.shownKnown = s.shownKnown || shown && q.known
		s.Zone = !s.shown
		if !s.shownKnown {
			if q.zoneLeft(s) {
				if s.Zone || !s.zonedRun {
					s.Left = true
					continue
				}
			} else {
				s.zoned, s.zoneAt, s.zonedRun = true, q.clock, true
			}
		}
		s.held, s.convicted = true, true
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
		if !q.cfg.everyBurst {
			q.outage(s, dt)
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
		top := 0.0
		// The fast path: no error and no evidence held; each alternative's
		// successes only lower a CUSUM at zero.
		if c.X != 0 || s.S != [len(bank)]float64{} {
			x, ok := float64(c.X), float64(c.N-c.X)
			for k := range s.S {
				l := x*a[k] + ok*b[k]
				s.qmask[k] <<= 1
				if l <= 0 {
					s.qmask[k] |= 1
					s.gap[k] = max(s.gap[k], int8(bits.TrailingZeros64(^s.qmask[k])))
				}
				v := s.S[k] + l
				if v <= 0 {
					// Back at zero: the evidence starts afresh, and so do
					// its bursts.
					s.restart(k)
					s.S[k] = 0
					continue
				}
				s.cnt[k]++
				s.u[k] += l
				// The minimum duration: gain is what the window of the
				// last W chunks brought (from the episode's start or the
				// burst's own at most).
				best := q.windows(s, k)
				gain := q.sB[min(q.w, int(s.cnt[k]-s.lo[k]))]
				hot := gain > q.credit
				if hot {
					s.calm[k] = 0
				} else if s.calm[k] = min(s.calm[k]+1, episodeCalm); s.calm[k] >= episodeCalm && s.segs[k] > 0 {
					// A minute without a burst ends the episode, whatever
					// the statistic: at low traffic it takes minutes to
					// fall back to zero.
					s.endEpisode(k)
				}
				// longGap: two windows of chunks without evidence since
				// the last burst's chunk (ownGapWindows)
				longGap := int(s.gap[k]) >= ownGapWindows*q.w
				// replace: the burst under way is none the cut forgave
				// (kept), and a new one that brings more than the credit
				// in its first chunk takes its place in the episode
				replace := s.segs[k] > 0 && !s.kept[k] && l > q.credit
				switch {
				case s.segs[k] == 0:
					if hot {
						// The episode's first burst: its windows are the
						// last W chunks, whatever came before it.
						s.segs[k] = 1
						s.excess[k], s.tokened[k], s.carry[k] = 0, s.carry[k], false
					}
				case l > 0 && (hot || l > q.credit) && s.gap[k] >= quietGap &&
					(q.cfg.everyBurst || s.segs[k] < episodeBursts || s.segs[k] == episodeBursts && longGap && s.tokenLeft(k) || replace) &&
					(q.cfg.everyBurst || l > q.credit || longGap):
					// A burst of its own, after a quiet gap (chunks that
					// brought no evidence at all since the last burst's
					// chunk): its windows reach no further back than its
					// first chunk. It brings more than the credit in that
					// chunk, or comes after two windows without evidence:
					// a fault of an error or two a second has quiet gaps
					// of a few chunks too, and is not forgiven once more
					// for each (at 11 req/s, 5%, twelve quiet chunks in a
					// row have a chance of e^-6.6, 1 in 700); a burst at
					// low traffic may begin with a check of an error or
					// two. Slow answers' stalls are each their own burst
					// after a quiet gap, however many (a GC pause coming
					// back is the server's normal), and two a check apart
					// are the best two windows (pairGap 0 there).
					// One more than the episode's episodeBursts (after
					// two windows of quiet) takes a token: bursts that
					// come back every half minute, a flapping fault, run
					// out of them and count in full.
					extra := !q.cfg.everyBurst && s.segs[k] >= episodeBursts && !replace
					s.newSegment(k, l, replace)
					if extra {
						s.takeToken(k)
					}
					best = q.windows(s, k)
				}
				if over := best - q.credit; s.segs[k] > 0 && over > s.excess[k] {
					// What the burst's best two windows (W chunks in
					// all, within 2W) brought beyond the credit is
					// taken out, and no more: a burst shorter than the
					// minimum duration lies in one window, whatever
					// its size, however spread, and whatever healthy
					// noise came before it; two bursts seconds apart
					// in two; and a fault that goes on is forgiven W
					// chunks of its evidence.
					d := over - s.excess[k]
					if v >= q.h {
						s.kept[k] = true
					}
					if v >= q.h && s.S[k] < q.h && !s.tokened[k] && !q.zoneLeft(s) {
						// Without the cut this burst would convict: it
						// takes one of the server's tokens. Bursts that
						// come back again and again (a flapping fault)
						// run out of them and count in full. Not a
						// server's already at h, nor a zone server's
						// condemned within ZoneEvery: left serving, it
						// hovers at h on its own evidence, and its own
						// windows over the credit would spend the tokens
						// its bursts need (a zone server at 40 req/s with
						// bursts of 60 errors, drained three times in 12
						// h when they ran out).
						if q.cfg.everyBurst || s.tokenLeft(k) {
							s.takeToken(k)
						} else {
							d = 0
						}
					}
					if d > 0 {
						v -= d
						s.excess[k] = over
						s.curCut[k] = q.cutOfWindows(s, k)
					}
				}
				if s.segs[k] > 0 && v < q.h && v+s.excess[k] >= q.h {
					// the cut kept a burst from convicting
					s.forgave = true
				}
				if l > q.credit || l > 0 && gain > q.credit {
					// a burst's chunk (or a fault's): one that brings
					// more than the credit on its own, or evidence in a
					// window over the credit; the quiet gap that makes a
					// burst of its own is counted from the last one
					s.gap[k] = 0
				}
				v = min(max(v, 0), q.h) // bounded: the statistic stops at h
				s.S[k] = v
				top = max(top, v)
			}
			s.wpos = (s.wpos + 1) % q.w
		}
		// The baseline: at once in the warm-up (a new server, or one back
		// from a drain, is judged against what it serves), later from the
		// buckets leaving the ring (above); either way only while quiet.
		warm, loud := s.warm(), top >= quiet
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
				if s.forgave && !s.convicted {
					q.burstAt = q.clock // a burst forgiven
				}
				s.endRun()
			}
		} else {
			s.run++
			s.runN += c.N
			s.runX += c.X
		}
		// Hysteresis: bounded at h, a faulty server left serving (observe
		// mode, a refused drain) dips under h on every chunk that brings
		// fewer errors than its alternative's rate, a chunk in six at 5%
		// and 33 req/s, and its would-drain and its gauge flickered with
		// them. A server condemned at the last step stays flagged for the
		// minimum duration's window after its evidence last stood at h,
		// and until the requests since then would have shown an error at
		// the rate it was condemned on but for a chance of holdAlpha
		// (holdN): at a few requests a second a fault's errors come
		// further apart than the window, and a 5% server at 5 req/s, left
		// serving, was let go at 17-33% of its checks (errors 4 s apart
		// on average, past the window's 6 s 22% of the time). A
		// healed server is let go that much later: at 5 req/s, 18 s after
		// its last error for a 5% fault, 6 s at 33 req/s and more (the
		// window); where a margin in evidence would hold it for minutes at
		// any rate. Only a server condemned: one flagged and not condemned
		// (a fleet-wide failure the peer check refused) would have more
		// chances at the peer check (held for every flagged server, N=3
		// at 5 req/s drained 3 in 2,000 fleet-wide incident-hours, against
		// 2).
		if top >= q.h {
			s.sinceH, s.quiet = 0, 0
		} else {
			if s.sinceH < math.MaxInt32 {
				s.sinceH++
			}
			s.quiet += c.N
		}
		s.Flagged = top >= q.h || s.held && (int(s.sinceH) < q.w || float64(s.quiet) < s.holdN)
	}
}

// passes: between chunks, a flagged server stays condemned while it
// passed the peer check on its last chunk (Left false).
func (q *Sequential) passes(srv []*SeqServer, serving []bool, i int) bool {
	ok, _, _ := q.peerCheck(srv, serving, i)
	return ok
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
	slices.SortFunc(q.order, func(i, j int) int { return byRate(q.peers[2*i], q.peers[2*j]) })
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
	q.scratch, q.scratchHi = q.scratch[:0], q.scratchHi[:0]
	all := 0
	for i, s := range srv {
		if n, x, ok := medianCounts(s, serving[i]); ok {
			q.scratch = append(q.scratch, x/n)
			q.scratchHi = append(q.scratchHi, upperPoisson(x, lineZ)/n)
			all++
		} else if serving[i] {
			all++
		}
	}
	// The lower median of all the servers, those that do not count in it
	// yet taken as above every one that does: serving servers without
	// 1,000 requests of baseline, most of them loud (a baseline learns
	// only the quiet buckets, so that the quietest servers learn first).
	// The lower median of those that count alone was at N=3 and low
	// traffic the quietest server's (the lower of two, or the one), and
	// the healthy servers above it, judged against its line and loud
	// against it, never learned theirs: at 0.5 req/s, a zone server at
	// 3.8% among peers at 0.3% and 0.9% was drained six times in a day
	// against a median of 0.25-0.35%, with peerCheck's median of all
	// the servers already (the soak, --servers 3 --rate 0.5
	// --hetero 0.5 --noise 0.015 --seeds 701-704). Until more than half
	// count (half of an even count), there is no median (known false:
	// cold, Step).
	slices.Sort(q.scratch)
	slices.Sort(q.scratchHi)
	q.median, q.lineSD, q.known = 0, 0, false
	if r := (all - 1) / 2; r >= 0 && r < len(q.scratch) {
		// The line's uncertainty, a median of 0 included, taken through
		// the floor at lineZ sigmas, the distance Step asks for, with a
		// Poisson bound that holds for few errors. Where the median is
		// under the floor's, one sigma up stayed on the floor; and
		// x + z√x + z errors, 3 for none at three sigmas, is a 95% bound
		// there, not 99.9%. A zone server at N=2 and 0.5 req/s (5.1%,
		// its peer at 1.1% with none in its last 17 minutes' 510
		// requests: a median of 0, a line of 1% give or take 0.2%) was
		// shown degraded, and drained again in the zone later in its day
		// (the soak, --servers 2 --rate 0.5 --hetero 0.6 --noise 0.02
		// --seeds 801-804). Now none in 510 is a median of up to 1.3%,
		// a line of 7.9%.
		q.median, q.known = q.scratch[r], true
		q.lineSD = (q.cfg.DegradedMin(q.scratchHi[r]) - q.cfg.DegradedMin(q.median)) / lineZ
	}
	for i, s := range srv {
		if serving[i] {
			q.coefficients(s)
		}
	}
}

// byRate orders counts by their rate, X/N without division; counts of no
// request sort last.
func byRate(a, b Counts) int {
	switch {
	case a.N == 0 && b.N == 0:
		return 0
	case a.N == 0:
		return 1
	case b.N == 0:
		return -1
	}
	return cmp.Compare(a.X*b.N, b.X*a.N)
}

// lowerMedianRate is the counts of cs whose rate is their lower median
// (cs sorted in place by rate).
func lowerMedianRate(cs []Counts) Counts {
	slices.SortFunc(cs, byRate)
	return cs[(len(cs)-1)/2]
}

// lowerRate is a lower bound of the rate of x errors in n requests, z
// sigma of the errors down (0 at least; 0 for no request).
func lowerRate(n, x, z float64) float64 {
	if n <= 0 {
		return 0
	}
	return max(0, (x-z*math.Sqrt(x))/n)
}

// upperRate is an upper bound of the rate of x errors in n requests (n >
// 0), about z sigma of the errors up; one error's worth more, so that
// none in a few requests is no certainty of none.
func upperRate(n, x, z float64) float64 {
	return (x + z*math.Sqrt(x) + z) / n
}

// upperPoisson is an upper bound of a Poisson mean of which x was seen,
// z sigmas of the normal up: Wilson and Hilferty's cube root, within a
// few percent of the exact quantile from x = 0 (6.7 for none at z = 3,
// the exact 6.6), where upperRate's x + z√x + z, meant for many errors,
// is 3.
func upperPoisson(x, z float64) float64 {
	y := x + 1
	c := 1 - 1/(9*y) + z/(3*math.Sqrt(y))
	return y * c * c * c
}

// warm: s is in its warm-up, its first coarseBuckets buckets of chunks
// since it began serving: its baseline learns each quiet chunk at once.
func (s *SeqServer) warm() bool { return s.Chunks <= ringChunks }

// medianCounts are the requests and 5xx by which s counts in the
// backend's healthy median: its long baseline where it weighs
// minBaseline, serving or not (a drained server's is kept as it was);
// else, serving and past its warm-up, its last 17 minutes (the coarse
// ring) where they hold minPeerRequests, the fewest a rate now is
// trusted from (at 1,000, a server at 0.5 req/s, 512 requests in 17
// minutes, never counted unless quiet enough to learn a baseline: the
// median was of the quietest servers alone, TestZoneServerOfThree). A
// server loud from its first minutes (in the
// zone, left serving) learns no baseline, and as the one it had faded
// under minBaseline it left the median, which moved down a rank: in a
// fleet of nine spread from 0.08% to 1.18% at 33 req/s, from 0.2% to
// 0.17% after 16 hours, and the zone server, under the true line, was
// shown above the estimate's and drained again (TestZoneServerNearTheLine;
// the soak's --hetero 0.6 --seeds 201-204). A server in its warm-up
// is left out: loud from a cold start, it is a fault on at the agent's
// start, no healthy rate.
func medianCounts(s *SeqServer, serving bool) (n, x float64, ok bool) {
	if s.en >= minBaseline {
		return s.en, s.ex, true
	}
	if !serving || s.warm() {
		return 0, 0, false
	}
	c := s.cur
	for _, b := range s.coarse {
		c.N += b.N
		c.X += b.X
	}
	return float64(c.N), float64(c.X), c.N >= minPeerRequests
}

// baselineHigh is an upper bound of s's long baseline (about 3 sigma of
// its errors; s.en > 0): the estimate's own noise must not read as a
// change, in s's null or in a peer's span set beside it.
func (s *SeqServer) baselineHigh() float64 { return upperRate(s.en, s.ex, 3) }

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
		own = s.baselineHigh()
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
// region of the backend's lower median over the span (every serving
// server's rate, the server's own among them) are left out, so that a
// second faulty peer cannot hide the first. The server's own rate counts
// in that median: of the others alone, at N=3 it is the lower median of
// two, the quieter peer, and a server whose louder peer was its equal
// (4.6% beside 4.3%, the third at 0.5%) had that peer left out as a
// fault of its own and was condemned against the quiet one (the soak,
// --servers 3 --rate 2 --hetero 0.5 --noise 0.012: 7.1 and 11.6 false
// drains per 1,000 server-days at --seeds 401-404 and 501-504, 1.0 and 0
// since). What it costs: two of three servers failing alike are the
// backend's median, as the regions define it, and neither is condemned
// against the third. The server must also be shown above the healthy
// region of its peers' rate and of the lower median of theirs and its
// own, each with its own uncertainty (the same conditional test, at
// HealthyRatio times their rate), and be above the healthy floor; a
// server whose peers are all out of service is judged by the floor
// alone only in a backend of one server. peers is a lower bound of the
// pooled rate of the peers it was compared with (their errors less
// about three sigma; 0 with none); now the counts of the backend's
// lower median over the span, whose line the degraded line is never
// under, one sigma of its errors down (Step).
func (q *Sequential) peerCheck(srv []*SeqServer, serving []bool, i int) (ok bool, peers float64, now Counts) {
	k := min(max(srv[i].run, 1), ringChunks)
	n, x := q.span(srv[i], k)
	if n == 0 {
		return false, 0, Counts{}
	}
	rate := float64(x) / float64(n)
	if rate <= q.cfg.HealthyFloor {
		return false, 0, Counts{}
	}
	q.peers, q.peerOf = q.peers[:0], q.peerOf[:0]
	for j, s := range srv {
		if j != i && serving[j] {
			pn, px := q.span(s, k)
			if pn > 0 {
				q.peers = append(q.peers, Counts{N: pn, X: px})
				q.peerOf = append(q.peerOf, s)
			}
		}
	}
	if len(q.peers) == 0 {
		// No peer: in a backend of one server only the floor applies. One
		// whose peers are all out (drained, down) is the last serving,
		// which the guardrails' serving floor keeps in (half the
		// servers by default), and has nothing to be judged against: at
		// N=2 the healthy lower server (3.6%) was condemned against the
		// floor while its peer in the zone (16.4%) was drained
		// (TestZoneServerOfThree).
		return len(srv) == 1 && rate >= q.cfg.Floor, 0, Counts{}
	}
	q.all = append(append(q.all[:0], q.peers...), Counts{N: n, X: x})
	mid := lowerMedianRate(q.all)
	now = mid
	// A peer far above the healthy region of the backend's lower median
	// over the span (every serving server's rate, the server's own
	// among them) fails of its own, and is left out, so that a second
	// faulty peer cannot hide the first. The median is taken one sigma
	// up (upperPoisson, which holds for few errors): at its point, a
	// median server's chance quiet (2 errors in 899 requests at 1%) left
	// out a healthy peer (19 in 929) and pooled the quietest.
	limit := q.cfg.HealthyMax(upperPoisson(float64(mid.X), 1) / float64(mid.N))
	faulty := func(c Counts) bool {
		return c.X > 0 && stats.BinomialUpperTail(c.N, c.X, limit) < degradedAlpha
	}
	var m, y uint64
	var pm, py float64 // what the two-sample tests pool of those peers
	lenders := 0       // peers whose last 17 minutes the edge may read
	q.refs = q.refs[:0]
	for j, c := range q.peers {
		if faulty(c) {
			continue
		}
		h := spanCounts{Counts: c, pn: float64(c.N), px: float64(c.X)}
		if p := q.peerOf[j]; q.known && p.en > 0 {
			minutes, lent := q.lends(p, c)
			h.above = !lent
			if lent && p.en > h.pn {
				h.pn, h.px = p.en, p.ex
			}
			if lent && minutes.N > c.N {
				h.minutes = minutes
				lenders++
			}
		}
		m, y, pm, py = m+c.N, y+c.X, pm+h.pn, py+h.px
		q.refs = append(q.refs, h)
	}
	q.refs = append(q.refs, spanCounts{Counts: Counts{N: n, X: x}, pn: float64(n), px: float64(x), self: true})
	slices.SortFunc(q.refs, func(a, b spanCounts) int { return byRate(a.Counts, b.Counts) })
	ref := q.refs[(len(q.refs)-1)/2]
	// The server must stand above the healthy region of its peers' pooled
	// rate and of the lower median of theirs and its own (those that
	// fail of their own left out), and be shown so. In a noisy backend
	// at low traffic the median is learned slowly (1,000 requests a
	// server) and from the quietest servers first, whose chunks are the
	// least often loud, so healthy servers at two or three times the
	// true median were judged against a line under them; this end is
	// the backend's own, over the same chunks. Against the peers' rate
	// alone (a point), N=2 at 3 req/s, median 1%, σ 0.5, drained 17
	// healthy servers per 1,000 server-days, and N=9 at 0.5 req/s,
	// median 2%, 77.5 (844d57e; 2.2 and 61 with medianCounts; 0 and 1.0
	// since, the soak, --seeds 401-404); so the pooled rate is taken one
	// sigma up.
	//
	// The median as well as the pooled rate: the loudest server's peers
	// pool to their mean, under the median where the quiet one is
	// quieter (at N=3, 0.7% for peers at 0.4% and 1%, the median), and a
	// healthy server at 2.5 times the median, 3.6 times that mean, was
	// condemned (TestPeerCheckAgainstTheMedian). And where every peer
	// was left out, only the floor applied: at N=2 the lower server, the
	// median itself, was condemned beside a peer in the zone (3.6%
	// beside 16.4%: the soak, --servers 2 --rate 2 --hetero 0.6 --noise
	// 0.02 --seeds 901-904). A server that is that median is never
	// condemned by it. The median is a server's counts, few: while the
	// backend's median is not known it is taken one sigma up, as a
	// healthy server above the floor stands at h for minutes then and
	// is asked at every chunk; once known, at its point, as the healthy
	// servers' own baselines keep them off h, and one sigma up found a
	// 2% fault at N=3 and 33 req/s mid-stream in a median 62 s, not 43
	// (a throwaway probe of 200 seeds).
	//
	// While the median is not known, the level is degradedAlpha over
	// the looks of the run so far (Bonferroni's), for the same reason:
	// each look is a new chance on a span that has grown. A fault's
	// evidence grows with its span and its tail shrinks exponentially,
	// so the looks cost it the log of their number in evidence.
	//
	// In the server's warm-up, its first 17 minutes (a cold start, or
	// back from a drain), the level is a tenth (warmAlpha). Its own
	// baseline is then its span itself, the backend's median rests on
	// minutes, and every server of a fleet passes through it each time
	// the agent starts: at 10⁻³, healthy servers at 2.8 and 2.9 times
	// the median, each a little loud over its first minutes beside
	// peers quiet over theirs, were condemned at their first looks, at
	// 9.7·10⁻⁴ (15 in 266 requests beside none in 469, 255 s into the
	// day: the soak, --servers 3 --rate 1 --hetero 0.6 --noise 0.01
	// --seeds 901-908) and 9.3·10⁻⁴ (65 in 4,975 beside 7 in 4,992,
	// 154 s in: --servers 2 --rate 33 --hetero 0.6 --noise 0.005
	// --seeds 801-804), one false drain in 2,000 to 4,000 server-days,
	// the interval's upper end over 2 (TestPeerCheckInTheWarmUp). What
	// it costs falls on a fault found in its server's warm-up, from a
	// cold start: one after a steady state is judged past it.
	//
	// The edge reads the lending peers' last 17 minutes in place of
	// their spans, where they hold more requests and two peers or more
	// lend (spanCounts.minutes), for the median and the pooled rate
	// alike: a peer that lends fails now as it always has, and its
	// minutes, every chunk of them (a baseline learns only its quiet
	// ones), are its rate now with a fraction of the span's noise. On
	// the spans, one sigma up, the peers' chance errors over a fault's
	// first minute at N=3 and 5 req/s (4 in 600 requests between the
	// two, 0.67%, 1.17% one sigma up) set the edge at three times that,
	// 3.5%, and the fault waited for minutes more of its own span: a 2%
	// fault was found after a steady state in a median 295 s, 245 s on
	// the minutes, and at 33 req/s in 45.2 s, 38.2 s (the soak,
	// --servers 3 --rate 5,33 --fault 0.02 --trials 50 --seeds 1-4;
	// TestPeerEdgeOverTheirMinutes). Two peers or more: at N=2 the edge
	// rests on one server's rate, and the span's sigma is the margin that
	// keeps a healthy server at two or three times its peer, and a zone
	// server, from being condemned at the check's level look after look.
	// On one peer's minutes the soak's N=2 cells drained a healthy server
	// (--servers 2 --rate 1 --hetero 0.7 --noise 0.02 --seeds 601-604)
	// and zone servers twice in their day (--rate 0.5 --hetero 0.6
	// --noise 0.02 --seeds 801-804; --rate 33 --hetero 0.6 --noise 0.005
	// --seeds 901-904). A fault on the server alone leaves its peers'
	// minutes as they were; in a fleet-wide incident their minutes stand
	// above their histories, they lend nothing, and their spans are
	// read, as before.
	alpha := degradedAlpha
	if srv[i].warm() {
		alpha = warmAlpha
	}
	if !q.known {
		alpha /= float64(max(srv[i].coldLooks, 1))
	}
	var em, ey uint64 // what the edge pools of the peers
	q.edges = q.edges[:0]
	for _, c := range q.refs {
		e := c.Counts
		if lenders >= 2 && c.minutes.N > 0 {
			e = c.minutes
		}
		q.edges = append(q.edges, e)
		if !c.self {
			em, ey = em+e.N, ey+e.X
		}
	}
	e := lowerMedianRate(q.edges)
	base := float64(e.X) / float64(e.N)
	if !q.known {
		base = upperRate(float64(e.N), float64(e.X), 1)
	}
	if m > 0 {
		base = max(base, upperRate(float64(em), float64(ey), 1))
	}
	edge := q.cfg.HealthyMax(base)
	if rate <= edge || stats.BinomialUpperTail(n, x, edge) >= alpha {
		return false, 0, now
	}
	// And above the healthy region of the peers' pooled rate, and of the
	// median's, with their own uncertainty, at the same level: a
	// two-sample test (beyond), where a rate one sigma up, or a point,
	// is no bound at the test's level. At N=2 and 0.5 req/s (σ 0.6,
	// median 2%) the lower server's few errors over the span read a
	// third of its rate by chance (1 in 510 requests at 1.5%), and a
	// healthy server at 2.2 to 2.8 times it, itself a little loud (25
	// in 527), was condemned: 4 false drains in 1,794 server-days, all
	// in a day's first 42 minutes (the soak, --servers 2 --rate 0.5
	// --hetero 0.6 --noise 0.02 --seeds 901-904), each at a chance of
	// 0.007 to 0.015 by this test. At N=3 and 1 req/s, against the
	// median's point (8 in 1,027 at 1.5%), so was one at 2.5 times it
	// (--servers 3 --rate 1 --hetero 0.6 --noise 0.01 --seeds 801-804).
	//
	// The median's side pools the peers at or above its rate, the median
	// among them: one server's few errors made a fault among six
	// healthy servers with none wait (18 in 420 requests beside 0 in
	// 420 is 0.006 at three times; beside four such, 2·10⁻⁷). Where the
	// backend's median is known, a peer's long baseline counts in place
	// of its span, where it holds more requests, while neither the span
	// nor the peer's last 17 minutes stand above it (historyAlpha): a
	// peer failing as it always has lends its history, so that a few
	// errors over a short span do not slow a real fault's finding (on
	// the spans alone, a 2% fault at N=3 and 5 req/s was found in a
	// median 351 s, not 295).
	//
	// In place of the span, not beside it: the baseline learns each
	// quiet chunk at once in the warm-up, and 17 minutes late after it,
	// so early in a day it holds the span's own chunks, and beside the
	// span it counted a quiet peer's few errors twice (8 in 2,951
	// requests, and again 8 in 2,900): a healthy server at 2.6 times
	// the median (44 in 1,515) was condemned 759 s into its day (the
	// soak, --servers 3 --rate 2 --hetero 0.5 --noise 0.012 --seeds
	// 401-404; TestPeerHistoryCountsOnce).
	//
	// The last 17 minutes as well as the span: in a fleet-wide incident
	// at N=3 and 5 req/s the peers' spans of 38 s (338 requests) held 2
	// errors by chance, where 5% gives 17, did not stand above their
	// histories at 0.22%, and lent them: a server beside them (20 in
	// 191) was condemned 666 s into the incident (the soak, --servers 3
	// --rate 5 --fleet-fault 0.05 --trials 50 --seeds 1-4;
	// TestPeerHistoryInAnIncident). A fault on the server alone leaves
	// its peers' minutes as they were, and their histories are lent as
	// before.
	//
	// A peer whose span or minutes stand above its history (a fault, or
	// a fleet-wide incident) is judged on its span in the pooled rate,
	// and stays off the median's side, where its point in the edge
	// above judges it: there, at N=3, a server at 20% beside peers at
	// 5% and 0.2% was not condemned until its counts
	// showed it above three times the 5% (minutes at 33 req/s, or not
	// in four), while its 5% peer was, and the guardrails' serving
	// floor would have kept the worse one serving (TestSequential's two
	// of three faulty). The median's side is asked once the backend's
	// median is known: before, it has the spans alone, one server's at
	// N=3, and from a cold start a 5% fault at N=3 was found in a median
	// 29 s at 33 req/s, not 19, and 211 s at 5 req/s, not 102 (a
	// throwaway probe of 200 seeds); while cold, the edge above takes the
	// median one sigma up, at a level shared among the looks.
	var un, ux float64
	for _, c := range q.refs {
		if !c.self && !c.above && byRate(c.Counts, ref.Counts) >= 0 {
			un += c.pn
			ux += c.px
		}
	}
	r := q.cfg.HealthyRatio
	if m > 0 && !beyond(n, x, pm, py, r, alpha) ||
		q.known && un > 0 && !beyond(n, x, un, ux, r, alpha) {
		return false, 0, now
	}
	return beyond(n, x, float64(m), float64(y), 1, peerAlpha), lowerRate(float64(m), float64(y), 3), now
}

// lends: peer p, with counts c over the peer check's span, may lend its
// long baseline: neither c nor its last 17 minutes stand above the
// baseline's upper bound at historyAlpha (see peerCheck). minutes are
// those 17 minutes' counts, where c does not stand above it.
func (q *Sequential) lends(p *SeqServer, c Counts) (minutes Counts, ok bool) {
	hi := p.baselineHigh()
	if stats.BinomialUpperTail(c.N, c.X, hi) < historyAlpha {
		return Counts{}, false
	}
	n, x := q.span(p, ringChunks)
	return Counts{N: n, X: x}, stats.BinomialUpperTail(n, x, hi) >= historyAlpha
}

// spanCounts are a server's counts over the peer check's span, and what
// the two-sample tests pool of it (pn, px): the span, or its long
// baseline where the check may take it and it holds more requests.
type spanCounts struct {
	Counts
	pn, px float64
	above  bool // a peer whose span or last 17 minutes stand above its baseline
	self   bool // the server checked
	// minutes: a lending peer's last 17 minutes, where they hold more
	// requests than its span, which the edge above the median reads in
	// its place where two peers or more lend (see peerCheck).
	minutes Counts
}

// beyond: x errors in n requests are more than ratio times the rate of y
// errors in m requests (m > 0), at level alpha: the conditional test of
// two Poisson rates, under which, given the x+y errors, x is binomial in
// the first's share of the requests weighted by the ratio.
func beyond(n, x uint64, m, y, ratio, alpha float64) bool {
	w := ratio * float64(n)
	return stats.BinomialUpperTail(x+uint64(math.Round(y)), x, w/(w+m)) < alpha
}
