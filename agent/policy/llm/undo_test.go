package llm

import (
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/rs/zerolog"
)

// The hold on undoing: a drain younger than --min-hold is undone on the
// model's word only if the server's own window is in the rules' healthy
// region against its serving peers (the sequential test's terms, no
// longer the windowed test's verdict); an older one always.
func TestHoldOnUndoingJudgesByTheHealthyRegion(t *testing.T) {
	now := time.Unix(1000, 0)
	p := New(nil, agent.Policy{}, rules.DefaultConfig(), DefaultConfig(), zerolog.Nop())
	defer p.Close()
	for _, tc := range []struct {
		name    string
		ago     time.Duration
		req, e5 uint64
		peerE5  uint64 // each peer's 5xx of its 3,000
		mayUndo bool
	}{
		{"its window as healthy as its peers'", 10 * time.Second, 3000, 6, 6, true},
		{"0.4%, under the healthy floor of 0.5%", 10 * time.Second, 3000, 12, 6, true},
		// the windowed test's rule (at most twice its peers') held it
		{"one error among error-free peers is healthy", 10 * time.Second, 3000, 1, 0, true},
		{"its window still 3% (its minute before the drain)", 10 * time.Second, 3000, 90, 6, false},
		{"no traffic: no evidence either way", 10 * time.Second, 0, 0, 6, false},
		{"past the hold: the model's word", 2 * time.Minute, 3000, 90, 6, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			servers := fixtures.Healthy("s", 5, 1)
			for i := range servers {
				servers[i].Req, servers[i].E5 = 3000, tc.peerE5
			}
			servers[2].DrainedAgo = tc.ago
			b := fixtures.Backend(now, "app", servers)
			// a drained server's window: what it answered over the last minute
			b.Servers[2].Window.Requests, b.Servers[2].Window.Err5xx = tc.req, tc.e5
			obs := agent.Observation{Time: now, Backends: []agent.BackendView{b}}
			if got := p.mayUndo(obs, agent.Action{Kind: agent.Ready, Backend: "app", Server: "s3"}); got != tc.mayUndo {
				t.Fatalf("mayUndo %v, want %v", got, tc.mayUndo)
			}
		})
	}
}
