package rules

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

func server(name string, n, x uint64) agent.ServerView {
	return agent.ServerView{
		Backend: "app", Server: name,
		State:  haproxy.ServerState{Backend: "app", Server: name, OpState: haproxy.OpRunning, Weight: 1, Initial: 1},
		Window: window.Stats{Backend: "app", Server: name, Requests: n, Err5xx: x},
		Owner:  agent.OwnerNone,
	}
}

// simulate draws each server's 5xx count for n requests at its error rate.
func simulate(rng *rand.Rand, n uint64, rates []float64) agent.BackendView {
	b := agent.BackendView{Name: "app"}
	for i, r := range rates {
		var x uint64
		for j := uint64(0); j < n; j++ {
			if rng.Float64() < r {
				x++
			}
		}
		b.Servers = append(b.Servers, server(fmt.Sprintf("srv%d", i+1), n, x))
	}
	return b
}

// outliers is what the windowed test finds on one window.
func outliers(p *Policy, b agent.BackendView) map[string]bool {
	out := map[string]bool{}
	for _, f := range p.Test(b) {
		if f.Outlier {
			out[f.Server] = true
		}
	}
	return out
}

func drained(t *testing.T, p *Policy, b agent.BackendView) map[string]bool {
	plan, err := p.Decide(context.Background(), agent.Observation{Backends: []agent.BackendView{b}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, a := range plan {
		if a.Kind != agent.Drain {
			t.Fatalf("unexpected action %+v", a)
		}
		out[a.Server] = true
	}
	return out
}

// TestScenarios draws many random windows per scenario for the windowed
// test (the LLM policy's checks run it): detection must be near certain where a server fails 5%, and false drains absent where no
// server differs from its peers.
func TestScenarios(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	p := New(DefaultConfig())
	tests := []struct {
		name      string
		perServer uint64 // requests per server in the window
		rates     []float64
		faulty    map[string]bool
		minRecall float64
		trials    int
	}{
		// 300 req/s over 6 servers is 50 req/s each: 10 s of window.
		{"one 5% among 6 healthy", 500, []float64{0, 0, 0.05, 0, 0, 0}, map[string]bool{"srv3": true}, 0.99, 200},
		{"two 5% among 6", 1000, []float64{0, 0, 0.05, 0, 0, 0.05}, map[string]bool{"srv3": true, "srv6": true}, 0.95, 200},
		{"5% among 0.2% noise", 3000, []float64{0.002, 0.002, 0.05, 0.002, 0.002, 0.002}, map[string]bool{"srv3": true}, 0.99, 200},
		{"2 servers", 1000, []float64{0, 0.05}, map[string]bool{"srv2": true}, 0.99, 200},
		{"3 servers", 1000, []float64{0.05, 0, 0}, map[string]bool{"srv1": true}, 0.99, 200},
		{"3 servers with noise", 3000, []float64{0.002, 0.002, 0.05}, map[string]bool{"srv3": true}, 0.99, 200},
		{"two 5% among 6, 5 s of data", 250, []float64{0, 0, 0.05, 0, 0, 0.05}, map[string]bool{"srv3": true, "srv6": true}, 0.6, 200},
		{"healthy with 0.2% noise, short window", 300, []float64{0.002, 0.002, 0.002, 0.002, 0.002, 0.002}, nil, 0, 2000},
		{"fleet-wide 3%, short window", 200, []float64{0.03, 0.03, 0.03, 0.03, 0.03, 0.03}, nil, 0, 2000},
		{"fleet-wide 5%, 3 servers", 3000, []float64{0.05, 0.05, 0.05}, nil, 0, 1000},
		{"healthy with 0.2% noise", 3000, []float64{0.002, 0.002, 0.002, 0.002, 0.002, 0.002}, nil, 0, 1000},
		{"fleet-wide 3%", 3000, []float64{0.03, 0.03, 0.03, 0.03, 0.03, 0.03}, nil, 0, 1000},
		{"fleet-wide 3%, 2 servers", 3000, []float64{0.03, 0.03}, nil, 0, 1000},
		{"fleet-wide 20%, 9 servers", 1000, []float64{.2, .2, .2, .2, .2, .2, .2, .2, .2}, nil, 0, 300},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			found, falseDrains := 0, 0
			for i := 0; i < tc.trials; i++ {
				got := outliers(p, simulate(rng, tc.perServer, tc.rates))
				for s := range got {
					if tc.faulty[s] {
						found++
					} else {
						falseDrains++
					}
				}
			}
			if falseDrains > 0 {
				t.Fatalf("%d healthy servers drained in %d trials", falseDrains, tc.trials)
			}
			if want := tc.minRecall * float64(tc.trials*len(tc.faulty)); float64(found) < want {
				t.Fatalf("found %d faulty of %d", found, tc.trials*len(tc.faulty))
			}
		})
	}
}

func TestMinimumVolume(t *testing.T) {
	p := New(DefaultConfig())
	b := agent.BackendView{Name: "app", Servers: []agent.ServerView{server("a", 50, 10), server("b", 5000, 0)}}
	if got := outliers(p, b); len(got) != 0 {
		t.Fatalf("drained on 50 requests: %v", got)
	}
	b = agent.BackendView{Name: "app", Servers: []agent.ServerView{server("a", 1000, 4), server("b", 5000, 0)}}
	if got := outliers(p, b); len(got) != 0 {
		t.Fatalf("drained on 4 errors: %v", got)
	}
}

func TestOnlyServingServersCount(t *testing.T) {
	p := New(DefaultConfig())
	drainedFaulty := server("c", 2000, 100)
	drainedFaulty.State.AdminState = haproxy.AdminForcedDrain
	// c is already drained: it is neither judged nor a peer, so b (5%)
	// stands out against a alone.
	b := agent.BackendView{Name: "app", Servers: []agent.ServerView{server("a", 2000, 0), server("b", 2000, 100), drainedFaulty}}
	got := outliers(p, b)
	if !got["b"] || got["c"] || len(got) != 1 {
		t.Fatalf("drained %v", got)
	}
}

// TestGolden: testdata/*.json hold an observation; *.golden the plan
// once its windows have come in: ten chunks of a tenth of each, as ten
// seconds of the evidence check bring them to the sequential test.
func TestGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden inputs: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var obs agent.Observation
			dec := json.NewDecoder(strings.NewReader(string(raw)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&obs); err != nil {
				t.Fatal(err)
			}
			p := New(DefaultConfig())
			var plan agent.Plan
			// The window's counts arrive over 20 one-second checks: longer
			// than the minimum duration, so that a sustained fault is one.
			for k := range uint64(21) {
				obs.Time = obs.Time.Add(time.Second)
				for _, b := range obs.Backends {
					for i := range b.Servers {
						w := &b.Servers[i].Window
						w.TotalRequests, w.TotalErr5xx = k*w.Requests/20, k*w.Err5xx/20
					}
				}
				if plan, err = p.Decide(context.Background(), obs); err != nil {
					t.Fatal(err)
				}
			}
			// The loop's check between steps finds what Decide drains.
			var targets, found []string
			for _, a := range plan {
				targets = append(targets, a.Key().String())
			}
			sort.Strings(targets)
			for _, k := range p.Evidence(obs) {
				found = append(found, k.String())
			}
			sort.Strings(found)
			if strings.Join(found, " ") != strings.Join(targets, " ") {
				t.Errorf("Evidence %v, Decide drains %v", found, targets)
			}
			got, _ := json.MarshalIndent(plan, "", "  ")
			got = append(got, '\n')
			golden := strings.TrimSuffix(f, ".json") + ".golden"
			if *update {
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(want) {
				t.Fatalf("plan:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

func slowServer(name string, n uint64, p50 int) agent.ServerView {
	s := server(name, n, 0)
	s.Window.P50Ms = p50
	return s
}

func TestLatencyOutliers(t *testing.T) {
	tests := []struct {
		name    string
		servers []agent.ServerView
		want    string
	}{
		{"20x slower drained", []agent.ServerView{slowServer("srv1", 300, 11), slowServer("srv2", 300, 220), slowServer("srv3", 300, 11)}, "srv2"},
		{"all slow alike: nobody", []agent.ServerView{slowServer("srv1", 300, 220), slowServer("srv2", 300, 230), slowServer("srv3", 300, 210)}, ""},
		{"3x slower: below the ratio", []agent.ServerView{slowServer("srv1", 300, 30), slowServer("srv2", 300, 90), slowServer("srv3", 300, 30)}, ""},
		{"5x but only 40 ms more: below the floor", []agent.ServerView{slowServer("srv1", 300, 10), slowServer("srv2", 300, 50), slowServer("srv3", 300, 10)}, ""},
		{"too few answers to judge", []agent.ServerView{slowServer("srv1", 300, 11), slowServer("srv2", 20, 400), slowServer("srv3", 300, 11)}, ""},
		{"two servers: one peer is enough", []agent.ServerView{slowServer("srv1", 300, 11), slowServer("srv2", 300, 220)}, "srv2"},
		// Two peers whose windows hold only failures with no answer time
		// (median 0) are no peers at 0 ms: srv1, 3× its one timed peer,
		// is not slow. Counted as peers, they made the others' median 0.
		{"peers with no timed answer are no peers", []agent.ServerView{slowServer("srv1", 300, 60), slowServer("srv2", 300, 20), untimed("srv3", 300), untimed("srv4", 300)}, ""},
		// A server all of whose answers came from the stats path has its
		// mean judged by the tail test each check, not its window
		// median here; it still counts among the peers.
		{"the stats path's servers: the tail test's", []agent.ServerView{statsOnlyServer(slowServer("srv1", 300, 11)), statsOnlyServer(slowServer("srv2", 300, 220)), statsOnlyServer(slowServer("srv3", 300, 11))}, ""},
		{"a stats path peer counts", []agent.ServerView{slowServer("srv2", 300, 220), statsOnlyServer(slowServer("srv3", 300, 11))}, "srv2"},
	}
	p := New(DefaultConfig())
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := drained(t, p, agent.BackendView{Name: "app", Servers: tc.servers})
			var names []string
			for s := range got {
				names = append(names, s)
			}
			if strings.Join(names, ",") != tc.want {
				t.Errorf("drained %v, want %q", names, tc.want)
			}
		})
	}
	off := DefaultConfig()
	off.LatencyRatio = 0
	if got := drained(t, New(off), agent.BackendView{Name: "app", Servers: tests[0].servers}); len(got) != 0 {
		t.Errorf("latency off: drained %v", got)
	}
	// With the tail test off, the median test judges the stats path's
	// servers as before.
	tailOff := DefaultConfig()
	tailOff.TailRatio = 0
	stats := agent.BackendView{Name: "app", Servers: []agent.ServerView{statsOnlyServer(slowServer("srv1", 300, 11)), statsOnlyServer(slowServer("srv2", 300, 220)), statsOnlyServer(slowServer("srv3", 300, 11))}}
	if got := drained(t, New(tailOff), stats); !got["srv2"] || len(got) != 1 {
		t.Errorf("tail test off, the stats path: drained %v, want srv2", got)
	}
}

// untimed is a server whose window's requests all have no answer time.
func untimed(name string, n uint64) agent.ServerView {
	s := server(name, n, n)
	s.Window.Untimed = n
	return s
}

// statsOnlyServer makes every answer of s's series the stats path's.
func statsOnlyServer(s agent.ServerView) agent.ServerView {
	s.Window.TotalRequests, s.Window.TotalCounted = s.Window.Requests, s.Window.Requests
	return s
}

// sequentialPlan is Decide's plan for testdata's observation f once its
// windows have come in, as TestGolden feeds them.
func sequentialPlan(t *testing.T, f string) agent.Plan {
	t.Helper()
	raw, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	var obs agent.Observation
	if err := json.Unmarshal(raw, &obs); err != nil {
		t.Fatal(err)
	}
	p := New(DefaultConfig())
	var plan agent.Plan
	// over 20 one-second checks, longer than the minimum duration, as
	// TestGolden feeds it
	for k := range uint64(21) {
		obs.Time = obs.Time.Add(time.Second)
		for _, b := range obs.Backends {
			for i := range b.Servers {
				w := &b.Servers[i].Window
				w.TotalRequests, w.TotalErr5xx = k*w.Requests/20, k*w.Err5xx/20
			}
		}
		if plan, err = p.Decide(context.Background(), obs); err != nil {
			t.Fatal(err)
		}
	}
	return plan
}

// Every action the rules propose carries its test's figures, and they
// are the ones that condemn: the statistic at or past the threshold (a
// p-value under it), the p-value the windowed test's own, the rates the
// counts' shares.
func TestActionsCarryTheirFigures(t *testing.T) {
	cfg := DefaultConfig()
	windowed := func() agent.Plan {
		b := agent.BackendView{Name: "app", Servers: []agent.ServerView{server("srv1", 3000, 1), server("srv2", 3000, 150), server("srv3", 3000, 2), server("srv4", 3000, 0)}}
		plan, err := NewWindowed(cfg).Decide(context.Background(), agent.Observation{Backends: []agent.BackendView{b}})
		if err != nil {
			t.Fatal(err)
		}
		return plan
	}
	slow := func() agent.Plan {
		return planOf(t, New(cfg), agent.BackendView{Name: "app", Servers: []agent.ServerView{slowServer("srv1", 300, 11), slowServer("srv2", 300, 220), slowServer("srv3", 300, 11)}})
	}
	tests := []struct {
		name      string
		plan      func() agent.Plan
		test      string
		threshold float64
		rates     bool
		pValue    bool
	}{
		{"sequential", func() agent.Plan { return sequentialPlan(t, "testdata/two-faulty-of-six.json") }, SequentialTest, cfg.Threshold(), true, false},
		{"windowed", windowed, WindowedTest, cfg.Alpha / 4, true, true},
		{"latency", slow, LatencyTest, cfg.LatencyRatio, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan := tc.plan()
			if len(plan) == 0 {
				t.Fatal("no action")
			}
			for _, a := range plan {
				f := a.Test
				if f == nil || f.Name != tc.test || f.Threshold != tc.threshold {
					t.Fatalf("%s: figures %+v, want the %s test's at threshold %v", a.Server, f, tc.test, tc.threshold)
				}
				condemned := f.Statistic >= f.Threshold
				if tc.pValue {
					condemned = f.Statistic < f.Threshold && f.PValue != nil && *f.PValue == f.Statistic &&
						strings.Contains(a.Reason, fmt.Sprintf("p=%.2g", *f.PValue))
				} else if f.PValue != nil {
					t.Errorf("%s: a p-value %v where the test has none", a.Server, *f.PValue)
				}
				if !condemned {
					t.Errorf("%s: figures %+v do not condemn it", a.Server, f)
				}
				if tc.rates && !(f.Rate > f.Baseline && f.Baseline > 0 && strings.Contains(a.Reason, fmt.Sprintf("%.2f%%", 100*f.Rate))) {
					t.Errorf("%s: rate %v against %v, reason %q", a.Server, f.Rate, f.Baseline, a.Reason)
				}
			}
		})
	}
}

// planOf is Decide's plan for one backend.
func planOf(t *testing.T, p *Policy, b agent.BackendView) agent.Plan {
	t.Helper()
	plan, err := p.Decide(context.Background(), agent.Observation{Backends: []agent.BackendView{b}})
	if err != nil {
		t.Fatal(err)
	}
	return plan
}
