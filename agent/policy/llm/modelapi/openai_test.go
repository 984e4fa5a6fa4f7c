package modelapi

import (
	"encoding/json"
	"testing"
)

// A form down the ladder keeps the schema's property names, even one
// named like a keyword it drops.
func TestSchemaFormsDropKeywordsOnly(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"enum":{"type":"string","enum":["a"]},"required":{"type":"integer","maximum":3}},"required":["enum"]}`)
	rf, err := schemaLadder[2].responseFormat(schema)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rf)
	if got := string(b); got != `{"json_schema":{"name":"plan","schema":{"properties":{"enum":{"type":"string"},"required":{"type":"integer"}},"type":"object"},"strict":true},"type":"json_schema"}` {
		t.Fatalf("%s", got)
	}
}
