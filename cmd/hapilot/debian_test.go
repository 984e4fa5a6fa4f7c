package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The package's prerm, run on a copy whose paths point into a scratch
// root: on removal it runs `hapilot stop` with the packaged settings
// (with --keep when /etc/hapilot/keep-drains-on-remove exists) and says
// which; when the stop fails the removal fails, with what to do; an
// upgrade runs nothing.
func TestPrermStopsAgentsAndRestores(t *testing.T) {
	script, err := os.ReadFile("debian/prerm")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, arg string
		keep      bool
		fails     bool // the stand-in binary exits 1
		want      string
		wantErr   bool
		says      string
	}{
		{name: "remove", arg: "remove", want: "stop --binary ROOT/usr/bin/hapilot --config ROOT/etc/hapilot/hapilot.conf", says: "restoring the servers the agents changed"},
		{name: "remove, kept", arg: "remove", keep: true, want: "stop --keep --binary ROOT/usr/bin/hapilot --config ROOT/etc/hapilot/hapilot.conf", says: "keep-drains-on-remove exists"},
		{name: "remove, undo failed", arg: "remove", fails: true, want: "stop --binary", wantErr: true, says: "removal stopped"},
		{name: "upgrade", arg: "upgrade"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for _, d := range []string{"etc/hapilot", "var/lib/hapilot", "usr/bin"} {
				if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if tc.keep {
				if err := os.WriteFile(filepath.Join(root, "etc/hapilot/keep-drains-on-remove"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			// A stand-in for the binary that records how it was run.
			calls := filepath.Join(root, "calls")
			stub := "#!/bin/sh\necho \"$@\" >> " + calls + "\n"
			if tc.fails {
				stub += "exit 1\n"
			}
			if err := os.WriteFile(filepath.Join(root, "usr/bin/hapilot"), []byte(stub), 0o755); err != nil {
				t.Fatal(err)
			}
			s := strings.NewReplacer("/etc/hapilot", root+"/etc/hapilot", "/var/lib/hapilot", root+"/var/lib/hapilot",
				"/usr/bin/hapilot", root+"/usr/bin/hapilot", "/run/systemd/system", root+"/no-systemd",
				"chown ", "true ").Replace(string(script))
			out, err := exec.Command("sh", "-c", s, "prerm", tc.arg).CombinedOutput()
			if (err != nil) != tc.wantErr {
				t.Fatalf("prerm %s: %v\n%s", tc.arg, err, out)
			}
			got, _ := os.ReadFile(calls)
			want := strings.ReplaceAll(tc.want, "ROOT", root)
			if (want == "") != (len(got) == 0) || !strings.Contains(string(got), want) || !strings.Contains(string(out), tc.says) {
				t.Fatalf("prerm %s: ran %q, want %q; said %q", tc.arg, got, want, out)
			}
		})
	}
}

// postinst, where systemd is not running, says that it did not enable
// the unit and how to start the agent.
func TestPostinstSaysWhenSystemdIsAbsent(t *testing.T) {
	script, err := os.ReadFile("debian/postinst")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	// Every command it runs is a stand-in that succeeds: the user and
	// group exist.
	s := strings.NewReplacer("/run/systemd/system", root+"/no-systemd", "getent ", "true ").Replace(string(script))
	out, err := exec.Command("sh", "-c", s, "postinst", "configure").CombinedOutput()
	if err != nil {
		t.Fatalf("postinst: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "systemd is not running here: hapilot.service is not enabled") {
		t.Fatalf("postinst said %q", out)
	}
}
