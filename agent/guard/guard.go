package guard

import (
	"errors"
	"fmt"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
)

// Guardrails bound what any policy may do in one step. They are
// deterministic and apply to every policy, present and future.
type Guardrails struct {
	MaxDrains     int // drains per step
	MaxActions    int // actions per step
	MaxWeightStep int // how far one step may move a weight
	// MinServing is the fewest servers a backend may be left serving;
	// 0 means half its servers, rounded up, and at least one.
	MinServing int
	// DrainsPer adapts the drain cap to fleet size: when set, each
	// backend of N servers may lose up to max(MaxDrains, N/DrainsPer)
	// servers per step (the serving floor still applies). 0 keeps
	// MaxDrains for the whole step.
	DrainsPer int
	// MaxUtilization makes draining capacity-aware: where HAProxy knows
	// the servers' maxconn, a drain that would push a surviving server
	// past this share of its throughput (maxconn / service time)
	// becomes the smallest weight cut that keeps it below. 0 is off.
	MaxUtilization float64
	// Scope is the config file's backend blocks: which backends and
	// servers the agent acts on, and each one's floor, cap and action.
	Scope Scope
	// MaxDrained caps the servers the agent holds drained across every
	// backend (a count, or a share of every server); zero: no cap.
	MaxDrained Cap
	// DrainsPerHour caps each backend's drains in any hour; 0: no cap.
	DrainsPerHour int
}

// DefaultGuardrails are the study's limits plus our serving floor.
func DefaultGuardrails() Guardrails {
	return Guardrails{MaxDrains: 1, MaxActions: 3, MaxWeightStep: 50, MaxUtilization: 0.85}
}

// For returns the guardrails widened by a policy's needs: its drain cap
// per fleet size. Nothing a policy needs loosens the floor, the operator's
// hold or any other limit.
func (g Guardrails) For(n agent.Needs) Guardrails {
	if n.DrainsPer > 0 {
		g.DrainsPer = n.DrainsPer
	}
	return g
}

// Validate checks the settings an operator may give.
func (g Guardrails) Validate() error {
	var errs []error
	if g.MinServing < 0 {
		errs = append(errs, fmt.Errorf("min-serving %d is negative", g.MinServing))
	}
	if !(g.MaxUtilization >= 0 && g.MaxUtilization <= 1) { // NaN fails too
		errs = append(errs, fmt.Errorf("max-utilization %v outside [0, 1]", g.MaxUtilization))
	}
	if g.DrainsPerHour < 0 {
		errs = append(errs, fmt.Errorf("max-drains-per-hour %d is negative", g.DrainsPerHour))
	}
	if g.MaxDrains < 1 || g.MaxActions < 1 || g.MaxWeightStep < 1 {
		errs = append(errs, fmt.Errorf("max drains, actions and weight step must be positive"))
	}
	return errors.Join(errs...)
}

// Floor is the serving floor for a backend of n servers.
func (g Guardrails) Floor(n int) int {
	if g.MinServing > 0 {
		return g.MinServing
	}
	f := (n + 1) / 2
	if f < 1 {
		f = 1
	}
	return f
}

// capacityWeight finds the smallest weight for s that keeps every other
// serving server of b within MaxUtilization of its throughput, where that
// is known. why is empty when a drain is fine (or capacity unknown).
func (g Guardrails) capacityWeight(obs *agent.Observation, b *agent.BackendView, serving map[string]bool, s *agent.ServerView) (int, string) {
	if g.MaxUtilization <= 0 {
		return 0, ""
	}
	var rate float64
	type peer struct{ weight, capacity float64 }
	var peers []peer
	var peerWeight float64
	for _, v := range b.Servers {
		if !serving[v.Server] {
			continue
		}
		if v.MaxConn <= 0 {
			return 0, "" // capacity unknown: nothing to protect
		}
		r := v.Recent.RatePerSec
		if r <= 0 {
			// No rate over complete seconds yet. With 50 requests, or in
			// the first seconds of data, a partial second would understate
			// the load: wait. Otherwise it is a trickle.
			if v.Recent.Requests >= 50 || v.Recent.Seconds < 3 {
				return s.State.Weight, "capacity: too little history yet to know whether the others can take its load"
			}
			r = float64(v.Recent.Requests) / float64(max(v.Recent.Seconds, 1)) // a trickle
		}
		rate += r
		if v.Server != s.Server {
			c := float64(v.MaxConn) / (float64(max(v.ServiceMs(), 1)) / 1000)
			peers = append(peers, peer{float64(v.State.Weight), c})
			peerWeight += float64(v.State.Weight)
		}
	}
	worst := func(w int) float64 {
		u := 0.0
		for _, p := range peers {
			u = max(u, rate*p.weight/(peerWeight+float64(w))/p.capacity)
		}
		return u
	}
	for w := 0; w < s.State.Weight; w++ {
		if worst(w) <= g.MaxUtilization {
			if w == 0 {
				return 0, ""
			}
			return w, fmt.Sprintf("capacity: draining would run the others at %.0f%% of their throughput; weight %d keeps them at %.0f%%",
				100*worst(0), w, 100*worst(w))
		}
	}
	return s.State.Weight, fmt.Sprintf("capacity: the others would run at %.0f%% of their throughput even with a smaller weight", 100*worst(s.State.Weight-1))
}

func (g Guardrails) drainLimit(servers int) int {
	if g.DrainsPer > 0 {
		return max(g.MaxDrains, servers/g.DrainsPer)
	}
	return g.MaxDrains
}

// refusal is a refusal's code and its text.
type refusal struct {
	code agent.Refusal
	text string
}

func refuse(code agent.Refusal, format string, args ...any) *refusal {
	return &refusal{code, fmt.Sprintf(format, args...)}
}

// Vet checks a plan against the observation, in the plan's order.
func (g Guardrails) Vet(obs *agent.Observation, plan agent.Plan) []agent.Verdict {
	out := make([]agent.Verdict, 0, len(plan))
	// serving after the actions accepted so far, per backend
	serving := map[string]map[string]bool{}
	touched := map[agent.Key]bool{}
	drains := map[string]int{} // per backend, or all under "" without DrainsPer
	actions := 0
	held := g.heldDrains(obs)
	for _, a := range plan {
		v := agent.Verdict{Proposed: a}
		scope := ""
		if g.DrainsPer > 0 {
			scope = a.Backend
		}
		r, applied := g.check(obs, serving, touched, a, drains[scope], actions)
		if r == nil && applied.Kind == agent.Drain && a.Counted() {
			r = g.checkCaps(obs, held, a.Backend)
		}
		if r != nil {
			v.Code, v.Reason = r.code, r.text
			out = append(out, v)
			continue
		}
		v.Accepted, v.Applied = true, applied
		if a.Counted() {
			actions++
			if applied.Kind == agent.Drain {
				drains[scope]++
				held.add(a.Backend)
				held.step[a.Backend]++
			}
		}
		touched[a.Key()] = true
		out = append(out, v)
	}
	return out
}

func (g Guardrails) check(obs *agent.Observation, serving map[string]map[string]bool, touched map[agent.Key]bool, a agent.Action, drains, actions int) (*refusal, agent.Action) {
	b, s := obs.Find(a.Backend, a.Server)
	if s == nil {
		return refuse(agent.RefusedUnknownServer, "unknown server %s", a.Key()), a
	}
	if touched[a.Key()] {
		return refuse(agent.RefusedTouched, "one action per server per step"), a
	}
	if s.Owner == agent.OwnerOperator {
		if !s.OperatorUntil.IsZero() {
			return refuse(agent.RefusedOperator, "the operator undid the agent's change (%s, weight %d of %d): theirs until %s or until its state changes",
				s.State.Label(), s.State.Weight, s.State.Initial, s.OperatorUntil.Format(time.TimeOnly)), a
		}
		return refuse(agent.RefusedOperator, "held by the operator (%s, weight %d of %d): the agent never changes it", s.State.Label(), s.State.Weight, s.State.Initial), a
	}
	// Out of scope or left alone, the agent may only undo its own change.
	if a.Kind != agent.Ready {
		bs := g.Scope.For(b.Name)
		if !bs.InScope() {
			return refuse(agent.RefusedOutOfScope, "backend %s is out of scope (enabled false in the config's backend %s block): the agent observes it only", b.Name, bs.Pattern), a
		}
		if bs.LeftAlone(a.Server) {
			return refuse(agent.RefusedLeftAlone, "%s is left alone (leave-alone in the config's backend %s block)", a.Key(), bs.Pattern), a
		}
	}
	if actions >= g.MaxActions && a.Counted() {
		return refuse(agent.RefusedActionCap, "at most %d actions per step", g.MaxActions), a
	}
	cur := serving[b.Name]
	if cur == nil {
		cur = map[string]bool{}
		for _, sv := range b.Servers {
			cur[sv.Server] = sv.Serving()
		}
		serving[b.Name] = cur
	}
	switch a.Kind {
	case agent.Drain:
		return g.checkDrain(obs, b, s, cur, a, drains)
	case agent.Ready:
		if s.Owner != agent.OwnerAgent {
			return refuse(agent.RefusedNotAgents, "not changed by the agent: nothing to undo"), a
		}
		// Only recovery, after its probes, brings a drained server back
		// (and the agent's own undo as it stops, which never passes here).
		if s.Changed != nil && s.Changed.Phase == agent.PhaseDrained && a.Origin != agent.OriginRecovery && a.Origin != agent.OriginRestore {
			return refuse(agent.RefusedNeedsProbe, "a drained server comes back only after a clean probe burst: recovery was asked to probe it"), a
		}
		cur[a.Server] = s.State.OpState == haproxy.OpRunning
		return nil, a
	case agent.SetWeight:
		return g.checkWeight(obs, b, s, cur, a)
	}
	return refuse(agent.RefusedUnknownKind, "unknown action kind %q", a.Kind), a
}

// belowFloor says why taking server out of b's serving set cur would
// leave b below its floor, or nil when it would not.
func (g Guardrails) belowFloor(b *agent.BackendView, cur map[string]bool, server string) *refusal {
	count := 0
	for _, on := range cur {
		if on {
			count++
		}
	}
	if floor := g.floorOf(b); cur[server] && count-1 < floor {
		return refuse(agent.RefusedFloor, "would leave %s with %d serving servers, below the floor of %d", b.Name, count-1, floor)
	}
	return nil
}

func (g Guardrails) checkDrain(obs *agent.Observation, b *agent.BackendView, s *agent.ServerView, cur map[string]bool, a agent.Action, drains int) (*refusal, agent.Action) {
	if s.State.Drain() {
		return refuse(agent.RefusedNoChange, "already drained"), a
	}
	if limit := g.drainLimit(len(b.Servers)); drains >= limit && a.Counted() {
		return refuse(agent.RefusedDrainCap, "at most %d drain per step", limit), a
	}
	if obs.Time.Before(s.NoDrainUntil) {
		return refuse(agent.RefusedTailHold, "held from draining until %s: draining it hurt the backend's p99", s.NoDrainUntil.Format(time.TimeOnly)), a
	}
	if r := g.belowFloor(b, cur, a.Server); r != nil {
		return r, a
	}
	if a.Counted() {
		if w, why := g.capacityWeight(obs, b, cur, s); why != "" {
			if w >= s.State.Weight {
				return &refusal{agent.RefusedCapacity, why}, a
			}
			cut := a
			cut.Kind, cut.Weight = agent.SetWeight, w
			cut.Reason = a.Reason + "; " + why
			return nil, cut
		}
	}
	cur[a.Server] = false
	return nil, a
}

// checkWeight bounds a weight change: at most MaxWeightStep a step, and
// never above the server's configured weight, whichever policy asks. A
// cut is checked against the others' capacity as a drain is.
func (g Guardrails) checkWeight(obs *agent.Observation, b *agent.BackendView, s *agent.ServerView, cur map[string]bool, a agent.Action) (*refusal, agent.Action) {
	w := a.Weight
	lo, hi := s.State.Weight-g.MaxWeightStep, s.State.Weight+g.MaxWeightStep
	w = max(w, lo, 0)
	w = min(w, hi, haproxy.MaxWeight, s.State.Initial)
	if w == s.State.Weight {
		if a.Weight > s.State.Initial {
			return refuse(agent.RefusedAboveConfig, "weight %d is above the configured %d: no policy raises a weight past its configuration", a.Weight, s.State.Initial), a
		}
		return refuse(agent.RefusedNoChange, "weight already %d", w), a
	}
	applied := a
	if w < s.State.Weight && cur[a.Server] && a.Counted() {
		if least, why := g.capacityWeight(obs, b, cur, s); why != "" && w < least {
			if least >= s.State.Weight {
				return &refusal{agent.RefusedCapacity, why}, a
			}
			w = least
			applied.Reason = a.Reason + "; " + why
		}
	}
	if w == 0 {
		if r := g.belowFloor(b, cur, a.Server); r != nil {
			return r, a
		}
		cur[a.Server] = false
	} else if !s.State.Drain() && !s.State.Maint() {
		cur[a.Server] = s.State.OpState == haproxy.OpRunning
	}
	applied.Weight = w
	return nil, applied
}

// floorOf is b's serving floor: its block's min-serving, else the
// global one.
func (g Guardrails) floorOf(b *agent.BackendView) int {
	if bs := g.Scope.For(b.Name); bs.MinServing != nil && *bs.MinServing > 0 {
		return *bs.MinServing
	}
	return g.Floor(len(b.Servers))
}

// drainsHeld counts the servers the agent holds drained, per backend and
// in all, with this step's accepted drains added as they pass.
type drainsHeld struct {
	by      map[string]int
	step    map[string]int // drains accepted this step
	servers map[string]int // each backend's servers, for a percentage
	total   int
	all     int // every backend's servers
}

func (h *drainsHeld) add(backend string) { h.by[backend]++; h.total++ }

func (g Guardrails) heldDrains(obs *agent.Observation) *drainsHeld {
	h := &drainsHeld{by: map[string]int{}, step: map[string]int{}, servers: map[string]int{}}
	for _, b := range obs.Backends {
		h.servers[b.Name] = len(b.Servers)
		h.all += len(b.Servers)
		for _, s := range b.Servers {
			if s.Owner == agent.OwnerAgent && s.Changed != nil && s.Changed.Phase == agent.PhaseDrained {
				h.add(b.Name)
			}
		}
	}
	return h
}

// checkCaps holds a drain of backend to its max-drained, to
// --max-drained across every backend, and to --max-drains-per-hour.
func (g Guardrails) checkCaps(obs *agent.Observation, held *drainsHeld, backend string) *refusal {
	bs := g.Scope.For(backend)
	if bs.MaxDrained != nil {
		if limit := bs.MaxDrained.Of(held.servers[backend]); limit > 0 && held.by[backend] >= limit {
			return refuse(agent.RefusedMaxDrained, "backend %s already has %d drained by the agent: its max-drained is %s (%d of %d servers)",
				backend, held.by[backend], bs.MaxDrained, limit, held.servers[backend])
		}
	}
	if limit := g.MaxDrained.Of(held.all); limit > 0 && held.total >= limit {
		return refuse(agent.RefusedMaxDrained, "the agent already holds %d servers drained: --max-drained is %s (%d of %d servers)",
			held.total, g.MaxDrained, limit, held.all)
	}
	if g.DrainsPerHour > 0 {
		if n := obs.DrainsLastHour[backend] + held.step[backend]; n >= g.DrainsPerHour {
			return refuse(agent.RefusedRateCap, "backend %s had %d drains in the last hour: --max-drains-per-hour is %d", backend, n, g.DrainsPerHour)
		}
	}
	return nil
}
