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

// TestSoakPolicyLLM: `soak --policy llm --model capable` runs the
// emulated profile through the agent path and writes what --policy rules
// writes plus the model's figures; `--path agent` runs the rules through
// the same path. The head line says the profile is emulated.
func TestSoakPolicyLLM(t *testing.T) {
	small := []string{"--servers", "9", "--rate", "33", "--server-days", "0", "--fault", "0.05", "--trials", "2", "--warmup", "2m", "--seeds", "1"}
	for _, tc := range []struct {
		name   string
		args   []string
		header string
		want   map[string]any
		absent []string
	}{
		{"llm capable", []string{"--policy", "llm", "--model", "capable"}, "EMULATED profile capable",
			map[string]any{"policy": "llm", "model_healthy_drains": 0.0, "trials": 2.0}, nil},
		{"rules through the agent path", []string{"--path", "agent"}, "--policy rules through the agent path",
			map[string]any{"policy": "rules", "trials": 2.0}, []string{"model_actions", "model_calls"}},
		{"rules direct", nil, "the rules' sequential (CUSUM) test",
			map[string]any{"trials": 2.0}, []string{"policy", "model_actions", "steps"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "soak.json")
			var stdout, stderr bytes.Buffer
			args := append(append(append([]string{}, small...), tc.args...), "--json", out)
			if err := cmdSoak(context.Background(), args, &stdout, &stderr); err != nil {
				t.Fatalf("%v\n%s", err, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.header) {
				t.Errorf("the output lacks %q:\n%s", tc.header, stdout.String())
			}
			raw, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var cells []map[string]any
			if err := json.Unmarshal(raw, &cells); err != nil || len(cells) != 1 {
				t.Fatalf("%v: %s", err, raw)
			}
			for k, v := range tc.want {
				if cells[0][k] != v {
					t.Errorf("%s: %v, want %v", k, cells[0][k], v)
				}
			}
			for _, k := range tc.absent {
				if _, ok := cells[0][k]; ok {
					t.Errorf("%s present", k)
				}
			}
			if tc.want["policy"] == "llm" {
				for _, k := range []string{"model_actions", "model_calls", "steps", "detect_median_s"} {
					if _, ok := cells[0][k]; !ok {
						t.Errorf("%s missing: %s", k, raw)
					}
				}
			}
		})
	}
}

// TestSoakPolicyFlagErrors: the policy's flags are checked against each
// other before any simulation, each error naming its flag.
func TestSoakPolicyFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--policy", "llm"}, "--policy llm needs --model"},
		{[]string{"--policy", "llm", "--model", "no-such-profile"}, "not an emulated profile"},
		{[]string{"--policy", "llm", "--model", "capable", "--path", "direct"}, "agent path only"},
		{[]string{"--policy", "rules", "--model", "capable"}, "--model: for --policy llm"},
		{[]string{"--policy", "static"}, "--policy \"static\""},
		{[]string{"--path", "fast"}, "--path \"fast\""},
		{[]string{"--path", "agent", "--interval", "1500ms"}, "--interval"},
		{[]string{"--policy", "llm", "--model", "capable", "--readmit"}, "--readmit"},
		{[]string{"--policy", "llm", "--model", "capable", "--evidence-check", "100ms"}, "one-second checks"},
		{[]string{"--policy", "llm", "--model", "m", "--ollama-host", "http://127.0.0.1:1"}, "the model m"},
	} {
		var stdout, stderr bytes.Buffer
		err := cmdSoak(context.Background(), append(tc.args, "--server-days", "1"), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error()+stderr.String(), tc.want) {
			t.Errorf("%v: %v %s; want an error naming %q", tc.args, err, stderr.String(), tc.want)
		}
	}
}
