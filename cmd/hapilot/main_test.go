package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/internal/lab/ollamafake"
)

// TestCalibrateAndRun calibrates emulated models served by the Ollama
// stand-in, then checks that `run --policy llm` lets only the passing one
// act (the refused one falls back to rules).
func TestCalibrate(t *testing.T) {
	dir := t.TempDir()
	fake := ollamafake.New(map[string]string{"capable": "sha256:c1", "happy": "sha256:h1"}, ollamafake.Capable)
	defer fake.Close()
	var out, errb bytes.Buffer
	if code := run([]string{"calibrate", "--model", "capable", "--ollama-host", fake.URL, "--calibration-dir", dir}, &out, &errb); code != 0 {
		t.Fatalf("code %d: %s %s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), "PASSED") || !strings.Contains(out.String(), "sha256:c1") {
		t.Fatalf("scorecard:\n%s", out.String())
	}
	fake.SetResponder(ollamafake.TriggerHappy)
	out.Reset()
	if code := run([]string{"calibrate", "--model", "happy", "--ollama-host", fake.URL, "--calibration-dir", dir}, &out, &errb); code != 1 {
		t.Fatalf("trigger-happy model: code %d\n%s", code, out.String())
	}
	if !strings.Contains(out.String(), "FAILED") {
		t.Fatalf("scorecard:\n%s", out.String())
	}
	if code := run([]string{"calibrate", "--model", "absent", "--ollama-host", fake.URL, "--calibration-dir", dir}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "not on the Ollama server") {
		t.Fatalf("absent model: code %d, %s", code, errb.String())
	}
}

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
		{[]string{"run", "--policy", "nope"}, 1, "", `policy "nope": want static|rules|llm|lua`},
		{[]string{"demo"}, 2, "", "unknown command"},
		{[]string{"check", "--mode", "observe"}, 0, "mode observe", ""},
		{[]string{"check", "--config", "../../examples/notify.conf"}, 0, "ok:", ""},
		{[]string{"check", "--notify-webhook", "ftp://x"}, 1, "", "want an http:// or https:// URL"},
		{[]string{"check", "--notify-format", "xml"}, 1, "", `notify-format "xml"`},
		{[]string{"check", "--mode", "dry"}, 1, "", `mode "dry": want enforce|observe`},
		{[]string{"check", "--control-socket", "127.0.0.1:9999"}, 1, "", "control-socket"},
		{[]string{"ctl"}, 1, "", "no command"},
		{[]string{"ctl", "frob"}, 1, "", `unknown command "frob"`},
		{[]string{"ctl", "release", "nonsense"}, 1, "", "release"},
		{[]string{"ctl", "pause", "--for", "-1m"}, 1, "", "negative"},
		{[]string{"ctl", "--socket", "unix:/nonexistent/ctl.sock", "status"}, 1, "", "is it running"},
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

var update = flag.Bool("update", false, "rewrite examples/hapilot.conf")

// examples/hapilot.conf, the file the Debian package installs, is what
// `hapilot defaults --packaged` prints; every commented line, uncommented,
// is a valid setting at its default, and `check` accepts the whole.
func TestPackagedSettingsFile(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"defaults", "--packaged"}, &out, &errb); code != 0 {
		t.Fatalf("defaults: %d %s", code, errb.String())
	}
	const golden = "../../examples/hapilot.conf"
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("%s is stale: go test ./cmd/hapilot -run PackagedSettingsFile -update", golden)
	}
	// Every default, uncommented: the same settings as none at all.
	var all strings.Builder
	n := 0
	for _, line := range strings.Split(out.String(), "\n") {
		if name, ok := strings.CutPrefix(line, "#"); ok && name != "" && !strings.HasPrefix(name, " ") && strings.Contains(name, " ") {
			all.WriteString(name + "\n")
			n++
		}
	}
	dir := t.TempDir()
	for name, body := range map[string]string{"packaged": out.String(), "every-default": all.String()} {
		path := filepath.Join(dir, name+".conf")
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		var o, e bytes.Buffer
		if code := run([]string{"check", "--config", path}, &o, &e); code != 0 {
			t.Errorf("%s: check: %s", name, e.String())
		}
	}
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	config.Register(fs)
	withDefault := 0
	fs.VisitAll(func(f *flag.Flag) {
		if f.DefValue != "" {
			withDefault++
		}
	})
	if n != withDefault {
		t.Errorf("%d settings at their default in the file, %d flags have one", n, withDefault)
	}
}

// ctl --config reads the socket from the agent's settings file; --socket
// wins over it.
func TestCtlConfig(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "hapilot.conf")
	if err := os.WriteFile(conf, []byte("control-socket unix:"+dir+"/from-config.sock\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"ctl", "--config", conf, "status"}, dir + "/from-config.sock"},
		{[]string{"ctl", "--config", conf, "--socket", "unix:" + dir + "/flag.sock", "status"}, dir + "/flag.sock"},
	} {
		var out, errb bytes.Buffer
		if code := run(tc.args, &out, &errb); code != 1 || !strings.Contains(errb.String(), "reach the agent at "+tc.want) {
			t.Errorf("%v: code %d, stderr %q", tc.args, code, errb.String())
		}
	}
}

// `hapilot check` with a bad webhook URL, by flag or in the settings
// file, says what is wrong and names the URL by its origin only: its user
// info, path and query are where a webhook keeps its secret.
func TestCheckNeverEchoesWebhookSecrets(t *testing.T) {
	dir := t.TempDir()
	for _, bad := range []string{
		"ftp://hookuser:HOOKPASS@hooks.example/services/T0/B0/PATHSECRET?token=QSECRET",
		"http://hookuser:HOOKPASS@[::1/services/PATHSECRET?token=QSECRET",
		"hookuser:HOOKPASS@hooks.example/services/PATHSECRET?token=QSECRET",
	} {
		conf := filepath.Join(dir, "hapilot.conf")
		if err := os.WriteFile(conf, []byte("notify-webhook "+bad+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"check", "--notify-webhook", bad}, {"check", "--config", conf}} {
			var out, errb bytes.Buffer
			code := run(args, &out, &errb)
			all := out.String() + errb.String()
			if code != 1 || !strings.Contains(all, "notify-webhook") || !strings.Contains(all, "want an http:// or https:// URL") {
				t.Fatalf("%v: code %d, output %q", args[1], code, all)
			}
			for _, s := range []string{"hookuser", "HOOKPASS", "PATHSECRET", "QSECRET"} {
				if strings.Contains(all, s) {
					t.Errorf("%v %s: the output carries %s: %q", args[1], bad, s, all)
				}
			}
		}
	}
}

// `hapilot restore` refuses a state file others may write, before it asks
// HAProxy anything: a forged file would have it ready an operator's
// drained server.
func TestRestoreRefusesAForgedStateFile(t *testing.T) {
	dir := t.TempDir()
	forged := filepath.Join(dir, "state.json")
	if err := os.WriteFile(forged, []byte(`{"version":2,"changes":{"app/s1":{"phase":"drained"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(forged, 0o666); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	code := run([]string{"restore", "--state-file", forged, "--haproxy-socket", filepath.Join(dir, "none.sock"),
		"--control-socket", "unix:" + filepath.Join(dir, "ctl.sock")}, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), forged+" has mode 0666") || !strings.Contains(errb.String(), "chmod 644") {
		t.Fatalf("code %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
}
