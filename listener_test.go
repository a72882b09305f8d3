package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestLowDescriptorLimit runs the binary with RLIMIT_NOFILE 128 and more
// clients than that, each on its own connection: connections above the
// cap wait at the listener, and no request on an accepted connection
// fails.
func TestLowDescriptorLimit(t *testing.T) {
	stderr := &syncBuffer{}
	sh := needTool(t, "sh", "apt-get install dash")
	base, _ := startBinary(t, []string{sh, "-c", `ulimit -n 128 && exec "$0" "$@"`},
		[]string{"-db", filepath.Join(t.TempDir(), "pets.db")}, stderr)
	const clients, each = 150, 5
	var failed, answered atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			transport := &http.Transport{MaxConnsPerHost: 1}
			defer transport.CloseIdleConnections()
			client := &http.Client{Transport: transport, Timeout: patience}
			for range each {
				if r := send(t, base, call{method: "GET", path: "/v1/pets?limit=5", client: client}); r.status == 200 {
					answered.Add(1)
				} else {
					failed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("RLIMIT_NOFILE 128, %d clients on their own connections: %d requests answered 200, %d failed", clients, answered.Load(), failed.Load())
	if failed.Load() != 0 || strings.Contains(stderr.String(), "too many open files") {
		t.Errorf("%d requests failed at the descriptor limit; log:\n%s", failed.Load(), stderr)
	}
}

// TestCertificateReloadOnSIGHUP replaces the binary's certificate and key
// and sends SIGHUP while clients call it: new handshakes get the new
// certificate, no request fails, no restart. A broken pair keeps the one
// in force with an error line. Handshakes that fail (bare connects, TLS
// 1.0 hellos) are logged at most once a minute per cause, with a count.
func TestCertificateReloadOnSIGHUP(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	certFile, keyFile, poolA := writeTestCertificate(t, dirA)
	newCert, newKey, poolB := writeTestCertificate(t, dirB)
	logs := &syncBuffer{}
	base, cmd := startBinary(t, nil, []string{"-tls-cert", certFile, "-tls-key", keyFile}, logs)
	get := func(c *http.Client) error {
		if r := send(t, base, call{method: "GET", path: "/v1/pets", client: c}); r.status != 200 {
			return fmt.Errorf("status %d: %v", r.status, r.err)
		}
		return nil
	}
	trusting := func(pool *x509.CertPool) *http.Client {
		return &http.Client{Timeout: patience, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
	}
	if err := get(trusting(poolA)); err != nil {
		t.Fatalf("before the reload: %v", err)
	}
	// Clients that trust either certificate go on through the swap, some
	// on kept-alive connections, some with a handshake per request.
	var calls atomic.Int64
	anyCert := &tls.Config{InsecureSkipVerify: true}
	loopers := []*http.Client{
		{Timeout: patience, Transport: &http.Transport{TLSClientConfig: anyCert}},
		{Timeout: patience, Transport: &http.Transport{TLSClientConfig: anyCert, DisableKeepAlives: true}},
	}
	var next atomic.Int64
	stop := inLoops(t, 4, func() {
		calls.Add(1)
		if err := get(loopers[next.Add(1)%2]); err != nil {
			t.Errorf("a request during the reload: %v", err)
		}
	})
	for _, pair := range [][2]string{{newCert, certFile}, {newKey, keyFile}} {
		b, err := os.ReadFile(pair[0])
		must(t, err)
		must(t, os.WriteFile(pair[1]+".new", b, 0o600))
		must(t, os.Rename(pair[1]+".new", pair[1]))
	}
	must(t, cmd.Process.Signal(syscall.SIGHUP))
	waitForLog(t, logs, `level=INFO msg="SIGHUP: TLS certificate reloaded"`, 1)
	if err := get(trusting(poolB)); err != nil {
		t.Errorf("a new handshake after the reload does not get the new certificate: %v", err)
	}
	if err := get(trusting(poolA)); err == nil {
		t.Error("a new handshake after the reload still gets the old certificate")
	}

	// A broken pair changes nothing.
	must(t, os.WriteFile(certFile, []byte("not a certificate\n"), 0o600))
	must(t, cmd.Process.Signal(syscall.SIGHUP))
	waitForLog(t, logs, `level=ERROR msg="SIGHUP: TLS certificate not reloaded; the previous one stays in force"`, 1)
	if err := get(trusting(poolB)); err != nil {
		t.Errorf("after a broken pair: %v", err)
	}
	stop() // each request that failed is an error above

	// 100 bare connects and 100 TLS 1.0 hellos: a line or two, not 200.
	addr := strings.TrimPrefix(base, "https://")
	for range 100 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
		}
		raw, err := net.Dial("tcp", addr)
		must(t, err)
		old := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS10})
		if old.Handshake() == nil {
			t.Fatal("a TLS 1.0 handshake succeeded")
		}
		old.Close()
	}
	// The service's log keeps order: once a later request's access line is
	// in, so is every handshake line before it.
	send(t, base, call{method: "GET", path: "/healthz", header: map[string]string{"X-Request-Id": "after-the-handshakes"}, client: trusting(poolB)})
	waitForLog(t, logs, `msg=request [^\n]*request_id=after-the-handshakes`, 1)
	if n := countLines(logs, `level=WARN msg="http server: http: TLS handshake error from CLIENT`); n < 1 || n > 4 {
		t.Errorf("%d lines for 200 failed handshakes, want 1 to 4:\n%s", n, logs)
	}
	t.Logf("%d requests through two reloads, none failed; 200 failed handshakes gave %d lines", calls.Load(), countLines(logs, `level=WARN msg="http server: http: TLS handshake error`))
}

// TestServerErrorsAreLimited: what the http server logs for a client's
// doing (a failed handshake, an HTTP/2 protocol error) is written at most
// once a minute per kind, whatever addresses and bytes each line holds.
func TestServerErrorsAreLimited(t *testing.T) {
	logs := &syncBuffer{}
	errorLog := newServerErrors(slog.New(slog.NewTextHandler(logs, nil)))
	for i := range 200 {
		errorLog.Printf("http: TLS handshake error from 10.0.%d.%d:%d: EOF", i/256, i%256, 40000+i)
		errorLog.Printf("http2: server: error reading preface from client 10.0.0.%d:%d: bogus greeting %q", i%256, 40000+i, fmt.Sprint("XRI * HTTP/2.0 ", i))
		errorLog.Printf("http2: server connection error from [2001:db8::%x]:%d: connection error: FRAME_SIZE_ERROR", i, 40000+i)
	}
	if n := countLines(logs, "level=WARN"); n != 3 {
		t.Errorf("%d lines for 600 errors of three kinds, want 3:\n%s", n, logs)
	}
	if strings.Contains(logs.String(), "XRI * HTTP/2.0 1") {
		t.Errorf("a later client's bytes were logged:\n%s", logs)
	}
}

// TestConnectionCap fills -max-conns with connections that send nothing:
// a new client is answered once they have been silent for half a second, the
// oldest of them is the one closed for it, and one WARN line says the cap
// was reached.
func TestConnectionCap(t *testing.T) {
	// Only the cap closes them: the header timeout is longer than the test.
	svc := startService(t, nil, "-max-conns", "4", "-read-header-timeout", "5m")
	var silent []net.Conn
	for range 4 {
		c, err := net.Dial("tcp", strings.TrimPrefix(svc.url, "http://"))
		must(t, err)
		t.Cleanup(func() { c.Close() })
		silent = append(silent, c)
	}
	// All four are being served before the client comes: a slot still
	// free would be its own, and no one would be closed for it.
	waitFor(t, patience, "the 4 silent connections served", func() bool {
		svc.ln.mu.Lock()
		defer svc.ln.mu.Unlock()
		return svc.ln.open == 4 && svc.ln.parked.Len() == 0
	})
	client := &http.Client{Transport: &http.Transport{}, Timeout: patience}
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets", client: client}), 200, nil, "[]")
	silent[0].SetReadDeadline(time.Now().Add(patience))
	if _, err := silent[0].Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the oldest silent connection: %v, want it closed (EOF)", err)
	}
	checkLines(t, svc.log, `level=WARN msg="connection limit reached: [^"]*" max_conns=4 closed=1`, 1)
}

// BenchmarkFreshClient is a load run, not a test of the default suite:
// it times answers, which a machine busy with other work slows (a fresh
// client was seen answered 5 of 10 within 1 s beside the soak tests).
// CI runs it on its own:
//
//	go test -run '^$' -bench '^BenchmarkFreshClient$' -benchtime 1x .
//
// 22,000 clients without a key,
// from 90 addresses, each keep a connection open, redialled when it ends:
// a third send the headers of a POST and one byte of its 1,000-byte body
// and wait, a third the same as a GET of /healthz, a third nothing (the
// service, at its descriptor limit, holds up to 20,000). Meanwhile a client from a fresh address is
// answered within 1 s at least 9 times of 10, and its own unauthenticated
// POST with an unfinished body gets its 401 within 2 s; the binary stays
// at or under 256 MiB resident, and a WARN line says the cap was full.
func BenchmarkFreshClient(b *testing.B) {
	t := b
	if host := os.Getenv("PETSTORE_TEST_FLOOD"); host != "" {
		floodConnections(host) // a flood's own process, until killed
	}
	// The binary inherits the raised limit: descriptors for the served
	// connections and the parked ones.
	var lim syscall.Rlimit
	must(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	lim.Cur = lim.Max
	if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) != nil || lim.Cur < 12000 {
		lacking(t, "a descriptor limit of 12,000 for 11,000 connections", "ulimit -Hn 12000 or more")
	}
	// A flood comes from other machines: its two processes run on a CPU
	// of their own, the service and this client on another. On shared
	// cores the flood's redials took the service's CPU, and a fresh client
	// was answered 4 to 10 times of 10 on the 2-core development machine,
	// this build and the one before alike; pinned, 9 or 10 times in 18
	// runs of 20 over both (pinning also moves the kernel's work for the
	// flood's loopback packets to the flood's CPU: kinder than a flood
	// from outside, so the figures shared are in docs/operations.md too).
	serviceCPU, floodCPU := pinApart(t)
	logs := &syncBuffer{}
	base, cmd := startBinary(t, serviceCPU, nil, logs)
	// The flood runs in two processes of their own, as it would on other
	// machines: in this one, its goroutines would hold up the probe
	// client's own, and the test would time the client.
	host := strings.TrimPrefix(base, "http://")
	var dialled [2]atomic.Int64
	total := func() int64 { return dialled[0].Load() + dialled[1].Load() }
	for i := range dialled {
		argv := append(floodCPU, os.Args[0], "-test.run", "^$", "-test.bench", "^BenchmarkFreshClient$", "-test.benchtime", "1x")
		flood := exec.Command(argv[0], argv[1:]...)
		flood.Env = append(os.Environ(), "PETSTORE_TEST_FLOOD="+host)
		counts, err := flood.StdoutPipe()
		must(t, err)
		must(t, flood.Start())
		t.Cleanup(func() { flood.Process.Kill(); flood.Wait() })
		go func() {
			for lines := bufio.NewScanner(counts); lines.Scan(); {
				if n, err := strconv.ParseInt(strings.TrimPrefix(lines.Text(), "dialled "), 10, 64); err == nil {
					dialled[i].Store(n)
				}
			}
		}()
	}
	waitFor(t, patience, "22,000 connections dialled", func() bool { return total() >= 22000 })

	fresh := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 2, 0, 1)}}
	answered, slowest := probeFresh(t, base, "/healthz", func(int) *http.Client {
		return &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: fresh.DialContext, DisableKeepAlives: true}}
	})
	if answered < 9 {
		t.Errorf("a client from a fresh address was answered within 1 s %d times of 10, want at least 9", answered)
	}
	// Neither waits for the rest of its body: a create without a key is
	// refused at once, and /healthz takes no body.
	var answeredIn [2]time.Duration
	for i, slow := range []struct {
		request string
		status  int
	}{{slowPOST, 401}, {strings.Replace(slowPOST, "POST /v1/pets", "GET /healthz", 1), 200}} {
		c, err := fresh.Dial("tcp", host)
		must(t, err)
		defer c.Close()
		sent := time.Now()
		io.WriteString(c, slow.request)
		c.SetReadDeadline(sent.Add(2 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Errorf("%.20q with an unfinished body: no answer within 2 s: %v", slow.request, err)
		} else if resp.Body.Close(); resp.StatusCode != slow.status || !resp.Close {
			t.Errorf("%.20q with an unfinished body: %d, connection closed %v; want %d, closed", slow.request, resp.StatusCode, resp.Close, slow.status)
		}
		answeredIn[i] = time.Since(sent)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	must(t, err)
	peakKiB, _ := strconv.Atoi(string(regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(status)[1]))
	// Beyond what the service holds, served and parked, the flood waits in
	// the kernel's listen queue, and a fresh client's SYN races it there.
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", cmd.Process.Pid))
	must(t, err)
	descriptors := regexp.MustCompile(`Max open files\s+(\d+)`).FindSubmatch(limits)[1]
	if peakKiB > 256<<10 {
		t.Errorf("peak resident memory %d KiB, want at most 256 MiB", peakKiB)
	}
	waitForLog(t, logs, `level=WARN msg="connection limit reached: connections not being served were closed to make room for new ones" max_conns=2048 closed=\d+`, 1)
	t.Logf("%d connections from 22,000 clients at 90 addresses, the service's descriptor limit %s: a fresh client answered %d of 10 times within 1 s, the slowest in %s; the 401 to a POST with an unfinished body in %s, the 200 to a GET with one in %s; peak RSS %d KiB",
		total(), descriptors, answered, slowest.Round(time.Millisecond), answeredIn[0].Round(time.Millisecond), answeredIn[1].Round(time.Millisecond), peakKiB)
}

// slowPOST is the headers of a POST and one byte of its 1,000-byte body.
const slowPOST = "POST /v1/pets HTTP/1.1\r\nHost: petstore\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"

// pinApart pins this process to the first CPU it may run on, until the
// benchmark ends, and returns the command prefixes that run the service
// there too and a flood on the others; none where there is one CPU, or
// no taskset.
func pinApart(t testing.TB) (service, flood []string) {
	pid := strconv.Itoa(os.Getpid())
	out, err := exec.Command("taskset", "-c", "-p", pid).Output() // "pid N's current affinity list: 0-3,6"
	_, list, _ := strings.Cut(strings.TrimSpace(string(out)), ": ")
	var cpus []string
	for _, part := range strings.Split(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		if !isRange {
			hi = lo
		}
		from, _ := strconv.Atoi(lo)
		to, _ := strconv.Atoi(hi)
		for cpu := from; cpu <= to; cpu++ {
			cpus = append(cpus, strconv.Itoa(cpu))
		}
	}
	if err != nil || len(cpus) < 2 {
		t.Logf("the flood shares the service's CPUs (%q: one CPU, or no taskset)", list)
		return nil, nil
	}
	// Put back first: a pin that fails halfway leaves some threads pinned.
	t.Cleanup(func() { exec.Command("taskset", "-a", "-c", "-p", list, pid).Run() })
	if out, err := exec.Command("taskset", "-a", "-c", "-p", cpus[0], pid).CombinedOutput(); err != nil {
		t.Logf("the flood shares the service's CPUs (taskset: %v: %s)", err, out)
		return nil, nil
	}
	t.Logf("the service and its client run on CPU %s, the flood on %s", cpus[0], strings.Join(cpus[1:], ","))
	return []string{"taskset", "-c", cpus[0]}, []string{"taskset", "-c", strings.Join(cpus[1:], ",")}
}

// floodConnections keeps 11,000 connections open to host from 90
// addresses, each redialled when it ends: a third send the headers of a
// POST and one byte of its 1,000-byte body, a third the same as a GET of
// /healthz, and a third nothing. It prints how many it has dialled, ten
// times a second, and never returns.
func floodConnections(host string) {
	var dialled atomic.Int64
	for i := range 11000 {
		go func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 1, byte(i%90), 1)}}
			for {
				c, err := d.Dial("tcp", host)
				if err != nil {
					continue // dropped while the queue was full: dial again
				}
				dialled.Add(1)
				switch i % 3 {
				case 0:
					io.WriteString(c, slowPOST)
				case 1: // a public path, and a body it does not take
					io.WriteString(c, strings.Replace(slowPOST, "POST /v1/pets", "GET /healthz", 1))
				}
				io.Copy(io.Discard, c) // until the service closes it
				c.Close()
			}
		}()
	}
	for range time.Tick(100 * time.Millisecond) {
		fmt.Printf("dialled %d\n", dialled.Load())
	}
}

// TestParkingFull: with the parking full, a newcomer takes the place of
// its own address's oldest parked connection, which is closed, and is
// handed out in its turn, even when the one it displaced was its
// address's last.
func TestParkingFull(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	l := newLimitListener(ln, 1, 5*time.Second, discardLog)
	defer l.Close()
	l.mu.Lock()
	l.maxParked = 1
	l.mu.Unlock()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		must(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	served, err := l.Accept() // the one slot
	must(t, err)
	displaced := dial()
	waitFor(t, patience, "a connection parked", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.parked.Len() == 1
	})
	newcomer := dial()
	displaced.SetReadDeadline(time.Now().Add(patience))
	if _, err := displaced.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the displaced connection: %v, want it closed (EOF)", err)
	}
	served.Close()
	next, err := l.Accept()
	must(t, err)
	if next.RemoteAddr().String() != newcomer.LocalAddr().String() {
		t.Errorf("handed out %s, want the newcomer %s", next.RemoteAddr(), newcomer.LocalAddr())
	}
	next.Close()
}

// TestHTTP2AtTheCap: over TLS with -max-conns 4, an HTTP/2 connection
// with requests in progress is never closed for room, whatever one of
// its streams was answered: 50 creates on one connection, one stream
// beside them answered 401, while 6 more clients come and room is made
// for them; every create is answered 201 and stored. And a
// client whose round trip is 1.2 s, whose TLS handshake alone takes
// longer than a silent connection is given, is served among 20 silent
// connections from 20 addresses, redialled as they are closed.
func TestHTTP2AtTheCap(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := writeTestCertificate(t, dir)
	svc := startService(t, nil, "-tls-cert", certFile, "-tls-key", keyFile, "-max-conns", "4")
	host := strings.TrimPrefix(svc.url, "https://")
	var dials atomic.Int64
	dialer := &tls.Dialer{Config: &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}}}
	shared := &http.Client{Timeout: patience, Transport: &http.Transport{
		ForceAttemptHTTP2: true, TLSClientConfig: dialer.Config,
		DialTLSContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dialer.DialContext(ctx, network, addr)
		}}}
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets", client: shared}), 200, nil, "[]")

	// Each create sends half its body, then waits for release. At most 15
	// are under way at once, so that Go's client, which opens another
	// connection when one has no stream free, keeps to this one.
	slots := make(chan struct{}, maxStreams-1)
	release := make(chan struct{})
	var halfSent atomic.Int64
	statuses := make(chan int, 50)
	create := func(i int) {
		slots <- struct{}{}
		defer func() { <-slots }()
		body, w := io.Pipe()
		go func() {
			b := fmt.Sprintf(`{"name":"Shared %02d","categoryId":1}`, i)
			io.WriteString(w, b[:10])
			halfSent.Add(1)
			<-release
			io.WriteString(w, b[10:])
			w.Close()
		}()
		req, _ := http.NewRequest("POST", svc.url+"/v1/pets", body)
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := shared.Do(req)
		if err != nil {
			t.Errorf("create %d: %v", i, err)
			statuses <- 0
			return
		}
		resp.Body.Close()
		statuses <- resp.StatusCode
	}
	for i := range maxStreams - 1 {
		go create(i)
	}
	waitFor(t, patience, "15 creates in progress on the connection", func() bool { return halfSent.Load() == maxStreams-1 })
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets", client: shared, header: map[string]string{"Authorization": "Bearer not-the-key-at-all-0123"}}), 401, nil, errBody(401, codeUnauthorized, "invalid API key"))
	for i := maxStreams - 1; i < 50; i++ {
		go create(i)
	}
	// 6 more clients, each on a connection of its own, kept open: room is
	// made for the later ones by closing earlier ones once idle.
	others := make(chan int, 6)
	for range 6 {
		go func() {
			client := &http.Client{Timeout: patience, Transport: &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: pool}}}
			others <- send(t, svc.url, call{method: "GET", path: "/healthz", client: client}).status
		}()
	}
	for range 6 {
		if status := <-others; status != 200 {
			t.Errorf("another client: %d, want 200", status)
		}
	}
	waitForLog(t, svc.log, `level=WARN msg="connection limit reached`, 1)
	close(release)
	created := 0
	for range 50 {
		if <-statuses == 201 {
			created++
		}
	}
	list := send(t, svc.url, call{method: "GET", path: "/v1/pets?limit=100", client: shared})
	stored := strings.Count(string(list.body), `"name":"Shared `)
	t.Logf("HTTP/2, -max-conns 4: %d of 50 creates on %d connection(s) answered 201, %d stored", created, dials.Load(), stored)
	if created != 50 || stored != 50 || dials.Load() != 1 {
		t.Errorf("%d of 50 creates answered 201, %d stored, on %d connections; want 50, 50, 1", created, stored, dials.Load())
	}

	stopSilent := silentConnections(host, 20)
	defer stopSilent()
	slow := delayingProxy(t, host, 600*time.Millisecond)
	distant := &http.Client{Timeout: patience, Transport: &http.Transport{
		ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
	start := time.Now()
	r := send(t, "https://"+slow, call{method: "GET", path: "/v1/pets?limit=1", client: distant})
	t.Logf("a client 1.2 s away, among 20 silent connections: %d after %s", r.status, time.Since(start).Round(time.Millisecond))
	if r.status != 200 {
		t.Errorf("the distant client: %d (%v), want 200", r.status, r.err)
	}
}

// probeFresh sends a GET of path 10 times, each with the client made for
// its turn (a 1 s timeout, its own address), and returns how many were
// answered 200 within that time, and the slowest of those.
func probeFresh(t testing.TB, base, path string, client func(i int) *http.Client) (answered int, slowest time.Duration) {
	for i := range 10 {
		start := time.Now()
		if r := send(t, base, call{method: "GET", path: path, client: client(i)}); r.status == 200 {
			answered++
			slowest = max(slowest, time.Since(start))
		} else {
			t.Logf("probe: %v after %s", r.err, time.Since(start))
		}
	}
	return answered, slowest
}

// silentConnections keeps n connections to host open that send nothing,
// from n addresses (127.3.0.x), each redialled when the service closes
// it, until stop.
func silentConnections(host string, n int) (stop func()) {
	done := make(chan struct{})
	for i := range n {
		go func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 3, 0, byte(i+1))}}
			for {
				select {
				case <-done:
					return
				default:
				}
				if c, err := d.Dial("tcp", host); err == nil {
					c.SetReadDeadline(time.Now().Add(patience))
					c.Read(make([]byte, 1)) // until the service closes it
					c.Close()
				}
			}
		}()
	}
	return sync.OnceFunc(func() { close(done) })
}

// delayingProxy forwards connections to target, each byte arriving delay
// later in either direction, as over a link whose round trip is twice
// delay; it returns its address.
func delayingProxy(t *testing.T, target string, delay time.Duration) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	relay := func(dst, src net.Conn) {
		defer dst.Close()
		type chunk struct {
			b  []byte
			at time.Time
		}
		chunks := make(chan chunk, 1024)
		go func() {
			defer close(chunks)
			for {
				b := make([]byte, 32<<10)
				n, err := src.Read(b)
				if n > 0 {
					chunks <- chunk{b[:n], time.Now().Add(delay)}
				}
				if err != nil {
					return
				}
			}
		}()
		for c := range chunks {
			time.Sleep(time.Until(c.at))
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 4, 0, 1)}}
			s, err := d.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go relay(s, c)
			go relay(c, s)
		}
	}()
	return ln.Addr().String()
}

// BenchmarkFreshClientHTTP2 is a load run, as BenchmarkFreshClient: over
// TLS with -max-conns 4, among 20 silent connections from 20 addresses,
// redialled as they are closed, a fresh HTTP/2 client (Go's, a new
// connection each time) is answered within 1 s at least 9 times of 10.
// Then, at the default cap, 50 clients each send 100 creates over
// HTTP/2 whose bodies trickle a byte a second: the binary stays within
// 256 MiB resident.
func BenchmarkFreshClientHTTP2(b *testing.B) {
	t := b
	dir := t.TempDir()
	certFile, keyFile, pool := writeTestCertificate(t, dir)
	tlsArgs := []string{"-tls-cert", certFile, "-tls-key", keyFile}
	base, _ := startBinary(t, nil, append([]string{"-max-conns", "4", "-db", filepath.Join(dir, "a.db")}, tlsArgs...), nil)
	host := strings.TrimPrefix(base, "https://")
	stopSilent := silentConnections(host, 20)
	answered, slowest := probeFresh(t, base, "/v1/pets?limit=1", func(i int) *http.Client {
		fresh := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 5, 0, byte(i+1))}}
		return &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: fresh.DialContext,
			ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: pool}}}
	})
	stopSilent()
	if answered < 9 {
		t.Errorf("a fresh HTTP/2 client among 20 silent connections was answered within 1 s %d times of 10, want at least 9", answered)
	}

	base, cmd := startBinary(t, nil, append([]string{"-db", filepath.Join(dir, "b.db")}, tlsArgs...), nil)
	var started atomic.Int64
	done := make(chan struct{})
	defer close(done)
	for range 50 {
		client := &http.Client{Transport: &http.Transport{ForceAttemptHTTP2: true, TLSClientConfig: &tls.Config{RootCAs: pool}}}
		for range 100 {
			go func() {
				body, w := io.Pipe()
				go func() {
					defer w.Close()
					for {
						if _, err := io.WriteString(w, " "); err != nil {
							return
						}
						started.Add(1)
						select {
						case <-done:
							return
						case <-time.After(time.Second):
						}
					}
				}()
				req, _ := http.NewRequest("POST", base+"/v1/pets", body)
				req.Header.Set("Authorization", "Bearer "+testKey)
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
		}
	}
	waitFor(t, patience, "uploads trickling", func() bool { return started.Load() > 20000 })
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	must(t, err)
	peakKiB, _ := strconv.Atoi(string(regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(status)[1]))
	if peakKiB > 256<<10 {
		t.Errorf("peak resident memory %d KiB under 50 x 100 trickled HTTP/2 uploads, want at most 256 MiB", peakKiB)
	}
	t.Logf("over TLS, -max-conns 4, 20 silent connections: a fresh HTTP/2 client answered %d of 10 times within 1 s, the slowest in %s; 50 x 100 trickled HTTP/2 uploads: peak RSS %d KiB",
		answered, slowest.Round(time.Millisecond), peakKiB)
}

// BenchmarkFreshClientLowLimit is a load run, as BenchmarkFreshClient:
// the binary at a descriptor limit of 512, one address holding 700
// keep-alive connections that each sent a request; a client from
// another address is answered within 1 s at least 9 times of 10.
func BenchmarkFreshClientLowLimit(b *testing.B) {
	t := b
	sh := needTool(t, "sh", "apt-get install dash")
	base, _ := startBinary(t, []string{sh, "-c", `ulimit -n 512 && exec "$0" "$@"`},
		[]string{"-db", filepath.Join(t.TempDir(), "pets.db")}, nil)
	host := strings.TrimPrefix(base, "http://")
	var sent atomic.Int64
	for range 700 {
		c, err := net.Dial("tcp", host)
		must(t, err)
		defer c.Close()
		go func() {
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: petstore\r\n\r\n"); err == nil {
				sent.Add(1)
			}
			io.Copy(io.Discard, c) // keeps it open until the service closes it
		}()
	}
	waitFor(t, patience, "700 requests sent", func() bool { return sent.Load() == 700 })
	answered, slowest := probeFresh(t, base, "/healthz", func(i int) *http.Client {
		other := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 6, 0, byte(i+1))}}
		return &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: other.DialContext, DisableKeepAlives: true}}
	})
	if answered < 9 {
		t.Errorf("at 512 descriptors, beside 700 connections from one address, a client from another was answered within 1 s %d times of 10, want at least 9", answered)
	}
	t.Logf("at 512 descriptors, beside 700 keep-alive connections from one address: a client from another answered %d of 10 times within 1 s, the slowest in %s",
		answered, slowest.Round(time.Millisecond))
}
