// Package fakesocket serves HAProxy's runtime API on a unix socket in
// front of a simulated fleet: B backends of S servers, each answering
// Poisson traffic and failing at its own healthy 5xx rate, so that the
// real agent (`hapilot run` on the counters path) can be run for as long
// as a test likes on a fleet no real HAProxy and backends could hold on a
// small machine.
//
// It answers what the agent sends, in HAProxy 2.6's words (the replies
// were captured from Debian's 2.6.12 and the column names are checked
// against a live one in this package's tests): `show cli level`, `show
// info`, `show stat` (the cumulative counters stot, req_tot, hrsp_*,
// lbtot), `show servers state` (format 1), `set server B/S state
// ready|drain|maint`, `set weight B/S N` and `get weight B/S`, each
// behind the client's "set severity-output number; " prefix. A drained,
// maint or weight-0 server gets no new traffic: its backend's load is
// shared by weight among the servers still serving. Every command is
// recorded.
//
// It is part of the lab: the agent never links it.
package fakesocket

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config is the simulated fleet.
type Config struct {
	// Backends and Servers per backend; backends are named be00, be01,
	// ..., servers s0, s1, ...
	Backends, Servers int
	// Rate is each server's mean requests per second while every server
	// of its backend serves: the backend's load is Rate×Servers, shared
	// by weight among those serving.
	Rate float64
	// Median is the fleet's median healthy 5xx rate (0.002 is 0.2%);
	// each server fails at Median×e^(Sigma×z), z standard normal, drawn
	// once from Seed.
	Median, Sigma float64
	Seed          uint64
	// Fault, when set, makes one server per backend (drawn from Seed)
	// fail at Fault.Rate from Fault.From after the start.
	Fault *Fault
	// Weight is every server's configured weight (default 10).
	Weight int
	// Addr and Port are every server's address in `show servers state`,
	// where the agent sends its readmission probes (default 127.0.0.1:9,
	// the discard port, closed on most machines: probes fail).
	Addr string
	Port int
	// Tick is the simulation's step (default 100 ms); RespMs the
	// average response time `show stat` prints (rtime, default 9).
	Tick   time.Duration
	RespMs int
}

// Fault is a server that fails at Rate from From after the start.
type Fault struct {
	Rate float64
	From time.Duration
}

// Command is one command the socket received.
type Command struct {
	At   time.Time
	Text string
}

// server is one simulated server and its cumulative counters.
type server struct {
	backend, name string
	id            int
	healthyRate   float64 // its own healthy 5xx rate
	faulty        bool
	admin         int // srv_admin_state bits: 0x01 forced maint, 0x08 forced drain
	weight        int // srv_uweight
	changed       time.Time
	stot, hrsp2xx int64
	hrsp5xx       int64
}

func (s *server) serving() bool { return s.admin == 0 && s.weight > 0 }

// Server is a running fake runtime socket.
type Server struct {
	cfg   Config
	path  string
	ln    net.Listener
	start time.Time
	pid   int

	mu       sync.Mutex
	servers  []*server // backend-major
	index    map[string]*server
	commands []Command
	last     time.Time
	rng      *rand.Rand

	stop chan struct{}
	wg   sync.WaitGroup // the simulation and every connection
}

// Start listens on path and starts the simulation; Close stops both.
func Start(path string, cfg Config) (*Server, error) {
	if cfg.Backends <= 0 || cfg.Servers <= 0 || cfg.Rate <= 0 || cfg.Median < 0 || cfg.Median >= 1 || cfg.Sigma < 0 {
		return nil, fmt.Errorf("fakesocket: config %+v: want backends, servers and rate above 0, median in [0, 1), sigma not negative", cfg)
	}
	if cfg.Fault != nil && (cfg.Fault.Rate < 0 || cfg.Fault.Rate > 1) {
		return nil, fmt.Errorf("fakesocket: fault rate %v outside [0, 1]", cfg.Fault.Rate)
	}
	if cfg.Weight == 0 {
		cfg.Weight = 10
	}
	if cfg.Addr == "" {
		cfg.Addr, cfg.Port = "127.0.0.1", 9
	}
	if cfg.Tick == 0 {
		cfg.Tick = 100 * time.Millisecond
	}
	if cfg.RespMs == 0 {
		cfg.RespMs = 9
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("fakesocket: %w", err)
	}
	now := time.Now()
	f := &Server{cfg: cfg, path: path, ln: ln, start: now, last: now, pid: 40000 + os.Getpid()%20000,
		index: map[string]*server{}, stop: make(chan struct{}),
		// The fleet's draws and its traffic come from the seed; the
		// traffic's exact counts also depend on when the ticks fall.
		rng: rand.New(rand.NewPCG(cfg.Seed, 0x6861706c6f74))}
	// The faulty servers come from a stream of their own, so that a
	// fleet with a fault has the same healthy rates as one without.
	faults := rand.New(rand.NewPCG(cfg.Seed, 0x6661756c74))
	for b := range cfg.Backends {
		faulty := -1
		if cfg.Fault != nil {
			faulty = faults.IntN(cfg.Servers)
		}
		for i := range cfg.Servers {
			s := &server{backend: BackendName(b), name: ServerName(i), id: i + 1, weight: cfg.Weight, changed: now,
				healthyRate: min(cfg.Median*math.Exp(cfg.Sigma*f.rng.NormFloat64()), 1), faulty: i == faulty}
			f.servers = append(f.servers, s)
			f.index[s.backend+"/"+s.name] = s
		}
	}
	f.wg.Add(2)
	go f.simulate()
	go f.accept()
	return f, nil
}

// BackendName and ServerName are the names the fake gives its b-th
// backend and i-th server.
func BackendName(b int) string { return fmt.Sprintf("be%02d", b) }
func ServerName(i int) string  { return "s" + strconv.Itoa(i) }

// Started is when the simulation began: a Fault's From counts from it.
func (f *Server) Started() time.Time { return f.start }

// Path is the socket's path.
func (f *Server) Path() string { return f.path }

// Close stops the socket and the simulation and waits for both.
func (f *Server) Close() error {
	err := f.ln.Close()
	close(f.stop)
	f.wg.Wait()
	os.Remove(f.path)
	return err
}

// Truth is what the fake knows of one server: its healthy rate, whether
// it is the faulty one, and its traffic so far.
type Truth struct {
	Backend, Server string
	HealthyRate     float64
	Faulty          bool
	Requests, Fails int64
	// State is its admin state now: ready, drain, maint or weight0.
	State string
}

// Truths lists every server, backend-major.
func (f *Server) Truths() []Truth {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Truth, 0, len(f.servers))
	for _, s := range f.servers {
		st := "ready"
		switch {
		case s.admin&0x01 != 0:
			st = "maint"
		case s.admin&0x08 != 0:
			st = "drain"
		case s.weight == 0:
			st = "weight0"
		}
		out = append(out, Truth{Backend: s.backend, Server: s.name, HealthyRate: s.healthyRate, Faulty: s.faulty,
			Requests: s.stot, Fails: s.hrsp5xx, State: st})
	}
	return out
}

// Commands returns every command received so far, without the
// severity prefix, in order.
func (f *Server) Commands() []Command {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Command(nil), f.commands...)
}

// simulate advances the fleet every Tick until Close.
func (f *Server) simulate() {
	defer f.wg.Done()
	t := time.NewTicker(f.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case now := <-t.C:
			f.advance(now)
		}
	}
}

// advance adds the traffic of the time since the last step: each serving
// server answers Poisson(its share × elapsed) requests, each a 5xx with
// its rate. The elapsed time is the clock's, so that a busy machine's
// late tick still gives the configured rate.
func (f *Server) advance(now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dt := now.Sub(f.last).Seconds()
	if dt <= 0 {
		return
	}
	f.last = now
	faultOn := f.cfg.Fault != nil && now.Sub(f.start) >= f.cfg.Fault.From
	for b := 0; b < len(f.servers); b += f.cfg.Servers {
		be := f.servers[b : b+f.cfg.Servers]
		total := 0
		for _, s := range be {
			if s.serving() {
				total += s.weight
			}
		}
		if total == 0 {
			continue
		}
		load := f.cfg.Rate * float64(f.cfg.Servers) * dt
		for _, s := range be {
			if !s.serving() {
				continue
			}
			p := s.healthyRate
			if s.faulty && faultOn {
				p = f.cfg.Fault.Rate
			}
			n := f.poisson(load * float64(s.weight) / float64(total))
			var fails int64
			for range n {
				if f.rng.Float64() < p {
					fails++
				}
			}
			s.stot += n
			s.hrsp5xx += fails
			s.hrsp2xx += n - fails
		}
	}
}

// poisson draws a Poisson count of mean m by counting exponential gaps:
// exact, and its cost is the count itself.
func (f *Server) poisson(m float64) int64 {
	var n int64
	for t := f.rng.ExpFloat64(); t < m; t += f.rng.ExpFloat64() {
		n++
	}
	return n
}

// MaxLine bounds a command line: HAProxy's own buffer is 16 KiB.
const MaxLine = 16 << 10

func (f *Server) accept() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			f.serve(c)
		}()
	}
}

// serve answers one connection in non-interactive mode, as HAProxy does:
// one line of commands separated by ";", each answered with its output
// and an empty line, then the connection is closed.
func (f *Server) serve(c net.Conn) {
	r := bufio.NewReaderSize(c, MaxLine)
	line, err := r.ReadSlice('\n')
	if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
		return // a line past MaxLine, or nothing: closed unanswered
	}
	var out strings.Builder
	severity := false
	for cmd := range strings.SplitSeq(strings.TrimRight(string(line), "\r\n"), ";") {
		cmd = strings.TrimSpace(cmd)
		if cmd == "" {
			continue
		}
		if cmd == "set severity-output number" {
			severity = true
			out.WriteString("\n")
			continue
		}
		f.mu.Lock()
		f.commands = append(f.commands, Command{At: time.Now(), Text: cmd})
		f.mu.Unlock()
		reply, sev := f.run(cmd)
		if sev > 0 && severity {
			reply = "[" + strconv.Itoa(sev) + "]: " + reply
		}
		out.WriteString(reply)
		out.WriteString("\n")
	}
	c.Write([]byte(out.String()))
}

// run answers one command with its output and, for a message, its
// severity (HAProxy's: 3 an error, 6 information); 0 for data.
func (f *Server) run(cmd string) (string, int) {
	fields := strings.Fields(cmd)
	switch {
	case cmd == "show cli level":
		return "admin\n", 6
	case cmd == "show info":
		return f.showInfo(), 0
	case cmd == "show stat":
		return f.showStat(), 0
	case cmd == "show servers state":
		return f.showServersState(), 0
	case len(fields) == 5 && fields[0] == "set" && fields[1] == "server" && fields[3] == "state":
		return f.setState(fields[2], fields[4])
	case len(fields) == 4 && fields[0] == "set" && fields[1] == "weight":
		return f.setWeight(fields[2], fields[3])
	case len(fields) == 3 && fields[0] == "get" && fields[1] == "weight":
		return f.getWeight(fields[2])
	}
	return "Unknown command.\n", 3
}

// lookup finds B/S, answering as HAProxy does when either is unknown.
func (f *Server) lookup(target string) (*server, string) {
	be, sv, ok := strings.Cut(target, "/")
	if !ok {
		return nil, "Require 'backend/server'.\n"
	}
	if s := f.index[be+"/"+sv]; s != nil {
		return s, ""
	}
	for _, s := range f.servers {
		if s.backend == be {
			return nil, "No such server.\n"
		}
	}
	return nil, "No such backend.\n"
}

func (f *Server) setState(target, state string) (string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, msg := f.lookup(target)
	if s == nil {
		return msg, 3
	}
	switch state {
	case "ready":
		s.admin &^= 0x01 | 0x08
	case "drain":
		s.admin = s.admin&^0x01 | 0x08
	case "maint":
		s.admin |= 0x01
	default:
		return "'set server <srv> state' expects 'ready', 'drain' and 'maint'.\n", 3
	}
	s.changed = time.Now()
	return "", 0
}

func (f *Server) setWeight(target, value string) (string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, msg := f.lookup(target)
	if s == nil {
		return msg, 3
	}
	w, err := strconv.Atoi(value)
	if pct, ok := strings.CutSuffix(value, "%"); ok {
		var p int
		if p, err = strconv.Atoi(pct); err == nil {
			w = f.cfg.Weight * p / 100
		}
	}
	if err != nil {
		return "Require <weight> or <weight%>.\n", 3
	}
	if w < 0 || w > 256 {
		return "Absolute weight can only be between 0 and 256 inclusive.\n", 3
	}
	s.weight, s.changed = w, time.Now()
	return "", 0
}

func (f *Server) getWeight(target string) (string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, msg := f.lookup(target)
	if s == nil {
		return msg, 3
	}
	return fmt.Sprintf("%d (initial %d)\n", s.weight, f.cfg.Weight), 0
}

// showInfo is HAProxy 2.6's `show info`, its fields in its order, with
// the lines nobody reads left out.
func (f *Server) showInfo() string {
	up := int64(time.Since(f.start).Seconds())
	return fmt.Sprintf("Name: HAProxy\nVersion: 2.6.12-1+deb12u4\nRelease_date: 2026/10/17\nNbthread: 2\nNbproc: 1\nProcess_num: 1\n"+
		"Pid: %d\nUptime: 0d %dh%02dm%02ds\nUptime_sec: %d\nMaxconn: 9986\nHard_maxconn: 9986\nCurrConns: 0\n"+
		"node: fakesocket\nStopping: 0\nBuild info: 2.6.12-1+deb12u4\nStart_time_sec: %d\nTainted: 0\n",
		f.pid, up/3600, up/60%60, up%60, up, f.start.Unix())
}

// statHeader is Debian's HAProxy 2.6.12 `show stat` header, captured.
var statHeader = strings.Split("pxname,svname,qcur,qmax,scur,smax,slim,stot,bin,bout,dreq,dresp,ereq,econ,eresp,wretr,wredis,status,weight,act,bck,chkfail,chkdown,lastchg,downtime,qlimit,pid,iid,sid,throttle,lbtot,tracked,type,rate,rate_lim,rate_max,check_status,check_code,check_duration,hrsp_1xx,hrsp_2xx,hrsp_3xx,hrsp_4xx,hrsp_5xx,hrsp_other,hanafail,req_rate,req_rate_max,req_tot,cli_abrt,srv_abrt,comp_in,comp_out,comp_byp,comp_rsp,lastsess,last_chk,last_agt,qtime,ctime,rtime,ttime,agent_status,agent_code,agent_duration,check_desc,agent_desc,check_rise,check_fall,check_health,agent_rise,agent_fall,agent_health,addr,cookie,mode,algo,conn_rate,conn_rate_max,conn_tot,intercepted,dcon,dses,wrew,connect,reuse,cache_lookups,cache_hits,srv_icur,src_ilim,qtime_max,ctime_max,rtime_max,ttime_max,eint,idle_conn_cur,safe_conn_cur,used_conn_cur,need_conn_est,uweight,agg_server_status,agg_server_check_status,agg_check_status,-,ssl_sess,ssl_reused_sess,ssl_failed_handshake,h2_headers_rcvd,h2_data_rcvd,h2_settings_rcvd,h2_rst_stream_rcvd,h2_goaway_rcvd,h2_detected_conn_protocol_errors,h2_detected_strm_protocol_errors,h2_rst_stream_resp,h2_goaway_resp,h2_open_connections,h2_backend_open_streams,h2_total_connections,h2_backend_total_streams,h1_open_connections,h1_open_streams,h1_total_connections,h1_total_streams,h1_bytes_in,h1_bytes_out,h1_spliced_bytes_in,h1_spliced_bytes_out", ",")

// StatHeader is the `show stat` header the fake prints.
func StatHeader() []string { return append([]string(nil), statHeader...) }

var statCol = func() map[string]int {
	m := make(map[string]int, len(statHeader))
	for i, n := range statHeader {
		m[n] = i
	}
	return m
}()

// ServersStateHeader is HAProxy 2.6's `show servers state` header
// (format 1), captured.
const ServersStateHeader = "be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port"

// showStat prints a row per server and one per backend, as HAProxy 2.6
// does for servers without checks: cumulative counters, status, weight.
func (f *Server) showStat() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	b.WriteString("# " + strings.Join(statHeader, ",") + ",\n")
	row := make([]string, len(statHeader))
	set := func(col string, v any) { row[statCol[col]] = fmt.Sprint(v) }
	now := time.Now()
	for bi := 0; bi < len(f.servers); bi += f.cfg.Servers {
		be := f.servers[bi : bi+f.cfg.Servers]
		var stot, h2, h5 int64
		weight := 0
		for _, s := range be {
			clear(row)
			status := "no check"
			switch {
			case s.admin&0x01 != 0:
				status = "MAINT"
			case s.admin&0x08 != 0:
				status = "DRAIN"
			}
			for col, v := range map[string]any{"pxname": s.backend, "svname": s.name, "qcur": 0, "qmax": 0, "scur": 0, "smax": 1,
				"stot": s.stot, "bin": s.stot * 70, "bout": s.stot * 133, "dresp": 0, "econ": 0, "eresp": 0, "wretr": 0, "wredis": 0,
				"status": status, "weight": s.weight, "act": 1, "bck": 0, "lastchg": int(now.Sub(s.changed).Seconds()),
				"pid": 1, "iid": bi/f.cfg.Servers + 2, "sid": s.id, "lbtot": s.stot, "type": 2, "rate": 0, "rate_max": 0,
				"hrsp_1xx": 0, "hrsp_2xx": s.hrsp2xx, "hrsp_3xx": 0, "hrsp_4xx": 0, "hrsp_5xx": s.hrsp5xx, "hrsp_other": 0,
				"req_tot": s.stot, "cli_abrt": 0, "srv_abrt": 0, "lastsess": 0, "qtime": 0, "ctime": 0, "rtime": f.cfg.RespMs,
				"ttime": f.cfg.RespMs + 1, "addr": fmt.Sprintf("%s:%d", f.cfg.Addr, f.cfg.Port), "mode": "http",
				"qtime_max": 0, "ctime_max": 1, "rtime_max": 4 * f.cfg.RespMs, "ttime_max": 4*f.cfg.RespMs + 1, "uweight": s.weight, "-": "-"} {
				set(col, v)
			}
			b.WriteString(strings.Join(row, ",") + ",\n")
			stot, h2, h5 = stot+s.stot, h2+s.hrsp2xx, h5+s.hrsp5xx
			if s.serving() {
				weight += s.weight
			}
		}
		clear(row)
		for col, v := range map[string]any{"pxname": be[0].backend, "svname": "BACKEND", "qcur": 0, "qmax": 0, "scur": 0, "smax": 1,
			"slim": 999, "stot": stot, "econ": 0, "eresp": 0, "wretr": 0, "wredis": 0, "status": "UP", "weight": weight,
			"act": len(be), "bck": 0, "pid": 1, "iid": bi/f.cfg.Servers + 2, "sid": 0, "lbtot": stot, "type": 1,
			"hrsp_1xx": 0, "hrsp_2xx": h2, "hrsp_3xx": 0, "hrsp_4xx": 0, "hrsp_5xx": h5, "hrsp_other": 0, "req_tot": stot,
			"rtime": f.cfg.RespMs, "mode": "http", "algo": "roundrobin", "uweight": weight, "-": "-"} {
			set(col, v)
		}
		b.WriteString(strings.Join(row, ",") + ",\n")
	}
	return b.String()
}

// showServersState prints format 1, a line per server.
func (f *Server) showServersState() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	b.WriteString("1\n# " + ServersStateHeader + "\n")
	now := time.Now()
	for i, s := range f.servers {
		fmt.Fprintf(&b, "%d %s %d %s %s 2 %d %d %d %d 1 0 2 0 0 0 0 - %d - 0 0 - - 0\n",
			i/f.cfg.Servers+2, s.backend, s.id, s.name, f.cfg.Addr, s.admin, s.weight, f.cfg.Weight,
			int(now.Sub(s.changed).Seconds()), f.cfg.Port)
	}
	return b.String()
}
