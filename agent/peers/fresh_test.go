package peers

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// Every check admit makes, one case each: a message must come from the
// address memberlist lists for its sender's name, from the process its
// meta names, within the freshness window by this clock, and once.
func TestAdmit(t *testing.T) {
	clk := newClock(time.Unix(100000, 0))
	now := clk.Now()
	inc := uint64(now.Add(-time.Hour).UnixNano())
	ns := func(d time.Duration) uint64 { return uint64(now.Add(d).UnixNano()) }
	b := addrOf("b")
	otherPort := netip.AddrPortFrom(b.Addr(), b.Port()+1)
	otherHost := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 66}), b.Port())
	window := FreshSyncs*DefaultConfig().Sync + MaxClockSkew
	for _, tc := range []struct {
		name   string
		h      header
		from   netip.AddrPort
		stream bool
		want   refusal
	}{
		{"fresh, from the member", header{Sender: "b", Incarnation: inc, Sent: ns(0), Seq: 1}, b, false, accepted},
		{"over TCP, from another port of the member's address", header{Sender: "b", Incarnation: inc, Sent: ns(0), Seq: 1}, otherPort, true, accepted},
		{"just inside the window", header{Sender: "b", Incarnation: inc, Sent: ns(-window), Seq: 1}, b, false, accepted},
		{"ahead, within the skew", header{Sender: "b", Incarnation: inc, Sent: ns(MaxClockSkew), Seq: 1}, b, false, accepted},
		{"this node's own name", header{Sender: "a", Incarnation: inc, Sent: ns(0), Seq: 1}, b, false, ownName},
		{"a name memberlist does not list", header{Sender: "ghost", Incarnation: inc, Sent: ns(0), Seq: 1}, b, false, notMember},
		{"the member's name from another host", header{Sender: "b", Incarnation: inc, Sent: ns(0), Seq: 1}, otherHost, false, wrongAddr},
		{"over UDP, from another port", header{Sender: "b", Incarnation: inc, Sent: ns(0), Seq: 1}, otherPort, false, wrongAddr},
		{"another process of the name", header{Sender: "b", Incarnation: inc + 1, Sent: ns(0), Seq: 1}, b, false, otherInc},
		{"an incarnation of 2^64-1", header{Sender: "b", Incarnation: 1<<64 - 1, Sent: ns(0), Seq: 1}, b, false, otherInc},
		{"replayed, past the window", header{Sender: "b", Incarnation: inc, Sent: ns(-window - time.Millisecond), Seq: 1}, b, false, tooOld},
		{"ahead, past the skew", header{Sender: "b", Incarnation: inc, Sent: ns(MaxClockSkew + time.Millisecond), Seq: 1}, b, false, tooNew},
		{"sent at 2^64-1", header{Sender: "b", Incarnation: inc, Sent: 1<<64 - 1, Seq: 1}, b, false, tooNew},
		{"sent before its process started", header{Sender: "b", Incarnation: ns(0), Sent: ns(-time.Second), Seq: 1}, b, false, early},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode("a", clk)
			minc := inc
			if tc.want == early {
				minc = tc.h.Incarnation
			}
			n.members["b"] = member{addr: b, incarnation: minc}
			if got := n.admit(tc.h, tc.from, tc.stream, now); got != tc.want {
				t.Fatalf("admit: %q, want %q", got, tc.want)
			}
		})
	}
}

// A member whose meta names no process, or one started ahead of this
// clock, has its messages refused.
func TestMetaBoundsTheIncarnation(t *testing.T) {
	clk := newClock(time.Unix(100000, 0))
	now := clk.Now()
	b := addrOf("b")
	for _, tc := range []struct {
		name string
		meta []byte
		want refusal
	}{
		{"its start", encodeMeta(uint64(now.Add(-time.Hour).UnixNano())), accepted},
		{"a start ahead of the clock", encodeMeta(1<<64 - 1), noInc},
		{"no meta (wire version 1)", nil, noInc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newTestNode("a", clk)
			n.learn(&memberlist.Node{Name: "b", Addr: b.Addr().AsSlice(), Port: b.Port(), Meta: tc.meta})
			inc, _ := decodeMeta(tc.meta)
			h := header{Sender: "b", Incarnation: inc, Sent: uint64(now.UnixNano()), Seq: 1}
			if got := n.admit(h, b, false, now); got != tc.want {
				t.Fatalf("admit: %q, want %q", got, tc.want)
			}
		})
	}
}

// A message is taken once; a sequence number far ahead (a liar's, or a
// replay's) shuts no later one out, since only the window's are kept.
func TestSequenceNumbersCannotLockASenderOut(t *testing.T) {
	clk := newClock(time.Unix(100000, 0))
	n := newTestNode("a", clk)
	inc := uint64(clk.Now().Add(-time.Hour).UnixNano())
	n.members["b"] = member{addr: addrOf("b"), incarnation: inc}
	at := func(seq uint64) header {
		return header{Sender: "b", Incarnation: inc, Sent: uint64(clk.Now().UnixNano()), Seq: seq}
	}
	for _, step := range []struct {
		seq  uint64
		want refusal
	}{{5, accepted}, {5, duplicate}, {1<<64 - 1, accepted}, {6, accepted}, {4, accepted}, {6, duplicate}} {
		if got := n.admit(at(step.seq), addrOf("b"), false, clk.Now()); got != step.want {
			t.Fatalf("seq %d: %q, want %q", step.seq, got, step.want)
		}
		clk.Advance(time.Millisecond)
	}
	// Past the window, what the clock refuses is forgotten.
	for i := uint64(0); i < maxSeen+10; i++ {
		n.admit(at(1000+i), addrOf("b"), false, clk.Now())
		if i == 100 {
			clk.Advance(n.fresh() + time.Second)
		}
	}
	if got := len(n.peers["b"].seen); got >= maxSeen {
		t.Fatalf("%d sequence numbers kept, bound %d", got, maxSeen)
	}
}

// A state replaces the decisions held only when it is later: a state
// sent earlier and delivered late (over TCP) changes nothing.
func TestOnlyALaterStateReplacesTheDecisions(t *testing.T) {
	clk := newClock(time.Unix(100000, 0))
	n := newTestNode("a", clk)
	inc := uint64(clk.Now().Add(-time.Hour).UnixNano())
	state := func(sent time.Time, seq uint64, held ...Held) []byte {
		m, _ := encodeState(stateMsg{header: header{Sender: "b", Incarnation: inc, Sent: uint64(sent.UnixNano()), Seq: seq}, Decisions: []Decision{{Backend: "app", Held: held}}})
		return m
	}
	early := clk.Now()
	clk.Advance(100 * time.Millisecond)
	hear(n, state(clk.Now(), 2, Held{Server: "s2", Phase: agent.PhaseDrained}))
	hear(n, state(early, 1)) // sent before, arrives after
	if got := n.peers["b"].decisions["app"].Held; len(got) != 1 || got[0].Server != "s2" {
		t.Fatalf("an earlier state replaced a later one: %+v", got)
	}
}

// A lie is logged with its reason, once per sender and reason every
// refusalLogEvery: twenty lies are one line, not twenty.
func TestRefusalsAreLoggedOncePerSenderAndReason(t *testing.T) {
	clk := newClock(time.Unix(100000, 0))
	n := newTestNode("a", clk)
	var logged bytes.Buffer
	n.log = zerolog.New(&logged)
	inc := uint64(clk.Now().Add(-time.Hour).UnixNano())
	n.members["d"] = member{addr: addrOf("d"), incarnation: inc}
	liar := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, 0, 66}), 7946)
	for i := uint64(0); i < 20; i++ {
		m, _ := encodeState(stateMsg{header: header{Sender: "d", Incarnation: 1<<64 - 1, Sent: uint64(clk.Now().UnixNano()), Seq: i}})
		n.receive(m, liar, false)
	}
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], `"level":"warn"`) || !strings.Contains(lines[0], string(wrongAddr)) || !strings.Contains(lines[0], liar.String()) {
		t.Fatalf("twenty lies logged as %d lines:\n%s", len(lines), logged.String())
	}
	if n.counters.Forged.Load() != 20 {
		t.Fatalf("forged %d, want 20", n.counters.Forged.Load())
	}
	clk.Advance(refusalLogEvery)
	m, _ := encodeState(stateMsg{header: header{Sender: "d", Incarnation: inc, Sent: uint64(clk.Now().UnixNano()), Seq: 99}})
	n.receive(m, liar, false)
	if got := strings.Count(logged.String(), "\n"); got != 2 {
		t.Fatalf("%d lines after refusalLogEvery, want 2", got)
	}
}
