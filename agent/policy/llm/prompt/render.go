// Package prompt is what the LLM policy shows a model and what it takes
// back: the prompt's three forms (full, compact, numbered) and their
// system prompts, the reply's JSON schema, and the strict parser of a
// reply. A model trained on one form (hapilot's own read the numbered
// one) must be called with it.
package prompt

import (
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/internal/lib/enum"
)

// Input is what one call shows the model.
type Input struct {
	Obs agent.Observation
	// Candidates: why the windows flag a server (errors in
	// the grey zone, latency, overload). Backends with one are shown.
	Candidates map[agent.Key]string
	// Brief: a candidate's reason in a few words, for the compact forms
	// (the sequential test's figures of an errors candidate); without
	// one, the compact forms shorten its reason themselves (compactWhy).
	Brief map[agent.Key]string
	// Floor: what the rules already do to a server this step.
	Floor map[agent.Key]string
	// Pending: how many steps a proposal of the model's about a server
	// has waited for confirmation, out of Confirm.
	Pending map[agent.Key]int
	Confirm int
	// History is the model's last decisions and how they turned out.
	History []string
	// DrainsPer is the drain cap per fleet size (N/DrainsPer a step).
	DrainsPer int
	// MaxShown is how many servers per backend are listed in full (the
	// most anomalous first); the rest are summed in one line.
	MaxShown int
	// Only, when set, limits the prompt to these backends.
	Only map[string]bool
	// Style is the prompt's form ("" is full).
	Style Style
}

// Header names the columns of a server row; an emulated model reads rows
// by these names.
const Header = "server state owner weight cfg_weight req_s util_pct requests 5xx err_pct peer_err_pct ratio recent_requests recent_err_pct p50_ms p95_ms note"

// Shown lists the backends a prompt of in would show.
func (in Input) Shown() []string {
	var out []string
	for _, b := range in.Obs.Backends {
		if in.shows(b) {
			out = append(out, b.Name)
		}
	}
	return out
}

func (in Input) shows(b agent.BackendView) bool {
	if in.Only != nil {
		return in.Only[b.Name]
	}
	for _, s := range b.Servers {
		if _, ok := in.Candidates[s.Key()]; ok {
			return true
		}
		if s.Owner == agent.OwnerAgent {
			return true
		}
	}
	return false
}

// Prompt renders the observation for the model: per backend shown, its
// figures, then one row per server with its peers' error rate and its
// ratio to them, whether it is a candidate and why, a recent figure beside
// the full window, its load against maxconn, its configured weight, and
// the agent's hold, pending and refusal state; then the model's recent
// decisions and how they turned out.
func Render(in Input) string {
	if in.Style == Compact || in.Style == Numbered {
		return compactPrompt(in)
	}
	var b strings.Builder
	obs := in.Obs
	fmt.Fprintf(&b, "step %d; windows: the last %s, and the last %s as recent\n", obs.Cycle, lookback(obs.Lookback), lookback(obs.RecentSpan))
	for _, be := range obs.Backends {
		if in.shows(be) {
			writeBackend(&b, in, be)
		}
	}
	if len(in.History) > 0 {
		b.WriteString("\nyour recent decisions, oldest first:\n")
		for _, h := range in.History {
			b.WriteString("- " + h + "\n")
		}
	}
	return b.String()
}

func writeBackend(b *strings.Builder, in Input, be agent.BackendView) {
	var req, e5 uint64
	for _, s := range be.Servers {
		req += s.Window.Requests
		e5 += s.Window.Err5xx
	}
	floor := (len(be.Servers) + 1) / 2
	drains := 1
	if in.DrainsPer > 0 {
		drains = max(1, len(be.Servers)/in.DrainsPer)
	}
	fmt.Fprintf(b, "\nbackend %s: %d servers, %d serving (keep at least %d), at most %d drains a step, %d requests, 5xx %.2f%%\n",
		be.Name, len(be.Servers), be.ServingCount(), floor, drains, req, pct(e5, req))
	b.WriteString(Header + "\n")
	rows, hidden, hReq, hErr := in.listed(be, in.MaxShown)
	for _, s := range rows {
		writeRow(b, in, be, s)
	}
	if hidden > 0 {
		fmt.Fprintf(b, "(%d more servers, none flagged: %d requests, 5xx %.2f%%)\n", hidden, hReq, pct(hErr, hReq))
	}
}

// listed orders be's servers for a prompt, the candidates and the
// agent's own first, then by error rate, and keeps the first shown of
// the rest (0: all); the others are counted and summed.
func (in Input) listed(be agent.BackendView, shown int) (rows []agent.ServerView, hidden int, hReq, hErr uint64) {
	servers := append([]agent.ServerView(nil), be.Servers...)
	rank := func(s agent.ServerView) int {
		if _, ok := in.Candidates[s.Key()]; ok {
			return 0
		}
		if s.Owner == agent.OwnerAgent {
			return 1
		}
		return 2
	}
	sort.SliceStable(servers, func(i, j int) bool {
		if ri, rj := rank(servers[i]), rank(servers[j]); ri != rj {
			return ri < rj
		}
		return servers[i].Window.ErrorRate() > servers[j].Window.ErrorRate()
	})
	for i, s := range servers {
		if shown > 0 && i >= shown && rank(s) == 2 {
			hidden++
			hReq += s.Window.Requests
			hErr += s.Window.Err5xx
			continue
		}
		rows = append(rows, s)
	}
	return rows, hidden, hReq, hErr
}

// figures are a row's error rate against its serving peers', their
// ratio as the prompt writes it, and the recent request rate.
type figures struct {
	rate, peer, rps float64
	ratio           string
}

func rowFigures(be agent.BackendView, s agent.ServerView) figures {
	var peerN, peerX uint64
	for _, p := range be.Servers {
		if p.Server != s.Server && p.Serving() {
			peerN += p.Window.Requests
			peerX += p.Window.Err5xx
		}
	}
	f := figures{rate: s.Window.ErrorRate(), ratio: "-", rps: s.Recent.RatePerSec}
	if peerN > 0 {
		f.peer = float64(peerX) / float64(peerN)
	}
	switch {
	case f.peer > 0:
		f.ratio = fmt.Sprintf("%.1f", f.rate/f.peer)
	case f.rate > 0:
		f.ratio = "inf"
	}
	if f.rps == 0 && s.Recent.Seconds > 0 {
		f.rps = float64(s.Recent.Requests) / float64(s.Recent.Seconds)
	}
	return f
}

func writeRow(b *strings.Builder, in Input, be agent.BackendView, s agent.ServerView) {
	f := rowFigures(be, s)
	fmt.Fprintf(b, "%s %s %s %d %d %.1f %s %d %d %.2f %.2f %s %d %.2f %d %d %s\n",
		s.Server, s.State.Label(), s.Owner, s.State.Weight, s.State.Initial, f.rps, utilization(s, f.rps),
		s.Window.Requests, s.Window.Err5xx, 100*f.rate, 100*f.peer, f.ratio,
		s.Recent.Requests, 100*s.Recent.ErrorRate(), s.Window.P50Ms, s.Window.P95Ms, note(in, be, s))
}

// utilization is the server's load against its maxconn in percent, "-"
// when it has none.
func utilization(s agent.ServerView, rps float64) string {
	if s.MaxConn <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", 100*s.Busy(rps))
}

func note(in Input, be agent.BackendView, s agent.ServerView) string {
	k := agent.Key{Backend: be.Name, Server: s.Server}
	var n []string
	if why, ok := in.Candidates[k]; ok {
		n = append(n, "candidate: "+why)
	}
	if a, ok := in.Floor[k]; ok {
		n = append(n, "the rules "+a+" it this step")
	}
	if s.Changed != nil {
		n = append(n, fmt.Sprintf("%s by the agent %.0fs ago", s.Changed.Phase, in.Obs.Time.Sub(s.Changed.At).Seconds()))
		if s.Changed.Phase == agent.PhaseDrained {
			n = append(n, "no traffic while drained: a ready only asks for probes")
		}
	}
	if !s.NoDrainUntil.IsZero() {
		n = append(n, fmt.Sprintf("held from draining for %.0fs", s.NoDrainUntil.Sub(in.Obs.Time).Seconds()))
	}
	if c := in.Pending[k]; c > 0 {
		n = append(n, fmt.Sprintf("your proposal awaits confirmation (%d of %d)", c, in.Confirm))
	}
	if why, ok := in.Obs.Refused[k]; ok {
		n = append(n, "refused last step: "+why)
	}
	if s.Owner == agent.OwnerOperator {
		n = append(n, "the operator's: never act on it")
	}
	if len(n) == 0 {
		return "-"
	}
	return strings.Join(n, "; ")
}

func lookback(d time.Duration) string {
	if d == 0 {
		return "window"
	}
	return d.String()
}

func pct(x, n uint64) float64 {
	if n == 0 {
		return 0
	}
	return 100 * float64(x) / float64(n)
}

//go:embed system-prompt.txt
var DefaultSystemPrompt string

//go:embed system-prompt-compact.txt
var CompactSystemPrompt string

//go:embed system-prompt-numbered.txt
var NumberedSystemPrompt string

// SystemPrompt is the embedded system prompt of the style.
func (s Style) SystemPrompt() string {
	switch s {
	case Compact:
		return CompactSystemPrompt
	case Numbered:
		return NumberedSystemPrompt
	}
	return DefaultSystemPrompt
}

// Style is the form of the prompt the model reads.
type Style string

const (
	// Full: the system prompt's rules in prose, and every column
	// of a server row (Header).
	Full Style = "full"
	// Compact: for small models, hapilot's own among them: a
	// system prompt of a few lines, the columns that decide (CompactHeader),
	// notes in a few words, and the servers that need no look summed
	// beyond CompactShown. With its system prompt it is under half the
	// full form's bytes (45% over calibration's prompts), so that a model
	// trained here sees whole examples in its context.
	Compact Style = "compact"
	// Numbered: the compact form with a reference on every row
	// and backend (s1, b1; see Refs), which the reply names instead of
	// the server: for a small model trained here, which points at a row
	// more surely than it copies a name it never saw.
	Numbered Style = "numbered"
)

// Styles lists the styles.
var Styles = []Style{Full, Compact, Numbered}

func (s *Style) String() string { return string(*s) }

// Set implements flag.Value.
func (s *Style) Set(v string) (err error) {
	*s, err = enum.Parse("llm-prompt", v, Styles...)
	return err
}

type replyAction struct {
	Reason  string `json:"reason"`
	Action  string `json:"action"`
	Backend string `json:"backend"`
	Server  string `json:"server"`
	Weight  *int   `json:"weight"`
}

// ParseReply validates a reply strictly: one JSON object with an
// "actions" list, every action well formed, nothing else. Any fault
// rejects the whole reply. A weight given with drain or ready, which the
// schema allows, is ignored.
func ParseReply(content string) (agent.Plan, error) {
	dec := json.NewDecoder(strings.NewReader(content))
	dec.DisallowUnknownFields()
	var r struct {
		Actions *[]replyAction `json:"actions"`
	}
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("not the reply schema: %w", err)
	}
	if dec.More() {
		return nil, errors.New("text after the JSON object")
	}
	if r.Actions == nil {
		return nil, errors.New(`no "actions" list`)
	}
	if len(*r.Actions) > MaxActions {
		return nil, fmt.Errorf("%d actions, at most %d", len(*r.Actions), MaxActions)
	}
	plan := agent.Plan{}
	for i, a := range *r.Actions {
		act, ok, err := agent.ParseAction(a.Action, a.Backend, a.Server, a.Weight, "model", a.Reason)
		if err != nil {
			return nil, fmt.Errorf("action %d: %w", i, err)
		}
		if ok {
			plan = append(plan, act)
		}
	}
	return plan, nil
}
