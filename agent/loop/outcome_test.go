package loop

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lab/fakes"
)

// Each decision says what was done. In observe mode a vetted drain is
// "observed": no "applied" action (nothing was sent), what it would have
// sent under "would_apply"; a refusal has no "applied" either; an applied
// drain is "applied". Zero times (no_drain_until, operator_until) are
// left out of the JSON, not written as 0001-01-01.
func TestDecisionsSayWhatWasDone(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    agent.Mode
		plan    agent.Plan
		want    []agent.Outcome
		has     []string
		hasNot  []string
		servers string // what the view of s2 must not hold
	}{
		{
			name: "observe", mode: agent.ModeObserve, plan: agent.Plan{drain("s2")},
			want:   []agent.Outcome{agent.OutcomeObserved},
			has:    []string{`"outcome":"observed"`, `"would_apply":{"kind":"drain","backend":"app","server":"s2"}`, `"would":"observe mode`},
			hasNot: []string{`"applied"`},
		},
		{
			name: "enforce", mode: agent.ModeEnforce, plan: agent.Plan{drain("s2"), drain("s3")},
			// s3 would leave one of four serving: the floor refuses it.
			want:   []agent.Outcome{agent.OutcomeApplied, agent.OutcomeRefused},
			has:    []string{`"outcome":"applied","proposed":{"kind":"drain","backend":"app","server":"s2"},"accepted":true,"applied":{"kind":"drain","backend":"app","server":"s2"}`, `"outcome":"refused"`},
			hasNot: []string{`"would_apply"`, `"applied":{"kind":""`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
			l, _, pol, _ := newLoop(rt)
			l.Mode = tc.mode
			pol.plans = []agent.Plan{tc.plan}
			l.Step(context.Background())
			st := l.View().Status()
			var got []agent.Outcome
			for _, d := range st.Decisions {
				got = append(got, d.Outcome)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("outcomes %v, want %v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("outcomes %v, want %v", got, tc.want)
				}
			}
			b, err := json.Marshal(st.Decisions)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range tc.has {
				if !strings.Contains(string(b), s) {
					t.Errorf("decisions lack %s:\n%s", s, b)
				}
			}
			for _, s := range tc.hasNot {
				if strings.Contains(string(b), s) {
					t.Errorf("decisions hold %s:\n%s", s, b)
				}
			}
			all, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(all), "0001-01-01") {
				t.Errorf("a zero time in /status:\n%s", all)
			}
		})
	}
}
