package fleet

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hapilot/hapilot/internal/lib/enum"
	"github.com/valyala/fasthttp"
)

// Fault is how a failing request fails: the ways a real server fails, each
// of which HAProxy records in its own counters (docs/explanation/telemetry.md).
type Fault string

const (
	// Fault500 answers HTTP 500: the server's own 5xx (the default).
	Fault500 Fault = "500"
	// FaultHang reads the request and never answers (for HangFor): past
	// `timeout server`, HAProxy answers 504 itself (sH--).
	FaultHang Fault = "hang"
	// FaultReset closes the connection with a TCP reset instead of an
	// answer: a 502 (SH--) to a client without keep-alive; a client
	// connection closed without a word to a keep-alive one.
	FaultReset Fault = "reset"
	// FaultRefuse refuses connections: the listening socket is closed for
	// short spells that add up to the error rate's share of the time, so
	// that the kernel resets the connections that arrive then. HAProxy
	// retries them, and with `option redispatch` sends the last retry to
	// another server.
	FaultRefuse Fault = "refuse"
	// FaultGarbage answers bytes that are not HTTP: a 502 (PH--).
	FaultGarbage Fault = "garbage"
	// FaultSlow answers 200 after SlowFor: a slow tail, not an error.
	FaultSlow Fault = "slow"
)

// Faults lists the fault kinds, for usage lines.
var Faults = []Fault{Fault500, FaultHang, FaultReset, FaultRefuse, FaultGarbage, FaultSlow}

func (f *Fault) String() string { return string(*f) }

// Set implements flag.Value.
func (f *Fault) Set(s string) (err error) {
	*f, err = enum.Parse("fault", s, Faults...)
	return err
}

// Defaults of the faults' durations.
const (
	// DefaultHangFor is past any `timeout server` the lab configures.
	DefaultHangFor = 10 * time.Second
	// DefaultSlowFor is the slow tail: 1.5 s on a share.
	DefaultSlowFor = 1500 * time.Millisecond
	// refuseSpell is how long one refusing spell lasts: short enough that
	// a spell refuses a few connections, not a whole second's.
	refuseSpell = 20 * time.Millisecond
)

// garbageAnswer is what FaultGarbage sends: no status line HAProxy takes.
const garbageAnswer = "this is not HTTP\r\n\r\n"

// BackendConfig shapes one fault-injecting server.
type BackendConfig struct {
	// ErrorRate is the share of requests that fail, at random, in the way
	// Fault says (for FaultRefuse, the share of the time connections are
	// refused).
	ErrorRate float64
	// Fault is how they fail; "" is Fault500.
	Fault Fault
	// HangFor (FaultHang) and SlowFor (FaultSlow) are how long a failing
	// request is held; 0 is DefaultHangFor, DefaultSlowFor.
	HangFor, SlowFor time.Duration
	Latency          time.Duration // base service time
	Jitter           time.Duration // plus a uniform 0..Jitter
	// Capacity is how many requests it serves at once; more wait in line,
	// as on a real server with a worker pool. 0 means unlimited.
	Capacity int
	Seed     uint64
	// Listen is the address to listen on; "" is a free loopback port
	// (127.0.0.1:0). A server-template test needs several hosts on one
	// port: 127.0.0.11:P, 127.0.0.12:P, ...
	Listen string
}

// Backend is one running server.
type Backend struct {
	Addr string

	errorRate atomic.Uint64 // float64 bits, changeable while running
	cfg       BackendConfig
	slots     chan struct{}
	rngMu     sync.Mutex
	rng       *rand.Rand
	srv       *fasthttp.Server
	ln        net.Listener
	flap      *flapListener // FaultRefuse's listener, for Restart
	served    atomic.Uint64
	failed    atomic.Uint64
	// done ends the hangs and the refusing listener's spells on Close.
	done      chan struct{}
	closeOnce sync.Once
	refused   atomic.Uint64 // refusing spells
}

// StartBackend listens on a free loopback port and serves until Close.
func StartBackend(cfg BackendConfig) (*Backend, error) {
	addr := cfg.Listen
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if cfg.Fault == "" {
		cfg.Fault = Fault500
	}
	if _, err := enum.Parse("fault", string(cfg.Fault), Faults...); err != nil {
		return nil, fmt.Errorf("fleet: backend: %w", err)
	}
	if cfg.HangFor <= 0 {
		cfg.HangFor = DefaultHangFor
	}
	if cfg.SlowFor <= 0 {
		cfg.SlowFor = DefaultSlowFor
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fleet: backend listen: %w", err)
	}
	b := &Backend{Addr: ln.Addr().String(), cfg: cfg, ln: ln, done: make(chan struct{}), rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
	b.SetErrorRate(cfg.ErrorRate)
	if cfg.Capacity > 0 {
		b.slots = make(chan struct{}, cfg.Capacity)
	}
	b.srv = &fasthttp.Server{Handler: b.handle, Name: "fleet", Concurrency: 100000, Logger: quiet{}}
	if cfg.Fault == FaultRefuse {
		fl := &flapListener{addr: b.Addr, cur: ln, conns: make(chan net.Conn), done: b.done, down: make(chan time.Duration)}
		b.flap = fl
		b.ln = fl
		go fl.run(b)
	}
	go b.srv.Serve(b.ln)
	return b, nil
}

// quiet drops fasthttp's log lines: a reset or a hang is on purpose here.
type quiet struct{}

func (quiet) Printf(string, ...any) {}

// Fault is how this backend's failing requests fail.
func (b *Backend) Fault() Fault { return b.cfg.Fault }

// Restart closes a FaultRefuse backend's listening socket for d, now, as
// a restart does: every connection meanwhile is refused. It returns once
// the socket is closed; false for another kind of backend.
func (b *Backend) Restart(d time.Duration) bool {
	if b.flap == nil {
		return false
	}
	select {
	case b.flap.down <- d:
		return true
	case <-b.done:
		return false
	}
}

// RefusingSpells counts the spells FaultRefuse closed the listener for.
func (b *Backend) RefusingSpells() uint64 { return b.refused.Load() }

// flapListener is FaultRefuse's listener: one net.Listener to the HTTP
// server, under which the real socket is closed for refusing spells and
// opened again on the same address. A connection that arrives in a spell
// finds no socket and is reset by the kernel, as a refused one is.
type flapListener struct {
	addr  string
	conns chan net.Conn
	done  chan struct{}
	// down asks for one refusing spell of the length given, now: a
	// restart, as a deploy makes one.
	down chan time.Duration
	mu   sync.Mutex
	cur  net.Listener // nil during a spell
}

// run accepts from the socket of the moment and flaps it until done: each
// open spell lasts an exponential draw whose mean makes the closed spells
// (refuseSpell each) the error rate's share of the time.
func (fl *flapListener) run(b *Backend) {
	for {
		fl.mu.Lock()
		ln := fl.cur
		fl.mu.Unlock()
		accepted := make(chan struct{})
		go func() {
			defer close(accepted)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				select {
				case fl.conns <- c:
				case <-fl.done:
					c.Close()
					return
				}
			}
		}()
		spell := refuseSpell
	wait:
		for {
			open, refuse := b.openSpell()
			select {
			case <-fl.done:
				ln.Close()
				<-accepted
				return
			case <-time.After(open):
				if refuse {
					break wait
				}
			case spell = <-fl.down:
				break wait
			}
		}
		fl.mu.Lock()
		fl.cur = nil
		fl.mu.Unlock()
		ln.Close()
		<-accepted
		b.refused.Add(1)
		select {
		case <-fl.done:
			return
		case <-time.After(spell):
		}
		// Open again on the same address; Go's listeners set SO_REUSEADDR.
		for {
			nl, err := net.Listen("tcp", fl.addr)
			if err == nil {
				fl.mu.Lock()
				fl.cur = nl
				fl.mu.Unlock()
				break
			}
			select {
			case <-fl.done:
				return
			case <-time.After(refuseSpell):
			}
		}
	}
}

// openSpell draws how long the listener stays open before the next
// refusing spell. At rate 0 there is none: refuse is false, and the rate
// is looked at again after a second, so that a fault switched on
// mid-stream (SetErrorRate) begins within one. Before, rate 0 still
// closed the socket for a spell each second, about 2% of the time: a
// server meant healthy until its onset was drained before it.
func (b *Backend) openSpell() (open time.Duration, refuse bool) {
	r := b.ErrorRate()
	if r <= 0 {
		return time.Second, false
	}
	r = min(r, 0.99)
	mean := float64(refuseSpell) * (1 - r) / r
	b.rngMu.Lock()
	defer b.rngMu.Unlock()
	return time.Duration(b.rng.ExpFloat64() * mean), true
}

func (fl *flapListener) Accept() (net.Conn, error) {
	select {
	case c := <-fl.conns:
		return c, nil
	case <-fl.done:
		return nil, net.ErrClosed
	}
}

func (fl *flapListener) Close() error { return nil } // Backend.Close ends it through done

func (fl *flapListener) Addr() net.Addr {
	a, _ := net.ResolveTCPAddr("tcp", fl.addr)
	return a
}

// SetErrorRate changes the share of failed requests from now on.
func (b *Backend) SetErrorRate(r float64) { b.errorRate.Store(math.Float64bits(r)) }

// ErrorRate is the current share of failed requests.
func (b *Backend) ErrorRate() float64 { return math.Float64frombits(b.errorRate.Load()) }

func (b *Backend) draw() (fail bool, delay time.Duration) {
	b.rngMu.Lock()
	defer b.rngMu.Unlock()
	fail = b.rng.Float64() < b.ErrorRate()
	delay = b.cfg.Latency
	if b.cfg.Jitter > 0 {
		delay += time.Duration(b.rng.Int64N(int64(b.cfg.Jitter)))
	}
	return fail, delay
}

func (b *Backend) handle(ctx *fasthttp.RequestCtx) {
	if b.slots != nil {
		b.slots <- struct{}{}
		defer func() { <-b.slots }()
	}
	fail, delay := b.draw()
	if b.cfg.Fault == FaultRefuse {
		fail = false // its failures are the refused connections
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	b.served.Add(1)
	if !fail {
		ctx.SetBodyString("ok\n")
		return
	}
	b.failed.Add(1)
	switch b.cfg.Fault {
	case FaultHang:
		select {
		case <-time.After(b.cfg.HangFor):
		case <-b.done:
		}
		ctx.Error("hung", fasthttp.StatusInternalServerError) // long after HAProxy gave up
	case FaultReset:
		// SO_LINGER 0 makes the close a reset, not a FIN.
		if tc, ok := ctx.Conn().(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) { c.Close() })
	case FaultGarbage:
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(c net.Conn) {
			c.Write([]byte(garbageAnswer))
			c.Close()
		})
	case FaultSlow:
		select {
		case <-time.After(b.cfg.SlowFor):
		case <-b.done:
		}
		ctx.SetBodyString("ok\n")
	default:
		ctx.Error("injected fault", fasthttp.StatusInternalServerError)
	}
}

// Served counts requests read; Failed those failed by the fault (none
// for FaultRefuse: see RefusingSpells).
func (b *Backend) Served() uint64 { return b.served.Load() }
func (b *Backend) Failed() uint64 { return b.failed.Load() }

// Close stops the server, ending its hangs.
func (b *Backend) Close() error {
	b.closeOnce.Do(func() { close(b.done) })
	return b.srv.Shutdown()
}

// StartBackends starts one backend per config.
func StartBackends(cfgs []BackendConfig) ([]*Backend, error) {
	var out []*Backend
	for _, c := range cfgs {
		b, err := StartBackend(c)
		if err != nil {
			CloseAll(out)
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// CloseAll stops every backend.
func CloseAll(bs []*Backend) {
	for _, b := range bs {
		b.Close()
	}
}

// Addrs lists the backends' addresses.
func Addrs(bs []*Backend) []string {
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = b.Addr
	}
	return out
}
