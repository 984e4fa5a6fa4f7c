package bench

import (
	"strings"
	"testing"
	"time"
)

func TestParseProfile(t *testing.T) {
	// 3.2's table (the caller column) and 2.6's (none), as printed.
	reply := `Per-task CPU profiling              : on            # set profiling tasks {on|auto|off}
Tasks activity over 14.678 sec till 0.000 sec ago:
  function                      calls   cpu_tot   cpu_avg   lat_tot   lat_avg
  process_stream               107955   108.1ms   1.001us   5.018s    46.48us <- sc_notify@src/stconn.c:1243 task_wakeup
  h1_io_cb                      71923   136.9ms   1.903us   314.9ms   4.378us <- sock_conn_iocb@src/sock.c:1110 tasklet_wakeup
  main+0x1dbea0                 11054   11.32ms   1.024us   262.9ms   23.78us <- spop_snd_buf@src/mux_spop.c:3425 tasklet_wakeup
  srv_cleanup_idle_conns            1   2.404us   2.404us   592.0ns   592.0ns <- srv_add_to_idle_list@src/server.c:7330 task_schedule
  process_stream                  12        -         -   1.000s    1.000us
  spoe_handle_appctx             3000   273.0ns   1.000ns   1.5s      2.000us
  broken                          x1    1.0ms     1.0ms     1.0ms     1.0ms
  unparsable                      10    1.0qs     1.0ms     1.0ms     1.0ms
`
	want := []ProfileRow{
		{"process_stream", "sc_notify@src/stconn.c:1243", 107955, 108100 * time.Microsecond},
		{"h1_io_cb", "sock_conn_iocb@src/sock.c:1110", 71923, 136900 * time.Microsecond},
		{"main+0x1dbea0", "spop_snd_buf@src/mux_spop.c:3425", 11054, 11320 * time.Microsecond},
		{"srv_cleanup_idle_conns", "srv_add_to_idle_list@src/server.c:7330", 1, 2404 * time.Nanosecond},
		{"process_stream", "", 12, 0},
		{"spoe_handle_appctx", "", 3000, 273 * time.Nanosecond},
	}
	got := ParseProfile(reply)
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		d := got[i].CPU - want[i].CPU
		if got[i].Function != want[i].Function || got[i].Caller != want[i].Caller || got[i].Calls != want[i].Calls || d < -time.Nanosecond || d > time.Nanosecond {
			t.Errorf("row %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestPrintOverheadMatrix(t *testing.T) {
	cfg := OverheadConfig{Duration: 12 * time.Second, Rounds: 3, Paths: []string{"plain", "ring", "spoe"}}
	rows := []MatrixRow{
		{VersionOf("HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/"),
			[]PathResult{{Path: "plain", HAProxyCPU: 10 * time.Microsecond}, {Path: "ring", HAProxyCPU: 11 * time.Microsecond}, {Path: "spoe", HAProxyCPU: 13 * time.Microsecond}}},
		{"3.2.26-1", []PathResult{{Path: "plain", HAProxyCPU: 10 * time.Microsecond}, {Path: "ring"}, {Path: "spoe", HAProxyCPU: 18 * time.Microsecond}}},
	}
	var b strings.Builder
	PrintOverheadMatrix(&b, cfg, rows)
	out := b.String()
	for _, w := range []string{"2.6.12-1+deb12u4  10.00  1.100x  1.300x", "3.2.26-1  10.00  -  1.800x", "ring  spoe"} {
		if !strings.Contains(strings.Join(strings.Fields(out), "  "), w) {
			t.Errorf("table lacks %q:\n%s", w, out)
		}
	}
}
