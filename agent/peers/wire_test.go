package peers

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/window"
)

func sampleState() stateMsg {
	return stateMsg{header: header{Kind: kindState, Sender: "edge-1", Incarnation: 1700000000000000000, Sent: 1700000000500000000, Seq: 42}, Decisions: []Decision{
		{Backend: "app", PooledRequests: 9000, PooledErr5xx: 31, Held: []Held{
			{Server: "srv3", Phase: agent.PhaseDrained, Reason: "5xx 5.1% vs peers 0.0%", ErrorRate: 0.051},
			{Server: "srv6", Phase: agent.PhaseCanary, Weight: 25, Reason: "re-admission"},
		}},
		{Backend: "api"},
	}}
}

func sampleDeltas(n int) []window.Delta {
	var out []window.Delta
	for i := 0; i < n; i++ {
		out = append(out, window.Delta{Backend: "app", Server: "srv" + strings.Repeat("x", i%7) + string(rune('a'+i%26)), Seconds: []window.Second{
			{Ago: 1, Requests: 100, Err5xx: 5, Err4xx: 2, Retried: 1, Latency: []window.Bin{{Index: 9, Count: 60}, {Index: 20, Count: 39}}},
			{Ago: 0, Requests: 7, Latency: []window.Bin{{Index: 3, Count: 7}}},
		}})
	}
	return out
}

func TestStateRoundTrip(t *testing.T) {
	want := sampleState()
	b, left := encodeState(want)
	if left != 0 {
		t.Fatalf("%d decisions left out", left)
	}
	got, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, &want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
	}
}

// Counts are packed into messages that each fit the limit, and together
// carry every delta once, in order.
func TestCountsChunkedUnderTheLimit(t *testing.T) {
	deltas := sampleDeltas(300)
	seq := uint64(0)
	msgs := encodeCounts(header{Sender: "edge-1", Incarnation: 7}, deltas, 1336, func() uint64 { seq++; return seq })
	if len(msgs) < 2 {
		t.Fatalf("300 deltas in %d message(s): no chunking", len(msgs))
	}
	var got []window.Delta
	for i, m := range msgs {
		if len(m) > 1336 {
			t.Errorf("message %d: %d bytes, over the limit", i, len(m))
		}
		v, err := decode(m)
		if err != nil {
			t.Fatal(err)
		}
		c := v.(*countsMsg)
		if c.Seq != uint64(i+1) {
			t.Errorf("message %d: seq %d", i, c.Seq)
		}
		got = append(got, c.Deltas...)
	}
	if !reflect.DeepEqual(got, deltas) {
		t.Fatalf("deltas differ after the round trip")
	}
}

// Whatever arrives, decode returns an error or a message, never panics,
// and a message cut anywhere is refused.
func TestDecodeRefusesMalformed(t *testing.T) {
	valid, _ := encodeState(sampleState())
	counts := encodeCounts(header{Sender: "b", Incarnation: 1}, sampleDeltas(3), 1<<20, func() uint64 { return 1 })[0]
	for _, m := range [][]byte{valid, counts} {
		for i := 0; i < len(m); i++ {
			if _, err := decode(m[:i]); err == nil {
				t.Fatalf("a message cut at %d of %d bytes was accepted", i, len(m))
			}
		}
		if _, err := decode(append(append([]byte{}, m...), 0)); err == nil {
			t.Fatal("trailing bytes accepted")
		}
	}
	if _, err := decode(oneHeldAt(phaseCode(agent.PhaseCut), 50, ppm)); err != nil {
		t.Fatalf("the well-formed one oneHeld builds: %v", err) // so that the three below fail on their one bad field
	}
	w := func(f func(w *writer)) []byte { x := &writer{}; f(x); return x.b }
	head := func(w *writer, kind byte) { w.header(header{Kind: kind, Sender: "b", Incarnation: 1, Seq: 1}) }
	for name, m := range map[string][]byte{
		"empty":           nil,
		"wrong magic":     {'x', version, kindState, 0},
		"wrong version":   {magic, 9, kindState},
		"unknown kind":    w(func(w *writer) { head(w, 7) }),
		"no sender":       w(func(w *writer) { w.header(header{Kind: kindState}); w.uvarint(0) }),
		"huge count":      w(func(w *writer) { head(w, kindState); w.uvarint(1 << 40) }),
		"bad phase":       oneHeld(9, 0),
		"weight over 256": oneHeld(phaseCode(agent.PhaseCut), 1000),
		"5xx rate over 1": oneHeldAt(phaseCode(agent.PhaseDrained), 0, ppm+1),
		"count over 32 bits": w(func(w *writer) {
			head(w, kindCounts)
			w.uvarint(1)
			w.string("app", 255)
			w.string("srv1", 255)
			w.uvarint(1)
			w.byte(0)
			w.uvarint(1 << 33)
			w.uvarint(0)
			w.uvarint(0)
			w.uvarint(0)
			w.uvarint(0)
		}),
		"name over 255 bytes": w(func(w *writer) {
			w.b = append(w.b, magic, version, kindState)
			w.uvarint(300)
			w.b = append(w.b, strings.Repeat("n", 300)...)
		}),
	} {
		if v, err := decode(m); err == nil {
			t.Errorf("%s: accepted as %+v", name, v)
		}
	}
}

func FuzzDecode(f *testing.F) {
	st, _ := encodeState(sampleState())
	f.Add(st)
	f.Add(encodeCounts(header{Sender: "b", Incarnation: 1}, sampleDeltas(2), 1<<20, func() uint64 { return 1 })[0])
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decode(b)
		if err == nil && v == nil {
			t.Fatal("no message and no error")
		}
	})
}

// oneHeld is a state message holding one server at phase code and weight,
// written field by field, so that either may be out of range.
func oneHeld(phase byte, weight uint64) []byte { return oneHeldAt(phase, weight, 0) }

func oneHeldAt(phase byte, weight, ratePPM uint64) []byte {
	w := &writer{}
	w.header(header{Kind: kindState, Sender: "b", Incarnation: 1, Seq: 1})
	w.uvarint(1) // one decision
	w.string("app", maxName)
	w.uvarint(0) // pooled requests
	w.uvarint(0) // pooled 5xx
	w.uvarint(1) // one server held
	w.string("srv1", maxName)
	w.byte(phase)
	w.uvarint(weight)
	w.string("", maxReason)
	w.uvarint(ratePPM)
	return w.b
}

// A state too large for one message is cut to MaxMessage: whole
// decisions only, and the count of those left out.
func TestStateCutToMaxMessage(t *testing.T) {
	long := strings.Repeat("x", maxName)
	var st stateMsg
	st.Sender = "edge-1"
	for i := 0; len(st.Decisions)*maxName*2 < 2*MaxMessage; i++ {
		st.Decisions = append(st.Decisions, Decision{Backend: long[:maxName-5] + strconv.Itoa(10000+i), Held: []Held{{Server: long, Phase: agent.PhaseDrained, Reason: strings.Repeat("r", maxReason)}}})
	}
	b, left := encodeState(st)
	if len(b) > MaxMessage || left == 0 {
		t.Fatalf("%d bytes with %d decisions left out, bound %d", len(b), left, MaxMessage)
	}
	v, err := decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(v.(*stateMsg).Decisions); got != len(st.Decisions)-left || !reflect.DeepEqual(v.(*stateMsg).Decisions, st.Decisions[:got]) {
		t.Fatalf("%d decisions decoded of %d, %d said left out", got, len(st.Decisions), left)
	}
}

func TestMetaRoundTrip(t *testing.T) {
	for _, inc := range []uint64{1, 1700000000000000000, 1<<64 - 1} {
		if got, err := decodeMeta(encodeMeta(inc)); err != nil || got != inc {
			t.Errorf("%d: %d %v", inc, got, err)
		}
	}
	for _, bad := range [][]byte{nil, {'h'}, {'h', 1, 5}, {'x', version, 5}, append(encodeMeta(5), 0)} {
		if _, err := decodeMeta(bad); err == nil {
			t.Errorf("meta %x taken", bad)
		}
	}
}
