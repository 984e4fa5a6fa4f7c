package netx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Serve is the one accept loop of every stream listener (SPOE, the Lua
// companion, a ring's forwarder): it accepts from ln until ctx ends and
// runs handle for each connection in a goroutine it owns. When it
// returns, ln is closed, every connection it accepted is closed, and every
// handle has returned. An accept error that is not the listener's
// closing (Limit already lives through the machine's own) is logged and
// retried after a pause of 5 ms doubling to 1 s, as net/http does; a
// listener closed while ctx is live is an error, since nothing will
// accept there any more.
func Serve(ctx context.Context, ln net.Listener, log zerolog.Logger, handle func(net.Conn)) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var (
		mu    sync.Mutex // guards conns: the accepts add, the handlers remove, the close reads
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	defer func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	var pause time.Duration
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accept: %w", err)
			}
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			log.Error().Err(err).Dur("retry_in", pause).Msg("accept failed: the listener goes on")
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			continue
		}
		pause = 0
		mu.Lock()
		conns[conn] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				conn.Close()
				mu.Lock()
				delete(conns, conn)
				mu.Unlock()
			}()
			handle(conn)
		}()
	}
}
