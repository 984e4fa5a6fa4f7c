package haproxy

import (
	"math"
	"time"

	"github.com/hapilot/hapilot/internal/lib/stats"
)

// TimeSamples is HAProxy's TIME_STATS_SAMPLES: the number of samples its
// sliding averages (rtime, qtime, ctime, ttime) are kept over. The stats
// page says "the last 1024 requests"; HAProxy's source keeps 512, since
// such an average is within 95% of two batches of them.
const TimeSamples = 512

// SwrateAdd is HAProxy's swrate_add_dynamic: the sliding sum after one
// more sample v, of n samples (0 while the server has answered at most
// TimeSamples requests: the sum then only grows). rtime is
// SwrateAvg(sum, n) with n the requests so far, up to TimeSamples (2.6
// reads 52 ms after 100 answers of 50 ms). The lab models HAProxy's
// rtime with it.
func SwrateAdd(sum, n, v uint32) uint32 {
	if n == 0 {
		return sum + v
	}
	return sum - (sum+n-1)/n + v
}

// SwrateAvg is HAProxy's swrate_avg: the average a sliding sum stands
// for, rounded up.
func SwrateAvg(sum, n uint32) uint32 { return (sum + n - 1) / n }

// RTimeOf is the rtime `show stat` prints for a server whose sliding sum
// is sum after requests requests: the sum over the requests so far, up
// to TimeSamples.
func RTimeOf(sum uint32, requests int64) uint32 {
	if requests <= 0 {
		return 0
	}
	return SwrateAvg(sum, uint32(min(requests, TimeSamples)))
}

// RecentMean turns HAProxy's rtime, a sliding average that each answer
// moves by 1/512 of the way to its own time, back into the mean time of
// a server's answers of the last MeanSpan. Read raw, rtime moves two
// thirds of the way to a new level only after 560 answers (11 s at 50
// answers a second, 22 s at 25), and the stats path found a slow tail
// that began mid-stream 13-21 s after its onset where the per-response
// paths took 6-10 s (docs/explanation/detection.md). Worse, it weighs a
// pause by the rate: a second's pause (every answer held for it: a GC
// pause, a throttled CPU) moves it by rate/512 × 500 ms, 98 ms at 100
// answers a second, twice the median test's whole margin.
//
// Over m answers of mean v, HAProxy's sum goes from s0 to s0·a^m +
// v·512·(1 − a^m), a = 1 − 1/512, so that between two reads
//
//	v = (r1 − r0·a^m) / (1 − a^m)
//
// from their averages r0 and r1 (SpanMean), and m·v is the answers' time.
// (Before its 513th answer the sum only grows, and rtime is it over the
// answers so far: a span's time is then r1·c1 − r0·c0.) Each read is
// rounded up to a whole ms, which the division magnifies over a short
// span; summed over consecutive reads the errors cancel but for the
// first read's and the last's, 512 ms of answer time at most: over
// MinSpanAnswers answers, 8 ms on the mean.
//
// A mean has no tail, and a pause moves it as a slow tail does: a
// second's pause adds 500 ms a second of span at any rate, 50 ms over
// MeanSpan, the whole margin the median test allows above a server's
// peers (LatencyMinMs). So the mean is winsorized over grains of at
// least a second and grainAnswers answers: no grain counts above the
// larger of twice the server's typical grain (the median of its grains
// of the last CapSpan) and grainCapMs above it. A pause lives in one
// grain or two and counts there at most grainCapMs, a fifth of the
// margin over MeanSpan; it takes more than half CapSpan's grains, five
// such pauses in 20 s, to raise the cap. A tail that moves the mean lives
// in every grain, and once it has lasted half CapSpan the typical grain
// carries it and it counts in full: the cost is that time, about 10 s,
// before the stats path sees a tail move the mean (the per-response
// paths see each slow answer). A tail too sparse to be in most grains
// (one answer in a hundred at 10 s) stays capped longer: the median,
// not a higher quantile, because a higher one let clustered pauses
// through.
type RecentMean struct {
	last   meanRead
	have   bool
	grains []meanSpan // from the oldest, within maxSpanAge of the latest
	means  []float64  // scratch: the grains' means, for their median
	mean   float64
	ok     bool
}

// meanRead is one read of a server: its rtime and its answers so far.
type meanRead struct {
	at      time.Time
	rtime   int
	answers int64
}

// meanSpan is what came between reads: n answers that took ms in all,
// over secs seconds ending at.
type meanSpan struct {
	at   time.Time
	secs float64
	ms   float64
	n    int64
}

// MeanSpan is how far back the mean reaches (see RecentMean): far enough
// that a capped pause moves it by a fifth of LatencyMinMs, and no
// further, so that a tail is seen as soon as the cap lets it through.
const MeanSpan = 10 * time.Second

// CapSpan is how far back the typical grain, which the cap is set from,
// is taken: twice MeanSpan, so that pauses must fill more than half of
// 20 s to raise it, and a tail raises it in about 10 s.
const CapSpan = 2 * MeanSpan

// MinSpanAnswers is the fewest answers a mean is taken over (see
// RecentMean): a quieter server's span reaches further back, up to
// maxSpanAge.
const MinSpanAnswers = 64

// minCapGrains is the fewest grains the typical grain is the median of,
// reaching beyond CapSpan for a quiet server: a pause touches two at
// most, which the median of five never is.
const minCapGrains = 5

// maxSpanAge bounds how far back a quiet server's span may reach. One
// with fewer than MinSpanAnswers answers in that long keeps its last
// mean.
const maxSpanAge = 3 * CapSpan

// spanGrain and grainAnswers: a grain closes once it holds a second and
// 25 answers (see RecentMean). A second, the tail test's minimum
// duration, is what a pause may fill; 25 answers, so that a tail whose
// slow answers move the mean past the margin (3% or more at a second and
// a half on a fast body) has one in most grains, and the typical grain
// carries it; and a fast poll keeps one grain a second.
const (
	spanGrain    = time.Second
	grainAnswers = 25
)

// grainCapRatio and grainCapMs: no grain counts above the larger of
// twice the typical grain and 50 ms above it, the median test's margin
// (LatencyMinMs): a grain of the typical one's level always counts in
// full, and a pause's grain adds at most the margin, spread over the
// span's ten seconds.
const (
	grainCapRatio = 2
	grainCapMs    = 50
)

// Add takes a read of a server at a time: its rtime and the answers it
// has given (a running count; one lower than the last starts afresh, as
// after `clear counters`). It returns the answer time, in ms, to record
// the read's answers at: the mean of the last MeanSpan's (or more, up to
// MinSpanAnswers); while there are too few, the last such mean, or
// before any, HAProxy's own rtime.
func (m *RecentMean) Add(at time.Time, rtime int, answers int64) float64 {
	if m.have && answers < m.last.answers {
		*m = RecentMean{} // counters cleared
	}
	// Up to its 512th answer HAProxy's sum only grows, and rtime is it
	// over the answers so far: the span's time is the difference of the
	// two sums. From there it slides (SpanMean). A span across the two
	// is skipped.
	if n := answers - m.last.answers; m.have && (answers <= TimeSamples || m.last.answers >= TimeSamples) {
		sp := meanSpan{at: at, secs: at.Sub(m.last.at).Seconds(), n: n}
		switch {
		case n <= 0:
		case answers <= TimeSamples:
			sp.ms = max(float64(rtime)*float64(answers)-float64(m.last.rtime)*float64(m.last.answers), 0)
		default:
			sp.ms = float64(n) * SpanMean(m.last.rtime, rtime, n)
		}
		if k := len(m.grains) - 1; k >= 0 && !m.grains[k].closed() {
			g := m.grains[k]
			m.grains[k] = meanSpan{at: at, secs: g.secs + sp.secs, n: g.n + sp.n, ms: g.ms + sp.ms}
		} else {
			m.grains = append(m.grains, sp)
		}
	}
	m.last, m.have = meanRead{at: at, rtime: rtime, answers: answers}, true
	drop := 0
	for drop < len(m.grains)-1 && at.Sub(m.grains[drop].at) > maxSpanAge {
		drop++
	}
	m.grains = append(m.grains[:0], m.grains[drop:]...)
	if v, ok := m.span(at); ok {
		m.mean, m.ok = v, true
	}
	if m.ok {
		return m.mean
	}
	return float64(rtime)
}

// closed says the grain holds what a grain must (spanGrain, grainAnswers).
func (g meanSpan) closed() bool { return g.secs >= spanGrain.Seconds() && g.n >= grainAnswers }

// span is the winsorized mean of the latest grains that cover MeanSpan
// and MinSpanAnswers (see RecentMean), at now; false when all of them
// hold fewer answers.
func (m *RecentMean) span(now time.Time) (float64, bool) {
	var secs float64
	var n int64
	from := len(m.grains)
	for from > 0 && (secs < MeanSpan.Seconds() || n < MinSpanAnswers) {
		from--
		secs, n = secs+m.grains[from].secs, n+m.grains[from].n
	}
	if n < MinSpanAnswers {
		return 0, false
	}
	// The typical grain: the median of the whole grains of CapSpan, or
	// of the last minCapGrains.
	m.means = m.means[:0]
	for i := len(m.grains) - 1; i >= 0; i-- {
		g := m.grains[i]
		if now.Sub(g.at) >= CapSpan && len(m.means) >= minCapGrains {
			break
		}
		if g.closed() {
			m.means = append(m.means, g.ms/float64(g.n))
		}
	}
	limit := math.Inf(1)
	if len(m.means) > 0 {
		typical := stats.LowerMedian(m.means)
		limit = max(grainCapRatio*typical, typical+grainCapMs)
	}
	var ms float64
	for _, g := range m.grains[from:] {
		if g.n > 0 {
			ms += float64(g.n) * min(g.ms/float64(g.n), limit)
		}
	}
	return ms / float64(n), true
}

// SpanMean is the mean time, in ms, of n answers that took HAProxy's
// rtime from r0 to r1 (see RecentMean). HAProxy rounds both the read
// (the sum over 512, up) and each step's decay (the sum less its 512th,
// up): half a ms each way on average, which cancel, so that the plain
// formula is unbiased. A mean below zero (rounding, at a fast server) is
// zero.
func SpanMean(r0, r1 int, n int64) float64 {
	if n <= 0 {
		return float64(r1)
	}
	a := math.Pow(1-1.0/TimeSamples, float64(n))
	return max((float64(r1)-float64(r0)*a)/(1-a), 0)
}
