package telemetry

import (
	"strings"
	"testing"
)

func TestAdvice(t *testing.T) {
	for _, tc := range []struct {
		version, path string
		want          []string // substrings of the advice; nil: none
	}{
		// Full SPOE on the rewritten SPOE names the cheap path that
		// detects as fast.
		{"3.2.26-1", "spoe", []string{"SPOE (examples/haproxy.cfg) costs HAProxy 3.2 about 1.80x", "HAProxy's counters alone (no stanza: --spoe-listen off) costs 1.02x", "0.5 s after it"}},
		{"3.1.0", "spoe", []string{"HAProxy 3.1"}},
		{"3.3-dev4", "spoe", []string{"HAProxy 3.3"}},
		// Before 3.1 SPOE stays under the bar: nothing to say.
		{"2.6.12-1+deb12u4", "spoe", nil},
		{"3.0.11-1+deb13u4", "spoe", nil},
		// The cheap paths themselves, and paths or versions it does not know.
		{"3.2.26-1", "spoe-sampled", nil}, // 1.14x: under the bar

		{"3.2.26-1", "ring", nil},
		{"3.2.26-1", "stats", nil},
		{"3.2.26-1", "carrier-pigeon", nil},
		{"", "spoe", nil},
		{"unknown", "spoe", nil},
	} {
		got := Advice(tc.version, tc.path)
		if tc.want == nil {
			if got != "" {
				t.Errorf("%s on %q: advice %q, want none", tc.path, tc.version, got)
			}
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s on %q: advice %q lacks %q", tc.path, tc.version, got, w)
			}
		}
	}
}

// Every path named is cheaper than the bar it is advised for, and the
// thresholds keep today's 2.6 SPOE unadvised: the table and the bars
// agree with docs/lab/telemetry-cost.md.
func TestPathCostsAgreeWithTheBars(t *testing.T) {
	for _, p := range pathCosts {
		if p.before31 <= 0 || p.v31 <= 0 || p.isolated <= 0 || p.how == "" {
			t.Errorf("%+v: incomplete", p)
		}
	}
	if pathCosts[0].name != "spoe" || pathCosts[0].before31 > AdviseAbove || pathCosts[0].v31 <= AdviseAbove {
		t.Errorf("SPOE's figures %+v: want under %.2f before 3.1 and over it from 3.1", pathCosts[0], AdviseAbove)
	}
}

func TestSPOEPath(t *testing.T) {
	for _, tc := range []struct {
		events, sampled uint64
		want            string
	}{
		{0, 0, ""},
		{10, 0, "spoe"},
		{10, 1, "spoe-sampled"},
	} {
		if got := SPOEPath(tc.events, tc.sampled); got != tc.want {
			t.Errorf("SPOEPath(%d, %d) = %q, want %q", tc.events, tc.sampled, got, tc.want)
		}
	}
}
