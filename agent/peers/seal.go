package peers

import (
	"bytes"
	"compress/lzw"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"

	"golang.org/x/crypto/chacha20poly1305"
)

// hapilot's messages travel in an envelope of their own, beside
// memberlist's packets on the same port, rather than in memberlist's user
// messages: memberlist hands a user message over without saying where it
// came from, so a member holding the key could speak in any other's name.
// The transport (transport.go) sees each envelope's source address, and
// Node.admit checks it against the member memberlist lists under the
// sender's name.
//
//	envelope: 'H' envelopeVersion flags, nonce (24 bytes), sealed message
//	over TCP: 'H', length (4 bytes, big-endian), envelope
//
// The seal is XChaCha20-Poly1305 under a key derived from the fleet's key
// (HKDF-SHA256): random 24-byte nonces do not repeat in any fleet's
// life, where random 12-byte ones (AES-GCM's, memberlist's) should not be
// drawn more than 2^32 times under one key; and a key of its own keeps
// its nonces apart from memberlist's.
const (
	envelopeMagic   = 'H' // memberlist's packets open with 0..13 or 244
	envelopeVersion = 1

	flagLZW = 1 // the message is LZW-compressed, as memberlist compresses its own

	envelopeHeader   = 3
	envelopeOverhead = envelopeHeader + chacha20poly1305.NonceSizeX + chacha20poly1305.Overhead

	// maxEnvelope is the largest envelope a receiver reads: a message
	// of MaxMessage sealed, with room for a compression that did not pay.
	maxEnvelope = MaxMessage + MaxMessage/8 + envelopeOverhead
)

var errNotSealed = errors.New("not a sealed hapilot message")

type sealer struct {
	aead     cipher.AEAD
	compress bool
}

func newSealer(key []byte, compress bool) (*sealer, error) {
	k, err := hkdf.Key(sha256.New, key, nil, "hapilot fleet messages, envelope 1", chacha20poly1305.KeySize)
	if err != nil {
		return nil, fmt.Errorf("fleet: derive the messages' key: %w", err)
	}
	aead, err := chacha20poly1305.NewX(k)
	if err != nil {
		return nil, fmt.Errorf("fleet: messages' seal: %w", err)
	}
	return &sealer{aead: aead, compress: compress}, nil
}

// seal puts msg in an envelope.
func (s *sealer) seal(msg []byte) []byte {
	flags := byte(0)
	if s.compress {
		var b bytes.Buffer
		w := lzw.NewWriter(&b, lzw.LSB, 8)
		_, _ = w.Write(msg) // a bytes.Buffer does not fail
		_ = w.Close()
		if b.Len() < len(msg) {
			msg, flags = b.Bytes(), flagLZW
		}
	}
	out := make([]byte, envelopeHeader+chacha20poly1305.NonceSizeX, envelopeOverhead+len(msg))
	out[0], out[1], out[2] = envelopeMagic, envelopeVersion, flags
	nonce := out[envelopeHeader:]
	_, _ = rand.Read(nonce) // crypto/rand never fails on Linux
	return s.aead.Seal(out, nonce, msg, out[:envelopeHeader])
}

// open takes msg out of its envelope: an error unless it was sealed with
// the fleet's key, whole, and decompresses to at most MaxMessage.
func (s *sealer) open(env []byte) ([]byte, error) {
	if len(env) < envelopeOverhead || env[0] != envelopeMagic {
		return nil, errNotSealed
	}
	if env[1] != envelopeVersion {
		return nil, fmt.Errorf("envelope version %d, this agent speaks %d", env[1], envelopeVersion)
	}
	nonce := env[envelopeHeader : envelopeHeader+chacha20poly1305.NonceSizeX]
	msg, err := s.aead.Open(nil, nonce, env[envelopeHeader+chacha20poly1305.NonceSizeX:], env[:envelopeHeader])
	if err != nil {
		return nil, errors.New("not sealed with the fleet's key, or altered")
	}
	if env[2]&flagLZW == 0 {
		return msg, nil
	}
	// A key holder's bomb: a few KiB that expand a thousandfold.
	r := lzw.NewReader(bytes.NewReader(msg), lzw.LSB, 8)
	defer r.Close()
	out, err := io.ReadAll(io.LimitReader(r, MaxMessage+1))
	if err != nil {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	if len(out) > MaxMessage {
		return nil, fmt.Errorf("decompresses past %d bytes", MaxMessage)
	}
	return out, nil
}
