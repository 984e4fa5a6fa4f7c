package daemon

import (
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hapilot/hapilot/internal/lib/promtext"
)

// Version is the agent's version, for build_info and the event log; the
// command sets it from its build.
var Version = "dev"

// started is when the process started, for process_start_time_seconds.
var started = time.Now()

// writeProcessMetrics writes build_info and the process metrics every Go
// exporter has (the names client_golang's process collector uses), read
// from the kernel: CPU time, resident memory, open files, start time.
func writeProcessMetrics(w io.Writer) {
	promtext.Family(w, "hapilot_build_info", "gauge", "The agent's version and Go version; always 1.",
		[]promtext.Sample{{Labels: []string{"version", Version, "goversion", runtime.Version()}, Value: 1}})
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		cpu := float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
		promtext.Counter(w, "process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", cpu)
	}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			if pages, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				promtext.Gauge(w, "process_resident_memory_bytes", "Resident memory size in bytes.", pages*int64(os.Getpagesize()))
			}
		}
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		promtext.Gauge(w, "process_open_fds", "Number of open file descriptors.", len(fds))
	}
	promtext.Gauge(w, "process_start_time_seconds", "Start time of the process since unix epoch in seconds.", float64(started.UnixNano())/1e9)
	promtext.Gauge(w, "go_goroutines", "Number of goroutines that currently exist.", runtime.NumGoroutine())
}
