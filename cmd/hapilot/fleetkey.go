package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/hapilot/hapilot/agent/peers"
)

// cmdFleetKey writes a new 32-byte key, base64, to a file only its owner
// may read; it never replaces one, since every node must hold the same.
func cmdFleetKey(args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: hapilot fleet-key FILE (then copy FILE, mode 0600, to every node)")
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	f, err := os.OpenFile(args[0], os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write key (an existing file is never replaced): %w", err)
	}
	if _, err := fmt.Fprintln(f, base64.StdEncoding.EncodeToString(key)); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if _, err := peers.ReadKey(args[0]); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s: copy it, mode 0600, to every node's agent, and give each --fleet-key %s\n", args[0], args[0])
	return nil
}
