package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The package's prerm, run on a copy whose paths point into a scratch
// root: on removal it runs `hapilot restore` with the packaged settings,
// unless /etc/hapilot/keep-drains-on-remove exists, and says which; an
// upgrade runs nothing.
func TestPrermRestoresUnlessKept(t *testing.T) {
	script, err := os.ReadFile("debian/prerm")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, arg string
		keep      bool
		restored  bool
		says      string
	}{
		{"remove", "remove", false, true, "restoring the servers the agent changed"},
		{"remove, kept", "remove", true, false, "keep-drains-on-remove exists"},
		{"upgrade", "upgrade", false, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for _, d := range []string{"etc/hapilot", "var/lib/hapilot", "usr/bin"} {
				if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(root, "var/lib/hapilot/state.json"), []byte("{}"), 0o640); err != nil {
				t.Fatal(err)
			}
			if tc.keep {
				if err := os.WriteFile(filepath.Join(root, "etc/hapilot/keep-drains-on-remove"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			// A stand-in for the binary that records how it was run.
			calls := filepath.Join(root, "calls")
			stub := "#!/bin/sh\necho \"$@\" >> " + calls + "\n"
			if err := os.WriteFile(filepath.Join(root, "usr/bin/hapilot"), []byte(stub), 0o755); err != nil {
				t.Fatal(err)
			}
			s := strings.NewReplacer("/etc/hapilot", root+"/etc/hapilot", "/var/lib/hapilot", root+"/var/lib/hapilot",
				"/usr/bin/hapilot", root+"/usr/bin/hapilot", "/run/systemd/system", root+"/no-systemd",
				"chown ", "true ").Replace(string(script))
			out, err := exec.Command("sh", "-c", s, "prerm", tc.arg).CombinedOutput()
			if err != nil {
				t.Fatalf("prerm %s: %v\n%s", tc.arg, err, out)
			}
			got, _ := os.ReadFile(calls)
			ran := strings.Contains(string(got), "restore --config "+root+"/etc/hapilot/hapilot.conf")
			if ran != tc.restored || !strings.Contains(string(out), tc.says) {
				t.Fatalf("prerm %s: ran %q, said %q", tc.arg, got, out)
			}
		})
	}
}
