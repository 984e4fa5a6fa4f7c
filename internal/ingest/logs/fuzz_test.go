package logs

import (
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lib/window"
)

// The line and syslog parsers take whatever reaches their ports: any
// input is either an event within bounds or an error, never a panic.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{"app s1 200 5", "app s1 503 12 7", "app s1 200 5 0", "app <NOSRV> 503 -1", "a b c d e f", "", " \\n", "app s1 200 5 1048577"} {
		f.Add([]byte(s))
	}
	store := window.New(time.Minute, 64, nil)
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, _, err := parseLine(line)
		if err == nil && (ev.Count < 0 || ev.Count > window.MaxCount) {
			t.Fatalf("count %d out of bounds for %q", ev.Count, line)
		}
		var c Counters
		record(&c, store, line)
	})
}

func FuzzParseLogLine(f *testing.F) {
	for _, s := range []string{"<134>Nov 30 12:00:00 haproxy[1]: hapilot app s1 200 5", "hapilot app s1 200 5 3", "hapilot", "<1>hapilot a"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		_, _ = ParseLogLine(msg)
	})
}
