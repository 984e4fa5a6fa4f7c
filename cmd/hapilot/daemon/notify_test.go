package daemon

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/rs/zerolog"
)

// With --notify-webhook the agent posts its events to the receiver from
// a goroutine of its own: the telemetry-silence hook's event arrives, in
// the event log's shape.
func TestWebhookReceivesEvents(t *testing.T) {
	got := make(chan agent.Event, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var ev agent.Event
		if err := json.Unmarshal(b, &ev); err != nil {
			t.Errorf("payload %s: %v", b, err)
		}
		got <- ev
	}))
	defer srv.Close()
	dir := t.TempDir()
	c := parseConfig(t, []string{"--spoe-listen", "off", "--status-listen", "off", "--haproxy-socket", filepath.Join(dir, "missing.sock"),
		"--notify-webhook", srv.URL})
	d, err := New(*c, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	serve(t, d)
	d.Loop.TelemetrySilent(30*time.Second, "no response reported by HAProxy in 30s")
	select {
	case ev := <-got:
		if ev.Type != agent.EventTelemetrySilent || ev.Schema != agent.EventSchema || ev.Host == "" || ev.Detail["silent_for"] != "30s" {
			t.Fatalf("event %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the webhook received nothing in 10 s")
	}
}
