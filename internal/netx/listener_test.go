package netx

import (
	"errors"
	"net"
	"os"
	"strings"
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

// Past the cap, a connection waits for another to close; Close ends a
// waiting Accept.
func TestCapAndClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Limit(ln, 1, zerolog.Nop())
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			c.Close()
		}
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("a second connection was accepted past the cap: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	first.Close() // frees the slot
	if err := <-got; err != nil {
		t.Fatalf("after a close: %v", err)
	}
	// An Accept waiting for a slot ends when the listener closes.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	held, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	// Whether it waits for a slot already or not, a closed listener ends it.
	go func() { _, err := l.Accept(); got <- err }()
	l.Close()
	if err := <-got; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after close: %v", err)
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
