package notify

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/rs/zerolog"
)

func event(typ agent.EventType) agent.Event {
	k := agent.Key{Backend: "app", Server: "srv3"}
	return agent.Event{Schema: agent.EventSchema, Type: typ, Time: time.Date(2026, 12, 3, 0, 10, 0, 0, time.UTC),
		Identity: agent.Identity{Host: "lb1", Version: "v1"}, Mode: agent.ModeEnforce, Server: &k,
		Action: &agent.Action{Kind: agent.Drain, Backend: "app", Server: "srv3", Reason: reason, Test: &agent.TestFigures{
			Name: "windowed", Statistic: pValue, Threshold: 1e-6 / 3, PValue: &pValue, Rate: 0.05, Baseline: 1.0 / 3600}},
		Reason: reason}
}

const reason = "5xx 5.00% (90/1800) vs peers 0.03% (1/3600), p=3.1e-24"

var pValue = 3.1e-24

// receiver records the bodies it takes, answering each with status.
type receiver struct {
	mu     sync.Mutex
	bodies []string
	status int
	hold   chan struct{} // when set, each request waits for it
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if r.hold != nil {
		select {
		case <-r.hold:
		case <-req.Context().Done():
			return
		}
	}
	b, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.bodies = append(r.bodies, string(b))
	status := r.status
	r.mu.Unlock()
	w.WriteHeader(status)
}

func (r *receiver) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bodies...)
}

// sendQueued delivers every queued event, as Run's loop does, in the
// test's goroutine: no sleeping, no polling.
func sendQueued(n *Notifier) {
	for {
		select {
		case ev := <-n.queue:
			n.deliver(context.Background(), ev)
		default:
			return
		}
	}
}

// A healthy receiver gets one payload per notified event, in the shape
// its format promises; would-actions and steps are not posted.
func TestHealthyReceiver(t *testing.T) {
	tests := []struct {
		format Format
		check  func(t *testing.T, body string)
	}{
		{FormatEvent, func(t *testing.T, body string) {
			var ev agent.Event
			if err := json.Unmarshal([]byte(body), &ev); err != nil || ev.Type != agent.EventDrain || ev.Schema != 1 || ev.Server.String() != "app/srv3" {
				t.Fatalf("event payload %s: %v", body, err)
			}
			if f := ev.Action.Test; f == nil || f.Name != "windowed" || f.PValue == nil || *f.PValue != pValue || f.Threshold != 1e-6/3 {
				t.Fatalf("event payload without its test's figures: %s", body)
			}
		}},
		{FormatAlertmanager, func(t *testing.T, body string) {
			var alerts []struct {
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
				StartsAt    time.Time         `json:"startsAt"`
				EndsAt      time.Time         `json:"endsAt"`
			}
			if err := json.Unmarshal([]byte(body), &alerts); err != nil || len(alerts) != 1 {
				t.Fatalf("alertmanager payload %s: %v", body, err)
			}
			a := alerts[0]
			if a.Labels["alertname"] != "HapilotDrain" || a.Labels["server"] != "srv3" || a.Labels["backend"] != "app" ||
				!strings.Contains(a.Annotations["summary"], "drain app/srv3") || !a.EndsAt.Equal(a.StartsAt.Add(AlertFor)) ||
				a.Annotations["test"] != "windowed" || a.Annotations["p_value"] != "3.1e-24" || a.Annotations["statistic"] != "3.1e-24" {
				t.Fatalf("alert %+v", a)
			}
		}},
		{FormatSlack, func(t *testing.T, body string) {
			var m map[string]string
			if err := json.Unmarshal([]byte(body), &m); err != nil || len(m) != 1 ||
				m["text"] != "hapilot on lb1: drain app/srv3: 5xx 5.00% (90/1800) vs peers 0.03% (1/3600), p=3.1e-24" {
				t.Fatalf("slack payload %s: %v", body, err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(string(tc.format), func(t *testing.T) {
			r := &receiver{status: http.StatusOK}
			srv := httptest.NewServer(r)
			defer srv.Close()
			n := New(Config{URL: srv.URL, Format: tc.format, Timeout: time.Second}, zerolog.Nop())
			n.Emit(event(agent.EventWould))
			n.Emit(event(agent.EventStep))
			n.Emit(event(agent.EventDrain))
			sendQueued(n)
			got := r.got()
			if len(got) != 1 || n.Counts().Sent != 1 {
				t.Fatalf("posted %d: %q", len(got), got)
			}
			tc.check(t, got[0])
		})
	}
}

// A failing receiver: a 5xx is retried with doubling backoff, then the
// event is dropped and counted; a 4xx is not retried.
func TestFailingReceiver(t *testing.T) {
	for _, tc := range []struct {
		status   int
		attempts int
		backoffs []time.Duration
	}{
		{http.StatusServiceUnavailable, Attempts, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}},
		{http.StatusTooManyRequests, Attempts, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}},
		{http.StatusBadRequest, 1, nil},
	} {
		t.Run(http.StatusText(tc.status), func(t *testing.T) {
			r := &receiver{status: tc.status}
			srv := httptest.NewServer(r)
			defer srv.Close()
			n := New(Config{URL: srv.URL, Format: FormatEvent, Timeout: time.Second}, zerolog.Nop())
			var mu sync.Mutex
			var slept []time.Duration
			n.Sleep = func(_ context.Context, d time.Duration) bool {
				mu.Lock()
				slept = append(slept, d)
				mu.Unlock()
				return true
			}
			n.Emit(event(agent.EventRefused))
			sendQueued(n)
			if n.Counts().Failed != 1 {
				t.Fatalf("counts %+v", n.Counts())
			}
			mu.Lock()
			defer mu.Unlock()
			if len(r.got()) != tc.attempts || len(slept) != len(tc.backoffs) || (len(slept) > 0 && slept[2] != tc.backoffs[2]) {
				t.Fatalf("%d attempts, backoffs %v; want %d, %v", len(r.got()), slept, tc.attempts, tc.backoffs)
			}
			if c := n.Counts(); c.Sent != 0 || c.QueueFull != 0 {
				t.Fatalf("counts %+v", c)
			}
		})
	}
}

// A slow receiver (it answers nothing until released) costs dropped
// events, never a blocked Emit: the queue holds what it can, the rest is
// counted, each attempt ends at the timeout.
func TestSlowReceiver(t *testing.T) {
	r := &receiver{status: http.StatusOK, hold: make(chan struct{})}
	srv := httptest.NewServer(r)
	defer srv.Close()
	defer close(r.hold)
	n := New(Config{URL: srv.URL, Format: FormatEvent, Timeout: 20 * time.Millisecond, Queue: 4}, zerolog.Nop())
	n.Sleep = func(context.Context, time.Duration) bool { return true }
	for range 6 { // before the sender runs: 4 queued, 2 dropped
		n.Emit(event(agent.EventDrain))
	}
	if c := n.Counts(); c.QueueFull != 2 {
		t.Fatalf("counts %+v, want 2 dropped at the queue", c)
	}
	// The sender takes one event and is stuck on it; meanwhile Emit
	// returns every time, and what the queue cannot hold is counted.
	ev := <-n.queue
	done := make(chan struct{})
	go func() { defer close(done); n.deliver(context.Background(), ev) }()
	for range 100 {
		n.Emit(event(agent.EventCut))
	}
	<-done
	sendQueued(n)
	// 4 queued at first, 1 taken, 1 more fits: 5 sent and failed after
	// their timeouts; 2 + 99 dropped at the queue.
	if c := n.Counts(); c.Sent != 0 || c.Failed != 5 || c.QueueFull != 101 {
		t.Fatalf("counts %+v", c)
	}
}

// Run sends what is queued, and at its stop gives the events still
// queued one attempt each.
func TestRunFlushesAtStop(t *testing.T) {
	r := &receiver{status: http.StatusOK}
	srv := httptest.NewServer(r)
	defer srv.Close()
	n := New(Config{URL: srv.URL, Format: FormatEvent, Timeout: time.Second}, zerolog.Nop())
	n.Emit(event(agent.EventDrain))
	n.Emit(event(agent.EventRelease))
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stopped before it starts: everything goes in the flush
	if err := n.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if c := n.Counts(); c.Sent != 2 || len(r.got()) != 2 {
		t.Fatalf("counts %+v, posted %d", c, len(r.got()))
	}
}

// The receiver answers 307 to another server: nothing is posted there
// (it could be a cloud's metadata address), the event fails at once with
// the reason, and the log names neither URL's path nor query.
func TestRedirectNeverFollowed(t *testing.T) {
	other := &receiver{status: http.StatusOK}
	target := httptest.NewServer(other)
	defer target.Close()
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusMovedPermanently, http.StatusFound, http.StatusPermanentRedirect} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			hits := 0
			first := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits++
				http.Redirect(w, r, target.URL+"/LOCSECRET?token=LOCQ", code)
			}))
			defer first.Close()
			var logs strings.Builder
			n := New(Config{URL: first.URL + "/services/T0/B0/PATHSECRET?token=QSECRET", Format: FormatEvent, Timeout: time.Second}, zerolog.New(&logs))
			n.Sleep = func(context.Context, time.Duration) bool { t.Error("a redirect was retried"); return true }
			n.Emit(event(agent.EventDrain))
			sendQueued(n)
			if got := other.got(); len(got) != 0 {
				t.Fatalf("the redirect's target received %d posts", len(got))
			}
			if hits != 1 || n.Counts().Failed != 1 {
				t.Fatalf("%d posts to the receiver, counts %+v", hits, n.Counts())
			}
			l := logs.String()
			if !strings.Contains(l, "redirect, never followed") || !strings.Contains(l, target.URL) {
				t.Fatalf("the log does not say why: %s", l)
			}
			for _, secret := range []string{"PATHSECRET", "QSECRET", "LOCSECRET", "LOCQ", "/services"} {
				if strings.Contains(l, secret) {
					t.Fatalf("the log carries %s: %s", secret, l)
				}
			}
		})
	}
}

// The webhook's URL carries its secrets in its user info, path and query:
// a failure's log line, and a bad URL's error, name its origin only.
func TestWebhookSecretsNeverLogged(t *testing.T) {
	secrets := []string{"hookuser", "HOOKPASS", "PATHSECRET", "QSECRET"}
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close() // a port that refuses: the client's *url.Error names the URL
	u := strings.Replace(dead.URL, "http://", "http://hookuser:HOOKPASS@", 1) + "/services/T0/B0/PATHSECRET?token=QSECRET"
	var logs strings.Builder
	n := New(Config{URL: u, Format: FormatEvent, Timeout: time.Second}, zerolog.New(&logs))
	n.Sleep = func(context.Context, time.Duration) bool { return true }
	n.Emit(event(agent.EventDrain))
	sendQueued(n)
	if l := logs.String(); !strings.Contains(l, "connection refused") || !strings.Contains(l, strings.TrimPrefix(dead.URL, "http://")) {
		t.Fatalf("the log does not say what failed: %s", l)
	}
	texts := []string{logs.String()}
	for _, bad := range []string{
		"ftp://hookuser:HOOKPASS@hooks.example/PATHSECRET?token=QSECRET",
		"http://hookuser:HOOKPASS@[::1/PATHSECRET?token=QSECRET",
		"hookuser:HOOKPASS@hooks.example/PATHSECRET?token=QSECRET",
		"http:///PATHSECRET?token=QSECRET",
	} {
		err := Config{URL: bad, Format: FormatEvent, Timeout: time.Second}.Validate()
		if err == nil {
			t.Fatalf("%s accepted", bad)
		}
		texts = append(texts, err.Error())
	}
	for _, text := range texts {
		for _, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%q carries %s", text, s)
			}
		}
	}
}
