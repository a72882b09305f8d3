// The load runs: benchmarks that print figures and gate nothing. Run one
// at a time, each once:
//
//	go test -run '^$' -bench '^BenchmarkThroughput$' -benchtime 1x .
//
// Knobs (environment): PETSTORE_BENCH_PETS (100,000) preloaded pets,
// PETSTORE_BENCH_ROUNDS (3) rounds of PETSTORE_BENCH_SECONDS (3) for the
// alternating runs, PETSTORE_BENCH_OLD the earlier build to compare
// (/work/old/petstore-2ef6b6d if it exists), PETSTORE_BENCH_BIG_PETS
// (1,000,000) for BenchmarkMillionPets and BenchmarkLitestream, and
// PETSTORE_BENCH_LOAD_SECONDS (10), BenchmarkMillionPets' load.

package main

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkThroughput: each operation in rounds alternating between a
// floor (a trivial net/http server in this process answering this
// build's bytes), this build and the earlier one, each on a database of
// its own with PETSTORE_BENCH_PETS pets. The targets: create at
// least 0.8 of the old build's, list 0.30 of the floor, get 0.45.
func BenchmarkThroughput(b *testing.B) {
	bin, load := setUp(b, true)
	pets := knob(b, "PETSTORE_BENCH_PETS", 100000)
	hosts := make([]string, 3) // the floor, this build, the old one
	hosts[1], _, _ = startPetstore(b, bin, preloaded(b, bin, pets))
	old := os.Getenv("PETSTORE_BENCH_OLD")
	if _, err := os.Stat(old); err == nil {
		hosts[2], _, _ = startPetstore(b, old, preloaded(b, old, pets))
	}
	ops, replies, headers := benchOps(pets), map[string]reply{}, map[string]http.Header{}
	for _, op := range ops {
		key := floorKey.ReplaceAllString(op.method+" "+op.sample, "")
		replies[key], headers[key] = (&service{url: "http://" + hosts[1]}).send(b, call{method: op.method, path: op.sample, body: op.body})
	}
	hosts[0] = startFloor(b, replies, headers)
	for i, r := range alternate(b, load, ops, hosts) {
		b.ReportMetric(r[1]/r[0], ops[i].name+"/floor")
		b.ReportMetric(r[1]/r[2], ops[i].name+"/old") // +Inf without the old build
		b.Logf("%-11s floor %6.0f/s, this build %6.0f/s = %.2f of the floor; old build (%s) %6.0f/s, this/old %.2f; target %s",
			ops[i].name, r[0], r[1], r[1]/r[0], old, r[2], r[1]/r[2], ops[i].target)
	}
}

// BenchmarkMillionPets: this build on PETSTORE_BENCH_BIG_PETS pets, the
// time from its start until /healthz answers 200 (target 1 s), its peak
// RSS after PETSTORE_BENCH_LOAD_SECONDS of lists, then gets (target 64
// MiB), and a page of sold pets as sqlite3 reads it. Unpinned: the
// service has both CPUs, as on its machine, and wrk takes its share.
func BenchmarkMillionPets(b *testing.B) {
	bin, _ := setUp(b, false)
	sqlite3 := needTool(b, "sqlite3", "apt-get install sqlite3")
	pets, seconds := knob(b, "PETSTORE_BENCH_BIG_PETS", 1000000), knob(b, "PETSTORE_BENCH_LOAD_SECONDS", 10)
	db := preloaded(b, bin, pets)
	start := time.Now()
	host, cmd, _ := startPetstore(b, bin, db)
	svc := &service{url: "http://" + host}
	waitFor(b, "/healthz to answer 200", func() bool {
		r, _ := svc.send(b, call{method: "GET", path: "/healthz"})
		return r.status == http.StatusOK
	})
	healthy, ops := time.Since(start), benchOps(pets)
	list, get := wrk(b, nil, ops[1].lua, host, (seconds+1)/2), wrk(b, nil, ops[3].lua, host, (seconds+1)/2)
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	peakKiB, _ := strconv.Atoi(string(regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(status)[1]))
	const page = "/v1/pets?status=sold&after=500000&limit=3"
	got, _ := svc.send(b, call{method: "GET", path: page})
	want, err := exec.Command(sqlite3, "-json", "file:"+db+"?mode=ro", "SELECT id, name, category_id AS categoryId, status FROM pets WHERE status = 'sold' AND id > 500000 ORDER BY id LIMIT 3").Output()
	must(b, err)
	if got.status != http.StatusOK || jsonValue(got.body) != jsonValue(cmp.Or(strings.TrimSpace(string(want)), "[]")) {
		b.Errorf("GET %s: %d %s; sqlite3 reads %s", page, got.status, got.body, want)
	}
	b.Logf("%d pets: /healthz 200 %s after the start (target 1 s); lists %.0f/s, then gets %.0f/s; VmHWM %.1f MiB (target 64 MiB); %s: %s, as sqlite3 reads it",
		pets, healthy.Round(time.Millisecond), list, get, float64(peakKiB)/1024, page, strings.TrimSpace(got.body))
}

// BenchmarkLitestream: creates and lists on PETSTORE_BENCH_BIG_PETS pets,
// in rounds alternating between this build alone and this build with
// Litestream replicating its file to a file replica beside it, as
// litestream.yml ships it (truncate-page-n: 0), on the service's CPU.
// Target: at least 0.9 of without.
func BenchmarkLitestream(b *testing.B) {
	ls := needTool(b, "litestream", "go install github.com/benbjohnson/litestream/cmd/litestream@v0.5.18")
	bin, load := setUp(b, true)
	pets := knob(b, "PETSTORE_BENCH_BIG_PETS", 1000000)
	without, _, _ := startPetstore(b, bin, preloaded(b, bin, pets))
	db := preloaded(b, bin, pets)
	with, _, _ := startPetstore(b, bin, db)
	config := filepath.Join(filepath.Dir(db), "litestream.yml")
	must(b, os.WriteFile(config, fmt.Appendf(nil, "dbs:\n  - path: %s\n    truncate-page-n: 0\n    replica:\n      type: file\n      path: %s\n      sync-interval: 1s\n",
		db, filepath.Join(filepath.Dir(db), "replica")), 0o600))
	launch(b, `msg="snapshot (complete)"`, ls, "replicate", "-config", config)
	ops := benchOps(pets)[:2]
	for i, r := range alternate(b, load, ops, []string{without, with}) {
		b.ReportMetric(r[1]/r[0], ops[i].name+"/without")
		b.Logf("%-6s without Litestream %6.0f/s, with %6.0f/s = %.2f (target 0.90)", ops[i].name, r[0], r[1], r[1]/r[0])
	}
}

// BenchmarkFreshClient, issue 43's front door, at the default descriptor
// limit with net/http's own timeouts: (a) under 300 keep-alive
// connections from 20 addresses sending requests one after another, 200
// sending partial headers from 40 and 100 slow bodies from 10, a fresh
// client from 127.0.0.100 is answered within 1 s (target 10 of 10); (b)
// over TLS, among 300 silent connections from 20 addresses, a fresh
// HTTP/2 client (target 9 of 10); (c) headers trickled a byte a second
// are cut within 30 s. The flood is a helper process (this test binary
// again) on a CPU of its own, as it would come from other machines.
func BenchmarkFreshClient(b *testing.B) {
	if spec := os.Getenv("PETSTORE_BENCH_FLOOD"); spec != "" {
		flood(strings.Fields(spec)) // the helper's whole work, until killed
	}
	bin, load := setUp(b, true)
	dir := b.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	pool := writeCertificate(b, certFile, keyFile, 1)
	freshClient(b, bin, load, "plain (target 10 of 10)", "300 200 100 0", 600, 1, pool)
	freshClient(b, bin, load, "TLS, HTTP/2 (target 9 of 10)", "0 0 0 300", 300, 2, pool, "-tls-cert", certFile, "-tls-key", keyFile)
}

// freshClient starts the binary with args, and the helper process with
// the flood, and tries a fresh client 10 times, over HTTP/proto.
func freshClient(b *testing.B, bin string, load []string, name, counts string, connections, proto int, pool *x509.CertPool, args ...string) {
	host, cmd, stop := startPetstore(b, bin, filepath.Join(b.TempDir(), "pets.db"), args...)
	defer stop()
	_, _, stopFlood := launch(b, "(flooding)", append(append([]string{"env", "PETSTORE_BENCH_FLOOD=" + host + " " + counts}, load...),
		os.Args[0], "-test.run=^$", "-test.bench=^BenchmarkFreshClient$")...)
	defer stopFlood()
	fds := fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid)
	waitFor(b, "the flood's connections", func() bool { d, _ := os.ReadDir(fds); return len(d) >= connections*9/10 })
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true, ForceAttemptHTTP2: true,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 100)}}).DialContext, TLSClientConfig: &tls.Config{RootCAs: pool}}}
	answered, slowest := 0, time.Duration(0)
	for range 10 {
		start := time.Now()
		resp, err := client.Get(map[int]string{1: "http://", 2: "https://"}[proto] + host + "/healthz")
		if took := time.Since(start); err == nil && resp.StatusCode == http.StatusOK && resp.ProtoMajor == proto {
			answered, slowest = answered+1, max(slowest, took)
			resp.Body.Close()
		} else {
			b.Logf("%s: a fresh client not answered within 1 s: %v (%s)", name, err, took.Round(time.Millisecond))
		}
		time.Sleep(100 * time.Millisecond)
	}
	limits, _ := os.ReadFile(fmt.Sprintf("/proc/%d/limits", cmd.Process.Pid))
	b.ReportMetric(float64(answered), fmt.Sprintf("http%d-answered/10", proto))
	b.Logf("%s: at a descriptor limit of %s, a fresh client answered within 1 s %d of 10 times, the slowest of those in %s",
		name, regexp.MustCompile(`Max open files\s+(\d+)`).FindSubmatch(limits)[1], answered, slowest.Round(time.Millisecond))
	if proto == 1 { // the start of a request's headers, then a byte a second, never ending them
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 101)}}).Dial("tcp", host)
		must(b, err)
		defer c.Close()
		start := time.Now()
		go func() {
			for _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: petstore\r\nX-Trickle: "); err == nil; _, err = c.Write([]byte("x")) {
				time.Sleep(time.Second)
			}
		}()
		c.SetReadDeadline(start.Add(time.Minute))
		io.Copy(io.Discard, c) // until the service cuts it
		b.Logf("headers trickled a byte a second, under the flood: cut after %s (target 30 s)", time.Since(start).Round(100*time.Millisecond))
	}
}

// flood keeps connections to args[0] open, each redialled when it ends,
// until the process is killed: args[1] keep-alive ones sending requests
// one after another, from 20 addresses (127.0.0.2-21); args[2] sending
// the start of a request's headers, then a byte a second, from 40;
// args[3] a create's body a byte a second, from 10; args[4] nothing,
// from 127.0.0.2-21.
func flood(args []string) {
	fmt.Println("flooding")
	const head = "Host: petstore\r\nAuthorization: Bearer " + testKey + "\r\n"
	starts := []string{"GET /v1/pets?limit=20 HTTP/1.1\r\n" + head + "\r\n", "GET /v1/pets HTTP/1.1\r\n" + head,
		"POST /v1/pets HTTP/1.1\r\n" + head + "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n", ""}
	for kind, first := range []int{2, 22, 62, 2} {
		n, _ := strconv.Atoi(args[kind+1])
		for i := range n {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(first+i%[]int{20, 40, 10, 20}[kind]))}}
			go func() {
				for ; ; time.Sleep(10 * time.Millisecond) {
					if c, err := d.Dial("tcp", args[0]); err == nil {
						// Keep-alive: one request, then idle; partial headers
						// and slow bodies: a byte a second.
						_, err = io.WriteString(c, starts[kind])
						for ; err == nil && (kind == 1 || kind == 2); _, err = c.Write([]byte(" ")) {
							time.Sleep(time.Second)
						}
						io.Copy(io.Discard, c) // the answer, until the service closes it
						c.Close()
					}
				}
			}()
		}
	}
	select {}
}

// benchOp is one operation of a load run: a sample request, and wrk's Lua
// for the run (wrk adds the key).
type benchOp struct{ name, method, sample, body, lua, target string }

// benchOps are the operations over n preloaded pets: creates, then pages
// and gets at random places.
func benchOps(n int) []benchOp {
	const pet = `{"name":"bench pet","categoryId":7,"status":"available"}`
	page := `request = function() return wrk.format(nil, "/v1/pets?limit=20%s&after=" .. math.random(0, %d)) end`
	return []benchOp{
		{"create", "POST", "/v1/pets", pet, "wrk.method = \"POST\"\nwrk.path = \"/v1/pets\"\nwrk.body = '" + pet + "'\nwrk.headers[\"Content-Type\"] = \"application/json\"", "0.80 of the old build"},
		{"list", "GET", "/v1/pets?limit=20&after=1000", "", fmt.Sprintf(page, "", n-20), "0.30 of the floor"},
		{"list-status", "GET", "/v1/pets?limit=20&status=sold&after=1000", "", fmt.Sprintf(page, "&status=sold", n-60), "none given"},
		{"get", "GET", "/v1/pets/1000", "", fmt.Sprintf(`request = function() return wrk.format(nil, "/v1/pets/" .. math.random(1, %d)) end`, n), "0.45 of the floor"},
	}
}

// alternate runs PETSTORE_BENCH_ROUNDS rounds of each op against each
// host in turn ("" skipped), and returns each op's mean requests a
// second, by host.
func alternate(b *testing.B, load []string, ops []benchOp, hosts []string) [][]float64 {
	rounds, seconds := knob(b, "PETSTORE_BENCH_ROUNDS", 3), knob(b, "PETSTORE_BENCH_SECONDS", 3)
	rates := make([][]float64, len(ops))
	for o, op := range ops {
		rates[o] = make([]float64, len(hosts))
		for range rounds {
			for i, host := range hosts {
				if host != "" {
					rates[o][i] += wrk(b, load, op.lua, host, seconds) / float64(rounds)
				}
			}
		}
	}
	return rates
}

// wrk runs lua against host for seconds, after the prefix load, and
// returns its requests a second; an answer not 2xx, or a socket error,
// is an error of the benchmark's.
func wrk(b *testing.B, load []string, lua, host string, seconds int) float64 {
	script := filepath.Join(b.TempDir(), "op.lua")
	must(b, os.WriteFile(script, []byte("wrk.headers[\"Authorization\"] = \"Bearer "+testKey+"\"\n"+lua+"\n"), 0o600))
	argv := append(load[:len(load):len(load)], "wrk", "-t2", "-c64", fmt.Sprintf("-d%ds", seconds), "-s", script, "http://"+host)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	m := regexp.MustCompile(`Requests/sec:\s+([\d.]+)`).FindSubmatch(out)
	if err != nil || m == nil {
		b.Fatalf("%s: %v\n%s", argv, err, out)
	}
	if bad := regexp.MustCompile(`Non-2xx or 3xx responses: \d+|Socket errors: .*`).Find(out); bad != nil {
		b.Errorf("wrk against %s: %s, for\n%s", host, bad, lua)
	}
	rate, _ := strconv.ParseFloat(string(m[1]), 64)
	return rate
}

// floorKey is what the floor tells operations apart by: a request
// without its numbers.
var floorKey = regexp.MustCompile(`[0-9]+`)

// startFloor serves the replies, by floorKey, with their headers, from
// memory with the service's timeouts: what net/http alone costs for the
// same bytes. It returns its host:port.
func startFloor(b *testing.B, replies map[string]reply, headers map[string]http.Header) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(b, err)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			key := floorKey.ReplaceAllString(r.Method+" "+r.URL.RequestURI(), "")
			maps.Copy(w.Header(), headers[key]) // Date too: the floor's is the same size
			w.WriteHeader(replies[key].status)
			io.WriteString(w, replies[key].body)
		})}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// preloaded is a database that bin made (started and stopped on it),
// then given n pets straight into SQLite, of every category and status.
func preloaded(b *testing.B, bin string, n int) string {
	db := filepath.Join(b.TempDir(), "pets.db")
	_, _, stop := startPetstore(b, bin, db)
	stop()
	conn := sqlite(b, db)
	_, err := conn.Exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
		INSERT INTO pets (name, category_id, status) SELECT 'pet number ' || i, i % 50 + 1,
		CASE i % 3 WHEN 0 THEN 'available' WHEN 1 THEN 'pending' ELSE 'sold' END FROM n`, n)
	must(b, err)
	must(b, conn.Close())
	syscall.Sync() // the preload's writeback is not left to slow the runs' fsyncs
	return db
}

// startPetstore runs the build bin on db and returns its host:port once
// its listening line (either build's form) says it.
func startPetstore(b *testing.B, bin, db string, args ...string) (string, *exec.Cmd, func()) {
	return launch(b, `msg=listening addr=(?:https?://)?(\S+)`, append([]string{bin, "-addr", "127.0.0.1:0", "-db", db}, args...)...)
}

// launch starts argv with the test key, its output to a file, and
// returns ready's group once the output matches it, the process, and a
// stop (SIGINT, then wait), which also runs when the benchmark ends.
func launch(b *testing.B, ready string, argv ...string) (string, *exec.Cmd, func()) {
	cmd, output := exec.Command(argv[0], argv[1:]...), filepath.Join(b.TempDir(), "output")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "PETSTORE_API_KEYS=" + testKey}
	out, err := os.Create(output)
	must(b, err)
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	must(b, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := sync.OnceFunc(func() { cmd.Process.Signal(os.Interrupt); <-exited })
	b.Cleanup(stop)
	var m [][]byte
	waitFor(b, ready, func() bool {
		text, _ := os.ReadFile(output)
		if m = regexp.MustCompile(ready).FindSubmatch(text); m == nil && len(exited) > 0 {
			b.Fatalf("%s stopped:\n%s", argv, text)
		}
		return m != nil
	})
	return string(m[1]), cmd, stop
}

// setUp skips a load run without wrk and returns the binary. With pin,
// it pins this process, and what it starts from now on (the service,
// Litestream, the floor in it), to CPU 0 with GOMAXPROCS 1 until the
// benchmark ends, and returns the prefix that runs a load generator on
// the other CPUs; none where there is one CPU or no taskset.
func setUp(b *testing.B, pin bool) (string, []string) {
	needTool(b, "wrk", "apt-get install wrk")
	bin, err := binaryPath()
	must(b, err)
	n, pid := runtime.NumCPU(), strconv.Itoa(os.Getpid())
	if _, err := exec.LookPath("taskset"); !pin || err != nil || n < 2 {
		return bin, nil
	}
	must(b, exec.Command("taskset", "-a", "-p", "-c", "0", pid).Run())
	b.Cleanup(func() { exec.Command("taskset", "-a", "-p", "-c", "0-"+strconv.Itoa(n-1), pid).Run() })
	procs := runtime.GOMAXPROCS(1)
	b.Cleanup(func() { runtime.GOMAXPROCS(procs) })
	return bin, []string{"taskset", "-c", "1-" + strconv.Itoa(n-1)}
}

// knob reads a positive integer setting, def when it is not one.
func knob(b *testing.B, name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}
