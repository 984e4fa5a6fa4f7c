// Package labtest holds helpers that only tests use: a real HAProxy for
// one test, and the rule for tests that need one where HAProxy is missing.
package labtest

import (
	"context"
	"os"
	"os/exec"
	"testing"

	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
)

// RequireHAProxy skips t where no HAProxy is installed, so that `go test
// ./...` passes on a machine without one; where HAPILOT_REQUIRE_HAPROXY is
// set (make test and CI set it), a missing HAProxy fails the test
// instead, so that CI can never pass by skipping.
func RequireHAProxy(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath(haproxyproc.Binary()); err != nil {
		if os.Getenv("HAPILOT_REQUIRE_HAPROXY") != "" {
			t.Fatalf("haproxy not installed (apt-get install -y haproxy): %v", err)
		}
		t.Skipf("haproxy not installed (apt-get install -y haproxy; HAPILOT_REQUIRE_HAPROXY=1 makes this a failure): %v", err)
	}
}

// StartT starts HAProxy for a test in t.TempDir(); it is stopped at the
// end, and its output printed only if the test failed.
func StartT(t testing.TB, config func(dir string) (cfg, socket string)) *haproxyproc.Process {
	t.Helper()
	RequireHAProxy(t)
	dir := t.TempDir()
	cfg, socket := config(dir)
	p, err := haproxyproc.Start(context.Background(), dir, cfg, socket)
	if err != nil {
		t.Fatalf("start haproxy: %v", err)
	}
	t.Cleanup(func() {
		p.Stop()
		if t.Failed() {
			t.Logf("haproxy config:\n%s\nhaproxy output:\n%s", cfg, p.Log())
		}
	})
	return p
}
