package haproxy

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// haproxyServer models one server's rtime as HAProxy keeps it
// (stream_update_time_stats): the sum slides over 512 samples once the
// server has more than 512 requests, and is read over the requests so
// far until then, rounded up (RTimeOf).
type haproxyServer struct {
	sum     uint32
	answers int64
}

func (s *haproxyServer) answer(ms uint32) {
	n := uint32(0)
	if s.answers >= TimeSamples { // HAProxy: cum_req > 512, counted before
		n = TimeSamples
	}
	s.sum = SwrateAdd(s.sum, n, ms)
	s.answers++
}

func (s *haproxyServer) rtime() int { return int(RTimeOf(s.sum, s.answers)) }

// TestSpanMean: the mean of the answers between two reads, from
// HAProxy's rounded sliding average, within the rounding's error: a
// steady body, a step up and a step down mid-stream (the span's answers
// alone, whatever came before), and random bodies with a slow tail.
func TestSpanMean(t *testing.T) {
	tests := []struct {
		name         string
		before, span func(*rand.Rand) uint32
		n            int64
	}{
		{"steady 11 ms", fixed(11), fixed(11), 64},
		{"steady 0 ms", fixed(0), fixed(0), 64},
		{"a step up from 11 to 85 ms", fixed(11), fixed(85), 64},
		{"a step down from 1500 to 20 ms", fixed(1500), fixed(20), 64},
		{"a step up over a long span", fixed(11), fixed(85), 2000},
		{"lognormal 20 ms body, 5% at 1.5 s", lognormal(20, 0.6, 0), lognormal(20, 0.6, 0.05), 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var worst float64
			for seed := range uint64(200) {
				rng := rand.New(rand.NewPCG(seed, 1))
				var s haproxyServer
				for range 3000 {
					s.answer(tt.before(rng))
				}
				r0 := s.rtime()
				var total float64
				for range tt.n {
					ms := tt.span(rng)
					total += float64(ms)
					s.answer(ms)
				}
				want := total / float64(tt.n)
				got := SpanMean(r0, s.rtime(), tt.n)
				// the mean is of answers weighted a^(n-i): over a span
				// of answers that differ, the weights differ by up to
				// 1 - a^n; allow for that against the spread
				worst = max(worst, math.Abs(got-want))
				if tol := 8.5 + spread(tt.n)*want; math.Abs(got-want) > tol {
					t.Fatalf("seed %d: span mean %.2f ms, the answers' %.2f ms: off by more than %.1f", seed, got, want, tol)
				}
			}
			t.Logf("worst error over 200 seeds: %.2f ms", worst)
		})
	}
}

// spread bounds how far the weighted mean may lie from the plain one,
// as a share of it, for answers that differ: the weights' range.
func spread(n int64) float64 { return 1 - math.Pow(1-1.0/TimeSamples, float64(n)) }

func fixed(ms uint32) func(*rand.Rand) uint32 { return func(*rand.Rand) uint32 { return ms } }

func lognormal(median, sigma, slowShare float64) func(*rand.Rand) uint32 {
	return func(rng *rand.Rand) uint32 {
		if rng.Float64() < slowShare {
			return 1500
		}
		return uint32(median * math.Exp(sigma*rng.NormFloat64()))
	}
}

// TestRecentMean: HAProxy's own rtime until there is a span of
// MinSpanAnswers beyond its first 512 answers; then the mean of the last
// MeanSpan (further back for a quiet server), its grains capped by the
// typical one; the last mean while there are too few answers; and afresh
// when the count goes back (`clear counters`).
func TestRecentMean(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var s haproxyServer
	var m RecentMean
	sec := 0
	// read adds k answers of ms each over the next second and reads.
	read := func(k int, ms uint32) float64 {
		for range k {
			s.answer(ms)
		}
		sec++
		return m.Add(start.Add(time.Duration(sec)*time.Second), s.rtime(), s.answers)
	}
	for range 600 {
		s.answer(40)
	}
	if v := read(0, 0); v != float64(s.rtime()) {
		t.Fatalf("the first read: %.2f, want HAProxy's rtime %d", v, s.rtime())
	}
	if v := read(30, 11); v != float64(s.rtime()) {
		t.Fatalf("over 30 answers, under MinSpanAnswers: %.2f, want HAProxy's rtime %d", v, s.rtime())
	}
	if v := read(40, 11); math.Abs(v-11) > 8.5 { // the rounding's bound
		t.Fatalf("over 70 answers of 11 ms: %.2f", v)
	}
	// 50 answers a second for 30 s, then a step to 200 ms: the mean
	// covers the last ten seconds; the new grains count at the cap
	// (twice the typical grain, or 50 ms above it: 61 ms) until they
	// are the typical one, more than half of the last 20 s, and then in
	// full
	for range 30 {
		read(50, 11)
	}
	for k := 1; k <= 15; k++ {
		v := read(50, 200)
		var want float64
		switch {
		case k <= 9:
			want = (float64(k)*61 + float64(10-k)*11) / 10
		case k >= 12:
			want = 200
		default:
			continue // the typical grain turns over
		}
		if math.Abs(v-want) > 4 {
			t.Fatalf("%d s after the step: mean %.2f, want about %.2f", k, v, want)
		}
	}
	// a pause: one second's 50 answers held 500 ms each, among 20 ms
	// ones: capped at 50 ms above the typical grain, a tenth of that on
	// the mean
	for range 30 {
		read(50, 20)
	}
	if v := read(50, 520); math.Abs(v-25) > 4 {
		t.Fatalf("after a pause: mean %.2f, want about 25 (uncapped: 70)", v)
	}
	// a quiet server: 10 answers a second, the span reaches back to 64;
	// within the rounding's bound, 512 ms over 64 answers
	for range 20 {
		read(10, 30)
	}
	if v := read(10, 30); math.Abs(v-30) > 8.5 {
		t.Fatalf("at 10 answers a second of 30 ms: %.2f", v)
	}
	// silent: the last mean stays
	for range 5 {
		if v := read(0, 0); math.Abs(v-30) > 8.5 {
			t.Fatalf("silent: %.2f", v)
		}
	}
	// cleared: the count goes back, HAProxy's rtime until a new span
	if v := m.Add(start.Add(time.Duration(sec+1)*time.Second), 7, 5); v != 7 {
		t.Fatalf("across a clear: %.2f, want HAProxy's rtime 7", v)
	}
	// a server within HAProxy's first 512 answers: the sum only grows,
	// rtime is it over the answers so far, and a span's mean is the
	// difference of the sums: after 200 answers at 20 ms, a step to 80
	// ms reads 80 once its answers fill the last MeanSpan, where rtime
	// has moved only part way
	var young haproxyServer
	var ym RecentMean
	for i := range 8 {
		ms := uint32(20)
		if i >= 4 {
			ms = 80
		}
		for range 50 {
			young.answer(ms)
		}
		v := ym.Add(start.Add(time.Duration(3*i)*time.Second), young.rtime(), young.answers) // 3 s apart
		if i == 7 && (math.Abs(v-80) > 4 || young.rtime() > 60) {
			t.Fatalf("200 answers into a step to 80 ms, within the first 512: mean %.2f (rtime %d)", v, young.rtime())
		}
	}
}

// TestRecentMeanKeepsLittle: a poll every 100 ms keeps one span a
// second, not one a read.
func TestRecentMeanKeepsLittle(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var s haproxyServer
	var m RecentMean
	for i := range 3000 {
		for range 5 {
			s.answer(11)
		}
		m.Add(start.Add(time.Duration(i)*100*time.Millisecond), s.rtime(), s.answers)
	}
	if n, most := len(m.grains), int(maxSpanAge/spanGrain)+1; n > most {
		t.Fatalf("%d spans kept, want at most %d", n, most)
	}
}
