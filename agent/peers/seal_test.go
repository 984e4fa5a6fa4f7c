package peers

import (
	"bytes"
	"compress/lzw"
	"strings"
	"testing"

	"golang.org/x/crypto/chacha20poly1305"
)

func TestSealRoundTripAndRefusals(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	msg := []byte(strings.Repeat("app srv1 ", 100)) // compresses
	for _, compress := range []bool{false, true} {
		s, err := newSealer(key, compress)
		if err != nil {
			t.Fatal(err)
		}
		env := s.seal(msg)
		if got, err := s.open(env); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("compress %v: round trip %v", compress, err)
		}
		if compress && len(env) >= len(msg) {
			t.Fatalf("compressed envelope of %d bytes for %d", len(env), len(msg))
		}
		if !compress && len(env) != len(msg)+envelopeOverhead {
			t.Fatalf("envelope of %d bytes for %d, want %d more", len(env), len(msg), envelopeOverhead)
		}
		other, _ := newSealer(bytes.Repeat([]byte{9}, 32), compress)
		if _, err := other.open(env); err == nil {
			t.Fatal("opened with another key")
		}
		for _, i := range []int{0, 1, 2, 10, len(env) - 1} {
			bad := append([]byte(nil), env...)
			bad[i] ^= 1
			if _, err := s.open(bad); err == nil {
				t.Fatalf("byte %d altered, and the envelope still opened", i)
			}
		}
		if _, err := s.open(env[:len(env)-1]); err == nil {
			t.Fatal("a cut envelope opened")
		}
	}
}

// A holder of the key cannot make a receiver inflate a small envelope
// past MaxMessage.
func TestSealRefusesABomb(t *testing.T) {
	s, err := newSealer(bytes.Repeat([]byte{7}, 32), true)
	if err != nil {
		t.Fatal(err)
	}
	var z bytes.Buffer
	w := lzw.NewWriter(&z, lzw.LSB, 8)
	w.Write(make([]byte, 4*MaxMessage))
	w.Close()
	hdr := []byte{envelopeMagic, envelopeVersion, flagLZW}
	nonce := make([]byte, chacha20poly1305.NonceSizeX)
	env := s.aead.Seal(append(append([]byte(nil), hdr...), nonce...), nonce, z.Bytes(), hdr)
	if _, err := s.open(env); err == nil || !strings.Contains(err.Error(), "decompresses past") {
		t.Fatalf("a bomb of %d bytes opened: %v", len(env), err)
	}
}
