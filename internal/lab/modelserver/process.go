package modelserver

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hapilot/hapilot/internal/lab/logbuf"
)

// RepoRoot is the folder of hapilot's go.mod, found from the working
// directory up ("" when there is none).
func RepoRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/hapilot/hapilot\n")) {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			return ""
		}
		dir = up
	}
}

// OllamaBinary is $HAPILOT_OLLAMA_BIN, else <repo>/bin/ollama (make
// modelservers builds it). It reports an error naming the make target
// when the file is not there.
func OllamaBinary() (string, error) {
	b := os.Getenv("HAPILOT_OLLAMA_BIN")
	if b == "" {
		b = filepath.Join(RepoRoot(), "bin", "ollama")
	}
	if st, err := os.Stat(b); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return b, fmt.Errorf("no Ollama binary at %s (make modelservers builds it: internal/lab/modelserver/build-ollama.sh bin/ollama; or set HAPILOT_OLLAMA_BIN)", b)
	}
	return b, nil
}

// LlamaDir is $HAPILOT_LLAMA_DIR, else <repo>/bin/llama.cpp (make
// modelservers fetches it), the folder of the llama-server and
// llama-finetune wrappers; an error names the make target when
// llama-server is not there.
func LlamaDir() (string, error) {
	d := os.Getenv("HAPILOT_LLAMA_DIR")
	if d == "" {
		d = filepath.Join(RepoRoot(), "bin", "llama.cpp")
	}
	if st, err := os.Stat(filepath.Join(d, "llama-server")); err != nil || st.Mode()&0o111 == 0 {
		return d, fmt.Errorf("no llama-server in %s (make modelservers fetches it: internal/lab/modelserver/fetch-llama.sh bin/llama.cpp; or set HAPILOT_LLAMA_DIR)", d)
	}
	return d, nil
}

// process is one server in its own process group, so that what it starts
// (Ollama's runners) is stopped with it. Its output is kept in memory.
type process struct {
	cmd  *exec.Cmd
	out  *logbuf.Buffer
	done chan struct{}
	err  error // cmd.Wait's, once done is closed
}

func startProcess(cmd *exec.Cmd) (*process, error) {
	p := &process{cmd: cmd, out: &logbuf.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	// Its own group, and killed if this process dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended, with its error.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the server, waits up to grace for it to end, then
// kills it; whatever else is left in its process group (a runner Ollama
// did not stop) is killed after it. It waits for the server's end.
func (p *process) stop(grace time.Duration) {
	if p == nil || p.cmd.Process == nil {
		return
	}
	pid := p.cmd.Process.Pid
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	// The group is this server's own (Setpgid): only what it started.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}

// waitHTTP polls url until it answers 200, the process exits, or the
// timeout or ctx ends.
func (p *process) waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		if done, err := p.exited(); done {
			return fmt.Errorf("%s exited before %s answered: %v", filepath.Base(p.cmd.Path), url, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %s", url, timeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePort is a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// cleanEnv is this process's environment without the variables that
// would change how a server behaves (OLLAMA_*, GPUs), plus extra.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, e := range os.Environ() {
		k, _, _ := strings.Cut(e, "=")
		if strings.HasPrefix(k, "OLLAMA_") || strings.HasPrefix(k, "LLAMA_") || k == "GGML_BACKEND_PATH" ||
			k == "CUDA_VISIBLE_DEVICES" || k == "HIP_VISIBLE_DEVICES" || k == "ROCR_VISIBLE_DEVICES" || k == "HOME" {
			continue
		}
		env = append(env, e)
	}
	return append(env, extra...)
}
