package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The load benchmark. It is a benchmark, never a timed assertion:
//
//	go test -run '^$' -bench '^BenchmarkLoad$' -benchtime 1x .
//
// PETSTORE_BENCH_PETS (default 100000) sets the catalogue size,
// PETSTORE_BENCH_SECONDS (default 5) the time per operation,
// PETSTORE_BENCH_CONNS (default 64) the keep-alive clients.
//
// It starts the real service (run) on loopback over a temp database
// preloaded with the pets, and a floor server: the same listener kind,
// timeouts and auth wrapper, answering from memory with bytes of the same
// size. Each operation is driven against both in turn, and the table gives
// req/s, p50, p99 and the ratio to the floor.
func BenchmarkLoad(b *testing.B) {
	pets := benchEnvInt(b, "PETSTORE_BENCH_PETS", 100_000)
	seconds := benchEnvInt(b, "PETSTORE_BENCH_SECONDS", 5)
	conns := benchEnvInt(b, "PETSTORE_BENCH_CONNS", 64)
	duration := time.Duration(seconds) * time.Second

	dir := b.TempDir()
	db := filepath.Join(dir, "bench.db")
	preloadPets(b, db, pets)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &syncBuffer{}
	done := make(chan error, 1)
	env := map[string]string{"PETSTORE_API_KEYS": testKey}
	go func() {
		done <- run(ctx, []string{"petstore", "-addr", "127.0.0.1:0", "-db", db}, func(k string) string { return env[k] }, io.Discard, stderr)
	}()
	base := waitListening(b, stderr)

	// Sizes of real answers, so the floor sends as many bytes.
	list20 := benchGet(b, base+"/v1/pets?limit=20&after=1000")
	listSold := benchGet(b, base+"/v1/pets?limit=20&status=sold&after=1000")
	one := benchGet(b, base+"/v1/pets/1000")
	floor := startFloor(b, list20, listSold, one)

	ops := []loadOp{
		{name: "list limit=20 (after cursors)", method: "GET", path: listPath("")},
		{name: "list limit=20&status=sold", method: "GET", path: listPath("sold")},
		{name: "get by id", method: "GET", path: func(rng *mathrand.Rand, _ *cursor) string {
			return "/v1/pets/" + strconv.Itoa(rng.IntN(pets)+1)
		}},
		{name: "create (synchronous=FULL)", method: "POST", body: func(rng *mathrand.Rand) string {
			return fmt.Sprintf(`{"name":"bench %d","categoryId":%d,"status":"available"}`, rng.Uint32(), rng.IntN(50)+1)
		}},
	}
	fmt.Printf("\nload: %d pets, %d keep-alive clients, %v per operation and server, GOMAXPROCS=%d\n", pets, conns, duration, runtimeProcs())
	fmt.Printf("%-32s %12s %10s %10s   %12s %10s %10s   %6s\n", "operation", "req/s", "p50", "p99", "floor req/s", "p50", "p99", "ratio")
	for _, op := range ops {
		got := drive(b, base, op, conns, duration, pets)
		fl := drive(b, floor, op, conns, duration, pets)
		ratio := got.rps / fl.rps
		fmt.Printf("%-32s %12.0f %10v %10v   %12.0f %10v %10v   %6.2f\n", op.name, got.rps, got.p50, got.p99, fl.rps, fl.p50, fl.p99, ratio)
		unit := strings.NewReplacer(" ", "_", "=", "", "(", "", ")", "", "&", "_").Replace(op.name)
		b.ReportMetric(got.rps, unit+"_req/s")
		b.ReportMetric(ratio, unit+"_ratio")
		if got.errors > 0 || fl.errors > 0 {
			b.Errorf("%s: %d errors against the service, %d against the floor", op.name, got.errors, fl.errors)
		}
	}
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// loadOp is one kind of request the load sends.
type loadOp struct {
	name   string
	method string
	path   func(*mathrand.Rand, *cursor) string // nil: /v1/pets
	body   func(*mathrand.Rand) string
}

// cursor is one client's place when it pages through the catalogue.
type cursor struct{ next string }

// listPath pages through the whole table by following next links, as a
// client would, starting each client at a random place.
func listPath(status string) func(*mathrand.Rand, *cursor) string {
	return func(rng *mathrand.Rand, c *cursor) string {
		if c.next == "" {
			q := "/v1/pets?limit=20"
			if status != "" {
				q += "&status=" + status
			}
			c.next = q + "&after=" + strconv.Itoa(rng.IntN(1000))
		}
		return c.next
	}
}

// loadResult is what one drive measured.
type loadResult struct {
	rps      float64
	p50, p99 time.Duration
	errors   int
}

// drive sends op from conns clients, each on its own keep-alive
// connection, for d, and measures every request.
func drive(b *testing.B, base string, op loadOp, conns int, d time.Duration, pets int) loadResult {
	b.Helper()
	transport := &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}
	var errs atomic.Int64
	latencies := make([][]time.Duration, conns)
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mathrand.New(mathrand.NewPCG(uint64(c), 42))
			cur := &cursor{}
			lat := make([]time.Duration, 0, 1<<16)
			for time.Now().Before(stop) {
				path := "/v1/pets"
				if op.path != nil {
					path = op.path(rng, cur)
				}
				var body io.Reader
				if op.body != nil {
					body = strings.NewReader(op.body(rng))
				}
				req, _ := http.NewRequest(op.method, base+path, body)
				req.Header.Set("Authorization", "Bearer "+testKey)
				if body != nil {
					req.Header.Set("Content-Type", "application/json")
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					errs.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat = append(lat, time.Since(t0))
				if resp.StatusCode >= 300 {
					errs.Add(1)
				}
				// Follow the next link; at the end of the table, start over.
				link := resp.Header.Get("Link")
				if i := strings.Index(link, ">"); strings.HasPrefix(link, "</v1/pets?") && i > 0 {
					cur.next = link[1:i]
				} else {
					cur.next = ""
				}
			}
			latencies[c] = lat
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	all := slices.Concat(latencies...)
	slices.Sort(all)
	if len(all) == 0 {
		b.Fatalf("%s: no request completed", op.name)
	}
	return loadResult{
		rps:    float64(len(all)) / elapsed.Seconds(),
		p50:    all[len(all)/2].Round(time.Microsecond),
		p99:    all[len(all)*99/100].Round(time.Microsecond),
		errors: int(errs.Load()),
	}
}

// startFloor serves the fastest possible answers of the same sizes from
// memory, behind the same listener, server settings and auth wrapper as
// the service: what the machine can do without the database and the
// encoding.
func startFloor(b *testing.B, list, listSold, one reply) string {
	b.Helper()
	created := one
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ans := one
		switch {
		case r.Method == "POST":
			io.Copy(io.Discard, r.Body)
			ans = created
			w.Header().Set("Location", "/v1/pets/1000")
		case r.URL.Path == "/v1/pets" && r.URL.Query().Get("status") != "":
			ans = listSold
		case r.URL.Path == "/v1/pets":
			ans = list
		}
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Length", strconv.Itoa(len(ans.body)))
		if l := ans.header.Get("Link"); l != "" {
			h.Set("Link", l)
		}
		status := http.StatusOK
		if r.Method == "POST" {
			status = http.StatusCreated
		}
		w.WriteHeader(status)
		w.Write(ans.body)
	})
	digests, _ := parseAPIKeys(testKey)
	cfg, _ := parseFlags([]string{"petstore"}, func(string) string { return "" }, io.Discard)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{
		Handler:           requireAPIKey(newKeyRing(digests), handler),
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

// preloadPets fills a new database with n pets, in one transaction.
func preloadPets(tb testing.TB, path string, n int) {
	tb.Helper()
	s, err := openStore(path)
	if err != nil {
		tb.Fatal(err)
	}
	s.close()
	db, err := sql.Open("sqlite3", sqliteDSN(path))
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	_, err = db.Exec(`WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
		INSERT INTO pets (name, category_id, status)
		SELECT 'pet number ' || i, i % 50 + 1, CASE i % 3 WHEN 0 THEN 'available' WHEN 1 THEN 'pending' ELSE 'sold' END FROM n`, n)
	if err != nil {
		tb.Fatal(err)
	}
}

// waitListening returns run's base URL once its log says it listens.
func waitListening(tb testing.TB, stderr *syncBuffer) string {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if i := strings.Index(stderr.String(), "addr=http://"); i >= 0 {
			return strings.Fields(stderr.String()[i+len("addr="):])[0]
		}
		time.Sleep(5 * time.Millisecond)
	}
	tb.Fatalf("service did not listen:\n%s", stderr.String())
	return ""
}

// benchGet fetches one answer with the test key.
func benchGet(tb testing.TB, url string) reply {
	tb.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		tb.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return reply{resp.StatusCode, resp.Header, body}
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

// Micro-benchmarks of each handler path, through the whole handler (mux,
// middleware, auth, store, encoding) without the network, with allocs/op:
//
//	go test -run '^$' -bench 'Handler' -benchmem .
func BenchmarkHandlerListPets(b *testing.B) {
	benchHandler(b, "GET", "/v1/pets?limit=20&after=500", "")
}

func BenchmarkHandlerListPetsByStatus(b *testing.B) {
	benchHandler(b, "GET", "/v1/pets?limit=20&status=sold&after=500", "")
}

func BenchmarkHandlerGetPet(b *testing.B) {
	benchHandler(b, "GET", "/v1/pets/777", "")
}

func BenchmarkHandlerCreatePet(b *testing.B) {
	benchHandler(b, "POST", "/v1/pets", `{"name":"Rex","categoryId":3,"status":"pending"}`)
}

func BenchmarkHandlerUnauthorized(b *testing.B) {
	benchHandler(b, "GET", "/v1/pets", "", "Bearer wrong")
}

// benchHandler serves one request shape over and over through the real
// handler on a real database of 10,000 pets.
func benchHandler(b *testing.B, method, target, body string, auth ...string) {
	path := filepath.Join(b.TempDir(), "bench.db")
	preloadPets(b, path, 10_000)
	store, err := openStore(path)
	if err != nil {
		b.Fatal(err)
	}
	defer store.close()
	digests, _ := parseAPIKeys(testKey)
	h := newHandler(store, newKeyRing(digests), slog.New(slog.NewTextHandler(io.Discard, nil)))
	authorization := "Bearer " + testKey
	if len(auth) > 0 {
		authorization = auth[0]
	}
	var rd strings.Reader
	req := httptest.NewRequest(method, target, &rd)
	req.Header.Set("Authorization", authorization)
	w := &benchWriter{header: http.Header{}}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		rd.Reset(body)
		w.reset()
		h.ServeHTTP(w, req)
	}
	b.StopTimer()
	if w.status >= 500 || (len(auth) == 0 && w.status >= 300) {
		b.Fatalf("%s %s: %d %s", method, target, w.status, w.body.Bytes())
	}
}

// benchWriter is a ResponseWriter that keeps nothing between requests, so
// the benchmark measures the handler, not the recorder.
type benchWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *benchWriter) Header() http.Header         { return w.header }
func (w *benchWriter) WriteHeader(status int)      { w.status = status }
func (w *benchWriter) Write(p []byte) (int, error) { return w.body.Write(p) }
func (w *benchWriter) reset() {
	clear(w.header)
	w.status = 0
	w.body.Reset()
}

// runtimeProcs is GOMAXPROCS, for the table's heading.
func runtimeProcs() int { return runtime.GOMAXPROCS(0) }
