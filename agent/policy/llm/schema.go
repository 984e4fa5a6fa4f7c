package llm

import (
	"encoding/json"
	"sort"

	"github.com/hapilot/hapilot/agent"
)

// Schema is the reply's JSON schema for one call, which Ollama turns into
// a grammar the model cannot leave. The reason comes first, so that a
// small model states its evidence before it picks an action. Backends and
// servers are enums of those the prompt shows and the agent may act on,
// and a weight cannot exceed the largest configured weight among them
// (the guardrails cap each server at its own).
func Schema(backends, servers []string, maxWeight int) json.RawMessage {
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
		{"reason", map[string]any{"type": "string", "maxLength": agent.MaxReason}},
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
	return json.RawMessage(`{"type":"object","properties":{"actions":{"type":"array","maxItems":8,"items":` + item + `}},"required":["actions"]}`)
}
