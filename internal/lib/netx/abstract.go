package netx

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// Why abstract sockets: Debian's and Ubuntu's stock haproxy.cfg chroots
// HAProxy into /var/lib/haproxy, and HAProxy connects to a server's
// unix@/path after the chroot, so a socket under /run is out of its
// reach. A name in Linux's abstract namespace has no file: HAProxy
// reaches it from inside any chroot (abns@ in HAProxy since 1.5, for
// servers, rings, logs and Lua's core.tcp alike). Having no file, it has
// no mode either, so every peer's credentials are checked instead
// (SO_PEERCRED on a stream, SCM_CREDENTIALS on each datagram), against
// what a 0660 socket owned by the agent's user and group would let in,
// plus HAProxy's group.
//
// HAProxy's abns@ addresses fill the whole sun_path: the name, then NULs
// to its 108 bytes (HAProxy 3.1 added abnsz@ for the short form other
// programs use). An agent that bound the short form would never be
// reached, so the listener pads the name the way HAProxy does.

// abstractPath is name as a Go unix address for HAProxy's abns@NAME: "@"
// (the leading NUL) and the name padded with NULs to sun_path's length.
func abstractPath(name string) string {
	return "@" + name + strings.Repeat("\x00", MaxAbstractName-len(name))
}

// Peers are the users and groups that may connect to an abstract socket.
// A peer is let in when its user is one of UIDs, or its group or one of
// its supplementary groups is one of GIDs.
type Peers struct {
	UIDs []int
	GIDs []int
	// Why names the allowed users and groups, for the refusal's message.
	Why string
}

// DefaultPeers lets in what a 0660 socket owned by the agent's user and
// group lets in (those, and root), and the group named group when it
// exists ("haproxy": the user HAProxy's stock config drops to). An empty
// group adds none; a group that does not exist is skipped, since the agent
// may run where HAProxy is not installed under that name.
func DefaultPeers(group string) *Peers {
	uid, gid := os.Geteuid(), os.Getegid()
	p := &Peers{UIDs: []int{0, uid}, GIDs: []int{gid}}
	names := []string{"uid 0", "uid " + strconv.Itoa(uid), "gid " + strconv.Itoa(gid)}
	if group != "" {
		if g, err := user.LookupGroup(group); err == nil {
			if id, err := strconv.Atoi(g.Gid); err == nil && !slices.Contains(p.GIDs, id) {
				p.GIDs = append(p.GIDs, id)
				names = append(names, "group "+group+" (gid "+g.Gid+")")
			}
		}
	}
	p.Why = strings.Join(names, ", ")
	return p
}

// Cred is a peer's credentials, as the kernel gives them.
type Cred struct {
	PID, UID, GID int
	// Groups are the supplementary groups; nil where the kernel does not
	// give them (SO_PEERGROUPS came in Linux 4.13; datagrams carry none).
	Groups []int
}

func (c Cred) String() string {
	return fmt.Sprintf("pid %d uid %d gid %d", c.PID, c.UID, c.GID)
}

// Allows reports whether c may connect.
func (p *Peers) Allows(c Cred) bool {
	if slices.Contains(p.UIDs, c.UID) || slices.Contains(p.GIDs, c.GID) {
		return true
	}
	for _, g := range c.Groups {
		if slices.Contains(p.GIDs, g) {
			return true
		}
	}
	return false
}

// Refusals counts the peers an abstract socket turned away, and keeps the
// last one, so that an agent that hears nothing can say who knocked.
type Refusals struct {
	Count atomic.Uint64
	last  atomic.Pointer[Cred]
}

// Last is the last peer refused; false when none was.
func (r *Refusals) Last() (Cred, bool) {
	c := r.last.Load()
	if c == nil {
		return Cred{}, false
	}
	return *c, true
}

func (r *Refusals) add(c Cred) {
	r.Count.Add(1)
	r.last.Store(&c)
}

// PeerListener is an abstract stream listener that accepts only the
// peers Peers allows: any other connection is closed at once, counted in
// Refused, and never returned by Accept.
type PeerListener struct {
	net.Listener
	Peers   *Peers
	Refused Refusals
}

func listenAbstract(a Address) (net.Listener, error) {
	ln, err := net.Listen("unix", abstractPath(a.Addr))
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w%s", a, err, Hint(err))
	}
	peers := a.Peers
	if peers == nil {
		peers = DefaultPeers("")
	}
	return &PeerListener{Listener: ln, Peers: peers}, nil
}

// Addr names the socket as HAProxy's configuration does, without the
// padding.
func (l *PeerListener) Addr() net.Addr { return abstractAddr{Abstract, l.Listener.Addr()} }

// Accept returns the next connection from an allowed peer. A peer whose
// credentials cannot be read is refused too.
func (l *PeerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cred, err := PeerCred(c)
		if err == nil && l.Peers.Allows(cred) {
			return c, nil
		}
		l.Refused.add(cred)
		c.Close()
	}
}

// PeerCred reads the credentials of a unix stream connection's peer, as
// they were when it connected.
func PeerCred(c net.Conn) (Cred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return Cred{}, fmt.Errorf("peer credentials: %T is not a unix connection", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var cred Cred
	var cerr error
	err = raw.Control(func(fd uintptr) {
		u, err := syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
		if err != nil {
			cerr = err
			return
		}
		cred = Cred{PID: int(u.Pid), UID: int(u.Uid), GID: int(u.Gid), Groups: peerGroups(fd)}
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	return cred, nil
}

// soPeerGroups is Linux's SO_PEERGROUPS (4.13), which syscall lacks.
const soPeerGroups = 59

// peerGroups reads the peer's supplementary groups; nil when the kernel
// gives none.
func peerGroups(fd uintptr) []int {
	var buf [64]uint32
	n := uint32(unsafe.Sizeof(buf))
	_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.SOL_SOCKET, soPeerGroups,
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 {
		return nil
	}
	gs := make([]int, 0, n/4)
	for _, g := range buf[:min(int(n/4), len(buf))] {
		gs = append(gs, int(g))
	}
	return gs
}

// abstractAddr prints an abstract socket's address as abns@NAME.
type abstractAddr struct {
	network Network
	inner   net.Addr
}

func (a abstractAddr) Network() string { return a.inner.Network() }
func (a abstractAddr) String() string {
	return string(a.network) + "@" + strings.TrimRight(strings.TrimPrefix(a.inner.String(), "@"), "\x00")
}

// PeerPacketConn is an abstract datagram socket that drops every
// datagram whose sender Peers does not allow: the kernel attaches each
// sender's credentials (SO_PASSCRED), so none can be forged.
type PeerPacketConn struct {
	*net.UnixConn
	Peers   *Peers
	Refused Refusals
	oob     []byte // the control messages' buffer: ReadFrom has one caller
}

func listenAbstractGram(a Address) (net.PacketConn, error) {
	uc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: abstractPath(a.Addr), Net: "unixgram"})
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w%s", a, err, Hint(err))
	}
	raw, err := uc.SyscallConn()
	if err == nil {
		cerr := raw.Control(func(fd uintptr) {
			err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_PASSCRED, 1)
		})
		err = errors.Join(err, cerr)
	}
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("listen %s: asking for senders' credentials: %w", a, err)
	}
	peers := a.Peers
	if peers == nil {
		peers = DefaultPeers("")
	}
	return &PeerPacketConn{UnixConn: uc, Peers: peers}, nil
}

// LocalAddr names the socket as HAProxy's configuration does.
func (p *PeerPacketConn) LocalAddr() net.Addr {
	return abstractAddr{AbstractGram, p.UnixConn.LocalAddr()}
}

// ReadFrom returns the next datagram from an allowed sender; others are
// dropped and counted.
func (p *PeerPacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	if p.oob == nil {
		p.oob = make([]byte, syscall.CmsgSpace(syscall.SizeofUcred))
	}
	for {
		n, oobn, _, addr, err := p.ReadMsgUnix(b, p.oob)
		if err != nil {
			return n, addr, err
		}
		cred, ok := datagramCred(p.oob[:oobn])
		if ok && p.Peers.Allows(cred) {
			return n, addr, nil
		}
		p.Refused.add(cred)
	}
}

// datagramCred reads the sender's credentials from a datagram's control
// messages.
func datagramCred(oob []byte) (Cred, bool) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return Cred{}, false
	}
	for _, m := range msgs {
		if u, err := syscall.ParseUnixCredentials(&m); err == nil {
			return Cred{PID: int(u.Pid), UID: int(u.Uid), GID: int(u.Gid)}, true
		}
	}
	return Cred{}, false
}
