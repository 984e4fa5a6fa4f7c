package netx

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The abstract forms parse as HAProxy spells them, and a bad name says
// what a good one is.
func TestParseAbstractAddress(t *testing.T) {
	for _, tc := range []struct {
		in      string
		allowed []Network
		want    Address
		err     string
	}{
		{in: "abns@hapilot-spoe", allowed: []Network{TCP, Unix, Abstract}, want: Address{Network: Abstract, Addr: "hapilot-spoe"}},
		{in: "abns://hapilot-spoe", allowed: []Network{Abstract}, want: Address{Network: Abstract, Addr: "hapilot-spoe"}},
		{in: "abnsgram@hapilot-log", allowed: []Network{UDP, AbstractGram}, want: Address{Network: AbstractGram, Addr: "hapilot-log"}},
		{in: "abns@", allowed: []Network{Abstract}, err: "an abstract name is 1 to 107 bytes"},
		{in: "abns@a/b", allowed: []Network{Abstract}, err: "without NUL, slash or space"},
		{in: "abns@" + strings.Repeat("x", 108), allowed: []Network{Abstract}, err: "1 to 107 bytes"},
		{in: "abnsgram@x", allowed: []Network{TCP, Abstract}, err: "want host:port, abns@name, or off"},
	} {
		got, err := ParseAddress("spoe-listen", tc.in, tc.allowed...)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err = %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q: got %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if got.String() != strings.Replace(tc.in, "://", "@", 1) {
			t.Errorf("%q: String() = %q", tc.in, got.String())
		}
	}
}

// HAProxy's abns@NAME fills sun_path with NULs after the name: a peer
// dialling that padded address reaches the listener, and the short form
// (what other programs use) does not, so a listener that bound the short
// form would never hear from HAProxy.
func TestAbstractListenerTakesHAProxysPaddedName(t *testing.T) {
	name := "hapilot-test-" + strings.ReplaceAll(t.Name(), "/", "-")
	ln, err := ListenAddress(Address{Network: Abstract, Addr: name})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if got := ln.Addr().String(); got != "abns@"+name {
		t.Errorf("Addr = %q", got)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("ok"))
			c.Close()
		}
	}()
	c, err := net.Dial("unix", abstractPath(name))
	if err != nil {
		t.Fatalf("the padded name HAProxy dials: %v", err)
	}
	buf := make([]byte, 2)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "ok" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	c.Close()
	if _, err := net.Dial("unix", "@"+name); err == nil {
		t.Fatal("the short abstract name reached the listener; HAProxy's padded one is the one bound")
	}
}

func TestPeersAllow(t *testing.T) {
	p := &Peers{UIDs: []int{0, 1000}, GIDs: []int{105}}
	for _, tc := range []struct {
		c    Cred
		want bool
	}{
		{Cred{UID: 0, GID: 0}, true},
		{Cred{UID: 1000, GID: 1000}, true},
		{Cred{UID: 102, GID: 105}, true},
		{Cred{UID: 102, GID: 102, Groups: []int{7, 105}}, true},
		{Cred{UID: 65534, GID: 65534}, false},
		{Cred{UID: 65534, GID: 65534, Groups: []int{65534}}, false},
	} {
		if got := p.Allows(tc.c); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.c, got, tc.want)
		}
	}
}

// dialAs runs this test binary again as uid/gid, to dial the abstract
// name (stream) or send one datagram to it (gram), and returns what the
// child printed; it needs root to change users.
func dialAs(t *testing.T, uid, gid uint32, network, name string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("changing users needs root")
	}
	cmd := exec.Command(helperCopy(t), "-test.run=^TestPeerCredHelper$")
	cmd.Env = append(os.Environ(), "NETX_PEER_HELPER="+network, "NETX_PEER_NAME="+name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper as %d:%d: %v: %s", uid, gid, err, out)
	}
	return string(out)
}

// helperCopy copies this test binary where another user may run it: the
// build's own folder is its owner's alone.
func helperCopy(t *testing.T) string {
	dir, err := os.MkdirTemp("", "netx-helper")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	path := dir + "/netx.test"
	if err := os.WriteFile(path, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPeerCredHelper is the child dialAs runs; it does nothing in a plain
// test run.
func TestPeerCredHelper(t *testing.T) {
	network, name := os.Getenv("NETX_PEER_HELPER"), os.Getenv("NETX_PEER_NAME")
	if network == "" {
		return
	}
	c, err := net.Dial(network, abstractPath(name))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if network == "unixgram" {
		c.Write([]byte("hello"))
		return
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 8)
	n, _ := c.Read(buf)
	os.Stdout.WriteString("read:" + string(buf[:n]) + "\n")
}

// Only the allowed peers are let in: another user's connection is closed
// unanswered and counted, with its credentials kept; its datagrams are
// dropped and counted too.
func TestAbstractSocketsRefuseOtherUsers(t *testing.T) {
	peers := &Peers{UIDs: []int{0}, GIDs: []int{4242}}
	name := "hapilot-test-peers"
	ln, err := ListenAddress(Address{Network: Abstract, Addr: name, Peers: peers})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("ok"))
			c.Close()
		}
	}()
	if out := dialAs(t, 65534, 65534, "unix", name); strings.Contains(out, "read:ok") {
		t.Fatalf("a stranger was answered: %s", out)
	}
	if out := dialAs(t, 65534, 4242, "unix", name); !strings.Contains(out, "read:ok") {
		t.Fatalf("the allowed group was not answered: %s", out)
	}
	pl := ln.(*PeerListener)
	last, ok := pl.Refused.Last()
	if pl.Refused.Count.Load() != 1 || !ok || last.UID != 65534 {
		t.Fatalf("refused %d, last %+v", pl.Refused.Count.Load(), last)
	}

	pc, err := ListenPacketAddress(Address{Network: AbstractGram, Addr: name + "-gram", Peers: peers})
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	dialAs(t, 65534, 65534, "unixgram", name+"-gram")
	dialAs(t, 65534, 4242, "unixgram", name+"-gram")
	pc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	n, _, err := pc.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if got := pc.(*PeerPacketConn).Refused.Count.Load(); got != 1 {
		t.Fatalf("refused datagrams %d, want 1", got)
	}
}
