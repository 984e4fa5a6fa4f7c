package main

import (
	"os/exec"
	"path"
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
	// The lab's package names too, so that no package of the agent can be
	// taken for one of them (the lab's fleet of backends, say).
	out, err = exec.Command(goBin, "list", "github.com/hapilot/hapilot/internal/lab/...").Output()
	if err != nil {
		t.Fatalf("go list the lab: %v", err)
	}
	labNames := map[string]string{}
	for _, p := range strings.Fields(string(out)) {
		labNames[path.Base(p)] = p
	}
	for _, d := range deps {
		if d == "testing" || strings.HasPrefix(d, "testing/") || strings.HasSuffix(d, "/httptest") ||
			strings.HasPrefix(d, "github.com/hapilot/hapilot/internal/lab") {
			t.Errorf("the agent's binary links %s", d)
		}
		if lab, ok := labNames[path.Base(d)]; ok && strings.HasPrefix(d, "github.com/hapilot/hapilot/") {
			t.Errorf("the agent's binary links %s, named like the lab's %s", d, lab)
		}
	}
}
