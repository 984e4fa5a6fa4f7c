package logs

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/rs/zerolog"
)

// listen is a loopback listener, capped at max connections when max > 0.
func listen(t *testing.T, max int) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if max > 0 {
		return netx.Limit(ln, max, zerolog.Nop())
	}
	return ln
}

// run serves f on ln until the test ends.
func run(t *testing.T, ln net.Listener, f func(context.Context, net.Listener) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
}

// closedWithin reports whether the agent closes c within d.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// drip starts a peer that writes b, then one byte of pad every gap, as
// the slow peers did, until the test ends or the agent closes it.
func drip(t *testing.T, addr string, b []byte, gap time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			time.Sleep(gap)
			if _, err := c.Write([]byte{'x'}); err != nil {
				return
			}
		}
	}()
	return c
}

// waitOpen waits until the capped listener ln holds n connections: every
// peer dialled has been accepted and counted.
func waitOpen(t *testing.T, ln net.Listener, n int) {
	t.Helper()
	limited := ln.(*netx.Listener)
	if !waitFor(5*time.Second, func() bool { return limited.Open() == n }) {
		t.Fatalf("%d connections open after 5 s, want %d", limited.Open(), n)
	}
}

// waitFor polls ok for up to d.
func waitFor(d time.Duration, ok func() bool) bool {
	for deadline := time.Now().Add(d); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// A syslog frame is bounded whole from its first byte: a peer that
// begins a 60,000-byte frame and sends a byte now and then, each within
// the limit of the last, is closed at the limit. The timer used to
// restart at every read.
func TestSlowSyslogFrameIsCutAtItsLimit(t *testing.T) {
	ln := listen(t, 0)
	s := &SyslogServer{Sink: &recorder{}, Log: zerolog.Nop(), FrameTimeout: 300 * time.Millisecond, IdleTimeout: time.Minute}
	run(t, ln, s.ServeStream)
	c := drip(t, ln.Addr().String(), []byte("60000 <134>hapilot app s1 200 5"), 50*time.Millisecond)
	if !closedWithin(c, 3*time.Second) {
		t.Fatal("a frame fed a byte every 50 ms was still open after 3 s (limit 300ms)")
	}
}

// However many slow peers hold the stream listener, a ring's real frame
// is recorded at once: its connection evicts the slowest.
func TestRingFrameRecordedUnderSlowPeers(t *testing.T) {
	const max = 16
	ln := listen(t, max)
	rec := &recorder{}
	s := &SyslogServer{Sink: rec, Log: zerolog.Nop(), FrameTimeout: time.Minute, IdleTimeout: time.Minute}
	run(t, ln, s.ServeStream)
	for i := 0; i < max; i++ {
		drip(t, ln.Addr().String(), []byte("60000 <134>"), 100*time.Millisecond)
	}
	waitOpen(t, ln, max) // every slow peer accepted and holding its place
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := "<134>hapilot app s1 200 5"
	if _, err := c.Write([]byte(strconv.Itoa(len(msg)) + " " + msg)); err != nil {
		t.Fatal(err)
	}
	if !waitFor(2*time.Second, func() bool { return len(rec.list()) == 1 }) {
		t.Fatalf("the ring's frame was not recorded with %d slow peers holding the listener", max)
	}
}

// A Lua companion batch is bounded whole from its first byte: a byte
// every 50 ms with no newline is cut at the batch's limit.
func TestSlowLuaBatchIsCutAtItsLimit(t *testing.T) {
	ln := listen(t, 0)
	s := &LineServer{Sink: &recorder{}, Log: zerolog.Nop(), IdleTimeout: 300 * time.Millisecond, BatchTimeout: 300 * time.Millisecond}
	run(t, ln, s.Serve)
	c := drip(t, ln.Addr().String(), []byte("app"), 50*time.Millisecond)
	if !closedWithin(c, 3*time.Second) {
		t.Fatal("a batch fed a byte every 50 ms was still open after 3 s (limit 300ms)")
	}
}

// However many slow peers hold the Lua listener, a real batch is
// recorded at once.
func TestLuaBatchRecordedUnderSlowPeers(t *testing.T) {
	const max = 16
	ln := listen(t, max)
	rec := &recorder{}
	s := &LineServer{Sink: rec, Log: zerolog.Nop(), IdleTimeout: time.Minute, BatchTimeout: time.Minute}
	run(t, ln, s.Serve)
	for i := 0; i < max; i++ {
		drip(t, ln.Addr().String(), []byte("app"), 100*time.Millisecond)
	}
	waitOpen(t, ln, max)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("app s1 200 5\n")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if !waitFor(2*time.Second, func() bool { return len(rec.list()) == 1 }) {
		t.Fatalf("the batch was not recorded with %d slow peers holding the listener", max)
	}
}
