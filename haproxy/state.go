package haproxy

import (
	"context"
	"encoding/csv"
	"fmt"
	"strconv"
	"strings"
)

// Admin state bits of `show servers state` (srv_admin_state).
const (
	AdminForcedMaint    = 0x01
	AdminInheritedMaint = 0x02
	AdminConfigMaint    = 0x04
	AdminForcedDrain    = 0x08
	AdminInheritedDrain = 0x10
	AdminDNSMaint       = 0x20
	AdminHostnameMaint  = 0x40
)

// Operational states (srv_op_state).
const (
	OpStopped  = 0
	OpStarting = 1
	OpRunning  = 2
	OpStopping = 3
)

// ServerState is one row of `show servers state`.
type ServerState struct {
	Backend    string `json:"backend"`
	Server     string `json:"server"`
	Addr       string `json:"addr"`
	Port       int    `json:"port"`
	OpState    int    `json:"op_state"`
	AdminState int    `json:"admin_state"`
	Weight     int    `json:"weight"`         // srv_uweight: current
	Initial    int    `json:"initial_weight"` // srv_iweight: from the config
	UseSSL     bool   `json:"use_ssl"`
}

// Maint reports any maintenance bit; Drain any drain bit.
func (s ServerState) Maint() bool {
	return s.AdminState&(AdminForcedMaint|AdminInheritedMaint|AdminConfigMaint|AdminDNSMaint|AdminHostnameMaint) != 0
}
func (s ServerState) Drain() bool {
	return s.AdminState&(AdminForcedDrain|AdminInheritedDrain) != 0
}

// Serving reports whether the server takes new traffic: up, neither in
// maintenance nor drained, weight above zero.
func (s ServerState) Serving() bool {
	return (s.OpState == OpRunning || s.OpState == OpStarting) && !s.Maint() && !s.Drain() && s.Weight > 0
}

// Label names the admin state for people and prompts.
func (s ServerState) Label() string {
	switch {
	case s.Maint():
		return "maint"
	case s.Drain():
		return "drain"
	case s.OpState == OpStopped:
		return "down"
	case s.Weight == 0:
		return "weight0"
	}
	return "ready"
}

// ShowServersState reads `show servers state` (every backend).
func (c *Client) ShowServersState(ctx context.Context) ([]ServerState, error) {
	const cmd = "show servers state"
	reply, err := c.runShow(ctx, cmd)
	if err != nil {
		return nil, err
	}
	rows, err := ParseServersState(reply)
	if err != nil {
		return nil, fmt.Errorf("haproxy: %s: %w", cmd, err)
	}
	return rows, nil
}

// ParseServersState parses the reply of `show servers state`: a format
// version line (only version 1 exists), a "# " header naming the columns,
// then one space-separated line per server.
func ParseServersState(reply string) ([]ServerState, error) {
	lines := strings.Split(strings.TrimRight(reply, "\n"), "\n")
	if len(lines) < 2 {
		return nil, fmt.Errorf("reply of %d lines, want a version and a header", len(lines))
	}
	if v := strings.TrimSpace(lines[0]); v != "1" {
		return nil, fmt.Errorf("unsupported format version %q", truncate(v))
	}
	if !strings.HasPrefix(lines[1], "# ") {
		return nil, fmt.Errorf("no header line: %q", truncate(lines[1]))
	}
	cols := map[string]int{}
	header := strings.Fields(lines[1][2:])
	for i, name := range header {
		if _, dup := cols[name]; dup {
			return nil, fmt.Errorf("header names %s twice", truncate(name))
		}
		cols[name] = i
	}
	need := []string{"be_name", "srv_name", "srv_addr", "srv_op_state", "srv_admin_state", "srv_uweight", "srv_iweight", "srv_port"}
	for _, n := range need {
		if _, ok := cols[n]; !ok {
			return nil, fmt.Errorf("header lacks %s", n)
		}
	}
	var out []ServerState
	for i, line := range lines[2:] {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := strings.Fields(line)
		if len(f) != len(header) {
			return nil, fmt.Errorf("line %d: %d fields, header has %d", i+3, len(f), len(header))
		}
		get := func(n string) string { return f[cols[n]] }
		num := func(n string) (int, error) {
			v, err := strconv.Atoi(get(n))
			if err != nil {
				return 0, fmt.Errorf("line %d: %s: %w", i+3, n, err)
			}
			return v, nil
		}
		s := ServerState{Backend: get("be_name"), Server: get("srv_name"), Addr: get("srv_addr")}
		var err error
		for _, p := range []struct {
			name string
			dst  *int
		}{{"srv_op_state", &s.OpState}, {"srv_admin_state", &s.AdminState}, {"srv_uweight", &s.Weight}, {"srv_iweight", &s.Initial}, {"srv_port", &s.Port}} {
			if *p.dst, err = num(p.name); err != nil {
				return nil, err
			}
		}
		if idx, ok := cols["srv_use_ssl"]; ok {
			s.UseSSL = f[idx] == "1"
		}
		// HAProxy's weights are 0..256: a number past that comes from
		// something else, and bounds every loop over weights downstream.
		s.Weight, s.Initial = min(max(s.Weight, 0), MaxWeight), min(max(s.Initial, 0), MaxWeight)
		s.Port = min(max(s.Port, 0), 65535)
		out = append(out, s)
	}
	return out, nil
}

// StatRow is one line of `show stat`, keyed by the header's column names.
type StatRow map[string]string

// Int reads a numeric column; empty or missing reads as 0.
func (r StatRow) Int(col string) int64 {
	v, _ := strconv.ParseInt(r[col], 10, 64)
	return v
}

// ShowStat reads `show stat` and parses it by its header row, since
// column positions move between HAProxy releases.
func (c *Client) ShowStat(ctx context.Context) ([]StatRow, error) {
	const cmd = "show stat"
	reply, err := c.runShow(ctx, cmd)
	if err != nil {
		return nil, err
	}
	rows, err := ParseStat(reply)
	if err != nil {
		return nil, fmt.Errorf("haproxy: %s: %w", cmd, err)
	}
	return rows, nil
}

// ParseStat parses the CSV of `show stat`.
func ParseStat(reply string) ([]StatRow, error) {
	body, ok := strings.CutPrefix(reply, "# ")
	if !ok {
		return nil, fmt.Errorf("no header row: %q", truncate(reply))
	}
	r := csv.NewReader(strings.NewReader(body))
	r.FieldsPerRecord = -1
	r.LazyQuotes = true
	recs, err := r.ReadAll()
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("empty header")
	}
	header := recs[0]
	for len(header) > 0 && header[len(header)-1] == "" {
		header = header[:len(header)-1] // the header ends with a comma
	}
	var out []StatRow
	for i, rec := range recs[1:] {
		if len(rec) < len(header) {
			return nil, fmt.Errorf("row %d: %d fields, header has %d", i+1, len(rec), len(header))
		}
		row := make(StatRow, len(header))
		for j, name := range header {
			row[name] = rec[j]
		}
		out = append(out, row)
	}
	return out, nil
}

// ServerStat is what the agent reads of one server's `show stat` row.
type ServerStat struct {
	Backend string `json:"backend"`
	Server  string `json:"server"`
	// MaxConn is the server's maxconn (slim); 0 when it has none.
	MaxConn int `json:"maxconn,omitempty"`
	// RespTimeMs is HAProxy's average response time over the server's last
	// 1024 requests (rtime): service time without the queue.
	RespTimeMs int `json:"resp_time_ms,omitempty"`
	// Counters are the row's cumulative counters and gauges, for the
	// stats path (internal/ingest.StatPoller).
	Counters StatCounters `json:"-"`
}

// StatCounters are the cumulative counters (since the process started or
// the last `clear counters`) and the gauges of one server's row.
type StatCounters struct {
	// ReqTot is HTTP requests the server answered; Hrsp its answers by
	// class: 1xx..5xx, then other. A retried attempt is in neither.
	ReqTot int64
	Hrsp   [6]int64
	// Wretr is retries away from this server (connection failures, and
	// with retry-on, answers such as a 500 that HAProxy did not pass on);
	// Wredis is those of them redispatched to another server.
	Wretr, Wredis int64
	// Averages over the last 1024 requests, in ms: queue and total session
	// (the response time, rtime, is ServerStat.RespTimeMs); and the three
	// maxima since start.
	QTime, TTime                 int
	QTimeMax, RTimeMax, TTimeMax int
	// Scur and Qcur are current sessions and queued requests.
	Scur, Qcur int
}

// hrspColumns are the answer classes in StatCounters.Hrsp order.
var hrspColumns = [6]string{"hrsp_1xx", "hrsp_2xx", "hrsp_3xx", "hrsp_4xx", "hrsp_5xx", "hrsp_other"}

// ServerStats keeps the server rows of a `show stat` reply (not the
// BACKEND and FRONTEND summaries), typed.
func ServerStats(rows []StatRow) []ServerStat {
	out := make([]ServerStat, 0, len(rows))
	for _, r := range rows {
		if r["svname"] == "BACKEND" || r["svname"] == "FRONTEND" {
			continue
		}
		c := StatCounters{
			ReqTot: r.Int("req_tot"), Wretr: r.Int("wretr"), Wredis: r.Int("wredis"),
			QTime: int(r.Int("qtime")), TTime: int(r.Int("ttime")),
			QTimeMax: int(r.Int("qtime_max")), RTimeMax: int(r.Int("rtime_max")), TTimeMax: int(r.Int("ttime_max")),
			Scur: int(r.Int("scur")), Qcur: int(r.Int("qcur")),
		}
		for i, col := range hrspColumns {
			c.Hrsp[i] = r.Int(col)
		}
		out = append(out, ServerStat{Backend: r["pxname"], Server: r["svname"], MaxConn: int(r.Int("slim")), RespTimeMs: int(r.Int("rtime")), Counters: c})
	}
	return out
}

// ServerStats reads `show stat` and returns its server rows, typed.
func (c *Client) ServerStats(ctx context.Context) ([]ServerStat, error) {
	rows, err := c.ShowStat(ctx)
	if err != nil {
		return nil, err
	}
	return ServerStats(rows), nil
}

// Info is the part of `show info` that identifies a running HAProxy.
type Info struct {
	Version   string `json:"version"`
	Pid       int    `json:"pid"`
	StartTime int64  `json:"start_time_sec"`
}

// Instance names this HAProxy process: a reload or restart gives a new
// one, and with it a server table back at its configured state.
func (i Info) Instance() string { return fmt.Sprintf("%d@%d", i.Pid, i.StartTime) }

// ShowInfo reads `show info`.
func (c *Client) ShowInfo(ctx context.Context) (Info, error) {
	const cmd = "show info"
	reply, err := c.runShow(ctx, cmd)
	if err != nil {
		return Info{}, err
	}
	info, err := ParseInfo(reply)
	if err != nil {
		return Info{}, fmt.Errorf("haproxy: %s: %w", cmd, err)
	}
	return info, nil
}

// ParseInfo parses `show info`'s "Name: value" lines.
func ParseInfo(reply string) (Info, error) {
	var info Info
	var havePid, haveStart bool
	for _, line := range strings.Split(reply, "\n") {
		name, value, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		var err error
		switch name {
		case "Version":
			info.Version = value
		case "Pid":
			info.Pid, err = strconv.Atoi(value)
			havePid = err == nil
		case "Start_time_sec":
			info.StartTime, err = strconv.ParseInt(value, 10, 64)
			haveStart = err == nil
		}
		if err != nil {
			return Info{}, fmt.Errorf("%s: %w", name, err)
		}
	}
	if !havePid || !haveStart {
		return Info{}, fmt.Errorf("no Pid or Start_time_sec in %q", truncate(reply))
	}
	return info, nil
}
