package auditlog

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// hungDisk is a writer that takes nothing until released, as a write to
// a hung NFS or FUSE mount blocks; then it keeps what it is given.
type hungDisk struct {
	release chan struct{}
	mu      sync.Mutex
	got     []string
}

func (h *hungDisk) Write(p []byte) (int, error) {
	<-h.release
	h.mu.Lock()
	defer h.mu.Unlock()
	h.got = append(h.got, string(p))
	return len(p), nil
}

func (h *hungDisk) lines() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

// A hung disk never blocks a writer of the queue: past its bound, records
// are dropped and counted; once the disk answers, what was queued is
// written in order. Close waits at most its bound on a disk that never
// answers, and counts what it leaves.
func TestQueueNeverBlocksOnAHungDisk(t *testing.T) {
	disk := &hungDisk{release: make(chan struct{})}
	q := NewQueue(disk, zerolog.Nop())
	start := time.Now()
	for i := 0; i < QueueRecords+10; i++ {
		_, err := q.Write([]byte(fmt.Sprintf("{\"n\":%d}\n", i)))
		if err != nil && !errors.Is(err, ErrLost) {
			t.Fatal(err)
		}
	}
	// One record is in the hung write; QueueRecords wait; the rest are lost.
	if lost := q.Lost(); lost < 9 || lost > 10 {
		t.Fatalf("lost %d of %d records past a queue of %d", lost, QueueRecords+10, QueueRecords)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("writes to a hung disk took %v", d)
	}
	close(disk.release)
	if err := q.Close(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	got := disk.lines()
	if want := QueueRecords + 10 - int(q.Lost()); len(got) != want || got[0] != "{\"n\":0}\n" || got[1] != "{\"n\":1}\n" {
		t.Fatalf("written %d records (first %q), want %d in order", len(got), got[:2], want)
	}
	if _, err := q.Write([]byte("late\n")); !errors.Is(err, ErrLost) {
		t.Fatalf("write after close: %v", err)
	}

	// A disk that never answers: Close returns at its bound, and says so.
	never := &hungDisk{release: make(chan struct{})}
	q2 := NewQueue(never, zerolog.Nop())
	for i := 0; i < 3; i++ {
		_, _ = q2.Write([]byte("x\n"))
	}
	err := q2.Close(50 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "queued records lost") || q2.Lost() == 0 {
		t.Fatalf("close on a hung disk: %v, lost %d", err, q2.Lost())
	}
	close(never.release) // let its goroutine end with the test
}
