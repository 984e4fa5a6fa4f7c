package peers

import (
	"bytes"
	"context"
	"net"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// userMsgType is memberlist's message type of a user message on the wire.
const userMsgType = 8

func startNode(t *testing.T, name string, key []byte, join ...string) *Node {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Bind, cfg.Name, cfg.Join = "127.0.0.1:0", name, join
	n, err := Start(Params{Config: cfg, Key: key, Local: window.New(time.Minute, 64, nil), Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = n.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; n.Close() })
	return n
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10 s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func hasSeries(s *window.Store, backend, server string) bool {
	for _, st := range s.Snapshot(time.Minute) {
		if st.Backend == backend && st.Server == server && st.Requests > 0 {
			return true
		}
	}
	return false
}

// Over real memberlist on loopback: two agents with the key pool their
// counts; a peer with another key, or none, or a forged plaintext packet,
// can neither join nor inject counts or decisions.
func TestPeerWithoutTheKeyCannotInject(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	a := startNode(t, "a", key)
	b := startNode(t, "b", key, a.Addr())
	// b ships only what its windows gain once it hears a peer
	eventually(t, "a hears b and holds its counts", func() bool {
		b.local.Record(window.Event{Backend: []byte("app"), Server: []byte("srv1"), Status: 200, ResponseMs: 5})
		return hasSeries(a.remote, "app", "srv1")
	})

	forged := func(sender string) [][]byte {
		return encodeCounts(header{Sender: sender, Incarnation: uint64(time.Now().UnixNano()), Sent: uint64(time.Now().UnixNano())},
			[]window.Delta{{Backend: "app", Server: "evil", Seconds: []window.Second{{Requests: 1000, Err5xx: 1000}}}}, 1300, func() uint64 { return 1 })
	}
	decision, _ := encodeState(stateMsg{header: header{Sender: "evil", Incarnation: uint64(time.Now().UnixNano()), Sent: uint64(time.Now().UnixNano()), Seq: 1},
		Decisions: []Decision{{Backend: "app", Held: []Held{{Server: "srv1", Phase: "drained"}}}}})

	// another key: memberlist cannot even join
	other := startNode(t, "evil", bytes.Repeat([]byte{9}, 32))
	if _, err := other.ml.Join([]string{a.Addr()}); err == nil {
		t.Error("a peer with another key joined")
	}
	// ... nor reach a with user messages, nor in envelopes sealed with its
	// own key, nor with either claiming b's name
	for _, m := range append(forged("evil"), append(forged("b"), decision)...) {
		to := memberlist.Address{Addr: a.Addr(), Name: "a"}
		if err := other.ml.SendToAddress(to, m); err != nil {
			t.Fatal(err)
		}
		if err := other.tr.sendPacket(to, other.sealer.seal(m)); err != nil {
			t.Fatal(err)
		}
	}
	// plaintext packets straight to a's port: one bare, one as a user message
	conn, err := net.Dial("udp", a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, m := range append(forged("evil"), decision) {
		_, _ = conn.Write(m)
		_, _ = conn.Write(append([]byte{userMsgType}, m...))
	}
	// a's socket holds all of that before b next syncs: once b's marker
	// has arrived, a has read every forged packet
	marked := false
	for deadline := time.Now().Add(10 * time.Second); !marked && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b.local.Record(window.Event{Backend: []byte("app"), Server: []byte("marker"), Status: 200, ResponseMs: 5})
		marked = hasSeries(a.remote, "app", "marker")
	}
	if hasSeries(a.remote, "app", "evil") {
		t.Fatal("counts from a peer without the key reached the pooled windows")
	}
	if !marked {
		t.Fatal("b's counts stopped reaching a: a forged message in b's name was taken for b")
	}
	a.mu.Lock()
	_, heard := a.peers["evil"]
	a.mu.Unlock()
	if heard {
		t.Fatal("a peer without the key was heard")
	}
	for _, m := range a.ml.Members() {
		if m.Name == "evil" {
			t.Fatal("a peer without the key is a member")
		}
	}
}
