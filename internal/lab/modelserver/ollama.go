package modelserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ollama/ollama/api"
)

// Ollama is one `ollama serve` on a loopback port, its models in a
// folder of its own.
type Ollama struct {
	Bin     string
	Host    string // 127.0.0.1:PORT, as OLLAMA_HOST takes it
	URL     *url.URL
	Models  string // OLLAMA_MODELS
	Version string // what /api/version answered

	dir string
	p   *process
}

// StartOllama starts `ollama serve` with its models and home under dir,
// on a free loopback port, with OLLAMA_KEEP_ALIVE and every other
// OLLAMA_ setting unset and no GPU, and waits until /api/version
// answers.
func StartOllama(ctx context.Context, dir string) (*Ollama, error) {
	bin, err := OllamaBinary()
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	o := &Ollama{Bin: bin, Host: "127.0.0.1:" + strconv.Itoa(port), Models: filepath.Join(dir, "models"), dir: dir}
	o.URL = &url.URL{Scheme: "http", Host: o.Host}
	if err := os.MkdirAll(o.Models, 0o755); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve")
	cmd.Dir = dir
	cmd.Env = o.env()
	if o.p, err = startProcess(cmd); err != nil {
		return nil, err
	}
	if err := o.p.waitHTTP(ctx, o.URL.String()+"/api/version", 60*time.Second); err != nil {
		o.Stop()
		return nil, fmt.Errorf("%w\n%s", err, o.Log())
	}
	v, err := o.Client().Version(ctx)
	if err != nil {
		o.Stop()
		return nil, fmt.Errorf("ollama /api/version: %w", err)
	}
	o.Version = v
	return o, nil
}

func (o *Ollama) env() []string {
	return cleanEnv("OLLAMA_HOST="+o.Host, "OLLAMA_MODELS="+o.Models, "HOME="+o.dir,
		"CUDA_VISIBLE_DEVICES=-1", "HIP_VISIBLE_DEVICES=-1", "ROCR_VISIBLE_DEVICES=-1")
}

// String names the server and its version, for a test's log.
func (o *Ollama) String() string {
	return fmt.Sprintf("ollama %s (%s) at %s", o.Version, o.Bin, o.Host)
}

// Client is Ollama's own client for this server (no timeout: pass
// contexts with deadlines).
func (o *Ollama) Client() *api.Client { return api.NewClient(o.URL, http.DefaultClient) }

// Create imports m: it writes m's GGUF and Modelfile under the server's
// folder and runs `ollama create NAME -f Modelfile` there, as a user
// would.
func (o *Ollama) Create(ctx context.Context, m Model) error {
	dir := filepath.Join(o.dir, "import", m.Name)
	if _, err := m.Write(dir); err != nil {
		return err
	}
	return o.CreateFrom(ctx, m.Name, dir)
}

// CreateFrom runs `ollama create name -f Modelfile` in dir.
func (o *Ollama) CreateFrom(ctx context.Context, name, dir string) error {
	cmd := exec.CommandContext(ctx, o.Bin, "create", name, "-f", "Modelfile")
	cmd.Dir = dir
	cmd.Env = o.env()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ollama create %s: %v\n%s", name, err, out)
	}
	return nil
}

// Show is /api/show of model, decoded loosely (capabilities as strings,
// the model's context length from model_info's ARCH.context_length).
func (o *Ollama) Show(ctx context.Context, model string) (caps []string, contextLength int, err error) {
	return ShowInfo(ctx, o.Client(), model)
}

// ShowInfo reads /api/show's capabilities and the model's own context
// length through c, from any server that speaks Ollama's API.
func ShowInfo(ctx context.Context, c *api.Client, model string) (caps []string, contextLength int, err error) {
	r, err := c.Show(ctx, &api.ShowRequest{Model: model})
	if err != nil {
		return nil, 0, err
	}
	for _, c := range r.Capabilities {
		caps = append(caps, string(c))
	}
	arch, _ := r.ModelInfo["general.architecture"].(string)
	switch v := r.ModelInfo[arch+".context_length"].(type) {
	case float64:
		contextLength = int(v)
	case json.Number:
		n, _ := v.Int64()
		contextLength = int(n)
	}
	return caps, contextLength, nil
}

// Log is what the server printed.
func (o *Ollama) Log() string { return o.p.out.String() }

// Stop ends the server and every runner it started, and waits for them.
func (o *Ollama) Stop() {
	if o == nil {
		return
	}
	o.p.stop(10 * time.Second)
}
