package peers

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hapilot/hapilot/internal/lib/safefile"
)

// Config is the --fleet-* settings.
type Config struct {
	// Bind is where this agent talks to its peers (UDP and TCP); "" is
	// fleet mode off.
	Bind string
	// Join lists peers to join at the start, and again whenever one of
	// them is not a member (a partition healed, a peer restarted).
	Join []string
	// KeyFile holds the shared key, base64 of 16, 24 or 32 bytes, mode 0600.
	KeyFile string
	// Name is this node's name in the fleet; default the hostname.
	Name string
	// Sync is how often state and counts are sent; Timeout how long a
	// silent peer stays in the picture.
	Sync, Timeout time.Duration
	// Warmup is how long a member must have been in the picture before
	// it may decide (see picture).
	Warmup time.Duration
}

// DefaultConfig is fleet mode off, with its timings.
func DefaultConfig() Config {
	return Config{Sync: 250 * time.Millisecond, Timeout: time.Second, Warmup: 30 * time.Second}
}

// Enabled reports whether fleet mode is on.
func (c Config) Enabled() bool { return c.Bind != "" }

// Validate checks the settings when fleet mode is on.
func (c Config) Validate() error {
	if !c.Enabled() {
		if len(c.Join) > 0 || c.KeyFile != "" {
			return errors.New("fleet-join and fleet-key need fleet-bind")
		}
		return nil
	}
	var errs []error
	if _, _, err := splitHostPort(c.Bind); err != nil {
		errs = append(errs, fmt.Errorf("fleet-bind %q: %w", c.Bind, err))
	}
	for _, j := range c.Join {
		if _, _, err := net.SplitHostPort(j); err != nil {
			errs = append(errs, fmt.Errorf("fleet-join %q: %w", j, err))
		}
	}
	if c.KeyFile == "" {
		errs = append(errs, errors.New("fleet-bind needs fleet-key: the fleet's gossip is always encrypted (hapilot fleet-key FILE writes one)"))
	} else if _, err := ReadKey(c.KeyFile); err != nil {
		errs = append(errs, err)
	}
	if len(c.Name) > maxName || strings.ContainsAny(c.Name, " \t\n") {
		errs = append(errs, fmt.Errorf("fleet-name %q: want at most %d bytes, no spaces", c.Name, maxName))
	}
	if c.Sync < 50*time.Millisecond || c.Sync > 10*time.Second {
		errs = append(errs, fmt.Errorf("fleet-sync %v: want 50ms to 10s", c.Sync))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("fleet-warmup %v is negative", c.Warmup))
	}
	if c.Timeout < 2*c.Sync {
		errs = append(errs, fmt.Errorf("fleet-timeout %v: want at least two syncs (%v)", c.Timeout, 2*c.Sync))
	}
	return errors.Join(errs...)
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("port %q", p)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return host, port, nil
}

// ReadKey reads the shared key: base64 of 16, 24 or 32 bytes (AES-128,
// -192 or -256), from a file only its owner may read.
func ReadKey(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("fleet-key: %w", err)
	}
	if err := safefile.Trust("fleet-key", path, fi, 0o077, "the shared key must be readable by its owner only"); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fleet-key: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("fleet-key %s: want base64 of 16, 24 or 32 random bytes: %w", path, err)
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return nil, fmt.Errorf("fleet-key %s: %d bytes, want 16, 24 or 32", path, n)
	}
	return key, nil
}
