package netx

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// flaky fails its first accepts as a machine out of file descriptors does.
type flaky struct {
	net.Listener
	fails int
}

func (f *flaky) Accept() (net.Conn, error) {
	if f.fails > 0 {
		f.fails--
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	return f.Listener.Accept()
}

func TestAcceptLivesThroughEMFILE(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Limit(&flaky{Listener: ln, fails: 3}, 4, zerolog.Nop())
	defer l.Close()
	c0, err := net.Dial("tcp", ln.Addr().String()) // waits in the backlog for the accept
	if err != nil {
		t.Fatal(err)
	}
	defer c0.Close()
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("accept gave up: %v", err)
	}
	c.Close()
	if l.Refused.Load() != 3 {
		t.Fatalf("refused %d", l.Refused.Load())
	}
}

// dialN opens n connections to ln and accepts each through l, in order.
func dialN(t *testing.T, ln net.Listener, l *Listener, n int) (clients []net.Conn, served []*Conn) {
	t.Helper()
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		clients, served = append(clients, c), append(served, s.(*Conn))
	}
	return clients, served
}

// closedByPeer reports whether the agent's side of c was closed: a read
// ends at once with EOF or a reset, not at the deadline.
func closedByPeer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// At the cap, a new connection gets in at once: the one that has done
// least is closed for it. A connection that never proved itself goes
// before one that did, however old; among the same kind, the longest in
// its current wait. A waiting cap let slow peers keep HAProxy out.
func TestCapEvictsTheConnectionThatDidLeast(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Limit(ln, 3, zerolog.Nop())
	defer l.Close()
	clients, served := dialN(t, ln, l, 3)
	served[0].Proven()                                                 // the oldest proved itself
	served[2].since.Store(served[1].since.Load() - int64(time.Second)) // and the third has waited longest of the others

	done := make(chan []net.Conn, 1)
	go func() { c, _ := dialN(t, ln, l, 1); done <- c }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("a connection past the cap was not accepted")
	}
	if !closedByPeer(clients[2]) {
		t.Fatal("the unproven connection that waited longest was not the one evicted")
	}
	if l.Open() != 3 || l.Evicted.Load() != 1 {
		t.Fatalf("open %d, evicted %d", l.Open(), l.Evicted.Load())
	}
	// Next goes the other unproven one, then, with none left, the proven
	// one that waited longest.
	dialN(t, ln, l, 1)
	if !closedByPeer(clients[1]) {
		t.Fatal("the second unproven connection was not the next evicted")
	}
	for _, c := range l.snapshot() {
		if c != served[0] {
			c.Proven()
		}
	}
	dialN(t, ln, l, 1)
	if !closedByPeer(clients[0]) {
		t.Fatal("the proven connection longest in its wait was not evicted")
	}
	// Close ends a waiting Accept.
	got := make(chan error, 1)
	go func() { _, err := l.Accept(); got <- err }()
	l.Close()
	if err := <-got; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after close: %v", err)
	}
}

// A connection carrying out a request (Claim) is never evicted, however
// long it waited: the idle one goes instead, told so first (Evicting);
// with every connection busy, the new one is turned away and told so.
// An idle connection evicted first cannot claim its request after.
func TestCapNeverEvictsABusyConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Limit(ln, 2, zerolog.Nop())
	var told [2]atomic.Int32 // turned away, evicted
	l.Evicting = func(c net.Conn, evicted bool) {
		if evicted {
			told[1].Add(1)
		} else {
			told[0].Add(1)
		}
		_, _ = c.Write([]byte("bye\n"))
	}
	defer l.Close()
	clients, served := dialN(t, ln, l, 2)
	if !served[0].Claim() { // the oldest is busy
		t.Fatal("claim of an idle connection")
	}
	dialN(t, ln, l, 1)
	if !toldBye(clients[1]) || closedByPeer(clients[0]) || told[1].Load() != 1 {
		t.Fatalf("the idle connection was not the one evicted (told %d)", told[1].Load())
	}
	if served[1].Claim() {
		t.Fatal("an evicted connection claimed its request")
	}
	for _, c := range l.snapshot() {
		c.Claim()
	}
	// Every connection busy: the next is turned away, and Accept goes on
	// to the one after.
	turned, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer turned.Close()
	got := make(chan net.Conn, 1)
	go func() { c, _ := l.Accept(); got <- c }()
	if !toldBye(turned) || told[0].Load() != 1 || l.Turned.Load() != 1 {
		t.Fatalf("turned away: told %d, turned %d", told[0].Load(), l.Turned.Load())
	}
	served[0].Close() // a command answered: its place is free
	next, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	select {
	case c := <-got:
		defer c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("Accept stopped after turning a connection away")
	}
	if l.Open() != 2 {
		t.Fatalf("open %d", l.Open())
	}
}

// toldBye reports whether the agent's side said "bye" (the test's
// Evicting), then closed c.
func toldBye(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, err := io.ReadAll(c)
	var ne net.Error
	return string(b) == "bye\n" && !(errors.As(err, &ne) && ne.Timeout())
}

func (l *Listener) snapshot() []*Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*Conn
	for c := range l.conns {
		out = append(out, c)
	}
	return out
}

// A unit's deadline is fixed at its first byte: a peer that sends a byte
// now and then is cut at the unit's limit, however often it sends.
func TestUnitIsBoundWholeNotPerRead(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := Track(b)
	go func() {
		for i := 0; i < 100; i++ {
			if _, err := a.Write([]byte{'x'}); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	c.Unit(200 * time.Millisecond)
	start := time.Now()
	buf := make([]byte, 1)
	var err error
	for err == nil {
		_, err = c.Read(buf)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read ended with %v, want the unit's deadline", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("a unit of 200ms lasted %v while bytes trickled in", d)
	}
	// A wait's deadline counts from its own start; the unit that follows
	// it gets a fresh one.
	c.Wait(time.Second)
	if _, err := c.Read(buf); err != nil {
		t.Fatalf("read after Wait: %v", err)
	}
	if !c.proven.Load() {
		t.Fatal("a connection that finished a unit is not proven")
	}
}

// MaxLife bounds every deadline, whoever sets it.
func TestMaxLifeBoundsDeadlines(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Limit(ln, 4, zerolog.Nop())
	l.MaxLife = 150 * time.Millisecond
	defer l.Close()
	_, served := dialN(t, ln, l, 1)
	c := served[0]
	_ = c.SetReadDeadline(time.Now().Add(time.Hour)) // as an HTTP server's idle timeout would
	start := time.Now()
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || time.Since(start) > time.Second {
		t.Fatalf("read ended after %v with %v, want the connection's life of 150ms", time.Since(start), err)
	}
}

// A unix socket is group-only, replaces what a killed agent left, and is
// refused while another process answers on it.
func TestListenUnix(t *testing.T) {
	path := t.TempDir() + "/spoe.sock"
	ln, err := Listen("unix:" + path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != SocketMode {
		t.Fatalf("mode %v %v", fi.Mode().Perm(), err)
	}
	if _, err := Listen("unix:" + path); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("second listener: %v", err)
	}
	// A stale socket: the listener's file, left without its listener.
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	ln2, err := Listen("unix:" + path)
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	ln2.Close()
	plain := t.TempDir() + "/file"
	if err := os.WriteFile(plain, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen("unix:" + plain); err == nil {
		t.Fatal("listened over a regular file")
	}
	for addr, want := range map[string]bool{"127.0.0.1:9310": true, "[::1]:9310": true, "localhost:1": true, "0.0.0.0:9310": false, "10.0.0.1:9310": false, ":9310": false} {
		if IsLoopback(addr) != want {
			t.Errorf("IsLoopback(%q) != %v", addr, want)
		}
	}
}

func TestListenUnixgram(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/sub/syslog.sock"
	pc, err := ListenUnixgram(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != SocketMode {
		t.Fatalf("mode %v %v", fi.Mode().Perm(), err)
	}
	pc.Close()
	plain := dir + "/file"
	if err := os.WriteFile(plain, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnixgram(plain); err == nil {
		t.Fatal("listened over a regular file")
	}
	if b, _ := os.ReadFile(plain); string(b) != "keep" {
		t.Fatal("the regular file was removed")
	}
}
