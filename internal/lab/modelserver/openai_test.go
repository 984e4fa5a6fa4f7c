//go:build modelserver

package modelserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
)

// completion is the part of an OpenAI-style /v1/chat/completions reply
// the lab reads.
type completion struct {
	Choices []struct {
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// v1Chat posts body to base/v1/chat/completions: the reply, or its HTTP
// status and error text.
func v1Chat(t *testing.T, base string, body map[string]any) (completion, int, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s/v1/chat/completions: %v", base, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var c completion
	if resp.StatusCode != http.StatusOK {
		return c, resp.StatusCode, string(raw)
	}
	if err := json.Unmarshal(raw, &c); err != nil || len(c.Choices) == 0 {
		t.Fatalf("reply %s: %v", raw, err)
	}
	return c, resp.StatusCode, ""
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestLlamaServer(t *testing.T) {
	s := LlamaServerT(t, Spec{ContextLength: 2048, Seed: 1}, 2048)
	if code, body := get(t, s.URL+"/health"); code != 200 || !strings.Contains(body, `"ok"`) {
		t.Errorf("/health: %d %s", code, body)
	}
	p, err := s.Props(context.Background())
	if err != nil || p.DefaultGenerationSettings.NCtx != 2048 || p.BuildInfo == "" {
		t.Errorf("/props: %+v %v", p, err)
	}
	c, code, text := v1Chat(t, s.URL, map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}},
		"max_tokens": 8, "temperature": 0, "seed": 1})
	if code != 200 || c.Choices[0].FinishReason != "length" || c.Usage.CompletionTokens != 8 {
		t.Errorf("/v1/chat/completions: %d %s %+v", code, text, c)
	}
	t.Logf("a capped reply: finish_reason %s, usage %+v", c.Choices[0].FinishReason, c.Usage)
}

// agentLike is a plan's schema as the agent writes one (agent/policy/llm
// schema.go at the time of writing), with the bounds that keep a reply
// short as parameters: maxLength on the reason (0: none), maxItems on
// the actions (0: none), and additionalProperties false when closed.
func agentLike(maxLength, maxItems int, closed bool, minItems ...int) map[string]any {
	reason := map[string]any{"type": "string"}
	if maxLength > 0 {
		reason["maxLength"] = maxLength
	}
	item := map[string]any{"type": "object",
		"properties": map[string]any{
			"reason":  reason,
			"action":  map[string]any{"type": "string", "enum": []string{"drain", "ready", "set_weight", "no_op"}},
			"backend": map[string]any{"type": "string", "enum": []string{"app", "-"}},
			"server":  map[string]any{"type": "string", "enum": []string{"srv1", "srv2", "srv3", "-"}},
			"weight":  map[string]any{"type": "integer", "minimum": 0, "maximum": 256},
		},
		"required": []string{"reason", "action", "backend", "server"}}
	actions := map[string]any{"type": "array", "items": item}
	if maxItems > 0 {
		actions["maxItems"] = maxItems
	}
	if len(minItems) > 0 {
		actions["minItems"] = minItems[0]
	}
	root := map[string]any{"type": "object", "properties": map[string]any{"actions": actions}, "required": []string{"actions"}}
	if closed {
		item["additionalProperties"] = false
		root["additionalProperties"] = false
	}
	return root
}

// constructs are the JSON-schema constructs a plan's schema may use, each
// alone in a small schema, then the whole plan with and without the
// bounds that keep a reply short.
var constructs = []struct {
	name   string
	schema map[string]any
}{
	{"enum", map[string]any{"type": "object", "properties": map[string]any{"action": map[string]any{"type": "string", "enum": []string{"drain", "none"}}}}},
	{"enum+required", map[string]any{"type": "object", "properties": map[string]any{"action": map[string]any{"type": "string", "enum": []string{"drain", "none"}}}, "required": []string{"action"}}},
	{"string (free)", map[string]any{"type": "object", "properties": map[string]any{"reason": map[string]any{"type": "string"}}, "required": []string{"reason"}}},
	{"string maxLength 20", map[string]any{"type": "object", "properties": map[string]any{"reason": map[string]any{"type": "string", "maxLength": 20}}, "required": []string{"reason"}}},
	{"array maxItems 2", map[string]any{"type": "object", "properties": map[string]any{"servers": map[string]any{"type": "array", "maxItems": 2,
		"items": map[string]any{"type": "string", "enum": []string{"srv1", "srv2"}}}}, "required": []string{"servers"}}},
	{"integer minimum/maximum", map[string]any{"type": "object", "properties": map[string]any{"weight": map[string]any{"type": "integer", "minimum": 0, "maximum": 256}}, "required": []string{"weight"}}},
	{"additionalProperties false", map[string]any{"type": "object", "properties": map[string]any{"action": map[string]any{"type": "string", "enum": []string{"drain", "none"}}},
		"required": []string{"action"}, "additionalProperties": false}},
	{"plan: reason free, actions unbounded", agentLike(0, 0, false)},
	{"plan: reason maxLength 200, maxItems 8", agentLike(200, 8, false)},
	{"plan: reason maxLength 64, maxItems 2", agentLike(64, 2, false)},
	{"plan: reason maxLength 64, maxItems 2, closed", agentLike(64, 2, true)},
	// The random model answers an empty list of actions above; a real one
	// writes actions, so these make it write at least one (minItems 1,
	// which the agent's schema does not have) to show what each bound
	// saves.
	{"plan+1: reason free, actions unbounded", agentLike(0, 0, false, 1)},
	{"plan+1: reason maxLength 200, maxItems 8", agentLike(200, 8, false, 1)},
	{"plan+1: reason maxLength 64, maxItems 8", agentLike(64, 8, false, 1)},
	{"plan+1: reason maxLength 64, maxItems 2", agentLike(64, 2, false, 1)},
}

// TestStructuredOutputConstructs sends each construct as OpenAI's nested
// response_format {type: json_schema, json_schema: {name, schema,
// strict}} to llama-server and to Ollama's /v1, both serving the same
// tiny model, and reports which each accepts and how many completion
// tokens the random model's reply costs (temperature 0, seed 1, cap
// 1024). Every construct is accepted by both: none is refused.
func TestStructuredOutputConstructs(t *testing.T) {
	spec := Spec{ContextLength: 4096, Seed: 1}
	ls := LlamaServerT(t, spec, 4096)
	o := OllamaT(t, Model{Name: "tiny", Spec: spec})
	servers := []struct{ name, base, model string }{
		{"llama-server b" + strings.TrimPrefix(strings.Fields(ls.BuildInfo + " ?")[0], "b"), ls.URL, "tiny"},
		{"ollama " + o.Version + " /v1", o.URL.String(), "tiny"},
	}
	var table []string
	for _, c := range constructs {
		for _, sv := range servers {
			body := map[string]any{"model": sv.model, "messages": []map[string]string{{"role": "user", "content": "Plan for backend app."}},
				"max_tokens": 1024, "temperature": 0, "seed": 1,
				"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "plan", "schema": c.schema, "strict": true}}}
			r, code, text := v1Chat(t, sv.base, body)
			if code != 200 {
				t.Errorf("%s refuses %s: %d %s", sv.name, c.name, code, text)
				table = append(table, fmt.Sprintf("%-44s %-28s refused %d %s", c.name, sv.name, code, text))
				continue
			}
			out := r.Choices[0].Message.Content
			valid := json.Valid([]byte(out))
			if r.Choices[0].FinishReason == "" {
				// Ollama's token repeat limit (TestOllamaRepeatLimit): no
				// finish_reason, usage 0.
				table = append(table, fmt.Sprintf("%-44s %-28s accepted, cut by the token repeat limit after %d bytes (no finish_reason, usage 0)",
					c.name, sv.name, len(out)))
				continue
			}
			if r.Choices[0].FinishReason != "length" && !valid {
				t.Errorf("%s, %s: a reply ended by its grammar is not JSON: %q", sv.name, c.name, out)
			}
			table = append(table, fmt.Sprintf("%-44s %-28s accepted finish=%-6s completion_tokens=%4d valid_json=%v",
				c.name, sv.name, r.Choices[0].FinishReason, r.Usage.CompletionTokens, valid))
		}
	}
	t.Logf("constructs, servers, and the random model's reply:\n%s", strings.Join(table, "\n"))
}

// TestLlamaServerFlatSchemaIgnored: llama-server reads only the nested
// json_schema.schema. A flat {"type":"json_schema","schema":...} is read
// as json_object: the reply is JSON, but the schema is ignored, with no
// error (the random model answers "{}", without the required key).
func TestLlamaServerFlatSchemaIgnored(t *testing.T) {
	s := LlamaServerT(t, Spec{ContextLength: 2048, Seed: 1}, 2048)
	schema := constructs[1].schema // enum+required
	ask := func(rf map[string]any) map[string]any {
		r, code, text := v1Chat(t, s.URL, map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}},
			"max_tokens": 300, "temperature": 0, "seed": 1, "response_format": rf})
		if code != 200 {
			t.Fatalf("%v: %d %s", rf, code, text)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(r.Choices[0].Message.Content), &v); err != nil {
			t.Fatalf("%v: not a JSON object: %q", rf, r.Choices[0].Message.Content)
		}
		t.Logf("%v: %q", rf["type"], r.Choices[0].Message.Content)
		return v
	}
	if v := ask(map[string]any{"type": "json_schema", "schema": schema}); v["action"] != nil {
		t.Errorf("the flat schema was applied: %v", v)
	}
	if v := ask(map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "plan", "schema": schema, "strict": true}}); v["action"] == nil {
		t.Errorf("the nested schema was not applied: %v", v)
	}
}

// TestLlamaServerSpacePrefixArtefact pins what made llama-server refuse
// every json_schema before: a SentencePiece tokenizer that puts "▁"
// before the text after a special token (add_space_prefix, SPM's
// default) tokenises the generation prompt as "<|im_start|>▁assistant",
// which the grammar (it starts with the generation prompt) refuses: 400
// "Failed to initialize samplers". An artefact of the tiny model's
// tokenizer, not of any schema construct.
func TestLlamaServerSpacePrefixArtefact(t *testing.T) {
	s := LlamaServerT(t, Spec{ContextLength: 2048, Seed: 1, SpacePrefix: true}, 2048)
	_, code, text := v1Chat(t, s.URL, map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}},
		"max_tokens": 32, "temperature": 0, "seed": 1,
		"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "plan", "schema": constructs[0].schema, "strict": true}}})
	if code != 400 || !strings.Contains(text, "Failed to initialize samplers") {
		t.Errorf("with the space prefix: %d %s", code, text)
	}
	t.Logf("with the space prefix, an enum schema: %d %s", code, text)
}

// TestOllamaRepeatLimit: Ollama 0.17.4 ends a generation once the same
// token (spaces trimmed) comes 31 times in a row (llm/server.go,
// tokenRepeat > 30: "prediction aborted, token repeat limit reached"),
// and returns with no final reply: HTTP 200, done false, no done_reason,
// no counts. On /v1: finish_reason null and usage all 0. A random model
// writing "llll..." in a free string shows it.
func TestOllamaRepeatLimit(t *testing.T) {
	spec := Spec{ContextLength: 4096, Seed: 1}
	o := OllamaT(t, Model{Name: "tiny", Spec: spec})
	schema := agentLike(0, 0, false, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	raw, _ := json.Marshal(schema)
	r, err := chat(ctx, o.Client(), &api.ChatRequest{Model: "tiny", Messages: user("Plan for backend app."), Format: raw,
		Options: map[string]any{"temperature": 0, "seed": 1, "num_predict": 1024}})
	t.Logf("native: err %v, done %v, done_reason %q, eval_count %d, content %q", err, r.Done, r.DoneReason, r.EvalCount, r.Message.Content)
	if err != nil || r.Done || r.DoneReason != "" || r.EvalCount != 0 || !strings.HasSuffix(r.Message.Content, strings.Repeat("l", 30)) {
		t.Errorf("the native reply is not the repeat limit's")
	}
	c, code, text := v1Chat(t, o.URL.String(), map[string]any{"model": "tiny", "messages": []map[string]string{{"role": "user", "content": "Plan for backend app."}},
		"max_tokens": 1024, "temperature": 0, "seed": 1,
		"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "plan", "schema": schema, "strict": true}}})
	if code != 200 || c.Choices[0].FinishReason != "" || c.Usage.CompletionTokens != 0 {
		t.Errorf("/v1: %d %s %+v", code, text, c)
	}
	t.Logf("/v1: %d, finish_reason %q, usage %+v", code, c.Choices[0].FinishReason, c.Usage)
}
