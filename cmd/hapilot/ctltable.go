package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hapilot/hapilot/agent"
	"github.com/hapilot/hapilot/agent/loop"
	"github.com/hapilot/hapilot/cmd/hapilot/ctl"
	"github.com/hapilot/hapilot/cmd/hapilot/daemon"
)

// Output formats of `hapilot ctl`: tables for a person, as kubectl and
// cscli print them, JSON for scripts.
const (
	outputTable = "table"
	outputJSON  = "json"
)

// takeOutput removes -o/--output FORMAT from anywhere in args (before or
// after the command, as kubectl takes it) and returns the format.
func takeOutput(args []string) (rest []string, format string, err error) {
	format = outputTable
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(a, "=")
		if name != "-o" && name != "--output" && name != "-output" {
			rest = append(rest, a)
			continue
		}
		if !hasValue {
			if i+1 >= len(args) {
				return nil, "", fmt.Errorf("%s needs a format: %s or %s", name, outputTable, outputJSON)
			}
			i++
			value = args[i]
		}
		switch value {
		case outputTable, outputJSON:
			format = value
		default:
			return nil, "", fmt.Errorf("%s %q: want %s or %s", name, value, outputTable, outputJSON)
		}
	}
	return rest, format, nil
}

// printJSON is -o json: the message, then the result as indented JSON.
func printJSON(w io.Writer, ans ctl.Answer) {
	if ans.Message != "" {
		fmt.Fprintln(w, ans.Message)
	}
	if len(ans.Result) > 0 && string(ans.Result) != "null" {
		var v any
		if err := json.Unmarshal(ans.Result, &v); err == nil {
			b, _ := json.MarshalIndent(v, "", "  ")
			fmt.Fprintln(w, string(b))
		}
	}
}

// printTable is the default: the message, then the result as tables.
// A result it cannot read as its command's is printed as JSON.
func printTable(w io.Writer, cmd ctl.Command, ans ctl.Answer) {
	if ans.Message != "" {
		fmt.Fprintln(w, ans.Message)
	}
	if len(ans.Result) == 0 || string(ans.Result) == "null" {
		return
	}
	var err error
	switch cmd {
	case ctl.Status:
		var st daemon.CtlStatus
		if err = json.Unmarshal(ans.Result, &st); err == nil {
			statusTable(w, st)
		}
	case ctl.List:
		var hs []loop.Holding
		if err = json.Unmarshal(ans.Result, &hs); err == nil {
			holdingTable(w, hs)
		}
	case ctl.Explain:
		var e loop.Explanation
		if err = json.Unmarshal(ans.Result, &e); err == nil {
			explainTable(w, e)
		}
	case ctl.Restore:
		var rs []loop.Released
		if err = json.Unmarshal(ans.Result, &rs); err == nil {
			releasedTable(w, rs)
		}
	case ctl.Release:
		var r loop.Released
		if err = json.Unmarshal(ans.Result, &r); err == nil && r.Server.Server != "" {
			releasedTable(w, []loop.Released{r})
		}
	case ctl.Pause, ctl.Resume:
		// The message says it all.
	default:
		err = fmt.Errorf("no table for %q", cmd)
	}
	if err != nil {
		printJSON(w, ctl.Answer{Result: ans.Result})
	}
}

// table writes rows under a header, columns aligned.
func table(w io.Writer, header []string, rows [][]string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	_ = tw.Flush()
}

// when prints a time for a table: "-" for none.
func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func statusTable(w io.Writer, st daemon.CtlStatus) {
	kv := [][]string{
		{"mode", string(st.Mode)},
		{"policy", st.Policy},
		{"interval", st.Interval},
		{"cycle", strconv.FormatUint(st.Cycle, 10)},
		{"last step", when(st.Observed)},
	}
	if sf := st.StateFile; sf != nil {
		saved := "saved"
		if !sf.Saved {
			saved = "UNSAVED since " + when(sf.UnsavedSince) + ": " + sf.Error
		}
		kv = append(kv, []string{"state file", orDash(sf.File) + " (" + saved + ")"})
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range kv {
		fmt.Fprintf(tw, "%s:\t%s\n", r[0], r[1])
	}
	_ = tw.Flush()

	fmt.Fprintln(w)
	if len(st.Pauses) == 0 {
		fmt.Fprintln(w, "PAUSES: none")
	} else {
		var rows [][]string
		for _, p := range st.Pauses {
			rows = append(rows, []string{p.Backend, when(p.Since), when(p.Until), orDash(p.By)})
		}
		table(w, []string{"PAUSED BACKEND", "SINCE", "UNTIL", "BY"}, rows)
	}
	fmt.Fprintln(w)
	holdingTable(w, st.Holding)
	fmt.Fprintln(w)
	var rows [][]string
	for _, b := range st.Backends {
		scope := "yes"
		if !b.InScope {
			scope = "no"
		}
		minServing := "-"
		if b.MinServing > 0 {
			minServing = strconv.Itoa(b.MinServing)
		}
		drains := strconv.Itoa(b.Drains)
		if b.Rates != nil {
			drains = fmt.Sprintf("%d of %d", b.Rates.Used, b.Rates.PerHour)
		}
		rows = append(rows, []string{b.Backend, scope, string(b.Action), minServing, orDash(b.MaxDrained), drains, orDash(b.Blocks)})
	}
	table(w, []string{"BACKEND", "IN SCOPE", "ACTION", "MIN SERVING", "MAX DRAINED", "DRAINS/HOUR", "BLOCKS"}, rows)
	fmt.Fprintln(w)
	if len(st.Inventory) == 0 {
		fmt.Fprintln(w, "FOUND HELD AT START: none")
		return
	}
	rows = nil
	for _, h := range st.Inventory {
		rows = append(rows, []string{h.Server.String(), h.State, strconv.Itoa(h.Weight), string(h.Holder), when(h.Since), orDash(h.Reason)})
	}
	table(w, []string{"FOUND HELD AT START", "STATE", "WEIGHT", "HOLDER", "SINCE", "REASON"}, rows)
}

func holdingTable(w io.Writer, hs []loop.Holding) {
	if len(hs) == 0 {
		fmt.Fprintln(w, "HELD BY THE AGENT: none")
		return
	}
	var rows [][]string
	for _, h := range hs {
		weight := "-"
		if h.Weight > 0 {
			weight = strconv.Itoa(h.Weight)
		}
		rows = append(rows, []string{h.Server.String(), string(h.Phase), weight, when(h.At), orDash(h.Reason)})
	}
	table(w, []string{"HELD BY THE AGENT", "PHASE", "WEIGHT", "SINCE", "REASON"}, rows)
}

func explainTable(w io.Writer, e loop.Explanation) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "server:\t%s\n", e.Server)
	fmt.Fprintf(tw, "mode:\t%s\n", e.Mode)
	if v := e.View; v != nil {
		fmt.Fprintf(tw, "state:\t%s, weight %d of %d; owner %s\n", v.State.Label(), v.State.Weight, v.State.Initial, v.Owner)
		fmt.Fprintf(tw, "window:\t%d requests, %d 5xx, p99 %d ms\n", v.Window.Requests, v.Window.Err5xx, v.Window.P99Ms)
		fmt.Fprintf(tw, "recent:\t%d requests, %d 5xx, p99 %d ms\n", v.Recent.Requests, v.Recent.Err5xx, v.Recent.P99Ms)
		if !v.NoDrainUntil.IsZero() {
			fmt.Fprintf(tw, "no drain until:\t%s\n", when(v.NoDrainUntil))
		}
		if !v.OperatorUntil.IsZero() {
			fmt.Fprintf(tw, "operator's until:\t%s\n", when(v.OperatorUntil))
		}
	}
	fmt.Fprintf(tw, "backend:\t%d of %d serving\n", e.Serving, e.Servers)
	fmt.Fprintf(tw, "found by the test now:\t%v\n", e.Candidate)
	if c := e.Change; c != nil {
		fmt.Fprintf(tw, "agent's change:\t%s since %s: %s\n", c.Phase, when(c.At), orDash(c.Reason))
	}
	if p := e.Paused; p != nil {
		fmt.Fprintf(tw, "paused:\t%s\n", p.Why())
	}
	if p := e.Probe; p != nil {
		fmt.Fprintf(tw, "probe:\tnext %s, %d failed burst(s), %d drain(s)\n", when(p.Next), p.FailedBursts, p.Drains)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	if len(e.Decisions) == 0 {
		fmt.Fprintln(w, "DECISIONS: none recent")
		return
	}
	var rows [][]string
	for _, d := range e.Decisions {
		a := d.Proposed
		action := string(a.Kind)
		if a.Weight > 0 {
			action += " " + strconv.Itoa(a.Weight)
		}
		why := a.Reason
		switch {
		case d.Outcome == agent.OutcomeRefused:
			why = string(d.Code) + ": " + d.Reason
		case d.Would != "":
			why = d.Would + ": " + a.Reason
		case d.Error != "":
			why = d.Error
		}
		rows = append(rows, []string{when(d.Time), strconv.FormatUint(d.Cycle, 10), action, orDash(string(d.Outcome)), orDash(why)})
	}
	table(w, []string{"DECISION AT", "CYCLE", "ACTION", "OUTCOME", "WHY"}, rows)
}

func releasedTable(w io.Writer, rs []loop.Released) {
	if len(rs) == 0 {
		return
	}
	var rows [][]string
	for _, r := range rs {
		result := "back until " + when(r.Until) + " the operator's"
		if r.Error != "" {
			result = r.Error
		}
		rows = append(rows, []string{r.Server.String(), fmt.Sprintf("%s since %s", r.Was.Phase, when(r.Was.At)), result})
	}
	table(w, []string{"SERVER", "WAS", "NOW"}, rows)
}
