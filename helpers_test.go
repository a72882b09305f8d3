package main

import (
	"bufio"
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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testKey is the API key every test server accepts.
const testKey = "test-key-4f1d2c-9a7e5b3c"

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
// share. With a limit above zero it keeps only the first limit bytes
// written to it, and after them only the lines that hold keepPast.
type syncBuffer struct {
	mu       sync.Mutex
	b        bytes.Buffer
	limit    int
	keepPast string
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit > 0 {
		head := p[:min(len(p), max(0, s.limit-s.b.Len()))]
		s.b.Write(head)
		for _, line := range bytes.SplitAfter(p[len(head):], []byte("\n")) {
			if s.keepPast != "" && bytes.Contains(line, []byte(s.keepPast)) {
				s.b.Write(line)
			}
		}
		return len(p), nil
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// patience is how long a test waits for something that takes moments on
// an idle machine: generous, so that a loaded 2-core machine (a build
// beside the tests, -race) never fails a test that is right, while a
// hang still fails.
const patience = time.Minute

// waitFor polls cond until it holds, and fails the test if it has not
// within d. It is the one way the tests wait for a state: never a sleep
// followed by a check. It must be called from the test's goroutine.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for pause := time.Millisecond; !cond(); pause = min(2*pause, 10*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %s waiting for %s", d, what)
		}
		time.Sleep(pause)
	}
}

// waitForLog waits until log has count lines matching re, and shows the
// log if it never does.
func waitForLog(t testing.TB, log *syncBuffer, re string, count int) {
	t.Helper()
	pattern := regexp.MustCompile(re)
	found := false
	defer func() {
		if !found {
			t.Logf("the log:\n%s", log)
		}
	}()
	waitFor(t, patience, fmt.Sprintf("%d log lines matching %q", count, re), func() bool {
		return len(pattern.FindAllString(log.String(), -1)) >= count
	})
	found = true
}

// countLines counts the log lines that match re.
func countLines(logs *syncBuffer, re string) int {
	return len(regexp.MustCompile(re).FindAllString(logs.String(), -1))
}

// listeningLine finds the service's "listening" line, in text or JSON
// format, and its base URL.
var listeningLine = regexp.MustCompile(`msg=listening addr=(https?://\S+)|"msg":"listening","addr":"(https?://[^"]+)"`)

// listeningAt returns the base URL of the first "listening" line in log,
// or "".
func listeningAt(log string) string {
	if m := listeningLine.FindStringSubmatch(log); m != nil {
		return m[1] + m[2]
	}
	return ""
}

// startRun runs the whole program in-process and returns its base URL
// once it listens, its log, and a function that stops it and returns
// run's error (nil on a second call). The address is read from the
// "listening" line; at a level above info there is none, and args name a
// fixed address (freeAddr) whose /healthz is polled instead.
func startRun(t testing.TB, args []string, env map[string]string) (baseURL string, stderr *syncBuffer, stop func() error) {
	t.Helper()
	return startRunLogging(t, args, env, &syncBuffer{})
}

// startRunLogging is startRun with the log written to stderr, such as a
// syncBuffer with a limit.
func startRunLogging(t testing.TB, args []string, env map[string]string, stderr *syncBuffer) (baseURL string, _ *syncBuffer, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"petstore"}, args...), func(k string) string { return env[k] }, io.Discard, stderr)
	}()
	var runErr error
	returned := false
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		if !returned {
			select {
			case runErr = <-done:
				returned = true
			case <-time.After(patience):
				t.Fatalf("run did not return within %s after cancel:\n%s", patience, stderr)
			}
		}
		return runErr
	}
	t.Cleanup(func() { stop() })

	fixed := ""
	for i, a := range args {
		if a == "-addr" && i+1 < len(args) && !strings.HasSuffix(args[i+1], ":0") {
			fixed = "http://" + args[i+1]
		}
	}
	started := false
	defer func() {
		if !started {
			t.Logf("the service's log:\n%s", stderr)
		}
	}()
	waitFor(t, patience, "the service to listen", func() bool {
		if baseURL = listeningAt(stderr.String()); baseURL != "" {
			return true
		}
		if fixed != "" {
			if resp, err := http.Get(fixed + "/healthz"); err == nil {
				resp.Body.Close()
				baseURL = fixed
				return true
			}
		}
		select {
		case runErr = <-done:
			returned = true
			return true
		default:
			return false
		}
	})
	if baseURL == "" {
		t.Fatalf("run returned before it listened: %v", runErr)
	}
	started = true
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

// freeAddr returns a loopback address with a port that was free a moment
// ago: only for a service whose log will not say where it listens (a log
// level above info). Everything else listens on port 0 and reads its
// address from the "listening" line.
func freeAddr(t testing.TB) string {
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

// built is the petstore binary, built once per run of the test binary
// for every test that runs it as an operator would (SIGKILL, a second
// process, exit codes, a stalled log pipe); TestMain removes it.
var built struct {
	once sync.Once
	dir  string
	path string
	err  error
}

// petstoreBinary returns the path of the built petstore binary.
func petstoreBinary(t testing.TB) string {
	t.Helper()
	goBin := needTool(t, "go", "https://go.dev/doc/install")
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "petstore-test-")
		if built.err != nil {
			return
		}
		built.path = filepath.Join(built.dir, "petstore")
		if out, err := exec.Command(goBin, "build", "-o", built.path, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// startBinary starts the built binary as an operator would, on
// 127.0.0.1:0 with the test key, followed by args, and returns its base
// URL once its "listening" line says where it listens. wrap, if any, is a
// command that execs the binary with its arguments (such as a shell that
// lowers a limit first). The log goes to stderr (nil: read and dropped),
// from a pipe that this helper reads: a stderr that blocks stalls the
// service's log output. The process is killed when the test ends.
func startBinary(t testing.TB, wrap, args []string, stderr io.Writer) (base string, cmd *exec.Cmd) {
	t.Helper()
	for i, a := range args {
		if strings.TrimLeft(a, "-") == "log-level" && i+1 < len(args) && !regexp.MustCompile(`(?i)^(debug|info)$`).MatchString(args[i+1]) {
			t.Fatalf("startBinary reads the address from the listening line, which -log-level %s hides", args[i+1])
		}
	}
	if stderr == nil {
		stderr = io.Discard
	}
	argv := append(append(slices.Clone(wrap), petstoreBinary(t), "-addr", "127.0.0.1:0"), args...)
	cmd = exec.Command(argv[0], argv[1:]...)
	cmd.Env = binaryEnv("PETSTORE_API_KEYS=" + testKey)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	head := &syncBuffer{} // the log up to the listening line
	listening := make(chan string, 1)
	go func() {
		defer r.Close() // once stderr fails, so do the service's writes
		lines := bufio.NewReader(r)
		for {
			line, err := lines.ReadString('\n')
			head.Write([]byte(line))
			if base := listeningAt(line); base != "" {
				listening <- base
				break
			}
			if err != nil {
				close(listening)
				return
			}
		}
		if _, err := io.WriteString(stderr, head.String()); err == nil {
			io.Copy(stderr, lines)
		}
	}()
	select {
	case base, ok := <-listening:
		if !ok {
			cmd.Wait()
			t.Fatalf("%s exited before it listened: %v\n%s", argv, cmd.ProcessState, head)
		}
		return base, cmd
	case <-time.After(patience):
		t.Fatalf("%s did not listen within %s:\n%s", argv, patience, head)
	}
	return "", nil
}

// inLoops runs work in n goroutines, each calling it again and again
// until the returned stop is called, or the test ends; stop waits for the
// calls under way.
func inLoops(t testing.TB, n int, work func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				work()
			}
		}()
	}
	stop = sync.OnceFunc(func() { close(done); wg.Wait() })
	t.Cleanup(stop)
	return stop
}

// must fails the test at once on an error from a step of its set-up.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// getWith sends GET url through c, with the API key when key is not "",
// and reads the answer away: its status and header.
func getWith(c *http.Client, url, key string) (int, http.Header, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return 0, nil, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header, err
}

// get200 is getWith for a call that must answer 200.
func get200(c *http.Client, url, key string) error {
	status, _, err := getWith(c, url, key)
	if err == nil && status != 200 {
		err = fmt.Errorf("status %d", status)
	}
	return err
}

// binaryEnv is the environment for the built binary: this process's,
// without its PETSTORE_ variables (PETSTORE_TEST_ALL is the suite's, and
// the binary would warn that it does not read it), and extra.
func binaryEnv(extra ...string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PETSTORE_") })
	return append(env, extra...)
}
