package haproxy

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// bigStat is a `show stat` reply of n server rows, each a copy of the
// 2.6 capture's app/srv1 row (129 columns) under its own name.
func bigStat(t testing.TB, n int) string {
	t.Helper()
	raw, err := os.ReadFile("testdata/show-stat-2.6-retries.csv")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	var row string
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, "app,srv1,"); ok {
			row = rest
		}
	}
	if row == "" {
		t.Fatal("no app/srv1 row in the capture")
	}
	var b strings.Builder
	b.WriteString(lines[0] + "\n")
	for i := 0; i < n; i++ {
		b.WriteString("app,s" + strconv.Itoa(i) + "," + row + "\n")
	}
	b.WriteString("\n")
	return b.String()
}

// bigServersState is a `show servers state` reply of n servers.
func bigServersState(n int) string {
	var b strings.Builder
	b.WriteString("1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_port\n")
	for i := 0; i < n; i++ {
		b.WriteString("2 app " + strconv.Itoa(i) + " s" + strconv.Itoa(i) + " 127.0.0.1 2 0 10 10 80\n")
	}
	return b.String() + "\n"
}

// fakeSocket answers every command as HAProxy's runtime socket does (an
// empty line for the severity prefix first) with reply's bytes, written
// through write, then closes.
func fakeSocket(t testing.TB, write func(c net.Conn)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			func() {
				defer c.Close()
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				write(c)
			}()
		}
	}()
	return path
}

func replying(reply string) func(net.Conn) {
	b := []byte("\n" + reply)
	return func(c net.Conn) { _, _ = c.Write(b) }
}

// A `show stat` of 60,000 server rows (the capture's row, 129 columns,
// under 60,000 names) is parsed as it arrives: it costs a few times the
// reply's own size, not a map of every column per row. Before, the reply
// was read whole and every row became a map: 765 MiB allocated for a
// 13.6 MB reply, and 2.4 s.
func TestServerStatsOfABigReply(t *testing.T) {
	const rows = 60_000
	reply := bigStat(t, rows)
	c, err := New(fakeSocket(t, replying(reply)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	began := time.Now()
	got, err := c.ServerStats(ctx)
	took := time.Since(began)
	runtime.ReadMemStats(&after)
	if err != nil || len(got) != rows {
		t.Fatalf("%d rows, %v", len(got), err)
	}
	if got[rows-1].Server != "s"+strconv.Itoa(rows-1) || got[rows-1].Counters.Wretr != 20 {
		t.Fatalf("last row %+v", got[rows-1])
	}
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("reply %d bytes, %d rows: %v, %d MiB allocated", len(reply), rows, took, alloc>>20)
	if limit := 8 * uint64(len(reply)); alloc > limit {
		t.Fatalf("%d MiB allocated for a reply of %d MiB: over 8 times its size", alloc>>20, len(reply)>>20)
	}
}

// A reply of more rows than MaxRows is refused at the first row past it,
// for both commands the agent parses, and not fetched again.
func TestRowBound(t *testing.T) {
	tests := []struct {
		name  string
		reply string
		read  func(ctx context.Context, c *Client) (int, error)
	}{
		{"show stat", bigStat(t, 2000), func(ctx context.Context, c *Client) (int, error) {
			rows, err := c.ServerStats(ctx)
			return len(rows), err
		}},
		{"show servers state", bigServersState(2000), func(ctx context.Context, c *Client) (int, error) {
			rows, err := c.ShowServersState(ctx)
			return len(rows), err
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var conns int
			reply := replying(tc.reply)
			c, err := New(fakeSocket(t, func(c net.Conn) { conns++; reply(c) }))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if n, err := tc.read(ctx, c); err != nil || n != 2000 {
				t.Fatalf("within the default bound: %d rows, %v", n, err)
			}
			c.MaxRows = 1000
			n, err := tc.read(ctx, c)
			if !errors.Is(err, ErrTooManyRows) || n != 0 || !strings.Contains(err.Error(), "over 1000") {
				t.Fatalf("MaxRows 1000: %d rows, %v", n, err)
			}
			if conns != 2 {
				t.Fatalf("%d connections: a refused reply was fetched again", conns)
			}
		})
	}
}

// The parse stops at the context's end even when the whole reply is
// already buffered: a step's deadline cuts it.
func TestParseStopsAtContextEnd(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	big := bigStat(t, 5000)
	if _, err := readServerStats(ctx, bufio.NewReader(strings.NewReader(big)), DefaultMaxRows); !errors.Is(err, context.Canceled) {
		t.Fatalf("show stat: %v", err)
	}
	if _, err := readServersState(ctx, bufio.NewReader(strings.NewReader(bigServersState(5000))), DefaultMaxRows); !errors.Is(err, context.Canceled) {
		t.Fatalf("show servers state: %v", err)
	}
	// A reply that keeps coming, slowly, is cut at the deadline.
	c, err := New(fakeSocket(t, func(c net.Conn) {
		_, _ = c.Write([]byte("\n" + strings.SplitAfter(big, "\n")[0]))
		for i := 0; ; i++ {
			if _, err := c.Write([]byte("app,s" + strconv.Itoa(i) + ",0,0\n")); err != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer dcancel()
	began := time.Now()
	if _, err := c.ServerStats(dctx); err == nil {
		t.Fatal("an endless reply was accepted")
	}
	if d := time.Since(began); d > 2*time.Second {
		t.Fatalf("the read went on %v past a 200 ms deadline", d)
	}
}

// A marked failure is still told from data on a streamed reply.
func TestStreamedFailure(t *testing.T) {
	c, err := New(fakeSocket(t, replying("[3]: Unknown command.\n\n")))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.ServerStats(context.Background())
	var ce *CommandError
	if !errors.As(err, &ce) || ce.Severity != 3 || ce.Reply != "Unknown command." {
		t.Fatalf("err %v", err)
	}
}
