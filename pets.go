// The HTTP surface: the route table, the handler that serves it, and the
// pets' own handlers, in that order; the middleware every request meets
// on its way in is in middleware.go.

package main

import (
	_ "embed"
	"errors"
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
	readTimeout  time.Duration // the server's, for a request's body
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
	wrap := func(r route, h http.Handler) http.Handler {
		if !r.public {
			h = requireAPIKey(s.keys, s.guard, h)
		}
		if r.deprecated {
			h = deprecated(h)
		}
		return h
	}
	methods := map[string][]string{}
	first := map[string]route{}
	for _, r := range s.routes() {
		p := r.path
		if p == "/" {
			p = "/{$}" // "/" alone would match every path; this, only the root
		}
		mux.Handle(r.method+" "+p, wrap(r, r.handler))
		if _, seen := first[p]; !seen {
			first[p] = r
		}
		methods[p] = append(methods[p], r.method)
	}
	// Method-less patterns catch the other methods on known paths, so they
	// get a JSON 405 rather than the mux's plain-text one. A GET route
	// also serves HEAD. The mux matches by pattern, not by the order
	// patterns were added in.
	for p, r := range first {
		// A copy: methods[p] also feeds the CORS preflight, and must not be
		// extended or reordered here.
		allow := slices.Clone(methods[p])
		if slices.Contains(allow, "GET") {
			allow = append(allow, "HEAD")
		}
		slices.Sort(allow)
		mux.Handle(p, wrap(r, methodNotAllowed(strings.Join(allow, ", "))))
	}
	// Everything under /v1 needs a key, even a path that does not exist;
	// "/v1" itself is listed so the mux does not redirect it to "/v1/".
	v1 := requireAPIKey(s.keys, s.guard, http.HandlerFunc(notFound))
	mux.Handle("/v1", v1)
	mux.Handle("/v1/", v1)
	mux.HandleFunc("/", notFound)

	// Built inside out; a request meets them in the order of this file:
	// secureHeaders, logRequests, recoverPanics, cors, refuseChunked,
	// rejectUncleanPaths, closeAfterUnreadBody, the mux, then requireAPIKey and deprecated on the
	// routes that want them.
	h := refuseChunked(rejectUncleanPaths(closeAfterUnreadBody(mux)))
	h = cors(s.corsOrigins, s.log, mux, methods, h)
	h = recoverPanics(s.log, h)
	h = logRequests(s.log, h)
	return secureHeaders(h)
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
	writeBody(w, http.StatusOK, []byte(`{"status":"ok"}`+"\n"))
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

const (
	// defaultLimit and maxLimit are the page sizes of the specification.
	defaultLimit = 20
	maxLimit     = 100
	// maxBodyBytes bounds what a create may send: 16 KiB is twelve times
	// the largest valid NewPet (about 1.3 KB, a name of 100 four-byte
	// characters escaped), so no real client comes near it, and a flood
	// of large bodies holds little memory.
	maxBodyBytes = 16 << 10

	// getPet was deprecated on 2026-11-22T00:00:00Z (RFC 9745 wants the
	// date as @unix-seconds) and goes away on the specification's date.
	getPetDeprecation = "@1795305600"
	getPetSunset      = "Thu, 05 Dec 2030 00:00:00 GMT"
	getPetSuccessor   = `</v1/pets>; rel="successor-version"`
)

// listOrders stands for GET /store/orders, which the specification names
// but does not describe.
func listOrders(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusNotImplemented, codeNotImplemented,
		"GET /v1/store/orders is named by the specification but not specified, so it is not implemented")
}

// listPets answers GET /v1/pets: one page in ascending id, with a Link to
// the next page when more pets match.
func (s *server) listPets(w http.ResponseWriter, r *http.Request) {
	f, err := parseListQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeInvalidParameter, err.Error())
		return
	}
	// One row more than asked tells whether there is a next page, so the
	// last page, even an exactly full one, has no next link.
	limit := f.limit
	f.limit++
	buf := getBuffer()
	defer putBuffer(buf)
	b := append(*buf, '[')
	n, last := 0, int64(0)
	err = s.store.listPets(f, func(p *petRow) {
		if n == limit {
			n++ // the extra row: only its existence matters
			return
		}
		if n > 0 {
			b = append(b, ',')
		}
		b = appendPetJSON(b, p)
		n, last = n+1, p.id
	})
	*buf = b
	if err != nil {
		writeStoreError(w, r, s.log, err)
		return
	}
	if n > limit {
		// The RFC 8288 Link to the next page, relative, so it stays right
		// behind any domain or proxy.
		q := "limit=" + strconv.Itoa(limit)
		if f.status != "" {
			q += "&status=" + f.status
		}
		w.Header()["Link"] = []string{"</v1/pets?" + q + "&after=" + strconv.FormatInt(last, 10) + `>; rel="next"`}
	}
	*buf = append(b, ']', '\n')
	writeBody(w, http.StatusOK, *buf)
}

// getPet answers GET /v1/pets/{petId}.
func (s *server) getPet(w http.ResponseWriter, r *http.Request) {
	if err := checkNoQuery(r.URL.RawQuery); err != nil {
		writeError(w, http.StatusBadRequest, codeInvalidParameter, err.Error())
		return
	}
	id, ok := parseDecimal(r.PathValue("petId"))
	if !ok || id < 1 {
		writeError(w, http.StatusBadRequest, codeInvalidParameter,
			"petId must be a pet's id, an integer from 1 to 9223372036854775807, got "+quoteValue(r.PathValue("petId")))
		return
	}
	buf := getBuffer()
	defer putBuffer(buf)
	err := s.store.getPet(id, func(p *petRow) {
		*buf = append(appendPetJSON(*buf, p), '\n')
	})
	switch {
	case errors.Is(err, errNotFound):
		writeError(w, http.StatusNotFound, codeNotFound, "no pet with id "+strconv.FormatInt(id, 10))
	case err != nil:
		writeStoreError(w, r, s.log, err)
	default:
		writeBody(w, http.StatusOK, *buf)
	}
}

// createPet answers POST /v1/pets. The 201 is sent only once the row is
// committed. With an Idempotency-Key, a retry of the same request gets the
// same 201 again instead of a second pet.
func (s *server) createPet(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if !isJSONContentType(r.Header.Get("Content-Type")) {
		writeError(w, http.StatusUnsupportedMediaType, codeUnsupportedMediaType,
			"send the body as JSON with the header Content-Type: application/json (curl: --json)")
		return
	}
	key, err := idempotencyKey(r.Header)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeInvalidParameter, err.Error())
		return
	}
	// A body over the limit is read off until -read-timeout, or the
	// create's deadline if sooner, so that its 413 can still be sent.
	if s.createWithin > 0 && s.createWithin < s.readTimeout {
		http.NewResponseController(w).SetReadDeadline(start.Add(s.createWithin))
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	np, err := decodeNewPet(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeInvalidBody, err.Error())
		return
	}
	c := createRequest{pet: np, idempotencyKey: key}
	if key, ok := apiKeyOf(r.Context()); ok {
		c.scope = idempotencyScope(key)
	}
	if s.createWithin > 0 {
		// The store refuses a create whose commit has not begun by its
		// deadline, and answers one that has begun with its outcome,
		// however long the commit takes: the server's write timeout must
		// not then cut the client off from a pet that was stored.
		c.deadline = start.Add(s.createWithin)
		http.NewResponseController(w).SetWriteDeadline(time.Time{})
	}
	p, replayed, err := s.store.createPet(r.Context(), c)
	switch {
	case errors.Is(err, errRefusedByDatabase):
		writeError(w, http.StatusUnprocessableEntity, codeRefusedByDatabase, err.Error())
	case errors.Is(err, errIdempotencyKeyReused):
		writeError(w, http.StatusUnprocessableEntity, codeIdempotencyKeyReused,
			"this Idempotency-Key was already used for a different pet; use a new key for a new request")
	case err != nil:
		writeStoreError(w, r, s.log, err)
	}
	if err != nil {
		return
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Location", "/v1/pets/"+strconv.FormatInt(p.ID, 10))
	row := petRow{id: p.ID, name: []byte(p.Name), categoryID: p.CategoryID, status: []byte(p.Status)}
	writeBody(w, http.StatusCreated, append(appendPetJSON(nil, &row), '\n'))
}

// createDeadline is how long a create may take, from its handler's
// start, before it must be answered: a margin inside the server's write
// timeout, which cuts the connection. A create that cannot be committed
// by then is refused with 503 and not stored, so a client never gets EOF
// for a pet that was stored behind its back.
// The margin is a quarter of the timeout, from 0.25 to 2 s, and never
// more than half of it, so the deadline stays positive for any timeout.
func createDeadline(writeTimeout time.Duration) time.Duration {
	margin := min(2*time.Second, max(250*time.Millisecond, writeTimeout/4), writeTimeout/2)
	return writeTimeout - margin
}
