// Package peers is fleet mode (--fleet-*): it lets the agents of several
// HAProxy nodes, in front of the same backend servers, judge on their pooled evidence with one decider
// per backend, every agent applying that decider's word to its own
// HAProxy through its own guardrails.
//
// Membership, failure detection and the encrypted transport are
// hashicorp/memberlist's (SWIM gossip; its keyring encrypts and
// authenticates every packet with the shared key). On top of it this
// package adds only what is hapilot's:
//
//   - every Sync, each agent sends every member a state message: its
//     heartbeat, and its decisions for the backends it decides;
//   - every Sync, each agent sends what its windows gained, second by
//     second, to the decider of each backend and to the next in line, so
//     that a takeover starts from the same evidence;
//   - a peer not heard for Timeout is out of the picture. Each backend's
//     decider is the first of the members in the picture by rendezvous
//     hashing on the backend's name: every agent works out the same one
//     from the same picture, with no election. An agent that hears no
//     one decides everything alone, on its own evidence.
//
// A decision is a state (the servers the decider holds out, and how), so
// a repeated, late or doubled one changes nothing. Every agent vets it
// with its own guardrails, and never touches an operator's server.
package peers

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/window"
	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// Params is what Start needs beyond the settings.
type Params struct {
	Config
	Key []byte
	// Local is this agent's own windows; MaxSeries bounds the series its
	// peers' counts may make in the pooled ones.
	Local     *window.Store
	MaxSeries int
	// Tune, when set, adjusts memberlist's settings before it starts:
	// its timings, compression or transport. nil keeps its LAN defaults.
	Tune func(*memberlist.Config)
	Now  func() time.Time
	Log  zerolog.Logger
}

// Node is this agent's membership of the fleet.
type Node struct {
	cfg         Config
	name        string
	now         func() time.Time
	log         zerolog.Logger
	local       *window.Store
	remote      *window.Store // what the peers sent, all of them summed
	exporter    window.Exporter
	ml          *memberlist.Memberlist
	incarnation uint64
	started     time.Time
	seq         atomic.Uint64
	limit       int // a message's size that still fits one UDP packet

	// changes is the loop's ledger, read at each sync for the decisions
	// of the backends this agent decides.
	changes atomic.Pointer[func() map[agent.Key]agent.Change]

	mu        sync.Mutex
	peers     map[string]*peer
	backends  []string // the backends this agent's HAProxy serves, at its last step
	view      []BackendStatus
	lastHeard time.Time

	counters Counters
	sends    sync.WaitGroup // reliable sends of oversized messages
	sendSem  chan struct{}
	stop     chan struct{}
	done     sync.WaitGroup
	closed   sync.Once
}

// Counters are the fleet's traffic, for /metrics and /status.
type Counters struct {
	Sent, Received, BytesSent, BytesReceived atomic.Uint64
	// Rejected: messages that failed to parse, or claimed this agent's
	// own name; Duplicates: a sequence number seen before; Stale: from an
	// older process of that peer's name.
	Rejected, Duplicates, Stale atomic.Uint64
	SendErrors, JoinErrors      atomic.Uint64
	CountsAdded, CountsRefused  atomic.Uint64
}

// peer is what this agent knows of another.
type peer struct {
	incarnation uint64
	hi          uint64 // highest sequence number seen
	seen        uint64 // bit i: hi-i seen
	lastHeard   time.Time
	stateSeq    uint64
	decisions   map[string]Decision
}

// accept reports whether a message is new: not from an older process of
// the same name, not a sequence number already seen.
func (p *peer) accept(h header) (ok, stale bool) {
	switch {
	case h.Incarnation < p.incarnation:
		return false, true
	case h.Incarnation > p.incarnation:
		*p = peer{incarnation: h.Incarnation}
	}
	if h.Seq > p.hi {
		if shift := h.Seq - p.hi; shift >= 64 {
			p.seen = 0
		} else {
			p.seen <<= shift
		}
		p.seen |= 1
		p.hi = h.Seq
		return true, false
	}
	d := p.hi - h.Seq
	if d >= 64 || p.seen&(1<<d) != 0 {
		return false, false
	}
	p.seen |= 1 << d
	return true, false
}

// Start joins the fleet: it binds, and tries the join list in the
// background, so that the first node of a fleet starts alone. Run sends.
func Start(p Params) (*Node, error) {
	if p.Now == nil {
		p.Now = time.Now
	}
	if p.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("fleet-name: no name given and no hostname: %w", err)
		}
		p.Name = h
	}
	if p.MaxSeries <= 0 {
		p.MaxSeries = window.DefaultMaxSeries
	}
	n := &Node{cfg: p.Config, name: p.Name, now: p.Now, log: p.Log, local: p.Local,
		remote: window.New(p.Local.Span(), p.MaxSeries, p.Now), peers: map[string]*peer{},
		started: p.Now(), sendSem: make(chan struct{}, 8), stop: make(chan struct{})}
	n.incarnation = uint64(n.started.UnixNano())
	n.exporter.Store = p.Local
	mc := memberlist.DefaultLANConfig()
	mc.Name = p.Name
	host, port, err := splitHostPort(p.Bind)
	if err != nil {
		return nil, fmt.Errorf("fleet-bind %q: %w", p.Bind, err)
	}
	mc.BindAddr, mc.BindPort, mc.AdvertisePort = host, port, port
	mc.SecretKey = p.Key
	mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	mc.Delegate = delegate{n}
	mc.Events = events{n}
	mc.Logger = log.New(logWriter{p.Log}, "", 0)
	if p.Tune != nil {
		p.Tune(mc)
	}
	// Room for memberlist's own framing and encryption (type byte,
	// label, version, nonce, tag) in one packet.
	n.limit = mc.UDPBufferSize - 64
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("fleet: start memberlist on %s: %w", p.Bind, err)
	}
	n.ml = ml
	return n, nil
}

// Name is this node's name in the fleet.
func (n *Node) Name() string { return n.name }

// Addr is where peers reach this node.
func (n *Node) Addr() string { return n.ml.LocalNode().Address() }

// SetChanges gives the node the loop's ledger, whose changes of the
// backends this node decides are its decisions.
func (n *Node) SetChanges(f func() map[agent.Key]agent.Change) { n.changes.Store(&f) }

// Run sends state and counts every Sync, and joins or rejoins the join
// list, until ctx ends; then it leaves the fleet, so that the others
// take over its backends at once.
func (n *Node) Run(ctx context.Context) error {
	n.done.Add(1)
	defer n.done.Done()
	n.done.Add(1)
	go n.joinLoop(ctx)
	t := time.NewTicker(n.cfg.Sync)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-n.stop:
			return nil
		case <-t.C:
			n.sync()
		}
	}
}

// joinLoop joins the join list at the start and, every few seconds,
// whichever of it is not a member: memberlist forgets a peer it declared
// dead, so a healed partition or a restarted peer needs asking again.
func (n *Node) joinLoop(ctx context.Context) {
	defer n.done.Done()
	if len(n.cfg.Join) == 0 {
		return
	}
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		if missing := n.missingSeeds(); len(missing) > 0 {
			if joined, err := n.ml.Join(missing); err != nil {
				n.counters.JoinErrors.Add(1)
				n.log.Debug().Err(err).Strs("peers", missing).Int("joined", joined).Msg("fleet: cannot reach some peers yet")
			} else {
				n.log.Info().Strs("peers", missing).Msg("fleet: joined")
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-n.stop:
			return
		case <-t.C:
		}
	}
}

// missingSeeds are the join list's addresses no live member has.
func (n *Node) missingSeeds() []string {
	have := map[string]bool{}
	for _, m := range n.ml.Members() {
		have[m.Address()] = true
	}
	var out []string
	for _, s := range n.cfg.Join {
		addr := s
		if a, err := net.ResolveUDPAddr("udp", s); err == nil {
			addr = a.String()
		}
		if !have[addr] && addr != n.Addr() {
			out = append(out, s)
		}
	}
	return out
}

// Close leaves the fleet (peers see it go at once, not after a timeout)
// and stops memberlist. It is safe to call more than once.
func (n *Node) Close() {
	n.closed.Do(func() {
		close(n.stop)
		if err := n.ml.Leave(time.Second); err != nil {
			n.log.Debug().Err(err).Msg("fleet: leave")
		}
		n.sends.Wait()
		_ = n.ml.Shutdown()
		n.done.Wait()
	})
}

// sync sends this node's state to every member, and its windows' gains
// to each backend's decider and next in line.
func (n *Node) sync() {
	now := n.now()
	members := map[string]*memberlist.Node{}
	for _, m := range n.ml.Members() {
		if m.Name != n.name {
			members[m.Name] = m
		}
	}
	n.mu.Lock()
	pic := n.picture(now)
	backends := append([]string(nil), n.backends...)
	view := map[string]BackendStatus{}
	for _, v := range n.view {
		view[v.Backend] = v
	}
	n.mu.Unlock()

	st := stateMsg{header: n.header(kindState)}
	var changes map[agent.Key]agent.Change
	if f := n.changes.Load(); f != nil && !pic.alone() {
		changes = (*f)()
	}
	for _, b := range backends {
		if d, _ := pic.decider(b); !pic.alone() && d == n.name {
			d := Decision{Backend: b, Held: held(changes, b)}
			if v, ok := view[b]; ok {
				d.PooledRequests, d.PooledErr5xx = v.Pooled.Requests, v.Pooled.Err5xx
			}
			st.Decisions = append(st.Decisions, d)
		}
	}
	state := encodeState(st)
	for _, m := range members {
		n.send(m, state)
	}

	// The exporter runs even alone, so that a peer that comes back gets
	// what is new, not a backlog.
	deltas := n.exporter.Deltas()
	if pic.alone() {
		return
	}
	byDest := map[string][]window.Delta{}
	receivers := map[string][]string{} // by backend: deltas come sorted, many per backend
	for _, d := range deltas {
		r, ok := receivers[d.Backend]
		if !ok {
			r = pic.receivers(d.Backend)
			receivers[d.Backend] = r
		}
		for _, dest := range r {
			if dest != n.name {
				byDest[dest] = append(byDest[dest], d)
			}
		}
	}
	for dest, ds := range byDest {
		m := members[dest]
		if m == nil {
			continue // in the picture, but memberlist no longer lists it
		}
		for _, msg := range encodeCounts(n.header(kindCounts), ds, n.limit, n.nextSeq) {
			n.send(m, msg)
		}
	}
}

func (n *Node) nextSeq() uint64 { return n.seq.Add(1) }

func (n *Node) header(kind byte) header {
	return header{Kind: kind, Sender: n.name, Incarnation: n.incarnation, Seq: n.nextSeq()}
}

// held is this node's decision for backend: the changes its ledger holds
// there.
func held(changes map[agent.Key]agent.Change, backend string) []Held {
	var out []Held
	for k, c := range changes {
		if k.Backend == backend {
			out = append(out, Held{Server: k.Server, Phase: c.Phase, Weight: c.Weight, Reason: c.Reason})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Server < out[j].Server })
	return out
}

// send sends one message: in one UDP packet when it fits, else over TCP
// in the background (bounded), so that a peer that does not answer never
// holds up the sync.
func (n *Node) send(to *memberlist.Node, msg []byte) {
	n.counters.Sent.Add(1)
	n.counters.BytesSent.Add(uint64(len(msg)))
	if len(msg) <= n.limit {
		if err := n.ml.SendBestEffort(to, msg); err != nil {
			n.counters.SendErrors.Add(1)
		}
		return
	}
	select {
	case n.sendSem <- struct{}{}:
	default:
		n.counters.SendErrors.Add(1) // eight already on their way
		return
	}
	n.sends.Add(1)
	go func() {
		defer n.sends.Done()
		defer func() { <-n.sendSem }()
		if err := n.ml.SendReliable(to, msg); err != nil {
			n.counters.SendErrors.Add(1)
		}
	}()
}

// receive takes one message from a peer. memberlist has checked that it
// was sealed with the fleet's key; its shape is checked here.
func (n *Node) receive(b []byte) {
	n.counters.Received.Add(1)
	n.counters.BytesReceived.Add(uint64(len(b)))
	msg, err := decode(b)
	if err != nil {
		n.counters.Rejected.Add(1)
		n.log.Debug().Err(err).Msg("fleet: message refused")
		return
	}
	var h header
	switch m := msg.(type) {
	case *stateMsg:
		h = m.header
	case *countsMsg:
		h = m.header
	}
	if h.Sender == n.name {
		n.counters.Rejected.Add(1)
		n.log.Warn().Str("sender", h.Sender).Msg("fleet: a message claims this node's own name: two nodes share a fleet-name")
		return
	}
	now := n.now()
	n.mu.Lock()
	p := n.peers[h.Sender]
	if p == nil {
		p = &peer{}
		n.peers[h.Sender] = p
	}
	ok, stale := p.accept(h)
	if !ok {
		n.mu.Unlock()
		if stale {
			n.counters.Stale.Add(1)
		} else {
			n.counters.Duplicates.Add(1)
		}
		return
	}
	p.lastHeard, n.lastHeard = now, now
	if m, isState := msg.(*stateMsg); isState && m.Seq > p.stateSeq {
		p.stateSeq = m.Seq
		p.decisions = make(map[string]Decision, len(m.Decisions))
		for _, d := range m.Decisions {
			p.decisions[d.Backend] = d
		}
	}
	n.mu.Unlock()
	if m, ok := msg.(*countsMsg); ok {
		for _, d := range m.Deltas {
			for _, s := range d.Seconds {
				if err := n.remote.Add(d.Backend, d.Server, s); err != nil {
					n.counters.CountsRefused.Add(1)
					n.log.Debug().Err(err).Str("sender", h.Sender).Msg("fleet: counts refused")
					continue
				}
				n.counters.CountsAdded.Add(1)
			}
		}
	}
}

// forget drops a peer that left or was declared dead: its backends pass
// to the next in line at the next step, not after Timeout.
func (n *Node) forget(name string) {
	n.mu.Lock()
	delete(n.peers, name)
	n.mu.Unlock()
}

type delegate struct{ n *Node }

func (delegate) NodeMeta(int) []byte                 { return nil }
func (d delegate) NotifyMsg(b []byte)                { d.n.receive(b) }
func (delegate) GetBroadcasts(int, int) [][]byte     { return nil }
func (delegate) LocalState(bool) []byte              { return nil }
func (delegate) MergeRemoteState(buf []byte, _ bool) {}

type events struct{ n *Node }

func (e events) NotifyJoin(m *memberlist.Node) {
	e.n.log.Info().Str("member", m.Name).Str("addr", m.Address()).Msg("fleet: member joined")
}

func (e events) NotifyLeave(m *memberlist.Node) {
	if m.Name == e.n.name {
		return
	}
	e.n.log.Warn().Str("member", m.Name).Str("addr", m.Address()).Msg("fleet: member left or failed")
	e.n.forget(m.Name)
}

func (events) NotifyUpdate(*memberlist.Node) {}

// logWriter turns memberlist's log lines ("[WARN] memberlist: ...")
// into zerolog events at their level.
type logWriter struct{ log zerolog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	ev := w.log.Debug()
	switch {
	case strings.HasPrefix(line, "[ERR]"):
		ev = w.log.Warn()
	case strings.HasPrefix(line, "[WARN]"):
		ev = w.log.Info()
	}
	ev.Str("component", "memberlist").Msg(line)
	return len(p), nil
}

var _ io.Writer = logWriter{}
