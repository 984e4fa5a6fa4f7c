package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hapilot/hapilot/internal/lab/soak"
)

// TestSoakReadmitFlags: soak --readmit runs each case through both
// paths, and writes the table and the JSON.
func TestSoakReadmitFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "readmit.json")
	var out bytes.Buffer
	err := cmdSoak(context.Background(), []string{"--readmit", "--servers", "5", "--trials", "2", "--seeds", "1",
		"--readmit-horizon", "5m", "--heal-within", "1m", "--json", file}, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rs []soak.ReadmitResult
	if err := json.Unmarshal(raw, &rs); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rs {
		got = append(got, r.Case+"/"+r.Path)
	}
	want := "heals/probe heals/slowstart never heals/probe never heals/slowstart probe-blind, never heals/probe probe-blind, never heals/slowstart"
	if strings.Join(got, " ") != want || !strings.Contains(out.String(), "heal→full median s") || strings.Count(out.String(), "\n") != 8 {
		t.Fatalf("rows %q, want %q; table:\n%s", got, want, out.String())
	}
}
