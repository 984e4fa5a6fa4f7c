//go:build e2e

package e2e

import (
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// nineServers is the paper's fleet at N=9: every third server fails 5% of
// its answers, the others fail noise of their own.
func nineServers(faulty, noise float64) []float64 {
	rates := make([]float64, 9)
	for i := range rates {
		rates[i] = noise
		if i%3 == 2 {
			rates[i] = faulty
		}
	}
	return rates
}

// The paths that need no per-request stanza (HAProxy's own counters) or
// send a sample of it, on the paper fault, under noise alone and under a
// fault of the whole fleet: the faulty servers go within the time SPOE
// takes, healthy ones never, and a fleet-wide fault drains nobody, since
// no server stands out from its peers.
func TestStatsAndSampledPaths(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		rates   []float64
		drained []string
	}{
		{"paper", nineServers(0.05, 0), []string{"srv3", "srv6", "srv9"}},
		{"noise", nineServers(0.002, 0.002), nil},
		{"fleet-wide", nineServers(0.05, 0.05), nil},
	}
	for _, path := range []string{"stats", "spoe-sampled"} {
		for _, tc := range cases {
			if path == "spoe-sampled" && tc.name == "fleet-wide" {
				continue // the rules' share of it is the stats path's; no new plumbing
			}
			t.Run(path+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				out := run(t, scenario.Scenario{Servers: paperFleet(tc.rates...), Rate: 450, Duration: 30 * time.Second,
					Policy: "rules", Name: path, Telemetry: path})
				for _, s := range tc.drained {
					// The sequential test from a cold start at 50 req/s a
					// server (coldDrain).
					if at, ok := out.DrainedAt[s]; !ok || at > coldDrain {
						t.Errorf("%s drained at %v (%v)", s, at, ok)
					}
				}
				if len(out.DrainedAt) != len(tc.drained) {
					t.Errorf("drained %v, want %v", out.DrainedAt, tc.drained)
				}
				// Stats: every answer comes from the counters; sampled: one
				// event stands for k answers, so each answer counts again.
				if out.Events == 0 {
					t.Errorf("the agent recorded nothing from %s", path)
				}
			})
		}
	}
}

// Behind `retry-on 500 502 503 504`, `retries 2` and `option redispatch 1`
// the clients see no 5xx and SPOE sees only the final answer: the faulty
// servers' failures reach the agent through HAProxy's wretr counters
// alone, on the SPOE path (the hybrid) and on the stats path. They are
// drained, and the retries stop once they are.
func TestRetriedFailuresAreSeen(t *testing.T) {
	t.Parallel()
	for _, path := range []string{"spoe", "stats"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			out := run(t, scenario.Scenario{Servers: paperFleet(nineServers(0.05, 0)...), Rate: 450, Duration: coldDrain + 10*time.Second,
				Policy: "rules", Name: path, Telemetry: path, Retries: true, AgentArgs: noTailGuard})
			for _, s := range []string{"srv3", "srv6", "srv9"} {
				// The sequential test from a cold start at 50 req/s a
				// server (coldDrain); the retries' count is what is
				// tested, the last 10 s of the run are after the drains.
				if at, ok := out.DrainedAt[s]; !ok || at > coldDrain {
					t.Errorf("%s drained at %v (%v)", s, at, ok)
				}
			}
			if len(out.DrainedAt) != 3 {
				t.Errorf("drained %v", out.DrainedAt)
			}
			late := 0
			for _, s := range out.Load.PerSecond[int(coldDrain/time.Second):] {
				late += s.Retried
			}
			t.Logf("%s: %d client 5xx, %d retried responses, %d in the last 10 s, %d attempts retried", path,
				out.Load.Err5xx, out.Load.Retried, late, out.Retried)
			if out.Load.Retried == 0 {
				t.Error("no response was retried: the fault never reached HAProxy's retries")
			}
			if late != 0 {
				t.Errorf("%d responses retried in the last 10 s, after the drains", late)
			}
		})
	}
}

// At an interval longer than a cold start's detection, the rules'
// evidence, checked every second, steps the loop as it arrives: the paper
// fault goes within seconds, not at the next tick. (The sequential test
// takes coldDrain at most from a cold start at 50 req/s a server here, so
// the study's 10 s interval would leave no room to tell the two apart.)
func TestEvidenceStepsBetweenTicks(t *testing.T) {
	t.Parallel()
	interval := coldDrain + 15*time.Second
	out := run(t, scenario.Scenario{Servers: paperFleet(nineServers(0.05, 0)...), Rate: 450, Duration: interval + 5*time.Second,
		Policy: "rules", Name: "evidence", Interval: interval})
	for _, s := range []string{"srv3", "srv6", "srv9"} {
		if at, ok := out.DrainedAt[s]; !ok || at > interval-2*time.Second {
			t.Errorf("%s drained at %v (%v); the tick after the first is at %v", s, at, ok, interval)
		}
	}
	if len(out.DrainedAt) != 3 {
		t.Errorf("drained %v", out.DrainedAt)
	}
}
