// What every request meets on its way to a handler, in order: the
// answer's own headers, a request id and the access line, panic recovery
// and CORS. On getPet, the deprecation headers follow.

package main

import (
	"cmp"
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	mathrand "math/rand/v2"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"time"
)

// withMiddleware wraps the mux in what every request meets.
func withMiddleware(log *slog.Logger, origins []string, mux http.Handler) http.Handler {
	return logRequests(log, recoverPanics(log, cors(origins, mux)))
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

// clientRequestID is an X-Request-Id that is kept as the client sent it.
// It cannot forge or bloat a log line.
var clientRequestID = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)

// logRequests marks every answer as not to be cached or sniffed, and
// gives it an id: the client's X-Request-Id if clientRequestID matches
// it, else a new one. Once the request is answered, it writes the access
// line: the path without the query, status 0 for a client that left
// unanswered, and the key that was accepted, by the first 8 hex digits
// of its digest.
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
		rec, who := &statusRecorder{ResponseWriter: w}, &caller{}
		defer func() { // also for an answer aborted with http.ErrAbortHandler
			keyID := ""
			if who.accepted {
				keyID = hex.EncodeToString(who.key[:4])
			}
			log.LogAttrs(r.Context(), slog.LevelInfo, "request", slog.String("request_id", id), slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Int("status", rec.status), slog.Duration("duration", time.Since(start)), slog.String("key_id", keyID))
		}()
		next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), callerKey{}, who)))
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

// cors lets a back-office page on one of origins call the API and read
// the answers' headers. A preflight carries no credentials, so it is
// answered here, before the key check. For another origin the answer has
// no CORS headers, and browsers then refuse it.
func cors(origins []string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin, h := r.Header.Get("Origin"), w.Header()
		allowed := slices.Contains(origins, origin)
		if origin != "" {
			h.Add("Vary", "Origin")
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

// deprecate marks every answer of getPet deprecated, with its removal
// date and the operation that replaces it. The link is relative to
// /v1/pets/{petId}, so that it holds under any path prefix.
func deprecate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Deprecation", getPetDeprecation)
		w.Header().Set("Sunset", getPetSunset)
		w.Header().Set("Link", `<../pets>; rel="successor-version"`)
		next.ServeHTTP(w, r)
	})
}
