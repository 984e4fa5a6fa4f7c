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
// defaults: with --rules-min-ratio 5, a server failing 3 times as often
// as its peers is not "supported", however often a model that drains
// whatever it sees proposes it. With the default ratio 2 the same drain
// goes through, so the row that refuses it is the operator's ratio at
// work.
func TestThePolicyJudgesByTheOperatorsRules(t *testing.T) {
	now := time.Unix(1000, 0)
	// Five servers of 1000 requests: four fail 1%, s3 3%. The rules'
	// strict test does not drain s3 (p about 1e-4 against its better
	// peers, above 1e-6/5), so whether it goes is the model's call.
	servers := []fixtures.Server{{Name: "s1", Req: 1000, E5: 10}, {Name: "s2", Req: 1000, E5: 10}, {Name: "s3", Req: 1000, E5: 30},
		{Name: "s4", Req: 1000, E5: 10}, {Name: "s5", Req: 1000, E5: 10}}
	for _, tc := range []struct {
		name     string
		minRatio float64
		drained  bool
	}{
		{"the default ratio 2: 3x its peers is supported", 2, true},
		{"--rules-min-ratio 5: 3x its peers is not", 5, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			respond, err := ollamafake.Emulation("drain-all", 1, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			fake := ollamafake.New(map[string]string{model: "sha256:fa4e"}, respond)
			defer fake.Close()
			u, _ := url.Parse(fake.URL)
			cfg := DefaultConfig()
			cfg.Model, cfg.Deadline, cfg.LoadTimeout = model, 2*time.Second, 10*time.Second
			rc := rules.DefaultConfig()
			rc.MinRatio = tc.minRatio
			m := &Model{Server: &modelapi.Ollama{Client: api.NewClient(u, fake.Client())}, Config: cfg, SystemPrompt: prompt.DefaultSystemPrompt}
			p := New(m, rules.NewWindowed(rc), rc, cfg, zerolog.Nop())
			defer p.Close()
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
			if !tc.drained && len(r.Unsupported) == 0 {
				t.Fatalf("the refusal of s3 is not in the report: %+v", r)
			}
			for _, u := range r.Unsupported {
				if tc.drained && strings.Contains(u, "app/s3") {
					t.Fatalf("s3 refused under the default ratio: %q", u)
				}
			}
		})
	}
}
