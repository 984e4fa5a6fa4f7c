package ctl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// A request goes out as one JSON line and the answer comes back; a line
// over MaxLine is refused, not read whole.
func TestProtocol(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "ctl.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan Request, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, err := ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		got <- req
		b, _ := json.Marshal(Answer{OK: true, Message: "paused"})
		c.Write(append(b, '\n'))
	}()
	a, err := Do(context.Background(), sock, Request{Command: Pause, Backend: "app", For: "10m"})
	if err != nil || !a.OK || a.Message != "paused" {
		t.Fatalf("answer %+v, %v", a, err)
	}
	if req := <-got; req != (Request{Command: Pause, Backend: "app", For: "10m"}) {
		t.Fatalf("request %+v", req)
	}
	// A request over MaxRequest is read to its end and refused; the next
	// line is read whole.
	long := strings.Repeat("x", MaxRequest+1) + "\n" + `{"command":"status"}` + "\n"
	r := bufio.NewReaderSize(strings.NewReader(long), 4096)
	if _, err := ReadRequest(r); !errors.Is(err, ErrTooLong) {
		t.Fatalf("long line: %v", err)
	}
	if req, err := ReadRequest(r); err != nil || req.Command != Status {
		t.Fatalf("the line after: %+v, %v", req, err)
	}
	if _, err := Do(context.Background(), filepath.Join(t.TempDir(), "none.sock"), Request{Command: Status}); err == nil ||
		!strings.Contains(err.Error(), "is it running?") {
		t.Fatalf("no agent: %v", err)
	}
}
