// The middleware a request meets on its way to a handler, in the order
// newHandler chains them: secure headers, request id and access log,
// panic recovery, CORS, clean paths; then, per route, the deprecation
// headers.

package main

import (
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// secureHeaders marks every answer as not to be cached (it is one
// client's view of changing data, behind a key) and not to be sniffed as
// anything but its declared type.
func secureHeaders(next http.Handler) http.Handler {
	noStore, noSniff := []string{"no-store"}, []string{"nosniff"} // shared: net/http only reads them
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["Cache-Control"] = noStore
		h["X-Content-Type-Options"] = noSniff
		next.ServeHTTP(w, r)
	})
}

// requestInfo is what the access log learns about a request on its way
// through: its id, and which key it used, by the first 8 hex digits of
// the key's digest: enough to tell keys apart, useless to recover one.
type requestInfo struct {
	id     string
	key    keyDigest // the SHA-256 of the key sent
	hasKey bool      // a key was sent
}

type requestInfoKey struct{}

// infoOf returns the request's info; ok is false outside logRequests,
// where an empty one is returned.
func infoOf(ctx context.Context) (info *requestInfo, ok bool) {
	if info, ok = ctx.Value(requestInfoKey{}).(*requestInfo); ok {
		return info, true
	}
	return &requestInfo{}, false
}

// maxRequestID is the longest X-Request-Id kept from a client.
const maxRequestID = 128

// requestIDFrom keeps a client's X-Request-Id when it is of sane length
// and characters (so it cannot forge log lines or bloat them), and makes a
// new one otherwise.
func requestIDFrom(r *http.Request) string {
	id := r.Header.Get("X-Request-Id")
	ok := id != "" && len(id) <= maxRequestID
	for i := 0; ok && i < len(id); i++ {
		c := id[i]
		ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.:", c) >= 0
	}
	if ok {
		return id
	}
	// Unique enough to find a request in the logs; not a secret.
	return strconv.FormatUint(mathrand.Uint64()|1<<63, 16)
}

// statusRecorder remembers the status and size of an answer for the
// access log, and carries the request's info (one allocation for both).
type statusRecorder struct {
	http.ResponseWriter
	status, bytes int
	info          requestInfo
}

func (w *statusRecorder) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusRecorder) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// logRequests gives every request an id (echoed in X-Request-Id and
// attached to every log line of the request) and writes one access line
// when it is answered: the path without the query, never the key, only a
// short digest of it.
func logRequests(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, info: requestInfo{id: requestIDFrom(r)}}
		info := &rec.info
		w.Header()["X-Request-Id"] = []string{info.id}
		ctx := context.WithValue(r.Context(), requestInfoKey{}, info)
		next.ServeHTTP(rec, r.WithContext(ctx))
		keyID := ""
		if info.hasKey {
			keyID = hex.EncodeToString(info.key[:4])
		}
		log.LogAttrs(ctx, slog.LevelInfo, "request",
			slog.String("method", r.Method),
			slog.String("path", r.URL.Path),
			slog.Int("status", rec.status),
			slog.Int("bytes", rec.bytes),
			slog.Duration("duration", time.Since(start)),
			slog.String("key_id", keyID))
	})
}

// recoverPanics turns a panic in a handler into a logged 500 with the
// Error body, instead of net/http's dropped connection.
func recoverPanics(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v) // net/http's own way to abort a response
			}
			log.ErrorContext(r.Context(), "panic in handler", "method", r.Method, "path", r.URL.Path, "panic", v)
			writeError(w, http.StatusInternalServerError, codeInternalError, internalErrorMessage(w))
		}()
		next.ServeHTTP(w, r)
	})
}

// cors lets a browser back office on one of origins call the API. It
// answers preflights for the routes (before the key check: browsers send
// no credentials on a preflight) and marks answers to those origins as
// readable. Other origins get no CORS headers, so browsers keep their
// default of refusing.
func cors(origins []string, log *slog.Logger, mux *http.ServeMux, methods map[string][]string, next http.Handler) http.Handler {
	refused := newLogLimiter(time.Hour, 10_000, 60) // see noteRefusedOrigin
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" {
			next.ServeHTTP(w, r) // not a browser's cross-origin call
			return
		}
		h := w.Header()
		if len(origins) > 0 {
			h.Add("Vary", "Origin")
		}
		if !slices.Contains(origins, origin) {
			noteRefusedOrigin(log, refused, r, origin)
			next.ServeHTTP(w, r)
			return
		}
		h.Set("Access-Control-Allow-Origin", origin)
		if wanted := r.Header.Get("Access-Control-Request-Method"); r.Method == http.MethodOptions && wanted != "" {
			// Ask the mux which route the real request would reach.
			probe := r.Clone(r.Context())
			probe.Method = wanted
			if _, pattern := mux.Handler(probe); strings.Contains(pattern, " ") {
				_, path, _ := strings.Cut(pattern, " ")
				h.Set("Access-Control-Allow-Methods", strings.Join(methods[path], ", "))
				h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type, Idempotency-Key, X-Request-Id")
				h.Set("Access-Control-Max-Age", "600")
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		h.Set("Access-Control-Expose-Headers", "Link, Location, X-Request-Id, Deprecation, Sunset, Idempotent-Replayed, WWW-Authenticate")
		next.ServeHTTP(w, r)
	})
}

// noteRefusedOrigin logs a browser page on another origin that the
// service refuses (browsers then block it without a word to the server's
// operator): a page moved, or -cors-origins lacks it. Each origin is
// logged at most once an hour, with how many of its requests were refused
// since its last line, whenever it comes: a misconfiguration that appears
// after a flood of made-up origins still shows. Memory and the log stay
// bounded: at most 10,000 origins are remembered, and at most 60 lines
// are written a minute, the next one saying how many were not.
func noteRefusedOrigin(log *slog.Logger, lines *logLimiter, r *http.Request, origin string) {
	if u, err := url.Parse(origin); err == nil && u.Host == r.Host {
		return // the page is on the service's own origin: no CORS involved
	}
	if ok, held, others := lines.allow(origin, time.Now()); ok {
		log.WarnContext(r.Context(), "browser origin refused: it is not in -cors-origins, so browsers will not let its pages read the answers; add it there if it is the back office",
			"origin", origin, "method", r.Method, "path", r.URL.Path, "refused_since_last_line", held, "other_origins_not_logged", others)
	}
}

// refuseChunked refuses a request whose body comes chunked. RFC 9112
// (6.1) calls a message with both Transfer-Encoding and Content-Length
// ambiguous, a way to smuggle a second request past a proxy; Go's server
// drops the Content-Length before a handler sees it, so which ones had
// both cannot be told. No client of this API sends a chunked body (curl,
// browsers and the generated clients send Content-Length), so each gets
// 411 and its connection is closed: nothing behind it is read or answered.
func refuseChunked(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if len(r.TransferEncoding) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		// The body is read and thrown away first, up to maxDrainBytes and
		// within -read-timeout, as for a 413: a client still sending when
		// the connection closes is reset and loses the answer. The body
		// reader stops at the last chunk, so what follows is never read.
		io.Copy(io.Discard, io.LimitReader(r.Body, maxDrainBytes))
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusLengthRequired, codeLengthRequired,
			"send the request body with a Content-Length header, not Transfer-Encoding: chunked")
	})
}

// closeAfterUnreadBody answers a request that came with a body over
// HTTP/1.1 with Connection: close, unless its handler reads the body
// (see readBody). Go's server otherwise reads off the body a handler
// left before it sends the answer, until the read timeout for a slow one.
// Once an answer with Connection: close is sent, Go's server still reads
// off what is left of the body, to the read timeout, while the connection
// holds its place under the cap; it is given lingerFor, for the client to
// receive the answer before the close. An HTTP/2 stream's body needs no
// such care: the stream alone is reset.
func closeAfterUnreadBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 1 {
			next.ServeHTTP(w, r)
			return
		}
		if r.ContentLength != 0 {
			w.Header()["Connection"] = connectionClose
		}
		next.ServeHTTP(w, r)
		if w.Header().Get("Connection") == "close" {
			http.NewResponseController(w).SetReadDeadline(time.Now().Add(lingerFor))
		}
	})
}

// lingerFor is how long the rest of a body is read off after its request
// was answered with Connection: close.
const lingerFor = 500 * time.Millisecond

// connectionClose is shared: net/http only reads it.
var connectionClose = []string{"close"}

// rejectUncleanPaths answers 404 for paths with "//", "." or ".."
// segments. The mux would redirect them, and a redirect is neither the
// JSON error body nor something a script's curl follows by default.
func rejectUncleanPaths(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p := r.URL.Path
		if !strings.HasPrefix(p, "/") {
			notFound(w, r) // "*" of OPTIONS *, or the empty path of CONNECT
			return
		}
		clean := path.Clean(p) // allocates only when p is not clean
		if strings.HasSuffix(p, "/") && clean != "/" {
			clean += "/"
		}
		if p != clean {
			notFound(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// deprecated marks every answer of getPet as deprecated (RFC 9745), with
// its removal date (RFC 8594) and the operation that replaces it.
func deprecated(next http.Handler) http.Handler {
	deprecation, sunset, link := []string{getPetDeprecation}, []string{getPetSunset}, []string{getPetSuccessor}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["Deprecation"] = deprecation
		h["Sunset"] = sunset
		h["Link"] = link
		next.ServeHTTP(w, r)
	})
}
