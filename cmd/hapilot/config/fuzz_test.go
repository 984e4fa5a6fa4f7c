package config

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// A config file of any content is either applied or refused with an
// error, never a panic; what passes Validate is within bounds.
func FuzzConfigFile(f *testing.F) {
	for _, s := range []string{"interval 2s\npolicy = static\n", "# x\nwindow 1h\nmax-servers 1\n", "rules-alpha NaN\n", "haproxy-socket\n", "think low\nmodel m\npolicy llm\n"} {
		f.Add(s)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, content string) {
		p := filepath.Join(dir, "hapilot.conf")
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c := Register(fs)
		if Parse(fs, []string{"--config", p}) != nil || c.Validate() != nil {
			return
		}
		if c.Loop.Interval < 250_000_000 || c.Window > MaxWindow || c.Rules.Alpha <= 0 || c.Rules.Alpha >= 1 {
			t.Fatalf("a config past its bounds validated: %+v", c)
		}
	})
}
