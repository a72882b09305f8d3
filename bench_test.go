// The load run: a benchmark that prints figures and gates nothing. Run it
// once:
//
//	go test -run '^$' -bench '^BenchmarkThroughput$' -benchtime 1x .
//
// Knobs (environment): PETSTORE_BENCH_PETS (100,000) preloaded pets,
// PETSTORE_BENCH_ROUNDS (3) rounds of PETSTORE_BENCH_SECONDS (3) for the
// alternating runs, and PETSTORE_BENCH_OLD, the earlier build to compare.

package main

import (
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
// its own with PETSTORE_BENCH_PETS pets: requests a second, and the
// server's CPU time per request. Issue 48's targets against 9eb0899:
// list at least 1.05 with CPU per list at most 0.92, get 0.95, create 0.90.
func BenchmarkThroughput(b *testing.B) {
	bin, load := setUp(b)
	pets := knob(b, "PETSTORE_BENCH_PETS", 100000)
	targets := make([]target, 3) // the floor, this build, the old one
	targets[1] = startPetstore(b, bin, preloaded(b, bin, pets))
	old := os.Getenv("PETSTORE_BENCH_OLD")
	if _, err := os.Stat(old); err == nil {
		targets[2] = startPetstore(b, old, preloaded(b, old, pets))
	}
	ops, replies, headers := benchOps(pets), map[string]reply{}, map[string]http.Header{}
	for _, op := range ops {
		key := floorKey.ReplaceAllString(op.method+" "+op.sample, "")
		replies[key], headers[key] = (&service{url: "http://" + targets[1].host}).send(b, call{method: op.method, path: op.sample, body: op.body})
	}
	targets[0] = target{startFloor(b, replies, headers), os.Getpid()}
	rates, cpu := alternate(b, load, ops, targets)
	for i, r := range rates {
		c := cpu[i]
		b.ReportMetric(r[1]/r[2], ops[i].name+"/old") // +Inf without the old build
		b.ReportMetric(c[1]/c[2], ops[i].name+"-cpu/old")
		b.Logf("%-11s floor %6.0f/s %5.1f µs; this build %6.0f/s %5.1f µs (%.2f of the floor); old build %6.0f/s %5.1f µs; this/old %.2f, CPU per request %.2f",
			ops[i].name, r[0], c[0], r[1], c[1], r[1]/r[0], r[2], c[2], r[1]/r[2], c[1]/c[2])
	}
}

// benchOp is one operation of a load run: a sample request, and wrk's Lua
// for the run (wrk adds the key).
type benchOp struct{ name, method, sample, body, lua string }

// target is a server under load: its host:port, and its process, whose
// CPU time is read from /proc.
type target struct {
	host string
	pid  int
}

// cpuTime is the CPU time, user and system, that process pid has used.
func cpuTime(pid int) time.Duration {
	stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	user, _ := strconv.Atoi(fields[11])
	system, _ := strconv.Atoi(fields[12])
	return time.Duration(user+system) * 10 * time.Millisecond // in ticks of 1/100 s
}

// benchOps are the operations over n preloaded pets: creates, then pages
// and gets at random places.
func benchOps(n int) []benchOp {
	const pet = `{"name":"bench pet","categoryId":7,"status":"available"}`
	page := `request = function() return wrk.format(nil, "/v1/pets?limit=20%s&after=" .. math.random(0, %d)) end`
	return []benchOp{
		{"create", "POST", "/v1/pets", pet, "wrk.method = \"POST\"\nwrk.path = \"/v1/pets\"\nwrk.body = '" + pet + "'\nwrk.headers[\"Content-Type\"] = \"application/json\""},
		{"list", "GET", "/v1/pets?limit=20&after=1000", "", fmt.Sprintf(page, "", n-20)},
		{"list-status", "GET", "/v1/pets?limit=20&status=sold&after=1000", "", fmt.Sprintf(page, "&status=sold", n-60)},
		{"get", "GET", "/v1/pets/1000", "", fmt.Sprintf(`request = function() return wrk.format(nil, "/v1/pets/" .. math.random(1, %d)) end`, n)},
	}
}

// alternate runs PETSTORE_BENCH_ROUNDS rounds of each op against each
// target in turn (one with no host skipped), and returns, for each op and
// target, the mean requests per second and the CPU µs per request.
func alternate(b *testing.B, load []string, ops []benchOp, targets []target) (rates, cpu [][]float64) {
	rounds, seconds := knob(b, "PETSTORE_BENCH_ROUNDS", 3), knob(b, "PETSTORE_BENCH_SECONDS", 3)
	rates, cpu = make([][]float64, len(ops)), make([][]float64, len(ops))
	for o, op := range ops {
		rates[o], cpu[o] = make([]float64, len(targets)), make([]float64, len(targets))
		requests := make([]float64, len(targets))
		for range rounds {
			for i, t := range targets {
				if t.host != "" {
					before := cpuTime(t.pid)
					rate := wrk(b, load, op.lua, t.host, seconds)
					rates[o][i] += rate / float64(rounds)
					requests[i] += rate * float64(seconds)
					cpu[o][i] += float64((cpuTime(t.pid) - before).Microseconds())
				}
			}
		}
		for i := range targets {
			cpu[o][i] /= requests[i]
		}
	}
	return rates, cpu
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
	_, _, stop := launch(b, `msg=listening addr=(\S+)`, bin, "-addr", "127.0.0.1:0", "-db", db)
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

// startPetstore runs the build bin on db and returns it once its
// listening line says where.
func startPetstore(b *testing.B, bin, db string) target {
	host, cmd, _ := launch(b, `msg=listening addr=(\S+)`, bin, "-addr", "127.0.0.1:0", "-db", db)
	return target{host, cmd.Process.Pid}
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

// setUp skips a load run without wrk and returns the binary. It pins
// this process, and what it starts from now on (the services, and the
// floor in it), to CPU 0 with GOMAXPROCS 1 until the benchmark ends, and
// returns the prefix that runs a load generator on the other CPUs; none
// where there is one CPU or no taskset.
func setUp(b *testing.B) (string, []string) {
	needTool(b, "wrk", "apt-get install wrk")
	bin, err := binaryPath()
	must(b, err)
	n, pid := runtime.NumCPU(), strconv.Itoa(os.Getpid())
	if _, err := exec.LookPath("taskset"); err != nil || n < 2 {
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
