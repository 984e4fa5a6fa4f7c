package spoe

import (
	"errors"
	"fmt"

	"github.com/hapilot/hapilot/internal/lib/bytesconv"
	"github.com/hapilot/hapilot/internal/lib/window"
	"github.com/negasus/haproxy-spoe-go/typeddata"
	"github.com/negasus/haproxy-spoe-go/varint"
)

// MessageName is the spoe-message that carries one response; see
// spoe/hapilot-spoe.conf.
const MessageName = "hapilot-response"

// The message's argument names.
const (
	ArgBackend = "backend"
	ArgServer  = "server"
	ArgStatus  = "status"
	ArgTr      = "tr"
	// ArgSample (optional) is k of a sampled stanza: HAProxy sends every
	// 5xx and one in k of the other answers, so each of those stands for
	// k answers. Errors stay exact and request counts unbiased.
	ArgSample = "sample"
)

// MaxSample bounds k: beyond it a sample says too little to steer by.
const MaxSample = 1024

var errTruncated = errors.New("truncated")

// reader walks a byte slice; every read is bounds-checked, so hostile input
// ends in an error, never a panic.
type reader struct {
	b   []byte
	off int
}

func (r *reader) uvarint() (uint64, error) {
	v, n := varint.Uvarint(r.b[r.off:])
	if n <= 0 {
		return 0, fmt.Errorf("varint at offset %d: %w", r.off, errTruncated)
	}
	r.off += n
	return v, nil
}

func (r *reader) bytes(n uint64) ([]byte, error) {
	if n > uint64(len(r.b)-r.off) {
		return nil, fmt.Errorf("%d bytes at offset %d: %w", n, r.off, errTruncated)
	}
	s := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return s, nil
}

func (r *reader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, fmt.Errorf("byte at offset %d: %w", r.off, errTruncated)
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

func (r *reader) lenBytes() ([]byte, error) {
	n, err := r.uvarint()
	if err != nil {
		return nil, err
	}
	return r.bytes(n)
}

// value is one SPOE typed datum, kept without interface boxing so the
// decoder does not allocate.
type value struct {
	typ  byte
	num  uint64 // integers and booleans
	data []byte // strings, binaries, addresses
}

func (r *reader) value() (value, error) {
	c, err := r.byte()
	if err != nil {
		return value{}, err
	}
	v := value{typ: c & 0x0F}
	switch v.typ {
	case typeddata.TypeNull:
	case typeddata.TypeBoolean:
		v.num = uint64(c>>4) & 1
	case typeddata.TypeInt32, typeddata.TypeUInt32, typeddata.TypeInt64, typeddata.TypeUInt64:
		v.num, err = r.uvarint()
	case typeddata.TypeIPv4:
		v.data, err = r.bytes(4)
	case typeddata.TypeIPv6:
		v.data, err = r.bytes(16)
	case typeddata.TypeString, typeddata.TypeBinary:
		v.data, err = r.lenBytes()
	default:
		err = fmt.Errorf("unknown data type %d at offset %d", v.typ, r.off-1)
	}
	return v, err
}

// integer reads a value HAProxy may send as a number or, from a variable
// filled by set-var-fmt, as a decimal string.
func (v value) integer() (int, bool) {
	switch v.typ {
	case typeddata.TypeInt32:
		return int(int32(v.num)), true
	case typeddata.TypeInt64:
		return int(int64(v.num)), true
	case typeddata.TypeUInt32, typeddata.TypeUInt64:
		if v.num > 1<<31 {
			return 0, false
		}
		return int(v.num), true
	case typeddata.TypeString:
		return bytesconv.Atoi(v.data)
	}
	return 0, false
}

func (v value) name() ([]byte, bool) {
	if v.typ != typeddata.TypeString || len(v.data) == 0 {
		return nil, false
	}
	return v.data, true
}

// NotifyResult counts what one NOTIFY payload held.
type NotifyResult struct {
	Events  int // hapilot-response messages turned into events
	Invalid int // hapilot-response messages with missing or mistyped arguments
	Unknown int // messages of another name, skipped
	// NoServer counts responses HAProxy produced itself (no server was
	// chosen, so srv_name was empty or null): nothing to attribute.
	NoServer int
	// Sampled counts the events that came from a sampled stanza: a
	// sample argument above 1, whatever the status (a 5xx of a sampled
	// stanza counts once, but says which stanza sent it).
	Sampled int
}

// DecodeNotify decodes the messages of a NOTIFY frame's payload and hands
// each valid hapilot-response to emit. The event's names point into
// payload: emit must copy what it keeps. A structural error (truncation, an
// unknown type) stops decoding and is returned with what was counted so far.
func DecodeNotify(payload []byte, emit func(window.Event)) (NotifyResult, error) {
	var res NotifyResult
	r := reader{b: payload}
	for r.off < len(r.b) {
		name, err := r.lenBytes()
		if err != nil {
			return res, fmt.Errorf("message name: %w", err)
		}
		nargs, err := r.byte()
		if err != nil {
			return res, fmt.Errorf("message %q: argument count: %w", name, err)
		}
		ours := string(name) == MessageName
		var ev window.Event
		var have, bad, sample int
		noServer := false
		const want = 4
		for i := 0; i < int(nargs); i++ {
			key, err := r.lenBytes()
			if err != nil {
				return res, fmt.Errorf("message %q: argument %d name: %w", name, i, err)
			}
			v, err := r.value()
			if err != nil {
				return res, fmt.Errorf("message %q: argument %q: %w", name, key, err)
			}
			if !ours {
				continue
			}
			ok := true
			switch string(key) {
			case ArgBackend:
				ev.Backend, ok = v.name()
				have |= 1
			case ArgServer:
				ev.Server, ok = v.name()
				if !ok && (v.typ == typeddata.TypeNull || v.typ == typeddata.TypeString) {
					noServer, ok = true, true
				}
				have |= 2
			case ArgStatus:
				ev.Status, ok = v.integer()
				ok = ok && ev.Status >= 100 && ev.Status <= 999
				have |= 4
			case ArgTr:
				ev.ResponseMs, ok = v.integer()
				have |= 8
			case ArgSample:
				sample, ok = v.integer()
				ok = ok && sample >= 1 && sample <= MaxSample
			}
			if !ok {
				bad++
			}
		}
		switch {
		case !ours:
			res.Unknown++
		case bad > 0 || have != 1<<want-1:
			res.Invalid++
		case noServer:
			res.NoServer++
		default:
			if sample > 1 {
				res.Sampled++
				if ev.Status < 500 || ev.Status > 599 {
					ev.Count = sample
				}
			}
			res.Events++
			emit(ev)
		}
	}
	return res, nil
}
