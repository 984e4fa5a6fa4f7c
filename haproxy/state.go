package haproxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"io"
	"slices"
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

// ShowServersState reads `show servers state` (every backend), parsing
// it row by row as it arrives, within MaxRows.
func (c *Client) ShowServersState(ctx context.Context) ([]ServerState, error) {
	var rows []ServerState
	err := c.streamShow(ctx, "show servers state", func(r *bufio.Reader) (err error) {
		rows, err = readServersState(ctx, r, c.maxRows())
		return err
	})
	return rows, err
}

func (c *Client) maxRows() int {
	if c.MaxRows <= 0 {
		return DefaultMaxRows
	}
	return c.MaxRows
}

// MaxLine bounds one line of a `show servers state` reply (a server's
// line is a few hundred bytes).
const MaxLine = 64 << 10

// lineReader reads r line by line, each at most MaxLine bytes, counting
// them for errors.
type lineReader struct {
	r *bufio.Reader
	n int // lines read
}

// next returns the next line without its newline; io.EOF once none is
// left. The line is valid until the next call.
func (lr *lineReader) next() ([]byte, error) {
	line, err := lr.r.ReadSlice('\n')
	switch {
	case err == bufio.ErrBufferFull || len(line) > MaxLine:
		return nil, fmt.Errorf("line %d: over %d bytes", lr.n+1, MaxLine)
	case err == io.EOF && len(line) == 0:
		return nil, io.EOF
	case err != nil && err != io.EOF:
		return nil, err
	}
	lr.n++
	return bytes.TrimSuffix(line, []byte("\n")), nil
}

func readServersState(ctx context.Context, r *bufio.Reader, maxRows int) ([]ServerState, error) {
	if r.Size() < MaxLine {
		r = bufio.NewReaderSize(r, MaxLine)
	}
	lr := &lineReader{r: r}
	var first [2][]byte // the version line, then the header
	for i := range first {
		line, err := lr.next()
		if err == io.EOF {
			return nil, fmt.Errorf("reply of %d lines, want a version and a header", lr.n)
		}
		if err != nil {
			return nil, err
		}
		first[i] = bytes.Clone(line)
	}
	version, hline := first[0], first[1]
	if v := strings.TrimSpace(string(version)); v != "1" {
		return nil, fmt.Errorf("unsupported format version %q", truncate(v))
	}
	if !bytes.HasPrefix(hline, []byte("# ")) {
		return nil, fmt.Errorf("no header line: %q", truncate(string(hline)))
	}
	cols := map[string]int{}
	header := strings.Fields(string(hline[2:]))
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
	f := make([]string, 0, len(header))
	for {
		line, err := lr.next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if len(out) >= maxRows {
			return nil, fmt.Errorf("%w: over %d", ErrTooManyRows, maxRows)
		}
		if len(out)%256 == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("line %d: %w", lr.n, ctx.Err())
		}
		// One string per line, its fields cut from it: the names kept
		// are cloned, so that no line outlives its row.
		f = appendFields(f[:0], string(line))
		if len(f) != len(header) {
			return nil, fmt.Errorf("line %d: %d fields, header has %d", lr.n, len(f), len(header))
		}
		get := func(n string) string { return f[cols[n]] }
		num := func(n string) (int, error) {
			v, err := strconv.Atoi(get(n))
			if err != nil {
				return 0, fmt.Errorf("line %d: %s: %w", lr.n, n, err)
			}
			return v, nil
		}
		s := ServerState{Backend: strings.Clone(get("be_name")), Server: strings.Clone(get("srv_name")), Addr: strings.Clone(get("srv_addr"))}
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
}

// appendFields appends the space-separated fields of s to dst, as
// strings.Fields does, without a new slice per line.
func appendFields(dst []string, s string) []string {
	for {
		s = strings.TrimLeft(s, " \t\r\v\f")
		if s == "" {
			return dst
		}
		i := strings.IndexAny(s, " \t\r\v\f")
		if i < 0 {
			return append(dst, s)
		}
		dst = append(dst, s[:i])
		s = s[i:]
	}
}

// statRows reads the CSV of `show stat` from r line by line as it
// arrives: the header row names the columns (their positions move
// between releases), given to columns once; then each row goes to row,
// its fields valid only during the call. More than maxRows rows, or
// ctx's end, stops the read.
func statRows(ctx context.Context, r *bufio.Reader, maxRows int, columns func(header []string), row func(header, rec []string)) error {
	if head, err := r.Peek(2); err != nil || string(head) != "# " {
		head, _ = r.Peek(200)
		return fmt.Errorf("no header row: %q", truncate(string(head)))
	}
	r.Discard(2)
	if r.Size() < MaxLine {
		r = bufio.NewReaderSize(r, MaxLine)
	}
	lr := &lineReader{r: r}
	line, err := lr.next()
	if err == io.EOF || err == nil && len(line) == 0 {
		return fmt.Errorf("empty header")
	}
	if err != nil {
		return err
	}
	header, err := splitCSV(nil, string(line))
	if err != nil {
		return fmt.Errorf("header: %w", err)
	}
	for len(header) > 0 && header[len(header)-1] == "" {
		header = header[:len(header)-1] // the header ends with a comma
	}
	if columns != nil {
		columns(header)
	}
	rec := make([]string, 0, len(header)+1)
	for n := 0; ; {
		line, err := lr.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if len(line) == 0 {
			continue
		}
		if n >= maxRows {
			return fmt.Errorf("%w: over %d", ErrTooManyRows, maxRows)
		}
		if n%256 == 0 && ctx.Err() != nil {
			return fmt.Errorf("row %d: %w", n+1, ctx.Err())
		}
		n++
		if rec, err = splitCSV(rec[:0], string(line)); err != nil {
			return fmt.Errorf("row %d: %w", n, err)
		}
		if len(rec) < len(header) {
			return fmt.Errorf("row %d: %d fields, header has %d", n, len(rec), len(header))
		}
		row(header, rec)
	}
}

// splitCSV appends the fields of one CSV line to dst. HAProxy quotes a
// field only when it must (a comma or a quote in it), so most lines
// split on commas; a line with a quote goes through encoding/csv.
func splitCSV(dst []string, line string) ([]string, error) {
	if !strings.Contains(line, `"`) {
		for {
			i := strings.IndexByte(line, ',')
			if i < 0 {
				return append(dst, line), nil
			}
			dst = append(dst, line[:i])
			line = line[i+1:]
		}
	}
	cr := csv.NewReader(strings.NewReader(line))
	cr.FieldsPerRecord = -1
	cr.LazyQuotes = true
	rec, err := cr.Read()
	if err == io.EOF {
		return dst, nil
	}
	return append(dst, rec...), err
}

// ServerStat is what the agent reads of one server's `show stat` row.
type ServerStat struct {
	Backend string `json:"backend"`
	Server  string `json:"server"`
	// MaxConn is the server's maxconn (slim); 0 when it has none.
	MaxConn int `json:"maxconn,omitempty"`
	// RespTimeMs is HAProxy's average response time over the server's last
	// requests (rtime; the manual says 1024, HAProxy slides it over 512,
	// TimeSamples): service time without the queue.
	RespTimeMs int `json:"resp_time_ms,omitempty"`
	// Backup is a backup server (bck): it takes traffic only when every
	// active server is down.
	Backup bool `json:"backup,omitempty"`
	// AgentCheck says HAProxy's agent-check runs on the server (its
	// agent_rise is set): the check may set its state and weight.
	AgentCheck bool `json:"agent_check,omitempty"`
	// Algo is its backend's balance algorithm as `show stat` names it
	// (roundrobin, leastconn, uri, source, hdr, hash, ...).
	Algo string `json:"algo,omitempty"`
	// TCP says the server's backend is not in mode http (tcp, or spop:
	// HAProxy 3.1+ turns the SPOE agents' backend into one): no HTTP
	// status to judge.
	TCP bool `json:"tcp,omitempty"`
	// Counters are the row's cumulative counters and gauges, for the
	// stats path (internal/ingest/counters.StatPoller).
	Counters StatCounters `json:"-"`
}

// notHTTP reads show stat's mode column: "" (an HAProxy without it)
// counts as http.
func notHTTP(mode string) bool { return mode != "" && mode != "http" }

// HashAlgos are the balance algorithms that send each server its own
// share of the requests (by URI, source, header, parameter, cookie or
// expression), so that servers see different request mixes.
var HashAlgos = []string{"uri", "source", "hdr", "url_param", "rdp-cookie", "hash"}

// Hashed reports whether the server's backend balances by a hash.
func (s ServerStat) Hashed() bool { return slices.Contains(HashAlgos, s.Algo) }

// setAlgos gives every server its backend's algorithm, from the BACKEND
// rows' (algo is empty on server rows).
func setAlgos(out []ServerStat, algos map[string]string) {
	for i := range out {
		out[i].Algo = algos[out[i].Backend]
	}
}

// StatCounters are the cumulative counters (since the process started or
// the last `clear counters`) and the gauges of one server's row.
type StatCounters struct {
	// ReqTot is HTTP requests the server answered; Hrsp its answers by
	// class: 1xx..5xx, then other. A retried attempt is in neither.
	ReqTot int64
	Hrsp   [6]int64
	// Wretr is attempts on this server HAProxy retried on it again, and
	// Wredis those it redispatched to another server. A failed connection
	// counts in one of the two (HAProxy 2.6 measured: with option
	// redispatch and roundrobin, in wredis alone); an answer retried by
	// retry-on (a 500) in wretr, and in wredis too when redispatched.
	Wretr, Wredis int64
	// Econ is requests whose last connection attempt failed (HAProxy then
	// answers 503 itself); Eresp response errors: HAProxy's own 504 on
	// timeout server, 502 on an answer that is not HTTP or a reset, and
	// SrvAbrt, the transfers the server aborted, which Eresp includes. On
	// HAProxy 2.6 none of them is in ReqTot or Hrsp.
	Econ, Eresp, SrvAbrt int64
	// Stot is the sessions HAProxy sent to the server: every attempt,
	// answered or not. Stot less ReqTot bounds the attempts that ended
	// without an answer, which no failure class may exceed
	// (docs/explanation/telemetry.md).
	Stot int64
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

// ServerStats reads `show stat` and returns its server rows, typed. The
// reply is parsed as it arrives, keeping only the columns the agent reads:
// a reply's size in memory is its servers', not its text's.
func (c *Client) ServerStats(ctx context.Context) ([]ServerStat, error) {
	var out []ServerStat
	err := c.streamShow(ctx, "show stat", func(r *bufio.Reader) (err error) {
		out, err = readServerStats(ctx, r, c.maxRows())
		return err
	})
	return out, err
}

// statColumns are the columns ServerStat reads.
var statColumns = append([]string{"pxname", "svname", "slim", "rtime", "req_tot", "wretr", "wredis", "econ", "eresp", "srv_abrt", "stot", "qtime", "ttime",
	"qtime_max", "rtime_max", "ttime_max", "scur", "qcur", "bck", "agent_rise", "algo", "mode"}, hrspColumns[:]...)

func readServerStats(ctx context.Context, r *bufio.Reader, maxRows int) ([]ServerStat, error) {
	var out []ServerStat
	algos := map[string]string{}
	idx := make(map[string]int, len(statColumns))
	err := statRows(ctx, r, maxRows, func(header []string) {
		for _, name := range statColumns {
			idx[name] = slices.Index(header, name) // -1: missing, reads as 0
		}
	}, func(_, rec []string) {
		get := func(col string) string {
			if i := idx[col]; i >= 0 {
				return rec[i]
			}
			return ""
		}
		num := func(col string) int64 {
			f := get(col)
			if f == "" {
				return 0 // an empty column is common: no parse, no error to allocate
			}
			v, _ := strconv.ParseInt(f, 10, 64)
			return v
		}
		sv := get("svname")
		if sv == "BACKEND" {
			algos[strings.Clone(get("pxname"))] = strings.Clone(get("algo"))
		}
		if sv == "BACKEND" || sv == "FRONTEND" {
			return
		}
		c := StatCounters{
			ReqTot: num("req_tot"), Wretr: num("wretr"), Wredis: num("wredis"),
			Econ: num("econ"), Eresp: num("eresp"), SrvAbrt: num("srv_abrt"), Stot: num("stot"),
			QTime: int(num("qtime")), TTime: int(num("ttime")),
			QTimeMax: int(num("qtime_max")), RTimeMax: int(num("rtime_max")), TTimeMax: int(num("ttime_max")),
			Scur: int(num("scur")), Qcur: int(num("qcur")),
		}
		for i, col := range hrspColumns {
			c.Hrsp[i] = num(col)
		}
		if len(out) == cap(out) {
			out = slices.Grow(out, len(out)) // doubling: append's 1.25 on a big slice copies it many times over
		}
		out = append(out, ServerStat{Backend: strings.Clone(get("pxname")), Server: strings.Clone(sv), MaxConn: int(num("slim")),
			RespTimeMs: int(num("rtime")), Backup: get("bck") == "1", AgentCheck: get("agent_rise") != "", TCP: notHTTP(get("mode")), Counters: c})
	})
	if err != nil {
		return nil, err
	}
	setAlgos(out, algos)
	return out, nil
}

// Info is the part of `show info` that identifies a running HAProxy.
type Info struct {
	Version   string `json:"version"`
	Pid       int    `json:"pid"`
	StartTime int64  `json:"start_time_sec"`
	// Node is the process's node name (global's `node`, the host's name
	// by default): it outlives reloads and restarts.
	Node string `json:"node,omitempty"`
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
	info, err := parseInfo(reply)
	if err != nil {
		return Info{}, fmt.Errorf("haproxy: %s: %w", cmd, err)
	}
	return info, nil
}

// parseInfo parses `show info`'s "Name: value" lines.
func parseInfo(reply string) (Info, error) {
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
		case "node":
			info.Node = value
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
