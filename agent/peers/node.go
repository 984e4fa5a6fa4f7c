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
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/window"
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
	tr          *transport
	sealer      *sealer
	tcpTimeout  time.Duration
	incarnation uint64
	started     time.Time
	seq         atomic.Uint64
	limit       int // a message's size that still fits one UDP packet, sealed

	// changes is the loop's ledger, read at each sync for the decisions
	// of the backends this agent decides.
	changes atomic.Pointer[func() map[agent.Key]agent.Change]

	// mu guards what follows. Nothing holding it may call memberlist:
	// memberlist calls the events (learn, forget), which take it, while
	// holding its own lock, so the other order would deadlock (fleet-sim
	// met it at 50 nodes: Status read memberlist's address under mu).
	mu        sync.Mutex
	peers     map[string]*peer
	members   map[string]member // memberlist's members, as its events said
	backends  []string          // the backends this agent's HAProxy serves, at its last step
	view      []BackendStatus
	lastHeard time.Time
	logged    map[string]time.Time // the last refusal logged, by sender and reason

	counters Counters
	inbox    chan inbound
	sends    sync.WaitGroup // reliable sends of oversized messages
	sendSem  chan struct{}
	stop     chan struct{}
	done     sync.WaitGroup
	closed   sync.Once
}

// inbound is a message out of its envelope, with where it came from.
type inbound struct {
	msg    []byte
	from   netip.AddrPort
	stream bool
}

// member is what memberlist says of a member: where it is, and which
// process of its name (the incarnation in its meta; 0 when its meta has
// none this agent can take).
type member struct {
	addr        netip.AddrPort
	incarnation uint64
}

// Counters are the fleet's traffic, for /metrics and /status.
type Counters struct {
	Sent, Received, BytesSent, BytesReceived atomic.Uint64
	// Rejected: messages that failed to parse, or claimed this agent's
	// own name; Duplicates: a sequence number seen before; Stale: sent
	// longer ago than the freshness window, or by a process of the
	// sender's name other than the one memberlist lists; Forged: under a
	// name memberlist does not list, or not from its member's address;
	// Future: sent ahead of this clock by more than MaxClockSkew, or
	// before its own process started.
	Rejected, Duplicates, Stale, Forged, Future atomic.Uint64
	SendErrors, JoinErrors                      atomic.Uint64
	CountsAdded, CountsRefused                  atomic.Uint64
	// The port's own: envelopes not sealed with the key, messages
	// dropped with the inbox full, streams refused at their length,
	// streams closed at a cap (see MaxStreams), and state messages cut
	// to MaxMessage.
	Unsealed, InboxDropped, StreamsRefused, StreamsEvicted, StateCut atomic.Uint64
}

// peer is what this agent knows of another.
type peer struct {
	incarnation uint64
	seen        map[uint64]int64 // sequence numbers within the freshness window, with their time of sending
	lastHeard   time.Time
	stateSent   uint64 // the time of sending of the state its decisions came from,
	stateSeq    uint64 // and its sequence number
	decisions   map[string]Decision
}

// later reports whether a state message is later than the one p's
// decisions came from: sent later, or at the same time (a coarse clock)
// with a later sequence number.
func (p *peer) later(h header) bool {
	return h.Sent > p.stateSent || (h.Sent == p.stateSent && h.Seq > p.stateSeq)
}

// Freshness. A message sent longer ago than FreshSyncs syncs plus
// MaxClockSkew, by the receiver's clock, is refused, as is one sent more
// than MaxClockSkew ahead of it: a message sniffed and replayed later is
// refused by every receiver, however recently it started, and no
// sequence number can shut a sender out, since only the window's own are
// remembered. The nodes' clocks must agree within MaxClockSkew.
const (
	FreshSyncs   = 4
	MaxClockSkew = 2 * time.Second
	// maxSeen bounds the sequence numbers remembered per peer: its
	// state and counts messages over the freshness window, many times
	// over.
	maxSeen = 8192
	// refusalLogEvery spaces the log lines of one sender's refusals of
	// one kind: a liar cannot flood the log.
	refusalLogEvery = 10 * time.Second
)

// fresh is the freshness window at this node's sync period.
func (n *Node) fresh() time.Duration { return FreshSyncs*n.cfg.Sync + MaxClockSkew }

// refusal is why a message was refused; "" is accepted.
type refusal string

const (
	accepted  refusal = ""
	ownName   refusal = "it claims this node's own name: two nodes share a fleet-name, or one lies"
	notMember refusal = "memberlist lists no member of that name"
	wrongAddr refusal = "it did not come from the address memberlist lists for that name"
	noInc     refusal = "memberlist lists that name with no incarnation this agent can take (an agent of fleet wire version 1?)"
	otherInc  refusal = "it is from another process of that name than the one memberlist lists"
	tooOld    refusal = "it was sent longer ago than the freshness window allows (a replay, or a clock behind)"
	tooNew    refusal = "it was sent ahead of this clock by more than the skew allowed (a clock ahead, or a lie)"
	early     refusal = "it was sent before its own process started (a lie)"
	duplicate refusal = "its sequence number was seen before"
)

// admit checks a message's header against the member memberlist lists
// under its sender's name, against the clock, and against the sender's
// window of sequence numbers. Accepted, the sender is heard now.
// Callers hold n.mu.
func (n *Node) admit(h header, from netip.AddrPort, stream bool, now time.Time) refusal {
	if h.Sender == n.name {
		return ownName
	}
	m, ok := n.members[h.Sender]
	switch {
	case !ok:
		return notMember
	case from.Addr() != m.addr.Addr() || (!stream && from.Port() != m.addr.Port()):
		// Over UDP memberlist sends from its bound port; over TCP the
		// source port is the kernel's, so only the address counts.
		return wrongAddr
	case m.incarnation == 0:
		return noInc
	case h.Incarnation != m.incarnation:
		return otherInc
	}
	nowNs := now.UnixNano()
	switch {
	case h.Sent > uint64(nowNs+int64(MaxClockSkew)):
		return tooNew
	case h.Sent < uint64(max(nowNs-int64(n.fresh()), 0)):
		return tooOld
	case h.Sent < h.Incarnation:
		return early
	}
	p := n.peers[h.Sender]
	if p == nil || p.incarnation != h.Incarnation {
		p = &peer{incarnation: h.Incarnation, seen: map[uint64]int64{}}
		n.peers[h.Sender] = p
	}
	if _, seen := p.seen[h.Seq]; seen {
		return duplicate
	}
	if len(p.seen) >= maxSeen {
		// What the clock refuses needs no remembering.
		oldest := nowNs - int64(n.fresh())
		for seq, at := range p.seen {
			if at < oldest {
				delete(p.seen, seq)
			}
		}
		if len(p.seen) >= maxSeen { // a flood within the window: start over
			clear(p.seen)
		}
	}
	p.seen[h.Seq] = int64(h.Sent)
	p.lastHeard, n.lastHeard = now, now
	return accepted
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
		remote: window.New(p.Local.Span(), p.MaxSeries, p.Now), peers: map[string]*peer{}, members: map[string]member{},
		logged: map[string]time.Time{}, started: p.Now(), inbox: make(chan inbound, inboxSize),
		sendSem: make(chan struct{}, 8), stop: make(chan struct{})}
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
	if n.sealer, err = newSealer(p.Key, mc.EnableCompression); err != nil {
		return nil, err
	}
	// Room for the envelope (envelopeOverhead) in one packet.
	n.limit = mc.UDPBufferSize - 64
	n.tcpTimeout = mc.TCPTimeout
	inner := mc.Transport
	if inner == nil {
		// What memberlist.Create would make, made here to be wrapped.
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{mc.BindAddr}, BindPort: mc.BindPort, Logger: mc.Logger})
		if err != nil {
			return nil, fmt.Errorf("fleet: listen on %s: %w", p.Bind, err)
		}
		if mc.BindPort == 0 {
			mc.BindPort = nt.GetAutoBindPort()
			mc.AdvertisePort = mc.BindPort
		}
		inner = nt
	}
	// A stream lives at most two of memberlist's TCP timeouts from its
	// accept: a push-pull reads the peer's state, then writes its own.
	n.tr = newTransport(inner, 2*mc.TCPTimeout, &n.counters, p.Log, n.deliver)
	mc.Transport = n.tr
	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = n.tr.Shutdown()
		return nil, fmt.Errorf("fleet: start memberlist on %s: %w", p.Bind, err)
	}
	n.ml = ml
	n.done.Add(1)
	go n.readInbox()
	return n, nil
}

// inboxSize bounds the messages out of their envelopes that wait for
// receive: packets of a few KiB, a rare stream of at most MaxMessage.
const inboxSize = 256

// deliver opens an envelope the transport took, and queues its message.
// It runs on the transport's packet pump, or on a stream's goroutine,
// and never waits: memberlist's pings pass through the same pump.
func (n *Node) deliver(env []byte, from netip.AddrPort, stream bool) {
	msg, err := n.sealer.open(env)
	if err != nil {
		if n.counters.Unsealed.Add(1)%100 == 1 {
			n.log.Debug().Err(err).Str("from", from.String()).Msg("fleet: envelope refused (logged once, then every hundredth)")
		}
		return
	}
	select {
	case n.inbox <- inbound{msg: msg, from: from, stream: stream}:
	default:
		n.counters.InboxDropped.Add(1)
	}
}

// readInbox hands each queued message to receive, until Close.
func (n *Node) readInbox() {
	defer n.done.Done()
	for {
		select {
		case <-n.stop:
			return
		case m := <-n.inbox:
			n.receive(m.msg, m.from, m.stream)
		}
	}
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

// addresses are the live members' addresses but this node's, from the
// copies learn made while memberlist held its lock: the *memberlist.Node
// values Members returns are memberlist's own, which it rewrites in place
// when a member's address or incarnation changes, so reading them later
// races with it. n.mu must be held.
func (n *Node) addresses() map[string]memberlist.Address {
	out := make(map[string]memberlist.Address, len(n.members))
	for name, m := range n.members {
		out[name] = memberlist.Address{Addr: m.addr.String(), Name: name}
	}
	return out
}

// missingSeeds are the join list's addresses no live member has.
func (n *Node) missingSeeds() []string {
	have := map[string]bool{}
	n.mu.Lock()
	for _, a := range n.addresses() {
		have[a.Addr] = true
	}
	n.mu.Unlock()
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
	n.mu.Lock()
	members := n.addresses()
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
	state, left := encodeState(st)
	if left > 0 && n.counters.StateCut.Add(1)%100 == 1 {
		n.log.Warn().Int("left_out", left).Int("limit", MaxMessage).Msg("fleet: this node's decisions exceed one message: the backends left out are decided by their followers meanwhile (logged once, then every hundredth)")
	}
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
		m, ok := members[dest]
		if !ok {
			continue // in the picture, but memberlist no longer lists it
		}
		for _, msg := range encodeCounts(n.header(kindCounts), ds, n.limit, n.nextSeq) {
			n.send(m, msg)
		}
	}
}

func (n *Node) nextSeq() uint64 { return n.seq.Add(1) }

func (n *Node) header(kind byte) header {
	return header{Kind: kind, Sender: n.name, Incarnation: n.incarnation, Sent: uint64(n.now().UnixNano()), Seq: n.nextSeq()}
}

// held is this node's decision for backend: the changes its ledger holds
// there.
func held(changes map[agent.Key]agent.Change, backend string) []Held {
	var out []Held
	for k, c := range changes {
		if k.Backend == backend {
			out = append(out, Held{Server: k.Server, Phase: c.Phase, Weight: c.Weight, Reason: c.Reason, ErrorRate: c.ErrorRate})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Server < out[j].Server })
	return out
}

// send seals one message and sends it: in one UDP packet when it fits,
// else over TCP in the background (bounded), so that a peer that does
// not answer never holds up the sync.
func (n *Node) send(addr memberlist.Address, msg []byte) {
	n.counters.Sent.Add(1)
	n.counters.BytesSent.Add(uint64(len(msg)))
	env := n.sealer.seal(msg)
	if len(msg) <= n.limit {
		if err := n.tr.sendPacket(addr, env); err != nil {
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
		if err := n.tr.sendEnvelope(addr, env, n.tcpTimeout); err != nil {
			n.counters.SendErrors.Add(1)
		}
	}()
}

// receive takes one message out of its envelope (so from a holder of the
// key), from. Its shape is checked by decode, its sender and freshness
// by admit.
func (n *Node) receive(b []byte, from netip.AddrPort, stream bool) {
	n.counters.Received.Add(1)
	n.counters.BytesReceived.Add(uint64(len(b)))
	msg, err := decode(b)
	if err != nil {
		n.counters.Rejected.Add(1)
		n.log.Debug().Err(err).Str("from", from.String()).Msg("fleet: message refused")
		return
	}
	var h header
	switch m := msg.(type) {
	case *stateMsg:
		h = m.header
	case *countsMsg:
		h = m.header
	}
	now := n.now()
	n.mu.Lock()
	why := n.admit(h, from, stream, now)
	if why != accepted {
		n.refused(h, from, why, now)
		n.mu.Unlock()
		return
	}
	if m, isState := msg.(*stateMsg); isState && n.peers[h.Sender].later(m.header) {
		// Only a later word replaces the one held: a state delayed on
		// its way (over TCP, say) changes nothing.
		p := n.peers[h.Sender]
		p.stateSent, p.stateSeq = m.Sent, m.Seq
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

// refused counts a refusal, and logs it, each sender's of each kind at
// most once every refusalLogEvery: a duplicate at debug (UDP makes them);
// what a join, a restart or a slow network also makes (a name memberlist
// does not list yet, a process it no longer lists, a message late) at
// info; what only a lie or a clock set wrong makes as a warning.
// Callers hold n.mu.
func (n *Node) refused(h header, from netip.AddrPort, why refusal, now time.Time) {
	lvl := zerolog.WarnLevel
	switch why {
	case duplicate:
		n.counters.Duplicates.Add(1)
		lvl = zerolog.DebugLevel
	case tooOld, otherInc:
		n.counters.Stale.Add(1)
		lvl = zerolog.InfoLevel
	case tooNew, early:
		n.counters.Future.Add(1)
	case notMember:
		n.counters.Forged.Add(1)
		lvl = zerolog.InfoLevel
	case wrongAddr, noInc:
		n.counters.Forged.Add(1)
	default:
		n.counters.Rejected.Add(1)
	}
	key := h.Sender + "\x00" + string(why)
	if now.Sub(n.logged[key]) < refusalLogEvery {
		return
	}
	if len(n.logged) > 1024 { // names a liar makes up, forgotten
		clear(n.logged)
	}
	n.logged[key] = now
	ev := n.log.WithLevel(lvl).Str("sender", h.Sender).Str("from", from.String()).Str("reason", string(why)).
		Time("sent", time.Unix(0, int64(min(h.Sent, 1<<63-1)))).Uint64("incarnation", h.Incarnation)
	if m, ok := n.members[h.Sender]; ok {
		ev = ev.Str("member_addr", m.addr.String()).Uint64("member_incarnation", m.incarnation)
	}
	ev.Msg("fleet: message refused")
}

// learn records what memberlist says of a member: its address, and the
// incarnation in its meta, which must be a time this clock has reached.
func (n *Node) learn(m *memberlist.Node) {
	if m.Name == n.name {
		return
	}
	ip, _ := netip.AddrFromSlice(m.Addr)
	mem := member{addr: netip.AddrPortFrom(ip.Unmap(), m.Port)}
	inc, err := decodeMeta(m.Meta)
	switch {
	case err != nil:
		n.log.Warn().Err(err).Str("member", m.Name).Msg("fleet: a member without a valid incarnation in its meta: its messages are refused")
	case inc > uint64(n.now().Add(MaxClockSkew).UnixNano()):
		n.log.Warn().Str("member", m.Name).Time("claimed_start", time.Unix(0, int64(min(inc, 1<<63-1)))).
			Msg("fleet: a member claims a start ahead of this clock: its messages are refused")
	default:
		mem.incarnation = inc
	}
	n.mu.Lock()
	n.members[m.Name] = mem
	n.mu.Unlock()
}

// forget drops a member that left or was declared dead: its backends
// pass to the next in line at the next step, not after Timeout.
func (n *Node) forget(name string) {
	n.mu.Lock()
	delete(n.peers, name)
	delete(n.members, name)
	n.mu.Unlock()
}

type delegate struct{ n *Node }

// NodeMeta is this node's incarnation, for every member to tie this
// node's name to this process (see admit).
func (d delegate) NodeMeta(int) []byte { return encodeMeta(d.n.incarnation) }

// NotifyMsg is a memberlist user message: hapilot sends none since
// version 2 of its wire, so one is an agent of version 1, or a stranger.
func (d delegate) NotifyMsg([]byte) {
	if d.n.counters.Rejected.Add(1)%100 == 1 {
		d.n.log.Warn().Msg("fleet: a memberlist user message, refused: an agent of fleet wire version 1 is in the fleet (every agent must run the same version), or a holder of the key sends them")
	}
}
func (delegate) GetBroadcasts(int, int) [][]byte     { return nil }
func (delegate) LocalState(bool) []byte              { return nil }
func (delegate) MergeRemoteState(buf []byte, _ bool) {}

type events struct{ n *Node }

func (e events) NotifyJoin(m *memberlist.Node) {
	e.n.learn(m)
	if m.Name != e.n.name {
		e.n.log.Info().Str("member", m.Name).Str("addr", m.Address()).Msg("fleet: member joined")
	}
}

func (e events) NotifyLeave(m *memberlist.Node) {
	if m.Name == e.n.name {
		return
	}
	e.n.log.Warn().Str("member", m.Name).Str("addr", m.Address()).Msg("fleet: member left or failed")
	e.n.forget(m.Name)
}

// NotifyUpdate is a member's new meta or address: a restarted process
// of its name, say.
func (e events) NotifyUpdate(m *memberlist.Node) { e.n.learn(m) }

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
