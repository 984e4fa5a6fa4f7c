package luapolicy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The script runs in a worker: this same binary, started again with
// workerEnv set, so that the kernel bounds its memory (RLIMIT_DATA) and a
// call that will not stop can be killed. gopher-lua has no allocator
// hook, and a string doubled 29 times or a table filled until the
// deadline is one instruction or a few thousand away from a gigabyte: no
// check between instructions can bound it in the agent's own process, and
// no recover catches Go's own "out of memory". In a worker, the script's
// memory is its own, and what it does to the worker (an out-of-memory
// exit, a panic, a built-in that runs for ever) ends there.

// workerEnv names the environment variable that makes a process a Lua
// worker: any binary linking this package (hapilot, a test binary) turns
// into one in this package's init, before main runs. Its value is the
// protocol's version, so that a stale value starts nothing.
const (
	workerEnv   = "HAPILOT_LUA_WORKER"
	workerProto = "1"
)

func init() {
	if os.Getenv(workerEnv) != workerProto {
		return
	}
	os.Exit(serveWorker(os.Stdin, os.Stdout, os.Stderr))
}

// MaxMemory bounds what a worker may map beyond what it holds when it
// starts: the script's heap, the VM's and the observation's. Past it the
// kernel refuses the memory and the worker dies.
const MaxMemory = 256 << 20

// Bounds on what the script may say.
const (
	// MaxMessage bounds one print line, and an error's text, in bytes.
	MaxMessage = 2000
	// MaxPrints bounds the print lines of one call; the rest are counted.
	MaxPrints = 100
)

// serveWorker is the worker's life: it bounds itself, then answers
// requests one at a time until its input ends.
func serveWorker(in io.Reader, out, errOut io.Writer) int {
	// The worker ends when its input does (or with the agent): a signal
	// meant for the agent (a terminal's hangup or ^C) is not its own.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT)
	if err := limitSelf(); err != nil {
		fmt.Fprintln(errOut, "lua worker:", err)
		return 3
	}
	dec := json.NewDecoder(bufio.NewReaderSize(in, 64<<10))
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	var sendErr error
	send := func(r reply) {
		if sendErr == nil {
			if sendErr = enc.Encode(r); sendErr == nil {
				sendErr = w.Flush()
			}
		}
	}
	var prints, dropped int
	ws := &workerState{print: func(s string) {
		if prints >= MaxPrints {
			dropped++
			return
		}
		prints++
		send(reply{Log: s})
	}}
	for {
		var req request
		if err := dec.Decode(&req); err != nil {
			if errors.Is(err, io.EOF) {
				return 0 // the agent closed it
			}
			fmt.Fprintln(errOut, "lua worker: reading a request:", err)
			return 1
		}
		prints, dropped = 0, 0
		rep := ws.handle(req)
		rep.Done, rep.DroppedLogs = true, dropped
		send(rep)
		if sendErr != nil {
			fmt.Fprintln(errOut, "lua worker: writing a reply:", sendErr)
			return 1
		}
	}
}

// workerState is the worker's one VM.
type workerState struct {
	vm    *vm
	print func(string)
}

// handle answers one request. A panic in the VM (a gopher-lua bug, say)
// is an answer too, which breaks the policy: the state it leaves is not
// to be trusted.
func (ws *workerState) handle(req request) (rep reply) {
	defer func() {
		if r := recover(); r != nil {
			rep = reply{Error: cut(fmt.Sprintf("the Lua VM panicked: %v", r), MaxMessage), Broken: true}
		}
	}()
	switch {
	case req.Load != nil && ws.vm == nil:
		v, drainsPer, err := newVM(req.Load.Name, req.Load.Src, ws.print)
		if err != nil {
			return reply{Error: cut(err.Error(), MaxMessage)}
		}
		ws.vm = v
		return reply{DrainsPer: drainsPer}
	case req.Decide != nil && ws.vm != nil:
		actions, err := ws.vm.decide(time.Duration(req.Decide.BudgetMs)*time.Millisecond, req.Decide.Obs)
		if err != nil {
			return reply{Error: cut(err.Error(), MaxMessage), Broken: errors.Is(err, errBroken)}
		}
		return reply{Actions: actions}
	}
	return reply{Error: "the worker got a request out of order", Broken: true}
}

// limitSelf bounds the worker before it reads a script: its data
// segment to what it maps now plus MaxMemory, no core file, few file
// descriptors, one thread of Go code. prlimit64, which Go's Setrlimit
// uses, is in systemd's @default set, so the packaged unit's filter
// (~@resources) allows it.
func limitSelf() error {
	runtime.GOMAXPROCS(1)
	data, err := vmData()
	if err != nil {
		return err
	}
	for _, l := range []struct {
		name     string
		resource int
		value    uint64
	}{{"data", syscall.RLIMIT_DATA, data + MaxMemory}, {"core", syscall.RLIMIT_CORE, 0}, {"nofile", syscall.RLIMIT_NOFILE, 32}} {
		if err := syscall.Setrlimit(l.resource, &syscall.Rlimit{Cur: l.value, Max: l.value}); err != nil {
			return fmt.Errorf("setrlimit %s: %w", l.name, err)
		}
	}
	// The collector works harder as the heap nears half the bound, so
	// that what meets the hard one is what the script keeps, not its
	// garbage.
	debug.SetMemoryLimit(MaxMemory / 2)
	return nil
}

// vmData is the process's data segment now (VmData, what RLIMIT_DATA
// counts), in bytes.
func vmData() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmData:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("VmData %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmData in /proc/self/status")
}

// worker is the agent's end of one worker process. Calls are one at a
// time (the policy's lock).
type worker struct {
	cmd    *exec.Cmd
	in     *os.File // its stdin: requests
	out    *os.File // its stdout: replies
	r      *bufio.Reader
	stderr *headBuffer

	stopOnce sync.Once
	exit     error // what Wait said, once stopped
}

// maxReplyLine bounds one line from the worker: its messages are cut
// well below it.
const maxReplyLine = 64 << 10

// startWorker starts this binary as a worker. /proc/self/exe is the
// running binary even after a package upgrade replaced the file.
func startWorker() (*worker, error) {
	self := "/proc/self/exe"
	if _, err := os.Stat(self); err != nil {
		if self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("lua worker: %w", err)
		}
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("lua worker: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("lua worker: %w", err)
	}
	w := &worker{in: inW, out: outR, r: bufio.NewReaderSize(outR, maxReplyLine), stderr: &headBuffer{max: 4096}}
	w.cmd = exec.Command(self)
	w.cmd.Args = []string{"hapilot", "lua-policy-worker"} // what ps shows
	// Nothing of the agent's environment: the worker needs none of it.
	w.cmd.Env = []string{workerEnv + "=" + workerProto, "GOTRACEBACK=none"}
	w.cmd.Stdin, w.cmd.Stdout, w.cmd.Stderr = inR, outW, w.stderr
	// The worker dies with the agent, however the agent ends, and in a
	// process group of its own takes no signal meant for the agent's.
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	err = w.cmd.Start()
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, fmt.Errorf("lua worker: %w", err)
	}
	return w, nil
}

// errTimeout: the worker did not answer in time.
var errTimeout = errors.New("no answer in time")

// call sends req and reads the worker's replies until its answer, each
// print line given to logLine. The worker must answer by wait (zero: no
// bound), or grace after ctx ends, whichever is first; if it does not,
// or dies, call returns an error, and the worker must be stopped.
func (w *worker) call(ctx context.Context, req request, wait time.Time, grace time.Duration, logLine func(string)) (reply, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return reply{}, err
	}
	w.in.SetWriteDeadline(wait)
	w.out.SetReadDeadline(wait)
	stop := context.AfterFunc(ctx, func() {
		d := time.Now().Add(grace)
		if !wait.IsZero() && wait.Before(d) {
			d = wait
		}
		w.in.SetWriteDeadline(d)
		w.out.SetReadDeadline(d)
	})
	defer stop()
	if _, err := w.in.Write(append(b, '\n')); err != nil {
		return reply{}, w.failure(err)
	}
	for logs := 0; ; {
		line, err := w.r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			return reply{}, fmt.Errorf("a reply line over %d bytes", maxReplyLine)
		}
		if err != nil {
			return reply{}, w.failure(err)
		}
		var rep reply
		if err := json.Unmarshal(line, &rep); err != nil {
			return reply{}, fmt.Errorf("a malformed reply: %w", err)
		}
		if rep.Done {
			return rep, nil
		}
		if logs < MaxPrints {
			logLine(cut(rep.Log, MaxMessage))
			logs++
		}
	}
}

// failure names what became of a worker whose pipe failed: timed out,
// or dead (and then why, from its exit and its first words on stderr).
func (w *worker) failure(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errTimeout
	}
	w.stop()
	head := w.stderr.String()
	// What Go's runtime (or, in a race-detector build, ThreadSanitizer)
	// says when the kernel refuses it memory.
	if strings.Contains(head, "out of memory") || strings.Contains(head, "cannot allocate memory") || strings.Contains(head, "failed to allocate") {
		return fmt.Errorf("the script went past its memory bound (%d MiB): its worker died (%v: %s)", MaxMemory>>20, w.exit, firstLines(head, 2))
	}
	return fmt.Errorf("its worker died (%v: %s)", w.exit, firstLines(head, 2))
}

// stop kills the worker and waits for it; safe to call more than once.
func (w *worker) stop() {
	w.stopOnce.Do(func() {
		_ = w.cmd.Process.Kill()
		w.exit = w.cmd.Wait()
		w.in.Close()
		w.out.Close()
	})
}

// firstLines is s's first n lines that hold something, on one line.
func firstLines(s string, n int) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && len(out) < n {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return "nothing on stderr"
	}
	return strings.Join(out, " / ")
}

// headBuffer keeps the first max bytes written to it: a worker's last
// words on stderr, however long its dump.
type headBuffer struct {
	max int

	mu sync.Mutex // guards b: the worker's stderr is copied into it while a failure reads it
	b  []byte
}

func (h *headBuffer) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if room := h.max - len(h.b); room > 0 {
		h.b = append(h.b, p[:min(len(p), room)]...)
	}
	return len(p), nil
}

func (h *headBuffer) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return string(h.b)
}
