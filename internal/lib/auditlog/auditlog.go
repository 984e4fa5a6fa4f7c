// Package auditlog is the agent's audit log file: appended to, a regular
// file only (internal/lib/safefile), and reopened at its path on request, so
// that logrotate can move it away and have the agent write a new one
// (SIGHUP).
package auditlog

import (
	"fmt"
	"os"
	"sync"

	"github.com/hapilot/hapilot/internal/lib/safefile"
)

// File is an audit log open for appending. It is safe for concurrent
// use: the loop writes while a signal reopens.
type File struct {
	path string

	mu sync.Mutex // guards the fields below: the loop's writes and a signal's Reopen
	f  *os.File
	// torn: the last write ended short (a full disk), so the next one
	// starts on a new line, and the lines after the tear still parse.
	torn   bool
	closed bool // a signal's Reopen after Close opens nothing
}

// Open opens (or creates, mode 0640) the audit log at path.
func Open(path string) (*File, error) {
	f, err := open(path)
	if err != nil {
		return nil, err
	}
	return &File{path: path, f: f}, nil
}

func open(path string) (*os.File, error) {
	f, err := safefile.Open(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return f, nil
}

// Path is where the log is.
func (a *File) Path() string { return a.path }

// Write appends p, one record.
func (a *File) Write(p []byte) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.torn {
		if _, err := a.f.Write([]byte("\n")); err != nil {
			return 0, err
		}
		a.torn = false
	}
	n, err := a.f.Write(p)
	if err != nil && n > 0 {
		a.torn = true
	}
	return n, err
}

// Reopen opens the path again and writes there from now on: after
// logrotate moved the file, a new one. If the path cannot be opened, the
// log stays the file it was, and the error says why.
func (a *File) Reopen() error {
	f, err := open(a.path)
	if err != nil {
		return err
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return f.Close()
	}
	old := a.f
	a.f, a.torn = f, false
	a.mu.Unlock()
	return old.Close()
}

// Close closes the file.
func (a *File) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	return a.f.Close()
}
