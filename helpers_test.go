package main

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"go/build"
	"io"
	"log/slog"
	"net/http"
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

// testKey is the API key every test service accepts.
const testKey = "test-key-4f1d2c-9a7e5b3c"

// testService is the service started in-process, on a real listener, as
// run starts it: the store is there for the tests that look inside.
type testService struct {
	url   string
	ln    *limitListener
	api   *server
	store *petStore
	log   *syncBuffer
	stop  func() // shuts it down as SIGTERM does; called again, nothing
}

// startService starts the service in-process with the test key, on
// 127.0.0.1:0 and a new database in a temp dir unless args say
// otherwise, with its log captured; env adds to its environment. It is
// stopped, and its store closed, when the test ends.
func startService(t testing.TB, env map[string]string, args ...string) *testService {
	t.Helper()
	vars := map[string]string{"PETSTORE_API_KEYS": testKey}
	for k, v := range env {
		vars[k] = v
	}
	args = append([]string{"petstore", "-addr", "127.0.0.1:0", "-db", filepath.Join(t.TempDir(), "pets.db")}, args...)
	cfg, err := parseFlags(args, func(k string) string { return vars[k] }, io.Discard)
	must(t, err)
	logs := &syncBuffer{}
	svc, err := newService(cfg, func(k string) string { return vars[k] }, newLogger(logs, cfg.logFormat, cfg.logLevel), logs)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.serve(ctx) }()
	<-svc.store.ready // as the binary's "listening" line waits for it
	stop := sync.OnceFunc(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	t.Cleanup(stop)
	return &testService{url: svc.url(), ln: svc.ln, api: svc.api, store: svc.store, log: logs, stop: stop}
}

// call is one request a test sends. It carries the test key unless
// header says otherwise ("" removes a header), and a POST is JSON.
type call struct {
	method, path, body string
	header             map[string]string
	extra              http.Header  // added after header, as a second value of a header, say
	client             *http.Client // nil: http.DefaultClient
}

// noKey is the header of a call sent without a key.
var noKey = map[string]string{"Authorization": ""}

// reply is what came back; err says why there was no answer.
type reply struct {
	status int
	header http.Header
	body   []byte
	err    error
}

// send sends c to the service at base and returns the reply, with err
// set when there was none. A reply that breaks the OpenAPI document is
// reported with t.Errorf, so send is safe in any goroutine.
func send(t testing.TB, base string, c call) reply {
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, base+c.path, body)
	if err != nil {
		t.Errorf("%s %s: %v", c.method, c.path, err)
		return reply{err: err}
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
	for k, vs := range c.extra {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	client := http.DefaultClient
	if c.client != nil {
		client = c.client
	}
	resp, err := client.Do(req)
	if err == nil {
		defer resp.Body.Close()
		var b []byte
		if b, err = io.ReadAll(resp.Body); err == nil {
			r := reply{status: resp.StatusCode, header: resp.Header, body: b}
			if resp.Close {
				// Go's client moves the server's Connection: close here.
				r.header.Set("Connection", "close")
			}
			checkAgainstOpenAPI(t, c.method, req.URL.RequestURI(), r)
			return r
		}
	}
	return reply{err: fmt.Errorf("%s %s: %w", c.method, c.path, err)}
}

// parseJSON decodes b keeping numbers exact, so an int64 above 2^53 is
// compared digit for digit.
func parseJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("body is not JSON: %v: %q", err, b)
	}
	return v, nil
}

// diffJSON compares two JSON texts as values, numbers exact: "" when
// they are equal, else the differences (-want +got).
func diffJSON(want, got []byte) string {
	w, err := parseJSON(want)
	if err != nil {
		return "the expected body: " + err.Error()
	}
	g, err := parseJSON(got)
	if err != nil {
		return err.Error()
	}
	return cmp.Diff(w, g)
}

// checkReply compares a reply with the expected status, the listed
// headers and the body, given as JSON text. It reports with t.Errorf
// only, so it is safe in any goroutine.
func checkReply(t testing.TB, got reply, status int, header map[string]string, body string) {
	t.Helper()
	if got.err != nil || got.status != status {
		t.Errorf("status = %d (%v), want %d; body %s", got.status, got.err, status, got.body)
		return
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
	if diff := diffJSON([]byte(body), got.body); diff != "" {
		t.Errorf("body mismatch (-want +got):\n%s", diff)
	}
}

// errBody is the Error body as JSON text.
func errBody(status int, code, message string) string {
	b, _ := json.Marshal(apiError{Code: code, Message: message, Status: status})
	return string(b)
}

// createPets stores pets through the API, and fails the test if one is
// not answered 201.
func createPets(t testing.TB, base string, bodies ...string) {
	t.Helper()
	for _, b := range bodies {
		if r := send(t, base, call{method: "POST", path: "/v1/pets", body: b}); r.status != http.StatusCreated {
			t.Fatalf("create %s: status %d: %s", b, r.status, r.body)
		}
	}
}

// walkCatalogue lists every pet by following next links from the first
// page, as a client would.
func walkCatalogue(t *testing.T, base string) []Pet {
	t.Helper()
	return walkFrom(t, base, "/v1/pets?limit=100")
}

// walkFrom lists the pets of the page next and of every page after it.
func walkFrom(t testing.TB, base, next string) []Pet {
	t.Helper()
	var all []Pet
	walked := map[string]bool{}
	for next != "" {
		if walked[next] {
			t.Fatalf("the next link %s came round again", next)
		}
		walked[next] = true
		got := send(t, base, call{method: "GET", path: next})
		var pets []Pet
		if got.status != 200 || json.Unmarshal(got.body, &pets) != nil {
			t.Fatalf("GET %s: %d %s", next, got.status, got.body)
		}
		all = append(all, pets...)
		next = strings.TrimSuffix(strings.TrimPrefix(got.header.Get("Link"), "<"), `>; rel="next"`)
	}
	return all
}

// preloadPets fills a new database with n pets, in one transaction, the
// way docs/performance.md does it: the store makes the schema, then the
// pets go in from outside.
func preloadPets(tb testing.TB, path string, n int) {
	tb.Helper()
	s, err := openStore(path, discardLog)
	must(tb, err)
	s.close()
	sqlExec(tb, path, fmt.Sprintf(preloadSQL, n))
}

// preloadSQL inserts %d pets, with names, categories and statuses of
// every kind, as docs/performance.md does.
const preloadSQL = `WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < %d)
	INSERT INTO pets (name, category_id, status)
	SELECT 'pet number ' || i, i %% 50 + 1, CASE i %% 3 WHEN 0 THEN 'available' WHEN 1 THEN 'pending' ELSE 'sold' END FROM n`

// syncBuffer is a bytes.Buffer safe for the service's logger and the test
// to share. With a limit above zero it keeps only the first limit bytes
// written to it.
type syncBuffer struct {
	mu    sync.Mutex
	b     bytes.Buffer
	limit int
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit > 0 {
		s.b.Write(p[:min(len(p), max(0, s.limit-s.b.Len()))])
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

// waitForHealth waits until /healthz answers status, and returns that
// answer.
func waitForHealth(t testing.TB, base string, status int) reply {
	t.Helper()
	var r reply
	waitFor(t, patience, fmt.Sprintf("/healthz to answer %d", status), func() bool {
		r = send(t, base, call{method: "GET", path: "/healthz"})
		return r.status == status
	})
	return r
}

// holdWriteLock takes the database's write lock from a connection of its
// own, as another process would, until release is called or the test
// ends; other is that connection's pool, open until the test ends.
func holdWriteLock(t testing.TB, path string) (other *sql.DB, release func()) {
	t.Helper()
	other, err := sql.Open("sqlite3", path)
	must(t, err)
	t.Cleanup(func() { other.Close() })
	conn, err := other.Conn(context.Background())
	must(t, err)
	_, err = conn.ExecContext(context.Background(), "BEGIN IMMEDIATE")
	must(t, err)
	release = sync.OnceFunc(func() {
		conn.ExecContext(context.Background(), "ROLLBACK")
		conn.Close()
	})
	t.Cleanup(release)
	return other, release
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

// checkLines asserts that the log has want lines matching re.
func checkLines(t testing.TB, logs *syncBuffer, re string, want int) {
	t.Helper()
	if n := countLines(logs, re); n != want {
		t.Errorf("%d log lines match %s, want %d; the log:\n%s", n, re, want, logs)
	}
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
	out, _ := exec.Command("go", "env", "GOBIN", "GOPATH").Output()
	gobin, gopath, _ := strings.Cut(strings.TrimRight(string(out), "\n"), "\n")
	dirs := []string{gobin, filepath.Join(build.Default.GOPATH, "bin")}
	for _, p := range filepath.SplitList(gopath) {
		dirs = append(dirs, filepath.Join(p, "bin"))
	}
	for _, dir := range dirs {
		// LookPath of a path with a slash: there, a file, executable.
		if path, err := exec.LookPath(filepath.Join(dir, name)); dir != "" && err == nil {
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

// petstoreBinary returns the path of the built petstore binary:
// PETSTORE_TEST_BINARY where it names one (CI: the static musl build),
// else this tree built once.
func petstoreBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("PETSTORE_TEST_BINARY"); bin != "" {
		return bin
	}
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
	if kind := os.Getenv("PETSTORE_TEST_HELPER"); kind != "" {
		runHelper(kind) // an outside program of the soak tests
		return
	}
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// listeningLine matches the service's "listening" line, text or JSON, and
// the base URL in it.
var listeningLine = regexp.MustCompile(`msg=listening addr=(https?://\S+)|"msg":"listening","addr":"(https?://[^"]+)"`)

// startBinary starts the built binary as an operator would, on
// 127.0.0.1:0 with the test key, followed by args, and returns its base
// URL once its "listening" line says where it listens. wrap, if any, is a
// command that execs the binary with its arguments (such as a shell that
// lowers a limit first). The log goes to stderr (nil: read and dropped),
// from a pipe that this helper reads: a stderr that blocks stalls the
// service's log output. The process is killed when the test ends.
func startBinary(t testing.TB, wrap, args []string, stderr io.Writer) (base string, cmd *exec.Cmd) {
	t.Helper()
	if stderr == nil {
		stderr = io.Discard
	}
	argv := append(append(slices.Clone(wrap), petstoreBinary(t), "-addr", "127.0.0.1:0"), args...)
	cmd = exec.Command(argv[0], argv[1:]...)
	cmd.Env = binaryEnv("PETSTORE_API_KEYS=" + testKey)
	r, w, err := os.Pipe()
	must(t, err)
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
			if m := listeningLine.FindStringSubmatch(line); m != nil {
				listening <- m[1] + m[2]
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

// binaryEnv is the environment for the built binary: this process's,
// without its PETSTORE_ variables (PETSTORE_TEST_ALL is the suite's, and
// the binary would warn that it does not read it), and extra.
func binaryEnv(extra ...string) []string {
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "PETSTORE_") })
	return append(env, extra...)
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

// creates is a stream of creates from concurrent clients, as the crash,
// fault, backup and Litestream tests send it, to hold what was answered
// against what is stored afterwards.
type creates struct {
	mu      sync.Mutex
	sent    []*create // in the order sent
	refused bool      // a create was answered, and not 201
	stop    func()    // stops the clients and waits for them; called again, nothing
}

// create is one create of a stream and what it was answered.
type create struct {
	call
	name         string
	done         bool      // answered, or failed for want of an answer
	status       int       // 0: no answer (the service was killed, or cut the client off)
	body         []byte    // the answer
	pet          Pet       // the pet answered 201
	at           time.Time // when the answer came
	afterRefusal bool      // sent once a create of the stream had been refused
}

// startCreates starts clients creating pets at base, each pet named
// "<prefix> <n>" after its place in the stream, until stop is called or
// the test ends. Every other create carries an Idempotency-Key, as a
// client that retries does. A client stops at its first create without
// an answer: the service is gone, or cut it off.
func startCreates(t testing.TB, base string, clients int, prefix string) *creates {
	s := &creates{}
	client := &http.Client{Timeout: patience}
	halt := make(chan struct{})
	stop := inLoops(t, clients, func() {
		s.mu.Lock()
		n := len(s.sent) + 1
		c := &create{name: fmt.Sprintf("%s %d", prefix, n), afterRefusal: s.refused}
		c.call = call{method: "POST", path: "/v1/pets", body: fmt.Sprintf(`{"name":%q,"categoryId":%d}`, c.name, n%9+1), client: client}
		if n%2 == 0 {
			c.header = map[string]string{"Idempotency-Key": fmt.Sprintf("create-%d", n)}
		}
		s.sent = append(s.sent, c)
		s.mu.Unlock()
		r := send(t, base, c.call)
		s.mu.Lock()
		c.done, c.status, c.body, c.at = true, r.status, r.body, time.Now()
		if r.status == 201 {
			c.pet = decodePet(t, r.body)
		}
		s.refused = s.refused || r.status != 201 && r.err == nil
		s.mu.Unlock()
		if r.err != nil {
			<-halt
		}
	})
	s.stop = sync.OnceFunc(func() { close(halt); stop() })
	t.Cleanup(s.stop)
	return s
}

// answers returns a copy of the creates sent so far, in the order sent.
func (s *creates) answers() []create {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]create, len(s.sent))
	for i, c := range s.sent {
		out[i] = *c
	}
	return out
}

// statuses counts the creates answered so far by status; 0 counts those
// that got no answer.
func (s *creates) statuses() map[int]int {
	n := map[int]int{}
	for _, c := range s.answers() {
		if c.done {
			n[c.status]++
		}
	}
	return n
}

// refusals counts the creates answered, and not with 201.
func (s *creates) refusals() int {
	n := 0
	for status, count := range s.statuses() {
		if status != 201 && status != 0 {
			n += count
		}
	}
	return n
}

// acked returns the pets answered 201, by id.
func (s *creates) acked() map[int64]Pet {
	pets := map[int64]Pet{}
	for _, c := range s.answers() {
		if c.status == 201 {
			pets[c.pet.ID] = c.pet
		}
	}
	return pets
}

// checkStored holds the pets stored against the stream: every pet
// answered 201 is there, unchanged, and every pet there was sent by the
// stream, once; a create without an answer may be there or not. It returns how
// many creates were answered 201, how many were refused, and how many of
// those refused are stored all the same: after some faults (an I/O error
// on a commit) that may be, after others it must not.
func checkStored(t testing.TB, stored []Pet, s *creates) (acked, refused, refusedStored int) {
	t.Helper()
	byName := map[string]Pet{}
	for _, p := range stored {
		if _, twice := byName[p.Name]; twice {
			t.Errorf("%s is stored twice", p.Name)
		}
		byName[p.Name] = p
	}
	for _, c := range s.answers() {
		p, ok := byName[c.name]
		delete(byName, c.name)
		switch {
		case c.status == 201 && p != c.pet:
			t.Errorf("%s was answered 201 with %+v, and is stored as %+v", c.name, c.pet, p)
		case c.status == 201:
			acked++
		case c.status != 0 && ok:
			refusedStored++
			fallthrough
		case c.status != 0:
			refused++
		}
	}
	for name := range byName {
		t.Errorf("%s is stored, and no client sent it", name)
	}
	return acked, refused, refusedStored
}

// sqlExec runs queries on the database file from a connection of its
// own, as an operator's sqlite3 shell would.
func sqlExec(t testing.TB, path string, queries ...string) {
	t.Helper()
	db, err := sql.Open("sqlite3", path)
	must(t, err)
	defer db.Close()
	for _, q := range queries {
		_, err := db.Exec(q)
		must(t, err)
	}
}

// checkIntegrity runs SQLite's integrity_check on the database file.
func checkIntegrity(t testing.TB, path string) {
	t.Helper()
	db, err := sql.Open("sqlite3", path)
	must(t, err)
	defer db.Close()
	var result string
	if err := db.QueryRow("PRAGMA integrity_check").Scan(&result); err != nil || result != "ok" {
		t.Errorf("integrity_check of %s: %q %v", path, result, err)
	}
}

// sqlReader opens the database file for reading beside the store, as an
// operator's sqlite3 would, closed when the test ends.
func sqlReader(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	must(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

// discardLog is a logger for stores whose log no test reads.
var discardLog = slog.New(slog.DiscardHandler)
