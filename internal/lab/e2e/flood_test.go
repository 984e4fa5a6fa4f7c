//go:build e2e

package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
)

// A connection flood cannot stop the agent. `hapilot run` runs with 200
// file descriptors (prlimit); 300 connections each to its status, SPOE and
// syslog-stream ports run it out of them (before, an accept error there
// made the agent exit), and it answers /status once they close. Silent
// SPOE connections are closed by the agent after the hello timeout.
func TestConnectionFloodCannotStopTheAgent(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skip("prlimit (util-linux) not installed")
	}
	ports, err := haproxyproc.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	status, spoe, syslog := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1]), fmt.Sprintf("127.0.0.1:%d", ports[2])
	cmd := exec.Command("prlimit", "--nofile=200:200", agentBinary, "run", "--haproxy-socket", "/nonexistent.sock", "--interval", "1s",
		"--status-listen", status, "--spoe-listen", spoe, "--syslog-listen", "tcp://"+syslog, "--log-format", "json",
		"--state-file", "off", "--control-socket", "unix:"+filepath.Join(t.TempDir(), "ctl.sock"))
	logs := &strings.Builder{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	}()
	get := func() (string, error) {
		c, err := net.DialTimeout("tcp", status, time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
		return bufio.NewReader(c).ReadString('\n')
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if line, err := get(); err == nil && strings.Contains(line, "200") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent never answered /status")
		}
	}
	conns := map[string][]net.Conn{}
	total := 0
	for _, addr := range []string{status, spoe, syslog} {
		for i := 0; i < 300; i++ {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				break // the backlog is full: the flood is as big as it gets
			}
			conns[addr] = append(conns[addr], c)
			total++
		}
	}
	t.Logf("%d connections opened against an agent with 200 file descriptors", total)
	time.Sleep(2 * time.Second)
	select {
	case err := <-exited:
		t.Fatalf("the agent exited under the flood: %v", err)
	default:
	}
	// The silent SPOE connections: the agent closes them after its hello
	// timeout (10 s) once it has accepted them.
	spoeConns := conns[spoe]
	for _, c := range append(conns[status], conns[syslog]...) {
		c.Close()
	}
	closed := 0
	for _, c := range spoeConns {
		_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
		if _, err := io.ReadAll(c); err == nil {
			closed++ // EOF: the agent closed it
		}
		c.Close()
	}
	if closed < len(spoeConns)/2 {
		t.Errorf("the agent closed %d of %d silent SPOE connections", closed, len(spoeConns))
	}
	if line, err := get(); err != nil || !strings.Contains(line, "200") {
		t.Fatalf("/status after the flood: %q %v", line, err)
	}
	select {
	case err := <-exited:
		t.Fatalf("the agent exited: %v", err)
	default:
	}
}
