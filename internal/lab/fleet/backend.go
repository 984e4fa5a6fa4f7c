package fleet

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// BackendConfig shapes one fault-injecting server.
type BackendConfig struct {
	ErrorRate float64       // share of requests answered 500, at random
	Latency   time.Duration // base service time
	Jitter    time.Duration // plus a uniform 0..Jitter
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
	served    atomic.Uint64
	failed    atomic.Uint64
}

// StartBackend listens on a free loopback port and serves until Close.
func StartBackend(cfg BackendConfig) (*Backend, error) {
	addr := cfg.Listen
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fleet: backend listen: %w", err)
	}
	b := &Backend{Addr: ln.Addr().String(), cfg: cfg, ln: ln, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
	b.SetErrorRate(cfg.ErrorRate)
	if cfg.Capacity > 0 {
		b.slots = make(chan struct{}, cfg.Capacity)
	}
	b.srv = &fasthttp.Server{Handler: b.handle, Name: "fleet", Concurrency: 100000}
	go b.srv.Serve(ln)
	return b, nil
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
	if delay > 0 {
		time.Sleep(delay)
	}
	b.served.Add(1)
	if fail {
		b.failed.Add(1)
		ctx.Error("injected fault", fasthttp.StatusInternalServerError)
		return
	}
	ctx.SetBodyString("ok\n")
}

// Served and Failed count requests answered and answered 500.
func (b *Backend) Served() uint64 { return b.served.Load() }
func (b *Backend) Failed() uint64 { return b.failed.Load() }

// Close stops the server.
func (b *Backend) Close() error { return b.srv.Shutdown() }

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
