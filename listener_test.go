package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
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
				req, _ := http.NewRequest("GET", base+"/v1/pets?limit=5", nil)
				req.Header.Set("Authorization", "Bearer "+testKey)
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
					continue
				}
				answered.Add(1)
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
	get := func(c *http.Client) error { return get200(c, base+"/v1/pets", testKey) }
	trusting := func(pool *x509.CertPool) *http.Client {
		return &http.Client{Timeout: patience, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
	}
	if err := get(trusting(poolA)); err != nil {
		t.Fatalf("before the reload: %v", err)
	}
	// Clients that trust either certificate go on through the swap, some
	// on kept-alive connections, some with a handshake per request.
	var failed atomic.Int64
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
			failed.Add(1)
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
	stop()
	if failed.Load() != 0 {
		t.Errorf("%d of %d requests failed through the reloads", failed.Load(), calls.Load())
	}

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
	marked, _ := http.NewRequest("GET", base+"/healthz", nil)
	marked.Header.Set("X-Request-Id", "after-the-handshakes")
	resp, err := trusting(poolB).Do(marked)
	must(t, err)
	resp.Body.Close()
	waitForLog(t, logs, `msg=request [^\n]*request_id=after-the-handshakes`, 1)
	if n := countLines(logs, `level=WARN msg="TLS handshake failed"`); n < 1 || n > 4 {
		t.Errorf("%d lines for 200 failed handshakes, want 1 to 4:\n%s", n, logs)
	}
	t.Logf("%d requests through two reloads, none failed; 200 failed handshakes gave %d lines", calls.Load(), countLines(logs, `level=WARN msg="TLS handshake failed"`))
}

// TestOneClientCannotTakeEveryConnection runs the binary at RLIMIT_NOFILE
// 512. One address opens 1,000 connections, sends a request on each and
// keeps them: it gets -max-conns-per-client (256) and a 503 that says why
// on the rest. Then more addresses hold idle connections up to the
// process's cap, busy when the cap is reached and idle after. A client
// from yet another address is served all along: the connections idle
// longest make room for it. Resident memory stays
// under 64 MiB.
func TestOneClientCannotTakeEveryConnection(t *testing.T) {
	sh := needTool(t, "sh", "apt-get install dash")
	logs := &syncBuffer{}
	base, cmd := startBinary(t, []string{sh, "-c", `ulimit -n 512 && exec "$0" "$@"`},
		[]string{"-db", filepath.Join(t.TempDir(), "pets.db")}, logs)
	addr := strings.TrimPrefix(base, "http://")
	// hold opens n connections from ip, sends GET / on each, reads the
	// answer's status line, and keeps every connection it gets served on.
	var held []net.Conn
	t.Cleanup(func() {
		for _, c := range held {
			c.Close()
		}
	})
	hold := func(ip string, n int) (served, refused int) {
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: patience}
		for range n {
			c, err := dialer.Dial("tcp", addr)
			if err != nil {
				t.Fatalf("connection from %s: %v", ip, err)
			}
			c.SetDeadline(time.Now().Add(patience))
			fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: petstore\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			switch {
			case err != nil:
				c.Close()
				refused++ // closed to make room before it was answered
			case resp.StatusCode == 200:
				io.Copy(io.Discard, resp.Body)
				held = append(held, c)
				served++
			default:
				b, _ := io.ReadAll(resp.Body)
				c.Close()
				if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(b), `"too many connections from this client address`) {
					t.Errorf("a connection past the cap: %d %q", resp.StatusCode, b)
				}
				refused++
			}
		}
		return served, refused
	}
	office := &http.Client{Timeout: patience, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext, DisableKeepAlives: true}}
	officeCall := func() time.Duration {
		start := time.Now()
		req, _ := http.NewRequest("GET", base+"/v1/pets", nil)
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := office.Do(req)
		if err != nil {
			t.Fatalf("a client from another address: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("a client from another address: %d", resp.StatusCode)
		}
		return time.Since(start)
	}

	// Two addresses open 250 connections each, all at once, and only then
	// send a request on each and keep them: past the process's cap (about
	// 440 here) while all are busy, so room is made as each goes idle.
	var wg sync.WaitGroup
	for _, ip := range []string{"127.0.0.3", "127.0.0.4"} {
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: patience}
		var conns []net.Conn
		for range 250 {
			c, err := dialer.Dial("tcp", addr)
			must(t, err)
			conns = append(conns, c)
		}
		held = append(held, conns...)
		for _, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.SetDeadline(time.Now().Add(2 * time.Second))
				fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: petstore\r\n\r\n")
				if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
					io.Copy(io.Discard, resp.Body)
				}
			}()
		}
	}
	wg.Wait()
	duringBusy := officeCall()
	served, refused := hold("127.0.0.1", 1000)
	if served != 256 || refused != 744 {
		t.Errorf("one address asked for 1,000 connections: %d served, %d refused; want 256 and 744", served, refused)
	}
	first := officeCall()
	waitForLog(t, logs, `level=WARN msg="connection refused: this client address has as many connections open as -max-conns-per-client allows" client=127.0.0.1 open=256`, 1)
	if n := countLines(logs, `msg="connection refused`); n != 1 {
		t.Errorf("%d lines for 744 refused connections in a minute, want 1", n)
	}

	var slowest time.Duration
	for range 20 {
		slowest = max(slowest, officeCall())
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	must(t, err)
	var rssKiB int
	if m := regexp.MustCompile(`VmRSS:\s+(\d+) kB`).FindSubmatch(status); m != nil {
		rssKiB, _ = strconv.Atoi(string(m[1]))
	}
	if rssKiB == 0 || rssKiB > 64<<10 {
		t.Errorf("resident memory %d KiB, want under 64 MiB", rssKiB)
	}
	t.Logf("500 connections from two addresses, busy at the cap: a client from another address answered in %s; one address asking for 1,000: %d served, %d refused, and a client from another address answered in %s, then at most %s over 20 calls; RSS %d KiB",
		duringBusy.Round(time.Millisecond), served, refused, first.Round(time.Millisecond), slowest.Round(time.Millisecond), rssKiB)
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
