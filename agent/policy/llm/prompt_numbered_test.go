package llm

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/agent/policy/llm/prompt"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
)

// Over every calibration step, each reference a numbered prompt writes
// names the row it ends and the backend it stands under, and the reply
// schema offers exactly the references of the rows the agent may act on.
func TestNumberedRefsNameTheirRows(t *testing.T) {
	for _, seq := range fixtures.Sequences(time.Unix(5000, 0)) {
		for i, st := range seq.Steps {
			cands := map[agent.Key]string{}
			for _, b := range st.Obs.Backends {
				for _, s := range b.Servers {
					if s.Window.Err5xx > 0 || s.Owner == agent.OwnerOperator {
						cands[s.Key()] = "errors"
					}
				}
			}
			in := prompt.Input{Obs: st.Obs, Candidates: cands, Style: prompt.Numbered}
			r := in.Refs()
			backend, rows := "", 0
			for _, line := range strings.Split(prompt.Render(in), "\n") {
				if rest, ok := strings.CutPrefix(line, "backend "); ok {
					ref, name, _ := strings.Cut(rest, " = ")
					name, _, _ = strings.Cut(name, ":")
					if r.Backend(ref) != name {
						t.Fatalf("%s step %d: %q: %s is %q in Refs", seq.Name, i+1, line, ref, r.Backend(ref))
					}
					backend = ref
					continue
				}
				body, ref, ok := strings.Cut(line, " = s")
				if !ok || line == prompt.NumberedHeader {
					continue
				}
				rows++
				k, _ := r.Server("s" + ref)
				if name, _, _ := strings.Cut(body, " "); k.Server != name || k.Backend != r.Backend(backend) {
					t.Fatalf("%s step %d: row %q: s%s names %v", seq.Name, i+1, line, ref, k)
				}
			}
			if _, more := r.Server("s" + strconv.Itoa(rows+1)); more || rows == 0 && len(r.Backends) > 0 {
				t.Fatalf("%s step %d: %d rows numbered, Refs has more", seq.Name, i+1, rows)
			}
			var schema struct {
				Properties struct {
					Actions struct {
						Items struct {
							Properties struct {
								Backend, Server struct{ Enum []string }
							}
						}
					}
				}
			}
			p := &Policy{Config: Config{NumPredict: 256}}
			if err := json.Unmarshal(p.schema(in), &schema); err != nil {
				t.Fatal(err)
			}
			item := schema.Properties.Actions.Items.Properties
			for _, s := range item.Server.Enum {
				if k, ok := r.Server(s); s != "-" && (!ok || operators(st.Obs)[k]) {
					t.Fatalf("%s step %d: the schema offers %s (%v)", seq.Name, i+1, s, k)
				}
			}
			if len(r.Servers) > 0 && len(item.Server.Enum) != len(r.Servers)+1 || len(item.Backend.Enum) != len(r.Backends)+1 && len(r.Backends) > 0 {
				t.Fatalf("%s step %d: schema enums %v %v for %v %v", seq.Name, i+1, item.Backend.Enum, item.Server.Enum, r.Backends, r.Servers)
			}
		}
	}
}

func operators(obs agent.Observation) map[agent.Key]bool {
	out := map[agent.Key]bool{}
	for _, b := range obs.Backends {
		for _, s := range b.Servers {
			if s.Owner == agent.OwnerOperator {
				out[s.Key()] = true
			}
		}
	}
	return out
}

// Through the policy: a numbered reply acts on the server its reference
// names, and one naming a row the prompt did not give is an invalid
// reply, audited with what the model said, and the rules' plan stands.
func TestNumberedReplyActsOnItsRow(t *testing.T) {
	numbered := func(c *Config) { c.Prompt, c.Confirm, c.Gate = prompt.Numbered, 1, GateAlways }
	drain := func(b, s string) string {
		return `{"actions":[{"reason":"s1: 5xx far above its peers","action":"drain","backend":"` + b + `","server":"` + s + `"}]}`
	}
	p, fake := newPolicy(t, ollamafake.Fixed(drain("b1", "s1")), numbered)
	got := steps(t, p, grey(time.Unix(1000, 0)), 1)
	if len(got) != 1 || got[0].Key() != (agent.Key{Backend: "app", Server: "srv4"}) || got[0].Kind != agent.Drain {
		t.Fatalf("accepted %v", got)
	}
	if f := fake.Requests()[0].Format; !strings.Contains(string(f), `"enum":["s1","s2","s3","s4","-"]`) || !strings.Contains(string(f), `"enum":["b1","-"]`) {
		t.Fatalf("the schema does not offer the references: %s", f)
	}

	p, _ = newPolicy(t, ollamafake.Fixed(drain("b1", "s9")), numbered)
	plan, err := p.Decide(context.Background(), feed(p, grey(time.Unix(1000, 0))))
	if err != nil || len(plan) != 0 {
		t.Fatalf("plan %v, %v", plan, err)
	}
	r := p.Report().(Report)
	if r.Call == nil || !strings.Contains(r.Call.Error, `server "s9"`) || !strings.Contains(r.Call.Raw, "s9") || r.Fallback == "" {
		t.Fatalf("report %+v", r)
	}
	if p.counters.invalid != 1 || p.counters.fallbacks != 1 {
		t.Fatalf("counters %+v", p.counters)
	}
}
