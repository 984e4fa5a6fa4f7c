package agent

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

// Every example line of docs/reference/events.md parses into the agent's own types
// with no unknown field, says schema EventSchema, and writes back as the
// same JSON; every event type has one.
func TestEventsDocExamples(t *testing.T) {
	b, err := os.ReadFile("../docs/reference/events.md")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[EventType]bool{}
	blocks := strings.Split(string(b), "```json\n")[1:]
	if len(blocks) == 0 {
		t.Fatal("no ```json block in docs/reference/events.md")
	}
	for _, blk := range blocks {
		line := strings.TrimSpace(blk[:strings.Index(blk, "```")])
		var head struct {
			Schema int       `json:"schema"`
			Type   EventType `json:"type"`
		}
		if err := json.Unmarshal([]byte(line), &head); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		var v any = &Event{}
		if head.Type == EventStep {
			v = &Record{}
		}
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			t.Errorf("%s: %v", head.Type, err)
			continue
		}
		back, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var want, got any
		_ = json.Unmarshal([]byte(line), &want)
		_ = json.Unmarshal(back, &got)
		if !reflect.DeepEqual(want, got) {
			t.Errorf("%s does not round-trip:\n doc  %s\n code %s", head.Type, line, back)
		}
		if head.Schema != EventSchema {
			t.Errorf("%s: schema %d, want %d", head.Type, head.Schema, EventSchema)
		}
		if seen[head.Type] {
			t.Errorf("two examples of %s", head.Type)
		}
		seen[head.Type] = true
	}
	for _, typ := range EventTypes {
		if !seen[typ] {
			t.Errorf("no example of %s in docs/reference/events.md", typ)
		}
	}
	if len(seen) != len(EventTypes) {
		t.Errorf("docs/reference/events.md has %d types, the code %d", len(seen), len(EventTypes))
	}
}
