// Package ctl is the protocol of `hapilot ctl`: one JSON request line
// from the client, one JSON answer line from the agent, over the agent's
// unix control socket. It is shared by the agent's server
// (cmd/hapilot/daemon) and the client (cmd/hapilot), so that both read the
// same names.
package ctl

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"time"
)

// Command names what the client asks.
type Command string

const (
	Status  Command = "status"
	List    Command = "list"
	Explain Command = "explain"
	Release Command = "release"
	Pause   Command = "pause"
	Resume  Command = "resume"
	Restore Command = "restore"
)

// Commands lists them, in the order the help shows.
var Commands = []Command{Status, List, Explain, Release, Pause, Resume, Restore}

// Request is one command. Server is "backend/server" (explain,
// release); Backend scopes pause and resume ("" for every backend); For
// bounds a pause ("" or 0: until resumed).
type Request struct {
	Command Command `json:"command"`
	Server  string  `json:"server,omitempty"`
	Backend string  `json:"backend,omitempty"`
	For     string  `json:"for,omitempty"`
}

// Answer is the agent's reply: OK with a Result, or an Error that says
// why (a refusal's reason).
type Answer struct {
	OK      bool            `json:"ok"`
	Error   string          `json:"error,omitempty"`
	Message string          `json:"message,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	// Retry: the agent read no whole request on this connection (its
	// control connections were at their cap) and carried nothing out;
	// Do sends the request again.
	Retry bool `json:"retry,omitempty"`
}

// MaxRequest bounds a request line: a command and a name or two (a
// backend name is at most 255 bytes), with room to spare. The agent
// reads no more of a longer one than its buffer, and refuses it.
const MaxRequest = 64 << 10

// MaxAnswer bounds an answer line, which the agent checks before it
// writes one: what it writes, the client reads.
const MaxAnswer = 4 << 20

// Timeout bounds a command: a release reads HAProxy and sends commands,
// which a stuck socket could hold.
const Timeout = 30 * time.Second

// Do sends req to the agent at path and reads its answer. An answer
// that says nothing was carried out (Retry: the agent's connections were
// at their cap) sends the request again, after a pause of 10 ms doubling
// to 500 ms, until ctx ends.
func Do(ctx context.Context, path string, req Request) (Answer, error) {
	pause := 10 * time.Millisecond
	for {
		a, err := do(ctx, path, req)
		if err != nil || !a.Retry {
			return a, err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return a, nil // the agent's refusal says why
		case <-t.C:
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}

// do is one attempt of Do.
func do(ctx context.Context, path string, req Request) (Answer, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if errors.Is(err, fs.ErrPermission) {
		return Answer{}, fmt.Errorf("reach the agent at %s: %w (the socket is the agent's user's and group's, mode 0660: run as root or as a member of its group)", path, err)
	}
	if err != nil {
		return Answer{}, fmt.Errorf("reach the agent at %s: %w (is it running? `hapilot restore` works without it)", path, err)
	}
	defer conn.Close()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(Timeout)
	}
	_ = conn.SetDeadline(deadline)
	b, err := json.Marshal(req)
	if err != nil {
		return Answer{}, err
	}
	_, werr := conn.Write(append(b, '\n'))
	// A write that failed may still have an answer to read: the agent
	// closes a connection it turns away at its cap after saying so.
	r := bufio.NewReaderSize(conn, 64<<10)
	line, err := readLine(r, MaxAnswer)
	if err != nil && werr != nil {
		return Answer{}, fmt.Errorf("send to the agent: %w", werr)
	}
	if err != nil {
		return Answer{}, fmt.Errorf("read the agent's answer: %w", err)
	}
	var a Answer
	if err := json.Unmarshal(line, &a); err != nil {
		return Answer{}, fmt.Errorf("the agent's answer: %w", err)
	}
	return a, nil
}

// ReadRequest reads one request line. A line over MaxRequest is read to
// its end and dropped, so that the client, still sending, gets the
// refusal rather than a reset connection; the memory it takes is r's
// buffer, and the time the connection's deadline.
func ReadRequest(r *bufio.Reader) (Request, error) {
	line, err := readLine(r, MaxRequest)
	if err != nil {
		return Request{}, err
	}
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		return Request{}, fmt.Errorf("request: %w", err)
	}
	return req, nil
}

// ErrTooLong is a line over its bound.
var ErrTooLong = errors.New("line too long")

func readLine(r *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	over := false
	for {
		chunk, isPrefix, err := r.ReadLine()
		if err != nil {
			return nil, err
		}
		if !over {
			line = append(line, chunk...)
			if len(line) > limit {
				over, line = true, nil
			}
		}
		if isPrefix {
			continue
		}
		if over {
			return nil, fmt.Errorf("%w: over %d bytes", ErrTooLong, limit)
		}
		return line, nil
	}
}
