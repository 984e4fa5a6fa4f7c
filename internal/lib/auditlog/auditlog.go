// Package auditlog is the agent's audit log file: appended to, a regular
// file only (internal/lib/safefile), and reopened at its path on request, so
// that logrotate can move it away and have the agent write a new one
// (SIGHUP).
package auditlog

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/internal/lib/promtext"
	"github.com/hapilot/hapilot/internal/lib/safefile"
	"github.com/rs/zerolog"
)

// File is an audit log open for appending. It is safe for concurrent
// use: the loop writes while a signal reopens.
type File struct {
	path string

	mu sync.Mutex // guards the fields below: the loop's writes and a signal's Reopen
	f  *os.File
	// torn: the last write ended short (a full disk), so the next one
	// starts on a new line, and the lines after the tear still parse.
	torn   bool
	closed bool // a signal's Reopen after Close opens nothing
}

// Open opens (or creates, mode 0640) the audit log at path.
func Open(path string) (*File, error) {
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	return &File{path: path, f: f}, nil
}

func open(path string) (*os.File, error) {
	f, err := safefile.Open(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return f, nil
}

// Path is where the log is.
func (a *File) Path() string { return a.path }

// Write appends p, one record.
func (a *File) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.torn {
		if _, err := a.f.Write([]byte("\n")); err != nil {
			return 0, err
		}
		a.torn = false
	}
	n, err := a.f.Write(p)
	if err != nil && n > 0 {
		a.torn = true
	}
	return n, err
}

// Reopen opens the path again and writes there from now on: after
// logrotate moved the file, a new one. If the path cannot be opened, the
// log stays the file it was, and the error says why.
func (a *File) Reopen() error {
	f, err := open(a.path)
	if err != nil {
		return err
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return f.Close()
	}
	old := a.f
	a.f, a.torn = f, false
	a.mu.Unlock()
	return old.Close()
}

// Close closes the file.
func (a *File) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	return a.f.Close()
}

// Queue bounds: records, and their bytes (a step's snapshot of 1,000
// servers is about 100 KB).
const (
	QueueRecords = 4096
	QueueBytes   = 16 << 20
)

// ErrLost is a record the queue did not take: full, or closed.
var ErrLost = errors.New("audit log: record lost")

// Queue writes records to w from a goroutine of its own, so that a disk
// that hangs (NFS, FUSE) holds up that goroutine and never its callers
// (the agent's loop). It holds at most QueueRecords records of at most
// QueueBytes together; a record that finds it full is dropped, and
// counted in Lost with the writes that failed. NewQueue starts the
// goroutine; Close stops it.
type Queue struct {
	w   io.Writer
	log zerolog.Logger
	q   chan []byte

	mu     sync.RWMutex // Write holds it shared to enqueue, Close alone to close
	closed bool
	quit   chan struct{}
	done   chan struct{}

	queued atomic.Int64 // bytes in q
	lost   atomic.Uint64
}

// NewQueue starts writing to w what Write is given.
func NewQueue(w io.Writer, log zerolog.Logger) *Queue {
	q := &Queue{w: w, log: log, q: make(chan []byte, QueueRecords), quit: make(chan struct{}), done: make(chan struct{})}
	go q.run()
	return q
}

// Write queues a copy of p, one record, and returns at once: ErrLost
// when the queue is full or closed (counted in Lost).
func (q *Queue) Write(p []byte) (int, error) {
	q.mu.RLock()
	defer q.mu.RUnlock()
	if q.closed || q.queued.Load()+int64(len(p)) > QueueBytes {
		q.lose(1, "the audit log's queue is full (the disk takes records slower than they come) or closed: record dropped")
		return 0, ErrLost
	}
	b := append([]byte(nil), p...)
	select {
	case q.q <- b:
		q.queued.Add(int64(len(b)))
		return len(p), nil
	default:
		q.lose(1, "the audit log's queue is full (the disk takes records slower than they come): record dropped")
		return 0, ErrLost
	}
}

// lose counts n records lost, logging the first and every hundredth.
func (q *Queue) lose(n uint64, why string) {
	if total := q.lost.Add(n); total-n == 0 || total/100 != (total-n)/100 {
		q.log.Error().Uint64("lost_total", total).Msg(why)
	}
}

// Lost counts the records lost: dropped by a full queue, or whose write
// failed.
func (q *Queue) Lost() uint64 { return q.lost.Load() }

func (q *Queue) run() {
	defer close(q.done)
	for {
		select {
		case b := <-q.q:
			q.write(b)
		case <-q.quit:
			for {
				select {
				case b := <-q.q:
					q.write(b)
				default:
					return
				}
			}
		}
	}
}

func (q *Queue) write(b []byte) {
	q.queued.Add(-int64(len(b)))
	if _, err := q.w.Write(b); err != nil {
		q.lose(1, "cannot write to the audit log: "+err.Error())
	}
}

// Close takes no more records and waits at most wait for the queue to
// be written. A disk that takes nothing meanwhile leaves the goroutine in
// its write, to end with the process; what was queued is counted lost,
// and the error says so.
func (q *Queue) Close(wait time.Duration) error {
	q.mu.Lock()
	already := q.closed
	q.closed = true
	q.mu.Unlock()
	if !already {
		close(q.quit)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-q.done:
		return nil
	case <-t.C:
		n := uint64(len(q.q))
		q.lose(n, "the audit log's disk took no record at stop: records lost")
		return fmt.Errorf("audit log: the disk took nothing for %v at stop; %d queued records lost", wait, n)
	}
}

// Figures are the queue's losses, for /metrics and /status.
func (q *Queue) Figures() []promtext.Figure {
	return []promtext.Figure{{Metric: "hapilot_audit_lost_total", Help: "Audit log records lost: dropped by a full queue (a disk slower than the records, or hung) or whose write failed.", V: q.Lost()}}
}
