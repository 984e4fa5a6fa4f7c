package ollamafake

import (
	"encoding/json"
	"sort"
	"strconv"
	"strings"
)

// Row is one server line of hapilot's prompt, as an emulated model reads it.
type Row struct {
	Backend, Server, State, Owner string
	Requests, Err5xx, P95Ms       int
	ErrPct                        float64
}

// ParsePrompt reads the server rows out of the user message.
func ParsePrompt(req Request) []Row {
	var rows []Row
	backend := ""
	for _, m := range req.Messages {
		if m.Role != "user" {
			continue
		}
		for _, line := range strings.Split(m.Content, "\n") {
			if rest, ok := strings.CutPrefix(line, "backend "); ok {
				backend, _, _ = strings.Cut(rest, ":")
				continue
			}
			f := strings.Fields(line)
			if backend == "" || len(f) < 7 || f[0] == "server" {
				continue
			}
			req, err1 := strconv.Atoi(f[4])
			e5, err2 := strconv.Atoi(f[5])
			pct, err3 := strconv.ParseFloat(f[6], 64)
			if err1 != nil || err2 != nil || err3 != nil {
				continue
			}
			r := Row{Backend: backend, Server: f[0], State: f[1], Owner: f[2], Requests: req, Err5xx: e5, ErrPct: pct}
			if len(f) > 7 {
				r.P95Ms, _ = strconv.Atoi(f[7])
			}
			rows = append(rows, r)
		}
	}
	return rows
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

// Capable emulates a capable model: it drains the ready server whose
// error rate is far above the others' (or, with no error outlier, whose
// p95 is five times theirs), readies a server the agent drained once its
// traffic is clean, and otherwise answers no_op.
func Capable(req Request) Reply {
	all := ParsePrompt(req)
	rows := ready(all)
	rep := Reply{PromptTokens: 350, CompletionTokens: 40}
	for _, r := range all {
		if r.State == "drain" && r.Owner == "agent" && r.Requests >= 100 && r.Err5xx == 0 {
			rep.Content = Answer(Action{Action: "ready", Backend: r.Backend, Server: r.Server, Reason: "clean again"})
			return rep
		}
	}
	if len(rows) >= 2 {
		top := rows[0]
		var others []float64
		var p95s []int
		for _, r := range rows[1:] {
			others = append(others, r.ErrPct)
		}
		for _, r := range rows {
			p95s = append(p95s, r.P95Ms)
		}
		sort.Float64s(others)
		if top.Err5xx >= 5 && top.Requests >= 100 && top.ErrPct >= 3*others[len(others)/2]+0.5 {
			rep.Content = Answer(Action{Action: "drain", Backend: top.Backend, Server: top.Server, Reason: "error rate far above peers"})
			return rep
		}
		sort.Ints(p95s)
		for _, r := range rows {
			if r.Requests >= 100 && r.P95Ms >= 5*p95s[len(p95s)/2] && r.P95Ms > 20 {
				rep.Content = Answer(Action{Action: "drain", Backend: r.Backend, Server: r.Server, Reason: "far slower than peers"})
				return rep
			}
		}
	}
	rep.Content = Answer(Action{Action: "no_op", Backend: "-", Server: "-", Reason: "nothing stands out"})
	return rep
}

// TriggerHappy emulates a small model that drains the ready server with
// the most errors whenever it has any, healthy or not.
func TriggerHappy(req Request) Reply {
	rows := ready(ParsePrompt(req))
	rep := Reply{PromptTokens: 350, CompletionTokens: 30, Content: Answer()}
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
			return Reply{PromptTokens: 350, CompletionTokens: 30,
				Content: Answer(Action{Action: "ready", Backend: r.Backend, Server: r.Server, Reason: "give it another chance"})}
		}
	}
	return Capable(req)
}

// Fixed always answers the same content.
func Fixed(content string) Responder {
	return func(Request) Reply { return Reply{Content: content, PromptTokens: 300, CompletionTokens: 20} }
}
