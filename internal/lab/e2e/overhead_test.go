//go:build e2e

package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/bench"
)

// `hapilot-bench bench overhead`'s machinery on every telemetry path, briefly:
// each HAProxy answers every request, each agent records the responses it
// was sent, and HAProxy's CPU time is read. It asserts no ratio: those are
// measured by the command, not by a timed test. It does not run in
// parallel, so that its saturating load disturbs no other test; one
// round of a second a path, so that it holds the parallel tests back
// little (41 s at two rounds, 2 s a path).
func TestOverheadEveryPath(t *testing.T) {
	cfg := bench.OverheadConfig{Concurrency: 8, Duration: time.Second, Rounds: 1, Backends: 2, Paths: bench.OverheadPaths, Pin: true}
	res, err := bench.Overhead(context.Background(), &cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	bench.PrintOverhead(&table, cfg, res)
	t.Logf("\n%s", table.String())
	if len(res) != len(bench.OverheadPaths) {
		t.Fatalf("%d results for %d paths", len(res), len(bench.OverheadPaths))
	}
	for _, r := range res {
		if r.Throughput <= 0 || r.Failed != 0 || r.HAProxyCPU <= 0 {
			t.Errorf("%s: %.0f req/s, %d failed, HAProxy CPU %v per response", r.Path, r.Throughput, r.Failed, r.HAProxyCPU)
		}
		measured := uint64(r.Throughput * cfg.Duration.Seconds()) // the warm-up's responses come on top
		if k, ok := strings.CutPrefix(r.Path, "spoe-sampled"); ok {
			n, _ := strconv.Atoi(k)
			measured /= uint64(n) // one message in k: what SPOE counts is messages
		}
		switch {
		case r.Path == "plain" || strings.HasSuffix(r.Path, "-noagent"):
			if r.Recorded != 0 {
				t.Errorf("%s: recorded %d with no agent", r.Path, r.Recorded)
			}
		case r.Recorded < measured/2: // UDP may drop some under a saturating load; none must lose half
			t.Errorf("%s: the agent recorded %d events for %d measured responses", r.Path, r.Recorded, measured)
		}
	}
}
