//go:build e2e && soak

package e2e

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lab/haproxyproc"
	"github.com/hapilot/hapilot/internal/lab/scenario"
)

// TestSoak runs a real HAProxy at steady load for HAPILOT_SOAK (30m by
// default; `make soak`), the agent (a `hapilot run` process) taking a
// drip of hostile input on every port it listens on, every second:
// garbage and silent SPOE connections, SPOE messages with made-up server
// names, overlong and huge-count Lua lines, half-sent syslog frames, big
// POSTs to /status. The agent's RSS must stay within 10% of its level
// after a two-minute warm-up, no step may overrun, and its goroutines
// must not grow.
func TestSoak(t *testing.T) {
	d := 30 * time.Minute
	if v := os.Getenv("HAPILOT_SOAK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	ports, err := haproxyproc.FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	lua, syslog, status := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1]), fmt.Sprintf("127.0.0.1:%d", ports[2])
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var samples []sample
	var spoe string
	s := scenario.Scenario{Servers: paperFleet(0, 0, 0.05, 0, 0, 0.05), Rate: 200, Duration: d, Policy: "rules", AgentBinary: agentBinary,
		AgentArgs: []string{"--lua-listen", lua, "--syslog-listen", "tcp://" + syslog, "--status-listen", status},
		At: map[time.Duration]func(*scenario.Env){
			time.Second: func(env *scenario.Env) {
				spoe = env.AgentAddr
				wg.Add(2)
				go func() { defer wg.Done(); drip(stop, spoe, lua, syslog, status) }()
				go func() {
					defer wg.Done()
					pid := agentPID(t)
					tick := time.NewTicker(30 * time.Second)
					defer tick.Stop()
					for {
						select {
						case <-stop:
							return
						case <-tick.C:
							smp := sample{at: time.Now(), rss: rss(pid)}
							smp.goroutines, smp.skipped = metrics(status)
							mu.Lock()
							samples = append(samples, smp)
							mu.Unlock()
							t.Logf("rss %d KiB, goroutines %d, skipped steps %d", smp.rss, smp.goroutines, smp.skipped)
						}
					}
				}()
			},
		}}
	out := run(t, s)
	close(stop)
	wg.Wait()
	t.Logf("%d requests, %d failed, %d 5xx, p99 %v, drained %v", out.Load.Scheduled, out.Load.Failed, out.Load.Err5xx, out.Load.Quantile(0.99), out.DrainedAt)
	var after []sample
	for _, smp := range samples {
		if smp.at.Sub(out.Start) >= 2*time.Minute {
			after = append(after, smp)
		}
	}
	if len(after) < 2 {
		t.Fatalf("%d samples after the warm-up: run longer than 3 minutes", len(after))
	}
	base, last := after[0], after[len(after)-1]
	for _, smp := range after {
		if float64(smp.rss) > 1.1*float64(base.rss) {
			t.Errorf("RSS %d KiB at %v, over 110%% of %d KiB after the warm-up", smp.rss, smp.at.Sub(out.Start).Round(time.Second), base.rss)
		}
	}
	if last.skipped != 0 {
		t.Errorf("%d steps overran", last.skipped)
	}
	if last.goroutines > base.goroutines+20 {
		t.Errorf("goroutines grew from %d to %d", base.goroutines, last.goroutines)
	}
	if _, ok := out.DrainedAt["srv3"]; !ok || len(out.DrainedAt) != 2 {
		t.Errorf("under the drip the agent drained %v, want srv3 and srv6", out.DrainedAt)
	}
	t.Logf("RSS %d KiB after the warm-up, %d KiB at the end; goroutines %d then %d; %d steps overran",
		base.rss, last.rss, base.goroutines, last.goroutines, last.skipped)
}

type sample struct {
	at                  time.Time
	rss                 int
	goroutines, skipped int
}

// agentPID finds the `hapilot run` process this package started.
func agentPID(t *testing.T) int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err == nil && strings.HasPrefix(string(b), agentBinary+"\x00run") {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	t.Fatal("no hapilot run process")
	return 0
}

func rss(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return kb
		}
	}
	return -1
}

func metrics(status string) (goroutines, skipped int) {
	c, err := net.DialTimeout("tcp", status, 2*time.Second)
	if err != nil {
		return -1, -1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 {
			switch f[0] {
			case "hapilot_goroutines":
				goroutines, _ = strconv.Atoi(f[1])
			case "hapilot_cycles_skipped_total":
				skipped, _ = strconv.Atoi(f[1])
			}
		}
	}
	return goroutines, skipped
}

// drip sends a little hostile input to every port, every second.
func drip(stop <-chan struct{}, spoe, lua, syslog, status string) {
	rng := rand.New(rand.NewPCG(1, 2))
	var held []net.Conn // silent connections, kept open a while
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		send := func(addr string, b []byte) {
			if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				_ = c.SetDeadline(time.Now().Add(2 * time.Second))
				_, _ = c.Write(b)
				c.Close()
			}
		}
		junk := make([]byte, 64+rng.IntN(4096))
		for j := range junk {
			junk[j] = byte(rng.Uint32())
		}
		send(spoe, junk)
		var frame [4]byte
		binary.BigEndian.PutUint32(frame[:], 16000)
		send(spoe, append(frame[:], junk[:32]...)) // a frame that never completes
		if c, err := net.DialTimeout("tcp", spoe, time.Second); err == nil && len(held) < 50 {
			held = append(held, c) // silent: the agent closes it at its hello timeout
		}
		var lines strings.Builder
		for j := 0; j < 50; j++ {
			fmt.Fprintf(&lines, "app made-up-%d-%d 500 5\n", i, j)
		}
		fmt.Fprintf(&lines, "app srv1 200 5 1048576\n%s\n", strings.Repeat("x", 10000))
		send(lua, []byte(lines.String()))
		send(syslog, []byte("60000 <134>hapilot app srv1 200 5")) // half a frame
		send(syslog, junk)
		send(status, []byte("POST /status HTTP/1.1\r\nHost: x\r\nContent-Length: 4000000\r\n\r\n"+string(junk)))
		if i%10 == 0 {
			for _, c := range held {
				c.Close()
			}
			held = held[:0]
		}
	}
}
