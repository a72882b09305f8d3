// What every request meets on its way to a handler, in order: the
// answer's own headers, a request id and the access line, panic recovery,
// CORS and clean paths; then, on getPet, the deprecation headers. Below
// them, the writer that keeps a stalled log from holding up a request.

package main

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"net/http"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// withMiddleware wraps the mux in what every request meets.
func withMiddleware(log *slog.Logger, origins []string, mux http.Handler) http.Handler {
	return logRequests(log, recoverPanics(log, cors(log, origins, cleanPaths(log, mux))))
}

// statusRecorder remembers an answer's status for the access line.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (w *statusRecorder) WriteHeader(status int) {
	w.status = cmp.Or(w.status, status)
	w.ResponseWriter.WriteHeader(status)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// clientRequestID is an X-Request-Id kept as the client sent it.
var clientRequestID = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)

// logRequests marks every answer as not to be cached (one client's view
// of changing data) or sniffed, and gives it an id: the client's
// X-Request-Id if it is 1 to 128 of A-Za-z0-9-_.: (so it cannot forge or
// bloat a log line), else a new one. Once answered, one access line: the
// path without the query, status 0 for a client that left unanswered, and
// the key only by the first 8 hex digits of its digest, which tell keys
// apart and give none away.
func logRequests(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start, id := time.Now(), r.Header.Get("X-Request-Id")
		if !clientRequestID.MatchString(id) {
			id = strconv.FormatUint(mathrand.Uint64()|1<<63, 16) // unique enough to find in a log; not a secret
		}
		h := w.Header()
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Request-Id", id)
		rec := &statusRecorder{ResponseWriter: w}
		defer func() { // also for an answer aborted (http.ErrAbortHandler)
			keyID := "" // of a key let through: a wrong one may be another secret sent by mistake
			if token, _ := bearerToken(r); token != "" && rec.status != http.StatusUnauthorized {
				d := digestOf(token)
				keyID = hex.EncodeToString(d[:4])
			}
			log.LogAttrs(r.Context(), slog.LevelInfo, "request", slog.String("request_id", id), slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Int("status", rec.status), slog.Duration("duration", time.Since(start)), slog.String("key_id", keyID))
		}()
		next.ServeHTTP(rec, r)
	})
}

// recoverPanics turns a handler's panic into a logged JSON 500, not
// net/http's dropped connection.
func recoverPanics(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v == http.ErrAbortHandler {
				panic(v) // net/http's own way to abort an answer
			} else if v != nil {
				writeError(w, r, log, fmt.Errorf("panic in handler: %v", v))
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// cors lets a back office page on one of origins call the API, and
// read the answers' headers. A preflight is answered here, before the key
// check, as it carries no credentials: with the CORS headers for those
// origins, without them for others, which browsers then refuse; a line
// in the log says so, as browsers tell the server's operator nothing.
func cors(log *slog.Logger, origins []string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin, h := r.Header.Get("Origin"), w.Header()
		allowed := slices.Contains(origins, origin)
		if origin != "" {
			h.Add("Vary", "Origin")
		}
		if origin != "" && !allowed && !strings.HasSuffix(origin, "://"+r.Host) { // a page of the service's own needs no CORS
			log.Warn("browser origin refused: it is not in -cors-origins, so browsers will not let its pages read the answers", "origin", origin, "path", r.URL.Path)
		}
		if allowed {
			h.Set("Access-Control-Allow-Origin", origin)
			h.Set("Access-Control-Expose-Headers", "Link, Location, Retry-After, X-Request-Id, Deprecation, Sunset, Idempotent-Replayed, WWW-Authenticate")
		}
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			if allowed {
				h.Set("Access-Control-Allow-Methods", "GET, POST")
				h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, Idempotency-Key, X-Request-Id")
				h.Set("Access-Control-Max-Age", "600")
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// cleanPaths answers 404 for a path with "//", "." or ".." segments,
// which the mux would redirect with an HTML body, and for one not from
// the root (GET *), which it would answer 400 with none: every error
// answer of this API is its JSON Error body. It names no resource, so it
// comes before the key check.
func cleanPaths(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		clean := path.Clean(r.URL.Path)
		if strings.HasSuffix(r.URL.Path, "/") && clean != "/" {
			clean += "/"
		}
		if r.URL.Path != clean || clean[0] != '/' { // also CONNECT's empty path
			writeError(w, r, log, notFound(w, r))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// deprecate marks every answer of getPet deprecated (RFC 9745), with its
// removal date (RFC 8594) and the operation that replaces it.
func deprecate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Deprecation", getPetDeprecation)
		w.Header().Set("Sunset", getPetSunset)
		w.Header().Set("Link", `</v1/pets>; rel="successor-version"`)
		next.ServeHTTP(w, r)
	})
}

// logWriter stands between the logger and its output (a terminal, a pipe
// to journald, a file), so that an output that stalls never holds up a
// request: lines wait in a bounded queue that one goroutine writes out,
// and a full queue drops lines and counts them; the count is logged once
// the output takes lines again. Flooding the log is journald's to limit.
type logWriter struct {
	lines   chan []byte // a nil line ends the writer
	dropped atomic.Int64
	done    chan struct{}
}

func newLogWriter(out io.Writer, format string) *logWriter {
	w := &logWriter{lines: make(chan []byte, 4096), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var batch []byte
		for line := range w.lines {
			// What is queued goes in one write: under load, one write(2)
			// of many lines, not one a request.
			batch = append(batch[:0], line...)
			for line != nil && len(w.lines) > 0 {
				line = <-w.lines
				batch = append(batch, line...)
			}
			if n := w.dropped.Swap(0); n > 0 {
				newLogger(out, format, slog.LevelWarn).Warn("log lines were dropped: the log output did not take them", "lines", n)
			}
			out.Write(batch)
			if line == nil {
				return
			}
		}
	}()
	return w
}

// Write queues one line (slog writes whole lines) and never waits.
func (w *logWriter) Write(p []byte) (int, error) {
	select {
	case w.lines <- slices.Clone(p):
	default:
		w.dropped.Add(1)
	}
	return len(p), nil
}

// close writes out what is queued, waiting at most wait for an output
// that does not take it; a line logged after it is dropped.
func (w *logWriter) close(wait time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	select {
	case w.lines <- nil:
	case <-ctx.Done():
	}
	select {
	case <-w.done:
	case <-ctx.Done():
	}
}

// newLogger is the service's logger, in text or JSON.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}
