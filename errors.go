package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
)

// The closed vocabulary of the Error body's code field. README.md lists
// them; a client may switch on them.
const (
	codeUnauthorized         = "unauthorized"
	codeInvalidBody          = "invalid_body"
	codeInvalidParameter     = "invalid_parameter"
	codeNotFound             = "not_found"
	codeMethodNotAllowed     = "method_not_allowed"
	codeBodyTooLarge         = "body_too_large"
	codeLengthRequired       = "length_required"
	codeUnsupportedMediaType = "unsupported_media_type"
	codeNotImplemented       = "not_implemented"
	codeInternalError        = "internal_error"
	codeUnavailable          = "unavailable"
	codeIdempotencyKeyReused = "idempotency_key_reused"
	codeRateLimited          = "rate_limited"
	// codeRefusedByDatabase: a rule in the database file that the service
	// does not know of (an operator's trigger) refused this one create.
	codeRefusedByDatabase = "refused_by_database"
	// codeStorageTampered: creates are refused until a restart because the
	// database's -wal or -shm was deleted or replaced under the service.
	codeStorageTampered = "storage_tampered"
	// codeStorageFailed: creates are refused until a restart because a
	// write to the storage failed with an I/O error.
	codeStorageFailed = "storage_failed"
	// codeStorageDamaged: the database file is corrupt; creates, and reads
	// of what cannot be read, are refused until it is restored.
	codeStorageDamaged = "storage_damaged"
	// codeAcknowledgedPetsMissing: creates are refused because the file
	// lost pets this service acknowledged (see faultWentBack).
	codeAcknowledgedPetsMissing = "acknowledged_pets_missing"
)

// faultAnswers is how a client is told of each storage fault, beside
// its message (faultMessages): the Error body's code and the Retry-After
// in seconds. A lock passes quickly; a lasting fault waits for an
// operator, and has a code of its own, so a client that retries blindly
// on "unavailable" learns that waiting alone will not end it.
var faultAnswers = map[faultKind]struct{ code, retryAfter string }{
	faultDiskFull:     {codeUnavailable, "5"},
	faultReadOnly:     {codeUnavailable, "5"},
	faultLocked:       {codeUnavailable, "1"},
	faultNotAnswering: {codeUnavailable, "1"},
	faultTimedOut:     {codeUnavailable, "1"},
	faultStarting:     {codeUnavailable, "1"},
	faultIO:           {codeStorageFailed, "60"},
	faultDamaged:      {codeStorageDamaged, "60"},
	faultReplaced:     {codeUnavailable, "60"},
	faultTampered:     {codeStorageTampered, "60"},
	faultWentBack:     {codeAcknowledgedPetsMissing, "60"},
	faultMissing:      {codeAcknowledgedPetsMissing, "60"},
}

// apiError is the Error body of the specification.
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"status"`
}

// writeError answers with the JSON Error body. Every non-2xx answer of the
// service goes through here, so they all look alike.
func writeError(w http.ResponseWriter, status int, code, message string) {
	writeBody(w, status, marshalJSON(apiError{Code: code, Message: message, Status: status}))
}

// writeStoreError answers a failure of the store. A storage fault, whose
// cause is outside the service (disk full, read-only, locked, damaged,
// replaced), is a 503 that names the cause, with Retry-After, and is
// logged by the store once per fault rather than here per request; any
// other failure is a 500, whose cause is logged and not told to the
// client: it may hold internals.
func writeStoreError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	var fault *storageError
	switch {
	case errors.As(err, &fault):
		answer := faultAnswers[fault.kind]
		w.Header().Set("Retry-After", answer.retryAfter)
		writeError(w, http.StatusServiceUnavailable, answer.code, fault.kind.message())
	case errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The client went away; there is no one to answer and nothing wrong.
		log.DebugContext(r.Context(), "request cancelled by the client", "method", r.Method, "path", r.URL.Path)
	default:
		log.ErrorContext(r.Context(), "internal error", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, codeInternalError, internalErrorMessage(w))
	}
}

// internalErrorMessage is all a 500 says: that it is our fault, and the
// request id to quote, which finds the cause in the log. The id is the
// X-Request-Id the answer already carries, so the message and the header
// cannot disagree.
func internalErrorMessage(w http.ResponseWriter) string {
	return "internal error (request id " + w.Header().Get("X-Request-Id") + ")"
}

// marshalJSON is v as JSON and a newline, for what is off the hot paths
// (the Error body, a name appendJSONString cannot copy). HTML escaping is
// off: the body is application/json with nosniff, never HTML, and "<"
// should read as "<".
func marshalJSON(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(v) // strings and the service's own types of strings and ints: it cannot fail
	return buf.Bytes()
}

// contentTypeJSON is shared by every answer; net/http only reads it.
var contentTypeJSON = []string{"application/json"}

// writeBody answers with a JSON body already encoded.
func writeBody(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h["Content-Type"] = contentTypeJSON
	h["Content-Length"] = []string{strconv.Itoa(len(body))}
	w.WriteHeader(status)
	w.Write(body)
}
