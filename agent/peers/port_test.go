package peers

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lib/window"
)

// closedByNode reports whether the node closed c within d: a read ends
// with EOF or a reset, not at the deadline.
func closedByNode(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// A keyless peer that announces a 20 MiB stream, memberlist's or
// hapilot's, is closed at the length, before its body is read: 20 of them
// once took an agent from 12 MB to about 1 GB, since memberlist reads
// what a stream announces before it checks the key.
func TestKeylessStreamRefusedAtItsLength(t *testing.T) {
	a := startNode(t, "a", bytes.Repeat([]byte{7}, 32))
	const announce = 20 << 20
	for _, tc := range []struct {
		name string
		hdr  []byte
	}{
		{"memberlist's encrypted stream", []byte{mlEncrypt, 0, 0, 0, 0}},
		{"a labelled one", []byte{mlLabel, 2, 'x', 'y', mlEncrypt, 0, 0, 0, 0}},
		{"hapilot's envelope", []byte{envelopeMagic, 0, 0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			binary.BigEndian.PutUint32(tc.hdr[len(tc.hdr)-4:], announce)
			c, err := net.Dial("tcp", a.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(append(tc.hdr, make([]byte, 64<<10)...)); err != nil {
				t.Fatal(err)
			}
			if !closedByNode(c, 2*time.Second) {
				t.Fatalf("a stream announcing %d bytes was still read 2 s later (the bound is %d)", announce, MaxStream)
			}
		})
	}

	// And 20 of them sending their 20 MiB whole cost the node little.
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", a.Addr())
			if err != nil {
				return
			}
			defer c.Close()
			_ = c.SetWriteDeadline(time.Now().Add(3 * time.Second))
			hdr := []byte{mlEncrypt, 0, 0, 0, 0}
			binary.BigEndian.PutUint32(hdr[1:], announce)
			if _, err := c.Write(hdr); err != nil {
				return
			}
			chunk := make([]byte, 64<<10)
			for sent := 0; sent < announce; sent += len(chunk) {
				if _, err := c.Write(chunk); err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	runtime.ReadMemStats(&after)
	// The node reads at most a stream's bound from each, whatever the
	// buffers make of it; the test's own sends allocate a chunk each.
	t.Logf("20 keyless streams of %d bytes: the process allocated %d bytes meanwhile", announce, after.TotalAlloc-before.TotalAlloc)
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 20*4*MaxStream {
		t.Fatalf("20 keyless streams of %d bytes made the node allocate %d bytes (bound %d)", announce, grew, 20*4*MaxStream)
	}
}

// The fleet port caps its connections, per peer and in all: idle
// connections past the caps are closed at once (1,100 of them once used
// every file descriptor an agent had), and a real member still joins.
func TestFleetPortCapsItsConnections(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	a := startNode(t, "a", key)
	const idle = 4 * MaxStreams
	conns := make([]net.Conn, idle)
	for i := range conns {
		c, err := net.Dial("tcp", a.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[i] = c
	}
	closed := 0
	for _, c := range conns[:idle-MaxStreamsPerPeer] { // the oldest go first
		if closedByNode(c, time.Second) {
			closed++
		}
	}
	if closed != idle-MaxStreamsPerPeer {
		t.Fatalf("%d of %d idle connections from one address were closed; the caps allow %d open (%d per peer, %d in all)",
			closed, idle, idle-closed, MaxStreamsPerPeer, MaxStreams)
	}
	// A real member, from the same address, still gets in.
	b := startNode(t, "b", key, a.Addr())
	eventually(t, "a hears b through the held port", func() bool {
		b.local.Record(window.Event{Backend: []byte("app"), Server: []byte("srv1"), Status: 200, ResponseMs: 5})
		return hasSeries(a.remote, "app", "srv1")
	})
}

// Streams that have shown a header within bounds (push-pulls under way)
// are not evicted for a newcomer: the newcomer is closed instead, so that
// a burst of joins completes rather than evicting itself in turn.
func TestStreamsUnderWayAreNotEvicted(t *testing.T) {
	a := startNode(t, "a", bytes.Repeat([]byte{7}, 32))
	underWay := make([]net.Conn, MaxStreamsPerPeer)
	for i := range underWay {
		c, err := net.Dial("tcp", a.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		hdr := []byte{mlEncrypt, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(hdr[1:], 1000) // within bounds; its body never comes
		if _, err := c.Write(hdr); err != nil {
			t.Fatal(err)
		}
		underWay[i] = c
	}
	eventually(t, "every stream's header is read", func() bool {
		a.tr.mu.Lock()
		defer a.tr.mu.Unlock()
		shown := 0
		for c := range a.tr.open {
			if c.shown.Load() {
				shown++
			}
		}
		return shown == MaxStreamsPerPeer
	})
	late, err := net.Dial("tcp", a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	if !closedByNode(late, 2*time.Second) {
		t.Fatal("a newcomer past the per-peer cap was kept")
	}
	for i, c := range underWay {
		if closedByNode(c, 50*time.Millisecond) {
			t.Fatalf("stream %d, under way, was evicted for a newcomer", i)
		}
	}
}
