package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

func TestParseRestarts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want soak.Restarts
		ok   bool
	}{
		{"6:3", soak.Restarts{EveryHours: 6, Down: 3 * time.Second}, true},
		{"0.5:0.25", soak.Restarts{EveryHours: 0.5, Down: 250 * time.Millisecond}, true},
		{"6", soak.Restarts{}, false},
		{"0:3", soak.Restarts{}, false},
		{"6:0", soak.Restarts{}, false},
		{"6:-1", soak.Restarts{}, false},
		{"6:7200", soak.Restarts{}, false},
		{"six:3", soak.Restarts{}, false},
	} {
		got, err := parseRestarts(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("%q: %+v, %v; want %+v ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--restarts") {
			t.Errorf("%q: the error %q does not name the flag", tc.in, err)
		}
	}
}

func TestEvidenceCheckFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"100ms", 100 * time.Millisecond, true},
		{"0.1", 100 * time.Millisecond, true},
		{"2", 2 * time.Second, true},
		{"250ms", 250 * time.Millisecond, true},
		{"50ms", 0, false},
		{"0", 0, false},
		{"2m", 0, false},
		{"NaN", 0, false},
		{"fast", 0, false},
	} {
		v := secondsValue(time.Second)
		err := v.Set(tc.in)
		if (err == nil) != tc.ok || (tc.ok && time.Duration(v) != tc.want) {
			t.Errorf("%q: %v, %v; want %v ok %v", tc.in, time.Duration(v), err, tc.want, tc.ok)
		}
	}
}

func TestCheckNoiseFlags(t *testing.T) {
	for _, tc := range []struct {
		name       string
		spread     float64
		bursts     bool
		fleetFault float64
		faulty     int
		fault      bool
		want       string
	}{
		{"defaults", 0, false, 0, 1, false, ""},
		{"spread with bursts", 5, true, 0, 1, false, ""},
		{"spread without bursts", 5, false, 0, 1, false, "--burst-spread 5: needs --bursts"},
		{"negative spread", -1, true, 0, 1, false, "--burst-spread -1"},
		{"fleet fault 5%", 0, false, 0.05, 1, false, ""},
		{"fleet fault 100%", 0, false, 1, 1, false, "--fleet-fault 1"},
		{"three faulty", 0, false, 0, 3, true, ""},
		{"faulty without fault", 0, false, 0, 3, false, "--faulty 3: needs --fault"},
		{"faulty 0", 0, false, 0, 0, true, "--faulty 0"},
	} {
		err := checkNoiseFlags(tc.spread, tc.bursts, tc.fleetFault, tc.faulty, tc.fault)
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v; want %q", tc.name, err, tc.want)
		}
	}
}

func TestCheckCycles(t *testing.T) {
	zero, two := 0.0, 2.0
	for _, tc := range []struct {
		name string
		r    soak.Result
		ok   bool
	}{
		{"once a day", soak.Result{Cell: "a", ServerDays: 10, MostOneServerOneDay: 1}, true},
		{"twice a day", soak.Result{Cell: "b", ServerDays: 10, MostOneServerOneDay: 2}, false},
		{"no incident drain", soak.Result{Cell: "c", FleetFaultPer1000: &zero}, true},
		{"incident drains", soak.Result{Cell: "d", FleetFaultPer1000: &two}, false},
	} {
		if err := checkCycles([]soak.Result{tc.r}, 1, 1); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if err := checkCycles([]soak.Result{{ServerDays: 1, MostOneServerOneDay: 9}}, 0, 0); err != nil {
		t.Errorf("unbounded: %v", err)
	}
}

// TestSoakNoiseFlagsRun: each of issue 41's flags, through the command
// and its JSON, on tiny cells.
func TestSoakNoiseFlagsRun(t *testing.T) {
	small := []string{"--servers", "2", "--rate", "1", "--server-days", "2", "--seeds", "1", "--warmup", "1m", "--trials", "2"}
	for _, tc := range []struct {
		name   string
		args   []string
		header string         // in the table's first lines
		want   map[string]any // JSON fields of the first cell
		absent []string       // JSON fields not there
	}{
		{"restarts", []string{"--restarts", "6:3"}, "most a server-day",
			map[string]any{"restarts": "6:3", "cell": "N=2 1 req/s 0.2% restarts 6:3", "server_days": 2.0}, []string{"fleet_fault_drains_per_1000_incident_hours"}},
		{"burst spread", []string{"--bursts", "6:3-10", "--burst-spread", "5"}, "false drains",
			map[string]any{"burst_spread_s": 5.0, "bursts": "6:3-10"}, nil},
		{"fleet fault", []string{"--fleet-fault", "0.05"}, "per 1,000 incident-h",
			map[string]any{"fleet_fault": 0.05, "incident_hours": 2.0, "trials": 2.0}, nil},
		{"three faulty", []string{"--servers", "9", "--rate", "33", "--server-days", "0", "--fault", "0.05", "--faulty", "3"}, "3 at 5%",
			map[string]any{"faulty": 3.0, "trials": 2.0}, nil},
		{"check 100ms", []string{"--evidence-check", "0.1"}, "every 100ms of simulated traffic",
			map[string]any{"evidence_check_s": 0.1}, nil},
		{"random fleets", []string{"--random-fleets", "--server-days", "0", "--fault", "0.2", "--trials", "1"}, "random fleets",
			map[string]any{"random_fleets": true, "servers": 0.0, "cell": "random fleets"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "soak.json")
			var stdout, stderr bytes.Buffer
			args := append(append(slices.Clone(small), tc.args...), "--json", out)
			if err := cmdSoak(context.Background(), args, &stdout, &stderr); err != nil {
				t.Fatalf("%v\n%s", err, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.header) {
				t.Errorf("the table lacks %q:\n%s", tc.header, stdout.String())
			}
			raw, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var cells []map[string]any
			if err := json.Unmarshal(raw, &cells); err != nil || len(cells) == 0 {
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
			for _, k := range []string{"false_drains_per_1000_server_days", "zone_drains", "most_drains_one_server_one_day", "server_days"} {
				if _, ok := cells[0][k]; !ok {
					t.Errorf("%s missing", k)
				}
			}
		})
	}
}

// TestSoakNoiseFlagErrors: bad values of the new flags stop the command
// with an error that names the flag, before any simulation.
func TestSoakNoiseFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--restarts", "6"}, "--restarts"},
		{[]string{"--burst-spread", "5"}, "--burst-spread"},
		{[]string{"--fleet-fault", "2"}, "--fleet-fault"},
		{[]string{"--fleet-fault", "x"}, "fleet-fault"},
		{[]string{"--faulty", "3"}, "--faulty"},
		{[]string{"--fault", "0.05", "--faulty", "9"}, "faulty 9"},
		{[]string{"--evidence-check", "10ms"}, "evidence-check"},
		{[]string{"--readmit", "--restarts", "6:3"}, "--readmit: --restarts"},
	} {
		var stdout, stderr bytes.Buffer
		err := cmdSoak(context.Background(), append(tc.args, "--server-days", "1"), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error()+stderr.String(), tc.want) {
			t.Errorf("%v: %v %s; want an error naming %q", tc.args, err, stderr.String(), tc.want)
		}
	}
}

// TestWriteSoakTableColumns: the zone's and the incidents' columns only
// where a result has them.
func TestWriteSoakTableColumns(t *testing.T) {
	per := 0.0
	plain := soak.Result{Cell: "plain", ServerDays: 9, HealthyServerDays: 9}
	zone := soak.Result{Cell: "zone", ServerDays: 9, HealthyServerDays: 8, ZoneServerDays: 1, ZoneDrains: 4, MostOneServerOneDay: 4}
	fleet := soak.Result{Cell: "fleet", FleetFault: 0.05, IncidentHours: 10, FleetFaultPer1000: &per, FleetFaultHigh95: 368.89}
	for _, tc := range []struct {
		results      []soak.Result
		want, absent []string
	}{
		{[]soak.Result{plain}, []string{"most a server-day"}, []string{"zone drains", "incident-h"}},
		{[]soak.Result{plain, zone}, []string{"zone drains", "per 1,000 healthy server-days"}, []string{"incident-h"}},
		{[]soak.Result{fleet}, []string{"incident-h", "0.00 [368.89]"}, []string{"zone drains", "most a server-day"}},
	} {
		var b bytes.Buffer
		WriteSoakTable(&b, tc.results)
		for _, w := range tc.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("lacks %q:\n%s", w, b.String())
			}
		}
		for _, a := range tc.absent {
			if strings.Contains(b.String(), a) {
				t.Errorf("has %q:\n%s", a, b.String())
			}
		}
	}
}
