package envoyod

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hapilot/hapilot/haproxy"
	"github.com/hapilot/hapilot/internal/ingest/spoe"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/rs/zerolog"
)

// Runner feeds a Detector with every response HAProxy reports over the
// example stanza's SPOE messages (the same per-response stream hapilot
// reads) and carries out its decisions through the runtime socket: drain
// to eject, ready to return. Envoy sees every response its router
// forwards; this sees every response HAProxy forwards.
type Runner struct {
	Detector *Detector
	Backend  string // HAProxy backend of the hosts
	HAProxy  *haproxy.Client
	Log      zerolog.Logger
	// Now is the clock (time.Now when nil); the sweep ticks every
	// Config().Interval from Serve's start.
	Now func() time.Time

	mu      sync.Mutex
	actions []Action
	sweeps  []SweepStats
	queue   chan Action
	events  int
}

// Record is window.Sink's: one response, from an SPOE connection's
// goroutine.
func (r *Runner) Record(ev window.Event) {
	if string(ev.Backend) != r.Backend {
		return
	}
	status := ev.Status
	if ev.ResponseMs < 0 && status < 500 {
		status = 0 // no answer from the server
	}
	n := max(ev.Count, 1)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events += n
	for i := 0; i < n; i++ {
		if a := r.Detector.Record(r.now(), string(ev.Server), status); a != nil {
			r.push(*a)
		}
	}
}

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// push records a and hands it to the actor; callers hold mu.
func (r *Runner) push(a Action) {
	r.actions = append(r.actions, a)
	select {
	case r.queue <- a:
	default:
		r.Log.Warn().Str("host", a.Host).Msg("envoy: action queue full, dropped")
	}
}

// Actions lists what the detector decided so far.
func (r *Runner) Actions() []Action {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Action(nil), r.actions...)
}

// Sweeps lists every sweep's success-rate arithmetic so far.
func (r *Runner) Sweeps() []SweepStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]SweepStats(nil), r.sweeps...)
}

// Events is how many responses it has seen.
func (r *Runner) Events() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.events
}

// Serve listens for HAProxy's SPOE connections on ln, sweeps every
// interval and acts, until ctx ends.
func (r *Runner) Serve(ctx context.Context, ln net.Listener) error {
	r.queue = make(chan Action, 4096)
	srv := &spoe.Server{Sink: r, Log: r.Log}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-ctx.Done():
				return
			case a := <-r.queue:
				st := haproxy.StateDrain
				if !a.Eject {
					st = haproxy.StateReady
				}
				if err := r.HAProxy.SetServerState(ctx, r.Backend, a.Host, st); err != nil && ctx.Err() == nil {
					r.Log.Error().Err(err).Str("host", a.Host).Msg("envoy: runtime command")
				}
			}
		}
	}()
	go func() {
		defer wg.Done()
		tick := time.NewTicker(r.Detector.Config().Interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				r.mu.Lock()
				for _, a := range r.Detector.Sweep(r.now()) {
					r.push(a)
				}
				r.sweeps = append(r.sweeps, r.Detector.Last)
				r.mu.Unlock()
			}
		}
	}()
	err := srv.Serve(ctx, ln)
	wg.Wait()
	if errors.Is(ctx.Err(), context.Canceled) {
		return nil
	}
	return err
}
