package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// keyDigest is the SHA-256 of an API key. The service keeps only digests,
// so a memory dump does not give the keys away, and every comparison is of
// two fixed-length values.
type keyDigest [sha256.Size]byte

// keyRing is the set of accepted API keys. It is swapped whole, so a
// reload never shows a request a half-built set.
type keyRing struct {
	digests atomic.Pointer[[]keyDigest]
}

// newKeyRing returns a ring holding the given digests.
func newKeyRing(digests []keyDigest) *keyRing {
	k := &keyRing{}
	k.set(digests)
	return k
}

// set replaces the accepted keys.
func (k *keyRing) set(digests []keyDigest) {
	k.digests.Store(&digests)
}

// acceptsDigest reports whether d is the digest of one of the ring's
// keys. It compares d with every digest, without stopping at a match, in
// constant time, so the time taken says nothing about which byte differs
// or which key matched.
func (k *keyRing) acceptsDigest(d keyDigest) bool {
	match := 0
	for _, want := range *k.digests.Load() {
		match |= subtle.ConstantTimeCompare(d[:], want[:])
	}
	return match == 1
}

// minKeyLength is the shortest key accepted: 20 characters of the 94
// printable ones are over 130 bits even if they were chosen at random, and
// a short one typed by hand ("secret") falls to guessing. keygen makes 43.
const minKeyLength = 20

// digestOf is a key's digest, the only form in which the service holds it.
func digestOf(key string) keyDigest { return sha256.Sum256([]byte(key)) }

// keyProblem says what is wrong with a configured key, or "": never the
// key itself, which must not reach a log.
func keyProblem(key string) string {
	switch {
	case !isTokenString(key):
		return "has a character a client cannot send in an Authorization header (allowed: printable ASCII without spaces)"
	case len(key) < minKeyLength:
		return fmt.Sprintf("is shorter than %d characters, so it could be guessed; make one with petstore keygen", minKeyLength)
	}
	return ""
}

// parseAPIKeys reads PETSTORE_API_KEYS: comma-separated, spaces around
// entries trimmed, empty entries ignored.
func parseAPIKeys(list string) ([]keyDigest, error) {
	var digests []keyDigest
	for i, entry := range strings.Split(list, ",") {
		key := strings.TrimSpace(entry)
		if key == "" {
			continue
		}
		if problem := keyProblem(key); problem != "" {
			return nil, fmt.Errorf("API key number %d %s", i+1, problem)
		}
		digests = append(digests, digestOf(key))
	}
	return digests, nil
}

// isTokenString reports whether s is non-empty printable ASCII without
// spaces, which is what a bearer credential can hold on the wire.
func isTokenString(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// generateAPIKey returns a new random key of 256 bits, URL-safe base64, so
// it pastes into a shell and a header without quoting.
func generateAPIKey() string {
	b := make([]byte, 32)
	rand.Read(b) // never fails since Go 1.24: it crashes the program instead
	return base64.RawURLEncoding.EncodeToString(b)
}

// parseKeysFile reads a keys file: one key a line, either the key itself
// or "sha256:<hex digest>"; blank lines and "#" comments (a whole line, or
// after the key and a space) are ignored. Errors name the line, never the
// key.
func parseKeysFile(data []byte) ([]keyDigest, error) {
	var digests []keyDigest
	for n, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if len(fields) > 1 && !strings.HasPrefix(fields[1], "#") {
			return nil, fmt.Errorf("line %d: more than one word; write one key a line, comments after #", n+1)
		}
		entry := fields[0]
		if hexDigest, ok := strings.CutPrefix(entry, "sha256:"); ok {
			b, err := hex.DecodeString(hexDigest)
			if err != nil || len(b) != sha256.Size {
				return nil, fmt.Errorf("line %d: sha256: must be followed by the 64 hex digits of the key's SHA-256 digest", n+1)
			}
			digests = append(digests, keyDigest(b))
			continue
		}
		if problem := keyProblem(entry); problem != "" {
			return nil, fmt.Errorf("line %d: the key %s", n+1, problem)
		}
		digests = append(digests, digestOf(entry))
	}
	return digests, nil
}

// keySource is where the accepted keys come from: the PETSTORE_API_KEYS
// list and, optionally, a keys file that SIGHUP re-reads.
type keySource struct{ list, file string }

// load reads every configured key.
func (k keySource) load() ([]keyDigest, error) {
	digests, err := parseAPIKeys(k.list)
	if err != nil {
		return nil, fmt.Errorf("PETSTORE_API_KEYS: %w", err)
	}
	if k.file == "" {
		return digests, nil
	}
	data, err := os.ReadFile(k.file)
	if err != nil {
		return nil, fmt.Errorf("API keys file: %w", err)
	}
	fromFile, err := parseKeysFile(data)
	if err != nil {
		return nil, fmt.Errorf("API keys file %s: %w", k.file, err)
	}
	if len(fromFile) == 0 {
		// A file of comments only, or emptied by a > typed for >>.
		return nil, fmt.Errorf("API keys file %s holds no key", k.file)
	}
	return append(digests, fromFile...), nil
}

// bearerToken extracts the credential of an "Authorization: Bearer <key>"
// header. The scheme is matched case-insensitively (RFC 9110, 11.1). Both
// are "" when the header is absent; malformed says what is wrong when it
// is present but is not a single bearer credential.
func bearerToken(r *http.Request) (token, malformed string) {
	values := r.Header.Values("Authorization")
	switch {
	case len(values) == 0:
		return "", ""
	case len(values) > 1:
		return "", "two or more Authorization headers were sent: send exactly one, Authorization: Bearer <key>"
	}
	scheme, cred, found := strings.Cut(strings.TrimSpace(values[0]), " ")
	cred = strings.TrimLeft(cred, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") || !isTokenString(cred) {
		return "", "malformed Authorization header: expected Authorization: Bearer <key>"
	}
	return cred, ""
}

// requireAPIKey lets a request through to next only with a valid bearer
// key. Any other request is answered at once, without waiting for its
// body, and an HTTP/1.1 connection is closed (Go's server would otherwise
// read up to 256 KiB of an unread body first; an HTTP/2 connection
// carries other requests): 401 with a WWW-Authenticate
// challenge (RFC 6750), or 429 once its address has failed too often.
// The key is checked first, so a valid key is served whatever else came
// from its address. Neither the key nor the header is ever logged or
// echoed: the access log (see logRequests) gets only the digest of a
// well-formed key, valid or not, to tell keys apart, and the handlers get
// the valid key's digest in the request's context (see apiKeyOf), to
// scope an Idempotency-Key to its key.
func requireAPIKey(keys *keyRing, guard *authGuard, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, malformed := bearerToken(r)
		why, challenge := "missing", `Bearer realm="petstore"`
		msg := "missing API key: send the header Authorization: Bearer <key>"
		switch {
		case malformed != "":
			why, msg = "malformed", malformed
		case token != "":
			d := digestOf(token)
			info, _ := infoOf(r.Context())
			info.key, info.hasKey = d, true
			if keys.acceptsDigest(d) {
				next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), apiKeyKey{}, d)))
				return
			}
			why, msg, challenge = "invalid", "invalid API key", `Bearer realm="petstore", error="invalid_token"`
		}
		h := w.Header()
		if r.ProtoMajor == 1 {
			h["Connection"] = connectionClose
		}
		if wait := guard.failed(clientAddr(r), why, time.Now()); wait > 0 {
			secs := int(math.Ceil(wait.Seconds()))
			h.Set("Retry-After", strconv.Itoa(secs))
			writeError(w, http.StatusTooManyRequests, codeRateLimited,
				fmt.Sprintf("too many failed authentications from this address; retry after %d s", secs))
			return
		}
		h.Set("WWW-Authenticate", challenge)
		writeError(w, http.StatusUnauthorized, codeUnauthorized, msg)
	})
}

// apiKeyKey holds, in a request's context, the digest of the valid key
// it came with: what a handler knows of its caller (see apiKeyOf).
type apiKeyKey struct{}

// apiKeyOf is the digest of the key a request was let through with.
func apiKeyOf(ctx context.Context) (keyDigest, bool) {
	d, ok := ctx.Value(apiKeyKey{}).(keyDigest)
	return d, ok
}

// runKeygen is "petstore keygen": a new key for the client, and the line
// that lets the service accept it without keeping it in plain text.
func runKeygen(args []string, stdout io.Writer) error {
	if len(args) == 2 && (args[1] == "-h" || args[1] == "-help" || args[1] == "--help") {
		fmt.Fprintln(stdout, "Usage: petstore keygen\n\nPrints a new API key for a client, and the sha256: line for the keys file\n(-api-keys-file) that accepts it without storing it in plain text.")
		return nil
	}
	if len(args) > 1 {
		return fmt.Errorf("keygen takes no arguments, got %q (petstore keygen -h)", args[1])
	}
	key := generateAPIKey()
	// The keys-file line holds the key's digest, not the key.
	d := digestOf(key)
	fmt.Fprintf(stdout, "key: %s\nkeys-file line: sha256:%s\n", key, hex.EncodeToString(d[:]))
	return nil
}

// authGuard counts failed authentication (a missing, malformed or wrong
// key) per client address. Once an address has failed maxAuthFailures
// times in a minute, its failures for the rest of that minute are
// answered 429 with Retry-After rather than 401, which tells a stale
// script to stop; a valid key from the same address is served all the
// same, so one bad script behind an office's NAT locks out nobody. What
// slows a guesser is that every failed answer closes its connection (a
// new TCP, and with TLS a new handshake, per guess); what makes guessing
// hopeless is the key's length (see minKeyLength). The log gets at most one
// line an address a minute, with the count, for fail2ban and the like,
// and at most maxAuthLinesPerMinute in all. Memory is bounded: at most
// maxGuardedAddrs addresses are tracked at once.
type authGuard struct {
	log   *slog.Logger
	lines *logLimiter

	mu    sync.Mutex
	addrs map[string]*authFailures
}

// authFailures are an address's failures in the minute that began with
// the first of them.
type authFailures struct {
	windowStart time.Time
	failures    int
}

const (
	maxAuthFailures       = 20
	authWindow            = time.Minute
	maxGuardedAddrs       = 100_000
	maxAuthLinesPerMinute = 60
)

func newAuthGuard(log *slog.Logger) *authGuard {
	return &authGuard{log: log, addrs: map[string]*authFailures{},
		lines: newLogLimiter(authWindow, maxGuardedAddrs, maxAuthLinesPerMinute)}
}

// clientAddr is who the guard counts a request against: the client's
// host, and for IPv6 the /64 it is in, which one subscriber holds whole.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return host
}

// failed records a failed authentication from addr, and why ("missing",
// "malformed", "invalid"), never the key. It returns how long addr is
// answered 429, 0 while it is under the limit.
func (g *authGuard) failed(addr, why string, now time.Time) time.Duration {
	if ok, held, others := g.lines.allow(addr, now); ok {
		g.log.Warn("authentication failed", "client", addr, "failures", held+1, "last", why, "other_addresses_not_logged", others)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	f := g.addrs[addr]
	if f == nil || now.Sub(f.windowStart) >= authWindow {
		if f == nil && len(g.addrs) >= maxGuardedAddrs {
			// Full: forget the addresses whose minute is over, or else all
			// of them; a guesser forgotten early is counted from 0 again.
			for a, old := range g.addrs {
				if now.Sub(old.windowStart) >= authWindow || len(g.addrs) > maxGuardedAddrs/2 {
					delete(g.addrs, a)
				}
			}
		}
		f = &authFailures{windowStart: now}
		g.addrs[addr] = f
	}
	f.failures++
	if f.failures <= maxAuthFailures {
		return 0
	}
	return f.windowStart.Add(authWindow).Sub(now)
}

// idempotencyScope is what an Idempotency-Key is stored with, so that it
// belongs to the API key that sent it: a digest derived from the key's,
// for this use only, so the database holds nothing a keys file line would
// match.
func idempotencyScope(d keyDigest) []byte {
	sum := sha256.Sum256(append([]byte("petstore idempotency scope\x00"), d[:]...))
	return sum[:16]
}
