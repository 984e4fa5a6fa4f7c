package loop

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lab/fakes"
)

// A reload that the stats path reports (Wake) between two ticks is a
// step at once: the drain the new process lost goes back then, in that
// step, not at the next tick. Driven by the fake clock: s2 is found at
// 1 s and drained by a triggered step; HAProxy reloads at 3 s.
func TestWakeReappliesALostDrainAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name     string
		wake     bool
		wantBack time.Duration // when s2's drain goes back
	}{
		{"reload reported: back at 3 s", true, 3 * time.Second},
		{"no report: back at the next tick", false, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := fakes.NewRuntime("s1", "s2", "s3", "s4")
			l, clk, _, audit := newLoop(rt)
			start := clk.Now()
			reloaded := false
			pol := &evidenced{clock: clk, find: func(now time.Time) []string {
				at := now.Sub(start)
				return when(at >= time.Second && at < 2*time.Second, "s2")
			}}
			l.Policy, l.Interval, l.EvidenceCheck = agent.Policy{Decider: pol, Evidence: pol.Evidence}, 10*time.Second, time.Second
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pol.stop = func(now time.Time) {
				at := now.Sub(start)
				if at >= 3*time.Second && !reloaded {
					reloaded = true
					rt.Reload()
					if tc.wake {
						l.Wake("a new HAProxy process")
					}
				}
				if at >= 12*time.Second {
					cancel()
				}
			}
			if err := l.Run(ctx); err != nil {
				t.Fatal(err)
			}
			var drains []time.Duration
			var woken []string
			for _, r := range records(t, audit) {
				for _, c := range r.Commands {
					if c.Command == "set server app/s2 state drain" && c.Error == "" {
						drains = append(drains, r.Time.Sub(start))
					}
				}
				if r.Woken != "" {
					woken = append(woken, r.Woken)
				}
			}
			if len(drains) != 2 || drains[0] != time.Second || drains[1] != tc.wantBack {
				t.Errorf("s2 drained at %v, want at 1s and %v", drains, tc.wantBack)
			}
			if tc.wake != (len(woken) == 1) || (tc.wake && !strings.Contains(woken[0], "new HAProxy process")) {
				t.Errorf("woken steps: %q", woken)
			}
		})
	}
}

// Wake ends a real sleep: with an hour to the next tick, the woken step
// runs as soon as Wake is called, and Run still ends with its context.
func TestWakeEndsTheSleep(t *testing.T) {
	rt := fakes.NewRuntime("s1", "s2")
	l, _, _, _ := newLoop(rt)
	l.Clock, l.Interval = agent.RealClock{}, time.Hour
	steps := make(chan agent.Record, 8)
	l.Audit = stepWriter(steps)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }() // owned here: cancel ends it, done says so
	waitStep := func(what string) agent.Record {
		t.Helper()
		select {
		case r := <-steps:
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("no step %s", what)
			return agent.Record{}
		}
	}
	if r := waitStep("at the start"); r.Woken != "" {
		t.Fatalf("the first step is woken: %q", r.Woken)
	}
	l.Wake("a new HAProxy process")
	if r := waitStep("after Wake"); r.Woken != "a new HAProxy process" {
		t.Fatalf("step after Wake: woken %q", r.Woken)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// stepWriter is an audit writer that hands each step's record on.
type stepWriter chan agent.Record

func (w stepWriter) Write(p []byte) (int, error) {
	var r agent.Record
	if err := json.Unmarshal(p, &r); err == nil {
		w <- r
	}
	return len(p), nil
}
