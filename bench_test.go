package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkLoad is the load run: wrk, in its own process, against the
// built binary and against a floor server, in alternating rounds, and the
// ratio of the two. It is a benchmark, never a timed assertion:
//
//	go test -run '^$' -bench '^BenchmarkLoad$' -benchtime 1x .
//
// PETSTORE_BENCH_PETS (default 100000) pets are preloaded;
// PETSTORE_BENCH_ROUNDS (default 3) rounds of PETSTORE_BENCH_SECONDS
// (default 3) each are run per operation and server;
// PETSTORE_BENCH_OPS picks operations by name prefix (list, get, create);
// PETSTORE_BENCH_LITESTREAM=1 runs Litestream beside the binary;
// PETSTORE_BENCH_BINARY runs another build (an older one, to compare).
//
// The floor is the same kind of server, with the service's timeouts and
// its bearer-key wrapper, answering from memory with the same bytes the
// service answered.
//
// Where taskset is found, this process and the binary (with Litestream)
// run on CPU 0 and wrk on the others, so that wrk's own work does not
// pull every ratio toward 1.
func BenchmarkLoad(b *testing.B) {
	wrk := needTool(b, "wrk", "apt-get install wrk")
	if taskset, err := exec.LookPath("taskset"); err == nil && runtime.NumCPU() > 1 {
		pin := exec.Command(taskset, "-a", "-p", "-c", "0", strconv.Itoa(os.Getpid()))
		if out, err := pin.CombinedOutput(); err != nil {
			b.Fatalf("taskset: %v %s", err, out)
		}
		wrk = taskset + " -c 1-" + strconv.Itoa(runtime.NumCPU()-1) + " " + wrk
	}
	pets := benchEnvInt(b, "PETSTORE_BENCH_PETS", 100000)
	rounds := benchEnvInt(b, "PETSTORE_BENCH_ROUNDS", 3)
	seconds := benchEnvInt(b, "PETSTORE_BENCH_SECONDS", 3)
	dir := b.TempDir()
	db := filepath.Join(dir, "bench.db")
	if bin := os.Getenv("PETSTORE_BENCH_BINARY"); bin != "" {
		built.once.Do(func() { built.path = bin })
	}
	// The binary makes its schema, then the pets go in from outside, as
	// docs/performance.md does it; so an older build gets its own schema.
	_, first := startBinary(b, nil, []string{"-db", db}, nil)
	first.Process.Signal(os.Interrupt)
	first.Wait()
	sqlExec(b, db, fmt.Sprintf(preloadSQL, pets))
	logs := &syncBuffer{limit: 64 << 10}
	base, _ := startBinary(b, nil, []string{"-db", db}, logs)
	waitForLog(b, logs, "in-memory view loaded", 1)
	if os.Getenv("PETSTORE_BENCH_LITESTREAM") == "1" {
		startLitestream(b, litestreamBinary(b), db, filepath.Join(dir, "replica"))
	}
	answers := map[string][]byte{}
	for _, path := range []string{"/v1/pets?limit=20&after=1000", "/v1/pets?limit=20&status=sold&after=1000", "/v1/pets/1000"} {
		r := send(b, base, call{method: "GET", path: path})
		if r.status != 200 {
			b.Fatalf("GET %s: %d %s", path, r.status, r.body)
		}
		answers[path] = r.body
	}
	floor := startFloor(b, answers)

	ops := []struct{ name, script string }{
		{"list limit=20", fmt.Sprintf(`request = function() return wrk.format(nil, "/v1/pets?limit=20&after=" .. math.random(0, %d)) end`, pets-20)},
		{"list limit=20&status=sold", fmt.Sprintf(`request = function() return wrk.format(nil, "/v1/pets?limit=20&status=sold&after=" .. math.random(0, %d)) end`, pets-60)},
		{"get by id", fmt.Sprintf(`request = function() return wrk.format(nil, "/v1/pets/" .. math.random(1, %d)) end`, pets)},
		{"create", `wrk.method = "POST"
wrk.path = "/v1/pets"
wrk.body = '{"name":"bench pet","categoryId":7,"status":"available"}'
wrk.headers["Content-Type"] = "application/json"`},
	}
	fmt.Printf("\n%d pets, %d rounds of %d s, wrk -t2 -c64\n%-28s %12s %12s %7s\n", pets, rounds, seconds, "operation", "service/s", "floor/s", "ratio")
	for _, op := range ops {
		if only := os.Getenv("PETSTORE_BENCH_OPS"); only != "" && !strings.HasPrefix(op.name, only) {
			continue
		}
		script := filepath.Join(dir, "op.lua")
		must(b, os.WriteFile(script, []byte(`wrk.headers["Authorization"] = "Bearer `+testKey+`"`+"\n"+op.script+"\n"), 0o600))
		var service, floorRate float64
		for range rounds {
			floorRate += runWrk(b, wrk, script, floor, seconds)
			service += runWrk(b, wrk, script, base, seconds)
		}
		fmt.Printf("%-28s %12.0f %12.0f %7.2f\n", op.name, service/float64(rounds), floorRate/float64(rounds), service/floorRate)
	}
}

// runWrk runs one round of wrk and returns its requests a second; a
// round with any non-2xx answer or socket error fails the benchmark.
func runWrk(b *testing.B, wrk, script, base string, seconds int) float64 {
	b.Helper()
	argv := append(strings.Fields(wrk), "-t2", "-c64", fmt.Sprintf("-d%ds", seconds), "-s", script, base)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		b.Fatalf("wrk: %v\n%s", err, out)
	}
	if bad := regexp.MustCompile(`Non-2xx or 3xx responses: \d+|Socket errors: .*`).Find(out); bad != nil {
		b.Fatalf("wrk against %s: %s\n%s", base, bad, out)
	}
	m := regexp.MustCompile(`Requests/sec:\s+([\d.]+)`).FindSubmatch(out)
	if m == nil {
		b.Fatalf("wrk printed no rate:\n%s", out)
	}
	rate, _ := strconv.ParseFloat(string(m[1]), 64)
	return rate
}

// startFloor starts the floor server: answers holds the body of each GET
// path, by path without its after=; a create is answered with the get's.
func startFloor(b *testing.B, answers map[string][]byte) string {
	b.Helper()
	key := regexp.MustCompile(`&after=\d+|\d+$`)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		status, path := http.StatusOK, key.ReplaceAllString(r.URL.RequestURI(), "")
		if r.Method == "POST" {
			io.Copy(io.Discard, r.Body)
			status, path = http.StatusCreated, "/v1/pets/"
			w.Header().Set("Location", "/v1/pets/1000")
		}
		var body []byte
		for p, a := range answers {
			if key.ReplaceAllString(p, "") == path {
				body = a
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(status)
		w.Write(body)
	})
	cfg, _ := parseFlags([]string{"petstore"}, func(string) string { return "" }, io.Discard)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(b, err)
	srv := &http.Server{
		Handler:           requireAPIKey(newKeyRing([]keyDigest{digestOf(testKey)}), nil, handler),
		ReadHeaderTimeout: cfg.readHeaderTimeout,
		ReadTimeout:       cfg.readTimeout,
		WriteTimeout:      cfg.writeTimeout,
		IdleTimeout:       cfg.idleTimeout,
		MaxHeaderBytes:    cfg.maxHeaderBytes,
	}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// benchEnvInt reads a positive integer setting of the benchmark.
func benchEnvInt(tb testing.TB, key string, def int) int {
	v := os.Getenv(key)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		tb.Fatalf("%s=%q: want a positive integer", key, v)
	}
	return n
}
