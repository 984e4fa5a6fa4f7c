package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

type stateFile struct {
	Version int                `json:"version"`
	Changes map[string]*Change `json:"changes"`
}

// loadState reads the ledger from StateFile. Called with l.mu held.
func (l *Loop) loadState() error {
	if l.StateFile == "" {
		return nil
	}
	b, err := os.ReadFile(l.StateFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("state file %s: %w", l.StateFile, err)
	}
	if st.Version != 1 {
		return fmt.Errorf("state file %s: version %d, want 1", l.StateFile, st.Version)
	}
	for k, c := range st.Changes {
		if c != nil && (c.Kind == Drain || c.Kind == SetWeight) {
			l.ledger[k] = c
		}
	}
	l.Log.Info().Int("changes", len(l.ledger)).Str("file", l.StateFile).Msg("loaded the agent's earlier changes")
	return nil
}

// saveState replaces StateFile atomically. Called with l.mu held.
func (l *Loop) saveState() {
	if l.StateFile == "" {
		return
	}
	b, err := json.MarshalIndent(stateFile{Version: 1, Changes: l.ledger}, "", "  ")
	if err == nil {
		tmp := l.StateFile + ".tmp"
		if err = os.WriteFile(tmp, append(b, '\n'), 0o640); err == nil {
			err = os.Rename(tmp, l.StateFile)
		}
	}
	if err != nil {
		l.Log.Error().Err(err).Str("file", l.StateFile).Msg("cannot write the state file")
	}
}
