package peers

import (
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hashicorp/memberlist"
)

// The liar's tools, apart from the tests: what a holder of the key can
// send depends on the wire, the tests' claims do not.

// forgeState is a state message under sender's name, as a holder of the
// key would make one to lie with: backend app, held drained.
func forgeState(sender string, inc uint64, sent time.Time, seq uint64, held ...string) []byte {
	d := Decision{Backend: "app"}
	for _, s := range held {
		d.Held = append(d.Held, Held{Server: s, Phase: agent.PhaseDrained, Reason: "lie"})
	}
	m, _ := encodeState(stateMsg{header: header{Sender: sender, Incarnation: inc, Sent: uint64(sent.UnixNano()), Seq: seq}, Decisions: []Decision{d}})
	return m
}

// lie sends msg from liar to victim every way a holder of the key has:
// sealed in hapilot's envelope, and as a memberlist user message.
func lie(t *testing.T, liar, victim *Node, msg []byte) {
	t.Helper()
	to := memberlist.Address{Addr: victim.Addr(), Name: victim.Name()}
	if err := liar.tr.sendPacket(to, liar.sealer.seal(msg)); err != nil {
		t.Fatal(err)
	}
	if err := liar.ml.SendToAddress(to, msg); err != nil {
		t.Fatal(err)
	}
}

// liesCounted reports whether n counted the lies it refused: under
// another's name or process, and in memberlist's user messages.
func liesCounted(n *Node) bool {
	return n.counters.Forged.Load()+n.counters.Stale.Load() > 0 && n.counters.Rejected.Load() > 0
}
