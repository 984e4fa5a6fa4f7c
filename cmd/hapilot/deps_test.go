package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The agent an operator installs holds the agent and nothing else: no
// test framework, no test servers, nothing of the lab (fleets, scenarios,
// the benchmark, the Ollama stand-in, the HAProxy process runner).
func TestAgentBinaryHoldsNoLab(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the binary's packages: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/hapilot/hapilot/cmd/hapilot").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list -deps gave %d packages: %q", len(deps), out)
	}
	for _, d := range deps {
		if d == "testing" || strings.HasPrefix(d, "testing/") || strings.HasSuffix(d, "/httptest") ||
			strings.HasPrefix(d, "github.com/hapilot/hapilot/internal/lab") {
			t.Errorf("the agent's binary links %s", d)
		}
	}
}
