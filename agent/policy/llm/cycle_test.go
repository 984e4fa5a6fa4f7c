package llm

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/agent/policy/rules"
)

// A server the model drains on its own word (a candidate the rules do
// not condemn: the zone) is drained so once in ZoneEvery, never cycled:
// once re-admitted, the model's next drain of it is refused until
// ZoneEvery has passed, as the rules leave a zone server serving. A
// drain the guardrails refused does not count. Before, a candidate
// stayed one after its re-admission and the stand-in's emulated capable profile drained one
// zone server 81 times in a simulated day (hapilot-bench soak
// scoreboard).
func TestTheModelNeverCyclesAServer(t *testing.T) {
	now := time.Unix(1000, 0)
	// s3 fails 2%, its peers 0.08%: a candidate, not the floor's.
	servers := []fixtures.Server{{Name: "s1", Req: 1200, E5: 1}, {Name: "s2", Req: 1200, E5: 1}, {Name: "s3", Req: 1200, E5: 24},
		{Name: "s4", Req: 1200, E5: 1}, {Name: "s5", Req: 1200, E5: 1}}
	drained := append([]fixtures.Server(nil), servers...)
	drained[2] = fixtures.Server{Name: "s3", DrainedAgo: 5 * time.Second}
	rc := rules.DefaultConfig()
	p, cfg := drainAll(t, rc)
	// The policy's clock (for ZoneEvery) jumps; the observations' runs
	// on a second at a time, so that the floor's test is fed seconds, not
	// the hour between.
	clock, seen := now, now
	p.Now = func() time.Time { return clock }
	obsAt := func(s []fixtures.Server) agent.Observation {
		seen = seen.Add(time.Second)
		return agent.Observation{Time: seen, Cycle: 1, Backends: []agent.BackendView{fixtures.Backend(seen, "app", s)}}
	}
	drainsS3 := func(got []agent.Action) bool {
		for _, a := range got {
			if a.Kind == agent.Drain && a.Server == "s3" {
				return true
			}
		}
		return false
	}
	if got := steps(t, p, obsAt(servers), cfg.Confirm); !drainsS3(got) {
		t.Fatalf("the model's first drain of s3 was not made: %v (unsupported %q)", got, p.Report().(Report).Unsupported)
	}
	// The next step sees it drained: the drain took.
	if _, err := p.Decide(context.Background(), obsAt(drained)); err != nil {
		t.Fatal(err)
	}
	// Re-admitted an hour later, it fails as before: not drained again.
	clock = clock.Add(time.Hour)
	if got := steps(t, p, obsAt(servers), cfg.Confirm+1); drainsS3(got) {
		t.Fatalf("s3 drained again on the model's word an hour after its first drain: %v", got)
	}
	// Nor is the model asked about it: it is no candidate until then,
	// and the report says why.
	r := p.Report().(Report)
	if !strings.Contains(strings.Join(r.Spent, "\n"), "app/s3: drained on the model's word") {
		t.Fatalf("s3 is not among the spent candidates: %q (candidates %q)", r.Spent, r.Candidates)
	}
	if r.Called || r.Gated == "" {
		t.Fatalf("the model was asked with nothing else to decide (called %v, gated %q, candidates %q)", r.Called, r.Gated, r.Candidates)
	}
	// A day after the first drain it may be drained again.
	clock = now.Add(rc.ZoneEvery + time.Minute)
	if got := steps(t, p, obsAt(servers), cfg.Confirm+1); !drainsS3(got) {
		t.Fatalf("s3 not drained a ZoneEvery after its first drain: %v (unsupported %q)", got, p.Report().(Report).Unsupported)
	}
}
