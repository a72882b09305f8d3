package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
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
	codeUnsupportedMediaType = "unsupported_media_type"
	codeNotImplemented       = "not_implemented"
	codeInternalError        = "internal_error"
	codeUnavailable          = "unavailable"
	codeIdempotencyKeyReused = "idempotency_key_reused"
)

// apiError is the Error body of the specification.
type apiError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Status  int    `json:"status"`
}

// writeError answers with the JSON Error body. Every non-2xx answer of the
// service goes through here, so they all look alike.
func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, apiError{Code: code, Message: message, Status: status})
}

// writeInternalError logs the cause of a failure and tells the client only
// that something went wrong on our side: the cause may hold internals.
func writeInternalError(w http.ResponseWriter, r *http.Request, log *slog.Logger, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The client went away; there is no one to answer and nothing wrong.
		log.DebugContext(r.Context(), "request cancelled by the client", "method", r.Method, "path", r.URL.Path)
		return
	}
	log.ErrorContext(r.Context(), "internal error", "method", r.Method, "path", r.URL.Path, "err", err)
	writeError(w, http.StatusInternalServerError, codeInternalError, internalErrorMessage(r))
}

// internalErrorMessage is all a 500 says: that it is our fault, and the
// request id to quote, which finds the cause in the log.
func internalErrorMessage(r *http.Request) string {
	return "internal error (request id " + requestInfoFrom(r.Context()).id + ")"
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
			writeError(w, http.StatusInternalServerError, codeInternalError, internalErrorMessage(r))
		}()
		next.ServeHTTP(w, r)
	})
}
