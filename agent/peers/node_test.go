package peers

import (
	"context"
	"net/netip"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// rank orders every member for backend, decider first: the reference
// firstTwo must agree with.
func rank(backend string, members []string) []string {
	type scored struct {
		name  string
		score uint64
	}
	sc := make([]scored, len(members))
	for i, m := range members {
		sc[i] = scored{m, score(m, backend)}
	}
	sort.Slice(sc, func(i, j int) bool { return before(sc[i].score, sc[i].name, sc[j].score, sc[j].name) })
	out := make([]string, len(sc))
	for i, s := range sc {
		out[i] = s.name
	}
	return out
}

// clock is time driven by hand: the package's tests link nothing of the
// lab, since the agent's binary links the package.
type clock struct{ t time.Time }

func newClock(t time.Time) *clock        { return &clock{t} }
func (c *clock) Now() time.Time          { return c.t }
func (c *clock) Advance(d time.Duration) { c.t = c.t.Add(d) }

// newTestNode is a node with no network: messages reach it through
// receive (or hear), time through clk.
func newTestNode(name string, clk *clock) *Node {
	local := window.New(time.Minute, 64, clk.Now)
	cfg := DefaultConfig()
	return &Node{cfg: cfg, name: name, now: clk.Now, log: zerolog.Nop(), local: local, remote: window.New(time.Minute, 64, clk.Now),
		peers: map[string]*peer{}, members: map[string]member{}, logged: map[string]time.Time{},
		started: clk.Now().Add(-time.Hour), incarnation: 1, exporter: window.Exporter{Store: local}}
}

// addrOf is where the tests' member name lives: one port per name.
func addrOf(name string) netip.AddrPort {
	port := uint16(7000)
	for _, c := range name {
		port = port*31 + uint16(c)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 1}), port)
}

// hear delivers b to n from its sender's address, as memberlist's member
// of that name; a sender n has not met joins with the incarnation b
// carries, as its memberlist meta would say.
func hear(n *Node, b []byte) {
	v, err := decode(b)
	if err != nil {
		n.receive(b, netip.AddrPort{}, false)
		return
	}
	var h header
	switch m := v.(type) {
	case *stateMsg:
		h = m.header
	case *countsMsg:
		h = m.header
	}
	n.mu.Lock()
	if _, ok := n.members[h.Sender]; !ok && h.Sender != n.name {
		n.members[h.Sender] = member{addr: addrOf(h.Sender), incarnation: h.Incarnation}
	}
	n.mu.Unlock()
	n.receive(b, addrOf(h.Sender), false)
}

var seqs = map[string]uint64{}

// from is a state message of peer, started an hour before now, sent now.
func from(peer string, now time.Time, ds ...Decision) []byte {
	seqs[peer]++
	m, _ := encodeState(stateMsg{header: header{Sender: peer, Incarnation: uint64(now.Add(-time.Hour).UnixNano()), Sent: uint64(now.UnixNano()), Seq: seqs[peer]}, Decisions: ds})
	return m
}

func view(backend string, servers ...agent.ServerView) agent.Observation {
	for i := range servers {
		servers[i].Backend = backend
	}
	return agent.Observation{Lookback: time.Minute, RecentSpan: 10 * time.Second, Backends: []agent.BackendView{{Name: backend, Servers: servers}}}
}

func srv(name string, owner agent.Owner, admin int, weight int, changed *agent.Change) agent.ServerView {
	return agent.ServerView{Server: name, Owner: owner, Changed: changed,
		State: haproxy.ServerState{Server: name, AdminState: admin, OpState: haproxy.OpRunning, Weight: weight, Initial: 100}}
}

// The members that decide: whoever ranks first for the backend among the
// members heard within the timeout; alone, this node.
func TestRolesFollowThePicture(t *testing.T) {
	clk := newClock(time.Unix(100000, 0))
	n := newTestNode("a", clk)
	obs := view("app", srv("srv1", agent.OwnerNone, 0, 100, nil))
	role := func() BackendStatus {
		n.split(obs)
		return n.view[0]
	}
	if st := role(); st.Role != RoleAlone || st.Decider != "a" || st.Evidence != "local" {
		t.Fatalf("no peer: %+v", st)
	}
	// b and c speak; one of the three ranks first for app
	hear(n, from("b", clk.Now()))
	hear(n, from("c", clk.Now()))
	first := rank("app", []string{"a", "b", "c"})[0]
	st := role()
	if st.Decider != first {
		t.Fatalf("decider %s, want the first by rank, %s", st.Decider, first)
	}
	if first != "a" && st.Role != RoleLocal {
		t.Fatalf("the decider %s has not spoken for app: role %s, want local", first, st.Role)
	}
	if first != "a" {
		hear(n, from(first, clk.Now(), Decision{Backend: "app"}))
		if st := role(); st.Role != RoleFollower || st.Evidence != "pooled" {
			t.Fatalf("the decider spoke: %+v", st)
		}
	}
	// past the timeout without a word from either: alone again
	clk.Advance(n.cfg.Timeout + time.Millisecond)
	if st := role(); st.Role != RoleAlone {
		t.Fatalf("after the timeout: %+v", st)
	}
}

// A member that joined a running fleet minutes after the others follows
// until it has run for the warm-up, even where it ranks first.
func TestYoungMemberDoesNotDecide(t *testing.T) {
	clk := newClock(time.Unix(100000, 0))
	// find a backend name for which the young member ranks first
	backend := ""
	for _, b := range []string{"app", "api", "web", "static", "auth", "cart", "img", "search"} {
		if rank(b, []string{"old", "young"})[0] == "young" {
			backend = b
			break
		}
	}
	if backend == "" {
		t.Fatal("no backend ranks young first")
	}
	for _, tc := range []struct {
		name   string
		youngs time.Duration // how long young has run
		want   string
	}{
		{"just joined", 2 * time.Second, "old"},
		{"joined with the fleet", time.Hour - 3*time.Second, "young"},
		{"warm", DefaultConfig().Warmup, "young"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode("young", clk)
			n.started = clk.Now().Add(-tc.youngs)
			hear(n, from("old", clk.Now()))
			n.split(view(backend, srv("srv1", agent.OwnerNone, 0, 100, nil)))
			if got := n.view[0].Decider; got != tc.want {
				t.Fatalf("decider %s, want %s", got, tc.want)
			}
		})
	}
}

// A decider's pooled view is its own windows and its peers' counts added.
func TestDeciderJudgesPooledEvidence(t *testing.T) {
	clk := newClock(time.Unix(100000, 0))
	n := newTestNode("a", clk)
	backend := "" // one a decides among a and b
	for _, b := range []string{"app", "api", "web", "static", "auth"} {
		if rank(b, []string{"a", "b"})[0] == "a" {
			backend = b
			break
		}
	}
	for i := 0; i < 30; i++ {
		n.local.Record(window.Event{Backend: []byte(backend), Server: []byte("srv1"), Status: 200, ResponseMs: 9})
	}
	peerStore := window.New(time.Minute, 8, clk.Now)
	for i := 0; i < 70; i++ {
		status := 200
		if i < 7 {
			status = 500
		}
		peerStore.Record(window.Event{Backend: []byte(backend), Server: []byte("srv1"), Status: status, ResponseMs: 9})
	}
	ex := window.Exporter{Store: peerStore}
	hear(n, from("b", clk.Now()))
	counts := encodeCounts(header{Sender: "b", Incarnation: uint64(clk.Now().Add(-time.Hour).UnixNano()), Sent: uint64(clk.Now().UnixNano())}, ex.Deltas(), 1336, func() uint64 { seqs["b"]++; return seqs["b"] })
	for _, m := range counts {
		hear(n, m)
	}
	obs := view(backend, srv("srv1", agent.OwnerNone, 0, 100, nil))
	obs.Backends[0].Servers[0].Window = n.local.Snapshot(time.Minute)[0] // the loop's own view
	mine, follow := n.split(obs)
	if len(follow) != 0 || len(mine.Backends) != 1 {
		t.Fatalf("a decides %s: mine %d, followed %d", backend, len(mine.Backends), len(follow))
	}
	w := mine.Backends[0].Servers[0].Window
	if w.Requests != 100 || w.Err5xx != 7 {
		t.Fatalf("pooled window %d requests, %d 5xx; want 100 and 7", w.Requests, w.Err5xx)
	}
	if st := n.view[0]; st.Evidence != "pooled" || st.Pooled.Requests != 100 || st.Local.Requests != 30 {
		t.Fatalf("status %+v", st)
	}
	// the same counts delivered again are not added again
	for _, m := range counts {
		hear(n, m)
	}
	mine, _ = n.split(obs)
	if w := mine.Backends[0].Servers[0].Window; w.Requests != 100 || n.counters.Duplicates.Load() != uint64(len(counts)) {
		t.Fatalf("counts delivered twice: pooled %d requests, %d duplicates of %d messages", w.Requests, n.counters.Duplicates.Load(), len(counts))
	}
}

// A repeated, late or stale message changes nothing; a new process of a
// peer's name, once memberlist lists it, starts afresh.
func TestMessagesAreIdempotent(t *testing.T) {
	clk := newClock(time.Unix(100000, 0))
	n := newTestNode("a", clk)
	inc := uint64(clk.Now().Add(-time.Hour).UnixNano())
	now := uint64(clk.Now().UnixNano())
	msg := func(inc, sent, seq uint64, held ...Held) []byte {
		m, _ := encodeState(stateMsg{header: header{Sender: "b", Incarnation: inc, Sent: sent, Seq: seq}, Decisions: []Decision{{Backend: "app", Held: held}}})
		return m
	}
	drained := Held{Server: "srv1", Phase: agent.PhaseDrained}
	hear(n, msg(inc, now, 5, drained))
	hear(n, msg(inc, now, 5, drained))                 // repeated
	hear(n, msg(inc, now-uint64(time.Millisecond), 4)) // late: an older word, delayed on its way
	if got := n.peers["b"].decisions["app"].Held; len(got) != 1 {
		t.Fatalf("a late message replaced the decision: %+v", got)
	}
	hear(n, msg(inc-1, now, 9)) // another process of b than the one memberlist lists
	if d, s := n.counters.Duplicates.Load(), n.counters.Stale.Load(); d != 1 || s != 1 {
		t.Fatalf("duplicates %d stale %d, want 1 and 1", d, s)
	}
	// b restarted: memberlist's meta says so
	n.learn(&memberlist.Node{Name: "b", Addr: addrOf("b").Addr().AsSlice(), Port: addrOf("b").Port(), Meta: encodeMeta(inc + 1)})
	hear(n, msg(inc+1, now, 1))
	if got := n.peers["b"].decisions["app"].Held; len(got) != 0 {
		t.Fatalf("the restarted peer's word did not replace the old one: %+v", got)
	}
	own, _ := encodeState(stateMsg{header: header{Sender: "a", Incarnation: 1, Sent: now, Seq: 1}})
	hear(n, own)
	if n.counters.Rejected.Load() != 1 {
		t.Fatal("a message in this node's own name was accepted")
	}
}

func TestReconcileFollowsTheDecidersState(t *testing.T) {
	drainedHere := &agent.Change{Phase: agent.PhaseDrained}
	canaryHere := &agent.Change{Phase: agent.PhaseCanary, Weight: 25}
	for _, tc := range []struct {
		name string
		here agent.ServerView
		held *Held
		want agent.Plan
	}{
		{"not held, serving", srv("s", agent.OwnerNone, 0, 100, nil), nil, nil},
		{"not held, drained here: left to this node's recovery", srv("s", agent.OwnerAgent, haproxy.AdminForcedDrain, 100, drainedHere), nil, nil},
		{"held drained, serving here: drained at the decider's 5xx rate", srv("s", agent.OwnerNone, 0, 100, nil), &Held{Server: "s", Phase: agent.PhaseDrained, Reason: "5xx", ErrorRate: 0.0464},
			agent.Plan{{Kind: agent.Drain, Backend: "app", Server: "s", Reason: "fleet: b drained it: 5xx", ErrorRate: 0.0464}}},
		{"held drained, drained here already", srv("s", agent.OwnerAgent, haproxy.AdminForcedDrain, 100, drainedHere), &Held{Server: "s", Phase: agent.PhaseDrained}, nil},
		{"held drained, an operator's here", srv("s", agent.OwnerOperator, haproxy.AdminForcedMaint, 100, nil), &Held{Server: "s", Phase: agent.PhaseDrained}, nil},
		{"held at a cut weight, full here", srv("s", agent.OwnerNone, 0, 100, nil), &Held{Server: "s", Phase: agent.PhaseCut, Weight: 50},
			agent.Plan{{Kind: agent.SetWeight, Backend: "app", Server: "s", Weight: 50, Reason: "fleet: b holds it at weight 50"}}},
		{"canary there, drained here: the canary weight first", srv("s", agent.OwnerAgent, haproxy.AdminForcedDrain, 100, drainedHere), &Held{Server: "s", Phase: agent.PhaseCanary, Weight: 25},
			agent.Plan{{Kind: agent.SetWeight, Backend: "app", Server: "s", Weight: 25, Reason: "fleet: b re-admits it at a reduced weight, after its probes"}}},
		{"canary there, drained here at the canary weight: ready", srv("s", agent.OwnerAgent, haproxy.AdminForcedDrain, 25, drainedHere), &Held{Server: "s", Phase: agent.PhaseCanary, Weight: 25},
			agent.Plan{{Kind: agent.Ready, Backend: "app", Server: "s", Origin: agent.OriginRecovery, Reason: "fleet: b re-admitted it, after its probes"}}},
		{"canary there and here", srv("s", agent.OwnerAgent, 0, 25, canaryHere), &Held{Server: "s", Phase: agent.PhaseCanary, Weight: 25}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := followed{view: view("app", tc.here).Backends[0], decider: "b"}
			if tc.held != nil {
				f.decision.Held = []Held{*tc.held}
			}
			if got := reconcile(f); !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

type recordingRecovery struct{ saw []string }

func (r *recordingRecovery) Plan(_ context.Context, obs agent.Observation) agent.Plan {
	r.saw = nil
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			r.saw = append(r.saw, s.Server)
		}
	}
	return nil
}
func (r *recordingRecovery) RequestProbe(agent.Key) {}

// Recovery leaves a server a decider elsewhere holds to that decider.
func TestRecoveryLeavesHeldServersToTheirDecider(t *testing.T) {
	clk := newClock(time.Unix(100000, 0))
	n := newTestNode("a", clk)
	backend := ""
	for _, b := range []string{"app", "api", "web", "static", "auth"} {
		if rank(b, []string{"a", "b"})[0] == "b" {
			backend = b
			break
		}
	}
	hear(n, from("b", clk.Now(), Decision{Backend: backend, Held: []Held{{Server: "srv2", Phase: agent.PhaseDrained}}}))
	obs := view(backend, srv("srv1", agent.OwnerAgent, haproxy.AdminForcedDrain, 100, &agent.Change{Phase: agent.PhaseDrained}),
		srv("srv2", agent.OwnerAgent, haproxy.AdminForcedDrain, 100, &agent.Change{Phase: agent.PhaseDrained}))
	n.split(obs)
	rec := &recordingRecovery{}
	Recovery{Inner: rec, Node: n}.Plan(context.Background(), obs)
	if !reflect.DeepEqual(rec.saw, []string{"srv1"}) {
		t.Fatalf("recovery saw %v, want srv1 only", rec.saw)
	}
}

// firstTwo agrees with the full ranking.
func TestFirstTwoIsTheRankingsHead(t *testing.T) {
	members := []string{"a", "b", "c", "d", "e", "f", "g"}
	for _, b := range []string{"app", "api", "web", "x", "y", "z", "b042"} {
		r := rank(b, members)
		if f, s := firstTwo(b, members); f != r[0] || s != r[1] {
			t.Errorf("%s: firstTwo %s %s, rank %v", b, f, s, r[:2])
		}
	}
	if f, s := firstTwo("app", []string{"a"}); f != "a" || s != "" {
		t.Errorf("one member: %q %q", f, s)
	}
}
