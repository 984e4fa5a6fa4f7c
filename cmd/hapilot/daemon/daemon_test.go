package daemon

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hapilot/hapilot/cmd/hapilot/config"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// serve runs d until t ends, and fails t if Serve returns an error.
func serve(t *testing.T, d *Daemon) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
}

// TestMetricsCountIngestErrors starts the whole agent on free ports, with
// a runtime socket that does not exist, feeds its SPOE port a frame that
// breaks the protocol, and reads /metrics and /status.
func TestMetricsCountIngestErrors(t *testing.T) {
	c := parseConfig(t, []string{"--spoe-listen", "127.0.0.1:0", "--status-listen", "127.0.0.1:0",
		"--haproxy-socket", t.TempDir() + "/missing.sock", "--interval", "250ms"})
	d, err := New(*c, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	serve(t, d)

	conn, err := net.Dial("tcp", d.SPOEAddr())
	if err != nil {
		t.Fatal(err)
	}
	frame := []byte{0, 0, 0, 2, 1, 0} // shorter than any frame header
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	// The agent answers with AGENT-DISCONNECT and closes.
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [4]byte
	if _, err := io.ReadFull(conn, hdr[:]); err != nil {
		t.Fatalf("no disconnect frame: %v", err)
	}
	body := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(conn, body); err != nil || body[0] != 0x66 {
		t.Fatalf("reply %x, %v", body, err)
	}
	conn.Close()

	get := func(path string) string {
		code, b, err := fasthttp.Get(nil, "http://"+d.StatusAddr()+path)
		if err != nil || code != 200 {
			t.Fatalf("GET %s: %d %v", path, code, err)
		}
		return string(b)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		m := get("/metrics")
		if strings.Contains(m, "hapilot_ingest_errors_total 1\n") && !strings.Contains(m, "hapilot_state_errors_total 0\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics never showed the ingest error and the missing socket:\n%s", m)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if s := get("/status"); !strings.Contains(s, `"policy": "rules"`) {
		t.Fatalf("status: %s", s)
	}
}

// A link planted at the audit log's path is refused, never appended
// through; /status served beyond loopback needs a token.
func TestAuditLinkRefusedAndStatusWarned(t *testing.T) {
	dir := t.TempDir()
	victim, audit := filepath.Join(dir, "victim"), filepath.Join(dir, "audit.jsonl")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, audit); err != nil {
		t.Fatal(err)
	}
	build := func(extra ...string) (*Daemon, string, error) {
		args := append([]string{"--spoe-listen", "off", "--haproxy-socket", "/nonexistent.sock"}, extra...)
		c := parseConfig(t, args)
		var logs strings.Builder
		d, err := New(*c, zerolog.New(&logs))
		return d, logs.String(), err
	}
	if _, _, err := build("--status-listen", "off", "--audit-log", audit); err == nil || !strings.Contains(err.Error(), "symbolic link is refused") {
		t.Fatalf("err %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Fatalf("victim %q", b)
	}
	if _, _, err := build("--status-listen", "0.0.0.0:0"); err == nil || !strings.Contains(err.Error(), "beyond loopback: set status-token") {
		t.Fatalf("beyond loopback with no token: %v", err)
	}
	d, _, err := build("--status-listen", "0.0.0.0:0", "--status-token", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
}

// A state file or an audit log that is not a regular file is refused at
// start with a clear error, at once. Before, a FIFO as --audit-log
// blocked the start in open (no listener, SIGTERM ignored), and one as
// --state-file blocked the first step's read and /status with it.
func TestNonRegularFilesRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// A reader on a second FIFO: opening it for writing then succeeds, and
	// only the check after the open can tell it from a file.
	readFifo := filepath.Join(dir, "read-fifo")
	if err := syscall.Mkfifo(readFifo, 0o600); err != nil {
		t.Fatal(err)
	}
	reader, err := os.OpenFile(readFifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"state file is a FIFO", []string{"--state-file", fifo}, "is a FIFO"},
		{"state file is a directory", []string{"--state-file", dir}, "is a directory"},
		{"audit log is a FIFO no one reads", []string{"--audit-log", fifo}, "is a FIFO"},
		{"audit log is a FIFO someone reads", []string{"--audit-log", readFifo}, "is a FIFO"},
		{"audit log is a character device", []string{"--audit-log", "/dev/null"}, "is a character device"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := parseConfig(t, append([]string{"--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", "/nonexistent.sock"}, tc.args...))
			done := make(chan error, 1)
			go func() {
				d, err := New(*c, zerolog.Nop())
				if err == nil {
					d.Close()
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "not a regular file") {
					t.Fatalf("err %v, want %q", err, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the start blocked")
			}
		})
	}
}

// With no response reported, the warning names each path the agent
// listens on and what to check; the first response clears it.
func TestTelemetryWarning(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"spoe", []string{"--spoe-listen", "unix:" + filepath.Join(t.TempDir(), "spoe.sock")},
			[]string{"no response reported by HAProxy in 30s", "SPOE at unix:", "holds the stanza", "--spoe-listen off"}},
		{"counters only", []string{"--spoe-listen", "off"},
			[]string{"HAProxy's counters through", "check that the backends take traffic"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--status-listen", "off", "--haproxy-socket", t.TempDir() + "/missing.sock"}, tt.args...)
			c := parseConfig(t, args)
			d, err := New(*c, zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			w := d.Paths.NoResponse(30 * time.Second)
			for _, s := range tt.want {
				if !strings.Contains(w, s) {
					t.Errorf("warning %q lacks %q", w, s)
				}
			}
			d.Store.Record(window.Event{Backend: []byte("app"), Server: []byte("s1"), Status: 200})
			if w := d.Paths.NoResponse(30 * time.Second); w != "" {
				t.Errorf("still warned after a response: %q", w)
			}
		})
	}
}

// parseConfig is the agent's settings from args, as `hapilot run` parses
// them.
func parseConfig(t *testing.T, args []string) *config.Config {
	t.Helper()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := config.Register(fs)
	// The test's own state file and control socket: the defaults are the
	// user's state directory and /run/hapilot, shared with anything else
	// on the machine. The test's args come after, and win.
	dir := t.TempDir()
	own := []string{"--state-file", filepath.Join(dir, "state.json"), "--control-socket", "unix:" + filepath.Join(dir, "ctl.sock")}
	if err := config.Parse(fs, append(own, args...)); err != nil {
		t.Fatal(err)
	}
	return c
}

// Every stream listener is capped at MaxConns and evicts at its cap; the
// count is in /metrics.
func TestListenersEvictAtTheirCaps(t *testing.T) {
	c := parseConfig(t, []string{"--spoe-listen", "127.0.0.1:0", "--status-listen", "127.0.0.1:0",
		"--haproxy-socket", t.TempDir() + "/missing.sock", "--interval", "250ms"})
	d, err := New(*c, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	for i := 0; i < MaxConns+1; i++ {
		conn, err := net.Dial("tcp", d.SPOEAddr())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
	}
	want := []string{"hapilot_spoe_connections_evicted_total 1\n", fmt.Sprintf("hapilot_spoe_connections_open %d\n", MaxConns)}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, b, err := fasthttp.Get(nil, "http://"+d.StatusAddr()+"/metrics")
		m := string(b)
		if err == nil && strings.Contains(m, want[0]) && strings.Contains(m, want[1]) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics never showed %q:\n%s", want, m)
		}
	}
}

// The state file at start: one group or others may write is refused, the
// agent does not start, and the error names the file, its mode and the
// fix; one it cannot read is kept aside and, beyond the log line, is a
// warning on /status for as long as the agent runs. Before, /status said
// nothing ("warnings": null) while the operator's holds were forgotten.
func TestStateFileAtStart(t *testing.T) {
	dir := t.TempDir()
	forged := filepath.Join(dir, "forged.json")
	if err := os.WriteFile(forged, []byte(`{"version":2,"changes":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(forged, 0o666); err != nil {
		t.Fatal(err)
	}
	c := parseConfig(t, []string{"--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", "/nonexistent.sock", "--state-file", forged})
	if d, err := New(*c, zerolog.Nop()); err == nil {
		d.Close()
		t.Fatal("a state file others may write was read")
	} else if !strings.Contains(err.Error(), forged+" has mode 0666") || !strings.Contains(err.Error(), "chmod 644 "+forged) {
		t.Fatalf("err %v", err)
	}

	garbled := filepath.Join(dir, "garbled.json")
	if err := os.WriteFile(garbled, []byte(`{"version":2,"changes":`), 0o600); err != nil {
		t.Fatal(err)
	}
	c = parseConfig(t, []string{"--spoe-listen", "off", "--status-listen", "127.0.0.1:0", "--haproxy-socket", "/nonexistent.sock", "--state-file", garbled})
	d, err := New(*c, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	serve(t, d)
	code, b, err := fasthttp.Get(nil, "http://"+d.StatusAddr()+"/status")
	if err != nil || code != 200 {
		t.Fatalf("GET /status: %d %v", code, err)
	}
	var st struct{ Warnings []string }
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, w := range st.Warnings {
		found = found || (strings.Contains(w, "the state file "+garbled+" could not be read at start") && strings.Contains(w, "kept as "+garbled+".bad-"))
	}
	if !found {
		t.Fatalf("warnings %q", st.Warnings)
	}
}
