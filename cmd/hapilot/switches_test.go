package main

import (
	"bytes"
	"flag"
	"regexp"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/cmd/hapilot/config"
)

// researchSwitches are the study's switches that once shipped in the
// agent. The lab builds the study's loop around the agent's parts
// (internal/lab/bench.StudyLoop); an operator must not be able to ask
// for it.
var researchSwitches = []string{
	"unprotected",    // every fix around the model off
	"fallback",       // --fallback none: no rules' floor
	"no-step-budget", // a step waiting for the model however long
	"step-budget",
	"no-evidence-check",
}

// The agent's commands offer only what an operator may set: no research
// switch among their flags, and none in `hapilot defaults`.
func TestNoResearchSwitch(t *testing.T) {
	settings := flag.NewFlagSet("hapilot run", flag.ContinueOnError)
	config.Register(settings)
	n := 0
	settings.VisitAll(func(f *flag.Flag) {
		n++
		checkSwitch(t, "hapilot run --"+f.Name, f.Name, f.Usage)
	})
	if n < 50 {
		t.Fatalf("hapilot run has %d flags: the test sees the wrong flag set", n)
	}
	// Every command's own flags, as its -h lists them.
	flagLine := regexp.MustCompile(`^\s+-([a-z0-9-]+)`)
	// (ctl's flags are its commands'; fleet-key takes a path, not -h.)
	for _, cmd := range []string{"run", "check", "calibrate", "defaults", "restore", "stop"} {
		var out, errb bytes.Buffer
		run([]string{cmd, "-h"}, &out, &errb)
		help := out.String() + errb.String()
		names := 0
		for _, line := range strings.Split(help, "\n") {
			if m := flagLine.FindStringSubmatch(line); m != nil {
				names++
				checkSwitch(t, "hapilot "+cmd+" -h", m[1], "")
			}
		}
		if names == 0 {
			t.Errorf("hapilot %s -h lists no flag:\n%s", cmd, help)
		}
		if strings.Contains(strings.ToLower(help), "research") {
			t.Errorf("hapilot %s -h speaks of research:\n%s", cmd, help)
		}
	}
	// `hapilot defaults`, plain and packaged: one "#name value" line per
	// setting ("name value" where the package sets it).
	settingLine := regexp.MustCompile(`^#?([a-z][a-z0-9-]*)(\s|$)`)
	for _, args := range [][]string{nil, {"--packaged"}} {
		var out, errb bytes.Buffer
		if err := cmdDefaults(args, &out, &errb); err != nil {
			t.Fatalf("hapilot defaults %v: %v", args, err)
		}
		lines := 0
		for _, line := range strings.Split(out.String(), "\n") {
			if m := settingLine.FindStringSubmatch(line); m != nil {
				lines++
				checkSwitch(t, "hapilot defaults", m[1], "")
			}
		}
		if lines < n {
			t.Errorf("hapilot defaults %v shows %d settings of %d: the test reads the wrong lines", args, lines, n)
		}
		if strings.Contains(strings.ToLower(out.String()), "research") {
			t.Errorf("hapilot defaults %v speaks of research", args)
		}
	}
}

func checkSwitch(t *testing.T, where, name, usage string) {
	t.Helper()
	for _, s := range researchSwitches {
		if name == s {
			t.Errorf("%s: %q is a research switch", where, name)
		}
	}
	if strings.Contains(strings.ToLower(usage), "research") {
		t.Errorf("%s: its usage speaks of research: %q", where, usage)
	}
}
