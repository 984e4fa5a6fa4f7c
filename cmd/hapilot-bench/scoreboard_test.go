package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestScoreboard: `soak scoreboard` runs each family asked for under the
// rules and the capable profile, one markdown row each, and the JSON
// holds every result.
func TestScoreboard(t *testing.T) {
	dir := t.TempDir()
	md, js := filepath.Join(dir, "board.md"), filepath.Join(dir, "board.json")
	var stdout, stderr bytes.Buffer
	args := []string{"scoreboard", "--families", "grey,fleet-wide", "--trials", "2", "--seeds", "1", "--warmup", "1m", "--out", md, "--json", js}
	if err := cmdSoak(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	raw, err := os.ReadFile(md)
	if err != nil {
		t.Fatal(err)
	}
	table := string(raw)
	for _, want := range []string{"| grey | rules | 2/2 ", "| grey | llm: capable (emulated) | 2/2 ", "| fleet-wide | rules | - |", "in 2 incident-h"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
	if strings.Contains(table, "**flapping**") {
		t.Errorf("a family not asked for is described:\n%s", table)
	}
	var rows []scoreRow
	if raw, err = os.ReadFile(js); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &rows); err != nil || len(rows) != 4 {
		t.Fatalf("%v: %d rows", err, len(rows))
	}
	if rows[1].Result.ModelCalls == nil || rows[0].Result.ModelCalls != nil {
		t.Errorf("the model's figures belong to the LLM's rows only: %+v", rows)
	}
}

func TestScoreboardFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--families", "nope"}, "--families \"nope\""},
		{[]string{"--emulate", "nope"}, "--emulate \"nope\""},
		{[]string{"--model", "m"}, "go together"},
		{[]string{"--interval", "500ms"}, "--interval"},
		{[]string{"--seeds", "x"}, "seeds"},
	} {
		var stdout, stderr bytes.Buffer
		err := cmdSoak(context.Background(), append([]string{"scoreboard"}, tc.args...), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error()+stderr.String(), tc.want) {
			t.Errorf("%v: %v; want an error naming %q", tc.args, err, tc.want)
		}
	}
}
