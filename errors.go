// Errors: the store's, as values (at the end of this file), the code
// vocabulary, the Error body as an error a handler returns, and
// writeError, the one place any error becomes an answer: a status, a code
// and, for a storage fault, Retry-After. The store only returns them.

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
)

// The Error body's code is one of a closed vocabulary, which README.md
// lists and clients may switch on; each is written where it is made:
//
//	invalid_body, invalid_parameter        400
//	unauthorized                           401
//	not_found                              404
//	method_not_allowed                     405
//	body_too_large                         413
//	unsupported_media_type                 415
//	idempotency_key_reused                 422
//	refused_by_database                    422
//	internal_error                         500
//	not_implemented                        501
//	unavailable, storage_failed,
//	storage_damaged                        503

// apiError is the specification's Error body, and the error a handler
// returns to be answered with it.
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"status"`
}

func (e *apiError) Error() string { return e.Message }

// errorf makes an apiError, its message formatted.
func errorf(status int, code, format string, args ...any) error {
	return &apiError{Code: code, Message: fmt.Sprintf(format, args...), Status: status}
}

// writeError answers err; every non-2xx answer of the service is made
// here. A storage fault is a 503 that names its cause, with Retry-After
// (the store logs it once, not here per request); a lock passes in a
// moment, a fault that lasts waits for an operator and has a code of its
// own, so a client retrying on "unavailable" learns that waiting alone
// will not end it. An unknown error is a 500 whose cause goes to the log
// only: it may hold internals.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	var answer *apiError
	var fault *storageError
	var refused *refusedError
	switch {
	case errors.As(err, &answer):
	case errors.As(err, new(notFoundError)):
		answer = &apiError{"not_found", err.Error(), http.StatusNotFound}
	case errors.Is(err, errIdempotencyKeyReused):
		answer = &apiError{"idempotency_key_reused", "this Idempotency-Key was already used for a different pet; use a new key for a new request", http.StatusUnprocessableEntity}
	case errors.As(err, &refused):
		answer = &apiError{"refused_by_database", refused.Error(), http.StatusUnprocessableEntity}
	case errors.As(err, &fault):
		// Each refusal is a line, the cause's own words: journald limits a
		// flood of them.
		log.Warn("storage fault", "fault", fault.Error(), "method", r.Method, "path", r.URL.Path, "request_id", w.Header().Get("X-Request-Id"))
		code, retryAfter := "unavailable", "1"
		switch fault.kind {
		case faultDiskFull, faultReadOnly:
			retryAfter = "5"
		case faultIO:
			code, retryAfter = "storage_failed", "60"
		case faultDamaged:
			code, retryAfter = "storage_damaged", "60"
		}
		w.Header().Set("Retry-After", retryAfter)
		answer = &apiError{code, string(fault.kind), http.StatusServiceUnavailable}
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client closed the connection, or only its sending half:
		// net/http reads either as gone. Nothing is wrong, and it gets no
		// answer at all, not the empty 200 that net/http would send for
		// a handler that wrote nothing.
		log.Debug("request cancelled by the client", "method", r.Method, "path", r.URL.Path, "request_id", w.Header().Get("X-Request-Id"))
		panic(http.ErrAbortHandler)
	default:
		log.Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err, "request_id", w.Header().Get("X-Request-Id"))
		// All a 500 says: our fault, and the request id that finds its
		// cause in the log.
		answer = &apiError{"internal_error", "internal error (request id " + w.Header().Get("X-Request-Id") + ")", http.StatusInternalServerError}
	}
	writeJSON(w, answer.Status, answer)
}

// writeJSON answers v as JSON and a newline. HTML escaping is off: the
// body is application/json with nosniff, never HTML, and "<" reads as "<".
func writeJSON(w http.ResponseWriter, status int, v any) {
	body := buffers.Get().(*bytes.Buffer)
	defer buffers.Put(body)
	body.Reset()
	enc := json.NewEncoder(body)
	enc.SetEscapeHTML(false)
	enc.Encode(v) // the service's own types of strings and ints: it cannot fail
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(body.Len()))
	w.WriteHeader(status)
	w.Write(body.Bytes())
}

// buffers keeps answers' buffers for the next answers: a page of pets
// is a few KiB, and making it anew each time showed in the profile.
var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// The errors the store returns besides Go's own: values a caller tests
// with errors.Is and errors.As, and writeError turns into answers.

// faultKind names a cause outside the service for which the store cannot
// store or read a pet; it says so, starting with its short name.
type faultKind string

const (
	faultDiskFull     faultKind = "disk full: the filesystem holding the database has no space left, so no pet can be stored until space is freed"
	faultReadOnly     faultKind = "read-only: the database file or its filesystem cannot be written"
	faultLocked       faultKind = "database locked: another process holds the database's write lock"
	faultNotAnswering faultKind = "database not answering"
	faultTimedOut     faultKind = "timed out: the pet could not be committed before the write timeout, so it was not stored"
	faultRefused      faultKind = "refused: a rule in the database file (an operator's trigger or constraint) refuses writes"
	// The two that last until a restart:
	faultIO      faultKind = "I/O error: a write to the storage holding the database failed, so the service writes nothing more to it until it is restarted"
	faultDamaged faultKind = "damaged: the database file is corrupt and must be restored from a backup"
)

// storageError is a store failure whose cause is outside the service.
type storageError struct {
	kind faultKind
	err  error
}

func (e *storageError) Error() string { return string(e.kind) + ": " + e.err.Error() }

var (
	// errIdempotencyKeyReused: the key already stored a different pet.
	errIdempotencyKeyReused = errors.New("idempotency key reused for a different pet")
	// errNotPetstore: the file is another application's, left untouched.
	errNotPetstore = errors.New("not a petstore database")
)

// notFoundError: no pet has the id.
type notFoundError struct{ id int64 }

func (e notFoundError) Error() string { return fmt.Sprintf("no pet with id %d", e.id) }

// classifyFault tells whether err comes from the storage, and which fault
// it is; an error it does not know is no fault.
func classifyFault(err error) (faultKind, bool) {
	var se *storageError
	if errors.As(err, &se) {
		return se.kind, true
	}
	return sqliteFault(err)
}

// refusedError: a rule in the file the service does not know of (an
// operator's trigger or constraint) refused one create.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return "the database refused this pet: " + e.err.Error() }

// notStored is a create's context error as the reason it was not stored.
func notStored(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &storageError{faultTimedOut, err}
	}
	return err
}
