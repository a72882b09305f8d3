// Errors: the Error body and its codes, the store's errors, and
// writeError, the one place where an error becomes an answer.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
)

// apiError is the specification's Error body. Its code is one of those
// README.md lists, from invalid_body to unavailable.
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"status"`
}

func (e *apiError) Error() string { return e.Message }

// errorf makes an apiError with a formatted message.
func errorf(status int, code, format string, args ...any) error {
	return &apiError{Code: code, Message: fmt.Sprintf(format, args...), Status: status}
}

// writeError answers err. A storage fault is a 503 that names its cause,
// with Retry-After and a WARN line. An unknown error is a 500 whose cause
// goes to the log only, because it may hold internals.
func writeError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	id := w.Header().Get("X-Request-Id")
	var answer *apiError
	var fault *storageError
	switch {
	case errors.As(err, &answer):
	case errors.As(err, new(notFoundError)):
		answer = &apiError{"not_found", err.Error(), http.StatusNotFound}
	case errors.Is(err, errIdempotencyKeyReused):
		answer = &apiError{"idempotency_key_reused", "this Idempotency-Key was already used for a different pet; use a new key for a new request", http.StatusUnprocessableEntity}
	case errors.As(err, new(*refusedError)):
		answer = &apiError{"refused_by_database", err.Error(), http.StatusUnprocessableEntity}
	case errors.As(err, &fault):
		log.Warn("storage fault", "fault", fault.Error(), "method", r.Method, "path", r.URL.Path, "request_id", id)
		retryAfter := "1"
		if fault.kind == faultDiskFull || fault.kind == faultReadOnly {
			retryAfter = "5"
		}
		w.Header().Set("Retry-After", retryAfter)
		answer = &apiError{"unavailable", string(fault.kind), http.StatusServiceUnavailable}
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client closed its connection, or only its sending half. It
		// gets no answer, not the empty 200 that net/http would send.
		panic(http.ErrAbortHandler)
	default:
		log.Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err, "request_id", id)
		answer = &apiError{"internal_error", "internal error (request id " + id + ")", http.StatusInternalServerError}
	}
	writeJSON(w, answer.Status, answer)
}

// writeJSON answers v as JSON. HTML escaping is off, so that a name reads
// as it was sent; nosniff keeps the body from being read as HTML.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v) // the service's own types: it cannot fail
}

// faultKind is a cause outside the service that keeps the store from
// storing or reading a pet. Its text is the answer's message.
type faultKind string

const (
	faultDiskFull     faultKind = "disk full: the filesystem holding the database has no space left, so no pet can be stored until space is freed"
	faultReadOnly     faultKind = "read-only: the database file or its filesystem cannot be written"
	faultLocked       faultKind = "database locked: another process holds the database's write lock"
	faultTooManyFiles faultKind = "too many open files: the service has no file descriptor left to open the database with"
	faultTimedOut     faultKind = "timed out: the write could not begin in time, so nothing was stored"
	faultRefused      faultKind = "refused: a rule in the database file (an operator's trigger or constraint) refuses writes"
	faultStopping     faultKind = "stopping: the service is shutting down"
	// The storage lost what it had, and the service stops (store.failed).
	faultIO      faultKind = "I/O error: a read or write of the database failed"
	faultDamaged faultKind = "damaged: the database file is corrupt"
)

// storageError is a store failure whose cause is outside the service.
type storageError struct {
	kind faultKind
	err  error
}

func (e *storageError) Error() string { return string(e.kind) + ": " + e.err.Error() }

// errIdempotencyKeyReused says the key already stored a different pet.
var errIdempotencyKeyReused = errors.New("idempotency key reused for a different pet")

// errNotPetstore says the file is another application's.
var errNotPetstore = errors.New("not a petstore database")

// notFoundError says no pet has the id.
type notFoundError struct{ id int64 }

func (e notFoundError) Error() string { return fmt.Sprintf("no pet with id %d", e.id) }

// refusedError says a rule in the file, such as an operator's trigger,
// refused one create.
type refusedError struct{ err error }

func (e *refusedError) Error() string { return "the database refused this pet: " + e.err.Error() }

// asFault returns err as a *storageError if the storage is at fault.
func asFault(err error) *storageError {
	var se *storageError
	if errors.As(err, &se) {
		return se
	}
	if kind, ok := sqliteFault(err); ok {
		return &storageError{kind, err}
	}
	return nil
}

// isFatal reports whether err means that the storage lost what it had.
func isFatal(err error) bool {
	f := asFault(err)
	return f != nil && (f.kind == faultIO || f.kind == faultDamaged)
}

// notStored turns a create's context error, if any, into the reason it
// was not stored.
func notStored(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return &storageError{faultTimedOut, err}
	}
	return err
}
