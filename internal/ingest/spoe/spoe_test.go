package spoe

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/negasus/haproxy-spoe-go/client"
	"github.com/negasus/haproxy-spoe-go/frame"
	"github.com/negasus/haproxy-spoe-go/typeddata"
	"github.com/negasus/haproxy-spoe-go/varint"
	"github.com/rs/zerolog"
)

type arg struct {
	name  string
	value any
}

// encodeMessage builds a NOTIFY message with negasus's typed-data encoder,
// an implementation independent of our decoder.
func encodeMessage(t testing.TB, name string, args ...arg) []byte {
	var tmp [10]byte
	var b []byte
	n := varint.PutUvarint(tmp[:], uint64(len(name)))
	b = append(append(b, tmp[:n]...), name...)
	b = append(b, byte(len(args)))
	for _, a := range args {
		n = varint.PutUvarint(tmp[:], uint64(len(a.name)))
		b = append(append(b, tmp[:n]...), a.name...)
		var err error
		b, _, err = typeddata.Encode(a.value, b)
		if err != nil {
			t.Fatalf("encode %v: %v", a, err)
		}
	}
	return b
}

func response(t testing.TB, backend, server any, status, tr any) []byte {
	return encodeMessage(t, MessageName,
		arg{ArgBackend, backend}, arg{ArgServer, server}, arg{ArgStatus, status}, arg{ArgTr, tr})
}

type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) Record(ev window.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, string(ev.Backend)+"/"+string(ev.Server)+" "+itoa(ev.Status)+" "+itoa(ev.ResponseMs))
}

func (r *recorder) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.events...)
}

func itoa(n int) string {
	return string(binary.AppendVarint(nil, int64(n))) // compact, only compared
}

func TestDecodeNotify(t *testing.T) {
	ok := response(t, "app", "srv1", int32(200), "12")
	tests := []struct {
		name    string
		payload []byte
		want    NotifyResult
		events  int
		wantErr bool
	}{
		{"one response", ok, NotifyResult{Events: 1}, 1, false},
		{"two in one frame", append(append([]byte{}, ok...), ok...), NotifyResult{Events: 2}, 2, false},
		{"status as int64, tr as int", response(t, "app", "srv1", int64(503), int32(7)), NotifyResult{Events: 1}, 1, false},
		{"tr -1 (no answer)", response(t, "app", "srv1", int32(504), "-1"), NotifyResult{Events: 1}, 1, false},
		{"missing tr", encodeMessage(t, MessageName, arg{ArgBackend, "a"}, arg{ArgServer, "s"}, arg{ArgStatus, int32(200)}), NotifyResult{Invalid: 1}, 0, false},
		{"status as text", response(t, "app", "srv1", "OK", "1"), NotifyResult{Invalid: 1}, 0, false},
		{"status out of range", response(t, "app", "srv1", int32(42), "1"), NotifyResult{Invalid: 1}, 0, false},
		{"backend as binary", response(t, []byte("app"), "srv1", int32(200), "1"), NotifyResult{Invalid: 1}, 0, false},
		{"tr not a number", response(t, "app", "srv1", int32(200), "12ms"), NotifyResult{Invalid: 1}, 0, false},
		{"no server chosen", response(t, "app", nil, int32(503), "-1"), NotifyResult{NoServer: 1}, 0, false},
		{"other message skipped", append(encodeMessage(t, "other", arg{"x", int32(1)}), ok...), NotifyResult{Unknown: 1, Events: 1}, 1, false},
		{"truncated", ok[:len(ok)-3], NotifyResult{}, 0, true},
		{"name longer than payload", []byte{0x20, 'a'}, NotifyResult{}, 0, true},
		{"bad type byte", []byte{1, 'm', 1, 1, 'k', 0x0E}, NotifyResult{}, 0, true},
		{"empty", nil, NotifyResult{}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := 0
			got, err := DecodeNotify(tc.payload, func(ev window.Event) {
				n++
				if string(ev.Backend) != "app" || string(ev.Server) != "srv1" {
					t.Errorf("event names %q/%q", ev.Backend, ev.Server)
				}
			})
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if got != tc.want || n != tc.events {
				t.Fatalf("got %+v and %d events, want %+v and %d", got, n, tc.want, tc.events)
			}
		})
	}
}

func TestDecodeNotifyValues(t *testing.T) {
	var got window.Event
	_, err := DecodeNotify(response(t, "be_x", "s-9", int32(502), "1234"), func(ev window.Event) { got = ev })
	if err != nil || string(got.Backend) != "be_x" || string(got.Server) != "s-9" || got.Status != 502 || got.ResponseMs != 1234 {
		t.Fatalf("got %+v, %v", got, err)
	}
}

// A sampled stanza's answers stand for k each, its 5xx for one: error
// counts stay exact.
func TestDecodeSampled(t *testing.T) {
	sampled := func(status int32, k any) []byte {
		return encodeMessage(t, MessageName, arg{ArgBackend, "app"}, arg{ArgServer, "srv1"},
			arg{ArgStatus, status}, arg{ArgTr, "3"}, arg{ArgSample, k})
	}
	tests := []struct {
		name      string
		payload   []byte
		count     int // the event's Count; 0 is one answer
		events    int
		invalid   int
		sampled   int // events a sampled stanza sent, the 5xx included
		wantCount bool
	}{
		{"a 200 of one in 16", sampled(200, int32(16)), 16, 1, 0, 1, true},
		{"a 500 is itself", sampled(500, int32(16)), 0, 1, 0, 1, true},
		{"a 404 of one in 4", sampled(404, int32(4)), 4, 1, 0, 1, true},
		{"k of 1", sampled(200, int32(1)), 0, 1, 0, 0, true},
		{"k of 0", sampled(200, int32(0)), 0, 0, 1, 0, false},
		{"k past the bound", sampled(200, int32(MaxSample+1)), 0, 0, 1, 0, false},
		{"k as text", sampled(200, "sixteen"), 0, 0, 1, 0, false},
		{"no sample argument", response(t, "app", "srv1", int32(200), "3"), 0, 1, 0, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []window.Event
			res, err := DecodeNotify(tc.payload, func(ev window.Event) { got = append(got, ev) })
			if err != nil || res.Events != tc.events || res.Invalid != tc.invalid || res.Sampled != tc.sampled {
				t.Fatalf("%+v, %v; want %d events, %d invalid, %d sampled", res, err, tc.events, tc.invalid, tc.sampled)
			}
			if tc.wantCount && got[0].Count != tc.count {
				t.Fatalf("count %d, want %d", got[0].Count, tc.count)
			}
		})
	}
}

func TestDecodeNotifyAllocatesNothing(t *testing.T) {
	p := response(t, "app", "srv1", int32(200), "12")
	sink := func(window.Event) {}
	if n := testing.AllocsPerRun(1000, func() { _, _ = DecodeNotify(p, sink) }); n != 0 {
		t.Fatalf("%v allocations per message", n)
	}
}

// notifyFrame wraps a payload into a NOTIFY frame.
func notifyFrame(streamID, frameID uint64, payload []byte) []byte {
	var tmp [10]byte
	b := []byte{0, 0, 0, 0, byte(frame.TypeNotify), 0, 0, 0, 1}
	n := varint.PutUvarint(tmp[:], streamID)
	b = append(b, tmp[:n]...)
	n = varint.PutUvarint(tmp[:], frameID)
	b = append(b, tmp[:n]...)
	b = append(b, payload...)
	binary.BigEndian.PutUint32(b, uint32(len(b)-4))
	return b
}

func startServer(t *testing.T, sink window.Sink) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Sink: sink, Log: zerolog.Nop()}
	ctx, cancel := contextWithCancel(t)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

// TestHandshakeAndAckWithNegasusClient uses negasus's own SPOP client as
// the peer: hello, a NOTIFY answered by an ACK carrying its ids.
func TestHandshakeAndAckWithNegasusClient(t *testing.T) {
	rec := &recorder{}
	srv, addr := startServer(t, rec)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl := client.NewClient(c)
	if err := cl.Init(); err != nil {
		t.Fatalf("hello: %v", err)
	}
	br := bufio.NewReader(c)
	for i := uint64(1); i <= 3; i++ {
		if _, err := c.Write(notifyFrame(i, 7, response(t, "app", "srv1", int32(200), "5"))); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		ack, err := readAgentFrame(br)
		if err != nil {
			t.Fatalf("read ack: %v", err)
		}
		if ack.Type != frame.TypeAgentAck || ack.StreamID != i || ack.FrameID != 7 {
			t.Fatalf("ack %+v", ack)
		}
	}
	if got := len(rec.list()); got != 3 {
		t.Fatalf("%d events recorded", got)
	}
	if srv.Counters.Events.Load() != 3 || srv.Counters.Frames.Load() != 3 {
		t.Fatalf("counters events=%d frames=%d", srv.Counters.Events.Load(), srv.Counters.Frames.Load())
	}
}

func helloFrame(t testing.TB, healthcheck bool) []byte {
	f := frame.AcquireFrame()
	defer frame.ReleaseFrame(f)
	f.Type = frame.TypeHaproxyHello
	f.KV.Add("supported-versions", "2.0")
	f.KV.Add("max-frame-size", uint32(16380))
	f.KV.Add("capabilities", "pipelining,async")
	f.KV.Add("engine-id", "test")
	if healthcheck {
		f.KV.Add("healthcheck", true)
	}
	var b bytes.Buffer
	if _, err := f.Encode(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A malformed message is counted and acked; the connection carries on.
func TestMalformedMessageCountedAndAcked(t *testing.T) {
	rec := &recorder{}
	srv := &Server{Sink: rec, Log: zerolog.Nop()}
	in := bytes.NewBuffer(helloFrame(t, false))
	in.Write(notifyFrame(1, 1, response(t, "app", "srv1", "bad", "1")))
	in.Write(notifyFrame(2, 1, []byte{0x30, 'x'})) // truncated name
	in.Write(notifyFrame(3, 1, response(t, "app", "srv1", int32(500), "3")))
	var out bytes.Buffer
	err := srv.ServeConn(bufio.NewReader(in), bufio.NewWriter(&out))
	if err != io.EOF {
		t.Fatalf("ServeConn: %v", err)
	}
	if got := srv.Counters.IngestErrors.Load(); got != 2 {
		t.Fatalf("ingest errors %d, want 2", got)
	}
	if got := rec.list(); len(got) != 1 {
		t.Fatalf("events %v", got)
	}
	acks := 0
	br := bufio.NewReader(&out)
	for {
		f, err := readAgentFrame(br)
		if err != nil {
			break
		}
		if f.Type == frame.TypeAgentAck {
			acks++
		}
	}
	if acks != 3 {
		t.Fatalf("%d acks, want 3", acks)
	}
}

func TestProtocolErrorsDisconnect(t *testing.T) {
	tests := []struct {
		name  string
		input []byte
	}{
		{"notify before hello", notifyFrame(1, 1, nil)},
		{"frame too short", []byte{0, 0, 0, 2, 3, 0}},
		{"frame too long", []byte{0, 0, 0xff, 0xff, 3}},
		{"ids truncated", []byte{0, 0, 0, 7, 1, 0, 0, 0, 1, 0xff, 0xff}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := &Server{Sink: &recorder{}, Log: zerolog.Nop()}
			var out bytes.Buffer
			err := srv.ServeConn(bufio.NewReader(bytes.NewReader(tc.input)), bufio.NewWriter(&out))
			if err == nil {
				t.Fatal("no error")
			}
			f, rerr := readAgentFrame(&out)
			if rerr != nil || f.Type != frame.TypeAgentDisconnect {
				t.Fatalf("reply %v, %v", f.Type, rerr)
			}
			if srv.Counters.IngestErrors.Load() != 1 {
				t.Fatal("not counted")
			}
		})
	}
}

func TestHealthcheckEndsAfterHello(t *testing.T) {
	srv := &Server{Sink: &recorder{}, Log: zerolog.Nop()}
	var out bytes.Buffer
	if err := srv.ServeConn(bufio.NewReader(bytes.NewReader(helloFrame(t, true))), bufio.NewWriter(&out)); err != nil {
		t.Fatal(err)
	}
	f, err := readAgentFrame(&out)
	if err != nil || f.Type != frame.TypeAgentHello {
		t.Fatalf("reply %v %v", f.Type, err)
	}
}

// FuzzDecodeNotify: no payload makes the decoder panic, and every event it
// emits has names and a valid status.
func FuzzDecodeNotify(f *testing.F) {
	f.Add(response(f, "app", "srv1", int32(200), "12"))
	f.Add(response(f, "app", nil, int32(503), "-1"))
	f.Add(encodeMessage(f, "other", arg{"ip", []byte{1, 2, 3, 4}}))
	f.Add([]byte{0x30, 'x'})
	f.Fuzz(func(t *testing.T, payload []byte) {
		_, _ = DecodeNotify(payload, func(ev window.Event) {
			if len(ev.Backend) == 0 || len(ev.Server) == 0 || ev.Status < 100 || ev.Status > 999 {
				t.Fatalf("invalid event %+v", ev)
			}
		})
	})
}

// FuzzServeConn: any byte stream from a peer ends in an error or EOF,
// never a panic (ServeConn's recover would count one: we fail on it).
func FuzzServeConn(f *testing.F) {
	hello := helloFrame(f, false)
	f.Add(append(append([]byte{}, hello...), notifyFrame(1, 1, response(f, "a", "b", int32(200), "1"))...))
	f.Add(hello)
	f.Add([]byte{0, 0, 0, 7, 1, 0, 0, 0, 1, 0, 0})
	f.Fuzz(func(t *testing.T, in []byte) {
		srv := &Server{Sink: window.New(time.Minute, 16, nil), Log: zerolog.Nop()}
		err := srv.ServeConn(bufio.NewReader(bytes.NewReader(in)), bufio.NewWriter(io.Discard))
		if err != nil && bytes.Contains([]byte(err.Error()), []byte("panic")) {
			t.Fatal(err)
		}
	})
}

func BenchmarkDecodeNotify(b *testing.B) {
	p := response(b, "app", "srv1", int32(200), "12")
	s := window.New(time.Minute, 16, nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		_, _ = DecodeNotify(p, s.Record)
	}
}

// BenchmarkServerNotify is the per-frame work on a connection's goroutine:
// decode through the Sink interface into a window store.
func BenchmarkServerNotify(b *testing.B) {
	p := response(b, "app", "srv1", int32(200), "12")
	s := &Server{Sink: window.New(time.Minute, 16, nil), Log: zerolog.Nop()}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		s.notify(p)
	}
}

// A flood of unknown backend/server names keeps memory bounded: the store
// holds at most its max-servers series, and the rest are counted as dropped.
func TestNameFloodIsBounded(t *testing.T) {
	store := window.New(time.Minute, 100, nil)
	srv := &Server{Sink: store, Log: zerolog.Nop()}
	in := bytes.NewBuffer(helloFrame(t, false))
	for i := 0; i < 10000; i++ {
		in.Write(notifyFrame(uint64(i+1), 1, response(t, "be", fmt.Sprintf("flood-%d", i), int32(200), "1")))
	}
	if err := srv.ServeConn(bufio.NewReader(in), bufio.NewWriter(io.Discard)); err != io.EOF {
		t.Fatal(err)
	}
	if store.Len() != 100 || store.Dropped() != 9900 || srv.Counters.Events.Load() != 10000 {
		t.Fatalf("series %d, dropped %d, events %d", store.Len(), store.Dropped(), srv.Counters.Events.Load())
	}
}
