package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/cmd/hapilot/ctl"
	"github.com/hapilot/hapilot/internal/lib/netx"
	"github.com/rs/zerolog"
)

// The control socket is a unix socket of mode 0660 that answers each
// command with a result or a refusal's reason; a pause it takes is in
// the state file, and the agent's status, at once.
func TestControlSocket(t *testing.T) {
	dir := t.TempDir()
	sock, state, audit := filepath.Join(dir, "run", "ctl.sock"), filepath.Join(dir, "state.json"), filepath.Join(dir, "audit.jsonl")
	c := parseConfig(t, []string{"--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", filepath.Join(dir, "missing.sock"),
		"--control-socket", "unix:" + sock, "--state-file", state, "--mode", "observe", "--audit-log", audit, "--interval", "250ms"})
	d, err := New(*c, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	serve(t, d)
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o660 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("control socket %v, %v", fi.Mode(), err)
	}
	tests := []struct {
		req     ctl.Request
		ok      bool
		inReply string // in the message, the error or the result
	}{
		{ctl.Request{Command: ctl.Status}, true, `"mode":"observe"`},
		{ctl.Request{Command: ctl.List}, true, `[]`},
		// A backend's pause needs HAProxy's word that the agent governs it.
		{ctl.Request{Command: ctl.Pause, Backend: "app", For: "10m"}, false, "failed: cannot check that the agent governs backend app"},
		// A name HAProxy could not hold is refused before anything is read.
		{ctl.Request{Command: ctl.Pause, Backend: "app\x1b[2J"}, false, `pause: not a backend name: name "app\x1b[2J" holds '\x1b'`},
		{ctl.Request{Command: ctl.Pause, Backend: "ap\np"}, false, "not a backend name"},
		{ctl.Request{Command: ctl.Pause, Backend: strings.Repeat("a", 256)}, false, "not a backend name: name of 256 bytes"},
		// Over the request bound: read to its end, refused, answered.
		{ctl.Request{Command: ctl.Pause, Backend: strings.Repeat("a", 4<<20)}, false, "line too long: over 65536 bytes"},
		{ctl.Request{Command: ctl.Pause, For: "10m"}, true, "paused (every backend, until"},
		{ctl.Request{Command: ctl.Status}, true, `"backend":"*"`},
		{ctl.Request{Command: ctl.Pause, For: "soon"}, false, `pause --for "soon"`},
		{ctl.Request{Command: ctl.Resume, Backend: "app"}, true, "nothing was paused there; still paused: paused (every backend"},
		{ctl.Request{Command: ctl.Resume}, true, "1 pause(s) ended"},
		{ctl.Request{Command: ctl.Resume}, true, "nothing was paused"},
		{ctl.Request{Command: ctl.Explain, Server: "app"}, false, "explain needs BACKEND/SERVER"},
		{ctl.Request{Command: ctl.Explain, Server: "app/s1"}, false, "no step has read HAProxy yet"},
		{ctl.Request{Command: ctl.Release, Server: "app/s1"}, false, "failed: read server states"},
		{ctl.Request{Command: "reboot"}, false, `unknown command "reboot"`},
	}
	for _, tc := range tests {
		a, err := ctl.Do(context.Background(), sock, tc.req)
		if err != nil {
			t.Fatalf("%+v: %v", tc.req, err)
		}
		reply := a.Message + a.Error + string(a.Result)
		if a.OK != tc.ok || !strings.Contains(reply, tc.inReply) {
			t.Errorf("%+v: ok %v, reply %s; want ok %v and %q", tc.req, a.OK, reply, tc.ok, tc.inReply)
		}
	}
	// The pause taken and ended above went through the state file.
	a, _ := ctl.Do(context.Background(), sock, ctl.Request{Command: ctl.Pause, For: "1h"})
	var p agent.Pause
	if err := json.Unmarshal(a.Result, &p); err != nil || p.Backend != agent.AllBackends || !strings.HasPrefix(p.By, "ctl uid ") {
		t.Fatalf("pause result %s: %v", a.Result, err)
	}
	// The state file is written by its own goroutine: wait for the pause.
	var b []byte
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(string(b), `"pauses"`); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("state file %s: %v", b, err)
		}
		b, err = os.ReadFile(state)
	}
	// The audit log holds the events (the start, the pauses and resumes)
	// and, without --audit-steps, no step's snapshot.
	d.Loop.Step(context.Background()) // a step that cannot read HAProxy
	// The audit log is written by its own goroutine: wait for the events.
	var log string
	wants := []string{`"type":"start"`, `"type":"pause"`, `"type":"resume"`, `"schema":1`, `"by":"ctl uid `}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		b, err = os.ReadFile(audit)
		if err != nil {
			t.Fatal(err)
		}
		log = string(b)
		all := true
		for _, want := range wants {
			all = all && strings.Contains(log, want)
		}
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit log lacks one of %q:\n%s", wants, log)
		}
	}
	if strings.Contains(log, `"type":"step"`) {
		t.Errorf("a step snapshot without --audit-steps:\n%s", log)
	}
}

// At the control socket's cap, a connection that has sent its whole
// request is never evicted mid-command: under a reconnect loop that
// keeps the cap full (each connection it holds is redialled the moment
// the agent closes it), every one of 20 pauses gets its answer. Before,
// the command ran and its caller read EOF: 10 to 12 of 20.
func TestControlCommandsAnsweredUnderReconnectLoop(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	c := parseConfig(t, []string{"--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", filepath.Join(dir, "missing.sock"),
		"--control-socket", "unix:" + sock, "--state-file", filepath.Join(dir, "state.json"), "--mode", "observe", "--interval", "250ms"})
	d, err := New(*c, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	serve(t, d)
	ctx, stop := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	defer func() { stop(); loops.Wait() }()
	var redials atomic.Int64
	for i := 0; i < MaxControlConns; i++ {
		loops.Add(1)
		go func() {
			defer loops.Done()
			var dl net.Dialer
			for ctx.Err() == nil {
				conn, err := dl.DialContext(ctx, "unix", sock)
				if err != nil {
					continue
				}
				stopRead := context.AfterFunc(ctx, func() { conn.Close() })
				_, _ = io.Copy(io.Discard, conn) // until the agent closes it
				stopRead()
				conn.Close()
				redials.Add(1)
			}
		}()
	}
	ln := d.controlLn.(*netx.Listener)
	for deadline := time.Now().Add(10 * time.Second); ln.Open() < MaxControlConns; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the reconnect loop holds %d connections", ln.Open())
		}
	}
	lost := 0
	for i := 0; i < 20; i++ {
		a, err := ctl.Do(context.Background(), sock, ctl.Request{Command: ctl.Pause, For: "1h"})
		if err != nil || !a.OK {
			lost++
			t.Errorf("pause %d: %+v, %v", i, a, err)
		}
	}
	if lost > 0 || ln.Evicted.Load() == 0 {
		t.Fatalf("%d of 20 pauses without their answer; the loop redialled %d times, %d evicted", lost, redials.Load(), ln.Evicted.Load())
	}
}

// syncBuffer is a log sink the agent's goroutines may write at once.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Every control request is logged with its caller's uid and pid: the
// read-only ones, a malformed one, one that changed nothing. Before, only
// refusals and changes were.
func TestControlRequestsLoggedWithCaller(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	c := parseConfig(t, []string{"--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", filepath.Join(dir, "missing.sock"),
		"--control-socket", "unix:" + sock, "--state-file", filepath.Join(dir, "state.json"), "--mode", "observe", "--interval", "250ms"})
	var logs syncBuffer
	d, err := New(*c, zerolog.New(&logs))
	if err != nil {
		t.Fatal(err)
	}
	serve(t, d)
	for _, req := range []ctl.Request{{Command: ctl.Status}, {Command: ctl.List}, {Command: ctl.Resume, Backend: "app"}} {
		if a, err := ctl.Do(context.Background(), sock, req); err != nil || !a.OK {
			t.Fatalf("%+v: %+v %v", req, a, err)
		}
	}
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = conn.Write([]byte("status please\n"))
	answer, _ := io.ReadAll(conn)
	conn.Close()
	if !strings.Contains(string(answer), `"error":"refused: request: invalid character`) {
		t.Fatalf("malformed request's answer %s", answer)
	}
	by := fmt.Sprintf(`"by":"ctl uid %d pid `, os.Getuid())
	for _, want := range []string{
		`"command":"status"`, `"command":"list"`, `"command":"resume","server":"","backend":"app"`, `"message":"control request malformed"`,
	} {
		found := false
		for _, line := range strings.Split(logs.String(), "\n") {
			found = found || (strings.Contains(line, want) && strings.Contains(line, by))
		}
		if !found {
			t.Errorf("no log line with %s and %s:\n%s", want, by, logs.String())
		}
	}
}
