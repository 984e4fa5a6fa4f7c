package prompt

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// fleet is one backend of n servers, 600 requests each; faulty ones fail
// 5% (the policy's tests have the same).
func fleet(now time.Time, n int, faulty ...string) agent.Observation {
	b := agent.BackendView{Name: "app"}
	for i := 1; i <= n; i++ {
		name := "srv" + string(rune('0'+i))
		x := uint64(0)
		for _, f := range faulty {
			if f == name {
				x = 30
			}
		}
		b.Servers = append(b.Servers, agent.ServerView{Backend: "app", Server: name, Owner: agent.OwnerNone,
			State:  haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 1, Initial: 1},
			Window: window.Stats{Backend: "app", Server: name, Requests: 600, Err5xx: x, P50Ms: 9, P95Ms: 12, P99Ms: 14}})
	}
	return agent.Observation{Time: now, Cycle: 1, Backends: []agent.BackendView{b}}
}

// grey is six servers of which srv4 fails 7 of 600.
func grey(now time.Time) agent.Observation {
	obs := fleet(now, 6)
	obs.Backends[0].Servers[3].Window.Err5xx = 7
	return obs
}

func TestParseReply(t *testing.T) {
	plan, err := ParseReply(`{"actions":[{"action":"set_weight","backend":"app","server":"s1","weight":10,"reason":"r"},{"action":"no_op","backend":"-","server":"-","reason":"r"}]}`)
	if err != nil || len(plan) != 1 || plan[0].Weight != 10 {
		t.Fatalf("%+v %v", plan, err)
	}
	// The schema allows a weight with drain or ready: it is ignored.
	plan, err = ParseReply(`{"actions":[{"reason":"r","action":"drain","backend":"app","server":"s1","weight":3}]}`)
	if err != nil || len(plan) != 1 || plan[0].Kind != agent.Drain || plan[0].Weight != 0 {
		t.Fatalf("weight with drain: %+v %v", plan, err)
	}
	for _, bad := range []string{`{}`, `[]`, `{"actions":[]} {"actions":[]}`, `{"actions":[{"action":"set_weight","backend":"app","server":"s1","reason":"r"}]}`} {
		if _, err := ParseReply(bad); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

// rowsInput is a prompt's input with a candidate awaiting confirmation,
// the agent's drained server refused last step, maxconn, and history.
func rowsInput() Input {
	now := time.Unix(1000, 0)
	obs := grey(now)
	for i := range obs.Backends[0].Servers {
		s := &obs.Backends[0].Servers[i]
		s.MaxConn, s.RespTimeMs = 20, 40
		s.Recent = window.Stats{Requests: 100, Err5xx: 0, Seconds: 10, RatePerSec: 10, P50Ms: 9}
	}
	d := &obs.Backends[0].Servers[0]
	d.State.AdminState, d.Owner = haproxy.AdminForcedDrain, agent.OwnerAgent
	d.Changed = &agent.Change{Phase: agent.PhaseDrained, At: now.Add(-25 * time.Second)}
	obs.Refused = map[agent.Key]string{{Backend: "app", Server: "srv1"}: "a drained server comes back only after a clean probe burst"}
	// srv4's reasons as the LLM policy writes them from the rules'
	// sequential test (agent/policy/llm's candidates.go)
	srv4 := agent.Key{Backend: "app", Server: "srv4"}
	return Input{Obs: obs, Confirm: 2,
		Candidates: map[agent.Key]string{srv4: "errors: CUSUM past 12.8 of the rules' h 19.7: 2.07% (24/1160) over its evidence's 58 checks, judged against 0.500%, degraded from 1.00%"},
		Brief:      map[agent.Key]string{srv4: "errors S>=0.65h 2.07% over 58 checks p0 0.50% deg 1.00%"},
		Pending:    map[agent.Key]int{{Backend: "app", Server: "srv4"}: 1}, History: []string{"step 3: drain app/srv2: refused: floor"}, DrainsPer: 3, MaxShown: 12}
}

// The prompt gives each server its peers' rate and its ratio, why it is a
// candidate, a recent figure, its load against maxconn and its configured
// weight, the agent's state, and the model's recent decisions.
func TestPromptRows(t *testing.T) {
	got := Render(rowsInput())
	for _, want := range []string{
		Header,
		"backend app: 6 servers, 5 serving (keep at least 3), at most 2 drains a step, 3600 requests, 5xx 0.19%",
		"srv4 ready none 1 1 10.0 2 600 7 1.17 0.00 inf 100 0.00 9 12 candidate: errors: CUSUM past 12.8 of the rules' h 19.7: 2.07% (24/1160) over its evidence's 58 checks, judged against 0.500%, degraded from 1.00%; your proposal awaits confirmation (1 of 2)",
		"srv1 drain agent 1 1 10.0 2 600 0 0.00 0.23 0.0 100 0.00 9 12 drained by the agent 25s ago; no traffic while drained: a ready only asks for probes; refused last step:",
		"your recent decisions, oldest first:\n- step 3: drain app/srv2: refused: floor",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("prompt lacks %q:\n%s", want, got)
		}
	}
	rows := ollamafake.ParsePrompt(ollamafake.Request{Messages: []ollamafake.Message{{Role: "user", Content: got}}})
	if len(rows) != 6 || rows[0].Server != "srv4" || rows[0].Candidate == "" || rows[1].Owner != "agent" {
		t.Fatalf("an emulated model reads %+v", rows)
	}
}

// In a large backend, only the flagged servers and the agent's are listed
// in full; the rest are summed.
func TestPromptSumsQuietServers(t *testing.T) {
	obs := fleet(time.Unix(1000, 0), 9)
	in := Input{Obs: obs, Candidates: map[agent.Key]string{{Backend: "app", Server: "srv5"}: "latency"}, MaxShown: 4}
	p := Render(in)
	if !strings.Contains(p, "srv5 ready") || !strings.Contains(p, "(5 more servers, none flagged") {
		t.Fatalf("prompt:\n%s", p)
	}
	in.Candidates = nil
	if p := Render(in); strings.Contains(p, "backend app") {
		t.Fatalf("a backend with nothing flagged was sent:\n%s", p)
	}
}

func TestRefsResolve(t *testing.T) {
	in := rowsInput()
	in.Style = Numbered
	r := in.Refs() // s1 srv4 (the candidate), s2 srv1 (the agent's), then s3, s4
	tests := []struct {
		name     string
		backend  string
		server   string
		want     agent.Key
		rejected bool
	}{
		{name: "the candidate", backend: "b1", server: "s1", want: agent.Key{Backend: "app", Server: "srv4"}},
		{name: "the agent's", backend: "b1", server: "s2", want: agent.Key{Backend: "app", Server: "srv1"}},
		{name: "a row the prompt did not list", backend: "b1", server: "s5", rejected: true},
		{name: "a backend the prompt did not show", backend: "b2", server: "s1", rejected: true},
		{name: "a server's own name", backend: "app", server: "srv4", rejected: true},
		{name: "the placeholder", backend: "-", server: "-", rejected: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Resolve(agent.Plan{{Kind: agent.Drain, Backend: tc.backend, Server: tc.server, Reason: "model: r"}})
			if tc.rejected {
				if !errors.Is(err, ErrUnknownRef) || got != nil {
					t.Fatalf("resolved to %v, %v", got, err)
				}
				return
			}
			if err != nil || len(got) != 1 || got[0].Key() != tc.want || got[0].Kind != agent.Drain || got[0].Reason != "model: r" {
				t.Fatalf("resolved to %v, %v", got, err)
			}
		})
	}
}

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// The compact and numbered prompts of TestPromptRows' situation, as
// golden files: the rows that decide, notes in a few words, the history,
// and in the numbered form each row's and backend's reference.
func TestCompactPromptGolden(t *testing.T) {
	for _, style := range []Style{Compact, Numbered} {
		t.Run(string(style), func(t *testing.T) {
			in := rowsInput()
			in.Style = style
			got := Render(in)
			path := filepath.Join("testdata", "prompt-"+string(style)+".golden")
			if *update {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (go test ./agent/policy/llm/prompt -run CompactPromptGolden -update writes it)", err)
			}
			if got != string(want) {
				t.Errorf("%s prompt:\n%s\nwant:\n%s", style, got, want)
			}
		})
	}
}

// Over every calibration step, the compact prompt names each server the
// full one flags or the agent holds, shows at most CompactShown unflagged
// rows a backend, and is at most half as long as the full one with its
// system
func TestCompactPromptKeepsWhatDecides(t *testing.T) {
	var full, compact int
	for _, seq := range fixtures.Sequences(time.Unix(5000, 0)) {
		for i, st := range seq.Steps {
			cands := map[agent.Key]string{}
			for id := range st.Expected {
				cands[id.Server] = "errors"
			}
			in := Input{Obs: st.Obs, Candidates: cands, MaxShown: 12, Only: map[string]bool{}}
			for _, b := range st.Obs.Backends {
				in.Only[b.Name] = true
			}
			f := Render(in)
			in.Style = Compact
			c := Render(in)
			full += len(DefaultSystemPrompt) + len(f)
			compact += len(CompactSystemPrompt) + len(c)
			for _, b := range st.Obs.Backends {
				rows := 0
				for _, s := range b.Servers {
					_, flagged := cands[s.Key()]
					shown := strings.Contains(c, "\n"+s.Server+" ")
					if (flagged || s.Owner == agent.OwnerAgent) && !shown {
						t.Errorf("%s, step %d: %s/%s missing from the compact prompt:\n%s", seq.Name, i+1, b.Name, s.Server, c)
					}
					if shown && !flagged && s.Owner != agent.OwnerAgent {
						rows++
					}
				}
				if rows > CompactShown {
					t.Errorf("%s, step %d: %d unflagged rows of %s shown", seq.Name, i+1, rows, b.Name)
				}
			}
		}
	}
	t.Logf("calibration's prompts with their system prompt: full %d bytes, compact %d (%.0f%%)", full, compact, 100*float64(compact)/float64(full))
	if 2*compact > full {
		t.Errorf("compact prompts are %d bytes against the full ones' %d: want at most half", compact, full)
	}
}
