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
		{[]string{"version"}, 0, "hapilot dev", ""},
		{[]string{"check"}, 0, "ok: policy rules, interval 10s", ""},
		{[]string{"check", "--policy", "static", "--interval", "1s"}, 0, "ok: policy static, interval 1s", ""},
		{[]string{"check", "--interval", "10ms"}, 1, "", "below 250ms"},
		{[]string{"check", "--config", "/nonexistent/hapilot.conf"}, 1, "", "no such file"},
		{[]string{"frobnicate"}, 2, "", "unknown command"},
		{nil, 2, "", "usage"},
		{[]string{"run", "--policy", "nope"}, 1, "", "unknown policy"},
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
