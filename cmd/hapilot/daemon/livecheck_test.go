package daemon

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// check --live fails when the agent could not act (no HAProxy answers, a
// level below admin) or could not see (every path off), each named.
func TestLiveCheckProblems(t *testing.T) {
	for _, tc := range []struct {
		name string
		args func(t *testing.T) []string
		want string // in a problem; "" for none
	}{
		{"admin, counters alone", func(t *testing.T) []string {
			return []string{"--haproxy-socket", fakeRuntimeAt(t, "2.6.12", "admin"), "--spoe-listen", "off"}
		}, ""},
		{"level operator", func(t *testing.T) []string {
			return []string{"--haproxy-socket", fakeRuntimeAt(t, "2.6.12", "operator"), "--spoe-listen", "off"}
		}, `answers at level "operator"`},
		{"nothing answers", func(t *testing.T) []string {
			return []string{"--haproxy-socket", filepath.Join(t.TempDir(), "none.sock"), "--spoe-listen", "off"}
		}, "no HAProxy answered"},
		{"blind", func(t *testing.T) []string {
			return []string{"--haproxy-socket", fakeRuntimeAt(t, "2.6.12", "admin"), "--spoe-listen", "off", "--stats-poll", "0"}
		}, "the agent would be blind"},
		// SPOE sees the answers HAProxy passes on, and nothing of its
		// own 5xx, its retries or the aborts: with the stats path off,
		// the check says so.
		{"SPOE without the stats path", func(t *testing.T) []string {
			return []string{"--haproxy-socket", fakeRuntimeAt(t, "2.6.12", "admin"), "--spoe-listen", "127.0.0.1:0", "--stats-poll", "0"}
		}, "telemetry blind: the per-response paths cannot see HAProxy's own 502/503/504"},
		{"the logs without the stats path", func(t *testing.T) []string {
			return []string{"--haproxy-socket", fakeRuntimeAt(t, "2.6.12", "admin"), "--spoe-listen", "off", "--syslog-listen", "udp://127.0.0.1:0", "--stats-poll", "0"}
		}, "telemetry blind: the per-response paths cannot see the attempts HAProxy retried"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := parseConfig(t, append(tc.args(t), "--status-listen", "off"))
			r := LiveCheck(context.Background(), *c, 100*time.Millisecond)
			got := strings.Join(r.Problems, "\n")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("problems %q, want %q\nreport:\n%s", got, tc.want, strings.Join(r.Lines, "\n"))
			}
		})
	}
}
