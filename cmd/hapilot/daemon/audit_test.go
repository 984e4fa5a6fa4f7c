package daemon

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/auditlog"
	"github.com/rs/zerolog"
)

// hungDisk takes no write until released, as a hung NFS or FUSE mount.
type hungDisk struct{ release chan struct{} }

func (h hungDisk) Write(p []byte) (int, error) { <-h.release; return len(p), nil }

// An audit log on a disk that hangs never stops the loop: its steps and
// events go on (the records queue, then are dropped), the drops are
// counted in hapilot_audit_lost_total, and the agent stops within its
// bound. Before, the loop wrote each record itself and waited on the
// disk with it.
func TestHungAuditDiskNeverStopsTheLoop(t *testing.T) {
	dir := t.TempDir()
	c := parseConfig(t, []string{"--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", filepath.Join(dir, "missing.sock"),
		"--control-socket", "off", "--state-file", "off", "--audit-log", filepath.Join(dir, "audit.jsonl"), "--audit-steps", "--interval", "250ms"})
	d, err := New(*c, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	// The agent's own queue, over a disk that hangs from now on.
	disk := hungDisk{release: make(chan struct{})}
	defer close(disk.release)
	_ = d.auditQ.Close(time.Second)
	d.auditQ = auditlog.NewQueue(disk, zerolog.Nop())
	d.Loop.Events, d.Loop.Audit = eventLog{w: d.auditQ}, d.auditQ

	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < auditlog.QueueRecords+100; i++ {
			d.Loop.Emit(agent.Event{Type: agent.EventTelemetrySilent, Reason: fmt.Sprint(i)})
		}
		d.Loop.Step(context.Background()) // a step: its record too
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the loop's events and step waited on the hung disk")
	}
	var m strings.Builder
	d.writeIngestMetrics(&m)
	var lost uint64
	for _, line := range strings.Split(m.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "hapilot_audit_lost_total "); ok {
			fmt.Sscan(v, &lost)
		}
	}
	if lost < 100 {
		t.Fatalf("hapilot_audit_lost_total %d, want at least the 100 past the queue:\n%s", lost, m.String())
	}
	stopped := make(chan struct{})
	go func() { d.Close(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(AuditStopWait + 30*time.Second):
		t.Fatal("Close waited on the hung disk past its bound")
	}
}
