package llm

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/agent/policy/llm/modelapi"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/ollama/ollama/api"
	"github.com/rs/zerolog"
)

// The policy judges the model's drains by the operator's rules, not the
// defaults. Their sequential test finds the candidates, with the
// operator's regions: with --rules-floor 0.05 (degraded only from 5%), a
// server failing 2% is no candidate, and a model that drains whatever
// it sees is refused it. Their --rules-min-ratio judges a candidate's
// drain against its peers: at 25, 2% against its peers' 0.08% (24 times)
// is not enough. Under the defaults the same drain goes through, so each
// refusal is the operator's setting at work.
func TestThePolicyJudgesByTheOperatorsRules(t *testing.T) {
	now := time.Unix(1000, 0)
	// Five servers of 1,200 requests a minute: four fail 0.08%, s3 2%
	// (grey: a candidate, not yet the floor's; see grey).
	servers := []fixtures.Server{{Name: "s1", Req: 1200, E5: 1}, {Name: "s2", Req: 1200, E5: 1}, {Name: "s3", Req: 1200, E5: 24},
		{Name: "s4", Req: 1200, E5: 1}, {Name: "s5", Req: 1200, E5: 1}}
	for _, tc := range []struct {
		name    string
		set     func(*rules.Config)
		drained bool
		why     string
	}{
		{"the defaults: a candidate, supported", func(*rules.Config) {}, true, ""},
		{"--rules-floor 0.05: no candidate, nothing to ask", func(c *rules.Config) { c.Floor = 0.05 }, false, ""},
		{"--rules-min-ratio 25: 24 times its peers is not enough", func(c *rules.Config) { c.MinRatio = 25 }, false, "the backend fails alike"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := rules.DefaultConfig()
			tc.set(&rc)
			p, cfg := drainAll(t, rc)
			obs := agent.Observation{Time: now, Cycle: 1, Backends: []agent.BackendView{fixtures.Backend(now, "app", servers)}}
			got := steps(t, p, obs, cfg.Confirm+1)
			r := p.Report().(Report)
			if len(r.Floor) != 0 {
				t.Fatalf("the rules' floor drained on its own: %v", r.Floor)
			}
			drained := false
			for _, a := range got {
				drained = drained || a.Kind == agent.Drain && a.Server == "s3"
			}
			if drained != tc.drained {
				t.Fatalf("s3 drained %v, want %v (accepted %v, candidates %q, unsupported %q)", drained, tc.drained, got, r.Candidates, r.Unsupported)
			}
			if candidate := len(r.Candidates) == 1 && strings.HasPrefix(r.Candidates[0], "app/s3 errors"); candidate != (tc.why != "" || tc.drained) {
				t.Fatalf("candidates %q", r.Candidates)
			}
			if tc.why != "" && !strings.Contains(strings.Join(r.Unsupported, "\n"), tc.why) {
				t.Fatalf("the refusal of s3 (%s) is not in the report: %+v", tc.why, r)
			}
			for _, u := range r.Unsupported {
				if tc.drained && strings.Contains(u, "app/s3") {
					t.Fatalf("s3 refused under the default ratio: %q", u)
				}
			}
		})
	}
}

// drainAll is the policy under rc, its floor the rules, with the stand-in's
// emulated drain-all model (it drains whatever it sees), and its
// configuration; both end with the test.
func drainAll(t *testing.T, rc rules.Config) (*Policy, Config) {
	t.Helper()
	respond, err := ollamafake.Emulation("drain-all", 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	fake := ollamafake.New(map[string]string{model: "sha256:fa4e"}, respond)
	t.Cleanup(fake.Close)
	u, _ := url.Parse(fake.URL)
	cfg := DefaultConfig()
	cfg.Model, cfg.Deadline, cfg.LoadTimeout = model, 2*time.Second, 10*time.Second
	m := &Model{Server: &modelapi.Ollama{Client: api.NewClient(u, fake.Client())}, Config: cfg, SystemPrompt: prompt.DefaultSystemPrompt}
	p := New(m, rules.NewPolicy(rc), rc, cfg, zerolog.Nop())
	t.Cleanup(p.Close)
	return p, cfg
}
