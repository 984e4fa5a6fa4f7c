package bench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Progress draws a one-line bar on a terminal while runs go by; a nil
// *Progress (CI, a pipe) is quiet.
type Progress struct {
	W io.Writer

	mu      sync.Mutex
	total   int
	done    int
	runLen  time.Duration
	label   string
	began   time.Time
	stop    chan struct{}
	stopped chan struct{}
}

// Start announces total runs of about runLen each.
func (p *Progress) Start(total int, runLen time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.total, p.runLen = total, runLen
	p.stop, p.stopped = make(chan struct{}), make(chan struct{})
	p.mu.Unlock()
	go func() {
		defer close(p.stopped)
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.draw()
			}
		}
	}()
}

// Begin starts a run.
func (p *Progress) Begin(label string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.label, p.began = label, time.Now()
	p.mu.Unlock()
	p.draw()
}

// End finishes a run.
func (p *Progress) End() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.done++
	p.mu.Unlock()
	p.draw()
}

// Done clears the line.
func (p *Progress) Done() {
	if p == nil || p.stop == nil {
		return
	}
	close(p.stop)
	<-p.stopped
	fmt.Fprint(p.W, "\r\033[K")
}

func (p *Progress) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	const width = 24
	frac := float64(p.done) / float64(max(p.total, 1))
	if p.done < p.total && p.runLen > 0 {
		frac += min(time.Since(p.began).Seconds()/p.runLen.Seconds(), 1) / float64(max(p.total, 1))
	}
	n := int(frac * width)
	fmt.Fprintf(p.W, "\r\033[K[%s%s] run %d/%d  %s  %.0fs", strings.Repeat("#", n), strings.Repeat(".", width-n),
		min(p.done+1, p.total), p.total, p.label, time.Since(p.began).Seconds())
}
