package loop

import (
	"context"
	"net"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/guard"
	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/lab/fakes"
	"github.com/rs/zerolog"
)

// A runtime socket that accepts and never answers must not stall the loop
// nor pile up goroutines or connections: each step ends at its deadline,
// counts a state error, and leaves nothing behind.
func TestStalledSocketNeitherStallsNorLeaks(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "stalled.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // read nothing, answer nothing
		}
	}()
	client, err := haproxy.New(sock)
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	l := &Loop{Clock: agent.RealClock{}, Settings: agent.Settings{Interval: 100 * time.Millisecond}, Policy: agent.PolicyOf(&scripted{}), Guard: guard.DefaultGuardrails(),
		Runtimes: []agent.Runtime{client}, Windows: fakes.NewWindows(), Log: zerolog.Nop()}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := l.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("Run took %v", took)
	}
	l.st.mu.Lock()
	m := l.st.metrics
	l.st.mu.Unlock()
	// A step that waited on the socket past its budget would skip about
	// every other slot, and one that waited for good would make one
	// cycle. A third of the slots is the bound, not one: under -race, with
	// the other packages' tests on 2 cores, scheduling alone skipped 3 of
	// 16 in CI.
	if m.Cycles < 10 || m.StateErrors != m.Cycles || 3*m.Skipped > m.Cycles {
		t.Fatalf("cycles %d, state errors %d, skipped %d", m.Cycles, m.StateErrors, m.Skipped)
	}
	deadline := time.Now().Add(2 * time.Second)
	for runtime.NumGoroutine() > before+2 {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines %d, before %d", runtime.NumGoroutine(), before)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
