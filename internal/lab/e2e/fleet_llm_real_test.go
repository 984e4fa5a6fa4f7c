//go:build e2e && fleet && modelserver

package e2e

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fleet"
	"github.com/hapilot/hapilot/internal/lab/modelserver"
	"github.com/hapilot/hapilot/internal/lab/nodes"
)

// The LLM policy in a fleet of 3 against the real Ollama, serving a
// random-weight model: only the node that decides the backend asks the
// model (its hapilot_llm_calls_total grows, the followers' stay at 0),
// and the floor's drains reach every node.
func TestRealOllamaFleetAsksTheModelOnlyAtTheDecider(t *testing.T) {
	o := modelserver.OllamaT(t, tinyModel)
	srv := ollamaNative(o)
	c := startCluster(t, nodes.Setup{Servers: paperFleet(0, 0, 0.05, 0, 0, 0, 0, 0, 0), Nodes: 3, Fleet: true, Interval: guardedInterval,
		AgentArgs: append(append([]string{"--policy", "llm"}, srv.args...), "--skip-calibration", "--llm-gate", "always")})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	loadDone := make(chan *fleet.Result, 1)
	go func() { loadDone <- c.Load(ctx, 300, 45*time.Second) }()
	for _, n := range c.Nodes {
		if _, ok := waitStatus(t, n, 20*time.Second, func(st nodes.Status) bool {
			return st.Fleet != nil && !st.Fleet.Alone && len(st.Fleet.Members) == 3
		}); !ok {
			t.Fatalf("%s never saw a fleet of 3", n.Name)
		}
	}
	// Before the fleet forms each node is alone and asks the model
	// itself: the count starts once all three agree on the decider.
	callsOf := func() map[string]float64 {
		out := map[string]float64{}
		for _, n := range c.Nodes {
			_, metrics, err := scrape(n.StatusAddr)
			if err != nil {
				t.Fatal(err)
			}
			v, ok := metric(metrics, "hapilot_llm_calls_total")
			if !ok {
				t.Fatalf("%s: no hapilot_llm_calls_total in /metrics", n.Name)
			}
			out[n.Name] = v
		}
		return out
	}
	// Every backend has one decider, which alone asks the model about it:
	// app, and the lab HAProxy's second backend, its SPOE agents.
	deciders := func() (map[string]string, bool) {
		out, agree := map[string]string{}, true
		for _, n := range c.Nodes {
			st, err := n.Status(ctx)
			if err != nil || st.Fleet == nil {
				return nil, false
			}
			for _, b := range st.Fleet.Backends {
				if d, ok := out[b.Backend]; ok && d != b.Decider {
					agree = false
				}
				out[b.Backend] = b.Decider
			}
		}
		return out, agree && out[fleet.BackendName] != ""
	}
	var decides map[string]string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		d, ok := deciders()
		if ok {
			decides = d
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the nodes never agreed on the deciders: %v", d)
		}
	}
	decider := decides[fleet.BackendName]
	decidesSome := map[string]bool{}
	for _, d := range decides {
		decidesSome[d] = true
	}
	// A call a node began while alone may still be in flight, and it
	// counts when it ends: wait for the nodes that decide nothing to have
	// none.
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		busy := ""
		for _, n := range c.Nodes {
			raw, _, err := scrape(n.StatusAddr)
			var st struct {
				PolicyStatus struct {
					InFlight float64 `json:"call_in_flight_s"`
				} `json:"policy_status"`
			}
			if err != nil || json.Unmarshal(raw, &st) != nil {
				t.Fatalf("%s /status: %v", n.Name, err)
			}
			if !decidesSome[n.Name] && st.PolicyStatus.InFlight > 0 {
				busy = n.Name
			}
		}
		if busy == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s, deciding nothing, still has a model call in flight after 40 s", busy)
		}
	}
	before := callsOf()
	<-loadDone
	after := callsOf()
	calls := map[string]float64{}
	for name := range after {
		calls[name] = after[name] - before[name]
	}
	for _, n := range c.Nodes {
		if !waitDrained(ctx, n, "srv3", 5*time.Second) {
			t.Errorf("%s: srv3 not drained", n.Name)
		}
	}
	t.Logf("against %s: deciders %v, model calls per node once the fleet agreed %v (before %v)", srv.name, decides, calls, before)
	if len(decidesSome) == len(c.Nodes) {
		t.Fatalf("every node decides a backend: the case shows nothing")
	}
	for name, v := range calls {
		switch {
		case name == decider && v == 0:
			t.Errorf("the decider of %s, %s, never asked the model", fleet.BackendName, name)
		case !decidesSome[name] && v > 0:
			t.Errorf("%s decides no backend and asked the model %v times", name, v)
		}
	}
}
