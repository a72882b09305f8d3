package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestAuth(t *testing.T) {
	svc := startService(t, nil)
	const missing = "missing API key: send the header Authorization: Bearer <key>"
	const malformed = "malformed Authorization header: expected Authorization: Bearer <key>"
	challenge := `Bearer realm="petstore"`
	invalid := `Bearer realm="petstore", error="invalid_token"`
	tests := []struct {
		name      string
		auth      string
		status    int
		challenge string
		want      string
	}{
		{"valid", "Bearer " + testKey, 200, "", `[]`},
		{"scheme in lower case", "bearer " + testKey, 200, "", `[]`},
		{"scheme in capitals", "BEARER " + testKey, 200, "", `[]`},
		{"missing", "", 401, challenge, errBody(401, codeUnauthorized, missing)},
		{"wrong key", "Bearer not-the-key", 401, invalid, errBody(401, codeUnauthorized, "invalid API key")},
		{"key with a suffix", "Bearer " + testKey + "x", 401, invalid, errBody(401, codeUnauthorized, "invalid API key")},
		{"key prefix", "Bearer " + testKey[:5], 401, invalid, errBody(401, codeUnauthorized, "invalid API key")},
		{"basic scheme", "Basic dXNlcjpwYXNz", 401, challenge, errBody(401, codeUnauthorized, malformed)},
		{"bare key", testKey, 401, challenge, errBody(401, codeUnauthorized, malformed)},
		{"scheme without key", "Bearer", 401, challenge, errBody(401, codeUnauthorized, malformed)},
		{"scheme and space", "Bearer ", 401, challenge, errBody(401, codeUnauthorized, malformed)},
		{"two tokens", "Bearer " + testKey + " extra", 401, challenge, errBody(401, codeUnauthorized, malformed)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := send(t, svc.url, call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": tt.auth}})
			// A refusal closes its connection: no body is waited for.
			closes := map[int]string{200: "", 401: "close"}[tt.status]
			checkReply(t, got, tt.status, map[string]string{"WWW-Authenticate": tt.challenge, "Connection": closes}, tt.want)
			if bytes.Contains(got.body, []byte(testKey)) {
				t.Errorf("body echoes the key: %s", got.body)
			}
		})
	}

	t.Run("two Authorization headers", func(t *testing.T) {
		got := send(t, svc.url, call{method: "GET", path: "/v1/pets", extra: http.Header{"Authorization": {"Bearer " + testKey}}})
		checkReply(t, got, 401, map[string]string{"WWW-Authenticate": challenge},
			errBody(401, codeUnauthorized, "two or more Authorization headers were sent: send exactly one, Authorization: Bearer <key>"))
	})

	// Every /v1 path needs the key, including ones that do not exist and
	// methods that are not allowed.
	for _, c := range []call{
		{method: "GET", path: "/v1/pets"},
		{method: "POST", path: "/v1/pets", body: `{"name":"Rex","categoryId":1}`},
		{method: "GET", path: "/v1/pets/1"},
		{method: "GET", path: "/v1/store/orders"},
		{method: "DELETE", path: "/v1/pets"},
		{method: "GET", path: "/v1/nothing"},
		{method: "GET", path: "/v1"},
	} {
		t.Run("no key "+c.method+" "+c.path, func(t *testing.T) {
			c.header = noKey
			checkReply(t, send(t, svc.url, c), 401, map[string]string{"WWW-Authenticate": challenge}, errBody(401, codeUnauthorized, missing))
		})
	}
	// Nothing was created without a key.
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets"}), 200, nil, `[]`)
}

func TestKeysFile(t *testing.T) {
	digestOf := func(k string) keyDigest { return sha256.Sum256([]byte(k)) }
	tests := []struct {
		name    string
		file    string
		want    []keyDigest
		wantErr string
	}{
		{"plain and hashed keys with comments", "# back office\nplain-key-0123456789ab\n\n  sha256:" + hexDigest("hashed-key") + "  # scripts\n#old-key\n",
			[]keyDigest{digestOf("plain-key-0123456789ab"), digestOf("hashed-key")}, ""},
		{"empty file", "", nil, ""},
		{"only comments", "# nothing yet\n", nil, ""},
		{"CRLF line ends", "a-key-0123456789abcdef\r\nb-key-0123456789abcdef\r\n", []keyDigest{digestOf("a-key-0123456789abcdef"), digestOf("b-key-0123456789abcdef")}, ""},
		{"two words", "good-key-0123456789ab\nsecret-one secret-two\n", nil, "line 2: more than one word; write one key a line, comments after #"},
		{"short digest", "sha256:abcd\n", nil, "line 1: sha256: must be followed by the 64 hex digits of the key's SHA-256 digest"},
		{"digest not hex", "sha256:" + strings.Repeat("z", 64) + "\n", nil, "line 1: sha256: must be followed by the 64 hex digits of the key's SHA-256 digest"},
		{"non-ASCII key", "ключ\n", nil, "line 1: the key has a character a client cannot send in an Authorization header (allowed: printable ASCII without spaces)"},
		{"short key", "plain-key-0123456789ab\nsecret\n", nil, "line 2: the key is shorter than 20 characters, so it could be guessed; make one with petstore keygen"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseKeysFile([]byte(tt.file))
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if gotErr != tt.wantErr {
				t.Fatalf("error = %q, want %q", gotErr, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("digests (-want +got):\n%s", diff)
			}
			if strings.Contains(gotErr, "secret") {
				t.Errorf("error shows a key: %s", gotErr)
			}
		})
	}
}

func TestKeygen(t *testing.T) {
	var out bytes.Buffer
	must(t, run(context.Background(), []string{"petstore", "keygen"}, func(string) string { return "" }, &out, io.Discard))
	m := regexp.MustCompile(`^key: ([A-Za-z0-9_-]{43})\nkeys-file line: sha256:([0-9a-f]{64})\n$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("keygen output %q", out.String())
	}
	if m[2] != hexDigest(m[1]) {
		t.Errorf("line's digest %s is not the key's %s", m[2], hexDigest(m[1]))
	}
}

func TestKeysFileReloadOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	keysFile := filepath.Join(dir, "keys")
	write := func(content string) {
		must(t, os.WriteFile(keysFile, []byte(content), 0o600))
	}
	write("old-key-0123456789abcdef\nsha256:" + hexDigest("new-key-0123456789abcdef") + "\n")
	svc := startService(t, map[string]string{"PETSTORE_API_KEYS": "", "PETSTORE_API_KEYS_FILE": keysFile})
	base, stderr := svc.url, svc.log
	hup := func() {
		must(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	}
	ok := func(key string) {
		checkReply(t, send(t, base, call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": "Bearer " + key}}), 200, nil, `[]`)
	}
	refused := func(key string) {
		checkReply(t, send(t, base, call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": "Bearer " + key}}), 401, nil, errBody(401, codeUnauthorized, "invalid API key"))
	}
	ok("old-key-0123456789abcdef")
	ok("new-key-0123456789abcdef")

	// Revoke old-key-0123456789abcdef without a restart.
	write("# old-key-0123456789abcdef revoked\nsha256:" + hexDigest("new-key-0123456789abcdef") + "\n")
	hup()
	waitForLog(t, stderr, `API keys reloaded" keys=1`, 1)
	refused("old-key-0123456789abcdef")
	ok("new-key-0123456789abcdef")

	// A broken file changes nothing and says why.
	write("new-key-0123456789abcdef\nsha256:broken\n")
	hup()
	waitForLog(t, stderr, `API keys not reloaded; the previous keys stay in force" err="API keys file \S+ line 2: sha256: must be followed`, 1)
	ok("new-key-0123456789abcdef")
	refused("old-key-0123456789abcdef")

	// So does a key too short to be safe; the error names the line.
	write("new-key-0123456789abcdef\nguessable\n")
	hup()
	waitForLog(t, stderr, `API keys not reloaded; the previous keys stay in force" err="API keys file \S+ line 2: the key is shorter than 20 characters`, 1)
	ok("new-key-0123456789abcdef")

	// A file with no key (all comments, or emptied by a > typed for >>)
	// is refused as at start: it would lock every client out.
	write("# every key commented out\n# new-key-0123456789abcdef\n")
	hup()
	waitForLog(t, stderr, `level=ERROR msg="SIGHUP: API keys not reloaded; the previous keys stay in force" err="API keys file `+regexp.QuoteMeta(keysFile)+` holds no key"`, 1)
	ok("new-key-0123456789abcdef")
	write("")
	hup()
	waitForLog(t, stderr, `API keys not reloaded; the previous keys stay in force" err="API keys file \S+ holds no key"`, 2)
	ok("new-key-0123456789abcdef")
	if strings.Contains(stderr.String(), "old-key-0123456789abcdef") || strings.Contains(stderr.String(), "new-key-0123456789abcdef") {
		t.Errorf("log shows a key:\n%s", stderr.String())
	}
}

// TestFailedAuthenticationPerAddress sends 1,000 wrong keys to the binary
// from one address while a client with a valid key calls from another.
// The guesser gets at most 20 answers of 401 before 429s with
// Retry-After; a valid key from its own address is served all along; at
// most two WARN lines name its address, never a key; the other client
// never fails.
func TestFailedAuthenticationPerAddress(t *testing.T) {
	logs := &syncBuffer{}
	base, _ := startBinary(t, nil, nil, logs)
	from := func(ip string) *http.Client {
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &http.Client{Timeout: patience, Transport: &http.Transport{DialContext: dialer.DialContext}}
	}
	get := func(c *http.Client, key string) reply {
		return send(t, base, call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": "Bearer " + key}, client: c})
	}
	office := from("127.0.0.2")
	var officeFailures atomic.Int64
	stop := inLoops(t, 2, func() {
		if r := get(office, testKey); r.status != 200 {
			officeFailures.Add(1)
		}
	})
	guesser := from("127.0.0.1")
	answers := map[int]int{}
	unauthorizedBefore429 := 0
	for i := range 1000 {
		r := get(guesser, fmt.Sprintf("wrong-key-%04d-0123456789", i))
		answers[r.status]++
		if r.status == 401 && answers[429] == 0 {
			unauthorizedBefore429++
		}
		if secs, err := strconv.Atoi(r.header.Get("Retry-After")); r.status == 429 && (err != nil || secs < 1 || secs > 60) {
			t.Fatalf("429 with Retry-After %q, want 1 to 60 seconds", r.header.Get("Retry-After"))
		}
		if r.header.Get("Connection") != "close" {
			t.Fatalf("a failed authentication left its connection open: %d %v", r.status, r.header)
		}
		// The guesser's address holds a valid client too: served.
		if i%100 == 25 {
			checkReply(t, get(guesser, testKey), 200, map[string]string{"Retry-After": ""}, `[]`)
		}
	}
	stop()
	if unauthorizedBefore429 != 20 || answers[401]+answers[429] != 1000 {
		t.Errorf("1,000 wrong keys from one address were answered %v, with %d 401s before the first 429; want 20", answers, unauthorizedBefore429)
	}
	if n := officeFailures.Load(); n != 0 {
		t.Errorf("%d requests with a valid key from another address failed meanwhile", n)
	}
	warns := countLines(logs, `level=WARN msg="authentication failed" client=127\.0\.0\.1 failures=\d+`)
	if all := countLines(logs, `level=WARN`); warns < 1 || all != warns || all > 2 {
		t.Errorf("%d WARN lines, %d of them about failed authentication from 127.0.0.1; want 1 or 2:\n%.3000s", all, warns, logs)
	}
	if strings.Contains(logs.String(), "wrong-key-") || strings.Contains(logs.String(), testKey) {
		t.Error("the log shows a key")
	}
	t.Logf("1,000 wrong keys from one address: %v, %d answered 401 before the first 429", answers, unauthorizedBefore429)
}

// TestAuthGuardUnderManyAddresses: 150,000 addresses (IPv6 /64s) failing
// once each get at most 60 log lines a minute and bounded memory; an
// address failing 21 times is still answered 429 after them; addresses in
// one /64 count as one.
func TestAuthGuardUnderManyAddresses(t *testing.T) {
	logs := &syncBuffer{}
	g := newAuthGuard(slog.New(slog.NewTextHandler(logs, nil)))
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	addr := func(remote string) string {
		return clientAddr(&http.Request{RemoteAddr: remote})
	}
	for i := range 150_000 {
		g.failed(addr(fmt.Sprintf("[2001:db8:%x:%x::1]:4000", i>>16, i&0xffff)), "invalid", now)
	}
	if n := len(g.addrs); n > maxGuardedAddrs {
		t.Errorf("%d addresses tracked, want at most %d", n, maxGuardedAddrs)
	}
	if n := countLines(logs, "level=WARN"); n > maxAuthLinesPerMinute {
		t.Errorf("%d lines for 150,000 addresses in one minute, want at most %d", n, maxAuthLinesPerMinute)
	}
	// 20 failures from one /64, from two of its addresses; the 21st, from
	// a third, is answered 429 for the rest of the minute.
	for i := range 20 {
		if wait := g.failed(addr(fmt.Sprintf("[2001:db8:ffff:1::%x]:4000", i%2+1)), "invalid", now); wait != 0 {
			t.Fatalf("failure %d answered 429 for %s", i+1, wait)
		}
	}
	if wait := g.failed(addr("[2001:db8:ffff:1::99]:5000"), "invalid", now.Add(time.Second)); wait != authWindow-time.Second {
		t.Errorf("the 21st failure of the /64 is answered 429 for %s, want %s", wait, authWindow-time.Second)
	}
	if wait := g.failed(addr("[2001:db8:ffff:2::1]:5000"), "invalid", now); wait != 0 {
		t.Errorf("another /64 is answered 429 for %s", wait)
	}
	if wait := g.failed(addr("192.0.2.7:5000"), "invalid", now.Add(authWindow)); wait != 0 {
		t.Errorf("an IPv4 address failing once is answered 429 for %s", wait)
	}
}

// hexDigest is a key's SHA-256 in hex, computed apart from the code
// under test.
func hexDigest(k string) string {
	d := sha256.Sum256([]byte(k))
	return hex.EncodeToString(d[:])
}
