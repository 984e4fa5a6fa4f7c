package envoyod

import (
	"fmt"
	"math"
	"reflect"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func hosts(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("srv%d", i+1)
	}
	return out
}

// feed gives host h total responses of which failed are 500s, the
// failures spread so that no two are consecutive (no consecutive-5xx
// ejection).
func feed(t *testing.T, d *Detector, at time.Time, h string, total, failed int) {
	t.Helper()
	every := 0
	if failed > 0 {
		every = total / failed
	}
	for i := 0; i < total; i++ {
		st := 200
		if failed > 0 && i%every == 0 && i/every < failed {
			st = 500
		}
		if a := d.Record(at, h, st); a != nil {
			t.Fatalf("unexpected inline ejection %v", a)
		}
	}
}

func TestDefaultsAreTheProtos(t *testing.T) {
	c := Defaults()
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"consecutive_5xx", c.Consecutive5xx, 5},
		{"consecutive_gateway_failure", c.ConsecutiveGatewayFailure, 5},
		{"interval", c.Interval, 10 * time.Second},
		{"base_ejection_time", c.BaseEjectionTime, 30 * time.Second},
		{"max_ejection_time", c.MaxEjectionTime, 300 * time.Second},
		{"max_ejection_percent", c.MaxEjectionPercent, 10},
		{"enforcing_consecutive_5xx", c.EnforcingConsecutive5xx, 100},
		{"enforcing_consecutive_gateway_failure", c.EnforcingConsecutiveGatewayFailure, 0},
		{"enforcing_success_rate", c.EnforcingSuccessRate, 100},
		{"success_rate_minimum_hosts", c.SuccessRateMinimumHosts, 5},
		{"success_rate_request_volume", c.SuccessRateRequestVolume, 100},
		{"success_rate_stdev_factor", c.SuccessRateStdevFactor, 1900},
		{"failure_percentage_threshold", c.FailurePercentageThreshold, 85},
		{"enforcing_failure_percentage", c.EnforcingFailurePercentage, 0},
		{"failure_percentage_minimum_hosts", c.FailurePercentageMinimumHosts, 5},
		{"failure_percentage_request_volume", c.FailurePercentageRequestVolume, 50},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestParseConfig(t *testing.T) {
	c, err := ParseConfig("interval=1s, success_rate_minimum_hosts=3,enforcing_failure_percentage=100")
	if err != nil {
		t.Fatal(err)
	}
	if c.Interval != time.Second || c.SuccessRateMinimumHosts != 3 || c.EnforcingFailurePercentage != 100 || c.Consecutive5xx != 5 {
		t.Errorf("got %+v", c)
	}
	for _, bad := range []string{"interval", "nope=1", "interval=-1s", "max_ejection_percent=101", "consecutive_5xx=x"} {
		if _, err := ParseConfig(bad); err == nil {
			t.Errorf("ParseConfig(%q) took it", bad)
		}
	}
}

// The worked case, the study's fault at N=9: three servers at 95%
// against six at 100% give a mean of 98.3%, a stdev of 2.4 and a
// threshold of 93.8%: nothing is ejected. One faulty server out of nine
// gives 99.4%, 1.57 and 96.5%: it is ejected at the sweep.
func TestSuccessRateArithmetic(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		rates                  []float64
		mean, stdev, threshold float64
	}{
		{"paper n=9, three faulty", []float64{100, 100, 95, 100, 100, 95, 100, 100, 95}, 98.333, 2.357, 93.855},
		{"one faulty of nine", []float64{100, 100, 95, 100, 100, 100, 100, 100, 100}, 99.444, 1.571, 96.459},
		{"two of five", []float64{100, 95, 100, 95, 100}, 98, 2.449, 93.346},
		{"all equal", []float64{97, 97, 97, 97, 97}, 97, 0, 97},
	} {
		m, s, th := SuccessRateThreshold(tc.rates, 1900)
		if math.Abs(m-tc.mean) > 0.001 || math.Abs(s-tc.stdev) > 0.001 || math.Abs(th-tc.threshold) > 0.001 {
			t.Errorf("%s: mean %.3f stdev %.3f threshold %.3f, want %.3f %.3f %.3f", tc.name, m, s, th, tc.mean, tc.stdev, tc.threshold)
		}
	}
}

// The success-rate sweep end to end: per-host volumes of one interval,
// then what the sweep ejects.
func TestSuccessRateSweep(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n      int
		faulty map[string]int // failures per 100 requests
		volume int            // requests per host this interval
		cfg    func(*Config)
		want   []string
	}{
		{"paper n=9: three at 95% are not ejected", 9, map[string]int{"srv3": 5, "srv6": 5, "srv9": 5}, 500, nil, nil},
		{"one at 95% of nine is ejected", 9, map[string]int{"srv3": 5}, 500, nil, []string{"srv3"}},
		{"n=3 is below success_rate_minimum_hosts", 3, map[string]int{"srv3": 5}, 500, nil, nil},
		{"below success_rate_request_volume", 9, map[string]int{"srv3": 5}, 99, nil, nil},
		{"two of five at 95%: no ejection", 5, map[string]int{"srv2": 5, "srv4": 5}, 500, nil, nil},
		// One outlier among n sits sqrt(n-1) standard deviations below the
		// mean: at n=3 that is 1.41, never below 1.9, whatever its rate.
		{"minimum hosts lowered to 3: still 1.41 stdev, not 1.9", 3, map[string]int{"srv3": 50}, 500, func(c *Config) { c.SuccessRateMinimumHosts = 3 }, nil},
		{"minimum hosts 3 and factor 1.0", 3, map[string]int{"srv3": 5}, 500, func(c *Config) {
			c.SuccessRateMinimumHosts = 3
			c.SuccessRateStdevFactor = 1000
		}, []string{"srv3"}},
		{"one outlier of five: 2.0 stdev, ejected", 5, map[string]int{"srv2": 5}, 500, nil, []string{"srv2"}},
		{"enforcing_success_rate 0", 9, map[string]int{"srv3": 5}, 500, func(c *Config) { c.EnforcingSuccessRate = 0 }, nil},
		// Two outliers below the threshold, but max_ejection_percent (10%
		// of 9 hosts) lets only the first out.
		{"max_ejection_percent caps at one", 9, map[string]int{"srv3": 10, "srv6": 10}, 500, func(c *Config) { c.SuccessRateStdevFactor = 500 }, []string{"srv3"}},
		{"max_ejection_percent 100 lets both", 9, map[string]int{"srv3": 10, "srv6": 10}, 500,
			func(c *Config) { c.SuccessRateStdevFactor = 500; c.MaxEjectionPercent = 100 }, []string{"srv3", "srv6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Defaults()
			cfg.AlwaysEjectOneHost = true // one host of a few: the mechanism under test, not the cap
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			d := New(cfg, hosts(tc.n))
			for _, h := range hosts(tc.n) {
				feed(t, d, t0, h, tc.volume, tc.faulty[h]*tc.volume/100)
			}
			var got []string
			for _, a := range d.Sweep(t0.Add(cfg.Interval)) {
				if !a.Eject || a.Reason != SuccessRate {
					t.Errorf("unexpected %v", a)
				}
				got = append(got, a.Host)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("ejected %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFailurePercentage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		enforce int
		fail    int // srv1's failures per 100
		want    int
	}{
		{"off by default (enforcing 0)", 0, 90, 0},
		{"enforced, at 90% failures", 100, 90, 1},
		{"enforced, at 85% (the threshold: ejects)", 100, 85, 1},
		{"enforced, at 80%", 100, 80, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Defaults()
			cfg.AlwaysEjectOneHost = true // one host of a few: the mechanism under test, not the cap
			cfg.EnforcingFailurePercentage = tc.enforce
			cfg.EnforcingSuccessRate = 0
			cfg.Consecutive5xx = 0
			cfg.ConsecutiveGatewayFailure = 0
			d := New(cfg, hosts(5))
			for _, h := range hosts(5) {
				n := 0
				if h == "srv1" {
					n = tc.fail
				}
				for i := 0; i < 100; i++ {
					st := 200
					if i < n {
						st = 500
					}
					d.Record(t0, h, st)
				}
			}
			got := 0
			for _, a := range d.Sweep(t0.Add(cfg.Interval)) {
				if a.Eject && a.Host == "srv1" && a.Reason == FailurePercentage {
					got++
				}
			}
			if got != tc.want {
				t.Errorf("ejections %d, want %d", got, tc.want)
			}
		})
	}
}

func TestConsecutiveErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		statuses []int
		cfg      func(*Config)
		want     Reason // "" for no ejection
		at       int    // index of the response that ejects
	}{
		{"five 500s eject at the fifth", []int{500, 500, 500, 500, 500}, nil, Consecutive5xx, 4},
		{"a success resets the count", []int{500, 500, 500, 500, 200, 500, 500, 500, 500}, nil, "", 0},
		{"no answer counts as a 5xx", []int{0, 500, 0, 500, 503}, nil, Consecutive5xx, 4},
		{"gateway failures: enforcing 0 by default, consecutive 5xx still ejects", []int{503, 503, 503, 503, 503}, nil, Consecutive5xx, 4},
		{"gateway failures enforced, consecutive 5xx off", []int{502, 503, 504, 503, 502}, func(c *Config) {
			c.Consecutive5xx = 0
			c.EnforcingConsecutiveGatewayFailure = 100
		}, ConsecutiveGatewayFailure, 4},
		{"a 500 breaks a run of gateway failures", []int{502, 503, 500, 503, 502, 503}, func(c *Config) {
			c.Consecutive5xx = 0
			c.EnforcingConsecutiveGatewayFailure = 100
		}, "", 0},
		{"enforcing_consecutive_5xx 0", []int{500, 500, 500, 500, 500}, func(c *Config) { c.EnforcingConsecutive5xx = 0 }, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Defaults()
			cfg.AlwaysEjectOneHost = true // one host of a few: the mechanism under test, not the cap
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			d := New(cfg, hosts(3))
			var got Reason
			at := -1
			for i, st := range tc.statuses {
				if a := d.Record(t0, "srv1", st); a != nil {
					if got != "" {
						t.Fatalf("second ejection %v", a)
					}
					got, at = a.Reason, i
				}
			}
			if got != tc.want || (got != "" && at != tc.at) {
				t.Errorf("ejection %q at %d, want %q at %d", got, at, tc.want, tc.at)
			}
		})
	}
}

func TestEnforcingCoin(t *testing.T) {
	cfg := Defaults()
	cfg.AlwaysEjectOneHost = true // one host of a few: the mechanism under test, not the cap
	cfg.EnforcingConsecutive5xx = 30
	for _, tc := range []struct {
		roll  int
		eject bool
	}{{29, true}, {30, false}, {99, false}, {0, true}} {
		d := New(cfg, hosts(3))
		d.Roll = func() int { return tc.roll }
		var a *Action
		for i := 0; i < 5; i++ {
			a = d.Record(t0, "srv1", 500)
		}
		if (a != nil) != tc.eject {
			t.Errorf("roll %d: ejected %v, want %v", tc.roll, a != nil, tc.eject)
		}
	}
}

// outlier.rst: the host is ejected for base_ejection_time times the
// times it was ejected in a row, up to max_ejection_time; each sweep that
// finds it healthy decrements the multiplier, so that from the cap it
// takes about max_ejection_time / base_ejection_time × interval (300/30
// × 10 s = 100 s) to come down to base_ejection_time.
func TestEjectionTimeGrowsAndDecays(t *testing.T) {
	cfg := Defaults()
	cfg.AlwaysEjectOneHost = true // one host of a few: the mechanism under test, not the cap
	d := New(cfg, hosts(3))
	now := t0
	ejectNow := func() {
		t.Helper()
		var a *Action
		for i := 0; i < 5; i++ {
			a = d.Record(now, "srv1", 500)
		}
		if a == nil {
			t.Fatalf("at %v: not ejected", now.Sub(t0))
		}
	}
	var outFor []time.Duration
	for k := 0; k < 12; k++ {
		ejectNow()
		from := now
		for d.Ejected("srv1") {
			now = now.Add(cfg.Interval)
			d.Sweep(now)
		}
		outFor = append(outFor, now.Sub(from))
	}
	want := []time.Duration{30, 60, 90, 120, 150, 180, 210, 240, 270, 300, 300, 300}
	for i := range want {
		if outFor[i] != want[i]*time.Second {
			t.Errorf("ejection %d lasted %v, want %v", i+1, outFor[i], want[i]*time.Second)
		}
	}
	// Envoy's ejectHost grows the backoff while backoff·base < max +
	// base: 11·30 s = 330 s is not under 330 s, so it stops at 11.
	if m := d.Multiplier("srv1"); m != 11 {
		t.Fatalf("multiplier at the cap %d, want 11", m)
	}
	// Healthy from now on: eleven sweeps, 110 s, bring it back to 0.
	for i := 1; i <= 11; i++ {
		now = now.Add(cfg.Interval)
		d.Sweep(now)
		if m := d.Multiplier("srv1"); m != 11-i {
			t.Fatalf("after %d healthy sweeps multiplier %d, want %d", i, m, 11-i)
		}
	}
	ejectNow()
	if got := d.EjectionTime("srv1"); got != cfg.BaseEjectionTime {
		t.Errorf("after 110 s healthy, ejection time %v, want base %v", got, cfg.BaseEjectionTime)
	}
}

// max_ejection_percent as Envoy respects it since 1.28: an ejection only
// if 100·(ejected+1)/hosts <= max, unless always_eject_one_host (1.31,
// default false) lets the first through. Envoy's
// OutlierDetectorImplTest cases on max_ejection_percent, translated.
func TestMaxEjectionPercent(t *testing.T) {
	for _, tc := range []struct {
		n, pct int
		always bool
		want   int
	}{
		{3, 10, false, 0}, {9, 10, false, 0}, {10, 10, false, 1}, {20, 10, false, 2}, {9, 50, false, 4}, {4, 100, false, 4}, {5, 0, false, 0},
		// always_eject_one_host: the first whatever the value, then the cap.
		{3, 10, true, 1}, {9, 10, true, 1}, {5, 0, true, 1}, {20, 10, true, 2}, {9, 50, true, 4},
	} {
		cfg := Defaults()
		cfg.MaxEjectionPercent, cfg.AlwaysEjectOneHost = tc.pct, tc.always
		d := New(cfg, hosts(tc.n))
		got := 0
		for _, h := range hosts(tc.n) {
			for i := 0; i < 5; i++ {
				if d.Record(t0, h, 500) != nil {
					got++
				}
			}
		}
		if got != tc.want {
			t.Errorf("n=%d max %d%% always_eject_one_host %v: %d ejected, want %d", tc.n, tc.pct, tc.always, got, tc.want)
		}
	}
}

// Only the consecutive counter that fired is reset: an unenforced
// consecutive-5xx detection leaves the gateway-failure count running.
// Where both fire on one response, the gateway failure is recorded first
// (and ejects when enforced); the 5xx detection finds the host out.
func TestConsecutiveCountersResetApart(t *testing.T) {
	for _, tc := range []struct {
		name     string
		cfg      func(*Config)
		statuses []int
		want     Reason
		at       int
		detected map[Reason]int
	}{
		{"an unenforced 5xx detection does not reset the gateway count", func(c *Config) {
			c.Consecutive5xx, c.EnforcingConsecutive5xx = 3, 0
			c.ConsecutiveGatewayFailure, c.EnforcingConsecutiveGatewayFailure = 5, 100
		}, []int{503, 503, 503, 503, 503}, ConsecutiveGatewayFailure, 4, map[Reason]int{Consecutive5xx: 1, ConsecutiveGatewayFailure: 1}},
		{"both fire on one response, both enforced: the gateway failure", func(c *Config) {
			c.EnforcingConsecutiveGatewayFailure = 100
		}, []int{503, 503, 503, 503, 503}, ConsecutiveGatewayFailure, 4, map[Reason]int{ConsecutiveGatewayFailure: 1}},
		{"both fire, gateway unenforced (the default): both recorded, 5xx ejects", nil,
			[]int{503, 503, 503, 503, 503}, Consecutive5xx, 4, map[Reason]int{Consecutive5xx: 1, ConsecutiveGatewayFailure: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Defaults()
			cfg.AlwaysEjectOneHost = true
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			d := New(cfg, hosts(3))
			var got Reason
			at := -1
			for i, st := range tc.statuses {
				if a := d.Record(t0, "srv1", st); a != nil {
					got, at = a.Reason, i
				}
			}
			if got != tc.want || at != tc.at {
				t.Errorf("ejection %q at %d, want %q at %d", got, at, tc.want, tc.at)
			}
			if !reflect.DeepEqual(d.Detected, tc.detected) {
				t.Errorf("detected %v, want %v", d.Detected, tc.detected)
			}
		})
	}
}

// The backoff is decremented after the interval's detections: a host
// back in service with backoff 1, ejected again by a success-rate sweep,
// goes to 2 (decremented first, it stayed at 1).
func TestBackoffDecrementedAfterTheSweep(t *testing.T) {
	cfg := Defaults()
	cfg.MaxEjectionPercent = 100
	d := New(cfg, hosts(9))
	now := t0
	for range 5 {
		d.Record(now, "srv1", 500)
	}
	if !d.Ejected("srv1") || d.Multiplier("srv1") != 1 {
		t.Fatalf("srv1 not ejected with backoff 1")
	}
	now = now.Add(cfg.BaseEjectionTime)
	d.Sweep(now) // returned; not decremented on the sweep that returns it
	if d.Ejected("srv1") || d.Multiplier("srv1") != 1 {
		t.Fatalf("after its return: ejected %v, backoff %d, want false, 1", d.Ejected("srv1"), d.Multiplier("srv1"))
	}
	// One interval at 50% errors on srv1, none elsewhere: the sweep ejects
	// it on its success rate.
	for _, h := range hosts(9) {
		for i := range 200 {
			st := 200
			if h == "srv1" && i%2 == 0 {
				st = 500
			}
			d.Record(now, h, st)
		}
	}
	now = now.Add(cfg.Interval)
	ejected := false
	for _, a := range d.Sweep(now) {
		ejected = ejected || (a.Eject && a.Host == "srv1" && a.Reason == SuccessRate)
	}
	if !ejected {
		t.Fatalf("srv1 not ejected by the success-rate sweep")
	}
	if m := d.Multiplier("srv1"); m != 2 {
		t.Errorf("backoff %d, want 2 (1, ejected again before any decrement)", m)
	}
}
