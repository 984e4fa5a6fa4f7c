package netx

import (
	"net"
	"strings"
	"testing"
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
