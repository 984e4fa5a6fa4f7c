package config

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func parse(t *testing.T, file string, args ...string) (*Config, error) {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := Register(fs)
	if file != "" {
		p := filepath.Join(t.TempDir(), "hapilot.conf")
		if err := os.WriteFile(p, []byte(file), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", p}, args...)
	}
	if err := Parse(fs, args); err != nil {
		return nil, err
	}
	return c, c.Validate()
}

func TestDefaultsAreValid(t *testing.T) {
	c, err := parse(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.Loop.Interval != 10*time.Second || c.Policy != "rules" || c.MaxServers != 4096 || c.StatusListen != "127.0.0.1:9310" {
		t.Fatalf("defaults %+v", c)
	}
}

func TestFileAndFlags(t *testing.T) {
	file := `# comment
interval 2s
policy = static
haproxy-socket /run/a.sock
haproxy-socket=tcp:127.0.0.1:9999
rules-alpha 1e-5
`
	c, err := parse(t, file, "--interval", "500ms")
	if err != nil {
		t.Fatal(err)
	}
	if c.Loop.Interval != 500*time.Millisecond {
		t.Errorf("command line did not win: %v", c.Loop.Interval)
	}
	if c.Policy != "static" || c.Rules.Alpha != 1e-5 {
		t.Errorf("file not applied: %+v", c)
	}
	if strings.Join(c.HAProxySockets, ",") != "/run/a.sock,tcp:127.0.0.1:9999" {
		t.Errorf("sockets %v", c.HAProxySockets)
	}
}

// validKey is base64 of 32 bytes.
const validKey = "eREyZHGKihzya6vIm5YbnSXmuIRavMsSS8FVWEMpJ8g="

func keyFile(t *testing.T, mode os.FileMode, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "fleet.key")
	if err := os.WriteFile(p, []byte(content+"\n"), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// A fleet of valid settings passes, its join list split on commas.
func TestFleetSettings(t *testing.T) {
	c, err := parse(t, "", "--fleet-bind", "127.0.0.1:7946", "--fleet-key", keyFile(t, 0o600, validKey), "--fleet-join", "10.0.0.2:7946,10.0.0.3:7946", "--fleet-name", "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Fleet.Join; len(got) != 2 || got[1] != "10.0.0.3:7946" {
		t.Fatalf("join %v", got)
	}
}

func TestInvalid(t *testing.T) {
	tests := []struct {
		name, file string
		args       []string
		want       string
	}{
		{"interval too short", "", []string{"--interval", "100ms"}, "below 250ms"},
		{"unknown policy", "", []string{"--policy", "magic"}, `policy "magic": want static|rules|llm|lua`},
		{"bad socket", "", []string{"--haproxy-socket", "tcp:nohost"}, "socket address"},
		{"bad spoe address", "", []string{"--spoe-listen", "12345"}, "spoe-listen"},
		{"unknown key in file", "intervall 1s\n", nil, "unknown setting"},
		{"value missing in file", "interval\n", nil, "want `name value`"},
		{"bad value in file", "interval soon\n", nil, "interval"},
		// Named by file and line, not bufio.Scanner's "token too long".
		{"a line over 64 KiB", "interval 10s\n# " + strings.Repeat("x", 70<<10) + "\n", nil, "hapilot.conf:2: line over 65536 bytes"},
		{"stray argument", "", []string{"extra"}, "unexpected arguments"},
		{"alpha out of range", "", []string{"--rules-alpha", "2"}, "rules-alpha"},
		{"log format", "", []string{"--log-format", "xml"}, "log-format"},
		{"stats poll too short", "", []string{"--stats-poll", "10ms"}, "stats-poll 10ms: want 0 (off) or at least 100ms"},
		{"stats poll mode", "", []string{"--stats-poll-mode", "all"}, `stats-poll-mode "all": want auto|counts|retries`},
		{"evidence check too short", "", []string{"--evidence-check", "1ms"}, "evidence-check 1ms"},
		{"NaN alpha", "", []string{"--rules-alpha", "NaN"}, "rules-alpha NaN is not a finite number"},
		{"NaN utilization", "", []string{"--max-utilization", "NaN"}, "max-utilization NaN"},
		{"infinite probe rate", "", []string{"--probe-rate", "+Inf"}, "probe-rate"},
		{"NaN p99 guard", "", []string{"--p99-guard", "NaN"}, "p99-guard"},
		{"a window of a million hours", "", []string{"--window", "1000000h"}, "want 1s to 1h0m0s"},
		{"a window too big for max-servers", "", []string{"--window", "1h", "--max-servers", "4096"}, "MiB of buckets"},
		{"stat rows below max-servers", "", []string{"--max-stat-rows", "100"}, "max-stat-rows 100: want from max-servers (4096) to 1048576"},
		{"stat rows past a million", "", []string{"--max-stat-rows", "2000000"}, "max-stat-rows 2000000"},
		{"negative operator hold", "", []string{"--operator-hold", "-1s"}, "operator-hold"},
		{"shadow beside another policy", "", []string{"--policy", "llm", "--model", "m", "--shadow"}, "--shadow contradicts --policy llm"},
		{"shadow beside lua", "", []string{"--policy", "lua", "--policy-file", "x.lua", "--shadow"}, "--shadow contradicts --policy lua"},
		{"fleet without a key", "", []string{"--fleet-bind", "127.0.0.1:7946"}, "fleet-bind needs fleet-key"},
		{"fleet key others may read", "", []string{"--fleet-bind", "127.0.0.1:7946", "--fleet-key", keyFile(t, 0o644, validKey)}, "chmod 600"},
		{"fleet key not base64", "", []string{"--fleet-bind", "127.0.0.1:7946", "--fleet-key", keyFile(t, 0o600, "not a key!")}, "want base64"},
		{"fleet key of 8 bytes", "", []string{"--fleet-bind", "127.0.0.1:7946", "--fleet-key", keyFile(t, 0o600, "c2hvcnRrZXk=")}, "8 bytes, want 16, 24 or 32"},
		{"fleet join without bind", "", []string{"--fleet-join", "10.0.0.2:7946"}, "need fleet-bind"},
		{"fleet bind without port", "", []string{"--fleet-bind", "10.0.0.1", "--fleet-key", keyFile(t, 0o600, validKey)}, "fleet-bind"},
		{"fleet timeout under two syncs", "", []string{"--fleet-bind", "127.0.0.1:7946", "--fleet-key", keyFile(t, 0o600, validKey), "--fleet-timeout", "300ms"}, "fleet-timeout"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.file, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

// auto makes the counters the whole telemetry only when no per-response
// path listens.
func TestStatsModeAuto(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "retries"},
		{[]string{"--spoe-listen", "off"}, "counts"},
		{[]string{"--spoe-listen", "off", "--lua-listen", "127.0.0.1:7000"}, "retries"},
		{[]string{"--spoe-listen", "off", "--syslog-listen", "udp://127.0.0.1:7001"}, "retries"},
		{[]string{"--stats-poll-mode", "counts"}, "counts"},
		{[]string{"--spoe-listen", "off", "--stats-poll-mode", "retries"}, "retries"},
	}
	for _, tt := range tests {
		c, err := parse(t, "", tt.args...)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(c.StatsMode()); got != tt.want {
			t.Errorf("%v: mode %s, want %s", tt.args, got, tt.want)
		}
	}
}

// Beside SPOE alone, the stats path records every failure class (SPOE's
// http-response rule sees none of HAProxy's own answers); beside the Lua
// companion or the logs, which see HAProxy's own 502/503/504, only the
// retries and aborts.
func TestStatsUnseen(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "[]"},
		{[]string{"--lua-listen", "127.0.0.1:7000"}, "[retry abort]"},
		{[]string{"--spoe-listen", "off", "--syslog-listen", "udp://127.0.0.1:7001"}, "[retry abort]"},
	}
	for _, tt := range tests {
		c, err := parse(t, "", tt.args...)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(c.StatsUnseen()); got != tt.want {
			t.Errorf("%v: unseen %s, want %s", tt.args, got, tt.want)
		}
	}
}

// Backend blocks in the config file, as `backend.PATTERN.KEY VALUE`
// lines or --backend; an unknown key is an error, with the file's line.
func TestBackendBlocks(t *testing.T) {
	c, err := parse(t, "backend.api-*.max-drained 25%\nbackend.api-eu.action maint\nbackend cart.enabled=false\nmax-drained 3\nmax-drains-per-hour 4\n")
	if err != nil {
		t.Fatal(err)
	}
	eu := c.Guard.Scope.For("api-eu")
	if eu.MaxDrained == nil || eu.MaxDrained.String() != "25%" || !eu.Maint() || c.Guard.Scope.For("cart").InScope() {
		t.Fatalf("scope %+v", c.Guard.Scope)
	}
	if c.Guard.MaxDrained.N != 3 || c.Guard.DrainsPerHour != 4 {
		t.Fatalf("caps %+v %d", c.Guard.MaxDrained, c.Guard.DrainsPerHour)
	}
	for file, want := range map[string]string{
		"backend.app.frob 1\n":      `:1: backend: backend app: unknown key "frob"`,
		"backend.app 1\n":           "want PATTERN.KEY=VALUE",
		"max-drained lots\n":        "max-drained",
		"backend.app.enabled yes\n": "enabled",
	} {
		if _, err := parse(t, file); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", file, err, want)
		}
	}
}

// A config file written for an older agent: a retired setting at the value
// the agent now always has loads, any other value is refused with why.
func TestRetiredSettings(t *testing.T) {
	for _, c := range []struct {
		file    string
		wantErr string
	}{
		{"policy llm\nmodel m\nfallback rules\n", ""},
		{"policy llm\nmodel m\nfallback none\n", "fallback none: the setting was removed"},
		{"fallbacks rules\n", `unknown setting "fallbacks"`},
	} {
		_, err := parse(t, c.file)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%q: %v", c.file, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%q: error %v, want %q", c.file, err, c.wantErr)
		}
	}
}
