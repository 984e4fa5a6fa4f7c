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
