package peers

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
)

// The fleet port's bounds, against anyone who can reach it, key or no
// key. memberlist's own transport accepts every connection and, for a
// stream that says it is encrypted, reads as many bytes as it announces
// (up to 20 MiB) before it checks the key: 20 keyless connections once
// took an agent from 12 MB to about 1 GB, and 1,100 idle ones used every
// file descriptor it had.
const (
	// MaxStreams bounds the fleet port's connections open at once, and
	// MaxStreamsPerPeer those from one address. At either, the oldest
	// that has not yet shown a header within bounds is closed to make
	// room; when every one has, the new one is closed instead, so that a
	// burst of joins (a fleet restarted at once) completes its push-pulls
	// rather than evicting them in turn.
	MaxStreams        = 64
	MaxStreamsPerPeer = 8
	// MaxStream bounds the length a stream may announce: none of
	// hapilot's messages, nor memberlist's membership state of a fleet
	// far larger than fleet-sim's, comes near it. A longer one is closed
	// at its length, before its body is read.
	MaxStream = maxEnvelope
)

// memberlist's stream framing, as far as the length of an encrypted
// stream (memberlist's net.go and label.go, v0.7.0).
const (
	mlEncrypt = 10  // encryptMsg: 4 bytes of length follow
	mlLabel   = 244 // hasLabelMsg: a length byte and the label follow
)

// transport is memberlist's transport with the fleet port's bounds, and
// the way in and out of hapilot's own envelopes (seal.go): a packet or a
// stream that opens with the envelope's mark goes to deliver, with its
// source address; everything else goes to memberlist.
type transport struct {
	memberlist.NodeAwareTransport
	deliver func(env []byte, from netip.AddrPort, stream bool)
	// life bounds a stream's whole life from its accept, whoever sets
	// its deadlines (memberlist renews them).
	life     time.Duration
	counters *Counters
	log      zerolog.Logger

	packets chan *memberlist.Packet
	streams chan net.Conn

	mu     sync.Mutex // guards open and byPeer: the accepts, the streams' closes and Open
	open   map[*streamConn]struct{}
	byPeer map[netip.Addr]int

	done     chan struct{}
	wg       sync.WaitGroup
	shutdown sync.Once
}

func newTransport(inner memberlist.Transport, life time.Duration, counters *Counters, log zerolog.Logger,
	deliver func([]byte, netip.AddrPort, bool)) *transport {
	na, ok := inner.(memberlist.NodeAwareTransport)
	if !ok {
		na = nodeAware{inner}
	}
	t := &transport{NodeAwareTransport: na, deliver: deliver, life: life, counters: counters, log: log,
		packets: make(chan *memberlist.Packet), streams: make(chan net.Conn),
		open: map[*streamConn]struct{}{}, byPeer: map[netip.Addr]int{}, done: make(chan struct{})}
	t.wg.Add(2)
	go t.packetPump()
	go t.streamPump()
	return t
}

// nodeAware is memberlist's own shim for a transport that is not
// node-aware.
type nodeAware struct{ memberlist.Transport }

func (n nodeAware) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return n.WriteTo(b, a.Addr)
}

func (n nodeAware) DialAddressTimeout(a memberlist.Address, d time.Duration) (net.Conn, error) {
	return n.DialTimeout(a.Addr, d)
}

func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packets }
func (t *transport) StreamCh() <-chan net.Conn           { return t.streams }

// Shutdown stops the inner transport first, while memberlist still takes
// what it hands up (its listeners block until it is taken), then the
// pumps and every stream still open.
func (t *transport) Shutdown() error {
	var err error
	t.shutdown.Do(func() {
		err = t.NodeAwareTransport.Shutdown()
		close(t.done)
		t.mu.Lock()
		for c := range t.open {
			c.Conn.Close()
		}
		t.mu.Unlock()
		t.wg.Wait()
	})
	return err
}

func (t *transport) packetPump() {
	defer t.wg.Done()
	in := t.NodeAwareTransport.PacketCh()
	for {
		select {
		case <-t.done:
			return
		case p := <-in:
			if len(p.Buf) > 0 && p.Buf[0] == envelopeMagic {
				t.deliver(p.Buf, addrPort(p.From), false)
				continue
			}
			select {
			case t.packets <- p:
			case <-t.done:
				return
			}
		}
	}
}

func (t *transport) streamPump() {
	defer t.wg.Done()
	in := t.NodeAwareTransport.StreamCh()
	for {
		select {
		case <-t.done:
			return
		case c := <-in:
			if sc := t.admit(c); sc != nil {
				t.wg.Add(1)
				go t.classify(sc)
			}
		}
	}
}

// streamConn is one accepted stream, counted until it closes.
type streamConn struct {
	net.Conn
	t    *transport
	peer netip.Addr // the zero Addr for a transport without IP addresses
	born time.Time
	end  time.Time
	// shown: its header was read and within bounds; it is memberlist's
	// or being read whole, and is not evicted for a newcomer.
	shown atomic.Bool
	once  sync.Once
}

func (c *streamConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.t.release(c) })
	return err
}

func (c *streamConn) clamp(t time.Time) time.Time {
	if t.IsZero() || t.After(c.end) {
		return c.end
	}
	return t
}

func (c *streamConn) SetDeadline(t time.Time) error      { return c.Conn.SetDeadline(c.clamp(t)) }
func (c *streamConn) SetReadDeadline(t time.Time) error  { return c.Conn.SetReadDeadline(c.clamp(t)) }
func (c *streamConn) SetWriteDeadline(t time.Time) error { return c.Conn.SetWriteDeadline(c.clamp(t)) }

// admit counts c in, and makes room for it: at the per-peer cap among
// its own address's streams, at the fleet port's cap among all, the
// oldest that has shown no header goes. A keyless flood of idle
// connections evicts itself; a peer elsewhere always gets in. When every
// stream in the way has shown its header, c is closed instead (nil).
func (t *transport) admit(c net.Conn) *streamConn {
	now := time.Now()
	sc := &streamConn{Conn: c, t: t, peer: addrPort(c.RemoteAddr()).Addr(), born: now, end: now.Add(t.life)}
	t.mu.Lock()
	var victim *streamConn
	full := true
	switch {
	case sc.peer.IsValid() && t.byPeer[sc.peer] >= MaxStreamsPerPeer:
		victim = t.oldest(func(o *streamConn) bool { return o.peer == sc.peer })
	case len(t.open) >= MaxStreams:
		victim = t.oldest(func(*streamConn) bool { return true })
	default:
		full = false
	}
	if full && victim == nil {
		t.mu.Unlock()
		c.Close()
		t.counters.StreamsEvicted.Add(1)
		return nil
	}
	if victim != nil {
		t.forget(victim)
	}
	t.open[sc] = struct{}{}
	t.byPeer[sc.peer]++
	t.mu.Unlock()
	_ = c.SetDeadline(sc.end)
	if victim != nil {
		victim.Conn.Close()
		t.counters.StreamsEvicted.Add(1)
	}
	return sc
}

// oldest is the longest-open stream of those in scope that has shown no
// header. Callers hold t.mu.
func (t *transport) oldest(scope func(*streamConn) bool) *streamConn {
	var o *streamConn
	for c := range t.open {
		if scope(c) && !c.shown.Load() && (o == nil || c.born.Before(o.born)) {
			o = c
		}
	}
	return o
}

// forget stops counting c. Callers hold t.mu.
func (t *transport) forget(c *streamConn) {
	if _, ok := t.open[c]; !ok {
		return
	}
	delete(t.open, c)
	if t.byPeer[c.peer]--; t.byPeer[c.peer] <= 0 {
		delete(t.byPeer, c.peer)
	}
}

func (t *transport) release(c *streamConn) {
	t.mu.Lock()
	t.forget(c)
	t.mu.Unlock()
}

// Open is how many streams are open now.
func (t *transport) Open() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.open)
}

// classify reads a stream's first bytes: a hapilot envelope is read here,
// a memberlist stream announcing more than MaxStream is closed at its
// length, and any other goes to memberlist with its first bytes.
func (t *transport) classify(c *streamConn) {
	defer t.wg.Done()
	r := bufio.NewReaderSize(c, 512)
	first, err := r.Peek(1)
	if err != nil {
		c.Close()
		return
	}
	if first[0] == envelopeMagic {
		defer c.Close()
		env, err := readEnvelope(r, &c.shown)
		if err != nil {
			t.refuse(c, err)
			return
		}
		t.deliver(env, addrPort(c.RemoteAddr()), true)
		return
	}
	n, ok := announced(r)
	if ok && n > MaxStream {
		t.refuse(c, fmt.Errorf("a stream announcing %d bytes, over the %d any member sends", n, MaxStream))
		c.Close()
		return
	}
	// Another kind (a plaintext one memberlist refuses at once, or one
	// cut short) has shown nothing worth keeping it for.
	c.shown.Store(ok)
	select {
	case t.streams <- &peeked{streamConn: c, r: r}:
	case <-t.done:
		c.Close()
	}
}

func (t *transport) refuse(c net.Conn, err error) {
	if t.counters.StreamsRefused.Add(1)%100 == 1 {
		t.log.Warn().Err(err).Str("from", c.RemoteAddr().String()).Msg("fleet: stream refused (logged once, then every hundredth)")
	}
}

// readEnvelope reads 'H', a length and an envelope of at most
// maxEnvelope bytes; shown is set once the length is read and within it.
func readEnvelope(r *bufio.Reader, shown *atomic.Bool) ([]byte, error) {
	hdr, err := r.Peek(5)
	if err != nil {
		return nil, fmt.Errorf("envelope header: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[1:5])
	if n > maxEnvelope {
		return nil, fmt.Errorf("an envelope of %d bytes, over the %d any member sends", n, maxEnvelope)
	}
	shown.Store(true)
	_, _ = r.Discard(5)
	env := make([]byte, n)
	if _, err := io.ReadFull(r, env); err != nil {
		return nil, fmt.Errorf("envelope of %d bytes: %w", n, err)
	}
	return env, nil
}

// announced is the length an encrypted memberlist stream announces, read
// without consuming it; ok is false for a stream of another kind, which
// memberlist refuses or reads by its own bounds.
func announced(r *bufio.Reader) (n uint32, ok bool) {
	at := 0
	b, err := r.Peek(2)
	if err == nil && b[0] == mlLabel {
		at = 2 + int(b[1])
	}
	b, err = r.Peek(at + 5)
	if err != nil || b[at] != mlEncrypt {
		return 0, false
	}
	return binary.BigEndian.Uint32(b[at+1 : at+5]), true
}

// peeked is a stream with its first bytes in r.
type peeked struct {
	*streamConn
	r *bufio.Reader
}

func (p *peeked) Read(b []byte) (int, error) { return p.r.Read(b) }

// addrPort is a's address and port; the zero AddrPort for an address
// that is not IP (memberlist's in-memory network).
func addrPort(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.TCPAddr:
		return unmap(a.AddrPort())
	case *net.UDPAddr:
		return unmap(a.AddrPort())
	case nil:
		return netip.AddrPort{}
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return unmap(ap)
}

// unmap writes an IPv4 address as IPv4, however the socket gave it.
func unmap(ap netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) }

// sendEnvelope writes env to a member over the stream transport, for a
// message larger than a packet.
func (t *transport) sendEnvelope(to memberlist.Address, env []byte, timeout time.Duration) error {
	c, err := t.NodeAwareTransport.DialAddressTimeout(to, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	hdr := [5]byte{envelopeMagic}
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(env)))
	if _, err := c.Write(append(hdr[:], env...)); err != nil {
		return fmt.Errorf("send to %s: %w", to.Name, err)
	}
	return nil
}

// sendPacket writes env to a member in one packet.
func (t *transport) sendPacket(to memberlist.Address, env []byte) error {
	_, err := t.NodeAwareTransport.WriteToAddress(env, to)
	return err
}
