package llm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/policy/llm/calibrate/fixtures"
	"github.com/hapilot/hapilot/agent/policy/rules"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
	"github.com/rs/zerolog"
)

// fleetWideSeed3 is the benchmark's fleetwide scenario (every server
// fails 3%) at N=3, seed 3, 27 s in: the backends' seeded draws give
// srv2 48 errors to its peers' 24 and 36, and the loose test, which
// compares srv2 with its better peer alone, flags it (p=0.0032). The
// seventh attempt's model drained srv2 there.
func fleetWideSeed3() []fixtures.Server {
	return []fixtures.Server{{Name: "srv1", Req: 1350, E5: 24}, {Name: "srv2", Req: 1350, E5: 48}, {Name: "srv3", Req: 1350, E5: 36}}
}

func TestFleetWide(t *testing.T) {
	now := time.Unix(1000, 0)
	twoOfFive := []fixtures.Server{{Name: "s1", Req: 1000}, {Name: "s2", Req: 1000, E5: 30}, {Name: "s3", Req: 1000}, {Name: "s4", Req: 1000, E5: 30}, {Name: "s5", Req: 1000}}
	drainedPeer := []fixtures.Server{{Name: "d1", Req: 1350, E5: 30}, {Name: "d2", Req: 1350, E5: 48}, {Name: "d3", DrainedAgo: 20 * time.Second}}
	secondFault := []fixtures.Server{{Name: "x1", Req: 1000, E5: 1}, {Name: "x2", Req: 1000, E5: 25}, {Name: "x3", Req: 1000, E5: 40}}
	onBackground := []fixtures.Server{{Name: "b1", Req: 1000, E5: 30}, {Name: "b2", Req: 1000, E5: 100}, {Name: "b3", Req: 1000, E5: 30}}
	for _, tc := range []struct {
		name    string
		servers []fixtures.Server
		server  string
		refused bool
	}{
		{"every server fails alike: the better peer was a low draw", fleetWideSeed3(), "srv2", true},
		{"the calibration's grey-zone fault among healthy peers", greyZone(), "web-5", false},
		{"two faults of five: each is four times the rest", twoOfFive, "s2", false},
		{"the other of the two", twoOfFive, "s4", false},
		{"a fault on top of a fleet-wide 3%", onBackground, "b2", false},
		{"a second fault the loose test flags is set aside, not pooled", secondFault, "x2", false},
		{"a drained peer's empty window is not a peer", drainedPeer, "d2", true},
		{"nobody with traffic to compare with", []fixtures.Server{{Name: "q1", Req: 100, E5: 5}, {Name: "q2"}}, "q1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := New(nil, agent.Policy{}, rules.DefaultConfig(), DefaultConfig(), zerolog.Nop())
			defer p.Close()
			b := fixtures.Backend(now, "app", tc.servers)
			_, s := (&agent.Observation{Backends: []agent.BackendView{b}}).Find("app", tc.server)
			why := p.rules.FleetWide(&b, s, looseFlags(p, b))
			if (why != "") != tc.refused {
				t.Fatalf("fleetWide(%s) = %q, want refused %v", tc.server, why, tc.refused)
			}
		})
	}
}

// looseFlags is what supported sets apart when the floor does nothing:
// the servers the loose test flags.
func looseFlags(p *Policy, b agent.BackendView) map[agent.Key]bool {
	out := map[agent.Key]bool{}
	for _, f := range rules.New(p.rules.Loose()).Test(b) {
		if f.Outlier {
			out[agent.Key{Backend: b.Name, Server: f.Server}] = true
		}
	}
	return out
}

func greyZone() []fixtures.Server {
	s := fixtures.Healthy("web-", 7, 100)
	s[4] = fixtures.Server{Name: "web-5", Weight: 100, Req: 600, E5: 6}
	return s
}

// The check applies to drains and cuts of a server flagged for its errors
// alone: latency and overload are not the errors' to judge, and an
// unflagged server is never drained on the model's word.
func TestSupported(t *testing.T) {
	now := time.Unix(1000, 0)
	obs := agent.Observation{Time: now, Backends: []agent.BackendView{fixtures.Backend(now, "app", fleetWideSeed3())}}
	srv2 := agent.Key{Backend: "app", Server: "srv2"}
	errs := rules.Suspect{Why: "errors", Signals: []rules.Signal{rules.SignalErrors}}
	slowToo := rules.Suspect{Why: "errors", Signals: []rules.Signal{rules.SignalErrors, rules.SignalLatency}}
	drain := agent.Action{Kind: agent.Drain, Backend: "app", Server: "srv2"}
	cut := agent.Action{Kind: agent.SetWeight, Backend: "app", Server: "srv2", Weight: 0}
	raise := agent.Action{Kind: agent.SetWeight, Backend: "app", Server: "srv2", Weight: 1}
	// With srv3 (36 errors) out of its peers, srv2's 48 are twice srv1's 24.
	floorDrainsSrv3 := agent.Plan{{Kind: agent.Drain, Backend: "app", Server: "srv3"}}
	for _, tc := range []struct {
		name   string
		cands  map[agent.Key]rules.Suspect
		floor  agent.Plan
		action agent.Action
		kept   bool
		why    string
	}{
		{"not flagged", nil, nil, drain, false, "the windows do not flag it"},
		{"flagged for errors alike the rest", map[agent.Key]rules.Suspect{srv2: errs}, nil, drain, false, "the backend fails alike"},
		{"a cut is a drain's kin", map[agent.Key]rules.Suspect{srv2: errs}, nil, cut, false, "the backend fails alike"},
		{"a peer the floor drains is not a peer", map[agent.Key]rules.Suspect{srv2: errs}, floorDrainsSrv3, drain, true, ""},
		{"slow as well: latency is not the errors' to judge", map[agent.Key]rules.Suspect{srv2: slowToo}, nil, drain, true, ""},
		{"no cut: nothing to support", nil, nil, raise, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := New(nil, agent.Policy{}, rules.DefaultConfig(), DefaultConfig(), zerolog.Nop())
			defer p.Close()
			got := p.supported(obs, agent.Plan{tc.action}, tc.cands, tc.floor)
			if (len(got) == 1) != tc.kept {
				t.Fatalf("supported kept %v, want kept %v (unsupported %q)", got, tc.kept, p.report.Unsupported)
			}
			if !tc.kept && (len(p.report.Unsupported) != 1 || !strings.Contains(p.report.Unsupported[0], tc.why)) {
				t.Fatalf("unsupported %q, want one saying %q", p.report.Unsupported, tc.why)
			}
		})
	}
}

// A model that drains whatever it sees, on the benchmark's fleet-wide
// window, drains nothing. The windowed loose test flagged srv2 there;
// the rules' sequential test, which finds the candidates now, flags no
// server of a backend that fails alike (its peer check): asked anyway
// (the gate always), the model is shown no server of it to drain.
func TestFleetWideDrainRefused(t *testing.T) {
	respond, err := ollamafake.Emulation("drain-all", 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := newPolicy(t, respond, func(c *Config) { c.Gate = GateAlways })
	now := time.Unix(1000, 0)
	obs := agent.Observation{Time: now, Cycle: 1, Backends: []agent.BackendView{fixtures.Backend(now, "app", fleetWideSeed3())}}
	if got := steps(t, p, obs, 3); len(got) != 0 {
		t.Fatalf("drained on a fleet-wide failure: %v", got)
	}
	r := p.Report().(Report)
	if !r.Called || len(r.Candidates) != 0 || len(r.Floor) != 0 {
		t.Fatalf("the sequential test should flag no server and the model be asked: %+v", r)
	}
	if len(r.Proposed) != 0 || len(r.Unsupported) != 0 {
		t.Fatalf("the model had a server of the backend to drain: %+v", r)
	}
}

// On simulated windows (seeded binomial draws, 50 requests a second per
// server, cumulative over 30 one-second steps as the benchmark's 60 s
// windows are), the check takes away most of the loose test's flags of
// a healthy server under a fleet-wide failure, two steps running (what
// confirmation needs), and none of a faulty server's: each is flagged
// at the same step as without it.
func TestFleetWideOnSimulatedWindows(t *testing.T) {
	const runs, steps = 300, 30
	p := New(nil, agent.Policy{}, rules.DefaultConfig(), DefaultConfig(), zerolog.Nop())
	defer p.Close()
	type scenario struct {
		name   string
		n      int
		perSec int
		rate   func(i int) float64
	}
	third := func(hi, lo float64) func(int) float64 {
		return func(i int) float64 {
			if i%3 == 2 {
				return hi
			}
			return lo
		}
	}
	for _, sc := range []scenario{
		{"fleetwide", 3, 50, third(0.03, 0.03)},
		{"fleetwide", 9, 50, third(0.03, 0.03)},
		{"noise", 9, 50, third(0.05, 0.002)},
		{"low-traffic", 9, 5, third(0.05, 0)},
		{"two-faults", 5, 50, func(i int) float64 { return []float64{0, 0.05, 0, 0.05, 0}[i] }},
	} {
		t.Run(fmt.Sprintf("%s N=%d", sc.name, sc.n), func(t *testing.T) {
			var healthyLoose, healthyChecked, faultyLater, faultyFound, delay int
			for r := range runs {
				rng := rand.New(rand.NewPCG(uint64(r), 23))
				servers := make([]fixtures.Server, sc.n)
				for i := range servers {
					servers[i].Name = fmt.Sprintf("srv%d", i+1)
				}
				flagged := [2]map[string]int{{}, {}} // consecutive flags: loose, checked
				first := [2]map[string]int{{}, {}}   // step of the second flag running
				for step := 1; step <= steps; step++ {
					for i := range servers {
						for range sc.perSec {
							servers[i].Req++
							if rng.Float64() < sc.rate(i) {
								servers[i].E5++
							}
						}
					}
					b := fixtures.Backend(time.Unix(0, 0), "app", servers)
					apart := looseFlags(p, b)
					loose := map[string]bool{}
					checked := map[string]bool{}
					for k := range apart {
						loose[k.Server] = true
						_, s := (&agent.Observation{Backends: []agent.BackendView{b}}).Find("app", k.Server)
						checked[k.Server] = p.rules.FleetWide(&b, s, apart) == ""
					}
					for v, set := range []map[string]bool{loose, checked} {
						for _, s := range servers {
							if !set[s.Name] {
								flagged[v][s.Name] = 0
								continue
							}
							if flagged[v][s.Name]++; flagged[v][s.Name] == 2 && first[v][s.Name] == 0 {
								first[v][s.Name] = step
							}
						}
					}
				}
				least := sc.rate(0)
				for i := range servers {
					least = min(least, sc.rate(i))
				}
				for i, s := range servers {
					faulty := sc.rate(i) > least
					switch {
					case !faulty:
						if first[0][s.Name] > 0 {
							healthyLoose++
						}
						if first[1][s.Name] > 0 {
							healthyChecked++
						}
					case first[0][s.Name] > 0:
						faultyFound++
						if first[1][s.Name] != first[0][s.Name] {
							faultyLater++
							d := first[1][s.Name] - first[0][s.Name]
							if first[1][s.Name] == 0 {
								d = steps + 1 - first[0][s.Name]
							}
							delay += d
						}
					}
				}
			}
			t.Logf("%d runs: healthy servers flagged twice running %d without the check, %d with it; faulty servers found %d, %d of them later with it, by %d steps in all",
				runs, healthyLoose, healthyChecked, faultyFound, faultyLater, delay)
			if sc.name == "fleetwide" && (healthyLoose == 0 || 2*healthyChecked > healthyLoose) {
				t.Errorf("the check should take away most flags of a healthy server: %d of %d left", healthyChecked, healthyLoose)
			}
			if sc.name != "fleetwide" && (faultyFound == 0 || 100*faultyLater > faultyFound) {
				t.Errorf("the check delayed %d of %d faulty servers' flags", faultyLater, faultyFound)
			}
		})
	}
}

// The check leaves calibration alone: it judges what the model proposes,
// before any check, and every sequence's expected action passes the
// checks (one of them where any one is right: a latency candidate with no
// history of its own may be cut, not drained).
func TestCalibrationsDrainsPassTheFleetWideCheck(t *testing.T) {
	p := New(nil, rules.NewPolicy(rules.DefaultConfig()), rules.DefaultConfig(), DefaultConfig(), zerolog.Nop())
	defer p.Close()
	for _, seq := range fixtures.Sequences(time.Unix(1000, 0)) {
		var tl fixtures.Timeline
		for i, st := range seq.Steps {
			st.Obs = tl.Feed(st.Obs, p.Hooks().Evidence) // as calibration feeds the policy
			cands := p.candidates(context.Background(), st.Obs, nil)
			passed, refused := 0, []string{}
			for k := range st.Expected {
				a := agent.Action{Kind: k.Kind, Backend: k.Server.Backend, Server: k.Server.Server}
				if a.Kind == agent.SetWeight {
					_, s := st.Obs.Find(a.Backend, a.Server)
					a.Weight = s.State.Weight / 2
				}
				p.report = Report{}
				if got := p.supported(st.Obs, agent.Plan{a}, cands, nil); len(got) == 1 {
					passed++
				} else {
					refused = append(refused, fmt.Sprintf("%s refused: %q", k, p.report.Unsupported))
				}
			}
			if want := len(st.Expected); (st.AnyOf && passed == 0 && want > 0) || (!st.AnyOf && passed < want) {
				t.Errorf("%s step %d: %v", seq.Name, i+1, refused)
			}
		}
	}
}
