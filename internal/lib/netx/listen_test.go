package netx

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// A port already taken says what to do.
func TestListenTakenPortSaysSo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = Listen(ln.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), "another program, perhaps another hapilot, listens there") {
		t.Fatalf("err = %v", err)
	}
}

// Serve's connections are its own: when ctx ends, every one is closed and
// every handler has returned before Serve does.
func TestServeClosesAndWaitsForItsConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var handled, returned atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, ln, zerolog.Nop(), func(c net.Conn) {
			handled.Add(1)
			io.Copy(io.Discard, c) // until Serve closes it
			returned.Add(1)
		})
	}()
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	for handled.Load() < 3 {
		runtime.Gosched()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := returned.Load(); n != 3 {
		t.Fatalf("Serve returned with %d of 3 handlers still running", 3-n)
	}
	// The listener itself is closed. (Not a dial to its port: in CI a
	// test of another package got the freed port and took the dial.)
	// The deadline turns a listener left open into a failure, not a hang
	// (on a closed one it is refused, and Accept says closed).
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(time.Second))
	if c, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		if c != nil {
			c.Close()
		}
		t.Fatalf("the listener still accepts: Accept gave %v", err)
	}
}

func TestParseAddress(t *testing.T) {
	all := []Network{TCP, Unix, UDP, Unixgram}
	for _, tc := range []struct {
		in      string
		allowed []Network
		want    Address
		err     string
	}{
		{"", all, Address{}, ""},
		{"off", all, Address{}, ""},
		{"127.0.0.1:9310", all, Address{Network: TCP, Addr: "127.0.0.1:9310"}, ""},
		{"tcp://0.0.0.0:514", all, Address{Network: TCP, Addr: "0.0.0.0:514"}, ""},
		{"unix:/run/hapilot/spoe.sock", all, Address{Network: Unix, Addr: "/run/hapilot/spoe.sock"}, ""},
		{"unix:///run/x.sock", all, Address{Network: Unix, Addr: "/run/x.sock"}, ""},
		{"unixgram:///dev/log", all, Address{Network: Unixgram, Addr: "/dev/log"}, ""},
		{"udp://127.0.0.1:514", all, Address{Network: UDP, Addr: "127.0.0.1:514"}, ""},
		{"udp://127.0.0.1:514", []Network{TCP, Unix}, Address{}, "want host:port, unix:/path, or off"},
		{"12345", all, Address{}, "want host:port"},
		{"unix:relative.sock", all, Address{}, "absolute"},
	} {
		got, err := ParseAddress("x-listen", tc.in, tc.allowed...)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: %+v %v, want %+v", tc.in, got, err, tc.want)
		}
		if again, err := ParseAddress("x-listen", got.String(), tc.allowed...); err != nil || again != got {
			t.Errorf("%q: %s does not read back: %+v %v", tc.in, got, again, err)
		}
	}
}
