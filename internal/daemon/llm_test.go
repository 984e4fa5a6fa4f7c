package daemon

import (
	"context"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent/llm"
	"github.com/hapilot/hapilot/agent/llm/ollamafake"
	"github.com/hapilot/hapilot/internal/config"
	"github.com/rs/zerolog"
)

// The capability gate: a model acts only with a passing calibration
// record for its digest, unless --skip-calibration; --shadow never lets it.
func TestCapabilityGate(t *testing.T) {
	fake := ollamafake.New(map[string]string{"m": "sha256:m1"}, ollamafake.Capable)
	defer fake.Close()
	dir := t.TempDir()
	policy := func(extra ...string) string {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c := config.Register(fs)
		args := append([]string{"--policy", "llm", "--model", "m", "--ollama-host", fake.URL, "--calibration-dir", dir,
			"--spoe-listen", "127.0.0.1:0", "--status-listen", "off", "--haproxy-socket", "/nonexistent.sock"}, extra...)
		if err := config.Parse(fs, args); err != nil {
			t.Fatal(err)
		}
		d, err := New(*c, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		return d.Loop.Policy.Name()
	}
	if got := policy(); got != "rules" {
		t.Fatalf("uncalibrated model: policy %s", got)
	}
	if got := policy("--skip-calibration"); got != "llm" {
		t.Fatalf("--skip-calibration: policy %s", got)
	}
	if got := policy("--shadow"); got != "shadow:rules" {
		t.Fatalf("--shadow: policy %s", got)
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c := config.Register(fs)
	_ = config.Parse(fs, []string{"--model", "m", "--ollama-host", fake.URL})
	m, err := NewModel(*c)
	if err != nil {
		t.Fatal(err)
	}
	fake.SetResponder(ollamafake.TriggerHappy)
	sc, err := llm.Calibrate(context.Background(), m, time.Second, time.Now())
	if err != nil || sc.Passed {
		t.Fatalf("trigger-happy passed: %v", err)
	}
	if _, err := sc.Save(dir); err != nil {
		t.Fatal(err)
	}
	if got := policy(); got != "rules" {
		t.Fatalf("failing model: policy %s", got)
	}
	fake.SetResponder(ollamafake.Capable)
	if sc, err = llm.Calibrate(context.Background(), m, time.Second, time.Now()); err != nil || !sc.Passed {
		t.Fatalf("capable failed: %v %+v", err, sc)
	}
	if _, err := sc.Save(dir); err != nil {
		t.Fatal(err)
	}
	if got := policy(); got != "llm" {
		t.Fatalf("calibrated model: policy %s", got)
	}
}
