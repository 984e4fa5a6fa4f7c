package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestCommands(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"version"}, 0, "hapilot-bench dev", ""},
		{nil, 2, "", "usage"},
		{[]string{"run"}, 2, "", "unknown command"},
		{[]string{"bench", "--list"}, 0, "two-faults", ""},
		{[]string{"bench", "--scenario", "meteor"}, 1, "", "unknown scenario"},
		{[]string{"bench", "--policy", "llm"}, 1, "", "needs --emulate"},
		{[]string{"bench", "--policy", "llm", "--emulate", "oracle"}, 1, "", "unknown emulation"},
		{[]string{"bench", "--policy", "llm", "--emulate", "capable", "--protections", "maybe"}, 1, "", "want on, off"},
		{[]string{"bench", "--algo", "random"}, 1, "", "roundrobin or leastconn"},
		{[]string{"bench", "--servers", "1"}, 1, "", "from 2 to 64"},
		{[]string{"bench", "--report", "/nonexistent"}, 1, "", "no such file"},
		{[]string{"bench", "overhead", "--paths", "plain,carrier-pigeon", "--duration", "1s"}, 1, "", "unknown telemetry path"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("code %d, stdout %q, stderr %q", code, out.String(), errb.String())
			}
		})
	}
}
