package peers

import (
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// heldBy is what n holds as peer's word on app.
func heldBy(n *Node, peer string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	if p := n.peers[peer]; p != nil {
		for _, h := range p.decisions["app"].Held {
			out = append(out, h.Server)
		}
	}
	sort.Strings(out)
	return out
}

// heldWithin is the first word of peer's on app that n holds with a
// server in it, watched for d; nil if none.
func heldWithin(n *Node, peer string, d time.Duration) []string {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
		if h := heldBy(n, peer); len(h) > 0 {
			return h
		}
	}
	return nil
}

// inPicture reports whether n heard peer within the timeout.
func inPicture(n *Node, peer string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.peers[peer]
	return p != nil && n.now().Sub(p.lastHeard) <= n.cfg.Timeout
}

// sniffer is a transport that keeps a copy of every packet its node
// writes to one address: what someone on the path would record.
type sniffer struct {
	*memberlist.NetTransport
	mu      sync.Mutex
	to      string
	packets [][]byte
}

func (s *sniffer) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	s.mu.Lock()
	if a.Addr == s.to {
		s.packets = append(s.packets, append([]byte(nil), b...))
	}
	s.mu.Unlock()
	return s.NetTransport.WriteToAddress(b, a)
}

// startWith is startNode with memberlist's settings tuned.
func startWith(t *testing.T, name string, key []byte, tune func(*memberlist.Config), join ...string) *Node {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Bind, cfg.Name, cfg.Join = "127.0.0.1:0", name, join
	n, err := Start(Params{Config: cfg, Key: key, Local: window.New(time.Minute, 64, nil), Log: zerolog.Nop(), Tune: tune})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = n.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done; n.Close() }
	t.Cleanup(stop)
	return n
}

// rankedFirst is a name, "d" and a number, that ranks first for app
// among itself and others.
func rankedFirst(t *testing.T, others ...string) string {
	for i := 0; i < 1000; i++ {
		n := "d" + strconv.Itoa(i)
		if rank("app", append([]string{n}, others...))[0] == n {
			return n
		}
	}
	t.Fatalf("no name ranks first for app among %v", others)
	return ""
}

// decideApp makes d the decider of app holding held drained, as its
// loop and ledger would.
func decideApp(d *Node, held ...string) {
	d.split(view("app", srv("s1", agent.OwnerNone, 0, 100, nil), srv("s2", agent.OwnerNone, 0, 100, nil), srv("s3", agent.OwnerNone, 0, 100, nil)))
	changes := map[agent.Key]agent.Change{}
	for _, s := range held {
		changes[agent.Key{Backend: "app", Server: s}] = agent.Change{Phase: agent.PhaseDrained}
	}
	d.SetChanges(func() map[agent.Key]agent.Change { return changes })
}

// A member holding the key lies under the decider's name: 20 state
// messages with incarnation 2^64-1 and s1-s3 drained, then 20 with the
// decider's own incarnation. The follower takes none of them, logs them,
// and goes on following the real decider, which the lie used to shut out
// for good as "stale".
func TestImpersonatorCannotLockOutTheDecider(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	dn := rankedFirst(t, "f", "liar")
	d := startNode(t, dn, key)
	f := startNode(t, "f", key, d.Addr())
	liar := startNode(t, "liar", key, d.Addr())
	decideApp(d, "s2")
	eventually(t, "f follows d's word", func() bool {
		return inPicture(f, "liar") && len(heldBy(f, dn)) == 1
	})
	now := time.Now()
	rejected := f.counters.Rejected.Load()
	for i := uint64(0); i < 20; i++ {
		lie(t, liar, f, forgeState(dn, 1<<64-1, now, 1<<63+i, "s1", "s2", "s3"))
		lie(t, liar, f, forgeState(dn, d.incarnation, now, 1<<63+i, "s1", "s2", "s3"))
	}
	lie(t, liar, f, forgeState("liar", 1<<64-1, now, 1<<63, "s1", "s2", "s3")) // and under its own name, a process it is not
	// The lies are in: each one's memberlist user message is refused
	// (NotifyMsg), after its sealed packet on the same path.
	eventually(t, "f refuses the 41 lies' user messages", func() bool { return f.counters.Rejected.Load() >= rejected+41 })
	eventually(t, "f still follows d, and only d", func() bool {
		return inPicture(f, dn) && len(heldBy(f, dn)) == 1 && heldBy(f, dn)[0] == "s2" && len(heldBy(f, "liar")) == 0
	})
	if !liesCounted(f) {
		t.Fatal("the lies were not counted as refused")
	}
	// d's word still moves f: the operator readies s2, d holds nothing.
	decideApp(d)
	eventually(t, "f follows d's next word", func() bool { return inPicture(f, dn) && len(heldBy(f, dn)) == 0 })
}

// Packets between a decider and a follower, recorded while the decider
// held s2 drained and replayed after the operator readied it, drain
// nothing on a freshly restarted node: one that has not met the decider
// yet, nor one that has. A fresh node's replay window used to take any
// sequence number, and nothing in a message said when it was made.
func TestReplayedPacketsAreRefusedByARestartedNode(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	dn := rankedFirst(t, "f")
	var sniff *sniffer
	d := startWith(t, dn, key, func(c *memberlist.Config) {
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{"127.0.0.1"}, Logger: log.New(io.Discard, "", 0)})
		if err != nil {
			t.Fatal(err)
		}
		sniff = &sniffer{NetTransport: nt}
		c.Transport = sniff
	})
	f := startNode(t, "f", key, d.Addr())
	sniff.mu.Lock()
	sniff.to = f.Addr()
	sniff.mu.Unlock()
	decideApp(d, "s2")
	eventually(t, "f follows d's word", func() bool { return len(heldBy(f, dn)) == 1 })
	// Two more of d's packets to f recorded, after the one f followed.
	sniff.mu.Lock()
	seen := len(sniff.packets)
	sniff.mu.Unlock()
	eventually(t, "two more of d's packets to f recorded", func() bool {
		sniff.mu.Lock()
		defer sniff.mu.Unlock()
		return len(sniff.packets) >= seen+2
	})
	sniff.mu.Lock()
	recorded := sniff.packets
	sniff.mu.Unlock()
	decideApp(d) // the operator readied s2
	eventually(t, "f follows d's new word", func() bool { return len(heldBy(f, dn)) == 0 })

	replay := func(to *Node) {
		c, err := net.Dial("udp", to.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, p := range recorded {
			_, _ = c.Write(p)
		}
	}
	// A node restarted alone: it has not met d. Then one restarted into
	// the fleet, once it follows d's new word. Neither may hold s2 for a
	// moment: a step there would drain it.
	alone := startNode(t, "f2", key)
	replay(alone)
	if got := heldWithin(alone, dn, 600*time.Millisecond); len(got) != 0 {
		t.Fatalf("a replay drained %v on a node that had just started", got)
	}
	joined := startNode(t, "f3", key, d.Addr())
	eventually(t, "the restarted node hears d", func() bool { return inPicture(joined, dn) })
	replay(joined)
	if got := heldWithin(joined, dn, 600*time.Millisecond); len(got) != 0 {
		t.Fatalf("a replay drained %v on a node restarted into the fleet", got)
	}
	if len(recorded) == 0 {
		t.Fatal("nothing was recorded: the test replayed nothing")
	}
}
