package bench

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hapilot/hapilot/internal/lab/fleet"
)

// Spec is a named scenario of the benchmark: a fleet, the faults injected
// into it over the run, and which servers a perfect policy would have out
// of rotation.
type Spec struct {
	Name  string
	About string // what happens, for reports and the README
	// Expect is what a good policy does here.
	Expect string
	// Servers fixes the fleet size (0: the --servers given).
	Servers int
	// Backends shapes the n servers.
	Backends func(n int) []fleet.BackendConfig
	// Capacity is every server's worker pool and HAProxy maxconn.
	Capacity int
	// RatePerServer is the default offered load, per server.
	RatePerServer float64
	// Events change error rates during the run, at step boundaries.
	Events func(n, steps int) []Event
	// Faulty is the truly faulty set: the servers a fault was ever
	// injected into, against which drains are scored.
	Faulty func(n int) []string
	// EndFaulty is the set that should be out of rotation at the last
	// step; nil means Faulty.
	EndFaulty func(n int) []string
	// HealStep is the step at which the faults heal (transient), 0 if
	// they never do: re-admission is timed from it.
	HealStep func(steps int) int
	// OnsetStep is the step at which the faults begin (paper-late), nil
	// for the first: the time to detect is timed from it.
	OnsetStep func(steps int) int
}

// Event sets a server's error rate from a step on.
type Event struct {
	Step      int
	Server    int // 0-based
	ErrorRate float64
}

// paperServer: about 9 ms plus up to 4 ms, as in the study.
func paperServer(i int) fleet.BackendConfig {
	return fleet.BackendConfig{Latency: 9 * time.Millisecond, Jitter: 4 * time.Millisecond, Seed: uint64(i + 1)}
}

// everyThird is the study's faulty set: index % 3 == 2 (srv3, srv6, srv9).
func everyThird(n int) []int {
	var out []int
	for i := 2; i < n; i += 3 {
		out = append(out, i)
	}
	return out
}

func fleetWith(n int, base func(int) fleet.BackendConfig, rates map[int]float64, others float64) []fleet.BackendConfig {
	out := make([]fleet.BackendConfig, n)
	for i := range out {
		out[i] = base(i)
		out[i].ErrorRate = others
		if r, ok := rates[i]; ok {
			out[i].ErrorRate = r
		}
	}
	return out
}

func rates(idx []int, r float64) map[int]float64 {
	m := map[int]float64{}
	for _, i := range idx {
		m[i] = r
	}
	return m
}

func names(idx []int) []string {
	out := make([]string, len(idx))
	for i, x := range idx {
		out[i] = fleet.ServerName(x)
	}
	return out
}

func none(int) []string { return nil }

// paperFaulty is the study's faulty set by name.
func paperFaulty(n int) []string { return names(everyThird(n)) }

// Scenarios lists every scenario, the study's first.
var Scenarios = []Spec{
	{
		Name:   "paper",
		About:  "the study's: servers with index % 3 == 2 (srv3, srv6, srv9) answer 500 on 5% of requests for the whole run; answers take 9 ms plus up to 4 ms",
		Expect: "drain exactly the faulty servers, early, and keep them out",
		Backends: func(n int) []fleet.BackendConfig {
			return fleetWith(n, paperServer, rates(everyThird(n), 0.05), 0)
		},
		Faulty: paperFaulty,
	},
	{
		Name: "paper-late",
		About: "the paper scenario's faults begin half way through the run, after a steady state: " +
			"the agent's windows are full of healthy traffic when srv3, srv6, srv9 start failing 5%",
		Expect: "drain exactly the faulty servers soon after the onset (the time to detect is timed from it)",
		Backends: func(n int) []fleet.BackendConfig {
			return fleetWith(n, paperServer, nil, 0)
		},
		Events: func(n, steps int) []Event {
			var ev []Event
			for _, i := range everyThird(n) {
				ev = append(ev, Event{Step: steps / 2, Server: i, ErrorRate: 0.05})
			}
			return ev
		},
		Faulty:    paperFaulty,
		OnsetStep: func(steps int) int { return steps / 2 },
	},
	{
		Name:   "noise",
		About:  "the paper scenario, and every healthy server also fails 0.2% of requests",
		Expect: "drain the 5% servers, never one failing at the background 0.2%",
		Backends: func(n int) []fleet.BackendConfig {
			return fleetWith(n, paperServer, rates(everyThird(n), 0.05), 0.002)
		},
		Faulty: paperFaulty,
	},
	{
		Name:   "transient",
		About:  "the paper scenario's faults heal half way through the run",
		Expect: "drain the faulty servers, then bring them back after they heal: nothing drained at the end",
		Backends: func(n int) []fleet.BackendConfig {
			return fleetWith(n, paperServer, rates(everyThird(n), 0.05), 0)
		},
		Events: func(n, steps int) []Event {
			var ev []Event
			for _, i := range everyThird(n) {
				ev = append(ev, Event{Step: steps / 2, Server: i, ErrorRate: 0})
			}
			return ev
		},
		Faulty:    paperFaulty,
		EndFaulty: none,
		HealStep:  func(steps int) int { return steps / 2 },
	},
	{
		Name:  "latency",
		About: "srv2 answers 20 times slower (180 ms plus up to 80 ms), with no errors; the rest as in the paper scenario",
		Expect: "take srv2 out of rotation (the rules policy judges 5xx only and is expected to leave it: " +
			"this scenario shows what a latency-aware policy adds)",
		Backends: func(n int) []fleet.BackendConfig {
			out := fleetWith(n, paperServer, nil, 0)
			out[1].Latency, out[1].Jitter = 180*time.Millisecond, 80*time.Millisecond
			return out
		},
		Faulty: func(int) []string { return []string{fleet.ServerName(1)} },
	},
	{
		Name:   "fleetwide",
		About:  "every server fails 3% of requests: the fault is upstream of them all",
		Expect: "drain nothing: no server is worse than its peers, and draining cannot help",
		Backends: func(n int) []fleet.BackendConfig {
			return fleetWith(n, paperServer, nil, 0.03)
		},
		Faulty: none,
	},
	{
		Name: "flapping",
		About: "the paper scenario's faulty servers fail 5% for 6 steps (60 s at the study's interval), " +
			"then 0% for 6, and so on",
		Expect: "take the flapping servers out and keep them out (each re-admission costs a burst of errors): " +
			"few flips, drained at the end",
		Backends: func(n int) []fleet.BackendConfig {
			return fleetWith(n, paperServer, rates(everyThird(n), 0.05), 0)
		},
		Events: func(n, steps int) []Event {
			var ev []Event
			for s := 6; s < steps; s += 6 {
				r := 0.0
				if (s/6)%2 == 0 {
					r = 0.05
				}
				for _, i := range everyThird(n) {
					ev = append(ev, Event{Step: s, Server: i, ErrorRate: r})
				}
			}
			return ev
		},
		Faulty: paperFaulty,
	},
	{
		Name: "overload",
		About: "capacity is tight: each server serves 4 requests at a time in 40 ms plus up to 8 ms " +
			"(HAProxy maxconn 4), the fleet runs at about 75% of its capacity, and the study's third of the fleet fails 5%: " +
			"draining that third would push the rest past 100%",
		Expect: "cut the faulty servers' load only as far as the others can absorb (a reduced weight, not a drain): " +
			"fewer 5xx without a latency blow-up",
		Capacity:      4,
		RatePerServer: 68,
		Backends: func(n int) []fleet.BackendConfig {
			return fleetWith(n, func(i int) fleet.BackendConfig {
				return fleet.BackendConfig{Latency: 40 * time.Millisecond, Jitter: 8 * time.Millisecond, Seed: uint64(i + 1)}
			}, rates(everyThird(n), 0.05), 0)
		},
		Faulty:    paperFaulty,
		EndFaulty: none,
	},
	{
		Name: "moderate-latency",
		About: "srv2 answers about 3 times slower (27 ms plus up to 12 ms), with no errors: below the rules' " +
			"latency test (a median 5 times its peers' and 50 ms above)",
		Expect: "the grey zone: the rules leave srv2; a policy that judges latency may cut its weight or drain it",
		Backends: func(n int) []fleet.BackendConfig {
			out := fleetWith(n, paperServer, nil, 0)
			out[1].Latency, out[1].Jitter = 27*time.Millisecond, 12*time.Millisecond
			return out
		},
		Faulty: func(int) []string { return []string{fleet.ServerName(1)} },
	},
	{
		Name:          "low-traffic",
		About:         "the paper scenario at 5 requests a second per server: evidence comes ten times slower",
		Expect:        "drain the faulty servers once the evidence is there, never a healthy one on a few unlucky errors",
		RatePerServer: 5,
		Backends: func(n int) []fleet.BackendConfig {
			return fleetWith(n, paperServer, rates(everyThird(n), 0.05), 0)
		},
		Faulty: paperFaulty,
	},
	{
		Name:    "two-faults",
		About:   "five servers, two of them (srv2 and srv4) failing 5%",
		Expect:  "drain both, so that one faulty server does not hide the other",
		Servers: 5,
		Backends: func(n int) []fleet.BackendConfig {
			return fleetWith(n, paperServer, rates([]int{1, 3}, 0.05), 0)
		},
		Faulty: func(int) []string { return []string{"srv2", "srv4"} },
	},
}

// Lookup finds a scenario by name.
func Lookup(name string) (Spec, error) {
	for _, s := range Scenarios {
		if s.Name == name {
			return s, nil
		}
	}
	var all []string
	for _, s := range Scenarios {
		all = append(all, s.Name)
	}
	return Spec{}, fmt.Errorf("unknown scenario %q (want %s)", name, strings.Join(all, ", "))
}

// fleetSize is the fleet's size for a requested n.
func (s Spec) fleetSize(n int) int {
	if s.Servers > 0 {
		return s.Servers
	}
	return n
}

// capacity is every server's pool (and HAProxy maxconn).
func (s Spec) capacity() int {
	if s.Capacity > 0 {
		return s.Capacity
	}
	return 4
}

// defaultRate is the offered load for n servers.
func (s Spec) defaultRate(n int) float64 {
	if s.RatePerServer > 0 {
		return s.RatePerServer * float64(n)
	}
	return 50 * float64(n)
}

// truth is what the metrics score against.
func (s Spec) truth(n int) (faulty, end []string) {
	faulty = s.Faulty(n)
	end = faulty
	if s.EndFaulty != nil {
		end = s.EndFaulty(n)
	}
	sort.Strings(faulty)
	sort.Strings(end)
	return faulty, end
}
