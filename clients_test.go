package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// oapiCodegenVersion is the Go client generator, pinned; .ci/run installs
// it, and the test is skipped where it is missing (it fails under
// PETSTORE_TEST_ALL=1).
const oapiCodegenVersion = "v2.8.2"

// wantClientRun is what both generated-client programs print against a
// new catalogue: they create Rex and four sold pets, page through the sold
// ones two at a time by Link, get Rex, and get a 400 and a 401 typed as
// the Error body.
const wantClientRun = `{"created":{"id":1,"name":"Rex","categoryId":1,"status":"available"},"location":"/v1/pets/1",
	"soldPages":[2,2],"got":{"id":1,"name":"Rex","categoryId":1,"status":"available"},"deprecation":"@1795305600",
	"badRequest":{"code":"invalid_body","message":"name must not be empty or only whitespace","status":400},
	"unauthorized":{"code":"unauthorized","message":"missing API key: send the header Authorization: Bearer <key>","status":401},
	"unauthorizedStatus":401}`

// servedDocument starts the service on a new catalogue and saves the
// document it serves at /openapi.json into dir.
func servedDocument(t *testing.T, dir string) (base string) {
	t.Helper()
	base = startService(t, nil).url
	doc := send(t, base, call{method: "GET", path: "/openapi.json", header: noKey})
	must(t, errors.Join(doc.err, os.WriteFile(filepath.Join(dir, "openapi.json"), doc.body, 0o644)))
	return base
}

// checkClientRun compares what a client program printed with
// wantClientRun, and with the document version it read.
func checkClientRun(t *testing.T, out []byte, extra string) {
	t.Helper()
	want := strings.TrimSuffix(wantClientRun, "}") + "," + extra + "}"
	if diff := diffJSON([]byte(want), out); diff != "" {
		t.Errorf("the client program printed (-want +got):\n%s", diff)
	}
}

// copyTestdata copies the files names of testdata/from into dir; a
// name.go.txt (Go source kept out of this package's build) becomes name.go.
func copyTestdata(t *testing.T, dir, from string, names ...string) {
	t.Helper()
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join("testdata", from, name))
		must(t, err)
		must(t, os.WriteFile(filepath.Join(dir, strings.TrimSuffix(name, ".txt")), b, 0o644))
	}
}

// command runs name in dir and returns what it printed on stdout and on
// stderr; it fails the test with both if the command fails.
func command(t *testing.T, dir string, env []string, name string, args ...string) (stdout, stderr []byte) {
	t.Helper()
	out, errOut, err := runCommand(dir, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, errOut)
	}
	return out, errOut
}

// onlineCommand is command for a command that downloads (npm install,
// go mod tidy): where it fails for want of the network, the test lacks
// the network, named by what.
func onlineCommand(t *testing.T, what, dir string, env []string, name string, args ...string) (stdout, stderr []byte) {
	t.Helper()
	out, errOut, err := runCommand(dir, env, name, args...)
	if err != nil {
		if line := offline(append(slices.Clone(out), errOut...)); line != "" {
			lacking(t, "network access to "+what, fmt.Sprintf("%s %s downloads, and failed offline: %s", filepath.Base(name), args[0], line))
		}
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, errOut)
	}
	return out, errOut
}

// runCommand runs name in dir and returns what it printed on stdout and
// on stderr, and how it failed.
func runCommand(dir string, env []string, name string, args ...string) (stdout, stderr []byte, err error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	return out, []byte(errOut.String()), err
}

// TestGeneratedTypeScriptClient generates a TypeScript client with
// openapi-typescript and openapi-fetch (pinned in testdata/tsclient) from
// the document the running service serves, type-checks a back-office
// program with tsc --strict, and runs it with node against the server.
func TestGeneratedTypeScriptClient(t *testing.T) {
	node := needTool(t, "node", "apt-get install nodejs")
	npm := needTool(t, "npm", "apt-get install npm")
	dir := t.TempDir()
	copyTestdata(t, dir, "tsclient", "package.json", "tsconfig.json", "client.ts")
	base := servedDocument(t, dir)
	onlineCommand(t, "the npm registry", dir, nil, npm, "install", "--no-audit", "--no-fund", "--loglevel=error")
	genOut, genErr := command(t, dir, nil, node, "node_modules/openapi-typescript/bin/cli.js", "openapi.json", "-o", "api.d.ts")
	for _, line := range strings.Split(strings.TrimSpace(string(genOut)+string(genErr)), "\n") {
		if !regexp.MustCompile(`^(✨ openapi-typescript|🚀 openapi.json → api.d.ts)`).MatchString(line) {
			t.Errorf("openapi-typescript said more than it should (a warning?): %q", line)
		}
	}
	if out, errOut := command(t, dir, nil, node, "node_modules/typescript/bin/tsc", "-p", "tsconfig.json"); len(out)+len(errOut) > 0 {
		t.Errorf("tsc --strict: %s%s", out, errOut)
	}
	out, _ := command(t, dir, []string{"PETSTORE_URL=" + base, "PETSTORE_KEY=" + testKey}, node, "out/client.js")
	checkClientRun(t, out, `"openapi":"3.1.0"`)
}

// TestGeneratedGoClient generates a Go client with oapi-codegen (pinned,
// installed as a tool) from the document the running service serves, and
// builds and runs a program against the server, in a module of its own.
func TestGeneratedGoClient(t *testing.T) {
	codegen := goTool(t, "oapi-codegen", "github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen", oapiCodegenVersion)
	goBin := needTool(t, "go", "https://go.dev/doc/install")
	dir := t.TempDir()
	base := servedDocument(t, dir)
	copyTestdata(t, dir, "goclient", "main.go.txt")
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module petstoreclient\n\ngo 1.24\n"), 0o644)
	genOut, genErr := command(t, dir, nil, codegen, "-generate", "types,client", "-package", "main", "-o", "client.gen.go", "openapi.json")
	if len(strings.TrimSpace(string(genOut)+string(genErr))) > 0 {
		t.Errorf("oapi-codegen said more than it should (a warning?): %s%s", genOut, genErr)
	}
	env := []string{"GOFLAGS=", "PETSTORE_URL=" + base, "PETSTORE_KEY=" + testKey}
	onlineCommand(t, "the Go module proxy", dir, env, goBin, "mod", "tidy")
	command(t, dir, env, goBin, "vet", ".")
	out, _ := command(t, dir, env, goBin, "run", ".")
	checkClientRun(t, out, `"openapi":["3.1.0","3.1.0","application/yaml"]`)
}

// TestBrowserBackOffice loads the back-office page in testdata/browser in
// headless Chromium from two origins of its own. From the origin in
// -cors-origins the page lists, creates and reads Location, Link,
// X-Request-Id and the rest across origins; from another origin the
// browser refuses the first call, nothing is stored, and the service logs
// that origin once.
func TestBrowserBackOffice(t *testing.T) {
	chromium := needTool(t, "chromium", "apt-get install chromium")
	office, officeResults := backOfficeOrigin(t)
	elsewhere, elsewhereResults := backOfficeOrigin(t)
	svc := startService(t, nil, "-cors-origins", office.URL)
	base, logs := svc.url, svc.log
	officeResults.config <- map[string]string{"api": base, "key": testKey}
	elsewhereResults.config <- map[string]string{"api": base, "key": testKey}

	got := loadInBrowser(t, chromium, office.URL+"/office.html", officeResults.result)
	rex := `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`
	unauthorized := `{"code":"unauthorized","message":"invalid API key","status":401}`
	want := `{
		"created": {"status":201,"body":` + rex + `,"location":"/v1/pets/1","link":null,"requestId":"office-create-1",
			"replayed":null,"deprecation":null,"sunset":null,"challenge":null},
		"replayed": {"status":201,"body":` + rex + `,"location":"/v1/pets/1","link":null,"requestId":"GENERATED",
			"replayed":"true","deprecation":null,"sunset":null,"challenge":null},
		"soldPages": [
			{"status":200,"ids":[2,3],"link":"</v1/pets?limit=2&status=sold&after=3>; rel=\"next\""},
			{"status":200,"ids":[4],"link":null}],
		"got": {"status":200,"body":` + rex + `,"location":null,"link":"</v1/pets>; rel=\"successor-version\"",
			"requestId":"GENERATED","replayed":null,"deprecation":"@1795305600","sunset":"Thu, 05 Dec 2030 00:00:00 GMT","challenge":null},
		"badRequest": {"status":400,"body":{"code":"invalid_body","message":"name must not be empty or only whitespace","status":400},
			"location":null,"link":null,"requestId":"GENERATED","replayed":null,"deprecation":null,"sunset":null,"challenge":null},
		"unauthorized": {"status":401,"body":` + unauthorized + `,"location":null,"link":null,"requestId":"GENERATED",
			"replayed":null,"deprecation":null,"sunset":null,"challenge":"Bearer realm=\"petstore\", error=\"invalid_token\""}
	}`
	// The ids the service made up are read by the page and found in the
	// service's access log.
	generated := regexp.MustCompile(`"requestId":"([^"]+)"`)
	for _, m := range generated.FindAllStringSubmatch(string(got), -1) {
		if m[1] != "office-create-1" {
			waitForLog(t, logs, `(?m)request_id=`+regexp.QuoteMeta(m[1])+`$`, 1)
		}
	}
	gotJSON := generated.ReplaceAllStringFunc(string(got), func(s string) string {
		if strings.Contains(s, "office-create-1") {
			return s
		}
		return `"requestId":"GENERATED"`
	})
	if diff := diffJSON([]byte(want), []byte(gotJSON)); diff != "" {
		t.Errorf("the page on the allowed origin saw (-want +got):\n%s", diff)
	}

	got = loadInBrowser(t, chromium, elsewhere.URL+"/office.html", elsewhereResults.result)
	if diff := diffJSON([]byte(`{"error":"TypeError: Failed to fetch"}`), got); diff != "" {
		t.Errorf("the page on another origin saw (-want +got):\n%s", diff)
	}
	checkReply(t, send(t, base, call{method: "GET", path: "/v1/pets?limit=100"}), 200, nil,
		`[`+rex+`,{"id":2,"name":"Tom","categoryId":2,"status":"sold"},{"id":3,"name":"Kit","categoryId":2,"status":"sold"},{"id":4,"name":"Max","categoryId":2,"status":"sold"}]`)
	waitForLog(t, logs, `level=WARN msg="browser origin refused: [^"]*" origin=`+regexp.QuoteMeta(elsewhere.URL)+` method=OPTIONS path=/v1/pets`, 1)
	checkLines(t, logs, "browser origin refused", 1) // one origin; the allowed one never
}

// backOfficeResults carry the page's configuration to its origin, and what
// the page reported from it.
type backOfficeResults struct {
	config chan map[string]string
	result chan []byte
}

// backOfficeOrigin serves testdata/browser from an origin of its own, with
// config.json (the API and key, once the test knows them) and a /result
// the page posts what it saw to.
func backOfficeOrigin(t *testing.T) (*httptest.Server, backOfficeResults) {
	t.Helper()
	results := backOfficeResults{config: make(chan map[string]string, 1), result: make(chan []byte, 1)}
	var config []byte
	var once sync.Once
	mux := http.NewServeMux()
	mux.Handle("GET /office.html", http.FileServer(http.Dir(filepath.Join("testdata", "browser"))))
	mux.HandleFunc("GET /config.json", func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { config, _ = json.Marshal(<-results.config) })
		w.Header().Set("Content-Type", "application/json")
		w.Write(config)
	})
	mux.HandleFunc("POST /result", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		select {
		case results.result <- b:
		default:
		}
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, results
}

// loadInBrowser opens url in headless Chromium, with a profile of its own,
// and returns what the page reported, stopping the browser and its
// children afterwards.
func loadInBrowser(t *testing.T, chromium, url string, result <-chan []byte) []byte {
	t.Helper()
	cmd := exec.Command(chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
		"--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), url)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}()
	select {
	case b := <-result:
		return b
	case err := <-exited:
		exited <- err
		t.Fatalf("chromium exited before the page reported: %v\n%s", err, out.String())
	case <-time.After(patience):
		t.Fatalf("the page did not report within %s; chromium said:\n%s", patience, out.String())
	}
	return nil
}

// TestOpenAPITools runs widely used OpenAPI tools, pinned in
// testdata/tools and testdata/kinproxy, on the document the running
// service serves. Two more TypeScript generators, orval (fetch client)
// and @hey-api/openapi-ts, each get a program type-checked with tsc
// --strict and run against the server, with the base URL given at run
// time as README says. Then every kind of answer the service gives goes
// through two validating proxies, Prism's (--errors) and one built on
// kin-openapi's openapi3filter, and none may differ from the document.
func TestOpenAPITools(t *testing.T) {
	node := needTool(t, "node", "apt-get install nodejs")
	npm := needTool(t, "npm", "apt-get install npm")
	goBin := needTool(t, "go", "https://go.dev/doc/install")
	dir := t.TempDir()
	copyTestdata(t, dir, "tools", "package.json", "tsconfig.json", "orval.config.cjs", "orval.ts", "hey.ts")
	servedDocument(t, dir)
	onlineCommand(t, "the npm registry", dir, nil, npm, "install", "--no-audit", "--no-fund", "--loglevel=error")

	t.Run("generated clients", func(t *testing.T) {
		command(t, dir, nil, node, "node_modules/orval/dist/bin/orval.mjs", "--config", "orval.config.cjs")
		command(t, dir, nil, node, "node_modules/@hey-api/openapi-ts/bin/run.js", "-i", "openapi.json", "-o", "gen-hey")
		if out, errOut := command(t, dir, nil, node, "node_modules/typescript/bin/tsc", "-p", "tsconfig.json"); len(out)+len(errOut) > 0 {
			t.Errorf("tsc --strict: %s%s", out, errOut)
		}
		// Each program on a new catalogue runs every operation: it creates
		// Rex, lists, gets him, gets a 400 and the 501 typed as the Error
		// body, the health, the index and the document.
		const rex = `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`
		const common = `"created":[201,` + rex + `],"listed":[200,[` + rex + `]],"got":[200,` + rex + `],` +
			`"badRequest":[400,{"code":"invalid_body","message":"name must not be empty or only whitespace","status":400}],"openapi":"3.1.0",` +
			`"orders":[501,{"code":"not_implemented","message":"GET /v1/store/orders is named by the specification but not specified, so it is not implemented","status":501}],` +
			`"health":[200,{"status":"ok"}],"index":200`
		for _, tc := range []struct{ program, want string }{
			{"out/orval.js", `{` + common + `}`},
			{"out/hey.js", `{` + common + `,"openapiYaml":"3.1.0"}`},
		} {
			base := servedDocument(t, t.TempDir())
			out, _ := command(t, dir, []string{"PETSTORE_URL=" + base, "PETSTORE_KEY=" + testKey}, node, tc.program)
			if diff := diffJSON([]byte(tc.want), out); diff != "" {
				t.Errorf("%s printed (-want +got):\n%s", tc.program, diff)
			}
		}
	})

	base := servedDocument(t, t.TempDir())
	kin := startKinProxy(t, goBin, filepath.Join(dir, "openapi.json"), base)
	prism := startPrism(t, node, dir, base)
	// Prism mocks an operation whose upstream answers 501 instead of
	// passing the answer on, and answers requests it finds invalid itself
	// (422, and 401 without a key): those are sent to kin-openapi only.
	for _, a := range realAnswers() {
		direct := send(t, base, a.call)
		if direct.status != a.status {
			t.Fatalf("%s: the service answered %d, want %d: %s", a.name, direct.status, a.status, direct.body)
		}
		if viaKin := send(t, kin.url, a.call); viaKin.status != a.status {
			t.Errorf("%s through kin-openapi: %d, want %d", a.name, viaKin.status, a.status)
		}
		if a.prism {
			checkViaPrism(t, prism, a)
		}
	}
	// Last, 429: the address failed authentication too often, and its
	// requests without a valid key are refused for the rest of the minute.
	wrongKey := call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": "Bearer not-a-key-of-this-service"}}
	for i := 0; send(t, base, wrongKey).status != http.StatusTooManyRequests; i++ {
		if i > 100 {
			t.Fatal("100 wrong keys from one address were never refused with 429")
		}
	}
	if got := send(t, kin.url, wrongKey); got.status != 429 {
		t.Errorf("too many failed authentications through kin-openapi: %d, want 429", got.status)
	}
	checkViaPrism(t, prism, answer{"too many failed authentications", wrongKey, 429, true})
	lines := kin.waitForLines(t, len(realAnswers())+1)
	for _, line := range lines {
		if !strings.HasPrefix(line, "ok ") {
			t.Errorf("kin-openapi: %s", line)
		}
	}
}

// answer is a request that makes the service give one kind of answer.
type answer struct {
	name string
	call
	status int
	prism  bool // Prism passes it on (see TestOpenAPITools)
}

// checkViaPrism sends a through Prism's proxy: the service's answer must
// come back as it is, with no violation of the document found.
func checkViaPrism(t *testing.T, prism string, a answer) {
	t.Helper()
	got := send(t, prism, a.call)
	if violations := got.header.Get("sl-violations"); got.status != a.status || bytes.Contains(got.body, []byte("stoplight.io/prism/errors")) || violations != "" {
		t.Errorf("%s through Prism: %d %s (sl-violations: %q), want the service's %d", a.name, got.status, got.body, violations, a.status)
	}
}

// realAnswers is one request for each kind of answer the document
// describes that a healthy service gives, in an order that makes each.
// send adds the test key, and Content-Type: application/json to a POST.
func realAnswers() []answer {
	tooLong := `{"name":"` + strings.Repeat("x", 20<<10) + `","categoryId":1}`
	create := func(body string, header map[string]string) call {
		return call{method: "POST", path: "/v1/pets", body: body, header: header}
	}
	get := func(path string, header map[string]string) call {
		return call{method: "GET", path: path, header: header}
	}
	order1 := map[string]string{"Idempotency-Key": "order-1"}
	return []answer{
		{"index", get("/", noKey), 200, true},
		{"health", get("/healthz", noKey), 200, true},
		{"document as YAML", get("/openapi.yaml", noKey), 200, true},
		{"document as JSON", get("/openapi.json", noKey), 200, true},
		{"create", create(`{"name":"Rex","categoryId":1}`, nil), 201, true},
		{"create with a status", create(`{"name":"Nala","categoryId":2,"status":"sold"}`, nil), 201, true},
		{"create with an Idempotency-Key", create(`{"name":"Milo","categoryId":1}`, order1), 201, true},
		{"create replayed", create(`{"name":"Milo","categoryId":1}`, order1), 201, true},
		{"Idempotency-Key reused", create(`{"name":"Otto","categoryId":1}`, order1), 422, true},
		{"create, bad body", create(`{"name":"","categoryId":1}`, nil), 400, false},
		{"create, body too large", create(tooLong, nil), 413, false},
		{"create, not JSON", create(`Rex`, map[string]string{"Content-Type": "text/plain"}), 415, false},
		{"create without a key", create(`{"name":"Rex","categoryId":1}`, noKey), 401, false},
		{"list", get("/v1/pets", nil), 200, true},
		{"list, a page with a next link", get("/v1/pets?limit=1&status=available", nil), 200, true},
		{"list, unknown parameter", get("/v1/pets?colour=red", nil), 400, true},
		{"list, limit too large", get("/v1/pets?limit=1000", nil), 400, false},
		{"list without a key", get("/v1/pets", noKey), 401, false},
		{"list, wrong key", get("/v1/pets", map[string]string{"Authorization": "Bearer not-a-key-of-this-service"}), 401, true},
		{"get", get("/v1/pets/1", nil), 200, true},
		{"get, no such pet", get("/v1/pets/99", nil), 404, true},
		{"get, bad id", get("/v1/pets/abc", nil), 400, false},
		{"get with a query parameter", get("/v1/pets/1?status=sold", nil), 400, true},
		{"get without a key", get("/v1/pets/1", noKey), 401, false},
		{"orders", get("/v1/store/orders", nil), 501, false},
	}
}

// kinProxy is the kin-openapi validating proxy (testdata/kinproxy) as a
// process: its address, and the lines it prints, one per exchange.
type kinProxy struct {
	url   string
	lines *syncBuffer
}

// startKinProxy builds the proxy in a module of its own (kin-openapi is
// a tool here, not a module of the project) and starts it in front of
// upstream.
func startKinProxy(t *testing.T, goBin, document, upstream string) kinProxy {
	t.Helper()
	dir := t.TempDir()
	copyTestdata(t, dir, "kinproxy", "main.go.txt")
	env := []string{"GOFLAGS="}
	command(t, dir, env, goBin, "mod", "init", "kinproxy")
	onlineCommand(t, "the Go module proxy", dir, env, goBin, "get", "github.com/getkin/kin-openapi@"+kinOpenAPIVersion)
	onlineCommand(t, "the Go module proxy", dir, env, goBin, "mod", "tidy")
	command(t, dir, env, goBin, "build", "-o", "kinproxy", ".")
	p := kinProxy{lines: &syncBuffer{}}
	p.url = startProcess(t, p.lines, regexp.MustCompile(`listening on (http://\S+)`), filepath.Join(dir, "kinproxy"), document, upstream)
	return p
}

// kinOpenAPIVersion is kin-openapi, pinned.
const kinOpenAPIVersion = "v0.152.0"

// waitForLines waits for n exchange lines after the listening line.
func (p kinProxy) waitForLines(t *testing.T, n int) []string {
	t.Helper()
	var lines []string
	waitFor(t, patience, fmt.Sprintf("kin-openapi's %d lines", n), func() bool {
		lines = strings.Split(strings.TrimSpace(p.lines.String()), "\n")[1:]
		return len(lines) >= n
	})
	return lines
}

// startPrism starts Prism's validating proxy in front of upstream, on
// the document saved in dir, and returns its address. With --errors a
// response that differs from the document becomes Prism's own 500.
func startPrism(t *testing.T, node, dir, upstream string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	log := &syncBuffer{}
	startProcess(t, log, regexp.MustCompile(`Prism is listening on (http://\S+)`), node,
		filepath.Join(dir, "node_modules/@stoplight/prism-cli/dist/index.js"), "proxy", filepath.Join(dir, "openapi.json"), upstream, "--errors", "-h", "127.0.0.1", "-p", port)
	return "http://127.0.0.1:" + port
}

// startProcess starts a long-running tool whose output goes to out,
// waits for the line that says it listens, and returns that line's
// first group. The tool and its children are killed when the test ends.
func startProcess(t *testing.T, out *syncBuffer, listening *regexp.Regexp, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must(t, cmd.Start())
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	})
	var found []string
	waitFor(t, patience, filepath.Base(name)+" to listen", func() bool {
		select {
		case <-exited:
			t.Fatalf("%s exited: %s", name, out.String())
		default:
		}
		found = listening.FindStringSubmatch(out.String())
		return found != nil
	})
	return found[1]
}
