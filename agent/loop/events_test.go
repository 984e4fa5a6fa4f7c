package loop

import (
	"context"
	"reflect"
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lab/fakes"
)

type collected []agent.Event

func (c *collected) Emit(e agent.Event) { *c = append(*c, e) }

func (c *collected) types() []agent.EventType {
	var out []agent.EventType
	for _, e := range *c {
		out = append(out, e.Type)
	}
	return out
}

// The loop writes each action, refusal and would-action once, a refusal
// or a would-action repeated step after step only the first time, each
// stamped with the schema, the host and the version.
func TestLoopEvents(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		mode agent.Mode
		want []agent.EventType
	}{
		// Step 1: s2 drained, s1 refused (drain cap). Step 2: s2's drain
		// refused anew (already drained), s1 drained. Step 3: s2's refusal
		// repeats (not written), s1's is new (already drained).
		{"enforce", agent.ModeEnforce, []agent.EventType{agent.EventStart, agent.EventDrain, agent.EventRefused, agent.EventRefused, agent.EventDrain, agent.EventRefused}},
		// Every step: s2 would-drained, s1 refused (drain cap), each once.
		{"observe", agent.ModeObserve, []agent.EventType{agent.EventStart, agent.EventWould, agent.EventRefused}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
			l, _, pol, _ := newLoop(rt)
			var c collected
			l.Mode, l.Events, l.Identity = tc.mode, &c, agent.Identity{Host: "lb1", Version: "v1"}
			l.Start()
			// The same plan three steps running.
			p := agent.Plan{drain("s2"), drain("s1")}
			pol.plans = []agent.Plan{p, p, p}
			for range 3 {
				l.Step(ctx)
			}
			got := c.types()
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("events %v, want %v (%+v)", c.types(), tc.want, c)
			}
			for _, e := range c {
				if e.Schema != agent.EventSchema || e.Host != "lb1" || e.Version != "v1" || e.Mode != tc.mode || e.Time.IsZero() {
					t.Fatalf("event not stamped: %+v", e)
				}
			}
			if tc.mode == agent.ModeObserve && (c[1].Detail["would"] != "drain" || c[1].Reason != "observe mode") {
				t.Fatalf("would event %+v", c[1])
			}
		})
	}
}

// A policy whose report names a fallback: one event for a run of them,
// another when a new run starts.
func TestFallbackEvents(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2", "s3")
	l, _, _, _ := newLoop(rt)
	var c collected
	l.Events = &c
	reports := []any{
		map[string]any{"called": true},
		map[string]any{"fallback": "the model call overran its deadline"},
		map[string]any{"fallback": "the model call overran its deadline"},
		map[string]any{"called": true},
		map[string]any{"fallback": "the model server does not answer"},
		"not an object",
	}
	i := 0
	l.Policy.Report = func() any { r := reports[i]; i++; return r }
	for range reports {
		l.Step(context.Background())
	}
	var reasons []string
	for _, e := range c {
		if e.Type == agent.EventFallback {
			reasons = append(reasons, e.Reason)
		}
	}
	want := []string{"the model call overran its deadline", "the model server does not answer"}
	if !reflect.DeepEqual(reasons, want) {
		t.Fatalf("fallback events %q, want %q", reasons, want)
	}
}

// An action's event carries the figures of the test behind it as the
// policy set them, and the evidence's p-value is the test's own: never
// read back out of the reason's words (a p= in a reason that no test
// stands behind gives none).
func TestEventsCarryTheTestsFigures(t *testing.T) {
	p := 3.1e-24
	tests := []struct {
		name  string
		test  *agent.TestFigures
		want  *float64 // the evidence's p-value
		words string
	}{
		{"sequential: statistic and threshold, no p-value",
			&agent.TestFigures{Name: "sequential", Statistic: 25.5, Threshold: 19.7, Rate: 0.05, Baseline: 0.005}, nil, "5xx CUSUM at h 19.7"},
		{"windowed: its p-value", &agent.TestFigures{Name: "windowed", Statistic: p, Threshold: 0.01 / 4, PValue: &p, Rate: 0.05, Baseline: 0.0003}, &p, "5xx 5.00% vs peers 0.03%"},
		{"a p= in the words alone is no p-value", nil, nil, "the model says p=0.001"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
			l, _, pol, _ := newLoop(rt)
			var c collected
			l.Events = &c
			pol.plans = []agent.Plan{{{Kind: agent.Drain, Backend: "app", Server: "s2", Reason: tc.words, Test: tc.test}}}
			l.Step(context.Background())
			if len(c) != 1 || c[0].Type != agent.EventDrain || c[0].Evidence == nil {
				t.Fatalf("events %+v, want one drain with its evidence", c)
			}
			e := c[0]
			if !reflect.DeepEqual(e.Action.Test, tc.test) {
				t.Errorf("the action's figures %+v, want %+v", e.Action.Test, tc.test)
			}
			if !reflect.DeepEqual(e.Evidence.PValue, tc.want) {
				t.Errorf("the evidence's p-value %v, want %v", e.Evidence.PValue, tc.want)
			}
		})
	}
}
