package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

func TestEstimate(t *testing.T) {
	for _, tc := range []struct {
		name          string
		values        []*float64
		median        float64
		lo, hi        float64
		missing       int
		nilResult     bool
		within, exact bool
	}{
		{name: "one seed: the value, no spread", values: []*float64{ptr(7.0)}, median: 7, lo: 7, hi: 7, exact: true},
		{name: "five equal seeds", values: []*float64{ptr(3.0), ptr(3.0), ptr(3.0), ptr(3.0), ptr(3.0)}, median: 3, lo: 3, hi: 3, exact: true},
		{name: "five seeds", values: []*float64{ptr(10.0), ptr(12.0), ptr(11.0), ptr(30.0), ptr(9.0)}, median: 11, within: true},
		{name: "even count", values: []*float64{ptr(1.0), ptr(2.0), ptr(3.0), ptr(4.0)}, median: 2.5, within: true},
		{name: "missing seeds", values: []*float64{nil, ptr(4.0), nil}, median: 4, lo: 4, hi: 4, missing: 2, exact: true},
		{name: "none", values: []*float64{nil, nil}, nilResult: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := Estimate1(tc.values)
			if tc.nilResult {
				if e != nil {
					t.Fatalf("got %+v, want nil", e)
				}
				return
			}
			if e.Median != tc.median || e.Missing != tc.missing {
				t.Errorf("median %v missing %d, want %v %d", e.Median, e.Missing, tc.median, tc.missing)
			}
			if tc.exact && (e.Lo != tc.lo || e.Hi != tc.hi) {
				t.Errorf("interval [%v, %v], want [%v, %v]", e.Lo, e.Hi, tc.lo, tc.hi)
			}
			if tc.within {
				mn, mx := math.Inf(1), math.Inf(-1)
				for _, v := range e.Values {
					mn, mx = math.Min(mn, v), math.Max(mx, v)
				}
				if e.Lo > e.Median || e.Hi < e.Median || e.Lo < mn || e.Hi > mx || e.Lo == e.Hi {
					t.Errorf("interval [%v, %v] around %v, data in [%v, %v]", e.Lo, e.Hi, e.Median, mn, mx)
				}
			}
			if again := Estimate1(tc.values); again.Lo != e.Lo || again.Hi != e.Hi {
				t.Errorf("not reproducible: [%v, %v] then [%v, %v]", e.Lo, e.Hi, again.Lo, again.Hi)
			}
		})
	}
}

func TestOverlaps(t *testing.T) {
	for _, tc := range []struct {
		a, b Estimate
		want bool
	}{
		{Estimate{Lo: 1, Hi: 3}, Estimate{Lo: 2, Hi: 5}, true},
		{Estimate{Lo: 1, Hi: 3}, Estimate{Lo: 3, Hi: 5}, true},
		{Estimate{Lo: 1, Hi: 2}, Estimate{Lo: 3, Hi: 5}, false},
		{Estimate{Lo: 6, Hi: 7}, Estimate{Lo: 3, Hi: 5}, false},
	} {
		if got := tc.a.Overlaps(&tc.b); got != tc.want {
			t.Errorf("%+v %+v: %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// run is a hand-made result of one seed in one cell.
func sbsRun(variant string, seed uint64, c5xx, static5xx int, fp int, detect *float64) *RunResult {
	r := &RunResult{Cell: Cell{Scenario: "paper", Servers: 9, Algo: "roundrobin"}, Variant: variant,
		Config: RunSettings{Seed: seed}, Truth: TruthView{Faulty: []string{"srv3"}},
		Client: Client{Client5xx: c5xx, P99Ms: 10}, Loc: Localisation{FP: fp, DetectS: detect, Flips: map[string]int{"srv3": 1}}}
	r.Client.Against(Client{Client5xx: static5xx, P99Ms: 10})
	return r
}

func TestSideBySide(t *testing.T) {
	var runs []*RunResult
	for s := uint64(1); s <= 5; s++ {
		runs = append(runs, sbsRun("static", s, 1000+int(s), 1000+int(s), 0, nil))
		runs = append(runs, sbsRun("envoy", s, 990+int(s), 1000+int(s), 0, nil))
		runs = append(runs, sbsRun("rules", s, 100+int(s), 1000+int(s), 0, ptr(float64(s))))
	}
	SortRuns(runs)
	cells := SideBySide(runs)
	if len(cells) != 3 || cells[0].Variant != "static" || cells[1].Variant != "envoy" || cells[2].Variant != "rules" {
		t.Fatalf("cells %+v", cells)
	}
	rules := cells[2]
	if rules.Client5xx.Median != 103 || len(rules.Client5xx.Values) != 5 || rules.DetectS.Median != 3 || rules.EndCorrect != 0 {
		t.Errorf("rules %+v", rules)
	}
	if e := cells[1].DetectS; e != nil {
		t.Errorf("envoy never acted, detect %+v", e)
	}
	var b bytes.Buffer
	WriteSideBySide(&b, cells)
	out := b.String()
	for _, want := range []string{"**paper n=9 roundrobin** (5 seeds", "| rules | hapilot rules | 103 [", " * |", "| envoy | Envoy's algorithm, re-implemented in the lab | 993 [", "| never |"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Overlapping intervals: nobody is starred.
	for _, r := range runs {
		if r.Variant == "rules" {
			r.Client.Client5xx = 985 + int(r.Config.Seed)*3
		}
	}
	b.Reset()
	WriteSideBySide(&b, SideBySide(runs))
	if strings.Contains(b.String(), " * |") {
		t.Errorf("starred a cell whose interval overlaps:\n%s", b.String())
	}
	// One seed: no interval, no star.
	b.Reset()
	var one []*RunResult
	for _, r := range runs {
		if r.Config.Seed == 1 {
			one = append(one, r)
		}
	}
	WriteSideBySide(&b, SideBySide(one))
	if strings.Contains(b.String(), " * |") || !strings.Contains(b.String(), "1 seed: one run each") {
		t.Errorf("one seed:\n%s", b.String())
	}
	b.Reset()
	WritePerModel(&b, PerModel(runs))
	if !strings.Contains(b.String(), "| envoy | Envoy's algorithm, re-implemented in the lab | 5 |") {
		t.Errorf("per-model table:\n%s", b.String())
	}
}

func TestParseL7(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"10:fail-check", "check observe layer7 error-limit 10 on-error fail-check"},
		{"1:mark-down", "check observe layer7 error-limit 1 on-error mark-down"},
		{"1:sudden-death", "check observe layer7 error-limit 1 on-error sudden-death"},
		{"0:mark-down", ""}, {"x:mark-down", ""}, {"10", ""}, {"10:reboot", ""}, {"01:mark-down", ""},
	} {
		got, err := ParseL7(tc.in)
		if (err != nil) != (tc.want == "") || got != tc.want {
			t.Errorf("ParseL7(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
