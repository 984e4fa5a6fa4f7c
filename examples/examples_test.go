package examples_test

import (
	"github.com/hapilot/hapilot/spoe"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/examples"
	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/labtest"
	hapilotlua "github.com/hapilot/hapilot/lua"
)

// TestExampleConfigIsValid runs `haproxy -c` on the example haproxy.cfg
// with its SPOE file, paths pointed at a temporary directory.
func TestExampleConfigIsValid(t *testing.T) {
	labtest.RequireHAProxy(t)
	dir := t.TempDir()
	spoeFile := filepath.Join(dir, "hapilot-spoe.conf")
	if err := os.WriteFile(spoeFile, []byte(spoe.Conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := strings.ReplaceAll(examples.HAProxyCfg, "/etc/haproxy/hapilot-spoe.conf", spoeFile)
	cfg = strings.ReplaceAll(cfg, "/run/haproxy/admin.sock", filepath.Join(dir, "admin.sock"))
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	check(t, path)
}

// check runs `haproxy -c` on path: it must pass without a warning, on
// every HAProxy the matrix runs (HAPROXY_BIN).
func check(t *testing.T, path string) {
	t.Helper()
	out, err := exec.Command(haproxyproc.Binary(), "-c", "-f", path).CombinedOutput()
	if err != nil || strings.Contains(string(out), "[WARNING]") {
		t.Fatalf("haproxy -c %s: %v\n%s", filepath.Base(path), err, out)
	}
}

func TestExampleLuaAndSyslogAreValid(t *testing.T) {
	labtest.RequireHAProxy(t)
	dir := t.TempDir()
	for name, cfg := range map[string]string{"lua": examples.HAProxyLuaCfg, "syslog": examples.HAProxySyslogCfg, "syslog-ring": examples.HAProxySyslogRingCfg} {
		lua := filepath.Join(dir, "hapilot.lua")
		if err := os.WriteFile(lua, []byte(hapilotlua.Companion), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg = strings.ReplaceAll(cfg, "/etc/haproxy/hapilot.lua", lua)
		cfg = strings.ReplaceAll(cfg, "/run/haproxy/admin.sock", filepath.Join(dir, name+".sock"))
		path := filepath.Join(dir, name+".cfg")
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		check(t, path)
	}
}

// The sections the tests and the benchmark take from the examples are
// where they expect them.
func TestExampleSections(t *testing.T) {
	if got := examples.Lines(examples.HAProxySyslogCfg, "frontend www"); len(got) != 2 || !strings.HasPrefix(got[1], "log-format") {
		t.Fatalf("syslog frontend lines %q", got)
	}
	if got := examples.Lines(examples.HAProxySyslogRingCfg, "ring hapilot"); len(got) != 6 || !strings.Contains(got[5], "abns@hapilot-ring") {
		t.Fatalf("ring section lines %q", got)
	}
}

func TestStanzaExtraction(t *testing.T) {
	front, be, err := examples.Stanza("127.0.0.1:4242")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"filter spoe engine hapilot", "set-var-fmt(txn.hapilot_tr)", "send-spoe-group hapilot hapilot-observe if { nbsrv(hapilot-agents) gt 0 }"}
	joined := strings.Join(front, "\n")
	for _, w := range want {
		if !strings.Contains(joined, w) {
			t.Errorf("frontend stanza lacks %q:\n%s", w, joined)
		}
	}
	if strings.Contains(joined, "bind ") || strings.Contains(joined, "#") {
		t.Errorf("frontend stanza holds more than the drop-in:\n%s", joined)
	}
	if !strings.Contains(be, "server agent1 127.0.0.1:4242 check") || !strings.Contains(be, "option spop-check") {
		t.Errorf("agents backend:\n%s", be)
	}
}

// The sampled stanza passes `haproxy -c`, and its rand(k) and sample=int(k)
// agree: the agent counts each sampled answer k times.
func TestExampleSampledIsValidAndConsistent(t *testing.T) {
	k, err := examples.SampleK(examples.HAProxySampledCfg, spoe.SampledConf)
	if err != nil || k != 16 {
		t.Fatalf("sample k %d, %v; want 16", k, err)
	}
	labtest.RequireHAProxy(t)
	dir := t.TempDir()
	spoeFile := filepath.Join(dir, "hapilot-spoe-sampled.conf")
	if err := os.WriteFile(spoeFile, []byte(spoe.SampledConf), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := strings.ReplaceAll(examples.HAProxySampledCfg, "/etc/haproxy/hapilot-spoe-sampled.conf", spoeFile)
	cfg = strings.ReplaceAll(cfg, "/run/haproxy/admin.sock", filepath.Join(dir, "admin.sock"))
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	check(t, path)
	if _, err := examples.SampleK(strings.Replace(examples.HAProxySampledCfg, "rand(16)", "rand(8)", 1), spoe.SampledConf); err == nil {
		t.Fatal("rand(8) against sample=int(16) passed")
	}
}
