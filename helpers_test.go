package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"go/build"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testKey is the API key every test server accepts.
const testKey = "test-key-4f1d2c"

// newTestServer starts the real handler on a real listener over a fresh
// database file in a temp dir.
func newTestServer(t testing.TB) (*httptest.Server, *petStore) {
	t.Helper()
	return newTestServerAt(t, filepath.Join(t.TempDir(), "pets.db"))
}

// newTestServerAt is newTestServer over the database file at path.
func newTestServerAt(t testing.TB, path string) (*httptest.Server, *petStore) {
	t.Helper()
	store, err := openStore(path, storeOptions{})
	if err != nil {
		t.Fatalf("openStore: %v", err)
	}
	t.Cleanup(func() { store.close() })
	digests, err := parseAPIKeys(testKey)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(newHandler(&server{store: store, keys: newKeyRing(digests), log: quietLogger()}))
	t.Cleanup(srv.Close)
	return srv, store
}

// call is one request a test sends. Unless header says otherwise it
// carries the test key.
type call struct {
	method string
	path   string
	body   string
	header map[string]string
}

// reply is what came back.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// do sends c to srv. It fails the test if there is no answer, so it is
// for the test's goroutine; other goroutines use tryDo.
func do(t *testing.T, srv *httptest.Server, c call) reply {
	t.Helper()
	r, err := tryDo(t, srv, c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tryDo sends c to srv and returns the reply, or the error when there is
// none. A reply that breaks the OpenAPI document is reported with
// t.Errorf, so tryDo is safe in any goroutine.
func tryDo(t testing.TB, srv *httptest.Server, c call) (reply, error) {
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, srv.URL+c.path, body)
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	if c.method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range c.header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", c.method, c.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: reading the body: %w", c.method, c.path, err)
	}
	r := reply{status: resp.StatusCode, header: resp.Header, body: b}
	checkAgainstOpenAPI(t, c.method, c.path, r)
	return r, nil
}

// decodeJSON decodes b keeping numbers exact, so an int64 above 2^53 is
// compared digit for digit.
func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	v, err := parseJSON(b)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// parseJSON is decodeJSON returning its error, for any goroutine.
func parseJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("body is not JSON: %v: %q", err, b)
	}
	return v, nil
}

// checkReply compares a reply with the expected status, the listed
// headers and the body, given as JSON text. It reports with t.Errorf
// only, so it is safe in any goroutine.
func checkReply(t testing.TB, got reply, status int, header map[string]string, body string) {
	t.Helper()
	if got.status != status {
		t.Errorf("status = %d, want %d; body %s", got.status, status, got.body)
	}
	for k, want := range map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"} {
		if g := got.header.Get(k); g != want {
			t.Errorf("header %s = %q, want %q", k, g, want)
		}
	}
	for k, want := range header {
		if g := strings.Join(got.header.Values(k), ", "); g != want {
			t.Errorf("header %s = %q, want %q", k, g, want)
		}
	}
	want, err := parseJSON([]byte(body))
	if err != nil {
		t.Errorf("the expected body: %v", err)
		return
	}
	gotBody, err := parseJSON(got.body)
	if err != nil {
		t.Errorf("status %d: %v", got.status, err)
		return
	}
	if diff := cmp.Diff(want, gotBody); diff != "" {
		t.Errorf("body mismatch (-want +got):\n%s", diff)
	}
}

// errBody is the Error body as JSON text.
func errBody(status int, code, message string) string {
	b, _ := json.Marshal(apiError{Code: code, Message: message, Status: status})
	return string(b)
}

// createPets stores pets through the API and returns their bodies.
func createPets(t *testing.T, srv *httptest.Server, bodies ...string) {
	t.Helper()
	for _, b := range bodies {
		if r := do(t, srv, call{method: "POST", path: "/v1/pets", body: b}); r.status != http.StatusCreated {
			t.Fatalf("create %s: status %d: %s", b, r.status, r.body)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for run's logger and the test to
// share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startRun runs the whole program in-process and returns its base URL
// once it listens, and a function that stops it and returns run's error.
func startRun(t *testing.T, args []string, env map[string]string) (baseURL string, stderr *syncBuffer, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stderr = &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"petstore"}, args...), func(k string) string { return env[k] }, io.Discard, stderr)
	}()
	// The "listening" line in text or JSON format; at a level above info
	// there is none, and the caller names a fixed address in args.
	addrRE := regexp.MustCompile(`msg=listening addr=(https?://\S+)|"msg":"listening","addr":"(https?://[^"]+)"`)
	fixed := ""
	for i, a := range args {
		if a == "-addr" && i+1 < len(args) && !strings.HasSuffix(args[i+1], ":0") {
			fixed = "http://" + args[i+1]
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := addrRE.FindStringSubmatch(stderr.String()); m != nil {
			baseURL = m[1] + m[2]
			break
		}
		if fixed != "" {
			if resp, err := http.Get(fixed + "/healthz"); err == nil {
				resp.Body.Close()
				baseURL = fixed
				break
			}
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("run exited before listening: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("run did not start listening:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(15 * time.Second):
			t.Fatal("run did not return after cancel")
			return nil
		}
	}
	t.Cleanup(func() { stop() })
	return baseURL, stderr, stop
}

// send makes one request to a running service. It fails the test if
// there is no answer, so it is for the test's goroutine; other goroutines
// use trySend.
func send(t *testing.T, method, url, key, body string) reply {
	t.Helper()
	r, err := trySend(t, method, url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// trySend is send returning the error when there is no answer, and
// reporting a reply that breaks the OpenAPI document with t.Errorf: safe
// in any goroutine.
func trySend(t testing.TB, method, url, key, body string) (reply, error) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		return reply{}, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, fmt.Errorf("%s %s: reading the body: %w", method, url, err)
	}
	got := reply{resp.StatusCode, resp.Header, b}
	checkAgainstOpenAPI(t, method, req.URL.RequestURI(), got)
	return got, nil
}

// sha256Sum and hexDigest compute a key's digest independently of the code
// under test's helpers.
func sha256Sum(k string) keyDigest { return keyDigest(sha256.Sum256([]byte(k))) }

func hexDigest(k string) string { d := sha256Sum(k); return hex.EncodeToString(d[:]) }

// waitForLog waits until the service's log has grown a line matching re
// beyond the first skip matches.
func waitForLog(t *testing.T, log *syncBuffer, re string, count int) {
	t.Helper()
	pattern := regexp.MustCompile(re)
	deadline := time.Now().Add(5 * time.Second)
	for len(pattern.FindAllString(log.String(), -1)) < count {
		if time.Now().After(deadline) {
			t.Fatalf("log never had %d lines matching %q:\n%s", count, re, log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// freeAddr returns a loopback address with a port that was free a moment
// ago, for a service whose log will not say where it listens.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// walkCatalogue lists every pet by following next links from the first
// page, as a client would, fetching each page with get.
func walkCatalogue(t *testing.T, get func(path string) reply) []Pet {
	t.Helper()
	var all []Pet
	for next := "/v1/pets?limit=100"; next != ""; {
		got := get(next)
		var pets []Pet
		if got.status != 200 || json.Unmarshal(got.body, &pets) != nil {
			t.Fatalf("GET %s: %d %s", next, got.status, got.body)
		}
		all = append(all, pets...)
		next = strings.TrimSuffix(strings.TrimPrefix(got.header.Get("Link"), "<"), `>; rel="next"`)
	}
	return all
}

// quietLogger is the service's logger, at its default level, writing to
// nowhere: for tests that do not read the log.
func quietLogger() *slog.Logger { return newLogger(io.Discard, "text", slog.LevelInfo) }

// buildBinary builds the petstore binary into a temp dir, for the tests
// that run it as an operator would: SIGKILL, a second process, exit codes.
func buildBinary(t *testing.T) string {
	t.Helper()
	goBin := needTool(t, "go", "https://go.dev/doc/install")
	bin := filepath.Join(t.TempDir(), "petstore")
	if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// lacking says that this test cannot run here for want of what (a tool,
// root, the network), in one line naming it and how to get it. The test
// is skipped, so that `go test ./...` passes on a machine with only Go and
// gcc; with PETSTORE_TEST_ALL=1 (CI) it fails instead, so that nothing is
// skipped unnoticed where everything is meant to run.
func lacking(t testing.TB, what, how string) {
	t.Helper()
	if os.Getenv("PETSTORE_TEST_ALL") == "1" {
		t.Fatalf("needs %s (%s); PETSTORE_TEST_ALL=1 makes its absence a failure", what, how)
	}
	t.Skipf("needs %s (%s); skipped", what, how)
}

// needTool returns the path of the program name on PATH, or skips (fails
// under PETSTORE_TEST_ALL=1) saying how to get it.
func needTool(t testing.TB, name, how string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		lacking(t, name, how)
	}
	return path
}

// needRoot skips (fails under PETSTORE_TEST_ALL=1) a test that must run
// as root, saying why.
func needRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		lacking(t, "root", why+"; run the tests as root, as CI does")
	}
}

// goTool finds a tool the tests use (not a module of petstore) on PATH
// or in Go's bin directory. The tests never install it themselves (that
// needs the network): a missing tool is lacking, with its pinned go
// install line.
func goTool(t testing.TB, name, pkg, version string) string {
	t.Helper()
	if path, err := exec.LookPath(name); err == nil {
		return path
	}
	var dirs []string
	if out, err := exec.Command("go", "env", "GOBIN", "GOPATH").Output(); err == nil {
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) == 2 {
			if lines[0] != "" {
				dirs = append(dirs, lines[0])
			}
			for _, p := range filepath.SplitList(lines[1]) {
				dirs = append(dirs, filepath.Join(p, "bin"))
			}
		}
	} else {
		dirs = append(dirs, filepath.Join(build.Default.GOPATH, "bin"))
	}
	for _, dir := range dirs {
		path := filepath.Join(dir, name)
		if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return path
		}
	}
	lacking(t, name, "go install "+pkg+"@"+version)
	return ""
}

// offline returns the line of a command's output that says it could not
// reach the network (a package registry, the Go module proxy), or "".
func offline(out []byte) string {
	re := regexp.MustCompile(`(?i)ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|dial tcp|no such host|connection refused|i/o timeout|network is unreachable|TLS handshake timeout`)
	for _, line := range strings.Split(string(out), "\n") {
		if re.MatchString(line) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
