package counters

import (
	"testing"
	"time"

	"github.com/hapilot/hapilot/haproxy"
)

// A server is silent once HAProxy has counted MinAnswers answers for it
// over After with nothing delivered; a delivery ends the silence; a server
// with no traffic, or one the paths report, is never silent; a sampled
// stanza's larger MinAnswers holds a silence back.
func TestCoverage(t *testing.T) {
	k := haproxy.ServerKey{Backend: "app", Server: "s1"}
	t0 := time.Unix(1000, 0)
	type poll struct {
		at        time.Duration
		answers   int64
		delivered uint64
		silent    bool
	}
	for _, tc := range []struct {
		name  string
		min   int64
		polls []poll
	}{
		{"a path that reports everything", 25, []poll{{0, 0, 0, false}, {time.Second, 50, 50, false}, {6 * time.Second, 250, 300, false}, {12 * time.Second, 300, 600, false}}},
		{"no traffic: nothing to tell", 25, []poll{{0, 0, 0, false}, {10 * time.Second, 0, 0, false}}},
		{"silent from the start", 25, []poll{{0, 0, 0, false}, {2 * time.Second, 100, 0, false}, {5 * time.Second, 150, 0, true}, {6 * time.Second, 50, 0, true}}},
		{"too few answers in the time", 25, []poll{{0, 0, 0, false}, {6 * time.Second, 24, 0, false}, {7 * time.Second, 1, 0, true}}},
		{"silent, then reported again", 25, []poll{{0, 0, 0, false}, {6 * time.Second, 300, 0, true}, {7 * time.Second, 50, 40, false}, {8 * time.Second, 50, 90, false}}},
		{"goes silent later", 25, []poll{{0, 0, 10, false}, {time.Second, 50, 60, false}, {5 * time.Second, 200, 60, false}, {6 * time.Second, 50, 60, true}}},
		{"a sampled stanza's gap", 400, []poll{{0, 0, 16, false}, {6 * time.Second, 300, 16, false}, {7 * time.Second, 99, 16, false}, {8 * time.Second, 1, 16, true}}},
		{"the series made anew", 25, []poll{{0, 0, 500, false}, {time.Second, 50, 3, false}, {2 * time.Second, 50, 60, false}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var delivered uint64
			c := &Coverage{After: DefaultSilentAfter, MinAnswers: func() int64 { return tc.min },
				Delivered: func(string, string) uint64 { return delivered }}
			for i, p := range tc.polls {
				delivered = p.delivered
				if got := c.Observe(k, p.answers, t0.Add(p.at)); got != p.silent {
					t.Fatalf("poll %d at %v: silent %v, want %v", i, p.at, got, p.silent)
				}
			}
		})
	}
}

// Silence lists the silent servers in order, counts the reported ones and
// the episodes, and forgets servers HAProxy no longer lists.
func TestCoverageSilence(t *testing.T) {
	t0 := time.Unix(1000, 0)
	delivered := map[string]uint64{"a": 0, "b": 0, "c": 5}
	c := &Coverage{After: time.Second, Delivered: func(_, s string) uint64 { return delivered[s] }}
	keys := []haproxy.ServerKey{{Backend: "app", Server: "b"}, {Backend: "app", Server: "a"}, {Backend: "app", Server: "c"}}
	for _, k := range keys {
		c.Observe(k, 0, t0)
	}
	delivered["c"] = 50
	for _, k := range keys {
		c.Observe(k, 100, t0.Add(2*time.Second))
	}
	s := c.Silence()
	if len(s.Silent) != 2 || s.Silent[0].Server != "a" || s.Silent[1].Server != "b" || s.Covered != 1 || s.Episodes != 2 || !s.Since.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("%+v", s)
	}
	c.Forget(func(k haproxy.ServerKey) bool { return k.Server != "a" })
	if s := c.Silence(); len(s.Silent) != 1 || s.Silent[0].Server != "b" {
		t.Fatalf("after forgetting a: %+v", s)
	}
}
