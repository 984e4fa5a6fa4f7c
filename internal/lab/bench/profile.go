package bench

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// ProfileRow is one line of HAProxy's `show profiling tasks`: a task or
// tasklet handler, who woke it (from 2.9 on HAProxy names the caller; ""
// before), and what it cost.
type ProfileRow struct {
	Function, Caller string
	Calls            uint64
	CPU              time.Duration // cpu_tot
}

// ParseProfile reads the "Tasks activity" table of `show profiling tasks`
// (2.6's columns, and 3.x's with the trailing "<- caller"). Lines it cannot
// read are skipped: the table is a diagnostic, not an interface.
func ParseProfile(reply string) []ProfileRow {
	var rows []ProfileRow
	for _, line := range strings.Split(reply, "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[0] == "function" {
			continue
		}
		calls, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		cpu, ok := parseProfileDur(f[2])
		if !ok {
			continue
		}
		r := ProfileRow{Function: f[0], Calls: calls, CPU: cpu}
		if i := slices.Index(f, "<-"); i >= 0 && i+1 < len(f) {
			r.Caller = f[i+1]
		}
		rows = append(rows, r)
	}
	return rows
}

// parseProfileDur reads HAProxy's durations: "108.1ms", "273.0ns",
// "1.001us", "5.018s", "-" for none.
func parseProfileDur(s string) (time.Duration, bool) {
	if s == "-" {
		return 0, true
	}
	for _, u := range []struct {
		suffix string
		unit   time.Duration
	}{{"ns", time.Nanosecond}, {"us", time.Microsecond}, {"ms", time.Millisecond}, {"s", time.Second}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil || x < 0 {
				return 0, false
			}
			return time.Duration(x * float64(u.unit)), true
		}
	}
	return 0, false
}

// PrintProfiles writes, for each path that was profiled, HAProxy's task
// handlers by CPU per response over the measured rounds, the top n.
func PrintProfiles(w io.Writer, res []PathResult, n int) {
	fmt.Fprintln(w, "\nHAProxy's task handlers (show profiling tasks, on for the measured rounds only; profiling adds its own cost to the table above):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tfunction\twoken by\tcalls/resp\tCPU µs/resp\t")
	for _, r := range res {
		if len(r.Profile) == 0 || r.Responses == 0 {
			continue
		}
		rows := slices.Clone(r.Profile)
		slices.SortStableFunc(rows, func(a, b ProfileRow) int { return int(b.CPU - a.CPU) })
		var total time.Duration
		for _, p := range rows {
			total += p.CPU
		}
		per := func(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e3/float64(r.Responses)) }
		for i, p := range rows {
			if i == n {
				break
			}
			caller := p.Caller
			if caller == "" {
				caller = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%s\t\n", r.Path, p.Function, caller, float64(p.Calls)/float64(r.Responses), per(p.CPU))
		}
		fmt.Fprintf(tw, "%s\t(all handlers)\t\t\t%s\t\n", r.Path, per(total))
	}
	tw.Flush()
}

// MatrixRow is one HAProxy's results in PrintOverheadMatrix.
type MatrixRow struct {
	HAProxy string // as `haproxy -v` names it
	Results []PathResult
}

// VersionOf is the version in `haproxy -v`'s first line ("HAProxy version
// 3.2.26-1 2026/10/14 - https://haproxy.org/" gives "3.2.26-1").
func VersionOf(line string) string {
	f := strings.Fields(line)
	for i, w := range f {
		if w == "version" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return line
}

// PrintOverheadMatrix writes one table of every HAProxy's runs: plain's
// CPU per response, and each path's as a ratio to its own HAProxy's plain.
func PrintOverheadMatrix(w io.Writer, cfg OverheadConfig, rows []MatrixRow) {
	fmt.Fprintf(w, "HAProxy CPU per response, x plain of the same HAProxy (%v per path in %d interleaved rounds, each HAProxy in turn):\n", cfg.Duration, cfg.Rounds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "HAProxy\tplain µs/resp\t")
	for _, p := range cfg.Paths[1:] {
		fmt.Fprintf(tw, "%s\t", p)
	}
	fmt.Fprintln(tw)
	for _, r := range rows {
		if len(r.Results) == 0 {
			continue
		}
		plain := r.Results[0].HAProxyCPU
		fmt.Fprintf(tw, "%s\t%.2f\t", r.HAProxy, float64(plain)/1e3)
		for _, p := range r.Results[1:] {
			if plain > 0 && p.HAProxyCPU > 0 {
				fmt.Fprintf(tw, "%.3fx\t", float64(p.HAProxyCPU)/float64(plain))
			} else {
				fmt.Fprint(tw, "-\t")
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}
