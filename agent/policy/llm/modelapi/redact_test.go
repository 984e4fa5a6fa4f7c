package modelapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testKey = "sk-hapilot-SECRET-0123456789abcdef"

func writeKey(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte(testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A model server that answers 401 with a body echoing the Authorization
// header it got: no error the client returns carries the key, whatever
// the body's shape, through either API, and each still says 401.
func TestErrorsNeverCarryTheKey(t *testing.T) {
	bodies := map[string]func(auth string) string{
		"openai error": func(auth string) string {
			b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": "Invalid key in header Authorization: " + auth, "type": "auth"}})
			return string(b)
		},
		"ollama error": func(auth string) string {
			b, _ := json.Marshal(map[string]any{"error": "unauthorized: got " + auth})
			return string(b)
		},
		// The key far into a body that is no JSON: a cut at the old 300
		// characters left the head of the key.
		"plain, long": func(auth string) string {
			return strings.Repeat("x", 290) + " got header " + auth + " and the key alone " + testKey + strings.Repeat("y", 2000)
		},
		"header echo": func(auth string) string { return `{"headers":{"authorization":"` + auth + `"}}` },
	}
	for name, body := range bodies {
		for _, a := range APIs {
			t.Run(name+"/"+string(a), func(t *testing.T) {
				got := ""
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					got = r.Header.Get("Authorization")
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusUnauthorized)
					_, _ = w.Write([]byte(body(r.Header.Get("Authorization"))))
				}))
				defer srv.Close()
				s, err := Dial(a, srv.URL, "", writeKey(t))
				if err != nil {
					t.Fatal(err)
				}
				ctx := context.Background()
				errs := map[string]error{}
				_, errs["inspect"] = s.Inspect(ctx, "m")
				_, errs["loaded"] = s.Loaded(ctx, "m")
				_, errs["warm"] = s.Warm(ctx, Request{Model: "m"})
				_, errs["chat"] = s.Chat(ctx, Request{Model: "m", System: "s", User: "u"})
				_, errs["digest"] = s.Digest(ctx, "m")
				if got != "Bearer "+testKey {
					t.Fatalf("the server got %q: the key was not sent, so the test proves nothing", got)
				}
				for call, err := range errs {
					if err == nil {
						t.Fatalf("%s: no error from a 401", call)
					}
					text := err.Error()
					if strings.Contains(text, testKey) || strings.Contains(text, testKey[:12]) {
						t.Errorf("%s: the key in %q", call, text)
					}
					if len(text) > MaxErrorText+3 {
						t.Errorf("%s: %d characters", call, len(text))
					}
				}
				if !strings.Contains(errs["chat"].Error(), "401") && !strings.Contains(errs["chat"].Error(), "nauthorized") {
					t.Errorf("chat: %q says nothing of the 401", errs["chat"])
				}
			})
		}
	}
}

// The scrubbed error is still the kind it was: the context overflow and
// its prompt size, a deadline.
func TestScrubbedErrorsKeepTheirKinds(t *testing.T) {
	s := newSecrets(testKey, nil)
	inner := &ServerError{Kind: ErrContextOverflow, Err: errors.New("too long for Bearer " + testKey), PromptTokens: 4242}
	err := s.Error(errors.Join(errors.New("llm"), inner, context.DeadlineExceeded))
	if !errors.Is(err, ErrContextOverflow) || !errors.Is(err, context.DeadlineExceeded) || ReportedPromptTokens(err) != 4242 {
		t.Fatalf("kinds lost: %v", err)
	}
	if strings.Contains(err.Error(), testKey) || errors.Is(err, inner.Err) {
		t.Fatalf("the original is reachable: %v", err)
	}
	for in, want := range map[string]string{
		"Authorization: Bearer abc.def":    "Authorization: Bearer " + Redacted,
		`"authorization":"Basic dXNlcg=="`: `"authorization":"Basic ` + Redacted + `"`,
		"token bearer xyz123 refused":      "token bearer " + Redacted + " refused",
		"no secret here":                   "no secret here",
	} {
		if got := s.Scrub(in); got != want {
			t.Errorf("Scrub(%q) = %q, want %q", in, got, want)
		}
	}
}

// The password of --llm-url's user info is a secret too.
func TestURLPasswordScrubbed(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
	}))
	defer srv.Close()
	u := strings.Replace(srv.URL, "http://", "http://user:URLPASSWORD@", 1)
	s, err := Dial(APIOpenAI, u, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Inspect(context.Background(), "m"); err == nil || strings.Contains(err.Error(), "URLPASSWORD") {
		t.Fatalf("inspect: %v", err)
	}
}

// A server that echoes the key in what is not an error (its name for
// itself, the reply's content) gets it no further either.
func TestRepliesNeverCarryTheKey(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/health":
			_, _ = w.Write([]byte(`{"status":"ok"}`))
		case "/v1/models":
			b, _ := json.Marshal(map[string]any{"data": []map[string]any{{"id": "m", "owned_by": "echo " + auth}}})
			_, _ = w.Write(b)
		case "/v1/chat/completions":
			b, _ := json.Marshal(map[string]any{"choices": []map[string]any{{"finish_reason": "stop",
				"message": map[string]any{"content": "you sent " + auth, "reasoning_content": auth}}}})
			_, _ = w.Write(b)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	s, err := Dial(APIOpenAI, srv.URL, "", writeKey(t))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Inspect(context.Background(), "m")
	if err != nil || !strings.HasPrefix(info.Server, "echo Bearer ") || strings.Contains(info.Server, testKey) {
		t.Fatalf("info %+v: %v", info, err)
	}
	reply, err := s.Chat(context.Background(), Request{Model: "m", System: "s", User: "u"})
	if err != nil || !strings.HasPrefix(reply.Content, "you sent Bearer ") || strings.Contains(reply.Content+reply.Thinking, testKey) {
		t.Fatalf("reply %+v: %v", reply, err)
	}
}
