package modelserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// LlamaServer is one llama-server (Debian sid's llama.cpp) serving one
// GGUF on a loopback port.
type LlamaServer struct {
	Bin       string // the wrapper in LlamaDir
	URL       string // http://127.0.0.1:PORT
	Model     string // the GGUF
	NCtx      int    // -c
	Version   string // `llama-server --version`'s first line
	BuildInfo string // /props build_info

	p *process
}

// StartLlamaServer starts llama-server -m gguf -c nctx on a free loopback
// port, one slot (so that /props n_ctx is nctx), and waits until /health
// answers 200 (it answers 503 while the model loads).
func StartLlamaServer(ctx context.Context, gguf string, nctx int, extra ...string) (*LlamaServer, error) {
	dir, err := LlamaDir()
	if err != nil {
		return nil, err
	}
	s := &LlamaServer{Bin: filepath.Join(dir, "llama-server"), Model: gguf, NCtx: nctx}
	out, err := exec.CommandContext(ctx, s.Bin, "--version").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("llama-server --version: %v\n%s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "version:") {
			s.Version = strings.TrimSpace(strings.TrimPrefix(l, "version:"))
		}
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s.URL = "http://127.0.0.1:" + strconv.Itoa(port)
	args := append([]string{"-m", gguf, "--host", "127.0.0.1", "--port", strconv.Itoa(port), "-c", strconv.Itoa(nctx),
		"-np", "1", "--no-webui"}, extra...)
	cmd := exec.Command(s.Bin, args...)
	cmd.Env = cleanEnv()
	if s.p, err = startProcess(cmd); err != nil {
		return nil, err
	}
	if err := s.p.waitHTTP(ctx, s.URL+"/health", 60*time.Second); err != nil {
		s.Stop()
		return nil, fmt.Errorf("%w\n%s", err, s.Log())
	}
	props, err := s.Props(ctx)
	if err != nil {
		s.Stop()
		return nil, fmt.Errorf("llama-server /props: %w\n%s", err, s.Log())
	}
	s.BuildInfo = props.BuildInfo
	return s, nil
}

// Props is the part of llama-server's /props the lab reads.
type Props struct {
	BuildInfo                 string `json:"build_info"`
	DefaultGenerationSettings struct {
		NCtx int `json:"n_ctx"`
	} `json:"default_generation_settings"`
	ModelPath string `json:"model_path"`
}

// Props reads /props.
func (s *LlamaServer) Props(ctx context.Context) (Props, error) {
	var p Props
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/props", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return p, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return p, fmt.Errorf("/props: %s", resp.Status)
	}
	return p, json.NewDecoder(resp.Body).Decode(&p)
}

// String names the server and its version, for a test's log.
func (s *LlamaServer) String() string {
	return fmt.Sprintf("llama-server %s (build_info %s, %s) at %s", s.Version, s.BuildInfo, s.Bin, s.URL)
}

// Log is what the server printed.
func (s *LlamaServer) Log() string { return s.p.out.String() }

// Stop ends the server and waits for it.
func (s *LlamaServer) Stop() {
	if s == nil {
		return
	}
	s.p.stop(10 * time.Second)
}
