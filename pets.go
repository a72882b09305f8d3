// The HTTP surface: the pets, the routes, the middleware that every
// request meets, and the handlers with the parsing of what clients send.

package main

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	mathrand "math/rand/v2"
	"mime"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// NewPet is the body of a create.
type NewPet struct {
	Name       string `json:"name"`
	CategoryID int64  `json:"categoryId"`
	Status     string `json:"status"`
}

// Pet is a stored NewPet, with its id first.
type Pet struct {
	ID int64 `json:"id"`
	NewPet
}

// petStatuses are the PetStatus values. An omitted status is the first.
var petStatuses = []string{"available", "pending", "sold"}

// The limits and dates of the API.
const (
	maxNameLength = 100      // Unicode code points
	maxBodyBytes  = 16 << 10 // well above the largest NewPet, 100 escaped four-byte characters
	// lateWriteTimeout replaces WriteTimeout for answers that may be
	// slow, such as a create's.
	lateWriteTimeout = 10 * time.Second
)

// server holds what the handlers share.
type server struct {
	store *store
	keys  *keyRing
	log   *slog.Logger
	// createWithin bounds how long a create waits to begin committing.
	createWithin time.Duration
}

// handler answers a request, or returns the error to answer it with.
type handler func(http.ResponseWriter, *http.Request) error

// newHandler is the service's whole HTTP surface: the routes, a JSON 405
// with Allow for another method on a known path, and a JSON 404 for any
// other path, inside the middleware. Under /v1 the key is checked first,
// even for a path that does not exist.
func newHandler(s *server, corsOrigins []string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /{$}", s.wrap(serveIndex, true))
	mux.Handle("GET /healthz", s.wrap(s.health, true))
	mux.Handle("GET /openapi.json", s.wrap(serveDocument("application/json"), true))
	mux.Handle("GET /openapi.yaml", s.wrap(serveDocument("application/yaml"), true))
	mux.Handle("GET /v1/pets", s.wrap(s.listPets, false))
	mux.Handle("POST /v1/pets", s.wrap(s.createPet, false))
	mux.Handle("GET /v1/pets/{petId}", deprecate(s.wrap(s.getPet, false)))
	mux.Handle("GET /v1/store/orders", s.wrap(listOrders, false))
	for _, path := range []string{"/{$}", "/healthz", "/openapi.json", "/openapi.yaml"} {
		mux.Handle(path, s.wrap(methodNotAllowed("GET, HEAD"), true))
	}
	mux.Handle("/v1/pets", s.wrap(methodNotAllowed("GET, HEAD, POST"), false))
	mux.Handle("/v1/pets/{petId}", deprecate(s.wrap(methodNotAllowed("GET, HEAD"), false)))
	mux.Handle("/v1/store/orders", s.wrap(methodNotAllowed("GET, HEAD"), false))
	mux.Handle("/v1/", s.wrap(notFound, false))
	mux.Handle("/", s.wrap(notFound, true))
	return logRequests(s.log, recoverPanics(s.log, cors(corsOrigins, mux)))
}

// wrap makes h a handler whose error is answered, behind the key check
// unless public.
func (s *server) wrap(h handler, public bool) http.Handler {
	var next http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			writeError(w, r, s.log, err)
		}
	})
	if !public {
		next = requireAPIKey(s.keys, s.log, next)
	}
	return next
}

// notFound answers a path that names no resource.
func notFound(w http.ResponseWriter, r *http.Request) error {
	return errorf(http.StatusNotFound, "not_found", "no such resource: %s", r.URL.Path)
}

// methodNotAllowed answers another method on a known path.
func methodNotAllowed(allow string) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Allow", allow)
		return errorf(http.StatusMethodNotAllowed, "method_not_allowed", "method %s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, allow)
	}
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

// clientRequestID matches an X-Request-Id that is safe to log as sent.
var clientRequestID = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)

// logRequests marks every answer as not to be cached or sniffed, gives it
// a request id, and writes its access line: the path without the query,
// status 0 for a client that left unanswered, and an accepted key by the
// first 8 hex digits of its digest.
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
		rec, accepted := &statusRecorder{ResponseWriter: w}, new(keyDigest)
		defer func() { // also for an answer aborted by http.ErrAbortHandler
			keyID := ""
			if *accepted != (keyDigest{}) {
				keyID = hex.EncodeToString(accepted[:4])
			}
			log.LogAttrs(r.Context(), slog.LevelInfo, "request", slog.String("request_id", id), slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Int("status", rec.status), slog.Duration("duration", time.Since(start)), slog.String("key_id", keyID))
		}()
		next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), callerKey{}, accepted)))
	})
}

// recoverPanics turns a handler's panic into a logged JSON 500.
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

// cors lets a page on one of origins call the API and read the answers'
// headers. A preflight carries no key, so it is answered here. Other
// origins get no CORS headers, and browsers refuse them.
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
// date and the operation that replaces it, relative to /v1/pets/{petId}.
func deprecate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Deprecation", "@1795305600")
		w.Header().Set("Sunset", "Thu, 05 Dec 2030 00:00:00 GMT")
		w.Header().Set("Link", `<../pets>; rel="successor-version"`)
		next.ServeHTTP(w, r)
	})
}

// serveIndex answers GET / with links relative to it.
func serveIndex(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]any{"name": "petstore", "description": "A store's catalogue of animals: list, add and get pets under /v1 with a bearer API key.",
		"links": map[string]string{"pets": "v1/pets", "openapi": "openapi.yaml", "openapiJson": "openapi.json", "health": "healthz"}})
	return nil
}

// health answers 200 only while a pet can be both read and stored.
func (s *server) health(w http.ResponseWriter, r *http.Request) error {
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(lateWriteTimeout))
	if err := s.store.health(); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

// openapiDocument describes this API. TestOpenAPIRoutes checks it
// against newHandler's routes.
//
//go:embed openapi.json
var openapiDocument []byte

// serveDocument answers the document as mediaType. JSON is valid YAML
// 1.2, so one document serves both.
func serveDocument(mediaType string) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", mediaType)
		w.Header().Set("Content-Length", strconv.Itoa(len(openapiDocument)))
		w.Write(openapiDocument)
		return nil
	}
}

// listOrders answers 501: the specification names this operation but
// does not describe it.
func listOrders(w http.ResponseWriter, r *http.Request) error {
	return errorf(http.StatusNotImplemented, "not_implemented", "GET /v1/store/orders is named by the specification but not specified, so it is not implemented")
}

// listPets answers one page in ascending id, with a Link to the next
// page, relative to the request, when more pets match.
func (s *server) listPets(w http.ResponseWriter, r *http.Request) error {
	limit, status, after, err := parseListQuery(r.URL.RawQuery)
	if err != nil {
		return err
	}
	// One more than asked tells whether there is a next page.
	pets, err := s.store.listPets(status, after, limit+1)
	if err != nil {
		return err
	}
	if len(pets) > limit {
		pets = pets[:limit]
		next := "limit=" + strconv.Itoa(limit)
		if status != "" {
			next += "&status=" + status
		}
		w.Header().Set("Link", fmt.Sprintf(`<pets?%s&after=%d>; rel="next"`, next, pets[limit-1].ID))
	}
	writeJSON(w, http.StatusOK, pets)
	return nil
}

// getPet answers one pet. It takes no query, so that a typo does not pass
// for a filter that worked.
func (s *server) getPet(w http.ResponseWriter, r *http.Request) error {
	id, ok := parseDecimal(r.PathValue("petId"))
	switch {
	case r.URL.RawQuery != "":
		return badParameter("getPet takes no query parameters, got %s", quote(r.URL.RawQuery))
	case !ok || id < 1:
		return badParameter("petId must be a pet's id, an integer from 1 to 9223372036854775807, got %s", quote(r.PathValue("petId")))
	}
	p, err := s.store.getPet(id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, p)
	return nil
}

// createPet answers 201 only once the pet is committed, with a Location
// relative to the request. A retry with the same Idempotency-Key gets the
// same 201 again.
func (s *server) createPet(w http.ResponseWriter, r *http.Request) error {
	keys := r.Header.Values("Idempotency-Key")
	if len(keys) > 1 || len(keys) == 1 && (keys[0] == "" || len(keys[0]) > 255 || !isPrintable(keys[0])) {
		return badParameter("send one Idempotency-Key header of 1 to 255 printable ASCII characters")
	}
	key := strings.Join(keys, "") // "" when none was sent
	if ct := r.Header.Get("Content-Type"); ct != "" && !isJSON(ct) {
		return errorf(http.StatusUnsupportedMediaType, "unsupported_media_type", "send the body as JSON with the header Content-Type: application/json (curl: --json)")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if errors.As(err, new(*http.MaxBytesError)) {
		return errorf(http.StatusRequestEntityTooLarge, "body_too_large", "request body is larger than %d bytes (16 KiB); a pet's body is well under 2 KB", maxBodyBytes)
	} else if err != nil {
		return errorf(http.StatusBadRequest, "invalid_body", "could not read the request body")
	}
	pet, err := decodeNewPet(body)
	if err != nil {
		return errorf(http.StatusBadRequest, "invalid_body", "%s", err)
	}
	// A create not begun within createWithin (WriteTimeout) is not stored,
	// and gets a 503. One begun gets its outcome however long it takes.
	ctx, cancel := context.WithTimeout(r.Context(), s.createWithin)
	defer cancel()
	rc := http.NewResponseController(w)
	rc.SetWriteDeadline(time.Time{})
	p, replayed, err := s.store.createPet(ctx, pet, key, idempotencyScope(r.Context()))
	rc.SetWriteDeadline(time.Now().Add(lateWriteTimeout))
	if err != nil {
		return err
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Location", "pets/"+strconv.FormatInt(p.ID, 10))
	writeJSON(w, http.StatusCreated, p)
	return nil
}

// isJSON reports whether contentType is JSON, with no charset but UTF-8.
func isJSON(contentType string) bool {
	mediaType, params, err := mime.ParseMediaType(contentType)
	return err == nil && mediaType == "application/json" && (params["charset"] == "" || strings.EqualFold(params["charset"], "utf-8"))
}

// parseListQuery reads limit (1 to 100, 20 by default), status, and
// after, the id of the last pet seen. An unknown or repeated parameter is
// refused, so that "stauts" does not return every pet.
func parseListQuery(raw string) (limit int, status string, after int64, err error) {
	values, err := url.ParseQuery(raw)
	if err != nil {
		return 0, "", 0, badParameter("malformed query string: use name=value pairs joined by &, percent-encoded")
	}
	limit = 20
	for _, name := range slices.Sorted(maps.Keys(values)) {
		v := values[name][0]
		n, isNumber := parseDecimal(v)
		switch {
		case len(values[name]) > 1:
			return 0, "", 0, badParameter("query parameter %s is given more than once", name)
		case name == "limit" && (!isNumber || n < 1 || n > 100):
			return 0, "", 0, badParameter("limit must be an integer from 1 to 100, got %s", quote(v))
		case name == "limit":
			limit = int(n)
		case name == "status" && !slices.Contains(petStatuses, v):
			return 0, "", 0, badParameter("status must be one of available, pending, sold, got %s", quote(v))
		case name == "status":
			status = v
		case name == "after" && !isNumber:
			return 0, "", 0, badParameter("after must be the id of the last pet seen (an integer from 0 to 9223372036854775807), got %s", quote(v))
		case name == "after":
			after = n
		default:
			return 0, "", 0, badParameter("unknown query parameter %s; known: limit, status, after", quote(name))
		}
	}
	return limit, status, after, nil
}

// badParameter is a 400 for a query parameter or a header.
func badParameter(format string, args ...any) error {
	return errorf(http.StatusBadRequest, "invalid_parameter", format, args...)
}

// parseDecimal parses an int64 of plain digits, without a sign, space,
// fraction or exponent.
func parseDecimal(s string) (int64, bool) {
	n, err := strconv.ParseUint(s, 10, 63)
	return int64(n), err == nil
}

// quote quotes a client's value for a message, cut short.
func quote(s string) string { return strconv.Quote(cut(s)) }

// cut is s, or its first 64 characters and "...".
func cut(s string) string {
	if utf8.RuneCountInString(s) > 64 {
		return string([]rune(s)[:64]) + "..."
	}
	return s
}

// decodeNewPet reads a create's body and names every problem with it.
// Decoding into the struct would match member names in any case, let a
// duplicate win, and stop at the first problem.
func decodeNewPet(body []byte) (NewPet, error) {
	trimmed := bytes.TrimSpace(body)
	switch {
	case len(trimmed) == 0:
		return NewPet{}, errors.New(`request body is empty; send a JSON object such as {"name":"Rex","categoryId":1}`)
	case !utf8.Valid(body): // decoding would put U+FFFD in its place, silently
		return NewPet{}, errors.New("request body is not valid UTF-8")
	case trimmed[0] != '{':
		return NewPet{}, errors.New("request body must be a JSON object")
	}
	var members map[string]json.RawMessage
	var syntax *json.SyntaxError
	if err := json.Unmarshal(body, &members); errors.As(err, &syntax) {
		return NewPet{}, fmt.Errorf("request body is not valid JSON: %v (at byte %d)", err, syntax.Offset)
	}
	var problems []string
	names := memberNames(body)
	for i, name := range names {
		switch {
		case slices.Contains(names[:i], name):
			return NewPet{}, fmt.Errorf("field %s appears more than once", quote(name))
		case name == "id":
			problems = append(problems, "id must not be sent: the service assigns it")
		case name != "name" && name != "categoryId" && name != "status":
			problems = append(problems, fmt.Sprintf("unknown field %s (a NewPet has name, categoryId and status)", quote(name)))
		}
	}
	pet := NewPet{Status: petStatuses[0]}
	name, category, status := members["name"], members["categoryId"], members["status"]
	switch {
	case name == nil || string(name) == "null":
		problems = append(problems, "name is required")
	case name[0] != '"' || json.Unmarshal(name, &pet.Name) != nil:
		problems = append(problems, "name must be a string")
	case strings.TrimSpace(pet.Name) == "":
		problems = append(problems, "name must not be empty or only whitespace")
	case utf8.RuneCountInString(pet.Name) > maxNameLength:
		problems = append(problems, fmt.Sprintf("name must be at most %d characters, got %d", maxNameLength, utf8.RuneCountInString(pet.Name)))
	case strings.ContainsFunc(pet.Name, func(r rune) bool { return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Zl, unicode.Zp) }):
		// Control characters break lines; format characters are invisible.
		problems = append(problems, "name must not contain control, format or line separator characters (such as tab, newline, U+200B zero-width space, U+202E right-to-left override or U+2028)")
	case strings.ContainsRune(pet.Name, utf8.RuneError):
		// Decoding puts U+FFFD, silently, for half a surrogate pair.
		problems = append(problems, "name must not contain U+FFFD, the replacement character, or a \\u escape of half a UTF-16 surrogate pair (such as \\ud800 alone)")
	}
	// categoryId is parsed from its text, so that a value of any size is
	// kept exactly or refused.
	id, err := strconv.ParseInt(string(category), 10, 64)
	switch {
	case category == nil || string(category) == "null":
		problems = append(problems, "categoryId is required")
	case err != nil || id < 1:
		problems = append(problems, "categoryId must be a JSON integer from 1 to 9223372036854775807, got "+quote(string(category)))
	default:
		pet.CategoryID = id
	}
	if status != nil && (status[0] != '"' || json.Unmarshal(status, &pet.Status) != nil || !slices.Contains(petStatuses, pet.Status)) {
		problems = append(problems, "status must be one of available, pending, sold (or omitted, for available), got "+cut(string(status)))
	}
	if len(problems) > 0 {
		return NewPet{}, errors.New(strings.Join(problems, "; "))
	}
	return pet, nil
}

// memberNames returns the member names of the valid JSON object in body,
// in order, duplicates too.
func memberNames(body []byte) []string {
	var names []string
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.Token() // the {
	for dec.More() {
		name, _ := dec.Token()
		names = append(names, name.(string))
		dec.Decode(new(json.RawMessage))
	}
	return names
}
