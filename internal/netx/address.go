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
)

// Address is one listener's parsed setting: where it listens, or Off.
// Every listen flag is read through ParseAddress, so that "off" and ""
// mean the same for each, and every scheme is spelled one way.
type Address struct {
	Network Network
	// Addr is host:port for TCP and UDP, the path for Unix and Unixgram.
	Addr string
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
	}
	return string(a.Network) + "://" + a.Addr
}

// ParseAddress reads a listen flag's value: "" or "off"; "unix:/path" or
// "unix:///path"; "unixgram:///path"; "udp://host:port"; "tcp://host:port"
// or "host:port". A network the listener does not take (allowed) is an
// error that names the forms it does.
func ParseAddress(flag, s string, allowed ...Network) (Address, error) {
	var a Address
	switch {
	case s == "" || s == "off":
		return Address{}, nil
	case strings.HasPrefix(s, "unix://"):
		a = Address{Unix, strings.TrimPrefix(s, "unix://")}
	case strings.HasPrefix(s, "unix:"):
		a = Address{Unix, strings.TrimPrefix(s, "unix:")}
	case strings.HasPrefix(s, "unixgram://"):
		a = Address{Unixgram, strings.TrimPrefix(s, "unixgram://")}
	case strings.HasPrefix(s, "udp://"):
		a = Address{UDP, strings.TrimPrefix(s, "udp://")}
	case strings.HasPrefix(s, "tcp://"):
		a = Address{TCP, strings.TrimPrefix(s, "tcp://")}
	default:
		a = Address{TCP, s}
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
	}
	return nil, fmt.Errorf("listen %s: not a datagram address", a)
}
