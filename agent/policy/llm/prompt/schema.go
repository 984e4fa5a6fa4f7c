package prompt

import (
	"encoding/json"
	"sort"
	"strconv"
	"strings"

	"github.com/hapilot/hapilot/agent"
)

// SchemaReason bounds the reply schema's reason, in characters: tighter
// than agent.MaxReason, which the parser enforces, so that a reply stays
// short whatever the model.
const SchemaReason = 80

// MaxActions is the most actions a reply may hold, as the parser counts.
const MaxActions = 8

// guardCharsPerToken is what the guard on a reply's length assumes a
// token carries at the least: the schema's longest reply, without free
// whitespace, must fit num_predict at this many characters a token. A
// tokenizer of single bytes (the lab's tiny models) carries one; real
// tokenizers carry three or more of JSON keys and names.
const guardCharsPerToken = 2

// Schema is the reply's JSON schema for one call, which the server turns
// into a grammar the model cannot leave. The reason comes first, so that
// a small model states its evidence before it picks an action. Backends
// and servers are enums of those the prompt shows and the agent may act
// on, and a weight cannot exceed the largest configured weight among them
// (the guardrails cap each server at its own). Nothing is unbounded: the
// reason has SchemaReason characters at most, and the list at most one
// action per server listed, MaxActions, and as many as fit numPredict
// (MaxItems).
func Schema(backends, servers []string, maxWeight, numPredict int) json.RawMessage {
	str := func(values []string) map[string]any {
		if len(values) == 0 {
			return map[string]any{"type": "string"}
		}
		v := append([]string(nil), values...)
		sort.Strings(v)
		return map[string]any{"type": "string", "enum": append(v, "-")}
	}
	// encoding/json writes map keys sorted, which would put "action"
	// before "reason"; the order of properties is written by hand.
	props := []struct {
		name string
		def  any
	}{
		{"reason", map[string]any{"type": "string", "maxLength": SchemaReason}},
		{"action", map[string]any{"type": "string", "enum": agent.Verbs}},
		{"backend", str(backends)},
		{"server", str(servers)},
		{"weight", map[string]any{"type": "integer", "minimum": 0, "maximum": max(maxWeight, 1)}},
	}
	var p []byte
	p = append(p, '{')
	for i, prop := range props {
		if i > 0 {
			p = append(p, ',')
		}
		k, _ := json.Marshal(prop.name)
		v, _ := json.Marshal(prop.def)
		p = append(append(append(p, k...), ':'), v...)
	}
	p = append(p, '}')
	item := `{"type":"object","properties":` + string(p) + `,"required":["reason","action","backend","server"]}`
	return json.RawMessage(`{"type":"object","properties":{"actions":{"type":"array","maxItems":` + strconv.Itoa(MaxItems(backends, servers, maxWeight, numPredict)) +
		`,"items":` + item + `}},"required":["actions"]}`)
}

// MaxItems is the most actions a reply may list: one per server (or a
// single no_op), at most MaxActions, and no more than fit numPredict
// tokens at guardCharsPerToken, each action as long as the schema lets it
// be (a full reason, the longest verb, names and weight). At least one.
func MaxItems(backends, servers []string, maxWeight, numPredict int) int {
	longest := func(values []string) string {
		l := "-"
		for _, v := range values {
			if len(v) > len(l) {
				l = v
			}
		}
		return l
	}
	item, _ := json.Marshal(struct {
		Reason  string `json:"reason"`
		Action  string `json:"action"`
		Backend string `json:"backend"`
		Server  string `json:"server"`
		Weight  int    `json:"weight"`
	}{strings.Repeat("x", SchemaReason), longest(agent.Verbs), longest(backends), longest(servers), max(maxWeight, 1)})
	const envelope = len(`{"actions":[]}`)
	fit := (numPredict*guardCharsPerToken - envelope) / (len(item) + 1)
	return max(1, min(MaxActions, len(servers), fit))
}
