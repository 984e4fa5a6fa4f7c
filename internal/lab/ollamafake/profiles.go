package ollamafake

import (
	"encoding/json"
	"sort"
	"strconv"
	"strings"
)

// Row is one server line of hapilot's prompt, as an emulated model reads
// it: by the column names of the prompt's header row.
type Row struct {
	Backend, Server, State, Owner string
	Weight, CfgWeight             int
	Requests, Err5xx, P50Ms       int
	P95Ms                         int
	ErrPct, PeerErrPct, UtilPct   float64
	// Candidate is why the agent flags the server ("errors ...",
	// "latency ...", "overload ..."), "" when it does not.
	Candidate string
	Note      string
}

// ParsePrompt reads the server rows out of the user message, whatever
// its columns' order, and skips the rows it cannot read.
func ParsePrompt(req Request) []Row {
	var rows []Row
	backend := ""
	var cols []string
	for _, m := range req.Messages {
		if m.Role != "user" {
			continue
		}
		for _, line := range strings.Split(m.Content, "\n") {
			if rest, ok := strings.CutPrefix(line, "backend "); ok {
				backend, _, _ = strings.Cut(rest, ":")
				continue
			}
			if strings.HasPrefix(line, "server ") {
				cols = strings.Fields(line)
				continue
			}
			f := strings.Fields(line)
			if backend == "" || len(cols) == 0 || len(f) < len(cols) {
				continue
			}
			if r, ok := readRow(backend, cols, f); ok {
				rows = append(rows, r)
			}
		}
	}
	return rows
}

func readRow(backend string, cols, f []string) (Row, bool) {
	v := map[string]string{}
	for i, c := range cols[:len(cols)-1] {
		v[c] = f[i]
	}
	v[cols[len(cols)-1]] = strings.Join(f[len(cols)-1:], " ")
	num := func(k string) int { n, _ := strconv.Atoi(v[k]); return n }
	flt := func(k string) float64 { x, _ := strconv.ParseFloat(v[k], 64); return x }
	if _, err := strconv.Atoi(v["requests"]); err != nil {
		return Row{}, false
	}
	r := Row{Backend: backend, Server: v["server"], State: v["state"], Owner: v["owner"], Weight: num("weight"), CfgWeight: num("cfg_weight"),
		Requests: num("requests"), Err5xx: num("5xx"), P50Ms: num("p50_ms"), P95Ms: num("p95_ms"),
		ErrPct: flt("err_pct"), PeerErrPct: flt("peer_err_pct"), UtilPct: flt("util_pct"), Note: v["note"]}
	for _, part := range strings.Split(r.Note, "; ") {
		if why, ok := strings.CutPrefix(part, "candidate: "); ok {
			r.Candidate = why
		}
	}
	return r, true
}

// Action is one action of a reply.
type Action struct {
	Action  string `json:"action"`
	Backend string `json:"backend"`
	Server  string `json:"server"`
	Weight  *int   `json:"weight,omitempty"`
	Reason  string `json:"reason"`
}

// Answer renders actions as the reply schema.
func Answer(actions ...Action) string {
	if actions == nil {
		actions = []Action{}
	}
	b, _ := json.Marshal(map[string]any{"actions": actions})
	return string(b)
}

// ready lists the ready rows, the most failing first.
func ready(rows []Row) []Row {
	var out []Row
	for _, r := range rows {
		if r.State == "ready" {
			out = append(out, r)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].ErrPct > out[j].ErrPct })
	return out
}

// Capable emulates a capable model. It acts on what the agent flags,
// one server a backend: a server whose errors stand far above its peers'
// is drained; a slow one gets half its weight; an overloaded one two
// thirds. A server the agent drained is left to its probes, an
// operator's is never named, and anything else is a no_op.
func Capable(req Request) Reply {
	var acts []Action
	done := map[string]bool{}
	for _, r := range ParsePrompt(req) {
		if done[r.Backend] || r.State != "ready" || r.Owner == "operator" || strings.Contains(r.Note, "the rules ") {
			continue
		}
		a, ok := judge(r)
		if ok {
			acts = append(acts, a)
			done[r.Backend] = true
		}
	}
	if len(acts) == 0 {
		return Reply{Content: Answer(Action{Action: "no_op", Backend: "-", Server: "-", Reason: "nothing stands out"})}
	}
	return Reply{Content: Answer(acts...)}
}

func judge(r Row) (Action, bool) {
	cut := func(num, den int, why string) (Action, bool) {
		w := max(r.CfgWeight*num/den, 0)
		if w >= r.Weight {
			return Action{}, false
		}
		return Action{Action: "set_weight", Backend: r.Backend, Server: r.Server, Weight: &w, Reason: why}, true
	}
	switch {
	case r.Err5xx >= 5 && r.Requests >= 100 && r.ErrPct >= 3*r.PeerErrPct+0.5:
		return Action{Action: "drain", Backend: r.Backend, Server: r.Server, Reason: "error rate far above peers"}, true
	case strings.HasPrefix(r.Candidate, "latency"):
		if r.CfgWeight < 2 {
			return Action{Action: "drain", Backend: r.Backend, Server: r.Server, Reason: "far slower than peers"}, true
		}
		return cut(1, 2, "slower than peers: half its weight")
	case strings.HasPrefix(r.Candidate, "overload"):
		return cut(2, 3, "near its maxconn: a third less load")
	}
	return Action{}, false
}

// TriggerHappy emulates a small model that drains the ready server with
// the most errors whenever it has any, healthy or not.
func TriggerHappy(req Request) Reply {
	rows := ready(ParsePrompt(req))
	rep := Reply{CompletionTokens: 30, Content: Answer()}
	if len(rows) > 0 && rows[0].Err5xx > 0 {
		rep.Content = Answer(Action{Action: "drain", Backend: rows[0].Backend, Server: rows[0].Server, Reason: "has errors"})
	}
	return rep
}

// FlipFlop emulates a model that undoes its decisions: it readies every
// server the agent drained, and drains like Capable otherwise.
func FlipFlop(req Request) Reply {
	for _, r := range ParsePrompt(req) {
		if r.State == "drain" && r.Owner == "agent" {
			return Reply{CompletionTokens: 30,
				Content: Answer(Action{Action: "ready", Backend: r.Backend, Server: r.Server, Reason: "give it another chance"})}
		}
	}
	return Capable(req)
}

// Fixed always answers the same content.
func Fixed(content string) Responder {
	return func(Request) Reply { return Reply{Content: content, CompletionTokens: 20} }
}
