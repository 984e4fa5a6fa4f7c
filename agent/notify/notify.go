// Package notify posts the agent's events to a webhook: one JSON payload
// per event that needs a person (an action, a refusal, a release, the
// fallback taking over, telemetry gone silent). It never blocks the
// loop: events wait in a bounded queue for one sender goroutine, which
// retries with backoff under a timeout; what the queue cannot hold, or a
// receiver never takes, is dropped and counted.
package notify

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/internal/lib/wait"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/enum"
	"github.com/hapilot/hapilot/internal/lib/promtext"
	"github.com/rs/zerolog"
)

// Format is the payload's shape.
type Format string

const (
	// FormatEvent posts the event as the event log writes it
	// (docs/reference/events.md).
	FormatEvent Format = "event"
	// FormatAlertmanager posts a list of one alert, as Alertmanager's
	// POST /api/v2/alerts takes it.
	FormatAlertmanager Format = "alertmanager"
	// FormatSlack posts {"text": ...}, as Slack's, Mattermost's and
	// Rocket.Chat's incoming webhooks take it.
	FormatSlack Format = "slack"
)

// Formats lists them.
var Formats = []Format{FormatEvent, FormatAlertmanager, FormatSlack}

func (f *Format) String() string { return string(*f) }

// Set implements flag.Value.
func (f *Format) Set(s string) (err error) {
	*f, err = enum.Parse("notify-format", s, Formats...)
	return err
}

// Notified are the event types posted: what a person should hear of.
var Notified = map[agent.EventType]bool{
	agent.EventDrain: true, agent.EventCut: true, agent.EventRestore: true, agent.EventRelease: true,
	agent.EventRefused: true, agent.EventFallback: true, agent.EventTelemetrySilent: true,
}

// Config is the webhook's settings.
type Config struct {
	URL     string
	Format  Format
	Timeout time.Duration // one attempt's
	// Queue is how many events may wait (0: QueueSize).
	Queue int
}

// Bounds of the queue and of the retries: a receiver down for a minute
// costs the events past the queue, never the loop's time.
const (
	QueueSize   = 256
	Attempts    = 4 // the first and three retries
	BackoffBase = time.Second
	BackoffMax  = 30 * time.Second
	// FlushBudget is how long the events still queued at the agent's
	// stop are given, one attempt each.
	FlushBudget = 2 * time.Second
)

// DefaultConfig is off.
func DefaultConfig() Config { return Config{Format: FormatEvent, Timeout: 5 * time.Second} }

// Validate checks the settings an operator may give. Its errors name the
// URL as Origin does, never whole: its user info, path and query are
// where webhooks keep their secrets.
func (c Config) Validate() error {
	if c.URL == "" {
		return nil
	}
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("notify-webhook %s: want an http:// or https:// URL with a host", Origin(c.URL))
	}
	if c.Timeout <= 0 {
		return fmt.Errorf("notify-timeout %v must be positive", c.Timeout)
	}
	_, err = enum.Parse("notify-format", string(c.Format), Formats...)
	return err
}

// Origin is what the agent ever says of a webhook's URL: its scheme and
// host ("https://hooks.example.com"), without user info, path or query,
// which chat webhooks (Slack's /services/T/B/SECRET) and token-bearing
// URLs keep their secret in. Of a URL that does not parse, or has no
// host, nothing is repeated.
func Origin(raw string) string {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return "(unparsable URL)"
	case u.Host == "":
		// "user:pass@host/..." parses as scheme "user": nothing of it is
		// repeated.
		return "(URL without a host)"
	}
	return u.Scheme + "://" + u.Host
}

// Notifier is the webhook's queue and sender.
type Notifier struct {
	cfg    Config
	client *http.Client
	log    zerolog.Logger
	queue  chan agent.Event
	// Sleep waits d or until ctx ends (the backoff): time.Sleep's
	// context-aware form in production, the test's own in tests.
	Sleep func(ctx context.Context, d time.Duration) bool

	sent, full, failed atomic.Uint64
}

// New is a notifier for cfg; Run sends.
func New(cfg Config, log zerolog.Logger) *Notifier {
	client := &http.Client{Timeout: cfg.Timeout, CheckRedirect: refuseRedirect}
	return &Notifier{cfg: cfg, client: client, log: log,
		queue: make(chan agent.Event, cmp.Or(cfg.Queue, QueueSize)), Sleep: wait.Sleep}
}

// Emit queues ev if it is one to post; with the queue full it is dropped
// and counted. It never blocks.
func (n *Notifier) Emit(ev agent.Event) {
	if !Notified[ev.Type] {
		return
	}
	select {
	case n.queue <- ev:
	default:
		if n.full.Add(1) == 1 {
			n.log.Warn().Str("url", n.redacted()).Msg("webhook queue full: events are dropped (hapilot_notify_dropped_total)")
		}
	}
}

// Run sends the queued events until ctx ends, then gives those still
// queued one attempt each within FlushBudget.
func (n *Notifier) Run(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			n.flush()
			return nil
		case ev := <-n.queue:
			if ctx.Err() != nil { // stopping: this one goes with the flush
				n.sendOnce(ev)
				continue
			}
			n.deliver(ctx, ev)
		}
	}
}

// sendOnce gives ev one attempt within FlushBudget.
func (n *Notifier) sendOnce(ev agent.Event) {
	fctx, cancel := context.WithTimeout(context.Background(), FlushBudget)
	defer cancel()
	if err := n.post(fctx, ev); err != nil {
		n.failed.Add(1)
		return
	}
	n.sent.Add(1)
}

func (n *Notifier) flush() {
	fctx, cancel := context.WithTimeout(context.Background(), FlushBudget)
	defer cancel()
	for {
		select {
		case ev := <-n.queue:
			if err := n.post(fctx, ev); err != nil {
				n.failed.Add(1)
			} else {
				n.sent.Add(1)
			}
		default:
			return
		}
	}
}

// deliver posts ev, retrying a failure that may pass (a network error,
// a timeout, 429 or 5xx) with doubling backoff.
func (n *Notifier) deliver(ctx context.Context, ev agent.Event) {
	backoff := BackoffBase
	var err error
	for attempt := 1; attempt <= Attempts; attempt++ {
		if err = n.post(ctx, ev); err == nil {
			n.sent.Add(1)
			return
		}
		var perm permanent
		if errors.As(err, &perm) || attempt == Attempts {
			break
		}
		if !n.Sleep(ctx, backoff) {
			break
		}
		backoff = min(2*backoff, BackoffMax)
	}
	n.failed.Add(1)
	n.log.Warn().Err(err).Str("type", string(ev.Type)).Str("url", n.redacted()).Msg("webhook did not take the event; dropped (hapilot_notify_dropped_total)")
}

// permanent is a refusal no retry will change (4xx but 429, a redirect).
type permanent struct{ error }

// errRedirect: the receiver answered 3xx. No redirect is followed, to
// its own host or another: the event would be posted again where the
// operator never pointed it (a cloud's metadata address, say), and the
// Location may carry a secret of its own.
var errRedirect = errors.New("a redirect, never followed: set --notify-webhook to the final URL")

// refuseRedirect makes the client hand back the 3xx itself, which post
// counts a failure.
func refuseRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

func (n *Notifier) post(ctx context.Context, ev agent.Event) error {
	body, err := Payload(n.cfg.Format, ev)
	if err != nil {
		return permanent{err}
	}
	actx, cancel := context.WithTimeout(ctx, n.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, n.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return permanent{err}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "hapilot/"+ev.Version)
	resp, err := n.client.Do(req)
	if err != nil {
		// *url.Error carries the whole URL: only the origin is kept.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("post %s: %w", n.redacted(), err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		return nil
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	case resp.StatusCode >= 300 && resp.StatusCode < 400:
		to := "nowhere (no Location)"
		if loc, err := resp.Location(); err == nil {
			to = Origin(loc.String())
		}
		return permanent{fmt.Errorf("HTTP %d to %s: %w", resp.StatusCode, to, errRedirect)}
	}
	return permanent{fmt.Errorf("HTTP %d", resp.StatusCode)}
}

// redacted is the URL without its query or user info (chat webhooks
// carry their secret in the path, so only the host is logged).
func (n *Notifier) redacted() string { return Origin(n.cfg.URL) }

// Counts are the notifier's totals.
type Counts struct{ Sent, QueueFull, Failed uint64 }

// Counts returns the totals so far.
func (n *Notifier) Counts() Counts {
	return Counts{Sent: n.sent.Load(), QueueFull: n.full.Load(), Failed: n.failed.Load()}
}

// WriteMetrics writes the notifier's counters to /metrics.
func (n *Notifier) WriteMetrics(w io.Writer) {
	c := n.Counts()
	promtext.Counter(w, "hapilot_notify_sent_total", "Events the webhook took.", c.Sent)
	promtext.Family(w, "hapilot_notify_dropped_total", "counter", "Events never delivered: the queue was full, or the receiver failed every attempt.",
		[]promtext.Sample{{Labels: []string{"reason", "queue_full"}, Value: float64(c.QueueFull)}, {Labels: []string{"reason", "failed"}, Value: float64(c.Failed)}})
	promtext.Gauge(w, "hapilot_notify_queue", "Events waiting for the webhook.", len(n.queue))
}

// Payload is ev in format f.
func Payload(f Format, ev agent.Event) ([]byte, error) {
	switch f {
	case FormatAlertmanager:
		return json.Marshal([]alert{alertOf(ev)})
	case FormatSlack:
		return json.Marshal(map[string]string{"text": Text(ev)})
	}
	return json.Marshal(ev)
}

// alert is one of Alertmanager's POST /api/v2/alerts.
type alert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	StartsAt    time.Time         `json:"startsAt"`
	EndsAt      time.Time         `json:"endsAt"`
}

// AlertFor is how long an event's alert stays firing: an event has no
// end of its own, so the alert resolves by itself.
const AlertFor = 15 * time.Minute

func alertOf(ev agent.Event) alert {
	labels := map[string]string{"alertname": "Hapilot" + camel(string(ev.Type)), "severity": "warning", "host": ev.Host, "mode": string(ev.Mode)}
	if ev.Type == agent.EventRestore || ev.Type == agent.EventRelease {
		labels["severity"] = "info"
	}
	if ev.Server != nil {
		labels["backend"], labels["server"] = ev.Server.Backend, ev.Server.Server
	}
	if ev.Code != "" {
		labels["code"] = string(ev.Code)
	}
	annotations := map[string]string{"summary": Text(ev), "reason": ev.Reason}
	if ev.Action != nil && ev.Action.Test != nil {
		// the test's figures as the action carries them, in Alertmanager's
		// only shape for values: strings
		t := ev.Action.Test
		annotations["test"] = t.Name
		annotations["statistic"] = strconv.FormatFloat(t.Statistic, 'g', -1, 64)
		annotations["threshold"] = strconv.FormatFloat(t.Threshold, 'g', -1, 64)
		if t.PValue != nil {
			annotations["p_value"] = strconv.FormatFloat(*t.PValue, 'g', -1, 64)
		}
	}
	return alert{Labels: labels, Annotations: annotations, StartsAt: ev.Time, EndsAt: ev.Time.Add(AlertFor)}
}

func camel(s string) string {
	var b strings.Builder
	for _, w := range strings.Split(s, "_") {
		if w != "" {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	return b.String()
}

// Text is the event in one line, for chat.
func Text(ev agent.Event) string {
	what := string(ev.Type)
	if ev.Type == agent.EventRefused {
		what = "refused " + string(ev.Code)
		if ev.Action != nil {
			what = "refused " + string(ev.Action.Kind) + " (" + string(ev.Code) + ")"
		}
	}
	s := "hapilot on " + ev.Host + ": " + what
	if ev.Server != nil {
		s += " " + ev.Server.String()
	}
	if ev.Mode == agent.ModeObserve {
		s += " [observe]"
	}
	if ev.Reason != "" {
		s += ": " + ev.Reason
	}
	return s
}
