package main

import (
	"os"
	"os/exec"
	"path"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/hapilot/hapilot"

// A room is one layer of the tree. Data flows one way (HAProxy → ingest →
// windows → loop → policy → guardrails → runtime socket → HAProxy), and a
// package may import only the rooms its own room stands on: the ground
// floor stands on nothing; HAProxy's edge (the runtime client and the files
// HAProxy loads) stands on the ground floor; telemetry ingest and the
// agent stand side by side on both, neither importing the other; the
// wiring composes them; the lab builds on all of that, and the commands
// sit on top.
type room string

const (
	ground  room = "ground floor (internal/lib)"
	edge    room = "HAProxy's edge (haproxy, spoe, lua, examples)"
	ingest  room = "telemetry ingest (internal/ingest)"
	decide  room = "the agent (agent)"
	wiring  room = "wiring (cmd/hapilot/{config,daemon,ctl})"
	lab     room = "the lab (internal/lab)"
	command room = "commands (cmd/hapilot, cmd/hapilot-bench)"
)

// standsOn lists, for each room, the rooms its packages may import.
var standsOn = map[room][]room{
	ground:  {ground},
	edge:    {ground, edge},
	ingest:  {ground, edge, ingest},
	decide:  {ground, edge, decide},
	wiring:  {ground, edge, ingest, decide, wiring},
	lab:     {ground, edge, ingest, decide, wiring, lab},
	command: {ground, edge, ingest, decide, wiring, lab},
}

// roomOf places a package, by its path inside the module, in its room.
func roomOf(rel string) (room, bool) {
	under := func(dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }
	switch {
	case under("internal/lib"):
		return ground, true
	case under("haproxy"), under("spoe"), under("lua"), under("examples"):
		return edge, true
	case under("internal/ingest"):
		return ingest, true
	case under("agent"):
		return decide, true
	case under("cmd/hapilot/config"), under("cmd/hapilot/daemon"), under("cmd/hapilot/ctl"):
		return wiring, true
	case under("internal/lab"):
		return lab, true
	case rel == "cmd/hapilot", rel == "cmd/hapilot-bench":
		return command, true
	}
	return "", false
}

// packages lists the module's packages and, for each, the module's
// packages it imports (not its tests: a test may reach the lab's fakes).
func packages(t *testing.T) map[string][]string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the packages: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		rel := strings.TrimPrefix(strings.TrimPrefix(f[0], module), "/")
		var own []string
		for _, imp := range f[1:] {
			if imp == module || strings.HasPrefix(imp, module+"/") {
				own = append(own, strings.TrimPrefix(strings.TrimPrefix(imp, module), "/"))
			}
		}
		pkgs[rel] = own
	}
	if len(pkgs) < 30 {
		t.Fatalf("go list gave %d packages: %q", len(pkgs), out)
	}
	return pkgs
}

// TestNoBackArrows fails when a package imports one from a room above
// its own, or when a package sits in no room.
func TestNoBackArrows(t *testing.T) {
	for pkg, imports := range packages(t) {
		r, ok := roomOf(pkg)
		if !ok {
			t.Errorf("%s is in no room: place it in roomOf", pkg)
			continue
		}
		for _, imp := range imports {
			ir, ok := roomOf(imp)
			if !ok {
				continue // reported as a package of its own
			}
			allowed := false
			for _, s := range standsOn[r] {
				allowed = allowed || s == ir
			}
			if !allowed {
				t.Errorf("%s (%s) imports %s (%s): a back-arrow", pkg, r, imp, ir)
			}
		}
	}
}

func TestRoomsRefuseABackArrow(t *testing.T) {
	for _, c := range []struct {
		from, to string
		ok       bool
	}{
		{"agent", "internal/lib/window", true},
		{"internal/lib/window", "agent", false},
		{"internal/ingest/spoe", "agent", false},
		{"agent/policy/rules", "internal/ingest/counters", false},
		{"cmd/hapilot/daemon", "internal/ingest/spoe", true},
		{"agent", "cmd/hapilot/config", false},
		{"internal/lib/netx", "haproxy", false},
		{"internal/lab/e2e", "cmd/hapilot/daemon", true},
		{"cmd/hapilot/daemon", "internal/lab/fakes", false},
		{"agent/notify", "cmd/hapilot/config", false},
		{"internal/ingest/telemetry", "agent", false},
		{"internal/ingest/telemetry", "internal/ingest/spoe", true},
	} {
		from, _ := roomOf(c.from)
		to, _ := roomOf(c.to)
		allowed := false
		for _, s := range standsOn[from] {
			allowed = allowed || s == to
		}
		if allowed != c.ok {
			t.Errorf("%s → %s allowed %v, want %v", c.from, c.to, allowed, c.ok)
		}
	}
}

// agentRooms are the rooms inside the agent, one job each, and the
// agent's packages each may import ("x/..." is x and every package under
// it; "x" is x alone). The shared types (agent) stand on nothing of the
// agent; the guardrails, the ledger and the merge of HAProxy's processes
// on the types only, none on another, and so does the notifier that sends
// the types' events; the loop on those four, and nothing calls into the loop but the
// read side that shows it. Policies, recovery and fleet mode are handed to
// the loop: none of them reaches the loop or the ledger.
var agentRooms = map[string][]string{
	"agent":          nil,
	"agent/guard":    {"agent"},
	"agent/ledger":   {"agent"},
	"agent/merge":    {"agent"},
	"agent/notify":   {"agent"},
	"agent/loop":     {"agent", "agent/guard", "agent/ledger", "agent/merge"},
	"agent/status":   {"agent", "agent/guard", "agent/ledger", "agent/loop"},
	"agent/policy":   {"agent", "agent/guard", "agent/policy/..."},
	"agent/recovery": {"agent", "agent/policy/..."},
	"agent/peers":    {"agent", "agent/policy/..."},
}

// agentRoomOf is the entry of agentRooms pkg falls under: itself, or the
// nearest folder above it that has one.
func agentRoomOf(pkg string) (string, bool) {
	for p := pkg; p != "." && p != ""; p = path.Dir(p) {
		if _, ok := agentRooms[p]; ok {
			return p, true
		}
	}
	return "", false
}

// agentMayImport says whether a package of agent room r may import imp.
func agentMayImport(r, imp string) bool {
	for _, a := range agentRooms[r] {
		if tree, ok := strings.CutSuffix(a, "/..."); imp == a || ok && (imp == tree || strings.HasPrefix(imp, tree+"/")) {
			return true
		}
	}
	return false
}

// TestAgentRooms fails when a package of the agent imports one of the
// agent's that its room does not stand on, or sits in no room.
func TestAgentRooms(t *testing.T) {
	for pkg, imports := range packages(t) {
		if pkg != "agent" && !strings.HasPrefix(pkg, "agent/") {
			continue
		}
		r, ok := agentRoomOf(pkg)
		if !ok {
			t.Errorf("%s is in no room of the agent: place it in agentRooms", pkg)
			continue
		}
		for _, imp := range imports {
			if imp != "agent" && !strings.HasPrefix(imp, "agent/") {
				continue // the outer rooms' rule
			}
			if !agentMayImport(r, imp) {
				t.Errorf("%s (room %s) imports %s: its room does not stand on that one", pkg, r, imp)
			}
		}
	}
}

func TestAgentRoomsRefuseABackArrow(t *testing.T) {
	for _, c := range []struct {
		from, to string
		ok       bool
	}{
		{"agent/loop", "agent/ledger", true},
		{"agent/loop", "agent/guard", true},
		{"agent/policy/llm", "agent/policy/rules", true},
		{"agent/policy/rules", "agent/guard", true},
		{"agent", "agent/ledger", false},
		{"agent/ledger", "agent/loop", false},
		{"agent/ledger", "agent/guard", false},
		{"agent/merge", "agent/ledger", false},
		{"agent/loop", "agent/merge", true},
		{"agent/guard", "agent/ledger", false},
		{"agent/policy/rules", "agent/loop", false},
		{"agent/recovery", "agent/ledger", false},
		{"agent/peers", "agent/loop", false},
		{"agent/loop", "agent/policy/rules", false},
	} {
		r, ok := agentRoomOf(c.from)
		if !ok {
			t.Fatalf("%s in no room", c.from)
		}
		if got := agentMayImport(r, c.to); got != c.ok {
			t.Errorf("%s → %s allowed %v, want %v", c.from, c.to, got, c.ok)
		}
	}
}

// TestReadmeMapNamesEveryPackage keeps the README's map true: every
// package of the module appears in its table, in backquotes, and every
// package path the table names exists.
func TestReadmeMapNamesEveryPackage(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	start := strings.Index(readme, "\n## The map")
	if start < 0 {
		t.Fatal(`README.md has no "## The map" section`)
	}
	section := readme[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z][a-z0-9-]*(?:/[a-z0-9-]+)*)/?`").FindAllStringSubmatch(section, -1) {
		named[m[1]] = true
	}
	pkgs := packages(t)
	var missing []string
	for pkg := range pkgs {
		if !named[pkg] {
			missing = append(missing, pkg)
		}
	}
	sort.Strings(missing)
	for _, pkg := range missing {
		t.Errorf("README.md's map does not name %s", pkg)
	}
	for name := range named {
		if _, isPkg := pkgs[name]; isPkg {
			continue
		}
		if _, inRoom := roomOf(name); inRoom && strings.Contains(name, "/") {
			if _, err := os.Stat("../../" + name); err != nil {
				t.Errorf("README.md's map names %s, which does not exist", name)
			}
		}
	}
}

// TestDatasetKnowsNoPolicy: the training dataset simulates and labels;
// the LLM policy whose prompts it records is passed in
// (internal/lab/llmprompts), so that the dataset does not depend on how
// the policy decides.
func TestDatasetKnowsNoPolicy(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the packages: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", module+"/internal/lab/dataset").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, d := range strings.Fields(string(out)) {
		if d == module+"/agent/policy/llm" || d == module+"/agent/policy/rules" {
			t.Errorf("internal/lab/dataset depends on %s", d)
		}
	}
}
