// API keys: where they come from, the bearer check, and keygen. The
// service holds only keys' SHA-256 digests, compares them in constant
// time, and never logs or echoes a key.

package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
)

// keyDigest is the SHA-256 of an API key.
type keyDigest [sha256.Size]byte

// digestOf is the digest of key.
func digestOf(key string) keyDigest { return sha256.Sum256([]byte(key)) }

// keyRing is the set of accepted keys, from the PETSTORE_API_KEYS list
// and a keys file. reload replaces the whole set at once.
type keyRing struct {
	list, file string
	digests    atomic.Pointer[[]keyDigest]
}

// useKeyFile, with no key configured, creates DB.key with a random key
// unless it exists, and loads it as a keys file. Only its name is logged.
func (k *keyRing) useKeyFile(db string, log *slog.Logger) error {
	if k.list != "" || k.file != "" {
		return nil
	}
	k.file = db + ".key"
	f, err := os.OpenFile(k.file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		_, err = fmt.Fprintln(f, generateKey())
		err = errors.Join(err, f.Sync(), f.Close())
	}
	if err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("generated API key file: %w", err)
	}
	abs, _ := filepath.Abs(k.file)
	log.Warn("no API key configured (PETSTORE_API_KEYS, -api-keys-file): serving with the key in key_file, made at the first start; send it as Authorization: Bearer <key>", "key_file", abs)
	return k.reload()
}

// reload reads the keys again. If they do not load, the old ones stay in
// force, and the error names the entry, never the key.
func (k *keyRing) reload() error {
	digests, err := parseKeys(k.list, ",", "PETSTORE_API_KEYS: key")
	if err == nil && k.file != "" {
		data, readErr := os.ReadFile(k.file)
		if readErr != nil {
			return fmt.Errorf("API keys file: %w", readErr)
		}
		fromFile, parseErr := parseKeys(string(data), "\n", "API keys file "+k.file+": line")
		if err = parseErr; err == nil && len(fromFile) == 0 {
			// An empty file, as a > typed for >> leaves, would lock every
			// client out.
			err = fmt.Errorf("API keys file %s holds no key", k.file)
		}
		digests = append(digests, fromFile...)
	}
	if err == nil && len(digests) == 0 {
		err = errors.New("PETSTORE_API_KEYS holds no key") // such as " , "
	}
	if err == nil {
		k.digests.Store(&digests)
	}
	return err
}

// parseKeys reads one key per entry of text, split at sep, after which
// a # comment may follow. where names the source in an error.
func parseKeys(text, sep, where string) ([]keyDigest, error) {
	var digests []keyDigest
	for n, entry := range strings.Split(text, sep) {
		fields := strings.Fields(entry)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		d, problem := parseKey(fields[0])
		if len(fields) > 1 && !strings.HasPrefix(fields[1], "#") {
			problem = "holds more than one word; write one key per entry, comments after #"
		}
		if problem != "" {
			return nil, fmt.Errorf("%s %d: the key %s", where, n+1, problem)
		}
		digests = append(digests, d)
	}
	return digests, nil
}

// accepts compares d with every digest in constant time, so that the
// time says nothing of which byte differs or which key matched.
func (k *keyRing) accepts(d keyDigest) bool {
	match := 0
	for _, want := range *k.digests.Load() {
		match |= subtle.ConstantTimeCompare(d[:], want[:])
	}
	return match == 1
}

// minKeyLength is the shortest key accepted, because a short one falls
// to guessing.
const minKeyLength = 20

// parseKey reads one key, or sha256:<hex digest>, and says what is
// wrong with it, if anything.
func parseKey(entry string) (d keyDigest, problem string) {
	if len(entry) > 7 && strings.EqualFold(entry[:7], "sha256:") { // any case, so that SHA256: is not read as a key
		b, err := hex.DecodeString(entry[7:])
		if err != nil || len(b) != sha256.Size {
			return d, "is not sha256: followed by the 64 hex digits of the key's SHA-256 digest"
		}
		return keyDigest(b), ""
	}
	switch {
	case !isToken(entry):
		return d, "has a character a client cannot send in an Authorization header (allowed: printable ASCII without spaces)"
	case len(entry) < minKeyLength:
		return d, fmt.Sprintf("is shorter than %d characters, so it could be guessed; make one with petstore keygen", minKeyLength)
	}
	return digestOf(entry), ""
}

// isToken reports whether s can be a bearer credential.
func isToken(s string) bool { return s != "" && !strings.Contains(s, " ") && isPrintable(s) }

// isPrintable reports whether s is printable ASCII, spaces included.
func isPrintable(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r > '~' })
}

// generateKey returns a new random 256-bit key in URL-safe base64.
func generateKey() string {
	b := make([]byte, 32)
	rand.Read(b) // it never returns an error
	return base64.RawURLEncoding.EncodeToString(b)
}

// bearerToken is the credential of "Authorization: Bearer <key>", with
// the scheme in any case, or what is wrong with the header.
func bearerToken(r *http.Request) (token, malformed string) {
	values := r.Header.Values("Authorization")
	switch {
	case len(values) == 0:
		return "", ""
	case len(values) > 1:
		return "", "two or more Authorization headers were sent: send exactly one, Authorization: Bearer <key>"
	}
	scheme, cred, _ := strings.Cut(strings.TrimSpace(values[0]), " ")
	if cred = strings.TrimLeft(cred, " "); !strings.EqualFold(scheme, "Bearer") || !isToken(cred) {
		return "", "malformed Authorization header: expected Authorization: Bearer <key>"
	}
	return cred, ""
}

// requireAPIKey lets a request with a valid key through to next, and
// notes the key's digest at callerKey. Any other gets a 401, and one WARN
// line names the client's address.
func requireAPIKey(keys *keyRing, log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, malformed := bearerToken(r)
		why, msg, challenge := "missing", "missing API key: send the header Authorization: Bearer <key>", `Bearer realm="petstore"`
		switch {
		case malformed != "":
			why, msg = "malformed", malformed
		case token != "":
			if d := digestOf(token); keys.accepts(d) {
				*r.Context().Value(callerKey{}).(*keyDigest) = d
				next.ServeHTTP(w, r)
				return
			}
			why, msg, challenge = "invalid", "invalid API key", `Bearer realm="petstore", error="invalid_token"`
		}
		client, _, _ := net.SplitHostPort(r.RemoteAddr)
		log.Warn("authentication failed", "client", client, "key", why, "path", r.URL.Path, "request_id", w.Header().Get("X-Request-Id"))
		w.Header().Set("WWW-Authenticate", challenge)
		writeError(w, r, log, errorf(http.StatusUnauthorized, "unauthorized", "%s", msg))
	})
}

// callerKey is the context key of the *keyDigest that logRequests gives
// every request, which stays zero unless requireAPIKey accepts a key.
type callerKey struct{}

// idempotencyScope is what an Idempotency-Key is stored with, so that it
// belongs to the API key that sent it. It is derived from the key's
// digest, so that the database never holds what a keys file holds.
func idempotencyScope(ctx context.Context) []byte {
	d := ctx.Value(callerKey{}).(*keyDigest)
	sum := sha256.Sum256(append([]byte("petstore idempotency scope\x00"), d[:]...))
	return sum[:16]
}

// runKeygen is "petstore keygen": a new key, and its keys-file line.
func runKeygen(args []string, stdout io.Writer) error {
	if len(args) > 1 {
		return fmt.Errorf("keygen takes no arguments, got %q; it prints a new key and its keys-file line", args[1])
	}
	key := generateKey()
	d := digestOf(key)
	fmt.Fprintf(stdout, "key: %s\nkeys-file line: sha256:%s\n", key, hex.EncodeToString(d[:]))
	return nil
}
