// Package soak runs simulated server-days through the rules' sequential
// test as the agent's loop runs it: each simulated second, every server's
// new requests and 5xx (Poisson traffic, binomial errors) are one chunk
// of rules.Sequential.Step, the exact function Policy.Evidence calls on
// the windows' counts every EvidenceCheck. It does not build the loop's
// observations or the runtime socket's replies: at 10,000 server-days
// (864 million server-seconds) that path would take hours; TestSoakAgrees
// WithTheLoop checks that the loop, on the same traffic, drains when
// the soak says.
//
// What it counts:
//   - a false drain: the test condemning a healthy server (the server is
//     then out for DrainFor, as the probe cooldown keeps it, and comes back
//     with its evidence reset). Every condemnation counts, as if the
//     guardrails let all through: the figure is an upper bound;
//   - a fault's time to detect: one server's error rate jumps to Fault at
//     a random time after Warmup of steady healthy traffic; the time from
//     the jump to the end of the chunk that condemns it. Or its answers
//     slow down (Cell.Slow, with Cell.Latency: latency.go), or either fault
//     comes and goes (Cell.Flap).
package soak

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
)

// Bursts: one burst of Min to Max errors every EveryHours per server on
// average, spread over one second that straddles two chunks at a random
// point (the loop's checks do not fall on the windows' seconds).
type Bursts struct {
	EveryHours float64
	Min, Max   int
}

// Cell is one noise model, and the fault to find in it.
type Cell struct {
	Servers int     // per backend
	Rate    float64 // requests per second per server, on average
	Noise   float64 // healthy 5xx rate (the fleet's median)
	Hetero  float64 // lognormal sigma of the healthy servers' rates
	Bursts  Bursts
	// Diurnal is the swing of the traffic over a day: rate × (1 + Diurnal
	// × sin(2πt/day)); Uneven the lognormal sigma of each server's share.
	Diurnal, Uneven float64
	// Fault is the faulty server's 5xx rate (0: healthy days only).
	Fault      float64
	ServerDays float64 // healthy server-days to run, all seeds together
	Seeds      []uint64
	// Trials is how many fault onsets each seed runs.
	Trials int
	Warmup time.Duration
	// DrainFor is how long a condemned healthy server stays out.
	DrainFor time.Duration
	Config   rules.Config
	// Windowed runs the test the rules ran before the sequential one
	// (rules.Policy.Test on a 60 s window, every second), for comparison.
	Windowed bool
	// Flap makes the fault (5xx or slow) intermittent: on for Flap.On,
	// off for Flap.Off, from the onset on.
	Flap Flap
	// Latency simulates answer times and runs the rules' latency test
	// (rules.Policy.Slow) beside the sequential one; Slow is the slow
	// fault: the faulty server's median answer time times Slow.
	Latency Latency
	Slow    float64
}

// Flap is an intermittent fault's on and off periods (zero: steady).
type Flap struct{ On, Off time.Duration }

// on is whether a fault that began at onset is on in second t.
func (fl Flap) on(t int, onset float64) bool {
	if fl.On <= 0 {
		return true
	}
	on, off := fl.On.Seconds(), fl.Off.Seconds()
	return math.Mod(max(float64(t)-onset, 0), on+off) < on
}

// Validate checks a cell's settings.
func (c Cell) Validate() error {
	var errs []error
	if c.Servers < 2 || c.Servers > 100000 {
		errs = append(errs, fmt.Errorf("servers %d outside [2, 100000]", c.Servers))
	}
	if !(c.Rate > 0 && c.Rate <= 1e5) {
		errs = append(errs, fmt.Errorf("rate %v outside (0, 1e5]", c.Rate))
	}
	if !(c.Noise >= 0 && c.Noise < 0.5) || !(c.Fault >= 0 && c.Fault < 1) {
		errs = append(errs, fmt.Errorf("noise %v or fault %v outside [0, 0.5) and [0, 1)", c.Noise, c.Fault))
	}
	if !(c.Hetero >= 0 && c.Hetero <= 2) || !(c.Uneven >= 0 && c.Uneven <= 2) || !(c.Diurnal >= 0 && c.Diurnal < 1) {
		errs = append(errs, fmt.Errorf("hetero %v, uneven %v outside [0, 2] or diurnal %v outside [0, 1)", c.Hetero, c.Uneven, c.Diurnal))
	}
	if c.Bursts.EveryHours < 0 || (c.Bursts.EveryHours > 0 && (c.Bursts.Min < 1 || c.Bursts.Max < c.Bursts.Min)) {
		errs = append(errs, fmt.Errorf("bursts %+v: every > 0 hours and 1 <= min <= max", c.Bursts))
	}
	if c.ServerDays < 0 || len(c.Seeds) < 1 || c.Trials < 0 {
		errs = append(errs, fmt.Errorf("server-days %v, seeds %v, trials %d", c.ServerDays, c.Seeds, c.Trials))
	}
	if c.Flap.On < 0 || c.Flap.Off < 0 || (c.Flap.On == 0) != (c.Flap.Off == 0) {
		errs = append(errs, fmt.Errorf("flap %v:%v: both periods above zero, or both zero", c.Flap.On, c.Flap.Off))
	}
	if err := c.Latency.validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Slow != 0 && (!(c.Slow > 1 && c.Slow <= 1000) || c.Latency.MedianMs == 0) {
		errs = append(errs, fmt.Errorf("slow %v: want (1, 1000] times the median, with a latency model", c.Slow))
	}
	if err := c.Config.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("rules: %w", err))
	}
	return errors.Join(errs...)
}

// Result is a cell's figures.
type Result struct {
	Cell        string  `json:"cell"`
	Servers     int     `json:"servers"`
	Rate        float64 `json:"rate"`
	Noise       float64 `json:"noise"`
	Hetero      float64 `json:"hetero"`
	Bursts      string  `json:"bursts,omitempty"`
	Diurnal     float64 `json:"diurnal,omitempty"`
	Uneven      float64 `json:"uneven,omitempty"`
	ServerDays  float64 `json:"server_days"`
	FalseDrains int     `json:"false_drains"`
	// FalseDrainsPer1000 and its exact Poisson 95% interval.
	FalseDrainsPer1000 float64 `json:"false_drains_per_1000_server_days"`
	Low95              float64 `json:"low_95"`
	High95             float64 `json:"high_95"`
	Fault              float64 `json:"fault,omitempty"`
	Slow               float64 `json:"slow,omitempty"`
	Flap               string  `json:"flap,omitempty"`
	Latency            string  `json:"latency,omitempty"`
	Trials             int     `json:"trials,omitempty"`
	Missed             int     `json:"missed,omitempty"`
	DetectMedian       float64 `json:"detect_median_s,omitempty"`
	DetectP90          float64 `json:"detect_p90_s,omitempty"`
	// Bound is ln(ARL)/KL in seconds, ARL the requests of one server over
	// the promised 1,000 days between false drains, KL that of the fault
	// against the healthy rate: the least mean delay any test with that
	// false-alarm rate can have (Lorden 1971). The checks' one-second
	// cadence comes on top.
	Bound float64 `json:"bound_s,omitempty"`
	// FaultFalseDrains: healthy servers condemned during the fault trials.
	FaultFalseDrains int     `json:"fault_trials_false_drains,omitempty"`
	WallSeconds      float64 `json:"wall_s"`
}

// perSeed runs f once a seed, with a generator of its own (the seed, on
// stream), on up to workers goroutines (0: one a core), each owned here
// and waited for.
func perSeed(seeds []uint64, workers int, stream uint64, f func(i int, rng *rand.Rand)) {
	if workers < 1 {
		workers = runtime.GOMAXPROCS(0)
	}
	sem := make(chan struct{}, workers)
	var wg sync.WaitGroup
	for i, seed := range seeds {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(i, rand.New(rand.NewPCG(seed, stream)))
		}()
	}
	wg.Wait()
}

// Run runs a cell: its healthy days and its fault trials, the seeds on
// up to workers goroutines (perSeed).
func Run(c Cell, workers int) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	began := time.Now()
	type out struct {
		days, falses, faultFalses, missed int
		delays                            []float64
	}
	outs := make([]out, len(c.Seeds))
	daysPerSeed := int(math.Ceil(c.ServerDays / float64(c.Servers) / float64(len(c.Seeds))))
	perSeed(c.Seeds, workers, 0x50a4, func(si int, rng *rand.Rand) {
		o := &outs[si]
		for range daysPerSeed {
			f := newFleet(c, rng, -1)
			o.falses += f.run(f.dryTill+86400, -1, 0, nil)
			o.days++
		}
		if c.Fault > 0 || c.Slow > 0 {
			for range c.Trials {
				f := newFleet(c, rng, 0)
				warm := c.Warmup.Seconds()
				onset := warm + rng.Float64()*600
				d := -1.0
				o.faultFalses += f.run(onset+3600, 0, onset, &d)
				if d < 0 {
					o.missed++
				} else {
					o.delays = append(o.delays, d)
				}
			}
		}
	})
	r := Result{Servers: c.Servers, Rate: c.Rate, Noise: c.Noise, Hetero: c.Hetero, Diurnal: c.Diurnal, Uneven: c.Uneven, Fault: c.Fault, Slow: c.Slow}
	if c.Flap.On > 0 {
		r.Flap = fmt.Sprintf("%g:%g", c.Flap.On.Seconds(), c.Flap.Off.Seconds())
	}
	if c.Latency.MedianMs > 0 {
		r.Latency = c.Latency.String()
	}
	if c.Bursts.EveryHours > 0 {
		r.Bursts = fmt.Sprintf("%g:%d-%d", c.Bursts.EveryHours, c.Bursts.Min, c.Bursts.Max)
	}
	var delays []float64
	for _, o := range outs {
		r.ServerDays += float64(o.days * c.Servers)
		r.FalseDrains += o.falses
		r.FaultFalseDrains += o.faultFalses
		r.Missed += o.missed
		delays = append(delays, o.delays...)
	}
	if r.ServerDays > 0 {
		lo, hi := PoissonInterval(r.FalseDrains, 0.05)
		k := 1000 / r.ServerDays
		r.FalseDrainsPer1000, r.Low95, r.High95 = float64(r.FalseDrains)*k, lo*k, hi*k
	}
	if c.Fault > 0 || c.Slow > 0 {
		r.Trials = c.Trials * len(c.Seeds)
		r.DetectMedian, r.DetectP90 = quantile(delays, 0.5), quantile(delays, 0.9)
	}
	if c.Fault > 0 && c.Flap.On == 0 {
		// The bound is a steady fault's; a flapping one's would depend on
		// where its on periods fall.
		r.Bound = Bound(c.Fault, c.Noise, c.Rate, 1000)
	}
	r.Cell = r.name()
	r.WallSeconds = time.Since(began).Seconds()
	return r, nil
}

func (r Result) name() string {
	s := fmt.Sprintf("N=%d %g req/s %.2g%%", r.Servers, r.Rate, 100*r.Noise)
	if r.Hetero > 0 {
		s += fmt.Sprintf(" σ%g", r.Hetero)
	}
	if r.Bursts != "" {
		s += " bursts " + r.Bursts
	}
	if r.Diurnal > 0 {
		s += fmt.Sprintf(" diurnal %g", r.Diurnal)
	}
	if r.Uneven > 0 {
		s += fmt.Sprintf(" uneven %g", r.Uneven)
	}
	if r.Latency != "" {
		s += " latency " + r.Latency
	}
	if r.Flap != "" {
		s += " flap " + r.Flap
	}
	return s
}

// Bound is ln(ARL)/KL in seconds for a fault at rate pf among healthy
// servers at p0, at rate requests a second, ARL being arlDays of one
// server's requests.
func Bound(pf, p0, rate, arlDays float64) float64 {
	p0 = max(p0, 1e-9)
	kl := pf*math.Log(pf/p0) + (1-pf)*math.Log((1-pf)/(1-p0))
	return math.Log(rate*86400*arlDays) / kl / rate
}

// PoissonInterval is the exact (Garwood) two-sided 1-conf interval of a
// Poisson mean from k events.
func PoissonInterval(k int, alpha float64) (lo, hi float64) {
	if k > 0 {
		lo = gammaQuantile(float64(k), alpha/2)
	}
	hi = gammaQuantile(float64(k+1), 1-alpha/2)
	return lo, hi
}

// gammaQuantile is the q quantile of Gamma(shape, 1), by bisection on
// the regularised lower incomplete gamma function.
func gammaQuantile(shape, q float64) float64 {
	lo, hi := 0.0, shape+20*math.Sqrt(shape)+20
	for range 200 {
		mid := (lo + hi) / 2
		if lowerGamma(shape, mid) < q {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

// lowerGamma is P(shape, x), the regularised lower incomplete gamma, by
// its series (x < shape+1) or its continued fraction (Numerical Recipes
// 6.2).
func lowerGamma(a, x float64) float64 {
	if x <= 0 {
		return 0
	}
	lg, _ := math.Lgamma(a)
	if x < a+1 {
		sum, del := 1/a, 1/a
		for n := 1; n < 1000; n++ {
			del *= x / (a + float64(n))
			sum += del
			if math.Abs(del) < math.Abs(sum)*1e-15 {
				break
			}
		}
		return sum * math.Exp(-x+a*math.Log(x)-lg)
	}
	b, c, d := x+1-a, 1/1e-300, 1/(x+1-a)
	h := d
	for i := 1; i < 1000; i++ {
		an := -float64(i) * (float64(i) - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < 1e-300 {
			d = 1e-300
		}
		c = b + an/c
		if math.Abs(c) < 1e-300 {
			c = 1e-300
		}
		d = 1 / d
		del := d * c
		h *= del
		if math.Abs(del-1) < 1e-15 {
			break
		}
	}
	return 1 - math.Exp(-x+a*math.Log(x)-lg)*h
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

// fleet is one backend's servers for one simulated run.
type fleet struct {
	c       Cell
	rng     *rand.Rand
	rate    []float64 // error rate of each server
	share   []float64 // traffic share (mean 1)
	pending []uint64  // burst errors carried into the next chunk
	outTill []int     // second until which a condemned server is out
	q       *rules.Sequential
	srv     []*rules.SeqServer
	in      []rules.Counts
	serving []bool
	idx     []int
	faulty  int
	// the windowed test's 60 s rings, when Cell.Windowed
	old  *rules.Policy
	ring [][60]rules.Counts
	view agent.BackendView
	// the latency test's policy and each server's answer times, when
	// Cell.Latency
	lat *latencies
	// dryTill: before this second, condemnations are neither applied nor
	// counted. With a latency model it is the warm-up: the count begins
	// once the agent has learned each server's latency baseline, as an
	// agent that has watched the fleet before has (a new fleet is drawn
	// each day, and an agent does not restart each day). The cost of an
	// agent's own start is told apart in docs/explanation/detection.md.
	dryTill float64
}

func newFleet(c Cell, rng *rand.Rand, faulty int) *fleet {
	n := c.Servers
	f := &fleet{c: c, rng: rng, rate: make([]float64, n), share: make([]float64, n), pending: make([]uint64, n),
		outTill: make([]int, n), q: rules.NewSequential(c.Config), srv: make([]*rules.SeqServer, n),
		in: make([]rules.Counts, n), serving: make([]bool, n), faulty: faulty}
	for i := range n {
		f.rate[i] = c.Noise * math.Exp(c.Hetero*rng.NormFloat64())
		f.share[i] = math.Exp(c.Uneven*rng.NormFloat64() - c.Uneven*c.Uneven/2)
		f.srv[i] = &rules.SeqServer{}
	}
	if c.Latency.MedianMs > 0 {
		f.lat = newLatencies(c, rng)
		f.dryTill = c.Warmup.Seconds()
	}
	if c.Windowed || f.lat != nil {
		f.view = agent.BackendView{Name: "app", Servers: make([]agent.ServerView, n)}
		for i := range n {
			name := fmt.Sprintf("srv%d", i+1)
			f.view.Servers[i] = agent.ServerView{Backend: "app", Server: name,
				State: haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 1, Initial: 1}}
		}
	}
	if c.Windowed {
		f.old = rules.New(c.Config)
		f.ring = make([][60]rules.Counts, n)
	}
	return f
}

// run simulates secs seconds; from onset on, server f.faulty fails at
// c.Fault and *delay gets the time to its condemnation (the run then
// ends). It returns the healthy servers condemned.
func (f *fleet) run(secs float64, faulty int, onset float64, delay *float64) int {
	c := f.c
	falses := 0
	burstP := 0.0
	if c.Bursts.EveryHours > 0 {
		burstP = 1 / (c.Bursts.EveryHours * 3600)
	}
	drainFor := int(c.DrainFor / time.Second)
	for t := 0; float64(t) < secs; t++ {
		diurnal := 1.0
		if c.Diurnal > 0 {
			diurnal = 1 + c.Diurnal*math.Sin(2*math.Pi*float64(t)/86400)
		}
		for i := range f.srv {
			f.serving[i] = t >= f.outTill[i]
			if !f.serving[i] {
				f.in[i] = rules.Counts{}
				if f.lat != nil {
					f.lat.second(i, 0, false) // its window ages
				}
				continue
			}
			n := poisson(f.rng, c.Rate*diurnal*f.share[i])
			var x uint64
			on := i == faulty && c.Fault > 0 && c.Flap.on(t, onset)
			switch {
			case on && float64(t) >= onset:
				x = binomial(f.rng, n, c.Fault)
			case on && float64(t+1) > onset:
				// the second the fault begins: its tail fails at Fault
				nf := binomial(f.rng, n, float64(t+1)-onset)
				x = binomial(f.rng, n-nf, f.rate[i]) + binomial(f.rng, nf, c.Fault)
			default:
				x = binomial(f.rng, n, f.rate[i])
			}
			x += f.pending[i]
			n += f.pending[i]
			f.pending[i] = 0
			if burstP > 0 && f.rng.Float64() < burstP {
				k := uint64(c.Bursts.Min + f.rng.IntN(c.Bursts.Max-c.Bursts.Min+1))
				now := binomial(f.rng, k, f.rng.Float64())
				x += now
				n += now
				f.pending[i] = k - now
			}
			f.in[i] = rules.Counts{N: n, X: x}
			if f.lat != nil {
				// the slow fault: from the second it begins, while on
				slow := i == faulty && c.Slow > 0 && float64(t+1) > onset && c.Flap.on(t, onset)
				f.lat.second(i, n, slow)
			}
		}
		if f.old != nil {
			f.idx = f.windowed(t)
		} else {
			f.idx = f.q.Step(1, f.srv, f.in, f.serving, f.idx)
		}
		if f.lat != nil {
			f.idx = f.slow(f.idx)
		}
		for _, i := range f.idx {
			if float64(t) < f.dryTill {
				break
			}
			if i == faulty && float64(t) >= onset-1 && delay != nil {
				*delay = float64(t+1) - onset
				return falses
			}
			falses++
			f.outTill[i] = t + 1 + drainFor
		}
	}
	return falses
}

// windowed runs the old test on the last 60 s of every server, as the
// loop's evidence check ran it every second.
func (f *fleet) windowed(t int) []int {
	f.idx = f.idx[:0]
	for i := range f.srv {
		f.ring[i][t%60] = f.in[i]
		var n, x uint64
		for _, c := range f.ring[i] {
			n += c.N
			x += c.X
		}
		v := &f.view.Servers[i]
		v.Window.Requests, v.Window.Err5xx = n, x
		v.State.AdminState = 0
		if !f.serving[i] {
			v.State.AdminState = haproxy.AdminForcedDrain
			f.ring[i] = [60]rules.Counts{}
		}
	}
	for _, fd := range f.old.Test(f.view) {
		if fd.Outlier {
			// Test lists the serving servers in order of error rate
			for j := range f.view.Servers {
				if f.view.Servers[j].Server == fd.Server {
					f.idx = append(f.idx, j)
				}
			}
		}
	}
	return f.idx
}

// poisson draws a Poisson count of mean lambda: by inversion below 12,
// by the normal approximation above (the traffic's exact shape does not
// move the test: it judges errors given requests).
func poisson(rng *rand.Rand, lambda float64) uint64 {
	if lambda <= 0 {
		return 0
	}
	if lambda >= 12 {
		return uint64(max(0, math.Round(lambda+math.Sqrt(lambda)*rng.NormFloat64())))
	}
	u := rng.Float64()
	p := math.Exp(-lambda)
	k, cdf := uint64(0), p
	for u > cdf && k < 200 {
		k++
		p *= lambda / float64(k)
		cdf += p
	}
	return k
}

// binomial draws Binomial(n, p): one Bernoulli a trial for large p, the
// Poisson limit for small means (n·p < 12, p < 0.05), the normal one
// beyond.
func binomial(rng *rand.Rand, n uint64, p float64) uint64 {
	if n == 0 || p <= 0 {
		return 0
	}
	if p >= 1 {
		return n
	}
	mean := float64(n) * p
	switch {
	case p < 0.05 && mean < 12:
		return min(poisson(rng, mean), n)
	case n <= 64:
		var x uint64
		for range n {
			if rng.Float64() < p {
				x++
			}
		}
		return x
	default:
		x := math.Round(mean + math.Sqrt(mean*(1-p))*rng.NormFloat64())
		return uint64(min(max(0, x), float64(n)))
	}
}
