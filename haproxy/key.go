package haproxy

import (
	"fmt"
	"strings"
)

// MaxWeight is the largest weight HAProxy takes (`set server ... weight`,
// `server ... weight`): every parser of a weight, and the guardrails,
// bound it by this.
const MaxWeight = 256

// ServerKey names one server the way HAProxy's runtime API does,
// "backend/server". It is the one place that formats and parses that
// form; everything else compares keys, never strings it built. As a
// TextMarshaler it is a JSON object key and a JSON string.
type ServerKey struct {
	Backend string
	Server  string
}

func (k ServerKey) String() string { return k.Backend + "/" + k.Server }

// ParseServerKey reads "backend/server". A backend may not hold a slash
// (ValidName refuses one), so the first slash splits.
func ParseServerKey(s string) (ServerKey, error) {
	b, srv, ok := strings.Cut(s, "/")
	if !ok || b == "" || srv == "" {
		return ServerKey{}, fmt.Errorf("%q: not backend/server", s)
	}
	return ServerKey{Backend: b, Server: srv}, nil
}

func (k ServerKey) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

func (k *ServerKey) UnmarshalText(b []byte) (err error) {
	*k, err = ParseServerKey(string(b))
	return err
}
