// API keys: where they come from, how a request's key is checked, and
// keygen. The service holds only SHA-256 digests of keys, compares them
// in constant time, and never logs or echoes a key.

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

// keyDigest is the SHA-256 of an API key: a memory dump does not give the
// key away, and every comparison is of two fixed-length values.
type keyDigest [sha256.Size]byte

func digestOf(key string) keyDigest { return sha256.Sum256([]byte(key)) }

// keyRing is the set of accepted keys and where they come from: the
// PETSTORE_API_KEYS list and a keys file, which SIGHUP reads again. The
// set is swapped whole, so a request never sees half of one.
type keyRing struct {
	list, file string
	digests    atomic.Pointer[[]keyDigest]
}

// newKeyRing loads the configured keys; with none, it holds none until
// useKeyFile.
func newKeyRing(list, file string) (*keyRing, error) {
	k := &keyRing{list: list, file: file}
	if list == "" && file == "" {
		return k, nil
	}
	return k, k.reload()
}

// useKeyFile, with no key configured, serves the key in the file DB.key
// beside the database, which the first start writes (mode 0600), once the
// database opened, so that a refused start leaves none: a key shown on
// stderr would be kept by journald or a log file, so the log names only
// the file. It is read as a keys file.
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

// reload reads the keys again; what does not load changes nothing. Errors
// name the entry or the line, never the key.
func (k *keyRing) reload() error {
	var digests []keyDigest
	for i, entry := range strings.Split(k.list, ",") {
		if entry = strings.TrimSpace(entry); entry != "" {
			d, problem := parseKey(entry)
			if problem != "" {
				return fmt.Errorf("PETSTORE_API_KEYS: API key number %d %s", i+1, problem)
			}
			digests = append(digests, d)
		}
	}
	if k.file != "" {
		data, err := os.ReadFile(k.file)
		if err != nil {
			return fmt.Errorf("API keys file: %w", err)
		}
		fromList := len(digests)
		// One key a line; blank lines and # comments (a whole line, or
		// after the key and a space) are skipped.
		for n, line := range strings.Split(string(data), "\n") {
			fields := strings.Fields(line)
			if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
				continue
			}
			d, problem := parseKey(fields[0])
			if len(fields) > 1 && !strings.HasPrefix(fields[1], "#") {
				problem = "holds more than one word; write one key a line, comments after #"
			}
			if problem != "" {
				return fmt.Errorf("API keys file %s: line %d: the key %s", k.file, n+1, problem)
			}
			digests = append(digests, d)
		}
		if len(digests) == fromList {
			// All comments, or emptied by a > typed for >>: that would
			// lock every client out.
			return fmt.Errorf("API keys file %s holds no key", k.file)
		}
	}
	if len(digests) == 0 { // " , " says there are keys, and gives none
		return errors.New("PETSTORE_API_KEYS holds no key")
	}
	k.digests.Store(&digests)
	return nil
}

// accepts compares d with every digest, without stopping at a match, in
// constant time: the time says nothing of which byte differs or which key
// matched.
func (k *keyRing) accepts(d keyDigest) bool {
	match := 0
	for _, want := range *k.digests.Load() {
		match |= subtle.ConstantTimeCompare(d[:], want[:])
	}
	return match == 1
}

// minKeyLength: 20 printable characters are over 130 bits even chosen at
// random, and a short one typed by hand ("secret") falls to guessing.
const minKeyLength = 20

// parseKey reads one configured key: the key, or sha256:<hex digest>,
// which a keys file holds so that it gives no key away. problem says what
// is wrong, or is "".
func parseKey(entry string) (d keyDigest, problem string) {
	if len(entry) > 7 && strings.EqualFold(entry[:7], "sha256:") { // in any case: else a digest line would be a key
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

// isToken reports whether s is non-empty printable ASCII without spaces:
// what a bearer credential can hold on the wire.
func isToken(s string) bool { return s != "" && !strings.Contains(s, " ") && isPrintable(s) }

// isPrintable reports whether s is printable ASCII, spaces included.
func isPrintable(s string) bool {
	return !strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r > '~' })
}

// generateKey returns a new random 256-bit key, URL-safe base64, which
// pastes into a shell and a header unquoted.
func generateKey() string {
	b := make([]byte, 32)
	rand.Read(b) // never fails since Go 1.24: it crashes the program instead
	return base64.RawURLEncoding.EncodeToString(b)
}

// bearerToken is the credential of "Authorization: Bearer <key>", the
// scheme in any case (RFC 9110, 11.1). Both are "" with no header;
// malformed says what is wrong with one that is not a single credential.
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

// requireAPIKey lets a request with a valid key through to next, with the
// key's digest in its context (apiKeyKey). Any other is answered 401 with
// a WWW-Authenticate challenge (RFC 6750), and one WARN line names the
// client's address, for fail2ban and the like; never the key.
func requireAPIKey(keys *keyRing, log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, malformed := bearerToken(r)
		why, msg, challenge := "missing", "missing API key: send the header Authorization: Bearer <key>", `Bearer realm="petstore"`
		switch {
		case malformed != "":
			why, msg = "malformed", malformed
		case token != "":
			if d := digestOf(token); keys.accepts(d) {
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), apiKeyKey{}, d)))
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

// apiKeyKey holds, in a request's context, the digest of the valid key it
// came with: all a handler learns of its caller.
type apiKeyKey struct{}

// idempotencyScope is what an Idempotency-Key is stored with, so that it
// belongs to the API key that sent it: a digest derived from the key's,
// for this use only, which no keys-file line would match.
func idempotencyScope(ctx context.Context) []byte {
	d, _ := ctx.Value(apiKeyKey{}).(keyDigest)
	sum := sha256.Sum256(append([]byte("petstore idempotency scope\x00"), d[:]...))
	return sum[:16]
}

// runKeygen is "petstore keygen": a new key for a client, and the keys
// file line that accepts it without holding the key.
func runKeygen(args []string, stdout io.Writer) error {
	if len(args) > 1 {
		fmt.Fprintln(stdout, "Usage: petstore keygen\n\nPrints a new API key, and the sha256: line for the keys file that accepts it.")
		if args[1] == "-h" || args[1] == "-help" || args[1] == "--help" {
			return nil
		}
		return fmt.Errorf("keygen takes no arguments, got %q", args[1])
	}
	key := generateKey()
	d := digestOf(key)
	fmt.Fprintf(stdout, "key: %s\nkeys-file line: sha256:%s\n", key, hex.EncodeToString(d[:]))
	return nil
}
