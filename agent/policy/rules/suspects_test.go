package rules

import (
	"strings"
	"testing"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lib/window"
)

// suspectBackend is one backend "app" of servers given as name, requests
// and 5xx.
func suspectBackend(servers ...struct {
	name string
	n, x uint64
}) agent.BackendView {
	b := agent.BackendView{Name: "app"}
	for _, s := range servers {
		b.Servers = append(b.Servers, agent.ServerView{Backend: "app", Server: s.name, Owner: agent.OwnerNone,
			State:  haproxy.ServerState{Backend: "app", Server: s.name, OpState: haproxy.OpRunning, Weight: 1, Initial: 1},
			Window: window.Stats{Backend: "app", Server: s.name, Requests: s.n, Err5xx: s.x, P50Ms: 9, P95Ms: 12}})
	}
	return b
}

type row = struct {
	name string
	n, x uint64
}

// The loose test follows the operator's settings, and at the defaults is
// the one the LLM policy used before it did.
func TestLoose(t *testing.T) {
	withRatio := DefaultConfig()
	withRatio.MinRatio = 5
	withVolume := DefaultConfig()
	withVolume.MinRequests, withVolume.MinErrors = 400, 20
	looseAlpha := DefaultConfig()
	looseAlpha.Alpha = 0.1
	for _, tc := range []struct {
		name string
		in   Config
		want Config
	}{
		{"the defaults: the policy's old literals", DefaultConfig(), Config{Alpha: 0.05, MinRequests: 50, MinErrors: 3, MinRatio: 1.5}},
		{"--rules-min-ratio 5", withRatio, Config{Alpha: 0.05, MinRequests: 50, MinErrors: 3, MinRatio: 3}},
		{"--rules-min-requests 400, min errors 20", withVolume, Config{Alpha: 0.05, MinRequests: 200, MinErrors: 10, MinRatio: 1.5}},
		{"an alpha looser than LooseAlpha stays the rules'", looseAlpha, Config{Alpha: 0.1, MinRequests: 50, MinErrors: 3, MinRatio: 1.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.in.Loose(); got != tc.want {
				t.Fatalf("Loose() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Which servers are suspects, and which pass the fleet-wide check,
// depends on the operator's ratio and volumes.
func TestSuspectsFollowTheOperatorsRules(t *testing.T) {
	// s3 fails 3% against its peers' 1%.
	threeTimes := suspectBackend(row{"s1", 1000, 10}, row{"s2", 1000, 10}, row{"s3", 1000, 30}, row{"s4", 1000, 10}, row{"s5", 1000, 10})
	// q3 fails 10 of 80: the loose test judges 50 requests at the
	// defaults, and 150 with --rules-min-requests 300.
	quiet := suspectBackend(row{"q1", 80, 0}, row{"q2", 80, 0}, row{"q3", 80, 10}, row{"q4", 80, 0})
	ratio5, requests300 := DefaultConfig(), DefaultConfig()
	ratio5.MinRatio = 5
	requests300.MinRequests = 300
	for _, tc := range []struct {
		name      string
		cfg       Config
		b         agent.BackendView
		server    string
		suspect   bool
		fleetWide bool // FleetWide refuses it
	}{
		{"3x its peers at the default ratio", DefaultConfig(), threeTimes, "s3", true, false},
		{"3x its peers under --rules-min-ratio 5: a suspect (loose ratio 3), refused by FleetWide", ratio5, threeTimes, "s3", true, true},
		{"80 requests at the defaults", DefaultConfig(), quiet, "q3", true, false},
		{"80 requests under --rules-min-requests 300", requests300, quiet, "q3", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := agent.Key{Backend: "app", Server: tc.server}
			got, flagged := tc.cfg.Suspects(agent.Observation{Backends: []agent.BackendView{tc.b}}, nil)[k]
			if flagged != tc.suspect {
				t.Fatalf("suspect %v (%+v), want %v", flagged, got, tc.suspect)
			}
			if flagged && !got.Only(SignalErrors) {
				t.Fatalf("signals %v, want errors alone", got.Signals)
			}
			_, s := (&agent.Observation{Backends: []agent.BackendView{tc.b}}).Find("app", tc.server)
			why := tc.cfg.FleetWide(&tc.b, s, nil)
			if (why != "") != tc.fleetWide {
				t.Fatalf("FleetWide = %q, want refused %v", why, tc.fleetWide)
			}
			if why != "" && !strings.Contains(why, "under 5x theirs") {
				t.Fatalf("FleetWide does not name the operator's ratio: %q", why)
			}
		})
	}
}

// A server the rules act on this step is theirs, not a suspect.
func TestSuspectsLeaveTheRulesTheirOwn(t *testing.T) {
	b := suspectBackend(row{"s1", 1000, 10}, row{"s2", 1000, 10}, row{"s3", 1000, 30}, row{"s4", 1000, 10})
	k := agent.Key{Backend: "app", Server: "s3"}
	obs := agent.Observation{Backends: []agent.BackendView{b}}
	if _, ok := DefaultConfig().Suspects(obs, nil)[k]; !ok {
		t.Fatal("s3 is no suspect to start with")
	}
	if got := DefaultConfig().Suspects(obs, map[agent.Key]bool{k: true}); len(got) != 0 {
		t.Fatalf("suspects beside the rules' own drain: %v", got)
	}
}
