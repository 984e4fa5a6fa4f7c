// Package fleetsim runs a fleet of agents in one process, with no
// HAProxy: every node is the real agent (its control loop, the rules, its
// guardrails, fleet mode over memberlist with its encryption, on
// memberlist's own in-memory network), in front of an in-memory runtime socket (fakes.Runtime)
// and fed counts straight into its windows. It measures what fleet mode
// costs and how fast it converges at sizes no lab of HAProxy processes
// reaches on one machine: how long the members take to see each other,
// the bytes each node sends per second, the time from a fault to every
// node draining the server, and the time a node started late takes to
// catch up with the fleet's word.
package fleetsim

import (
	"context"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/agent/peers"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// Setup sizes a simulation.
type Setup struct {
	Nodes    int
	Backends int
	Servers  int // per backend
	// Rate is requests per second each node sends each server.
	Rate     float64
	Interval time.Duration // the loop's; default 10 s, the agent's, with the evidence check every 1 s
	Window   time.Duration // the windows' span; default 10 s
	// Steady is how long traffic is measured before the fault.
	Steady time.Duration
	Log    zerolog.Logger
	// NodeLog receives every node's fleet log (memberlist's included).
	NodeLog zerolog.Logger
	// Tune adjusts memberlist's settings (nil: its LAN defaults, as the
	// agent runs).
	Tune func(*memberlist.Config)
}

// Result is what a run measured.
type Result struct {
	Setup
	Formed        time.Duration // until every node had every other in its picture
	BytesPerNode  float64       // per second, everything memberlist wrote (gossip, probes, ours; compressed if on, encrypted)
	FleetPerNode  float64       // per second, hapilot's own messages, plaintext
	MaxBytesNode  float64       // the busiest node's
	Decided       time.Duration // from the fault to the decider's drain
	Converged     time.Duration // from the fault to every node's drain
	CaughtUp      time.Duration // from a late node's start to its drain of the faulty server
	LateInPicture time.Duration // from its start until every node had it in its picture
	Faulty        string
	Decider       string
}

// simNode is one agent.
type simNode struct {
	name    string
	node    *peers.Node
	loop    *loop.Loop
	rt      *fakes.Runtime
	store   *window.Store
	tr      *counting
	cancel  context.CancelFunc
	stopped chan struct{}
}

// Run runs a simulation until it has measured everything, or ctx ends.
func Run(ctx context.Context, s Setup) (*Result, error) {
	if s.Interval == 0 {
		s.Interval = 10 * time.Second // the agent's default, with its evidence check every second
	}
	if s.Window == 0 {
		s.Window = 10 * time.Second
	}
	if s.Steady == 0 {
		s.Steady = 10 * time.Second
	}
	res := &Result{Setup: s}
	key := make([]byte, 32)
	for i := range key {
		key[i] = byte(i * 7)
	}
	var states []haproxy.ServerState
	for b := 0; b < s.Backends; b++ {
		for i := 0; i < s.Servers; i++ {
			states = append(states, haproxy.ServerState{Backend: backendName(b), Server: fmt.Sprintf("srv%d", i+1), OpState: haproxy.OpRunning, Weight: 100, Initial: 100})
		}
	}
	// memberlist's in-memory network; every transport is made before any
	// node starts, since MockNetwork's maps are not safe to grow while
	// others read them.
	var mock memberlist.MockNetwork
	transports := make([]*counting, s.Nodes+1)
	for i := range transports {
		transports[i] = newCounting(mock.NewTransport(nodeName(i)))
	}
	var nodes []*simNode
	defer func() {
		var wg sync.WaitGroup
		for _, n := range nodes {
			wg.Add(1)
			go func() { defer wg.Done(); n.stop() }()
		}
		wg.Wait()
	}()
	start := time.Now()
	var seed string
	for i := 0; i < s.Nodes; i++ {
		n, err := startNode(ctx, s, nodeName(i), key, seed, states, transports[i])
		if err != nil {
			return nil, err
		}
		if seed == "" {
			seed = n.node.Addr()
		}
		nodes = append(nodes, n)
	}
	var traffic trafficGen
	traffic.set(nodes)
	tctx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	go traffic.run(tctx, s)

	// 1. The fleet forms: every node sees every other. Every node's
	// status costs, so look twice a second, and say how far it got.
	lastLog := time.Now()
	if err := waitEvery(ctx, 2*time.Minute, 500*time.Millisecond, func() bool {
		if time.Since(lastLog) > 5*time.Second {
			lastLog = time.Now()
			smallest, dropped := len(nodes), uint64(0)
			for _, n := range nodes {
				smallest = min(smallest, inPicture(n))
				dropped += n.tr.dropped.Load()
			}
			s.Log.Info().Int("smallest_picture", smallest).Uint64("packets_dropped", dropped).Msg("forming")
		}
		return allSee(nodes, nodes)
	}); err != nil {
		return nil, fmt.Errorf("fleet never formed: %w", err)
	}
	res.Formed = time.Since(start)
	s.Log.Info().Dur("formed", res.Formed).Msg("fleet formed")

	// 2. Steady traffic: bytes per node per second.
	sent0, fleet0 := bytesSent(nodes)
	time.Sleep(s.Steady)
	sent1, fleet1 := bytesSent(nodes)
	secs := s.Steady.Seconds()
	var total, fl, maxNode float64
	for i := range nodes {
		d := float64(sent1[i] - sent0[i])
		total += d
		fl += float64(fleet1[i] - fleet0[i])
		maxNode = max(maxNode, d/secs)
	}
	res.BytesPerNode, res.FleetPerNode, res.MaxBytesNode = total/secs/float64(len(nodes)), fl/secs/float64(len(nodes)), maxNode

	// 3. A fault: one server fails 5% on every node's traffic.
	b := s.Backends / 2
	res.Faulty = agent.Key{Backend: backendName(b), Server: "srv3"}.String()
	faultAt := time.Now()
	traffic.fail(res.Faulty, 0.05)
	var decider *simNode
	if err := waitFor(ctx, time.Minute, func() bool {
		for _, n := range nodes {
			if drained(n, res.Faulty) {
				if decider == nil {
					decider, res.Decided = n, time.Since(faultAt)
				}
			}
		}
		return decider != nil
	}); err != nil {
		return nil, fmt.Errorf("the faulty server was never drained: %w", err)
	}
	res.Decider = decider.name
	if err := waitFor(ctx, time.Minute, func() bool {
		for _, n := range nodes {
			if !drained(n, res.Faulty) {
				return false
			}
		}
		return true
	}); err != nil {
		return nil, fmt.Errorf("not every node drained %s: %w", res.Faulty, err)
	}
	res.Converged = time.Since(faultAt)

	// 4. A node started late catches up with the fleet's word.
	lateAt := time.Now()
	late, err := startNode(ctx, s, nodeName(s.Nodes), key, seed, states, transports[s.Nodes])
	if err != nil {
		return nil, err
	}
	nodes = append(nodes, late)
	traffic.set(nodes)
	if err := waitFor(ctx, time.Minute, func() bool { return drained(late, res.Faulty) }); err != nil {
		return nil, fmt.Errorf("the late node never drained %s: %w", res.Faulty, err)
	}
	res.CaughtUp = time.Since(lateAt)
	if err := waitFor(ctx, time.Minute, func() bool { return allSee(nodes, []*simNode{late}) }); err != nil {
		return nil, fmt.Errorf("the late node never joined every picture: %w", err)
	}
	res.LateInPicture = time.Since(lateAt)
	return res, nil
}

func backendName(b int) string { return fmt.Sprintf("b%03d", b) }

func nodeName(i int) string { return fmt.Sprintf("node%03d", i+1) }

func startNode(ctx context.Context, s Setup, name string, key []byte, seed string, states []haproxy.ServerState, tr *counting) (*simNode, error) {
	store := window.New(s.Window, s.Backends*s.Servers+16, nil)
	cfg := peers.DefaultConfig()
	cfg.Bind, cfg.Name = "127.0.0.1:0", name
	if seed != "" {
		cfg.Join = []string{seed}
	}
	node, err := peers.Start(peers.Params{Config: cfg, Key: key, Local: store, MaxSeries: s.Backends*s.Servers + 16,
		Tune: func(c *memberlist.Config) {
			c.Transport = tr
			if s.Tune != nil {
				s.Tune(c)
			}
		}, Log: s.NodeLog})
	if err != nil {
		return nil, err
	}
	rt := fakes.WithStates(name, states)
	loop := &loop.Loop{Clock: agent.RealClock{}, Settings: agent.Settings{Interval: s.Interval, EvidenceCheck: time.Second}, Policy: peers.Wrap(rules.NewPolicy(rules.DefaultConfig()), node),
		Guard: guard.DefaultGuardrails(), Runtimes: []agent.Runtime{rt}, Windows: store, Log: zerolog.Nop()}
	node.SetChanges(loop.View().Ledger)
	nctx, cancel := context.WithCancel(ctx)
	n := &simNode{name: name, node: node, loop: loop, rt: rt, store: store, tr: tr, cancel: cancel, stopped: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = node.Run(nctx) }()
	go func() { defer wg.Done(); _ = loop.Run(nctx) }()
	go func() { wg.Wait(); close(n.stopped) }()
	return n, nil
}

func (n *simNode) stop() {
	n.cancel()
	<-n.stopped
	n.node.Close()
}

func drained(n *simNode, key string) bool {
	states, _ := n.rt.ShowServersState(context.Background())
	for _, st := range states {
		if (agent.Key{Backend: st.Backend, Server: st.Server}).String() == key {
			return st.Drain()
		}
	}
	return false
}

// allSee reports whether every node of among has every node of want in
// its picture.
func allSee(among, want []*simNode) bool {
	for _, n := range among {
		in := map[string]bool{}
		for _, m := range n.node.Status().Members {
			if m.InPicture {
				in[m.Name] = true
			}
		}
		for _, w := range want {
			if !in[w.name] {
				return false
			}
		}
	}
	return true
}

func bytesSent(nodes []*simNode) (wire, ours []uint64) {
	for _, n := range nodes {
		wire = append(wire, n.tr.sent.Load())
		ours = append(ours, n.node.Status().Traffic["bytes_sent"])
	}
	return wire, ours
}

func inPicture(n *simNode) int {
	in := 0
	for _, m := range n.node.Status().Members {
		if m.InPicture {
			in++
		}
	}
	return in
}

func waitFor(ctx context.Context, within time.Duration, ok func() bool) error {
	return waitEvery(ctx, within, 50*time.Millisecond, ok)
}

func waitEvery(ctx context.Context, within, every time.Duration, ok func() bool) error {
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
	return nil
}

// trafficGen records each node's traffic four times a second (as often
// as the fleet syncs, so that every sync has gains to ship), straight
// into its windows: Rate answers per server per second, 5xx at the
// failing servers' rate, none to a server the node has drained. Counts
// below one are carried to the next tick, so small rates add up.
type trafficGen struct {
	mu      sync.Mutex
	nodes   []*simNode
	failing map[string]float64
	owed    map[*simNode]map[agent.Key]*[2]float64 // answers, errors carried over
}

const ticksPerSecond = 4

func (g *trafficGen) set(nodes []*simNode) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.nodes = append([]*simNode(nil), nodes...)
}

func (g *trafficGen) fail(key string, rate float64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failing == nil {
		g.failing = map[string]float64{}
	}
	g.failing[key] = rate
}

func (g *trafficGen) run(ctx context.Context, s Setup) {
	t := time.NewTicker(time.Second / ticksPerSecond)
	defer t.Stop()
	g.owed = map[*simNode]map[agent.Key]*[2]float64{}
	for {
		g.mu.Lock()
		nodes, failing := g.nodes, g.failing
		for j, n := range nodes {
			owed := g.owed[n]
			if owed == nil {
				owed = map[agent.Key]*[2]float64{}
				g.owed[n] = owed
			}
			states, _ := n.rt.ShowServersState(ctx)
			for _, st := range states {
				if st.Drain() {
					continue
				}
				k := agent.Key{Backend: st.Backend, Server: st.Server}
				o := owed[k]
				if o == nil {
					// nodes start at different phases of the same rate
					o = &[2]float64{float64(j%ticksPerSecond) / ticksPerSecond, float64(j%20) / 20}
					owed[k] = o
				}
				perTick := s.Rate / ticksPerSecond
				o[0] += perTick * (1 - failing[k.String()])
				o[1] += perTick * failing[k.String()]
				ok, errs := int(o[0]), int(o[1])
				o[0] -= float64(ok)
				o[1] -= float64(errs)
				if errs > 0 {
					n.store.Record(window.Event{Backend: []byte(st.Backend), Server: []byte(st.Server), Status: 500, ResponseMs: 10, Count: errs})
				}
				if ok > 0 {
					n.store.Record(window.Event{Backend: []byte(st.Backend), Server: []byte(st.Server), Status: 200, ResponseMs: 10, Count: ok})
				}
			}
		}
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// counting is memberlist's in-memory transport, counting the bytes it
// writes (packets, and both ends of its streams), with its packets
// delivered as UDP would be: through a queue that drops when full.
// MockTransport hands each packet straight to the receiver's reader and
// waits for it; two nodes answering each other's pings at once would
// then wait on each other for good.
type counting struct {
	*memberlist.MockTransport
	sent    atomic.Uint64
	dropped atomic.Uint64
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
}

func newCounting(mt *memberlist.MockTransport) *counting {
	c := &counting{MockTransport: mt, packets: make(chan *memberlist.Packet, 4096), streams: make(chan net.Conn), done: make(chan struct{})}
	// The relay outlives its node: MockTransport's dials and sends wait
	// for a reader with no timeout, so a node stopped before its peers
	// must go on taking (and dropping) what they send it. It ends with
	// the process.
	go func() {
		for {
			select {
			case p := <-mt.PacketCh():
				select {
				case <-c.done:
				case c.packets <- p:
				default:
					c.dropped.Add(1)
				}
			case conn := <-mt.StreamCh():
				go func() {
					select {
					case c.streams <- countConn{conn, &c.sent}:
					case <-c.done:
						conn.Close()
					}
				}()
			}
		}
	}()
	return c
}

func (c *counting) PacketCh() <-chan *memberlist.Packet { return c.packets }

func (c *counting) WriteTo(b []byte, addr string) (time.Time, error) {
	c.sent.Add(uint64(len(b)))
	return c.MockTransport.WriteTo(b, addr)
}

func (c *counting) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	c.sent.Add(uint64(len(b)))
	return c.MockTransport.WriteToAddress(b, a)
}

func (c *counting) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	conn, err := c.MockTransport.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	return countConn{conn, &c.sent}, nil
}

func (c *counting) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	conn, err := c.MockTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	return countConn{conn, &c.sent}, nil
}

func (c *counting) StreamCh() <-chan net.Conn { return c.streams }

func (c *counting) Shutdown() error {
	select {
	case <-c.done:
	default:
		close(c.done)
	}
	return c.MockTransport.Shutdown()
}

type countConn struct {
	net.Conn
	n *atomic.Uint64
}

func (c countConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.Add(uint64(n))
	return n, err
}

// WriteTable writes results as a Markdown table.
func WriteTable(w io.Writer, results []*Result) {
	fmt.Fprintln(w, "| nodes | servers | req/s per server per node | fleet formed s | wire bytes/node/s (every packet and stream on the fleet port) | of which hapilot's messages, plaintext | busiest node's wire bytes/s | fault → decider drains s | fault → every node drains s | late node catches up s | late node in every picture s |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	sort.Slice(results, func(i, j int) bool { return results[i].Nodes < results[j].Nodes })
	for _, r := range results {
		fmt.Fprintf(w, "| %d | %d | %.0f | %.1f | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f | %.1f |\n", r.Nodes, r.Backends*r.Servers, r.Rate,
			r.Formed.Seconds(), r.BytesPerNode, r.FleetPerNode, r.MaxBytesNode, r.Decided.Seconds(), r.Converged.Seconds(), r.CaughtUp.Seconds(), r.LateInPicture.Seconds())
	}
}
