package spoe

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/window"
	"github.com/rs/zerolog"
)

// A connection that never says HELLO is closed by the agent: idle
// connections once piled up by the thousand.
func TestSilentConnectionsAreClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Sink: window.New(time.Minute, 16, nil), Log: zerolog.Nop(), HelloTimeout: 100 * time.Millisecond, IdleTimeout: time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c); err != nil { // EOF, once the agent closes it
		t.Fatalf("the silent connection was not closed by the agent: %v", err)
	}
}
