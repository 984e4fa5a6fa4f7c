package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A rules key of a backend block takes exactly the values its flag takes:
// `hapilot check` refuses or accepts each the same way through the global
// flag, the --backend flag and the config file's block, and a refusal
// names the same bound (rules.Config.Validate says both).
func TestBackendRulesKeysValidateAsTheirFlags(t *testing.T) {
	for _, tc := range []struct {
		key, value string
		ok         bool
	}{
		{"rules-floor", "0.05", true},
		{"rules-floor", "0.5", true},
		{"rules-floor", "0.7", false}, // above the test's most certain alternative: never degraded
		{"rules-floor", "0", false},
		{"rules-floor", "NaN", false},
		{"rules-floor", "x", false},
		{"rules-degraded-ratio", "6", true},
		{"rules-degraded-ratio", "5", false}, // under twice the healthy ratio: no zone between them
		{"rules-degraded-ratio", "1000", true},
		{"rules-degraded-ratio", "0.5", false},
		{"rules-degraded-ratio", "+Inf", false},
		{"rules-arl-days", "0.5", true},
		{"rules-arl-days", "10000", true},
		{"rules-arl-days", "0.01", false},
		{"rules-arl-days", "1e10", false},
	} {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			check := func(args ...string) (int, string) {
				var out, errb bytes.Buffer
				code := run(append([]string{"check"}, args...), &out, &errb)
				return code, errb.String()
			}
			conf := filepath.Join(t.TempDir(), "hapilot.conf")
			if err := os.WriteFile(conf, []byte("backend.app."+tc.key+" "+tc.value+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			gCode, gErr := check("--" + tc.key + "=" + tc.value)
			bCode, bErr := check("--backend", "app."+tc.key+"="+tc.value)
			fCode, fErr := check("--config", conf)
			want := 0
			if !tc.ok {
				want = 1
			}
			if gCode != want || bCode != want || fCode != want {
				t.Fatalf("rc: global flag %d (%q), --backend %d (%q), block %d (%q); want %d each", gCode, gErr, bCode, bErr, fCode, fErr, want)
			}
			if tc.ok || tc.value == "x" { // a parse error is each reader's own
				return
			}
			// The validation's own sentence, e.g. "rules-floor 0.7 outside (0, 0.6)".
			line := strings.TrimSpace(gErr)
			if i := strings.Index(line, tc.key+" "); i >= 0 {
				line = line[i:]
			}
			if !strings.Contains(line, tc.key) || !strings.Contains(bErr, "backend app: "+line) || !strings.Contains(fErr, "backend app: "+line) {
				t.Fatalf("global flag says %q; --backend %q; block %q", gErr, bErr, fErr)
			}
		})
	}
}
