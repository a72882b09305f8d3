// The HTTP surface: the route table, the handler that serves it, and the
// middleware every request meets on its way in, in that order.

package main

import (
	"context"
	_ "embed" // openapi.yaml
	"encoding/hex"
	"errors"
	"log/slog"
	mathrand "math/rand/v2"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// server holds what the handlers share.
type server struct {
	store       *petStore
	keys        *keyRing
	log         *slog.Logger
	corsOrigins []string // exact origins allowed to call from a browser
}

// route is one operation the service serves.
type route struct {
	method, path string
	handler      http.HandlerFunc
	public       bool // served without an API key
	deprecated   bool // answers carry Deprecation, Sunset and a successor Link
}

// routes is the whole API, in one list. The OpenAPI document describes
// exactly these (a test holds the two together).
func (s *server) routes() []route {
	return []route{
		{method: "GET", path: "/healthz", handler: s.health, public: true},
		{method: "GET", path: "/openapi.yaml", handler: serveOpenAPI, public: true},
		{method: "GET", path: "/v1/pets", handler: s.listPets},
		{method: "POST", path: "/v1/pets", handler: s.createPet},
		{method: "GET", path: "/v1/pets/{petId}", handler: s.getPet, deprecated: true},
		{method: "GET", path: "/v1/store/orders", handler: listOrders},
	}
}

// newHandler builds the service's whole HTTP surface: the routes, a JSON
// 405 with Allow for every other method on their paths, and a JSON 404
// for everything else, inside the middleware every answer goes through.
func newHandler(s *server) http.Handler {
	mux := http.NewServeMux()
	wrap := func(r route, h http.Handler) http.Handler {
		if !r.public {
			h = requireAPIKey(s.keys, noteKeyID, h)
		}
		if r.deprecated {
			h = deprecated(h)
		}
		return h
	}
	var paths []string
	methods := map[string][]string{}
	first := map[string]route{}
	for _, r := range s.routes() {
		mux.Handle(r.method+" "+r.path, wrap(r, r.handler))
		if _, seen := methods[r.path]; !seen {
			paths = append(paths, r.path)
			first[r.path] = r
		}
		methods[r.path] = append(methods[r.path], r.method)
	}
	// Method-less patterns catch the other methods on known paths, so they
	// get a JSON 405 rather than the mux's plain-text one. A GET route
	// also serves HEAD.
	for _, p := range paths {
		// A copy: methods[p] also feeds the CORS preflight, and must not be
		// extended or reordered here.
		allow := slices.Clone(methods[p])
		if slices.Contains(allow, "GET") {
			allow = append(allow, "HEAD")
		}
		slices.Sort(allow)
		mux.Handle(p, wrap(first[p], methodNotAllowed(strings.Join(allow, ", "))))
	}
	// Everything under /v1 needs a key, even a path that does not exist;
	// "/v1" itself is listed so the mux does not redirect it to "/v1/".
	mux.Handle("/v1", requireAPIKey(s.keys, noteKeyID, http.HandlerFunc(notFound)))
	mux.Handle("/v1/", requireAPIKey(s.keys, noteKeyID, http.HandlerFunc(notFound)))
	mux.HandleFunc("/", notFound)

	// Built inside out; a request meets them in the order of this file:
	// secureHeaders, logRequests, recoverPanics, cors, rejectUncleanPaths,
	// the mux, then requireAPIKey and deprecated on the routes that want them.
	h := rejectUncleanPaths(mux)
	h = cors(s.corsOrigins, mux, methods, h)
	h = recoverPanics(s.log, h)
	h = logRequests(s.log, h)
	return secureHeaders(h)
}

// secureHeaders marks every answer as not to be cached (it is one
// client's view of changing data, behind a key) and not to be sniffed as
// anything but its declared type.
func secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h["Cache-Control"] = noStore
		h["X-Content-Type-Options"] = noSniff
		next.ServeHTTP(w, r)
	})
}

// requestInfo is what the access log learns about a request on its way
// through: its id, and which key it used.
type requestInfo struct {
	id     string
	keyID  [4]byte // the first 4 bytes of the key's SHA-256
	hasKey bool    // a key was sent
}

// keyIDString is the key id as the log shows it: 8 hex digits, or "".
func (info *requestInfo) keyIDString() string {
	if !info.hasKey {
		return ""
	}
	return hex.EncodeToString(info.keyID[:])
}

type requestInfoKey struct{}

// lookupRequestInfo returns the request's info; ok is false outside
// logRequests.
func lookupRequestInfo(ctx context.Context) (info *requestInfo, ok bool) {
	info, ok = ctx.Value(requestInfoKey{}).(*requestInfo)
	return info, ok
}

// noteKeyID records which key a request sent, for the access log. The log
// names a key by its digest's first 8 hex digits: enough to tell keys
// apart, useless to recover one.
func noteKeyID(r *http.Request, d keyDigest) {
	info := requestInfoFrom(r.Context())
	copy(info.keyID[:], d[:4])
	info.hasKey = true
}

// requestInfoFrom returns the request's info, or an empty one outside
// logRequests.
func requestInfoFrom(ctx context.Context) *requestInfo {
	if info, ok := lookupRequestInfo(ctx); ok {
		return info
	}
	return &requestInfo{}
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
	status int
	bytes  int
	info   requestInfo
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
		if !log.Enabled(ctx, slog.LevelInfo) {
			return
		}
		log.LogAttrs(ctx, slog.LevelInfo, "request",
			slog.String("method", r.Method),
			slog.String("path", r.URL.Path),
			slog.Int("status", rec.status),
			slog.Int("bytes", rec.bytes),
			slog.Duration("duration", time.Since(start)),
			slog.String("key_id", info.keyIDString()))
	})
}

// requestIDHandler adds the request id of the context to each record.
type requestIDHandler struct{ slog.Handler }

func (h requestIDHandler) Handle(ctx context.Context, r slog.Record) error {
	if info, ok := lookupRequestInfo(ctx); ok {
		r.AddAttrs(slog.String("request_id", info.id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h requestIDHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return requestIDHandler{h.Handler.WithAttrs(attrs)}
}

func (h requestIDHandler) WithGroup(name string) slog.Handler {
	return requestIDHandler{h.Handler.WithGroup(name)}
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
func cors(origins []string, mux *http.ServeMux, methods map[string][]string, next http.Handler) http.Handler {
	if len(origins) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Add("Vary", "Origin")
		origin := r.Header.Get("Origin")
		if origin == "" || !slices.Contains(origins, origin) {
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

// notFound answers paths the service does not serve.
func notFound(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusNotFound, codeNotFound, "no such resource: "+r.URL.Path)
}

// methodNotAllowed answers a known path asked with a method it does not
// serve, listing the ones it does.
func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, codeMethodNotAllowed,
			"method "+r.Method+" is not allowed on "+r.URL.Path+"; allowed: "+allow)
	}
}

// health answers 200 only while the service can both read and store a
// pet, and otherwise 503 naming the failing check, for load balancers,
// monitors and systemd; it needs no key. The store logs each fault once.
func (s *server) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.store.health(ctx); err != nil {
		var fault *storageError
		if !errors.As(err, &fault) {
			fault = &storageError{kind: faultNotAnswering, err: err}
		}
		writeStoreError(w, r, s.log, fault)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Status string `json:"status"`
	}{"ok"})
}

// openapiDocument is openapi.yaml, built into the binary so the running
// service describes itself.
//
//go:embed openapi.yaml
var openapiDocument []byte

// serveOpenAPI answers GET /openapi.yaml without a key, for documentation
// platforms and client generators.
func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h["Content-Type"] = []string{"application/yaml"} // RFC 9512
	h["Content-Length"] = []string{strconv.Itoa(len(openapiDocument))}
	w.Write(openapiDocument)
}
