package netx

import (
	"fmt"
	"net"
	"strings"
)

// Network is the kind of socket a listener opens.
type Network string

const (
	TCP      Network = "tcp"
	Unix     Network = "unix"     // a stream socket at a path, mode 0660
	UDP      Network = "udp"      // syslog datagrams
	Unixgram Network = "unixgram" // syslog datagrams at a path
	// Abstract is a stream socket in Linux's abstract namespace, named as
	// HAProxy names it (abns@NAME): no file, so HAProxy reaches it from
	// inside its chroot, and each peer's credentials are checked instead
	// of a file's mode (PeerCheck).
	Abstract Network = "abns"
	// AbstractGram is the datagram kind, for `log abns@NAME`.
	AbstractGram Network = "abnsgram"
)

// MaxAbstractName is the longest abstract name: sun_path's 108 bytes
// less the leading NUL.
const MaxAbstractName = 107

// Address is one listener's parsed setting: where it listens, or Off.
// Every listen flag is read through ParseAddress, so that "off" and ""
// mean the same for each, and every scheme is spelled one way.
type Address struct {
	Network Network
	// Addr is host:port for TCP and UDP, the path for Unix and Unixgram,
	// the name (without abns@) for Abstract and AbstractGram.
	Addr string
	// Peers says who may connect to an abstract socket; nil lets in only
	// the agent's own user and group, and root (DefaultPeers with no
	// group).
	Peers *Peers
}

// Off reports whether the listener is turned off.
func (a Address) Off() bool { return a.Network == "" }

// String is the address as a flag spells it.
func (a Address) String() string {
	switch a.Network {
	case "":
		return "off"
	case TCP:
		return a.Addr
	case Unix:
		return "unix:" + a.Addr
	case Abstract, AbstractGram:
		return string(a.Network) + "@" + a.Addr
	}
	return string(a.Network) + "://" + a.Addr
}

// ParseAddress reads a listen flag's value: "" or "off"; "unix:/path" or
// "unix:///path"; "unixgram:///path"; "udp://host:port"; "tcp://host:port"
// or "host:port"; "abns@NAME" (or "abns://NAME") and "abnsgram@NAME", the
// abstract names HAProxy's own address prefix gives. A network the listener does not take (allowed) is an
// error that names the forms it does.
func ParseAddress(flag, s string, allowed ...Network) (Address, error) {
	var a Address
	switch {
	case s == "" || s == "off":
		return Address{}, nil
	case strings.HasPrefix(s, "abns@"), strings.HasPrefix(s, "abns://"):
		a = Address{Network: Abstract, Addr: strings.TrimPrefix(strings.TrimPrefix(s, "abns@"), "abns://")}
	case strings.HasPrefix(s, "abnsgram@"), strings.HasPrefix(s, "abnsgram://"):
		a = Address{Network: AbstractGram, Addr: strings.TrimPrefix(strings.TrimPrefix(s, "abnsgram@"), "abnsgram://")}
	case strings.HasPrefix(s, "unix://"):
		a = Address{Network: Unix, Addr: strings.TrimPrefix(s, "unix://")}
	case strings.HasPrefix(s, "unix:"):
		a = Address{Network: Unix, Addr: strings.TrimPrefix(s, "unix:")}
	case strings.HasPrefix(s, "unixgram://"):
		a = Address{Network: Unixgram, Addr: strings.TrimPrefix(s, "unixgram://")}
	case strings.HasPrefix(s, "udp://"):
		a = Address{Network: UDP, Addr: strings.TrimPrefix(s, "udp://")}
	case strings.HasPrefix(s, "tcp://"):
		a = Address{Network: TCP, Addr: strings.TrimPrefix(s, "tcp://")}
	default:
		a = Address{Network: TCP, Addr: s}
	}
	ok := false
	for _, n := range allowed {
		ok = ok || n == a.Network
	}
	if !ok {
		return Address{}, fmt.Errorf("%s %q: want %s, or off", flag, s, forms(allowed))
	}
	switch a.Network {
	case Unix, Unixgram:
		if !strings.HasPrefix(a.Addr, "/") {
			return Address{}, fmt.Errorf("%s %q: a socket path must be absolute", flag, s)
		}
	case Abstract, AbstractGram:
		if a.Addr == "" || len(a.Addr) > MaxAbstractName || strings.ContainsAny(a.Addr, "\x00/ ") {
			return Address{}, fmt.Errorf("%s %q: an abstract name is 1 to %d bytes, without NUL, slash or space", flag, s, MaxAbstractName)
		}
	default:
		if _, port, err := net.SplitHostPort(a.Addr); err != nil || port == "" {
			return Address{}, fmt.Errorf("%s %q: want host:port", flag, s)
		}
	}
	return a, nil
}

func forms(allowed []Network) string {
	var f []string
	for _, n := range allowed {
		switch n {
		case TCP:
			f = append(f, "host:port")
		case Unix:
			f = append(f, "unix:/path")
		case UDP:
			f = append(f, "udp://host:port")
		case Unixgram:
			f = append(f, "unixgram:///path")
		case Abstract:
			f = append(f, "abns@name")
		case AbstractGram:
			f = append(f, "abnsgram@name")
		}
	}
	return strings.Join(f, ", ")
}

// ListenPacketAddress opens a datagram listener at a (UDP or Unixgram).
func ListenPacketAddress(a Address) (net.PacketConn, error) {
	switch a.Network {
	case UDP:
		pc, err := net.ListenPacket("udp", a.Addr)
		if err != nil {
			return nil, fmt.Errorf("listen udp %s: %w%s", a.Addr, err, Hint(err))
		}
		return pc, nil
	case Unixgram:
		return ListenUnixgram(a.Addr)
	case AbstractGram:
		return listenAbstractGram(a)
	}
	return nil, fmt.Errorf("listen %s: not a datagram address", a)
}
