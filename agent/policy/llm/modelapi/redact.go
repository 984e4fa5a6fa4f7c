package modelapi

import (
	"context"
	"errors"
	"net/url"
	"regexp"
	"strings"
	"time"
)

// MaxErrorText caps the text of an error the client returns: a model
// server's error body is the server's to write, and goes on to the log,
// /status, the audit log and the webhook.
const MaxErrorText = 512

// Redacted stands in an error's text for a secret it carried.
const Redacted = "[redacted]"

// credential matches an Authorization header or a bearer token a server
// echoes back ("Authorization: Bearer sk-...", `"authorization":"..."`,
// "Bearer sk-..."), whatever the key: a server may echo a header the
// client never sent (a proxy's own) as well as ours.
var credential = []*regexp.Regexp{
	regexp.MustCompile(`(?i)(authorization["']?\s*[:=]\s*["']?)((?:bearer|basic|token)\s+)?[^\s"'\\,;}\[\]]+`),
	regexp.MustCompile(`(?i)\b(bearer\s+)()[A-Za-z0-9._~+/=:-]+`),
}

// secrets are the words an error from this client must never carry: the
// API key, and the password of the server's URL (--llm-url
// http://user:password@host).
type secrets []string

func newSecrets(key string, addr *url.URL) secrets {
	var s secrets
	if key != "" {
		s = append(s, key)
	}
	if addr != nil && addr.User != nil {
		if pw, ok := addr.User.Password(); ok && pw != "" {
			s = append(s, pw)
		}
	}
	return s
}

// Scrub is text without the secrets, any Authorization header or bearer
// token, cut to MaxErrorText. The secrets go first, before any cut, so
// that no part of one survives it.
func (s secrets) Scrub(text string) string {
	for _, w := range s {
		text = strings.ReplaceAll(text, w, Redacted)
	}
	for _, re := range credential {
		text = re.ReplaceAllString(text, "${1}${2}"+Redacted)
	}
	return truncate(text, MaxErrorText)
}

// Words is text without the secrets themselves, uncut: for what a
// server returns that is not an error (a reply, its name for itself),
// where an Authorization-like phrase may be the model's own words.
func (s secrets) Words(text string) string {
	for _, w := range s {
		text = strings.ReplaceAll(text, w, Redacted)
	}
	return text
}

// kinds are the errors a caller tells apart with errors.Is: a scrubbed
// error keeps them, and nothing else of the original.
var kinds = []error{ErrLoading, ErrThinkLevel, ErrThinkUnsupported, ErrContextOverflow, ErrCutShort, ErrUnfinished,
	context.Canceled, context.DeadlineExceeded}

// scrubbed is an error's scrubbed text with the kinds it was.
type scrubbed struct {
	text  string
	kinds []error
}

func (e *scrubbed) Error() string   { return e.text }
func (e *scrubbed) Unwrap() []error { return e.kinds }

// Error is err as it may leave the client: its text scrubbed, errors.Is
// still finding its kinds and errors.As its *ServerError (with the
// prompt's size), and no way back to the original text.
func (s secrets) Error(err error) error {
	if err == nil {
		return nil
	}
	out := &scrubbed{text: s.Scrub(err.Error())}
	for _, k := range kinds {
		if errors.Is(err, k) {
			out.kinds = append(out.kinds, k)
		}
	}
	if se := (*ServerError)(nil); errors.As(err, &se) {
		return &ServerError{Kind: se.Kind, Err: out, PromptTokens: se.PromptTokens}
	}
	return out
}

// redacting is a Server whose errors, and the text of a reply that
// quotes the server's (Reply.Stepped), are scrubbed of its secrets: the
// one place the client's key is known, so the one place it is removed.
// What else a server says (a reply, its own name, a digest) is scrubbed
// of the secrets themselves: a server that echoes the key anywhere gets
// it no further.
type redacting struct {
	Server
	secrets secrets
}

// Unwrap is the server under its redaction (for tests that tune it).
func Unwrap(s Server) Server {
	if r, ok := s.(*redacting); ok {
		return r.Server
	}
	return s
}

func (r *redacting) Inspect(ctx context.Context, model string) (Info, error) {
	info, err := r.Server.Inspect(ctx, model)
	for _, f := range []*string{&info.Version, &info.Server, &info.ParameterSize, &info.Quantization, &info.PromptForm} {
		*f = r.secrets.Words(*f)
	}
	for i := range info.Capabilities {
		info.Capabilities[i] = r.secrets.Words(info.Capabilities[i])
	}
	return info, r.secrets.Error(err)
}

func (r *redacting) Loaded(ctx context.Context, model string) (bool, error) {
	ok, err := r.Server.Loaded(ctx, model)
	return ok, r.secrets.Error(err)
}

func (r *redacting) Warm(ctx context.Context, req Request) (time.Duration, error) {
	d, err := r.Server.Warm(ctx, req)
	return d, r.secrets.Error(err)
}

func (r *redacting) Chat(ctx context.Context, req Request) (Reply, error) {
	reply, err := r.Server.Chat(ctx, req)
	if reply.Stepped != "" {
		reply.Stepped = r.secrets.Scrub(reply.Stepped)
	}
	reply.Content, reply.Thinking = r.secrets.Words(reply.Content), r.secrets.Words(reply.Thinking)
	return reply, r.secrets.Error(err)
}

func (r *redacting) Digest(ctx context.Context, model string) (string, error) {
	d, err := r.Server.Digest(ctx, model)
	return r.secrets.Words(d), r.secrets.Error(err)
}
