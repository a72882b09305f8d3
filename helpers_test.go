package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testKey is the API key every test service accepts.
const testKey = "test-key-4f1d2c-9a7e5b3c"

// service is a petstore a test started, in-process or as the binary.
type service struct {
	url, db string
	dir     string // the binary's working directory
	log     *logLines
	stop    func() error // as SIGTERM; the error run returned, or the exit's
	exit    func() error // the binary's exit, once it stops by itself
	cmd     *exec.Cmd    // the binary's process; nil in-process
	client  *http.Client // nil for http.DefaultClient
}

// logLines is a service's stderr, safe to read while it is written.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// testEnv is a service's environment: the test key, changed by env ("" unsets).
func testEnv(env map[string]string) map[string]string {
	vars := map[string]string{"PETSTORE_API_KEYS": testKey}
	maps.Copy(vars, env)
	return vars
}

// startService runs petstore in-process, as main does, on 127.0.0.1:0 and
// a new database in a temp dir unless args say otherwise, with the test
// key unless env changes it. It is stopped when the test ends.
func startService(t testing.TB, env map[string]string, args ...string) *service {
	t.Helper()
	vars := testEnv(env)
	args = append([]string{"petstore", "-addr", "127.0.0.1:0", "-db", filepath.Join(t.TempDir(), "pets.db")}, args...)
	svc := &service{log: &logLines{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, func(k string) string { return vars[k] }, io.Discard, svc.log) }()
	svc.stop = sync.OnceValue(func() error { cancel(); return <-done })
	t.Cleanup(func() { svc.stop() })
	svc.listening(t, func() bool { return len(done) > 0 && svc.stop() != nil })
	return svc
}

// binaryPath is the built petstore, made once (or PETSTORE_TEST_BINARY).
var binaryPath = sync.OnceValues(func() (string, error) {
	if path := os.Getenv("PETSTORE_TEST_BINARY"); path != "" {
		return path, nil
	}
	dir, err := os.MkdirTemp("", "petstore-test-binary-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "petstore")
	out, err := exec.Command("go", "build", "-o", path, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return path, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if path, err := binaryPath(); err == nil && os.Getenv("PETSTORE_TEST_BINARY") == "" {
		os.RemoveAll(filepath.Dir(path))
	}
	os.Exit(code)
}

// startBinary runs the built petstore as startService runs it in-process.
func startBinary(t testing.TB, env map[string]string, args ...string) *service {
	t.Helper()
	path, err := binaryPath()
	must(t, err)
	svc := &service{log: &logLines{}, dir: t.TempDir()}
	svc.cmd = exec.Command(path, append([]string{"-addr", "127.0.0.1:0", "-db", filepath.Join(svc.dir, "pets.db")}, args...)...)
	svc.cmd.Dir = svc.dir
	svc.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range testEnv(env) {
		svc.cmd.Env = append(svc.cmd.Env, k+"="+v)
	}
	svc.cmd.Stderr = svc.log
	must(t, svc.cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- svc.cmd.Wait() }()
	svc.exit = sync.OnceValue(func() error { return <-exited })
	svc.stop = func() error {
		svc.cmd.Process.Signal(syscall.SIGTERM)
		return svc.exit()
	}
	t.Cleanup(func() { svc.cmd.Process.Kill(); svc.stop() })
	svc.listening(t, func() bool { return len(exited) > 0 })
	return svc
}

// listening waits for the service's "listening" line and reads its
// address and database from it, failing if the service stops first.
func (svc *service) listening(t testing.TB, stopped func() bool) {
	t.Helper()
	line := regexp.MustCompile(`msg=listening addr=(\S+) tls=(\w+) db=(.+)|"msg":"listening","addr":"([^"]+)","tls":(\w+),"db":"([^"]+)"`)
	var m []string
	waitFor(t, "the service to listen", func() bool {
		m = line.FindStringSubmatch(svc.log.String())
		if m == nil && stopped() {
			t.Fatalf("the service stopped before it listened: %v\n%s", svc.stop(), svc.log)
		}
		return m != nil
	})
	addr, tls, db := m[1]+m[4], m[2]+m[5], m[3]+m[6]
	svc.url, svc.db = map[string]string{"true": "https://", "false": "http://"}[tls]+addr, strings.TrimSpace(db)
}

// waitFor waits for cond to hold, checking every 10 ms, for up to a
// minute: a deadline for a state, not a time to wait.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// call is one request: it carries the test key and, for a POST, JSON,
// unless header says otherwise ("" removes a header).
type call struct {
	method, path, body string
	header             map[string]string
}

// reply is an answer, as a test compares it.
type reply struct {
	status int
	header map[string]string // only those a test names
	body   string            // JSON compared as values, numbers exact
}

// send sends c and returns the answer, with every header; with no
// answer (a service killed, say), status 0 and the error as the body. It
// may run in any goroutine.
func (svc *service) send(t testing.TB, c call) (reply, http.Header) {
	req, err := http.NewRequest(c.method, svc.url+c.path, strings.NewReader(c.body))
	if err != nil {
		return reply{body: err.Error()}, http.Header{}
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	if c.method == "POST" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.header["Transfer-Encoding"] == "chunked" {
		req.ContentLength = -1 // of no length told, the body goes chunked
	}
	for k, v := range c.header {
		req.Header.Del(k)
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	client := http.DefaultClient
	if svc.client != nil {
		client = svc.client
	}
	resp, err := client.Do(req)
	var body []byte
	if err == nil {
		defer resp.Body.Close()
		body, err = io.ReadAll(resp.Body)
	}
	if err != nil {
		return reply{body: err.Error()}, http.Header{}
	}
	checkAgainstOpenAPI(t, c.method, c.path, resp.StatusCode, resp.Header, string(body))
	return reply{status: resp.StatusCode, body: string(body)}, resp.Header
}

// check sends c and compares the answer with want: its status, the
// headers want names ("" for one that must be absent), and its body as
// JSON. Every answer but a 204 is JSON, and none may be cached or sniffed.
func (svc *service) check(t testing.TB, c call, want reply) http.Header {
	t.Helper()
	got, header := svc.send(t, c)
	got.header = map[string]string{}
	for k := range want.header {
		got.header[k] = strings.Join(header.Values(k), ", ")
	}
	if want.status != http.StatusNoContent {
		got.header["Content-Type"], got.header["Cache-Control"] = header.Get("Content-Type"), header.Get("Cache-Control")
		want.header = maps.Collect(maps.All(want.header)) // a copy, never nil
		want.header["Content-Type"], want.header["Cache-Control"] = "application/json", "no-store"
		if c.method != "HEAD" {
			got.body, want.body = jsonValue(got.body), jsonValue(want.body)
		}
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(reply{})); diff != "" {
		t.Errorf("%s %s: (-want +got)\n%s", c.method, c.path, diff)
	}
	return header
}

// jsonValue is a JSON text re-encoded from its value, numbers exact, so
// that two texts of one value compare equal; text that is not JSON is
// returned as it is.
func jsonValue(text string) string {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return "not JSON: " + text
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// errorBody is the Error body as JSON text.
func errorBody(status int, code, message string) string {
	b, _ := json.Marshal(apiError{Code: code, Message: message, Status: status})
	return string(b)
}

// needTool skips the test when a tool it runs is missing, with a line
// naming it, unless PETSTORE_TEST_ALL=1, where every tool must be there.
func needTool(t testing.TB, tool, install string) string {
	t.Helper()
	path, err := exec.LookPath(tool)
	if err != nil {
		gopath, _ := exec.Command("go", "env", "GOPATH").Output() // where go install puts a tool
		path, err = exec.LookPath(filepath.Join(strings.TrimSpace(string(gopath)), "bin", tool))
	}
	if err != nil {
		if os.Getenv("PETSTORE_TEST_ALL") == "1" {
			t.Fatalf("needs %s (%s), and PETSTORE_TEST_ALL=1", tool, install)
		}
		t.Skipf("needs %s (%s); skipped", tool, install)
	}
	return path
}

// command runs name in dir and returns what it printed on stdout and on
// stderr, failing the test with both if it fails.
func command(t testing.TB, dir, name string, args ...string) (stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, errOut.String())
	}
	return string(out), errOut.String()
}

// rawRequest sends request as written on a connection of its own, closes
// its sending half if asked, and returns all that comes back.
func rawRequest(t testing.TB, addr, request string, closeWrite bool) string {
	conn, err := net.Dial("tcp", addr)
	must(t, err)
	defer conn.Close()
	io.WriteString(conn, request)
	if closeWrite {
		conn.(*net.TCPConn).CloseWrite()
	}
	answer, _ := io.ReadAll(conn)
	return string(answer)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sqlite opens a database file as an operator's program would, beside
// the service, with SQLite's own defaults.
func sqlite(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?_busy_timeout=5000")
	must(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

// execSQL runs query on the database file at path, as an operator's
// sqlite3 would.
func execSQL(t testing.TB, path, query string) {
	t.Helper()
	_, err := sqlite(t, path).Exec(query)
	must(t, err)
}

// createPets stores pets through the API, failing the test if one is
// not answered 201.
func createPets(t testing.TB, svc *service, bodies ...string) {
	t.Helper()
	for _, body := range bodies {
		if got, _ := svc.send(t, call{method: "POST", path: "/v1/pets", body: body}); got.status != http.StatusCreated {
			t.Fatalf("create %s: %d %s", body, got.status, got.body)
		}
	}
}
