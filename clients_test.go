package main

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// oapiCodegenVersion is the Go client generator, pinned; .ci/run installs
// it, and the test installs it itself where it is missing.
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
	base, _, _ = startRun(t, []string{"-addr", "127.0.0.1:0"},
		map[string]string{"PETSTORE_API_KEYS": testKey, "PETSTORE_DB": filepath.Join(t.TempDir(), "pets.db")})
	resp, err := http.Get(base + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	doc, _ := io.ReadAll(resp.Body)
	if err := os.WriteFile(filepath.Join(dir, "openapi.json"), doc, 0o644); err != nil {
		t.Fatal(err)
	}
	return base
}

// checkClientRun compares what a client program printed with
// wantClientRun, and with the document version it read.
func checkClientRun(t *testing.T, out []byte, extra string) {
	t.Helper()
	want := strings.TrimSuffix(wantClientRun, "}") + "," + extra + "}"
	if diff := cmp.Diff(decodeJSON(t, []byte(want)), decodeJSON(t, out)); diff != "" {
		t.Errorf("the client program printed (-want +got):\n%s", diff)
	}
}

// command runs name in dir and returns what it printed on stdout and on
// stderr; it fails the test with both if the command fails.
func command(t *testing.T, dir string, env []string, name string, args ...string) (stdout, stderr []byte) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, errOut.String())
	}
	return out, []byte(errOut.String())
}

// TestGeneratedTypeScriptClient generates a TypeScript client with
// openapi-typescript and openapi-fetch (pinned in testdata/tsclient) from
// the document the running service serves, type-checks a back-office
// program with tsc --strict, and runs it with node against the server.
func TestGeneratedTypeScriptClient(t *testing.T) {
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the TypeScript client test needs Node.js and npm (Debian: nodejs npm): %v", err)
		}
	}
	dir := t.TempDir()
	for _, name := range []string{"package.json", "tsconfig.json", "client.ts"} {
		b, err := os.ReadFile(filepath.Join("testdata", "tsclient", name))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	base := servedDocument(t, dir)
	command(t, dir, nil, "npm", "install", "--no-audit", "--no-fund", "--loglevel=error")
	genOut, genErr := command(t, dir, nil, "node", "node_modules/openapi-typescript/bin/cli.js", "openapi.json", "-o", "api.d.ts")
	for _, line := range strings.Split(strings.TrimSpace(string(genOut)+string(genErr)), "\n") {
		if !regexp.MustCompile(`^(✨ openapi-typescript|🚀 openapi.json → api.d.ts)`).MatchString(line) {
			t.Errorf("openapi-typescript said more than it should (a warning?): %q", line)
		}
	}
	if out, errOut := command(t, dir, nil, "node", "node_modules/typescript/bin/tsc", "-p", "tsconfig.json"); len(out)+len(errOut) > 0 {
		t.Errorf("tsc --strict: %s%s", out, errOut)
	}
	out, _ := command(t, dir, []string{"PETSTORE_URL=" + base, "PETSTORE_KEY=" + testKey}, "node", "out/client.js")
	checkClientRun(t, out, `"openapi":"3.1.0"`)
}

// TestGeneratedGoClient generates a Go client with oapi-codegen (pinned,
// installed as a tool) from the document the running service serves, and
// builds and runs a program against the server, in a module of its own.
func TestGeneratedGoClient(t *testing.T) {
	codegen := goTool(t, "oapi-codegen", "github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen", oapiCodegenVersion)
	dir := t.TempDir()
	base := servedDocument(t, dir)
	program, err := os.ReadFile(filepath.Join("testdata", "goclient", "main.go.txt"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "main.go"), program, 0o644)
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module petstoreclient\n\ngo 1.24\n"), 0o644)
	genOut, genErr := command(t, dir, nil, codegen, "-generate", "types,client", "-package", "main", "-o", "client.gen.go", "openapi.json")
	if len(strings.TrimSpace(string(genOut)+string(genErr))) > 0 {
		t.Errorf("oapi-codegen said more than it should (a warning?): %s%s", genOut, genErr)
	}
	env := []string{"GOFLAGS=", "PETSTORE_URL=" + base, "PETSTORE_KEY=" + testKey}
	command(t, dir, env, "go", "mod", "tidy")
	command(t, dir, env, "go", "vet", ".")
	out, _ := command(t, dir, env, "go", "run", ".")
	checkClientRun(t, out, `"openapi":["3.1.0","3.1.0"]`)
}
