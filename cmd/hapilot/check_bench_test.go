package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// BenchmarkCheckBackendBlocks is `hapilot check` on a config of n backend
// blocks, a block per backend as a generated config has. Linear in n: ten
// times the blocks cost about ten times the time (before, the blocks were
// found by a scan of every earlier one, and 100,000 took 18 to 28 s).
//
//	go test ./cmd/hapilot -run '^$' -bench CheckBackendBlocks -benchtime 3x
func BenchmarkCheckBackendBlocks(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var conf strings.Builder
			for i := 0; i < n; i++ {
				fmt.Fprintf(&conf, "backend.app%d.max-drained 2\nbackend.app%d.rules-floor 0.05\n", i, i)
			}
			conf.WriteString("backend.app*.action maint\n")
			path := filepath.Join(b.TempDir(), "hapilot.conf")
			if err := os.WriteFile(path, []byte(conf.String()), 0o600); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for range b.N {
				var out, errb bytes.Buffer
				if code := run([]string{"check", "--config", path}, &out, &errb); code != 0 {
					b.Fatalf("check: %d %s", code, errb.String())
				}
			}
		})
	}
}
