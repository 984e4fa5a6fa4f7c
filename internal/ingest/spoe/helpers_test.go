package spoe

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"testing"

	"github.com/negasus/haproxy-spoe-go/frame"
)

func contextWithCancel(t *testing.T) (context.Context, context.CancelFunc) {
	return context.WithCancel(context.Background())
}

type agentFrame struct {
	Type              frame.Type
	StreamID, FrameID uint64
	Payload           []byte
}

// readAgentFrame reads a frame the agent wrote; negasus's reader accepts
// only HAProxy's frame types, so tests read agent frames themselves.
func readAgentFrame(r io.Reader) (agentFrame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return agentFrame{}, err
	}
	b := make([]byte, binary.BigEndian.Uint32(hdr[:]))
	if _, err := io.ReadFull(r, b); err != nil {
		return agentFrame{}, err
	}
	if len(b) < 7 {
		return agentFrame{}, fmt.Errorf("short frame %x", b)
	}
	rd := reader{b: b, off: 5}
	sid, err := rd.uvarint()
	if err != nil {
		return agentFrame{}, err
	}
	fid, err := rd.uvarint()
	if err != nil {
		return agentFrame{}, err
	}
	return agentFrame{Type: frame.Type(b[0]), StreamID: sid, FrameID: fid, Payload: b[rd.off:]}, nil
}
