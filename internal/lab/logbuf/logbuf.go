// Package logbuf keeps a lab process's output (HAProxy's, a model
// server's) for the test that started it, to print if the test fails.
package logbuf

import (
	"bytes"
	"sync"
)

// Max bounds what a Buffer keeps: the head, since a runaway log must not
// eat the machine's memory and the first lines say why a process failed.
const Max = 8 << 20

// Buffer is an io.Writer safe for the process's stdout and stderr at once.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write keeps p while the buffer holds less than Max; past it, p is
// dropped, never refused, so the process is never blocked.
func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > Max {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
