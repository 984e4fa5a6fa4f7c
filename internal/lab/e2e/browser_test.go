//go:build e2e && browser

package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// TestLivePageInABrowser loads the agent's live page in Debian's
// Chromium, headless, driven through chromedriver's WebDriver API, during
// a demo fleet's run (srv3 and srv6 fail 5%): it waits until the page
// shows srv3 drained, saves a screenshot (HAPILOT_ARTIFACTS, else the
// temporary folder) and fails on any console error.
func TestLivePageInABrowser(t *testing.T) {
	for _, bin := range []string{"chromium", "chromedriver"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s: %v (apt-get install chromium chromium-driver; make test-browser does)", bin, err)
		}
	}
	ports, err := haproxyproc.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	wd := startDriver(t, ports[0])
	var shown time.Duration
	var pageErr error
	var consoleErrors []string
	var shot []byte
	start := time.Now()
	out := run(t, scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 300, Duration: 30 * time.Second,
		Policy: "rules", StatusListen: fmt.Sprintf("127.0.0.1:%d", ports[1]),
		At: map[time.Duration]func(*scenario.Env){time.Second: func(env *scenario.Env) {
			s, err := wd.session(t.TempDir())
			if err != nil {
				pageErr = err
				return
			}
			defer s.close()
			if err := s.call("POST", "/url", map[string]any{"url": "http://" + env.Daemon.StatusAddr() + "/"}, nil); err != nil {
				pageErr = err
				return
			}
			const probe = `const r = document.querySelector('tr[data-server="app/srv3"]'); return r ? r.dataset.state : null`
			for deadline := time.Now().Add(25 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				var state any
				if err := s.call("POST", "/execute/sync", map[string]any{"script": probe, "args": []any{}}, &state); err != nil {
					pageErr = err
					return
				}
				if state == "drain" {
					shown = time.Since(start)
					break
				}
			}
			var b64 string
			if err := s.call("GET", "/screenshot", nil, &b64); err != nil {
				pageErr = err
				return
			}
			shot, _ = base64.StdEncoding.DecodeString(b64)
			var logs []struct{ Level, Message string }
			if err := s.call("POST", "/se/log", map[string]any{"type": "browser"}, &logs); err != nil {
				pageErr = err
				return
			}
			for _, l := range logs {
				if l.Level == "SEVERE" {
					consoleErrors = append(consoleErrors, l.Message)
				}
			}
		}}})
	if pageErr != nil {
		t.Fatal(pageErr)
	}
	if shown == 0 {
		t.Errorf("the page never showed srv3 drained; HAProxy drained it at %v", out.DrainedAt["srv3"])
	}
	t.Logf("the page showed srv3 drained %v into the run (HAProxy drained it at %v)", shown.Round(100*time.Millisecond), out.DrainedAt["srv3"])
	if len(consoleErrors) > 0 {
		t.Errorf("console errors: %q", consoleErrors)
	}
	dir := os.Getenv("HAPILOT_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "hapilot-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if len(shot) < 1000 || !bytes.HasPrefix(shot, []byte("\x89PNG")) {
		t.Fatalf("screenshot of %d bytes", len(shot))
	}
	path := filepath.Join(dir, "live-page.png")
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}

// driver is a chromedriver process.
type driver struct{ base string }

func startDriver(t *testing.T, port int) *driver {
	t.Helper()
	cmd := exec.Command("chromedriver", fmt.Sprintf("--port=%d", port))
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	d := &driver{base: fmt.Sprintf("http://127.0.0.1:%d", port)}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if r, err := http.Get(d.base + "/status"); err == nil {
			r.Body.Close()
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("chromedriver did not start:\n%s", log.String())
		}
	}
}

// session opens a browser: Chromium headless with the flags this
// machine's closed network needs, and its console kept.
func (d *driver) session(profile string) (*session, error) {
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--window-size=1400,900", "--user-data-dir=" + profile}
	caps := map[string]any{"capabilities": map[string]any{"alwaysMatch": map[string]any{
		"browserName":        "chrome",
		"goog:chromeOptions": map[string]any{"binary": "/usr/bin/chromium", "args": args},
		"goog:loggingPrefs":  map[string]any{"browser": "ALL"},
	}}}
	var v struct {
		SessionID string `json:"sessionId"`
	}
	s := &session{base: d.base + "/session"}
	if err := s.call("POST", "", caps, &v); err != nil {
		return nil, fmt.Errorf("new session: %w", err)
	}
	s.base += "/" + v.SessionID
	return s, nil
}

type session struct{ base string }

// call sends one WebDriver command and decodes its value into out.
func (s *session) call(method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != 200 {
		return fmt.Errorf("webdriver %s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	var env struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(env.Value, out)
}

func (s *session) close() { _ = s.call("DELETE", "", nil, nil) }
