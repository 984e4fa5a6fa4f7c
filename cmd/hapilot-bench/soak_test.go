package main

import (
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/soak"
)

func TestParseBursts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want soak.Bursts
		ok   bool
	}{
		{"6:3-10", soak.Bursts{EveryHours: 6, Min: 3, Max: 10}, true},
		{"0.5:1-1", soak.Bursts{EveryHours: 0.5, Min: 1, Max: 1}, true},
		{"6:10-3", soak.Bursts{}, false},
		{"6:0-3", soak.Bursts{}, false},
		{"0:3-10", soak.Bursts{}, false},
		{"6-3:10", soak.Bursts{}, false},
		{"six:3-10", soak.Bursts{}, false},
	} {
		got, err := parseBursts(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%q: %+v, %v; want %+v ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestCheckPromise(t *testing.T) {
	healthy := soak.Result{Cell: "a", ServerDays: 10000, FalseDrainsPer1000: 0.3, High95: 0.9}
	for _, tc := range []struct {
		name string
		r    soak.Result
		ok   bool
	}{
		{"within", healthy, true},
		{"over the rate", soak.Result{Cell: "b", ServerDays: 1000, FalseDrainsPer1000: 2, High95: 5}, false},
		{"rate met, upper end not", soak.Result{Cell: "c", ServerDays: 1000, FalseDrainsPer1000: 1, High95: 5.6}, false},
		{"a fault cell has no days", soak.Result{Cell: "d", FalseDrainsPer1000: 0}, true},
	} {
		if err := checkPromise([]soak.Result{healthy, tc.r}, 1, 2); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func TestParseShapes(t *testing.T) {
	for _, tc := range []struct {
		flap, latency string
		hetero        float64
		wantFlap      soak.Flap
		wantLat       soak.Latency
		ok            bool
	}{
		{"", "", 0, soak.Flap{}, soak.Latency{}, true},
		{"5:25", "20:0.6", 0.3, soak.Flap{On: 5 * time.Second, Off: 25 * time.Second}, soak.Latency{MedianMs: 20, Sigma: 0.6, Hetero: 0.3}, true},
		{"0.5:1.5", "", 0, soak.Flap{On: 500 * time.Millisecond, Off: 1500 * time.Millisecond}, soak.Latency{}, true},
		{"5", "", 0, soak.Flap{}, soak.Latency{}, false},
		{"0:5", "", 0, soak.Flap{}, soak.Latency{}, false},
		{"", "20", 0, soak.Flap{}, soak.Latency{}, false},
		{"", "", 0.3, soak.Flap{}, soak.Latency{}, false}, // hetero without a model
	} {
		fl, lat, err := parseShapes(tc.flap, tc.latency, tc.hetero)
		if (err == nil) != tc.ok || (tc.ok && (fl != tc.wantFlap || lat != tc.wantLat)) {
			t.Errorf("%q %q %v: %+v %+v %v; want %+v %+v ok %v", tc.flap, tc.latency, tc.hetero, fl, lat, err, tc.wantFlap, tc.wantLat, tc.ok)
		}
	}
}
