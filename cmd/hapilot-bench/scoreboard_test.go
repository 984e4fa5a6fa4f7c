package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/internal/lab/soak"
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

// TestVerdicts: each LLM row against its family's rules row, on the
// issue's terms.
func TestVerdicts(t *testing.T) {
	rules := soak.Result{Fault: 0.05, Trials: 100, Missed: 10, FoundLow95: 0.82, FoundHigh95: 0.95,
		DetectMedian: 20, MedianLow95: 18, MedianHigh95: 22, FalseDrains: 2}
	for _, tc := range []struct {
		name string
		llm  soak.Result
		want []string
	}{
		{"the same", rules, []string{"90 against 90 of 100: level", "1.00x: within 1.2x", "2 against 2: no more"}},
		{"more found, sooner beyond the intervals", soak.Result{Fault: 0.05, Trials: 100, Missed: 2, FoundLow95: 0.93, FoundHigh95: 1,
			DetectMedian: 10, MedianLow95: 9, MedianHigh95: 11}, []string{"98 against 90 of 100: more", "0.50x: sooner, beyond the intervals", "0 against 2: no more"}},
		{"fewer within, later beyond", soak.Result{Fault: 0.05, Trials: 100, Missed: 14, FoundLow95: 0.77, FoundHigh95: 0.92,
			DetectMedian: 40, MedianLow95: 35, MedianHigh95: 45, FalseDrains: 30}, []string{"86 against 90 of 100: fewer, within the intervals", "2.00x: later than 1.2x", "30 against 2: more, beyond the intervals"}},
		{"zone drains count", soak.Result{Fault: 0.05, Trials: 100, Missed: 10, FoundLow95: 0.82, FoundHigh95: 0.95,
			DetectMedian: 20, MedianLow95: 18, MedianHigh95: 22, FalseDrains: 2, ZoneDrains: 150}, []string{"152 against 2: more, beyond the intervals"}},
		{"fewer beyond, over 1.2x within", soak.Result{Fault: 0.05, Trials: 100, Missed: 40, FoundLow95: 0.5, FoundHigh95: 0.7,
			DetectMedian: 25, MedianLow95: 15, MedianHigh95: 30, FalseDrains: 4}, []string{"fewer, beyond the intervals", "1.25x: over 1.2x, within the intervals", "4 against 2: more, within the intervals"}},
	} {
		var b bytes.Buffer
		writeVerdicts(&b, []scoreRow{{"f", "rules", rules}, {"f", "llm: x", tc.llm}})
		for _, w := range tc.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s: lacks %q:\n%s", tc.name, w, b.String())
			}
		}
	}
}
