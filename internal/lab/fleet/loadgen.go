package fleet

import (
	"context"
	"math"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Load is an open-loop, constant-rate load: request i is due at
// start + i/Rate whatever happened to earlier ones, and its latency is
// measured from that due time, so a stall in HAProxy or a server shows up
// as latency instead of being hidden by a slower send rate.
type Load struct {
	Addr        string // host:port of HAProxy's frontend
	Path        string
	Rate        float64 // requests per second
	Duration    time.Duration
	Timeout     time.Duration // per request; default 5 s
	MaxInFlight int           // default 4096; requests due beyond it are counted as failed
	// NoKeepAlive closes the connection after each request (Connection:
	// close): HAProxy then answers a server's reset with a 502, where a
	// keep-alive client's connection is closed without an answer.
	NoKeepAlive bool
}

// Second is one second of the client's view.
type Second struct {
	Requests int `json:"requests"`
	Err5xx   int `json:"err_5xx"`
	Failed   int `json:"failed"`            // transport errors, timeouts, in-flight overflow
	Retried  int `json:"retried,omitempty"` // answers HAProxy sent after retrying
	// SPOE counts the answers the SPOE was consulted on, and SPOEMaxMs is
	// the longest it held one (HAProxy's own figure, in SPOETimeHeader;
	// both 0 without HAProxyOptions.SPOETime).
	SPOE      int `json:"spoe,omitempty"`
	SPOEMaxMs int `json:"spoe_max_ms,omitempty"`
	// Latency percentiles of the responses due in this second.
	P50Ms float64 `json:"p50_ms"`
	P95Ms float64 `json:"p95_ms"`
	P99Ms float64 `json:"p99_ms"`
}

// Result is what the clients saw.
type Result struct {
	Scheduled int           `json:"scheduled"`
	Completed int           `json:"completed"` // got an HTTP response
	Err5xx    int           `json:"err_5xx"`
	Failed    int           `json:"failed"`
	Elapsed   time.Duration `json:"elapsed"`
	PerSecond []Second      `json:"per_second"`
	// Retried counts responses HAProxy sent after retrying (its %rc in
	// the RetriesHeader, set by configs with HAProxyOptions.Retries).
	Retried   int `json:"retried"`
	latencies []time.Duration
	retried   []time.Duration
	spoeMs    [][]int // per second, as SPOETimeHeader gave them
}

// SPOEHeld counts the answers due from second `from` on that the SPOE held
// for at least atLeast, by HAProxy's own clock: unlike the client's
// latency, a stall of the whole machine does not show in it unless the
// SPOE was consulted.
func (r *Result) SPOEHeld(from int, atLeast time.Duration) int {
	n := 0
	for sec := max(from, 0); sec < len(r.spoeMs); sec++ {
		for _, ms := range r.spoeMs[sec] {
			if time.Duration(ms)*time.Millisecond >= atLeast {
				n++
			}
		}
	}
	return n
}

// RetriesHeader is where a config with HAProxyOptions.Retries puts
// HAProxy's retry count (%rc: "0", or "+N" when redispatched).
const RetriesHeader = "X-Hapilot-Retries"

// RetriedQuantile is the q-th latency of the retried responses.
func (r *Result) RetriedQuantile(q float64) time.Duration {
	return quantile(r.retried, q)
}

// Quantile is the q-th latency (0 < q <= 1) over all responses.
func (r *Result) Quantile(q float64) time.Duration {
	return quantile(r.latencies, q)
}

// Mean latency over all responses.
func (r *Result) Mean() time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	var s time.Duration
	for _, l := range r.latencies {
		s += l
	}
	return s / time.Duration(len(r.latencies))
}

// Throughput is completed responses per second of the run.
func (r *Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Completed) / r.Elapsed.Seconds()
}

// Run drives the load and waits for every request to end.
func (l Load) Run(ctx context.Context) *Result {
	if l.Timeout == 0 {
		l.Timeout = 5 * time.Second
	}
	if l.MaxInFlight == 0 {
		l.MaxInFlight = 4096
	}
	if l.Path == "" {
		l.Path = "/"
	}
	client := &fasthttp.HostClient{Addr: l.Addr, MaxConns: l.MaxInFlight, ReadTimeout: l.Timeout, WriteTimeout: l.Timeout, MaxIdemponentCallAttempts: 1}
	total := int(l.Rate * l.Duration.Seconds())
	period := time.Duration(float64(time.Second) / l.Rate)
	res := &Result{Scheduled: total, PerSecond: make([]Second, int(math.Ceil(l.Duration.Seconds()))+1)}
	res.spoeMs = make([][]int, len(res.PerSecond))
	perSecond := make([][]time.Duration, len(res.PerSecond))
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, l.MaxInFlight)
	uri := "http://" + l.Addr + l.Path
	start := time.Now()
	record := func(due time.Time, status int, retried bool, spoeMs int, err error) {
		lat := time.Since(due)
		sec := int(due.Sub(start) / time.Second)
		mu.Lock()
		defer mu.Unlock()
		sec = min(sec, len(res.PerSecond)-1)
		ps := &res.PerSecond[sec]
		ps.Requests++
		switch {
		case err != nil:
			res.Failed++
			ps.Failed++
		default:
			res.Completed++
			res.latencies = append(res.latencies, lat)
			perSecond[sec] = append(perSecond[sec], lat)
			if retried {
				ps.Retried++
				res.Retried++
				res.retried = append(res.retried, lat)
			}
			if status >= 500 {
				res.Err5xx++
				ps.Err5xx++
			}
			if spoeMs >= 0 {
				ps.SPOE++
				ps.SPOEMaxMs = max(ps.SPOEMaxMs, spoeMs)
				res.spoeMs[sec] = append(res.spoeMs[sec], spoeMs)
			}
		}
	}
	for i := 0; i < total; i++ {
		due := start.Add(time.Duration(i) * period)
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
				res.Scheduled = i
				i = total
				continue
			case <-time.After(d):
			}
		}
		select {
		case slots <- struct{}{}:
		default:
			record(due, 0, false, -1, context.DeadlineExceeded)
			continue
		}
		wg.Add(1)
		go func(due time.Time) {
			defer wg.Done()
			defer func() { <-slots }()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI(uri)
			if l.NoKeepAlive {
				req.SetConnectionClose()
			}
			err := client.DoTimeout(req, resp, l.Timeout)
			rc := resp.Header.Peek(RetriesHeader)
			record(due, resp.StatusCode(), len(rc) > 0 && string(rc) != "0", spoeMs(resp.Header.Peek(SPOETimeHeader)), err)
		}(due)
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	sort.Slice(res.latencies, func(i, j int) bool { return res.latencies[i] < res.latencies[j] })
	sort.Slice(res.retried, func(i, j int) bool { return res.retried[i] < res.retried[j] })
	for i, lats := range perSecond {
		sort.Slice(lats, func(a, b int) bool { return lats[a] < lats[b] })
		ps := &res.PerSecond[i]
		ps.P50Ms, ps.P95Ms, ps.P99Ms = quantileMs(lats, 0.50), quantileMs(lats, 0.95), quantileMs(lats, 0.99)
	}
	return res
}

// spoeMs reads SPOETimeHeader: -1 where it is absent (the SPOE was not
// consulted) or not a count of milliseconds.
func spoeMs(h []byte) int {
	if len(h) == 0 {
		return -1
	}
	ms, err := strconv.Atoi(string(h))
	if err != nil || ms < 0 {
		return -1
	}
	return ms
}

// quantile is the q-th of sorted latencies (0 < q <= 1).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func quantileMs(sorted []time.Duration, q float64) float64 {
	return float64(quantile(sorted, q)) / float64(time.Millisecond)
}

// ClosedLoad keeps Concurrency requests in flight for Duration, each
// client sending its next request when the last one ends: the most a
// proxy can serve, for throughput comparisons.
type ClosedLoad struct {
	Addr        string
	Concurrency int
	Duration    time.Duration
	Timeout     time.Duration
}

// Run drives the load; Result.Scheduled is the number of requests sent.
func (l ClosedLoad) Run(ctx context.Context) *Result {
	if l.Timeout == 0 {
		l.Timeout = 5 * time.Second
	}
	client := &fasthttp.HostClient{Addr: l.Addr, MaxConns: l.Concurrency, ReadTimeout: l.Timeout, WriteTimeout: l.Timeout, MaxIdemponentCallAttempts: 1}
	res := &Result{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(l.Duration)
	uri := "http://" + l.Addr + "/"
	for i := 0; i < l.Concurrency; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI(uri)
			var lats []time.Duration
			sent, failed, e5 := 0, 0, 0
			for time.Now().Before(end) && ctx.Err() == nil {
				t0 := time.Now()
				err := client.DoTimeout(req, resp, l.Timeout)
				sent++
				switch {
				case err != nil:
					failed++
				case resp.StatusCode() >= 500:
					e5++
					lats = append(lats, time.Since(t0))
				default:
					lats = append(lats, time.Since(t0))
				}
			}
			mu.Lock()
			res.Scheduled += sent
			res.Completed += sent - failed
			res.Failed += failed
			res.Err5xx += e5
			res.latencies = append(res.latencies, lats...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	sort.Slice(res.latencies, func(i, j int) bool { return res.latencies[i] < res.latencies[j] })
	return res
}

// Merge adds other's counts and latencies to r (for interleaved rounds).
func (r *Result) Merge(other *Result) {
	r.Scheduled += other.Scheduled
	r.Completed += other.Completed
	r.Failed += other.Failed
	r.Err5xx += other.Err5xx
	r.Elapsed += other.Elapsed
	r.latencies = append(r.latencies, other.latencies...)
	sort.Slice(r.latencies, func(i, j int) bool { return r.latencies[i] < r.latencies[j] })
}
