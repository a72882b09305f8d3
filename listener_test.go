package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
// a new client is answered once they have been silent for a second, the
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
	client := &http.Client{Transport: &http.Transport{}, Timeout: patience}
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets", client: client}), 200, nil, "[]")
	silent[0].SetReadDeadline(time.Now().Add(patience))
	if _, err := silent[0].Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("the oldest silent connection: %v, want it closed (EOF)", err)
	}
	checkLines(t, svc.log, `level=WARN msg="connection limit reached: [^"]*" max_conns=4 closed=1`, 1)
}
