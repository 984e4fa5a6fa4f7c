package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

func TestCommands(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{[]string{"version"}, 0, "hapilot-bench dev", ""},
		{nil, 2, "", "usage"},
		{[]string{"run"}, 2, "", "unknown command"},
		{[]string{"bench", "--list"}, 0, "two-faults", ""},
		{[]string{"bench", "--scenario", "meteor"}, 1, "", "unknown scenario"},
		{[]string{"bench", "--policy", "llm"}, 1, "", "needs --emulate"},
		{[]string{"bench", "--policy", "llm", "--emulate", "oracle"}, 1, "", "unknown emulation"},
		{[]string{"bench", "--policy", "llm", "--emulate", "capable", "--protections", "maybe"}, 1, "", "want on, off"},
		{[]string{"bench", "--algo", "random"}, 1, "", "roundrobin or leastconn"},
		{[]string{"bench", "--servers", "1"}, 1, "", "from 2 to 64"},
		{[]string{"bench", "--report", "/nonexistent"}, 1, "", "no such file"},
		{[]string{"bench", "--policy", "haproxy-l7", "--haproxy-l7", "10:reboot"}, 1, "", "LIMIT:ACTION"},
		{[]string{"bench", "--policy", "haproxy-l7", "--haproxy-l7", ""}, 1, "", "needs --haproxy-l7"},
		{[]string{"bench", "--policy", "envoy", "--envoy", "success_rate_stdev_factor"}, 1, "", "field=value"},
		{[]string{"bench", "--policy", "envoy", "--envoy", "interval=soon"}, 1, "", "not a duration"},
		{[]string{"bench", "--seeds", "5-1"}, 1, "", "--seeds"},
		{[]string{"demo", "--fault", "flaky"}, 1, "", "want 500|hang|reset|refuse|garbage|slow"},
		{[]string{"bench", "--policy", "carrier-pigeon"}, 1, "", "want static, haproxy-l7, envoy"},
		{[]string{"bench", "overhead", "--paths", "plain,carrier-pigeon", "--duration", "1s"}, 1, "", "unknown telemetry path"},
		{[]string{"bench", "overhead", "--paths", "plain,spoe", "--haproxy", "3.2"}, 1, "", "want NAME=PATH"},
		{[]string{"bench", "overhead", "--paths", "plain,spoe", "--haproxy", "2.6=haproxy,=x"}, 1, "", "want NAME=PATH"},
		{[]string{"bench", "overhead", "--paths", "plain,spoe", "--haproxy", "none=/nonexistent/haproxy"}, 1, "", "none (/nonexistent/haproxy)"},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(out.String(), tc.stdout) || !strings.Contains(errb.String(), tc.stderr) {
				t.Fatalf("code %d, stdout %q, stderr %q", code, out.String(), errb.String())
			}
		})
	}
}

func TestParseSeeds(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
	}{{"1-5", "[1 2 3 4 5]"}, {"3", "[3]"}, {"1,3,7", "[1 3 7]"}, {"1-3,2,9", "[1 2 3 9]"}, {"x", ""}, {"4-2", ""}, {",", ""}} {
		got, err := parseSeeds(tc.in)
		if (err != nil) != (tc.want == "") || (err == nil && fmt.Sprint(got) != tc.want) {
			t.Errorf("parseSeeds(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
}

func TestBenchVariants(t *testing.T) {
	vs, err := benchVariants([]string{"static", "haproxy-l7", "envoy", "rules", "llm"}, []string{"capable"}, []string{"on"}, []string{"a", "b"}, []string{"10:fail-check", "1:mark-down"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range vs {
		names = append(names, v.Name())
	}
	want := "[haproxy-l7/10/fail-check haproxy-l7/1/mark-down envoy rules llm/capable llm/a llm/b]"
	if fmt.Sprint(names) != want {
		t.Errorf("variants %v, want %s", names, want)
	}
	vs, _ = benchVariants([]string{"llm"}, nil, []string{"on"}, []string{"qwen3:8b"}, nil)
	if len(vs) != 1 || vs[0].Name() != "llm" || vs[0].Model != "qwen3:8b" {
		t.Errorf("one real model: %+v", vs)
	}
}
