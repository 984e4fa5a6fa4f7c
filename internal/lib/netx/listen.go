package netx

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// SocketMode is the mode of the unix sockets the agent listens on: its
// own user and its group (haproxy, in the package), and nobody else, so
// that only HAProxy can send it evidence.
const SocketMode = 0o660

// Listen listens on "unix:/path" or "host:port", read as ParseAddress
// reads a listen flag (see ListenAddress).
func Listen(addr string) (net.Listener, error) {
	a, err := ParseAddress("listen", addr, TCP, Unix)
	if err != nil {
		return nil, err
	}
	return ListenAddress(a)
}

// ListenAddress opens a stream listener at a: a Unix socket of mode
// SocketMode, a stale socket file from an earlier run replaced, or TCP,
// for an HAProxy on another host.
func ListenAddress(a Address) (net.Listener, error) {
	switch a.Network {
	case TCP:
		ln, err := net.Listen("tcp", a.Addr)
		if err != nil {
			return nil, fmt.Errorf("listen %s: %w%s", a.Addr, err, Hint(err))
		}
		return ln, nil
	case Unix:
		return listenUnix(a.Addr)
	case Abstract:
		return listenAbstract(a)
	}
	return nil, fmt.Errorf("listen %s: not a stream address", a)
}

func listenUnix(path string) (net.Listener, error) {
	// The folder is made when missing (as systemd's RuntimeDirectory
	// would), readable by the agent's group for HAProxy to reach the socket.
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("listen unix %s: %w", path, err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	// The socket is created with the umask's mode; it is made group-only
	// before the first connection can be accepted.
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen unix %s: %w", path, err)
	}
	if err := os.Chmod(path, SocketMode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen unix %s: %w", path, err)
	}
	return ln, nil
}

// Hint says what to do about a listen error an operator commonly meets;
// "" for others.
func Hint(err error) string {
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return " (another program, perhaps another hapilot, listens there: stop it, or give this flag another address)"
	case errors.Is(err, syscall.EACCES):
		return " (no permission: a port below 1024 needs privileges; pick a higher one)"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		return " (no interface of this host has that address)"
	}
	return ""
}

// ListenUnixgram listens for datagrams on a unix socket at path, made as
// Listen makes a stream one: mode SocketMode, its folder made when
// missing, a socket file of an earlier run replaced, anything else at
// path refused.
func ListenUnixgram(path string) (net.PacketConn, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("listen unixgram %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("listen unixgram %s: a file that is not a socket is in the way", path)
		}
		if err := os.Remove(path); err != nil { // a datagram socket cannot be asked whether it is live
			return nil, fmt.Errorf("listen unixgram %s: %w", path, err)
		}
	}
	pc, err := net.ListenPacket("unixgram", path)
	if err != nil {
		return nil, fmt.Errorf("listen unixgram %s: %w", path, err)
	}
	if err := os.Chmod(path, SocketMode); err != nil {
		pc.Close()
		return nil, fmt.Errorf("listen unixgram %s: %w", path, err)
	}
	return pc, nil
}

// removeStale removes a socket file nobody answers on: what a killed
// agent leaves behind. Anything else at path is left and reported. A
// socket this user may not connect to (EACCES: one a root agent made,
// killed with -9 before it could remove it) cannot be asked; the kernel's
// list of listening sockets says whether a process still listens there.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listen unix %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("listen unix %s: a file that is not a socket is in the way", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("listen unix %s: another process answers on it", path)
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
	case errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.EPERM):
		live, lerr := listening(path)
		switch {
		case lerr != nil:
			return fmt.Errorf("listen unix %s: a socket this user may not connect to is there (%v), and whether a process listens on it cannot be told (%v): "+
				"if no agent runs, remove it (sudo rm %s), or give this flag another path", path, err, lerr, path)
		case live:
			return fmt.Errorf("listen unix %s: another user's process listens on it (connect: permission denied): "+
				"stop that process (a hapilot started as root?), or give this flag another path", path)
		}
	default:
		return fmt.Errorf("listen unix %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("listen unix %s: a stale socket, left by a process that died (a hapilot started as root and killed?), is in the way and cannot be removed (%w): sudo rm %s",
			path, err, path)
	}
	return nil
}

// procNetUnix lists the host's unix sockets (Linux).
var procNetUnix = "/proc/net/unix"

// listening reports whether a process listens on the unix socket at
// path, from the kernel's list: a bound socket in the listening state
// (flag __SO_ACCEPTCON) names its path there until it is closed.
func listening(path string) (bool, error) {
	b, err := os.ReadFile(procNetUnix)
	if err != nil {
		return false, err
	}
	abs, _ := filepath.Abs(path)
	const acceptCon = 0x10000
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// Num RefCount Protocol Flags Type St Inode Path
		f := strings.Fields(line)
		if len(f) < 8 || (f[7] != path && f[7] != abs) {
			continue
		}
		if flags, err := strconv.ParseUint(f[3], 16, 32); err == nil && flags&acceptCon != 0 {
			return true, nil
		}
	}
	return false, nil
}

// IsLoopback reports whether a "host:port" listens on loopback only.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
