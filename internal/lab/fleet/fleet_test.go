package fleet

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/labtest"
)

func TestBackendInjectsFaults(t *testing.T) {
	tests := []struct {
		name   string
		rate   float64
		lo, hi int
	}{
		{"healthy", 0, 0, 0},
		{"always failing", 1, 400, 400},
		{"5%", 0.05, 5, 40}, // 400 draws: mean 20
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := StartBackend(BackendConfig{ErrorRate: tc.rate, Seed: 7})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			res := Load{Addr: b.Addr, Rate: 400, Duration: time.Second}.Run(context.Background())
			if res.Completed != 400 || res.Failed != 0 {
				t.Fatalf("completed %d failed %d", res.Completed, res.Failed)
			}
			if res.Err5xx < tc.lo || res.Err5xx > tc.hi || uint64(res.Err5xx) != b.Failed() {
				t.Fatalf("%d 5xx (backend counted %d), want %d..%d", res.Err5xx, b.Failed(), tc.lo, tc.hi)
			}
		})
	}
}

// An open-loop load must show a server's queue as latency: capacity 1 at
// 20 ms per request serves 50 req/s, and 100 req/s for 1 s builds a
// queue, so late requests wait hundreds of milliseconds from their due
// time, where a closed loop would just have sent fewer.
func TestOpenLoopShowsQueueing(t *testing.T) {
	b, err := StartBackend(BackendConfig{Latency: 20 * time.Millisecond, Capacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	res := Load{Addr: b.Addr, Rate: 100, Duration: time.Second}.Run(context.Background())
	if res.Completed != 100 {
		t.Fatalf("completed %d", res.Completed)
	}
	if p99 := res.Quantile(0.99); p99 < 500*time.Millisecond {
		t.Fatalf("p99 %v: the queue is hidden", p99)
	}
	if p50 := res.Quantile(0.01); p50 < 20*time.Millisecond {
		t.Fatalf("fastest %v below the service time", p50)
	}
}

func TestErrorRateChangesLive(t *testing.T) {
	b, err := StartBackend(BackendConfig{ErrorRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	b.SetErrorRate(0)
	res := Load{Addr: b.Addr, Rate: 100, Duration: time.Second}.Run(context.Background())
	if res.Err5xx != 0 {
		t.Fatalf("%d 5xx after healing", res.Err5xx)
	}
}

// checkConfig writes cfg to dir/haproxy.cfg and fails t unless
// haproxy -c accepts it.
func checkConfig(t *testing.T, dir, cfg string) {
	t.Helper()
	p := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(haproxyproc.Binary(), "-c", "-f", p).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s\n%s", err, out, cfg)
	}
}

func TestHAProxyConfigIsValid(t *testing.T) {
	labtest.RequireHAProxy(t)
	for _, agent := range []string{"", "127.0.0.1:4242"} {
		dir := t.TempDir()
		cfg, err := HAProxyConfig(HAProxyOptions{Dir: dir, FrontendPort: 18080, Servers: []string{"127.0.0.1:1", "127.0.0.1:2"}, Algo: "leastconn", AgentAddr: agent})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(cfg, "spoe") != (agent != "") || !strings.Contains(cfg, "balance leastconn") || !strings.Contains(cfg, "server srv2 127.0.0.1:2") {
			t.Fatalf("config:\n%s", cfg)
		}
		checkConfig(t, dir, cfg)
	}
}

// The benchmark's haproxy-l7 baseline: HAProxy's own detection on every
// server, with HTTP checks; haproxy -c accepts each on-error action.
func TestHAProxyConfigObserveLayer7(t *testing.T) {
	labtest.RequireHAProxy(t)
	for _, action := range []string{"fastinter", "fail-check", "sudden-death", "mark-down"} {
		dir := t.TempDir()
		opts := "check observe layer7 error-limit 1 on-error " + action
		cfg, err := HAProxyConfig(HAProxyOptions{Dir: dir, FrontendPort: 18080, Servers: []string{"127.0.0.1:1", "127.0.0.1:2"}, Weight: 100, MaxConn: 4,
			ServerOptions: opts, HTTPCheck: true})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(cfg, "    option httpchk GET /\n") || !strings.Contains(cfg, "server srv2 127.0.0.1:2 weight 100 maxconn 4 "+opts+"\n") {
			t.Fatalf("config:\n%s", cfg)
		}
		checkConfig(t, dir, cfg)
	}
}

// SPOETime times the engine of both stanzas, full and sampled, and
// haproxy -c accepts it.
func TestHAProxyConfigSPOETime(t *testing.T) {
	labtest.RequireHAProxy(t)
	for _, sample := range []int{0, 16} {
		dir := t.TempDir()
		cfg, err := HAProxyConfig(HAProxyOptions{Dir: dir, FrontendPort: 18080, Servers: []string{"127.0.0.1:1"}, AgentAddr: "127.0.0.1:4242", Sample: sample, SPOETime: true})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(cfg, "http-after-response set-header "+SPOETimeHeader+" %[var(txn.hapilot.spoe_ms)]") {
			t.Fatalf("sample %d: no header rule:\n%s", sample, cfg)
		}
		spoeFiles, _ := filepath.Glob(filepath.Join(dir, "hapilot-spoe*.conf"))
		if len(spoeFiles) != 1 {
			t.Fatalf("sample %d: SPOE files %v", sample, spoeFiles)
		}
		spoeConf, err := os.ReadFile(spoeFiles[0])
		if err != nil || !strings.Contains(string(spoeConf), "spoe-agent hapilot\n    option set-total-time spoe_ms\n") {
			t.Fatalf("sample %d: %v\n%s", sample, err, spoeConf)
		}
		checkConfig(t, dir, cfg)
	}
}

func TestSPOEMsHeader(t *testing.T) {
	for _, tt := range []struct {
		header string
		want   int
	}{{"", -1}, {"0", 0}, {"20", 20}, {"-3", -1}, {"x", -1}} {
		if got := spoeMs([]byte(tt.header)); got != tt.want {
			t.Errorf("spoeMs(%q) = %d, want %d", tt.header, got, tt.want)
		}
	}
	r := &Result{spoeMs: [][]int{{30}, {0, 12}, {25, 9}}}
	if got := r.SPOEHeld(1, 10*time.Millisecond); got != 2 {
		t.Errorf("SPOEHeld(1, 10ms) = %d, want 2", got)
	}
}

func TestSampledPath(t *testing.T) {
	tests := []struct {
		path             string
		k                int
		sampled, invalid bool
	}{
		{"spoe", 0, false, false},
		{"stats", 0, false, false},
		{"spoe-sampled", 16, true, false},
		{"spoe-sampled4", 4, true, false},
		{"spoe-sampled1024", 1024, true, false},
		{"spoe-sampled0", 0, true, true},
		{"spoe-sampled1025", 0, true, true},
		{"spoe-sampledK", 0, true, true},
	}
	for _, tt := range tests {
		k, sampled, err := SampledPath(tt.path)
		if k != tt.k || sampled != tt.sampled || (err != nil) != tt.invalid {
			t.Errorf("%s: k %d sampled %v err %v", tt.path, k, sampled, err)
		}
	}
}
