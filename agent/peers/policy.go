package peers

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// Role is the part an agent plays for one backend.
type Role string

const (
	// RoleDecider: this agent decides, on the fleet's pooled evidence.
	RoleDecider Role = "decider"
	// RoleFollower: another agent decides; this one applies its word.
	RoleFollower Role = "follower"
	// RoleAlone: no peer heard within the timeout; this agent decides on
	// its own evidence.
	RoleAlone Role = "alone"
	// RoleLocal: the decider has not spoken for this backend (it does not
	// serve it, or has not stepped yet); this agent decides on its own
	// evidence meanwhile.
	RoleLocal Role = "local"
)

// EvidenceKind says what a backend's decision rests on.
type EvidenceKind string

const (
	// EvidencePooled: every agent's counts.
	EvidencePooled EvidenceKind = "pooled"
	// EvidenceLocal: this agent's alone.
	EvidenceLocal EvidenceKind = "local"
)

// Evidence is one backend's figures over the policy's window.
type Evidence struct {
	Requests uint64 `json:"requests"`
	Err5xx   uint64 `json:"err_5xx"`
}

// BackendStatus is this agent's part in one backend, as of its last step.
type BackendStatus struct {
	Backend string `json:"backend"`
	Decider string `json:"decider"`
	Standby string `json:"standby,omitempty"`
	Role    Role   `json:"role"`
	// Evidence says what the decision rests on.
	Evidence EvidenceKind `json:"evidence"`
	Pooled   Evidence     `json:"pooled"`
	Local    Evidence     `json:"local"`
	// Held is what the decider holds out of service, as it said last.
	Held []string `json:"held,omitempty"`
}

// followed is a backend another agent decides, with its word.
type followed struct {
	view     agent.BackendView
	decider  string
	decision Decision
}

// split divides one step's observation: the backends this agent decides
// (on pooled evidence when it has peers), and those it follows. It keeps
// the outcome for /status and for the next sync's decisions.
func (n *Node) split(obs agent.Observation) (mine agent.Observation, follow []followed) {
	now := n.now()
	n.mu.Lock()
	pic := n.picture(now)
	decisions := map[string]map[string]Decision{}
	for name, p := range n.peers {
		decisions[name] = p.decisions
	}
	n.mu.Unlock()
	alone := pic.alone()

	mine = obs
	mine.Backends = nil
	var pooled, pooledRecent map[agent.Key]window.Stats
	if decided := n.decidedHere(obs, pic); len(decided) > 0 {
		m := window.Merged{n.local, n.remote}
		pooled, pooledRecent = byKey(m.SnapshotOf(obs.Lookback, decided)), byKey(m.SnapshotOf(obs.RecentSpan, decided))
	}
	var names []string
	var view []BackendStatus
	for _, b := range obs.Backends {
		names = append(names, b.Name)
		decider, standby := pic.decider(b.Name)
		st := BackendStatus{Backend: b.Name, Decider: decider, Standby: standby, Evidence: EvidenceLocal, Local: evidenceOf(b.Servers)}
		switch d, spoke := decisions[decider][b.Name]; {
		case alone:
			st.Role = RoleAlone
			mine.Backends = append(mine.Backends, b)
		case decider == n.name:
			st.Role, st.Evidence = RoleDecider, EvidencePooled
			b = withWindows(b, pooled, pooledRecent)
			st.Pooled = evidenceOf(b.Servers)
			mine.Backends = append(mine.Backends, b)
		case !spoke:
			st.Role = RoleLocal
			mine.Backends = append(mine.Backends, b)
		default:
			st.Role, st.Evidence = RoleFollower, EvidencePooled
			st.Pooled = Evidence{Requests: d.PooledRequests, Err5xx: d.PooledErr5xx}
			for _, h := range d.Held {
				st.Held = append(st.Held, h.Server)
			}
			follow = append(follow, followed{view: b, decider: decider, decision: d})
		}
		view = append(view, st)
	}
	n.mu.Lock()
	n.backends, n.view = names, view
	n.mu.Unlock()
	// Peers' counts of servers this HAProxy does not report (removed,
	// renamed) go, as the loop does with its own windows.
	known := map[agent.Key]bool{}
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			known[s.Key()] = true
		}
	}
	n.remote.Retain(func(backend, server string) bool { return known[agent.Key{Backend: backend, Server: server}] })
	return mine, follow
}

func byKey(stats []window.Stats) map[agent.Key]window.Stats {
	m := make(map[agent.Key]window.Stats, len(stats))
	for _, s := range stats {
		m[agent.Key{Backend: s.Backend, Server: s.Server}] = s
	}
	return m
}

// decidedHere are the backends of obs this node decides on pooled
// evidence: none when it is alone.
func (n *Node) decidedHere(obs agent.Observation, pic picture) map[string]bool {
	if pic.alone() {
		return nil
	}
	out := map[string]bool{}
	for _, b := range obs.Backends {
		if d, _ := pic.decider(b.Name); d == n.name {
			out[b.Name] = true
		}
	}
	return out
}

// evidenceOf sums the servers' windows as the view holds them: this
// node's own, or the pooled ones of a backend it decides.
func evidenceOf(servers []agent.ServerView) Evidence {
	var e Evidence
	for _, s := range servers {
		e.Requests += s.Window.Requests
		e.Err5xx += s.Window.Err5xx
	}
	return e
}

// withWindows is b with its servers' windows read from the pooled ones.
func withWindows(b agent.BackendView, long, recent map[agent.Key]window.Stats) agent.BackendView {
	servers := make([]agent.ServerView, len(b.Servers))
	for i, s := range b.Servers {
		s.SetWindows(long, recent)
		servers[i] = s
	}
	b.Servers = servers
	return b
}

// reconcile is what this agent does to follow a decider's word on one
// backend: drain what it holds drained, set the weight it holds a server
// at, bring back (as a re-admission, after the decider's probes) a server
// it holds at a canary weight. A server this agent holds and the decider
// does not is left to this agent's own recovery and its probes; an
// operator's server is never touched.
func reconcile(f followed) agent.Plan {
	held := map[string]Held{}
	for _, h := range f.decision.Held {
		held[h.Server] = h
	}
	var plan agent.Plan
	for _, s := range f.view.Servers {
		h, ok := held[s.Server]
		if !ok || s.Owner == agent.OwnerOperator {
			continue
		}
		why := func(what string) string {
			r := fmt.Sprintf("fleet: %s %s", f.decider, what)
			if h.Reason != "" {
				r += ": " + h.Reason
			}
			return r
		}
		drainedHere := s.Owner == agent.OwnerAgent && s.Changed != nil && s.Changed.Phase == agent.PhaseDrained
		switch {
		case h.Phase == agent.PhaseDrained:
			if !drainedHere {
				plan = append(plan, agent.Action{Kind: agent.Drain, Backend: s.Backend, Server: s.Server, Reason: why("drained it"), ErrorRate: h.ErrorRate})
			}
		case h.Weight <= 0:
			// a cut or canary phase always carries its weight
		case drainedHere && s.State.Weight != h.Weight:
			plan = append(plan, agent.Action{Kind: agent.SetWeight, Backend: s.Backend, Server: s.Server, Weight: h.Weight,
				Reason: why("re-admits it at a reduced weight, after its probes")})
		case drainedHere:
			plan = append(plan, agent.Action{Kind: agent.Ready, Backend: s.Backend, Server: s.Server, Origin: agent.OriginRecovery,
				Reason: why("re-admitted it, after its probes")})
		case s.State.Weight != h.Weight:
			plan = append(plan, agent.Action{Kind: agent.SetWeight, Backend: s.Backend, Server: s.Server, Weight: h.Weight,
				Reason: why(fmt.Sprintf("holds it at weight %d", h.Weight))})
		}
	}
	return plan
}

// decider runs the inner decision on the backends this agent decides,
// and follows the deciders of the others.
type decider struct {
	inner agent.Decider
	node  *Node
}

// Wrap returns inner in fleet mode. It replaces the decision and the
// evidence test, and keeps every other hook of inner as it is: its needs,
// report, status, metrics and life cycle.
func Wrap(inner agent.Policy, n *Node) agent.Policy {
	out := inner
	out.Decider = decider{inner: inner.Decider, node: n}
	if test := inner.Evidence; test != nil {
		// A decider's new word also triggers a step at once.
		out.Evidence = func(obs agent.Observation) []agent.Key { return n.evidence(test, obs) }
	}
	return out
}

func (d decider) Name() string { return d.inner.Name() }

// Decide decides the backends this agent decides, and follows the rest.
func (d decider) Decide(ctx context.Context, obs agent.Observation) (agent.Plan, error) {
	mine, follow := d.node.split(obs)
	var plan agent.Plan
	var err error
	if len(mine.Backends) > 0 {
		plan, err = d.inner.Decide(ctx, mine)
	}
	for _, f := range follow {
		plan = append(plan, reconcile(f)...)
	}
	return plan, err
}

// evidence is the inner test on the backends this agent decides, and the
// servers a decider's word would change here.
func (n *Node) evidence(test func(agent.Observation) []agent.Key, obs agent.Observation) []agent.Key {
	mine, follow := n.split(obs)
	found := test(mine)
	for _, f := range follow {
		for _, a := range reconcile(f) {
			found = append(found, a.Key())
		}
	}
	sort.Slice(found, func(i, j int) bool { return found[i].String() < found[j].String() })
	return found
}

// Recovery runs the inner recovery on every server but those a decider
// elsewhere holds: their way back is that decider's probes, followed
// here by reconcile.
type Recovery struct {
	Inner agent.Recovery
	Node  *Node
}

func (r Recovery) Plan(ctx context.Context, obs agent.Observation) agent.Plan {
	heldElsewhere := r.Node.heldElsewhere()
	if len(heldElsewhere) == 0 {
		return r.Inner.Plan(ctx, obs)
	}
	cp := obs
	cp.Backends = make([]agent.BackendView, 0, len(obs.Backends))
	for _, b := range obs.Backends {
		servers := make([]agent.ServerView, 0, len(b.Servers))
		for _, s := range b.Servers {
			if !heldElsewhere[s.Key()] {
				servers = append(servers, s)
			}
		}
		b.Servers = servers
		cp.Backends = append(cp.Backends, b)
	}
	return r.Inner.Plan(ctx, cp)
}

func (r Recovery) RequestProbe(k agent.Key) {
	if !r.Node.heldElsewhere()[k] {
		r.Inner.RequestProbe(k)
	}
}

// heldElsewhere are the servers the deciders of followed backends hold,
// as of the last step.
func (n *Node) heldElsewhere() map[agent.Key]bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[agent.Key]bool{}
	for _, v := range n.view {
		if v.Role == RoleFollower {
			for _, s := range v.Held {
				out[agent.Key{Backend: v.Backend, Server: s}] = true
			}
		}
	}
	return out
}

// Status is the fleet as this agent sees it, for /status and the page.
type Status struct {
	Name    string   `json:"name"`
	Addr    string   `json:"addr"`
	Members []Member `json:"members"`
	// Alone: no peer heard within the timeout; every backend is decided
	// here, on local evidence.
	Alone bool `json:"alone"`
	// LastSyncAgeMs is how long ago the last message from any peer came
	// (-1: never).
	LastSyncAgeMs float64           `json:"last_sync_age_ms"`
	Backends      []BackendStatus   `json:"backends"`
	Traffic       map[string]uint64 `json:"traffic"`
}

// Member is one node of the fleet.
type Member struct {
	Name string `json:"name"`
	Addr string `json:"addr"`
	// InPicture: heard within the timeout (always true of this node).
	InPicture bool `json:"in_picture"`
	// LastHeardMs: how long ago it was last heard from (-1: never, or self).
	LastHeardMs float64 `json:"last_heard_ms"`
	Self        bool    `json:"self,omitempty"`
}

// Status is a copy of the fleet's state.
func (n *Node) Status() Status {
	now := n.now()
	self := n.Addr() // memberlist's, read before n.mu (see Node.mu)
	n.mu.Lock()
	defer n.mu.Unlock()
	addrs := map[string]string{n.name: self}
	for name, a := range n.addresses() {
		addrs[name] = a.Addr
	}
	st := Status{Name: n.name, Addr: self, LastSyncAgeMs: -1, Backends: append([]BackendStatus{}, n.view...), Traffic: n.traffic()}
	if !n.lastHeard.IsZero() {
		st.LastSyncAgeMs = ms(now.Sub(n.lastHeard))
	}
	st.Members = append(st.Members, Member{Name: n.name, Addr: st.Addr, InPicture: true, LastHeardMs: -1, Self: true})
	seen := map[string]bool{n.name: true}
	for name, p := range n.peers {
		seen[name] = true
		st.Members = append(st.Members, Member{Name: name, Addr: addrs[name], InPicture: now.Sub(p.lastHeard) <= n.cfg.Timeout, LastHeardMs: ms(now.Sub(p.lastHeard))})
	}
	for name, addr := range addrs {
		if !seen[name] {
			st.Members = append(st.Members, Member{Name: name, Addr: addr, LastHeardMs: -1})
		}
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].Name < st.Members[j].Name })
	st.Alone = n.picture(now).alone()
	return st
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// traffic is the counters by their /status names. Callers hold n.mu
// (for nothing: the counters are atomic; it keeps Status one read).
func (n *Node) traffic() map[string]uint64 {
	c := &n.counters
	return map[string]uint64{
		"messages_sent": c.Sent.Load(), "messages_received": c.Received.Load(),
		"bytes_sent": c.BytesSent.Load(), "bytes_received": c.BytesReceived.Load(),
		"rejected": c.Rejected.Load(), "duplicates": c.Duplicates.Load(), "stale": c.Stale.Load(),
		"forged": c.Forged.Load(), "future": c.Future.Load(),
		"send_errors": c.SendErrors.Load(), "join_errors": c.JoinErrors.Load(),
		"counts_added": c.CountsAdded.Load(), "counts_refused": c.CountsRefused.Load(),
		"unsealed": c.Unsealed.Load(), "inbox_dropped": c.InboxDropped.Load(), "state_cut": c.StateCut.Load(),
		"streams_refused": c.StreamsRefused.Load(), "streams_evicted": c.StreamsEvicted.Load(),
	}
}

// Probe passes hapilot ctl explain's question on to the recovery it
// wraps, when that one can answer it.
func (r Recovery) Probe(k agent.Key) (agent.ProbeStatus, bool) {
	if p, ok := r.Inner.(interface {
		Probe(agent.Key) (agent.ProbeStatus, bool)
	}); ok {
		return p.Probe(k)
	}
	return agent.ProbeStatus{}, false
}
