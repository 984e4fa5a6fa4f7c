package rules

import (
	"fmt"
	"math"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/stats"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// The tail test: a server whose share of slow answers has grown is
// drained, whatever its median. The median test (latency.go) judges a 60
// s window's median: a slow tail (5% of answers at 1.5 s) never moves it,
// and a whole slowdown moves it only once half the window is slow.
//
// A slow answer is one at or over the server's threshold T: TailRatio ×
// the backend's p95 and at least LatencyMinMs above it, the backend's p95
// being the lower median of the judged servers' window p95s (so that up to
// half of them slow cannot raise it); scaled up by the server's own
// window median over the backend's where that is higher, so that a
// healthy server whose answers are simply slower than its peers' (its
// whole distribution, median and all) has no more slow answers than they
// do. The windows tally answers by quarter octave (window.TailSlot): the
// answers over T are those of the slots above T's and the part of T's
// slot above it, the slot's answers taken as spread evenly in log time. The median
// moves little under a tail (a 5% tail moves it to the body's 52.6th
// percentile), so the threshold stays where it was while the tail grows.
//
// Each check, each server's new answers and new slow answers are one
// chunk of a second Sequential (sequential.go), with its own baselines:
// the CUSUM of the binomial log-likelihood ratio of the slow share
// against the larger of the backend's healthy median share and the
// server's own, a bank of alternatives from p1min = max(TailFloor,
// DegradedRatio × that median), a threshold from ARLDays, and the same
// peer check. A fleet-wide slowdown drains nothing: the peers' share
// rises alike, which lifts H0 and fails the peer check, and the
// backend's p95 follows within the window.
//
// Stalls: a stall (a GC pause, a throttled CPU) slows every answer that
// arrives during it, so its slow answers come together, as many as the
// traffic brings in its span: a 500 ms pause at 50 answers a second slows
// about 20 of one check's answers, or of two where it straddles them. A
// slow tail's come apart: 5% at 50 a second is 2 or 3 a check. The
// binomial test takes answers as independent, and so reads a stall as
// overwhelming evidence; with a minimum duration alone, two or three
// pauses close together (which pauses at random times, once a minute,
// bring every few hours) drained healthy servers (TestTailStalls). So
// the tail test judges a stall as one event, not as its answers:
//
//   - A check with more slow answers than a tail at 5% (or at the bank's
//     second alternative, 3 × the degraded line, where higher) gives at
//     three standard deviations is a stall (Sequential.StallCounts): its
//     slow answers are left out and its fast ones count. A stall that
//     outlasts the minimum duration's window (more than W checks in a
//     row) is a slowdown, and from then on its checks count in full: a
//     whole slowdown is found, a few checks later than before.
//   - A burst of fewer slow answers (a short pause slows a few, as many
//     as a tail's unlucky check) is cut by the minimum duration
//     (sequential.go): no window of W checks brings more than a fifth of
//     h. The tail test's is tailMinDuration, W = 2 checks: the shortest
//     that forgives a pause under a second wherever it falls against the
//     checks. Without the cut, a 200 ms pause (about 5 slow answers at
//     50 a second, half of h at the tail's alternatives) would drain a
//     server whenever two came a few seconds apart.
//   - No tokens (everyBurst): a pause that comes back every minute is the
//     server's normal, not a flapping fault, and each burst is cut on its
//     own, however close the next.
//
// What the cut costs: it takes out what the tail's first window brought
// beyond the credit, and later the excess of its luckiest window, so a
// tail is found about W + 0.8·B + that excess after it starts (B its
// bound, ln(ARL)/KL in seconds), within 2·B where B is a few seconds or
// more. The credit (a fifth of h) is what a pause a minute allows at the
// promise's rate: each burst leaves a chance of about e^(-0.8h) that
// healthy traffic does the rest, against 1,440 pauses a server-day.
//
// The stats path has no tail: every answer it records carries the mean
// answer time of the server's last 10 s of answers, read out of
// HAProxy's rtime with a pause's grains capped (haproxy.RecentMean). For
// a server whose chunk is all such answers, the threshold is the median
// test's instead: LatencyRatio × the judged servers' lower median p50 and
// LatencyMinMs above it, and, once the server's latency baseline is
// learned (latency.go), its margin above that baseline. A mean at or over
// it makes the chunk's every answer slow. So the stats path judges its
// mean as the median test would, each check, instead of a 60 s window's
// median of it (which moved only once half the window was slow; the
// median test leaves such servers to this, statsOnly): a tail is found
// there when it moves the mean that far, once it is the server's typical
// grain (more than half of 20 s after its onset). The reason says its
// figure is a mean.

// TailMinRate is the least rate of answers, a second, at which a
// server's answers are judged (and its median and p95 count in the
// backend's): 16, about 1,000 answers in the agent's 60 s window. The
// threshold rests on window quantiles, and on fewer answers their
// sampling noise moves it from check to check: in a heavy body's far
// tail that moves the slow share more than a binomial's noise, which the
// CUSUM's threshold does not allow for. The soak's harsh model (two
// servers at 5 req/s, answers lognormal with log-sd 1.5) drained 5
// healthy servers in 1,000 server-days so (12 with a ratio of 3, deeper
// in the tail). A rate, not a count of the window's answers, so that a
// busy server is judged from its window's third second (RatePerSec), not
// once its window has filled. Under it, the median test judges as before.
const TailMinRate = 16

// tailBackend is the tail test's state for one backend.
type tailBackend struct {
	q       *Sequential
	servers map[string]*SeqServer
	// last: each server's tallies at the last read.
	last map[string]tallies
	// found: what the last chunk condemned, with the threshold it was
	// judged at; meanOnly: servers whose last chunk was all the stats
	// path's answers (a mean, no tail).
	found    map[string]int
	meanOnly map[string]bool
	// per-call scratch
	chunks  []tallies
	fresh   []bool
	octs    []int
	at      []float64
	seen    map[string]bool
	srv     []*SeqServer
	in      []Counts
	serving []bool
	idx     []int
	p50s    []float64
	p95s    []float64
	// p95 is the backend's p95 the last thresholds came from, in ms;
	// floor each server's threshold (ms, rounded up; 0 when it was not
	// judged).
	p95, p50 int
	floor    map[string]int
	// carry: each server's fraction of a slow answer not yet counted.
	carry map[string]float64
	// stall: each server's run of stall checks (StallCounts).
	stall map[string]int
}

// tallies is one server's running totals that the tail test reads.
type tallies struct {
	oct          [window.TailSlots]uint32
	req, counted uint64
}

func talliesOf(st window.Stats) tallies {
	return tallies{oct: st.TotalTail, req: st.TotalRequests, counted: st.TotalCounted}
}

// tailMinDuration bounds the tail test's minimum duration (see Stalls):
// a pause under a second touches at most two one-second checks.
const tailMinDuration = time.Second

// stallSigmas, stallAlt and stallShare: a check is a stall when its
// slow answers are more than stallSigmas standard deviations (and one
// answer) above what a tail would give at the larger of stallShare and
// the bank's stallAlt-th alternative (3 × the degraded line): the tails
// the test is asked to find at full speed (issue 42's 5%, and the dilute
// alternatives; 10 and 30 × the line are a slowdown's scale) rarely
// pass it, and a pause of half a second does at 25 answers a second and
// more. A share, not the line alone: in a fleet whose answers are never
// slow the line is the tail floor's 0.2%, and a 5% tail would read as a
// train of pauses. The cost: a tail well above the share (20%, a whole
// slowdown of 3x) has many checks over it, left out until they come in a
// row, and is found in seconds more than a 5% one.
const (
	stallSigmas = 3
	stallAlt    = 1
	stallShare  = 0.05
)

// StallCounts is what the tail test judges of one check of a server
// whose counts are c (N answers, X slow), its run of stall checks in
// *run (kept by the caller, one per server): c itself, or, for a stall
// (more slow answers than a tail explains, see Stalls) no longer than
// the minimum duration's window, its fast answers alone. The soak feeds
// its Sequential through it as the agent does.
func (q *Sequential) StallCounts(c Counts, run *int) Counts {
	p := min(max(q.P1Min()*bank[stallAlt], stallShare), maxP1)
	n := float64(c.N)
	if c.X == 0 || float64(c.X) <= n*p+stallSigmas*math.Sqrt(n*p*(1-p))+1 {
		*run = 0
		return c
	}
	if *run++; *run > q.w {
		return c // a slowdown: longer than a stall may be
	}
	return Counts{N: c.N - c.X}
}

// TailConfig is the sequential test's settings for slow answers: the
// tail's floor as the degraded region's, half of it as the healthy
// region's (as the 5xx test's 0.5% is half its 1%), and a minimum
// duration of a stall's (see above). The soak runs its Sequential with
// them.
func (c Config) TailConfig() Config {
	t := c
	t.Floor = c.TailFloor
	t.HealthyFloor = c.TailFloor / 2
	t.MinDuration = min(c.MinDuration, tailMinDuration)
	t.everyBurst = true
	return t
}

func newTailBackend(cfg Config) *tailBackend {
	return &tailBackend{q: NewSequential(cfg.TailConfig()), servers: map[string]*SeqServer{}, last: map[string]tallies{}, carry: map[string]float64{}, stall: map[string]int{}}
}

// TailThreshold is the least answer time, in ms, the tail test counts
// as slow for a server whose window median is p50, in a backend whose
// p95 and median are p95b and p50b.
func (c Config) TailThreshold(p50, p50b, p95b int) float64 {
	t := max(c.TailRatio*float64(p95b), float64(p95b+c.LatencyMinMs))
	if p50 > p50b {
		t *= float64(p50) / float64(max(p50b, 1))
	}
	return t
}

// tailSlot is the first tally slot all of whose answers are at or
// over t ms; TailSlots when none is (t beyond the tallies' top).
func tailSlot(t float64) int {
	for k := 1; k < window.TailSlots; k++ {
		if float64(window.TailSlotFloorMs(k)) >= t {
			return k
		}
	}
	return window.TailSlots
}

// step feeds the tail test one chunk of b, dt seconds since the last.
// lat holds each server's latency baseline (the 5xx test's state).
func (tb *tailBackend) step(c Config, b agent.BackendView, dt float64, lat map[string]*SeqServer) {
	tb.srv, tb.in, tb.serving = tb.srv[:0], tb.in[:0], tb.serving[:0]
	// Kept between calls, cleared: the loop calls this every second,
	// on every server.
	if tb.found == nil {
		tb.found, tb.meanOnly, tb.floor, tb.seen = map[string]int{}, map[string]bool{}, map[string]int{}, map[string]bool{}
	}
	clear(tb.found)
	clear(tb.meanOnly)
	clear(tb.floor)
	clear(tb.seen)
	n := len(b.Servers)
	tb.chunks = append(tb.chunks[:0], make([]tallies, n)...)
	tb.fresh = append(tb.fresh[:0], make([]bool, n)...)
	tb.octs = append(tb.octs[:0], make([]int, n)...)
	tb.at = append(tb.at[:0], make([]float64, n)...)
	chunks, seen, fresh, octs, at := tb.chunks, tb.seen, tb.fresh, tb.octs, tb.at
	for i, s := range b.Servers {
		seen[s.Server] = true
		tot := talliesOf(s.Window)
		last, ok := tb.last[s.Server]
		tb.last[s.Server] = tot
		// The first read only sets the mark; a total that went back (the
		// series forgotten and made again) does the same.
		if !ok || tot.req < last.req || tot.counted < last.counted {
			continue
		}
		d := tallies{req: tot.req - last.req, counted: tot.counted - last.counted}
		for k := range d.oct {
			d.oct[k] = tot.oct[k] - last.oct[k] // modulo 2^32, as kept
		}
		chunks[i], fresh[i] = d, true
		if d.req > 0 && d.counted >= d.req {
			tb.meanOnly[s.Server] = true
		}
	}
	for name := range tb.servers {
		if !seen[name] {
			delete(tb.servers, name)
			delete(tb.last, name)
			delete(tb.carry, name)
			delete(tb.stall, name)
		}
	}
	// The backend's p50 and p95: the lower medians of the judged servers'
	// windows, those with per-answer times only.
	judged := func(s agent.ServerView) bool {
		return c.latencyJudged(s) && s.Window.RatePerSec >= TailMinRate && !tb.meanOnly[s.Server]
	}
	tb.p50s, tb.p95s = tb.p50s[:0], tb.p95s[:0]
	for _, s := range b.Servers {
		if judged(s) {
			tb.p50s = append(tb.p50s, float64(s.Window.P50Ms))
			tb.p95s = append(tb.p95s, float64(s.Window.P95Ms))
		}
	}
	p50b, p95b := int(stats.LowerMedian(tb.p50s)), int(stats.LowerMedian(tb.p95s))
	tb.p95 = p95b
	// The mean's threshold: the median test's, against the lower median
	// of the stats path's servers' means: each one's window median, or
	// its mean in this chunk (its median slot's floor) where higher, so
	// that a fleet-wide change moves the reference at once, not when half
	// the window has seen it.
	tb.p50s = tb.p50s[:0]
	for i, s := range b.Servers {
		if fresh[i] && tb.meanOnly[s.Server] && c.latencyJudged(s) {
			tb.p50s = append(tb.p50s, float64(max(s.Window.P50Ms, window.TailSlotFloorMs(medianSlot(&chunks[i].oct)))))
		}
	}
	tb.p50 = int(stats.LowerMedian(tb.p50s))
	meanT := max(c.LatencyRatio*float64(tb.p50), float64(tb.p50+c.LatencyMinMs))
	for i, s := range b.Servers {
		st := tb.servers[s.Server]
		if st == nil {
			st = &SeqServer{}
			tb.servers[s.Server] = st
		}
		var in Counts
		octs[i] = window.TailSlots
		onMean := tb.meanOnly[s.Server] && c.latencyJudged(s) && c.LatencyRatio > 0
		switch {
		case fresh[i] && onMean && len(tb.p50s) > 1 && chunks[i].req > 0:
			// A mean: every answer of the chunk at one time, counted
			// from the first slot wholly at or over the threshold.
			t := meanT
			if st := lat[s.Server]; st != nil && st.lat.learned() && c.LatencyBaselineRatio > 0 {
				t = max(t, math.Exp(st.lat.mean()+c.slowMargin(&st.lat)))
			}
			octs[i] = tailSlot(t)
			if octs[i] < window.TailSlots {
				at[i] = float64(window.TailSlotFloorMs(octs[i]))
				for k, n := range chunks[i].oct {
					in.N += uint64(n)
					if k >= octs[i] {
						in.X += uint64(n)
					}
				}
			}
		case fresh[i] && judged(s) && len(tb.p95s) > 0:
			// Answers: those of the slots above the threshold's, and of
			// its own slot the share above it, as if spread evenly in
			// log time over the slot. Rounding the threshold to a slot
			// instead moved it by up to 25%, and in a healthy body's far
			// tail that moved servers' shares threefold apart: enough
			// for the one rounded down to look degraded against the rest.
			// The fractions carry from check to check.
			t := c.TailThreshold(s.Window.P50Ms, p50b, p95b)
			at[i] = t
			x := slowShare(&chunks[i].oct, t) + tb.carry[s.Server]
			for _, n := range chunks[i].oct {
				in.N += uint64(n)
			}
			in.X = min(uint64(x), in.N)
			tb.carry[s.Server] = x - math.Floor(x)
			run := tb.stall[s.Server]
			in = tb.q.StallCounts(in, &run)
			tb.stall[s.Server] = run
		default:
			// not judged on answers (or a mean, whose grains cap a
			// stall: haproxy.RecentMean): no run of stalls
			delete(tb.stall, s.Server)
		}
		if at[i] > 0 {
			tb.floor[s.Server] = int(math.Ceil(at[i]))
		}
		tb.srv = append(tb.srv, st)
		tb.in = append(tb.in, in)
		tb.serving = append(tb.serving, s.Serving())
	}
	tb.idx = tb.q.Step(dt, tb.srv, tb.in, tb.serving, tb.idx)
	for _, i := range tb.idx {
		if at[i] > 0 {
			tb.found[b.Servers[i].Server] = int(math.Ceil(at[i]))
		}
	}
}

// slowShare is how many of the tallies' answers are at or over t ms:
// every answer of the slots above t's, and of t's slot the part above t,
// taking its answers as spread evenly over the slot in log time (in ms
// under 32, the first slot's range).
func slowShare(tl *[window.TailSlots]uint32, t float64) float64 {
	k := min(window.TailSlot(int(t)), window.TailSlots-1)
	var x float64
	for j := k + 1; j < window.TailSlots; j++ {
		x += float64(tl[j])
	}
	lo, hi := float64(window.TailSlotFloorMs(k)), float64(window.TailSlotFloorMs(k+1))
	switch {
	case k+1 >= window.TailSlots:
		if t <= lo {
			x += float64(tl[k])
		}
	case lo <= 0:
		x += float64(tl[k]) * max(0, hi-t) / hi
	default:
		x += float64(tl[k]) * max(0, math.Log(hi/max(t, lo))) / math.Log(hi/lo)
	}
	return x
}

// medianSlot is the slot that holds the median of the tallies' answers.
func medianSlot(t *[window.TailSlots]uint32) int {
	var n, seen uint64
	for _, c := range t {
		n += uint64(c)
	}
	for k, c := range t {
		seen += uint64(c)
		if 2*seen >= n && n > 0 {
			return k
		}
	}
	return 0
}

// drain is the tail test's drain of server: its reason, and the figures
// the probe burst that may bring it back is judged on, the slow answer
// time and the slow share over its evidence's span (Action.SlowMs). On
// the stats path the share is of answers whose mean was slow, which says
// nothing of how many answers are: the drain says it was a mean
// (SlowMean) and gives no share.
func (tb *tailBackend) drain(backend, server string) agent.Action {
	a := agent.Action{Kind: agent.Drain, Backend: backend, Server: server, Reason: tb.reason(server), SlowMs: tb.found[server]}
	if tb.meanOnly[server] {
		a.SlowMean = true
		return a
	}
	s := tb.servers[server]
	n, x := s.lastSum(min(max(s.run, 1), recentChunks))
	a.ErrorRate = float64(x) / float64(max(n, 1))
	return a
}

// reason is why the tail test condemns server: its slow share over its
// evidence's span, against what it was judged.
func (tb *tailBackend) reason(server string) string {
	s := tb.servers[server]
	k := min(max(s.run, 1), recentChunks)
	n, x := s.lastSum(k)
	if tb.meanOnly[server] {
		return fmt.Sprintf("slow mean, CUSUM at h %.1f: %.2f%% (%d/%d) of answers at a mean of %d ms or more (the peers' %d ms) over its evidence's %d checks, judged against %.3f%%, degraded from %.2f%%%s",
			tb.q.H(), 100*float64(x)/float64(max(n, 1)), x, n, tb.found[server], tb.p50, k, 100*s.P0(), 100*tb.q.P1Min(), meanNote)
	}
	return fmt.Sprintf("slow tail, CUSUM at h %.1f: %.2f%% (%d/%d) of answers at %d ms or more (the backend's p95 %d ms) over its evidence's %d checks, judged against %.3f%%, degraded from %.2f%%",
		tb.q.H(), 100*float64(x)/float64(max(n, 1)), x, n, tb.found[server], tb.p95, k, 100*s.P0(), 100*tb.q.P1Min())
}

// meanNote is what a latency reason adds for a server whose answer
// times are the stats path's mean.
const meanNote = "; its answer time is the mean of its last 10 s of answers, read out of HAProxy's rtime (the stats path): a mean has no tail, a slow tail shows only as it moves the mean"
