package soak

// The agent path: a cell's fleets run through an agent policy (the
// rules as --policy rules builds them, or the LLM policy with its floor)
// instead of rules.Sequential.Step alone. The loop's cadence is
// reproduced on the soak's clock: every evidence check (a second) the
// policy's evidence hook reads an observation built from the simulated
// counts (running totals, a 60 s window and a 10 s recent one, as the
// window store gives them); a check that finds a server the last one did
// not steps at once (at most loop.MaxTriggered times an interval), and
// every Interval a scheduled step runs. A step asks Decide, vets the
// plan with the agent's own guardrails (agent/guard, widened by the
// policy's Needs as the loop widens them) and applies what they accept
// to the simulated servers. What the soak does not reproduce: recovery's
// probes (a drained healthy server comes back after its cooldown:
// Cell.DrainFor, doubled with each drain of the same server up to 10
// minutes, as recovery's backoff), HAProxy's runtime socket, and the model's time: the
// simulated clock stands still while a model answers, so a model is
// judged on its decisions, not its speed (its calls' wall time is
// counted apart).

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/policy/llm"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// AgentPolicy runs a cell's fleets through an agent policy.
type AgentPolicy struct {
	// Name is the policy as the results show it ("rules", "llm").
	Name string
	// New builds the policy for one fleet (a backend-day, a trial), fresh
	// as at an agent's start; done ends it. It is called from the seeds'
	// goroutines at once.
	New func() (pol agent.Policy, done func(), err error)
	// Interval is the loop's step (0: 10 s), whole seconds.
	Interval time.Duration
	// Guard is the guardrails (the zero value: guard.DefaultGuardrails).
	Guard *guard.Guardrails
}

func (a *AgentPolicy) interval() int {
	if a.Interval <= 0 {
		return 10
	}
	return int(a.Interval / time.Second)
}

func (a *AgentPolicy) validate() error {
	if a.New == nil {
		return errors.New("agent policy: no constructor")
	}
	if a.Interval < 0 || a.Interval%time.Second != 0 || a.Interval > time.Hour {
		return fmt.Errorf("agent policy: interval %v: whole seconds up to an hour", a.Interval)
	}
	if a.Guard != nil {
		return a.Guard.Validate()
	}
	return nil
}

// windowSpan and recentSpan are the observation's windows, the agent's
// defaults (a minute, and ten seconds as recent).
const windowSpan, recentSpan = 60, 10

// driver runs one fleet's policy on the soak's clock.
type driver struct {
	pol      agent.Policy
	done     func()
	g        guard.Guardrails
	interval int
	epoch    time.Time
	names    []string
	// each server's running totals, its last 60 one-second counts, and
	// its state as HAProxy and the agent's ledger would hold it
	tot      []rules.Counts
	ring     [][windowSpan]rules.Counts
	weight   []int
	changed  []*agent.Change
	known    map[agent.Key]bool
	refused  map[agent.Key]string
	cycle    uint64
	trigger  int // triggered steps since the last scheduled one
	out      []int
	byModel  []bool
	isModel  map[agent.ActionID]bool
	counts   agentCounts
	deadline time.Duration
	llm      bool  // the policy reported as the LLM policy does
	drains   []int // each server's drains so far, for cooldown
	// store: with a latency model, every answer (its status and its
	// time) goes into the agent's own window store, on the soak's clock,
	// and observe reads the windows from it as the loop does (medians,
	// p95s and the tail tallies included); nil without one, where the
	// counts' ring is all the policy reads and far cheaper.
	store  *window.Store
	clock  time.Time
	bnames [][]byte
}

// agentCounts is what the agent path counts beyond the drains.
type agentCounts struct {
	steps, calls, fallbacks, policyErrors int
	// model: the model's actions beyond the floor that the guardrails
	// let through; modelRefused those they refused; unsupported the
	// model's drains and cuts the windows did not support (dropped by the
	// policy before the guardrails); modelFinds its drains of a faulty
	// server (before the floor's); modelCuts its weight cuts.
	model, modelRefused, unsupported, modelFinds, modelCuts int
	callWall                                                float64 // ms, summed
}

func (a *agentCounts) add(b agentCounts) {
	a.steps += b.steps
	a.calls += b.calls
	a.fallbacks += b.fallbacks
	a.policyErrors += b.policyErrors
	a.model += b.model
	a.modelRefused += b.modelRefused
	a.unsupported += b.unsupported
	a.modelFinds += b.modelFinds
	a.modelCuts += b.modelCuts
	a.callWall += b.callWall
}

// initialWeight is every simulated server's configured weight: room
// for a model's weight cuts.
const initialWeight = 16

func newDriver(a *AgentPolicy, n int) (*driver, error) {
	pol, done, err := a.New()
	if err != nil {
		return nil, fmt.Errorf("soak: building the %s policy: %w", a.Name, err)
	}
	g := guard.DefaultGuardrails()
	if a.Guard != nil {
		g = *a.Guard
	}
	d := &driver{pol: pol, done: done, g: g.For(pol.Needs), interval: a.interval(), epoch: time.Unix(1_700_000_000, 0),
		names: make([]string, n), tot: make([]rules.Counts, n), ring: make([][windowSpan]rules.Counts, n),
		weight: make([]int, n), changed: make([]*agent.Change, n), known: map[agent.Key]bool{}, refused: map[agent.Key]string{},
		deadline: agent.Settings{Interval: time.Duration(a.interval()) * time.Second}.PolicyBudget()}
	for i := range n {
		d.names[i] = fmt.Sprintf("srv%d", i+1)
		d.weight[i] = initialWeight
	}
	return d, nil
}

// timeAnswers gives the driver a window store, for a cell with a latency
// model: the fleet then hands it each answer (answer) as well as each
// second's counts.
func (d *driver) timeAnswers() {
	d.store = window.New(windowSpan*time.Second, len(d.names)+1, func() time.Time { return d.clock })
	d.bnames = make([][]byte, len(d.names))
	for i, n := range d.names {
		d.bnames[i] = []byte(n)
	}
}

// answerBackend is the simulated backend's name, as the store keys it.
var answerBackend = []byte("app")

// answer records one answer of server i in second sec (the chunk ending
// at sec): its status and its time in ms.
func (d *driver) answer(sec int, i int, status, ms int) {
	d.store.RecordAt(d.epoch.Unix()+int64(sec), window.Event{Backend: answerBackend, Server: d.bnames[i], Status: status, ResponseMs: ms})
}

func (d *driver) close() {
	if d.done != nil {
		d.done()
	}
}

// share is server i's traffic against its configured weight's.
func (d *driver) share(i int) float64 { return float64(d.weight[i]) / initialWeight }

// drained: the agent holds server i drained.
func (d *driver) drained(i int) bool {
	return d.changed[i] != nil && d.changed[i].Phase == agent.PhaseDrained
}

// maxCooldown is recovery's longest wait before a drained server is
// probed (recovery.DefaultConfig's MaxCooldown).
const maxCooldown = 600.0

// cooldown is how long server i stays out after this drain: first, the
// cell's DrainFor (recovery's first cooldown, 30 s by default), doubled
// for each drain of the same server before in this fleet's run, up to
// maxCooldown, as recovery's backoff grows with a server's drains. The
// direct path keeps DrainFor for every drain.
func (d *driver) cooldown(i int, first float64) float64 {
	if d.drains == nil {
		d.drains = make([]int, len(d.names))
	}
	n := d.drains[i]
	d.drains[i]++
	return min(first*math.Pow(2, float64(n)), max(first, maxCooldown))
}

// release brings a drained server back, as recovery would once its
// probe cooldown passed (the direct path's DrainFor).
func (d *driver) release(i int) {
	d.changed[i], d.weight[i] = nil, initialWeight
}

// observe is the observation at second t: every server's state and
// windows.
func (d *driver) observe(t float64) agent.Observation {
	now := d.epoch.Add(time.Duration(t * float64(time.Second)))
	b := agent.BackendView{Name: "app", Servers: make([]agent.ServerView, len(d.names))}
	sec := int(t)
	var long, recent map[string]window.Stats
	if d.store != nil {
		d.clock = now
		lw, rw := d.store.Snapshots(windowSpan*time.Second, recentSpan*time.Second)
		long, recent = make(map[string]window.Stats, len(lw)), make(map[string]window.Stats, len(rw))
		for j := range lw {
			long[lw[j].Server], recent[rw[j].Server] = lw[j], rw[j]
		}
	}
	for i, name := range d.names {
		st := haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: d.weight[i], Initial: initialWeight}
		v := agent.ServerView{Backend: "app", Server: name, Owner: agent.OwnerNone}
		if c := d.changed[i]; c != nil {
			v.Owner, v.Changed = agent.OwnerAgent, c
			if c.Phase == agent.PhaseDrained {
				st.AdminState = haproxy.AdminForcedDrain
			}
		}
		v.State = st
		if d.store != nil {
			// the store's windows, a server with no answer yet at zero
			v.Window, v.Recent = long[name], recent[name]
			b.Servers[i] = v
			continue
		}
		var wn, wx, rn, rx uint64
		held, recent := 0, 0
		for k := range windowSpan {
			s := sec - k
			if s < 1 {
				break
			}
			c := d.ring[i][s%windowSpan]
			wn, wx = wn+c.N, wx+c.X
			held++
			if k < recentSpan {
				rn, rx = rn+c.N, rx+c.X
				recent++
			}
		}
		v.Window = statsOf(wn, wx, held, d.tot[i])
		v.Recent = statsOf(rn, rx, recent, d.tot[i])
		b.Servers[i] = v
	}
	return agent.Observation{Time: now, Lookback: windowSpan * time.Second, RecentSpan: recentSpan * time.Second, Backends: []agent.BackendView{b}}
}

func statsOf(n, x uint64, secs int, tot rules.Counts) window.Stats {
	s := window.Stats{Requests: n, Err5xx: x, Seconds: secs, TotalRequests: tot.N, TotalErr5xx: tot.X}
	if secs > 0 {
		s.RatePerSec = float64(n) / float64(secs)
	}
	return s
}

// chunk takes second t's counts (the chunk ending at t), runs the
// evidence check or the step due then, and returns the servers drained
// in it, byModel telling which the model's actions drained.
func (d *driver) chunk(t float64, in []rules.Counts) (out []int, byModel []bool) {
	d.out, d.byModel = d.out[:0], d.byModel[:0]
	if d.cycle == 0 {
		// The loop's first step, at its start, reads the servers before
		// any traffic: it sets the test's marks. What it drains is out
		// from this chunk's end, as a step's drains are.
		d.step(d.observe(0))
	}
	sec := int(t)
	for i, c := range in {
		d.tot[i].N += c.N
		d.tot[i].X += c.X
		d.ring[i][sec%windowSpan] = c
	}
	obs := d.observe(t)
	switch {
	case sec%d.interval == 0:
		d.trigger = 0
		d.step(obs)
	case d.pol.Evidence != nil:
		// The loop's evidence check: a step at once for a server the
		// last check or step did not find.
		found := d.pol.Evidence(obs)
		fresh := false
		for _, k := range found {
			fresh = fresh || !d.known[k]
		}
		d.known = keySet(found)
		if fresh && d.trigger < maxTriggered {
			d.trigger++
			d.step(obs)
		}
	}
	return d.out, d.byModel
}

// maxTriggered is the loop's cap on triggered steps an interval
// (loop.MaxTriggered; the soak does not link the loop's package for a
// constant).
const maxTriggered = 3

func keySet(keys []agent.Key) map[agent.Key]bool {
	m := make(map[agent.Key]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// step runs one observe-decide-vet-apply cycle on obs.
func (d *driver) step(obs agent.Observation) {
	d.cycle++
	d.counts.steps++
	obs.Cycle, obs.Refused = d.cycle, d.refused
	ctx, cancel := context.WithTimeout(context.Background(), d.deadline)
	plan, err := d.pol.Decide(ctx, obs)
	cancel()
	if err != nil {
		// The loop logs it and acts on nothing this step.
		d.counts.policyErrors++
		plan = nil
	}
	clear(d.isModel)
	if d.isModel == nil {
		d.isModel = map[agent.ActionID]bool{}
	}
	if d.pol.Report != nil {
		if rep, ok := d.pol.Report().(llm.Report); ok {
			d.model(rep)
		}
	}
	if d.pol.Evidence != nil {
		d.known = keySet(d.pol.Evidence(obs))
	}
	d.refused = map[agent.Key]string{}
	for _, v := range d.g.Vet(&obs, plan) {
		model := d.isModel[v.Proposed.ID()]
		if !v.Accepted {
			d.refused[v.Proposed.Key()] = v.Reason
			if model {
				d.counts.modelRefused++
			}
			continue
		}
		if model {
			d.counts.model++
			if v.Applied.Kind == agent.SetWeight && v.Applied.Weight < d.weight[max(d.index(v.Applied.Server), 0)] {
				d.counts.modelCuts++
			}
		}
		d.apply(obs.Time, v.Applied, model)
	}
}

// model counts a step of the LLM policy: its call, and which of the
// plan's actions are the model's beyond the floor.
func (d *driver) model(rep llm.Report) {
	d.llm = true
	if rep.Called {
		d.counts.calls++
		if rep.Call != nil {
			d.counts.callWall += rep.Call.WallMs
		}
	}
	if rep.Fallback != "" {
		d.counts.fallbacks++
	}
	d.counts.unsupported += len(rep.Unsupported)
	floor := map[agent.Key]bool{}
	for _, a := range rep.Floor {
		floor[a.Key()] = true
	}
	for _, a := range rep.ModelPlan {
		if !floor[a.Key()] {
			d.isModel[a.ID()] = true
		}
	}
}

// apply puts an accepted action in force on the simulated server, as
// the runtime socket and the ledger would.
func (d *driver) apply(at time.Time, a agent.Action, model bool) {
	i := d.index(a.Server)
	if i < 0 {
		return
	}
	switch a.Kind {
	case agent.Drain:
		d.changed[i] = &agent.Change{Phase: agent.PhaseDrained, At: at, Reason: a.Reason}
		d.out = append(d.out, i)
		d.byModel = append(d.byModel, model)
	case agent.SetWeight:
		d.weight[i] = a.Weight
		d.changed[i] = &agent.Change{Phase: agent.PhaseCut, Weight: a.Weight, At: at, Reason: a.Reason}
		if a.Weight >= initialWeight {
			d.changed[i] = nil
		}
	case agent.Ready:
		d.release(i)
	}
}

func (d *driver) index(server string) int {
	for i, n := range d.names {
		if n == server {
			return i
		}
	}
	return -1
}
