// Package ollamafake is a stand-in Ollama server for tests and the
// benchmark: no model can run on these machines. It speaks Ollama's wire
// format for /api/chat (stream false), /api/tags and /api/version as in
// shared/ref/ollama-0.17/api.md: the same JSON fields, metrics in
// nanoseconds, errors as {"error": "..."} with Ollama's status codes, and
// the 400 a model without thinking gives when asked to think. What it
// answers is decided by a Responder written in Go; it is an emulation, not
// a model, and is labelled so wherever it is used.
package ollamafake

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"
)

// Request is /api/chat's body as the fake reads it. Think is raw so that
// tests can tell an omitted field from false.
type Request struct {
	Model     string          `json:"model"`
	Messages  []Message       `json:"messages"`
	Stream    *bool           `json:"stream"`
	Format    json.RawMessage `json:"format"`
	Options   map[string]any  `json:"options"`
	Think     json.RawMessage `json:"think"`
	KeepAlive json.RawMessage `json:"keep_alive"`
}

// Message is one chat message.
type Message struct {
	Role     string `json:"role"`
	Content  string `json:"content"`
	Thinking string `json:"thinking,omitempty"`
}

// Reply is what a Responder answers.
type Reply struct {
	Content          string
	Thinking         string
	Delay            time.Duration // before answering (a slow model)
	PromptTokens     int
	CompletionTokens int
	Status           int // non-200: an error reply with Error as its text
	Error            string
	RawBody          *string // sent as is (a broken server), status 200
}

// Responder decides the reply to one chat request.
type Responder func(req Request) Reply

// Server is the fake.
type Server struct {
	*httptest.Server
	Models   map[string]string // name -> digest
	Thinking bool              // whether the model can think

	mu       sync.Mutex
	respond  Responder
	requests []Request
}

// New starts a fake serving models (name -> digest) with respond.
func New(models map[string]string, respond Responder) *Server {
	s := &Server{Models: models, respond: respond}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/chat", s.chat)
	mux.HandleFunc("GET /api/tags", s.tags)
	mux.HandleFunc("GET /api/version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, 200, map[string]string{"version": "0.17.4"})
	})
	s.Server = httptest.NewServer(mux)
	return s
}

// SetResponder swaps the behaviour.
func (s *Server) SetResponder(r Responder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.respond = r
}

// Requests returns the chat requests received so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) tags(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		Name       string    `json:"name"`
		Model      string    `json:"model"`
		ModifiedAt time.Time `json:"modified_at"`
		Size       int64     `json:"size"`
		Digest     string    `json:"digest"`
	}
	var out struct {
		Models []model `json:"models"`
	}
	for name, d := range s.Models {
		out.Models = append(out.Models, model{Name: name, Model: name, ModifiedAt: time.Unix(1700000000, 0).UTC(), Size: 1 << 30, Digest: d})
	}
	writeJSON(w, 200, out)
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		return
	}
	s.mu.Lock()
	s.requests = append(s.requests, req)
	respond := s.respond
	s.mu.Unlock()
	if _, ok := s.Models[req.Model]; !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "model '" + req.Model + "' not found"})
		return
	}
	if !s.Thinking && len(req.Think) > 0 && string(req.Think) != "false" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": `"` + req.Model + `" does not support thinking`})
		return
	}
	start := time.Now()
	rep := respond(req)
	if rep.Delay > 0 {
		select {
		case <-time.After(rep.Delay):
		case <-r.Context().Done():
			return
		}
	}
	if rep.Status != 0 && rep.Status != 200 {
		writeJSON(w, rep.Status, map[string]string{"error": rep.Error})
		return
	}
	if rep.RawBody != nil {
		w.WriteHeader(200)
		_, _ = w.Write([]byte(*rep.RawBody))
		return
	}
	total := time.Since(start)
	writeJSON(w, 200, map[string]any{
		"model":                req.Model,
		"created_at":           time.Now().UTC().Format(time.RFC3339Nano),
		"message":              Message{Role: "assistant", Content: rep.Content, Thinking: rep.Thinking},
		"done":                 true,
		"done_reason":          "stop",
		"total_duration":       total.Nanoseconds(),
		"load_duration":        int64(1334875),
		"prompt_eval_count":    rep.PromptTokens,
		"prompt_eval_duration": total.Nanoseconds() / 3,
		"eval_count":           rep.CompletionTokens,
		"eval_duration":        total.Nanoseconds() / 2,
	})
}
