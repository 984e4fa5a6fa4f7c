// Package dataset makes the training text of hapilot's own policy model
// (internal/lab/models): simulated windows over varied fleets, rendered
// by the LLM policy's own prompt builder and system prompt (the policy's
// Decide, with a recording model server in place of a model), each
// labelled from the simulation's ground truth in the policy's answer
// schema. Calibration's own sequences are held out: none of their names,
// and none of their backends' size and weight, appear in training.
//
// The agent never links this package (cmd/hapilot's deps_test.go).
package dataset

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// Truth is what a server really is in the simulation.
type Truth int

const (
	Healthy    Truth = iota
	Faulty           // a true 5xx rate well above its peers'
	Slow             // a true latency well above its peers'
	Overloaded       // near its maxconn while its peers are not
)

func (t Truth) String() string {
	return [...]string{"healthy", "faulty", "slow", "overloaded"}[t]
}

// Kind is the situation a sequence simulates.
type Kind string

const (
	KindHealthy   Kind = "healthy"
	KindGrey      Kind = "grey"        // a fault in the grey zone
	KindClear     Kind = "clear"       // a fault the rules drain themselves
	KindNoise     Kind = "noise"       // a healthy server a little above its peers
	KindFleetwide Kind = "fleetwide"   // every server fails alike
	KindLatency   Kind = "latency"     // one server slow, no errors
	KindOverload  Kind = "overload"    // one server near its maxconn
	KindDrained   Kind = "drained"     // a server the agent drained 10-60 s ago
	KindOperator  Kind = "operator"    // an operator's server, faulty or not
	KindLow       Kind = "low-traffic" // a few requests a second
	KindTwo       Kind = "two-faults"
	KindQuiet     Kind = "quiet" // no traffic yet
)

// mix is how often each kind is drawn, in parts.
var mix = []struct {
	kind  Kind
	parts int
}{
	{KindHealthy, 6}, {KindGrey, 20}, {KindClear, 6}, {KindNoise, 14}, {KindFleetwide, 8},
	{KindLatency, 10}, {KindOverload, 8}, {KindDrained, 10}, {KindOperator, 7}, {KindLow, 9},
	{KindTwo, 8}, {KindQuiet, 2},
}

// sserver is one simulated server: its true behaviour, and what the
// agent and the operator did to it.
type sserver struct {
	name      string
	weight    int // configured
	cur       int // in force
	rps       float64
	errRate   float64
	p50, p95  int
	maxconn   int
	truth     Truth
	operator  bool
	drainedAt time.Time // the agent's drain, zero when none
	cutAt     time.Time // the agent's weight cut, zero when none
	// faultAt is when a fault that begins mid-situation begins (zero:
	// from the start). Until then the server is healthy and fails at
	// baseRate, its backend's background; after it, the windows mix the
	// two rates by the seconds each covers.
	faultAt  time.Time
	baseRate float64
}

// truthAt is what s really is at now: a fault that has not begun yet is
// a healthy server.
func (s *sserver) truthAt(now time.Time) Truth {
	if !s.faultAt.IsZero() && now.Before(s.faultAt) {
		return Healthy
	}
	return s.truth
}

type sbackend struct {
	name    string
	servers []*sserver
}

// situation is one simulated fleet over a few steps.
type situation struct {
	kind     Kind
	backends []*sbackend
	start    time.Time
	elapsed  time.Duration // traffic seen before the first step
	interval time.Duration
	steps    int
	// production: Confirm 2 and the anomaly gate, as `hapilot run` calls
	// the model; otherwise Confirm 1 and every step, as calibration does.
	production bool
	// frozen: no step's plan takes effect, as in calibration, whose
	// steps are fixed: the next prompt's history says "not in force"
	// beside a server still flagged, and the right answer is the same
	// action again. Without it the training's history lines almost
	// always came before a no_op, and a model learned to stop at one.
	frozen bool
	// now is the step being observed: the ground truth is read at it.
	now time.Time
}

var serverPrefixes = []string{"srv", "srv-", "node", "node-", "be", "host-", "h", "w", "x", "pod-", "ip-10-0-1-", "r", "k", "www", "worker-", "svc", "vm-", "c", "lb", "t"}

var backendNames = []string{"web", "www", "checkout", "static", "auth", "search", "media", "cart", "users", "bk_main", "be_api", "payments",
	"assets", "login", "catalog", "grpc", "ws", "backend", "default_backend", "svc", "front_api", "uploads", "reports", "chat", "video"}

var weights = []int{1, 2, 3, 4, 5, 8, 10, 12, 16, 20, 25, 32, 37, 50, 64, 100, 128, 200, 256}

// gen draws situations from one seed.
type gen struct {
	r    *rand.Rand
	hold Holdout
	draw Draw
}

func (g *gen) pick(n int) int { return g.r.IntN(n) }

func (g *gen) uniform(a, b float64) float64 { return a + (b-a)*g.r.Float64() }

func (g *gen) kind() Kind {
	total := 0
	for _, m := range mix {
		total += m.parts
	}
	n := g.pick(total)
	for _, m := range mix {
		if n < m.parts {
			return m.kind
		}
		n -= m.parts
	}
	return KindHealthy
}

// fleet draws a backend of n servers, named and weighted outside the
// hold-out.
func (g *gen) fleet(name string, n int, minWeight int) *sbackend {
	for {
		b := g.tryFleet(name, n, minWeight)
		if g.hold.Allows(b) {
			return b
		}
	}
}

func (g *gen) tryFleet(name string, n int, minWeight int) *sbackend {
	prefix := serverPrefixes[g.pick(len(serverPrefixes))]
	first := 1
	switch g.pick(6) {
	case 0:
		first = 0
	case 1:
		first = 1 + g.pick(40)
	}
	pad := g.pick(5) == 0
	mixed := g.pick(4) == 0
	w := weights[g.pick(len(weights))]
	base := g.uniform(1, 60) // requests a second per unit of share
	p50 := int(g.uniform(4, 60))
	spread := g.uniform(1.3, 2.5)
	b := &sbackend{name: name}
	for i := range n {
		sw := w
		if mixed {
			sw = weights[g.pick(len(weights))]
		}
		sw = max(sw, minWeight)
		label := fmt.Sprintf("%s%d", prefix, first+i)
		if pad {
			label = fmt.Sprintf("%s%02d", prefix, first+i)
		}
		s := &sserver{name: label, weight: sw, cur: sw, p50: jitter(g, p50), truth: Healthy}
		s.p95 = int(float64(s.p50) * spread)
		s.rps = base * g.uniform(0.85, 1.15)
		b.servers = append(b.servers, s)
	}
	if mixed { // traffic follows weight
		total := 0
		for _, s := range b.servers {
			total += s.weight
		}
		for _, s := range b.servers {
			s.rps = base * float64(n) * float64(s.weight) / float64(total) * g.uniform(0.9, 1.1)
		}
	}
	return b
}

func jitter(g *gen, v int) int { return max(1, int(float64(v)*g.uniform(0.9, 1.1))) }

// situation draws one situation.
func (g *gen) situation(now time.Time) *situation {
	k := g.kind()
	sit := &situation{kind: k, start: now, interval: 10 * time.Second, steps: 1 + g.pick(3), production: g.pick(2) == 0}
	if g.pick(10) < 3 {
		sit.interval = time.Second
	}
	sit.elapsed = time.Duration(g.uniform(float64(sit.interval), float64(2*time.Minute)))
	sit.frozen = !sit.production && g.draw.Frozen > 0 && g.pick(g.draw.Frozen) == 0
	total := 3 + g.pick(26) // 3..28 servers
	if k == KindTwo {
		total = max(total, 4)
	}
	names := append([]string(nil), backendNames...)
	g.r.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	minWeight := 1
	if k == KindOverload {
		minWeight = 2 // a cut needs room below the weight
	}
	twoBackends := g.pick(10) < 3
	if k == KindTwo {
		twoBackends = g.pick(2) == 0
	}
	if total >= 6 && twoBackends {
		a := 3 + g.pick(total-5)
		sit.backends = []*sbackend{g.fleet(names[0], a, minWeight), g.fleet(names[1], total-a, minWeight)}
	} else {
		sit.backends = []*sbackend{g.fleet(names[0], total, minWeight)}
	}
	base := []float64{0, 0.0005, 0.001, 0.001, 0.002, 0.003, 0.005}[g.pick(7)]
	for _, b := range sit.backends {
		for _, s := range b.servers {
			s.errRate = base * g.uniform(0.8, 1.2)
		}
	}
	target := sit.backends[g.pick(len(sit.backends))]
	victim := func() *sserver { return target.servers[g.pick(len(target.servers))] }
	fault := func(s *sserver, lo, hi float64) {
		s.truth = Faulty
		s.errRate = max(g.uniform(lo, hi), 4*base*g.uniform(1, 3))
	}
	switch k {
	case KindGrey:
		fault(victim(), 0.004, 0.03)
		if g.pick(3) == 0 { // fewer requests: evidence short of the rules' test
			scale(target, g.uniform(0.05, 0.4))
		}
	case KindClear:
		fault(victim(), 0.03, 0.3)
	case KindNoise:
		s := victim()
		s.errRate = max(base, 0.001) * g.uniform(1.3, 2.5)
	case KindFleetwide:
		r := g.uniform(0.01, 0.08)
		for _, b := range sit.backends {
			for _, s := range b.servers {
				s.errRate = r * g.uniform(0.85, 1.15)
			}
		}
	case KindLatency:
		s := victim()
		s.truth = Slow
		f := g.uniform(2.5, 25)
		if g.draw.SlowBelow > 0 && g.pick(g.draw.SlowBelow) == 0 {
			f = g.uniform(2.5, 5)
		}
		s.p50, s.p95 = int(float64(s.p50)*f), int(float64(s.p95)*f)
	case KindOverload:
		mc := 4 + g.pick(60)
		svc := float64(target.servers[0].p50)
		for _, s := range target.servers {
			s.maxconn = mc
			s.rps = g.uniform(0.3, 0.7) * float64(mc) * 1000 / svc
		}
		s := victim()
		s.truth = Overloaded
		s.rps = g.uniform(0.82, 1.0) * float64(mc) * 1000 / svc
	case KindDrained:
		s := victim()
		s.truth = Faulty
		s.errRate = g.uniform(0.005, 0.1)
		s.drainedAt = now.Add(-time.Duration(g.uniform(float64(10*time.Second), float64(60*time.Second))))
		s.cur = s.weight
		if g.pick(3) == 0 { // and a grey fault elsewhere
			other := sit.backends[g.pick(len(sit.backends))]
			o := other.servers[g.pick(len(other.servers))]
			if o != s {
				fault(o, 0.004, 0.03)
			}
		}
	case KindOperator:
		s := victim()
		s.operator = true
		if g.pick(2) == 0 {
			s.errRate = g.uniform(0.01, 0.2)
		}
		if g.pick(2) == 0 {
			o := victim()
			if o != s {
				fault(o, 0.004, 0.2)
			}
		}
	case KindLow:
		scale(target, g.uniform(0.02, 0.15))
		for _, b := range sit.backends {
			for _, s := range b.servers {
				s.rps = min(s.rps, g.uniform(0.5, 8))
			}
		}
		if g.pick(4) != 0 {
			fault(victim(), 0.02, 0.1)
		}
	case KindTwo:
		// Grey faults two times in three, which the model is there for
		// (the rules drain the clear ones, and the model's history then
		// holds nothing).
		lo, hi := 0.004, 0.03
		if g.pick(3) == 0 {
			lo, hi = 0.005, 0.08
		}
		a := victim()
		fault(a, lo, hi)
		// The second fault stands in the other backend half the time
		// there are two, and two times in three it begins later, once
		// the first may have been drained: a first drain in force, in
		// the history, must not hide a new fault (calibration's two-fault
		// sequence holds one, on names and sizes that stay out of
		// training).
		where := target
		if len(sit.backends) == 2 && g.pick(2) == 0 {
			where = sit.backends[0]
			if where == target {
				where = sit.backends[1]
			}
		}
		for {
			o := where.servers[g.pick(len(where.servers))]
			if o == a {
				continue
			}
			background := o.errRate
			fault(o, lo, hi)
			if g.pick(3) != 0 {
				o.baseRate = background
				// A few steps more, for the windows to show the new
				// fault once it has begun between the observations of
				// step k-1 and k.
				sit.steps = 3 + g.pick(3)
				k := 1 + g.pick(2)
				o.faultAt = now.Add(time.Duration((float64(k) - g.uniform(0.2, 1)) * float64(sit.interval)))
			}
			break
		}
	case KindQuiet:
		sit.elapsed = 0
		for _, b := range sit.backends {
			for _, s := range b.servers {
				s.rps = 0
			}
		}
		sit.steps = 1
	}
	// Where HAProxy sets a maxconn the prompt shows every server's
	// util_pct, at any load, and many operators set one (the lab's fleets
	// set maxconn 4 on every server). Drawn in overload situations only,
	// a util figure meant overload: the fifth attempt's model cut the
	// weight of a faulty server where a drain was right, and of healthy
	// ones in fleet-wide faults, wherever one showed. So all backends
	// but one in Draw.Unlimited have one elsewhere, at an ordinary load
	// (none where it is 0, and nothing drawn: the fifth attempt's data).
	if k != KindOverload && g.draw.Unlimited > 0 {
		for _, b := range sit.backends {
			if g.pick(g.draw.Unlimited) != 0 {
				limit(b, g.uniform(0.03, 0.6))
			}
		}
	}
	return sit
}

// limit gives every server of b the maxconn at which the busiest of them
// runs at util of it, a slow one aside (holding its connections longer,
// it runs nearer its maxconn, as it would). Not the median: the prompt
// flags a server at 80% (the recent rate's noise on top), and on the
// median (at 2% to 60%) the 8,000 examples' overload candidates went
// from 719 to 4,202.
func limit(b *sbackend, util float64) {
	load := 0.0
	for _, s := range b.servers {
		if s.truth != Slow {
			load = max(load, s.rps*float64(s.p50)/1000)
		}
	}
	mc := max(1, int(math.Ceil(load/util)))
	for _, s := range b.servers {
		s.maxconn = mc
	}
}

func scale(b *sbackend, f float64) {
	for _, s := range b.servers {
		s.rps *= f
	}
}

// observe draws the windows of step i: requests and 5xx sampled from each
// server's true rates over the window's seconds.
func (g *gen) observe(sit *situation, step int) agent.Observation {
	now := sit.start.Add(time.Duration(step) * sit.interval)
	seen := sit.elapsed + time.Duration(step)*sit.interval
	win := min(seen, time.Minute).Seconds()
	recent := min(seen, 10*time.Second).Seconds()
	sit.now = now
	obs := agent.Observation{Time: now, Cycle: uint64(step + 1), Lookback: time.Minute, RecentSpan: 10 * time.Second}
	for _, b := range sit.backends {
		bv := agent.BackendView{Name: b.name}
		for _, s := range b.servers {
			bv.Servers = append(bv.Servers, g.view(b.name, s, now, win, recent))
		}
		obs.Backends = append(obs.Backends, bv)
	}
	return obs
}

func (g *gen) view(backend string, s *sserver, now time.Time, win, recent float64) agent.ServerView {
	v := agent.ServerView{Backend: backend, Server: s.name, Owner: agent.OwnerNone, MaxConn: s.maxconn,
		State: haproxy.ServerState{Backend: backend, Server: s.name, OpState: haproxy.OpRunning, Weight: s.cur, Initial: s.weight}}
	serving := win
	share := 1.0
	if s.cur != s.weight {
		share = float64(s.cur) / float64(s.weight)
	}
	switch {
	case s.operator:
		v.State.AdminState, v.Owner = haproxy.AdminForcedMaint, agent.OwnerOperator
		if g.pick(2) == 0 {
			v.State.AdminState = haproxy.AdminForcedDrain
		}
		serving = 0
	case !s.drainedAt.IsZero():
		v.State.AdminState, v.Owner = haproxy.AdminForcedDrain, agent.OwnerAgent
		v.Changed = &agent.Change{Phase: agent.PhaseDrained, At: s.drainedAt, ErrorRate: s.errRate}
		ago := now.Sub(s.drainedAt).Seconds()
		serving = 0
		if g.pick(2) == 0 { // the window still holds the traffic before the drain
			serving = max(0, win-ago)
		}
		recent = 0
	case !s.cutAt.IsZero():
		v.Owner = agent.OwnerAgent
		v.Changed = &agent.Change{Phase: agent.PhaseCut, Weight: s.cur, At: s.cutAt}
	}
	rps := s.rps * share
	n := g.poisson(rps * serving)
	rn := g.poisson(rps * recent)
	if recent > 0 && serving > 0 {
		rn = min(rn, n)
	}
	p50, p95 := jitter(g, s.p50), jitter(g, s.p95)
	v.Window = window.Stats{Backend: backend, Server: s.name, Requests: n, Err5xx: g.errors(s, now, n, serving), P50Ms: p50, P95Ms: max(p95, p50), P99Ms: max(p95, p50) * 6 / 5}
	if n == 0 {
		v.Window.P50Ms, v.Window.P95Ms, v.Window.P99Ms = 0, 0, 0
	}
	v.Recent = window.Stats{Backend: backend, Server: s.name, Requests: rn, Err5xx: g.errors(s, now, rn, recent), P50Ms: p50, P95Ms: max(p95, p50), P99Ms: max(p95, p50) * 6 / 5,
		Seconds: int(recent)}
	if recent > 0 {
		v.Recent.RatePerSec = float64(rn) / recent
	}
	if s.maxconn > 0 {
		v.RespTimeMs = p50
	}
	return v
}

// errors draws the 5xx among n requests of the last secs seconds before
// now: at s's rate, or, for a fault that began within them, at its
// background rate for the seconds before and its fault's after.
func (g *gen) errors(s *sserver, now time.Time, n uint64, secs float64) uint64 {
	if s.faultAt.IsZero() || secs <= 0 {
		return g.binomial(n, s.errRate)
	}
	faulty := min(secs, max(0, now.Sub(s.faultAt).Seconds()))
	bad := uint64(math.Round(float64(n) * faulty / secs))
	return g.binomial(bad, s.errRate) + g.binomial(n-bad, s.baseRate)
}

// poisson draws a count of mean m: Knuth's method while small, a normal
// approximation beyond.
func (g *gen) poisson(m float64) uint64 {
	if m <= 0 {
		return 0
	}
	if m > 30 {
		return uint64(max(0, math.Round(m+math.Sqrt(m)*g.r.NormFloat64())))
	}
	l, k, p := math.Exp(-m), 0, 1.0
	for {
		p *= g.r.Float64()
		if p <= l {
			return uint64(k)
		}
		k++
	}
}

// binomial draws errors among n requests at rate p, through the Poisson
// or normal approximations (p is small, n at most a few thousand).
func (g *gen) binomial(n uint64, p float64) uint64 {
	if n == 0 || p <= 0 {
		return 0
	}
	m := float64(n) * p
	if m > 30 {
		sd := math.Sqrt(m * (1 - p))
		return uint64(min(float64(n), max(0, math.Round(m+sd*g.r.NormFloat64()))))
	}
	return min(n, g.poisson(m))
}
