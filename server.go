// The HTTP surface: the route table, the handler that serves it, and the
// middleware every request meets on its way in, in that order.

package main

import (
	_ "embed"
	"log/slog"
	"net/http"
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
	// createWithin is how long a create may take before it must be
	// answered (see createDeadline); 0: no bound.
	createWithin time.Duration
	// guard answers 429 to an address that fails authentication too
	// often; nil: none.
	guard *authGuard
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
		{method: "GET", path: "/", handler: serveIndex, public: true},
		{method: "GET", path: "/healthz", handler: s.health, public: true},
		{method: "GET", path: "/openapi.yaml", handler: serveOpenAPI("application/yaml"), public: true},
		{method: "GET", path: "/openapi.json", handler: serveOpenAPI("application/json"), public: true},
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
	keyed := func(h http.Handler) http.Handler {
		return requireAPIKey(s.keys, s.guard, noteKeyID, h)
	}
	wrap := func(r route, h http.Handler) http.Handler {
		if !r.public {
			h = keyed(h)
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
		p := muxPath(r.path)
		mux.Handle(r.method+" "+p, wrap(r, r.handler))
		if _, seen := methods[p]; !seen {
			paths = append(paths, p)
			first[p] = r
		}
		methods[p] = append(methods[p], r.method)
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
	mux.Handle("/v1", keyed(http.HandlerFunc(notFound)))
	mux.Handle("/v1/", keyed(http.HandlerFunc(notFound)))
	mux.HandleFunc("/", notFound)

	// Built inside out; a request meets them in the order of this file:
	// secureHeaders, logRequests, recoverPanics, cors, rejectUncleanPaths,
	// the mux, then requireAPIKey and deprecated on the
	// routes that want them.
	h := refuseChunked(rejectUncleanPaths(mux))
	h = cors(s.corsOrigins, s.log, mux, methods, h)
	h = recoverPanics(s.log, h)
	h = logRequests(s.log, h)
	return secureHeaders(h)
}

// muxPath is a route's path as a mux pattern: "/" alone would match every
// path, "/{$}" matches only the root.
func muxPath(path string) string {
	if path == "/" {
		return "/{$}"
	}
	return path
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

// indexBody is what GET / answers: where the API, its document and the
// health check are, relative so they stay right behind any proxy.
var indexBody = []byte(`{"name":"petstore","description":"A store's catalogue of animals: list, add and get pets under /v1 with a bearer API key.",` +
	`"links":{"pets":"/v1/pets","openapi":"/openapi.yaml","openapiJson":"/openapi.json","health":"/healthz"}}` + "\n")

// serveIndex answers GET / without a key, pointing the way.
func serveIndex(w http.ResponseWriter, r *http.Request) {
	writeBody(w, http.StatusOK, indexBody)
}

// health answers 200 only while the service can both read and store a
// pet, and otherwise 503 naming the failing check, for load balancers,
// monitors and systemd; it needs no key. The store logs each fault once.
func (s *server) health(w http.ResponseWriter, r *http.Request) {
	if err := s.store.health(); err != nil {
		writeStoreError(w, r, s.log, err) // a storageError: its 503
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Status string `json:"status"`
	}{"ok"})
}

// openapiDocument is openapi.json, the OpenAPI document of this API,
// built into the binary so the running service describes itself.
//
//go:embed openapi.json
var openapiDocument []byte

// serveOpenAPI answers the document without a key, as written, in the
// given media type: JSON is also YAML (YAML 1.2 is a superset of JSON),
// so one document serves tools that ask for either (RFC 9512 names
// application/yaml).
func serveOpenAPI(mediaType string) http.HandlerFunc {
	contentType := []string{mediaType}
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = contentType
		w.Header()["Content-Length"] = []string{strconv.Itoa(len(openapiDocument))}
		w.Write(openapiDocument)
	}
}
