package spoe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/negasus/haproxy-spoe-go/frame"
	"github.com/rs/zerolog"
)

// serve runs s on a loopback listener, capped at max connections when
// max > 0, until the test ends.
func serve(t *testing.T, s *Server, max int) string {
	t.Helper()
	addr, _ := serveLimited(t, s, max)
	return addr
}

// serveLimited is serve, with the capped listener (nil when max is 0),
// whose count of open connections a test waits on.
func serveLimited(t *testing.T, s *Server, max int) (string, *netx.Listener) {
	t.Helper()
	var ln net.Listener
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var limited *netx.Listener
	if max > 0 {
		limited = netx.Limit(ln, max, zerolog.Nop())
		ln = limited
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String(), limited
}

// waitOpen waits until ln holds n connections: every peer dialled has
// been accepted and counted.
func waitOpen(t *testing.T, ln *netx.Listener, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ln.Open() != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open after 5 s, want %d", ln.Open(), n)
		}
	}
}

// closedWithin reports whether the agent closes c within d: a read ends
// with EOF or a reset, not at the test's own deadline.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// trickle writes b one byte every gap until it is written or the
// connection fails.
func trickle(c net.Conn, b []byte, gap time.Duration) {
	for i := range b {
		if _, err := c.Write(b[i : i+1]); err != nil {
			return
		}
		time.Sleep(gap)
	}
}

// A connection that never says HELLO is closed by the agent: idle
// connections once piled up by the thousand.
func TestSilentConnectionsAreClosed(t *testing.T) {
	addr := serve(t, &Server{Sink: window.New(time.Minute, 16, nil), Log: zerolog.Nop(), HelloTimeout: 100 * time.Millisecond, IdleTimeout: time.Minute}, 0)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !closedWithin(c, 5*time.Second) {
		t.Fatal("the silent connection was not closed by the agent")
	}
}

// The HELLO limit bounds the whole HELLO from the connection's start: a
// peer that sends it a byte at a time, faster than the limit, is closed
// at the limit. The first read used to arm the HELLO's timer and every
// later one the idle timeout's, so such a peer held its connection for
// the idle timeout (5 minutes) and more.
func TestSlowHelloIsCutAtItsLimit(t *testing.T) {
	addr := serve(t, &Server{Sink: window.New(time.Minute, 16, nil), Log: zerolog.Nop(), HelloTimeout: 300 * time.Millisecond, IdleTimeout: time.Minute}, 0)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go trickle(c, helloFrame(t, false), 50*time.Millisecond) // about 5 s for the whole HELLO
	start := time.Now()
	if !closedWithin(c, 3*time.Second) {
		t.Fatalf("a HELLO trickled in a byte every 50 ms was still open after %v (limit 300ms)", time.Since(start))
	}
}

// A frame after the HELLO is bounded whole from its first byte, as the
// HELLO is, however often its bytes come.
func TestSlowFrameIsCutAtItsLimit(t *testing.T) {
	addr := serve(t, &Server{Sink: window.New(time.Minute, 16, nil), Log: zerolog.Nop(), FrameTimeout: 300 * time.Millisecond, IdleTimeout: time.Minute}, 0)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(helloFrame(t, false)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if f, err := readAgentFrame(br); err != nil || f.Type != frame.TypeAgentHello {
		t.Fatalf("hello: %v %v", f.Type, err)
	}
	go trickle(c, notifyFrame(1, 1, response(t, "app", "srv1", int32(200), "5")), 50*time.Millisecond)
	start := time.Now()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	_, err = io.Copy(io.Discard, br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a frame trickled in a byte every 50 ms was still open after %v (limit 300ms)", time.Since(start))
	}
}

// However many slow peers hold the listener's connections, HAProxy's own
// HELLO is answered at once: at the cap, the connection that has done
// least (a HELLO begun long ago and still not finished) is evicted. The
// cap used to make a new connection wait for one to close, which slow
// peers never did before their limits.
func TestGenuineHelloServedUnderSlowPeers(t *testing.T) {
	const max = 16
	addr, ln := serveLimited(t, &Server{Sink: window.New(time.Minute, 16, nil), Log: zerolog.Nop(), HelloTimeout: time.Minute, IdleTimeout: time.Minute}, max)
	hello := helloFrame(t, false)
	for i := 0; i < max; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(hello[:2]); err != nil {
			t.Fatal(err)
		}
	}
	waitOpen(t, ln, max) // every slow peer accepted and holding its place
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	f, err := readAgentFrame(bufio.NewReader(c))
	if err != nil || f.Type != frame.TypeAgentHello {
		t.Fatalf("HAProxy's HELLO was not answered with %d slow peers holding the listener: %v %v", max, f.Type, err)
	}
}

// memConn is a connection that reads a prepared stream, for measuring
// the per-frame work of the connection's loop without a socket.
type memConn struct {
	net.Conn
	r io.Reader
}

func (m memConn) Read(b []byte) (int, error)    { return m.r.Read(b) }
func (memConn) SetReadDeadline(time.Time) error { return nil }
func (memConn) Write(b []byte) (int, error)     { return len(b), nil }
func (memConn) RemoteAddr() net.Addr            { return &net.TCPAddr{} }
func (memConn) Close() error                    { return nil }

// BenchmarkServeConnFrames is the connection's loop per NOTIFY frame, its
// deadlines per frame included (units) or not (none): the difference is
// what bounding each frame whole costs.
func BenchmarkServeConnFrames(b *testing.B) {
	frame := notifyFrame(1, 1, response(b, "app", "srv1", int32(200), "12"))
	for _, tc := range []struct {
		name  string
		units bool
	}{{"none", false}, {"units", true}} {
		b.Run(tc.name, func(b *testing.B) {
			stream := append([]byte{}, helloFrame(b, false)...)
			for i := 0; i < b.N; i++ {
				stream = append(stream, frame...)
			}
			s := &Server{Sink: window.New(time.Minute, 16, nil), Log: zerolog.Nop()}
			uc := netx.Track(memConn{r: bytes.NewReader(stream)})
			var u *units
			if tc.units {
				uc.Unit(time.Minute)
				u = &units{conn: uc, frame: time.Minute, idle: time.Minute}
			}
			b.ReportAllocs()
			b.ResetTimer()
			_ = s.serveConn(bufio.NewReaderSize(uc, MaxFrameSize+4), bufio.NewWriter(io.Discard), u)
		})
	}
}
