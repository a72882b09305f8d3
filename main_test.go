package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestRun drives the real program: start, create, list, stop, and the data
// is still there after a restart.
func TestRun(t *testing.T) {
	db := filepath.Join(t.TempDir(), "run.db")
	// Keys are trimmed, and empty entries skipped.
	env := map[string]string{"PETSTORE_API_KEYS": " first-key-0123456789ab ,, " + testKey + " ,", "PETSTORE_DB": db}
	svc := startService(t, env, "-db", db)
	base, stderr := svc.url, svc.log

	checkReply(t, send(t, base, call{method: "GET", path: "/healthz", header: noKey}), 200, nil, `{"status":"ok"}`)
	checkReply(t, send(t, base, call{method: "POST", path: "/v1/pets", body: `{"name":"Rex","categoryId":1}`, header: map[string]string{"Authorization": "Bearer " + "first-key-0123456789ab"}}), 201,
		map[string]string{"Location": "/v1/pets/1"}, `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`)
	checkReply(t, send(t, base, call{method: "GET", path: "/v1/pets"}), 200, nil, `[{"id":1,"name":"Rex","categoryId":1,"status":"available"}]`)
	svc.stop()
	for _, secret := range []string{"first-key-0123456789ab", testKey} {
		if strings.Contains(stderr.String(), "Bearer "+secret) || strings.Contains(stderr.String(), secret+" ") {
			t.Errorf("log shows a key:\n%s", stderr.String())
		}
	}

	base = startService(t, env, "-db", db).url
	checkReply(t, send(t, base, call{method: "GET", path: "/v1/pets/1", header: map[string]string{"Authorization": "Bearer " + "first-key-0123456789ab"}}), 200, nil, `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`)
}

// TestRunGeneratesKey: with no key configured the first start works at
// once with a printed key (PETSTORE_API_KEYS empty, or only separators).
func TestRunGeneratesKey(t *testing.T) {
	for _, keys := range []string{"", " , ,"} {
		svc := startService(t, map[string]string{"PETSTORE_API_KEYS": keys})
		base, stderr := svc.url, svc.log
		m := regexp.MustCompile(`changes on every start:\n\n    (\S+)\n`).FindStringSubmatch(stderr.String())
		if m == nil {
			t.Fatalf("no generated key on stderr:\n%s", stderr.String())
		}
		if len(m[1]) < 22 { // 128 bits of base64
			t.Errorf("generated key %d characters, want at least 22", len(m[1]))
		}
		checkReply(t, send(t, base, call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": "Bearer " + m[1]}}), 200, nil, `[]`)
		checkReply(t, send(t, base, call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": "Bearer " + "guess"}}), 401, nil, errBody(401, codeUnauthorized, "invalid API key"))
	}
}

// TestNoKeyWithoutATerminal: with no key configured and a log that no
// person reads at a terminal (a pipe, as journald's), the generated key
// is shown nowhere, every line written is JSON with -log-format json, one
// WARN line says why every request under /v1 is refused, and it is.
func TestNoKeyWithoutATerminal(t *testing.T) {
	logs := &syncBuffer{}
	base, cmd := startBinary(t, []string{"env", "PETSTORE_API_KEYS="}, []string{"-log-format", "json", "-db", filepath.Join(t.TempDir(), "pets.db")}, logs)
	checkReply(t, send(t, base, call{method: "GET", path: "/v1/pets"}), 401, nil, errBody(401, codeUnauthorized, "invalid API key"))
	checkReply(t, send(t, base, call{method: "GET", path: "/healthz", header: noKey}), 200, nil, `{"status":"ok"}`)
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	waitForLog(t, logs, `"msg":"stopped"`, 1)
	warned := 0
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var entry struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("a line that is not JSON: %q", line)
		}
		if entry.Level == "WARN" && strings.HasPrefix(entry.Msg, "no API key configured (PETSTORE_API_KEYS, -api-keys-file): every request under /v1 is refused") {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("%d WARN lines about the missing key, want 1:\n%s", warned, logs)
	}

	// A start that fails says so in JSON too, and exits 1.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer busy.Close()
	cmd = exec.Command(petstoreBinary(t), "-log-format", "json", "-addr", busy.Addr().String(), "-db", filepath.Join(t.TempDir(), "pets.db"))
	cmd.Env = binaryEnv()
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Errorf("a start on a busy port: %v, want exit status 1", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("a start on a busy port wrote %q, want JSON lines", line)
		}
	}
	if !strings.Contains(string(out), `"msg":"petstore stopped on an error","err":"listen on `) {
		t.Errorf("a start on a busy port wrote %q, want a JSON line naming the error", out)
	}
}

func TestRunFailures(t *testing.T) {
	dir := t.TempDir()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer busy.Close()
	corrupt := filepath.Join(dir, "corrupt.db")
	os.WriteFile(corrupt, bytes.Repeat([]byte("not a database "), 500), 0o600)
	certFile, keyFile, _ := writeTestCertificate(t, dir)
	missing := filepath.Join(dir, "missing.db")
	foreign := filepath.Join(dir, "foreign.db")
	sqlExec(t, foreign, "CREATE TABLE notes (text TEXT)")
	env := map[string]string{"PETSTORE_API_KEYS": testKey}

	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"busy port", []string{"-addr", busy.Addr().String(), "-db", filepath.Join(dir, "a.db")}, env, "listen on " + busy.Addr().String() + ": listen tcp " + busy.Addr().String() + ": bind: address already in use"},
		{"corrupt database", []string{"-addr", "127.0.0.1:0", "-db", corrupt}, env, "open database " + corrupt + ": file is not a database"},
		{"another application's file", []string{"-addr", "127.0.0.1:0", "-db", foreign}, env, "open database " + foreign + ": not a petstore database: it holds tables petstore did not make (notes); use another -db file"},
		{"database in a missing directory", []string{"-addr", "127.0.0.1:0", "-db", filepath.Join(dir, "no", "such.db")}, env, "open database: open " + filepath.Join(dir, "no", "such.db") + ": no such file or directory"},
		{"unknown flag", []string{"-nope"}, env, "unknown flag -nope (petstore -h lists them)"},
		{"an unknown backup flag", []string{"backup", "-bd", "x", "y"}, env, "backup: unknown flag -bd (petstore backup -h lists them)"},
		{"an unknown restore flag", []string{"restore", "-frm", "x"}, env, "restore: unknown flag -frm (petstore restore -h lists them)"},
		{"a port beyond 65535", []string{"-addr", ":99999"}, env, "-addr (PETSTORE_ADDR) has port 99999, beyond 65535"},
		{"a port for an address", []string{"-addr", "8080"}, env, `-addr (PETSTORE_ADDR) must be host:port, got "8080": use :8080 or 127.0.0.1:8080`},
		{"a host for an address", nil, map[string]string{"PETSTORE_ADDR": "localhost"}, `-addr (PETSTORE_ADDR) must be host:port, got "localhost": such as 127.0.0.1:8080, or :8080 for every interface`},
		{"bad key list", []string{"-addr", "127.0.0.1:0"}, map[string]string{"PETSTORE_API_KEYS": "a b"}, "PETSTORE_API_KEYS: API key number 1 has a character a client cannot send in an Authorization header (allowed: printable ASCII without spaces)"},
		{"one-character key", []string{"-addr", "127.0.0.1:0"}, map[string]string{"PETSTORE_API_KEYS": "a"}, "PETSTORE_API_KEYS: API key number 1 is shorter than 20 characters, so it could be guessed; make one with petstore keygen"},
		{"a bad second key", []string{"-addr", "127.0.0.1:0"}, map[string]string{"PETSTORE_API_KEYS": "good-key-0123456789ab, bad key"}, "PETSTORE_API_KEYS: API key number 2 has a character a client cannot send in an Authorization header (allowed: printable ASCII without spaces)"},
		{"a key not in ASCII", []string{"-addr", "127.0.0.1:0"}, map[string]string{"PETSTORE_API_KEYS": "ключ"}, "PETSTORE_API_KEYS: API key number 1 has a character a client cannot send in an Authorization header (allowed: printable ASCII without spaces)"},
		{"a short second key", []string{"-addr", "127.0.0.1:0"}, map[string]string{"PETSTORE_API_KEYS": "key-one-0123456789ab,a"}, "PETSTORE_API_KEYS: API key number 2 is shorter than 20 characters, so it could be guessed; make one with petstore keygen"},
		{"stray argument", []string{"serve"}, env, `unexpected argument "serve" (commands: backup, restore, keygen)`},
		{"bad log format", []string{"-log-format", "xml"}, env, `-log-format (PETSTORE_LOG_FORMAT) must be text or json, got "xml"`},
		{"bad log level", []string{"-log-level", "loud"}, env, `-log-level (PETSTORE_LOG_LEVEL) must be debug, info, warn or error, got "loud"`},
		{"CORS origin without scheme", []string{"-cors-origins", "office.example.com"}, env, `-cors-origins (PETSTORE_CORS_ORIGINS): "office.example.com" is not an origin: write the scheme and host (and port), such as https://office.example.com, with no path`},
		{"CORS origin with a path", []string{"-cors-origins", "https://a.example, https://b.example/app"}, env, `-cors-origins (PETSTORE_CORS_ORIGINS): "https://b.example/app" is not an origin: write the scheme and host (and port), such as https://office.example.com, with no path`},
		// A flag and its variable accept the same values, refused with the
		// same message naming both.
		{"bad duration in the environment", nil, map[string]string{"PETSTORE_READ_TIMEOUT": "soon"}, `-read-timeout (PETSTORE_READ_TIMEOUT) must be a positive duration such as 5s or 1m30s, got "soon"`},
		{"bad duration as a flag", []string{"-read-timeout", "soon"}, env, `-read-timeout (PETSTORE_READ_TIMEOUT) must be a positive duration such as 5s or 1m30s, got "soon"`},
		{"zero duration as a flag", []string{"-read-timeout", "0s"}, env, `-read-timeout (PETSTORE_READ_TIMEOUT) must be a positive duration such as 5s or 1m30s, got "0s"`},
		{"zero duration in the environment", nil, map[string]string{"PETSTORE_READ_TIMEOUT": "0s"}, `-read-timeout (PETSTORE_READ_TIMEOUT) must be a positive duration such as 5s or 1m30s, got "0s"`},
		{"duration without a unit", []string{"-write-timeout", "5"}, env, `-write-timeout (PETSTORE_WRITE_TIMEOUT) must be a positive duration such as 5s or 1m30s, got "5"`},
		{"bad number in the environment", nil, map[string]string{"PETSTORE_MAX_HEADER_BYTES": "-1"}, `-max-header-bytes (PETSTORE_MAX_HEADER_BYTES) must be a positive integer, got "-1"`},
		{"bad number as a flag", []string{"-max-header-bytes", "-1"}, env, `-max-header-bytes (PETSTORE_MAX_HEADER_BYTES) must be a positive integer, got "-1"`},
		{"bad connection cap", []string{"-max-conns", "0"}, env, `-max-conns (PETSTORE_MAX_CONNS) must be a positive integer, got "0"`},
		{"bad connection cap in the environment", nil, map[string]string{"PETSTORE_MAX_CONNS": "0"}, `-max-conns (PETSTORE_MAX_CONNS) must be a positive integer, got "0"`},
		{"a certificate without its key", []string{"-addr", "127.0.0.1:0", "-db", filepath.Join(dir, "tls.db"), "-tls-cert", certFile}, env, "-tls-cert and -tls-key go together: give both or neither"},
		{"the key as the certificate", []string{"-addr", "127.0.0.1:0", "-db", filepath.Join(dir, "tls.db"), "-tls-cert", keyFile, "-tls-key", keyFile}, env,
			"TLS certificate " + keyFile + " and key " + keyFile + ": tls: failed to find certificate PEM data in certificate input, but did find a private key; PEM inputs may have been switched"},
		{"backup of a missing database", []string{"backup", "-db", missing, filepath.Join(dir, "b.db")}, env, "backup: database to back up: stat " + missing + ": no such file or directory"},
		{"backup to two files", []string{"backup", "-db", missing, "a.db", "b.db"}, env, "backup: name one backup file, or -dir (got 2 names): petstore backup [-db FILE] BACKUP-FILE | petstore backup [-db FILE] -dir DIR [-keep N]"},
		{"backup -dir with a file", []string{"backup", "-db", missing, "-dir", dir, "extra.db"}, env, "backup: with -dir, name no backup file: petstore backup [-db FILE] BACKUP-FILE | petstore backup [-db FILE] -dir DIR [-keep N]"},
		{"backup -keep 0", []string{"backup", "-db", missing, "-dir", dir, "-keep", "0"}, env, "backup: -keep must be at least 1, got 0"},
		{"keygen with an argument", []string{"keygen", "extra"}, env, `keygen takes no arguments, got "extra" (petstore keygen -h)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), append([]string{"petstore"}, tt.args...), func(k string) string { return tt.env[k] }, io.Discard, io.Discard)
			if err == nil || err.Error() != tt.want {
				t.Errorf("run error = %v, want %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("error is more than one line: %q", err)
			}
		})
	}
}

func TestSlowClientIsCutOff(t *testing.T) {
	base := startService(t, nil, "-read-header-timeout", "500ms").url
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	must(t, err)
	defer conn.Close()
	// Trickle a header one byte every 50 ms: its 204 bytes take at least
	// 10 s, 20 times the header timeout.
	trickled := make(chan struct{}) // closed once the whole header is sent
	start := time.Now()
	go func() {
		fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
		for _, b := range []byte(strings.Repeat("X-Slow: trickle\r\n", 12)) {
			if _, err := conn.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		close(trickled)
	}()
	// Others are served meanwhile.
	for range 5 {
		checkReply(t, send(t, base, call{method: "GET", path: "/healthz", header: noKey}), 200, nil, `{"status":"ok"}`)
	}
	// The connection is cut before the header is complete, however slow
	// the machine: the trickle's own pauses make it last 10 s at least.
	must(t, conn.SetReadDeadline(time.Now().Add(patience)))
	answer, err := io.ReadAll(conn)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("slow client still connected after %s", patience)
	}
	select {
	case <-trickled:
		t.Errorf("slow client cut off after %v, only after it sent its whole header", time.Since(start))
	default:
	}
	if bytes.Contains(answer, []byte(" 200 ")) {
		t.Errorf("the trickled request was answered: %q", answer)
	}
	t.Logf("trickling client cut off after %v (header timeout 500ms)", time.Since(start).Round(time.Millisecond))
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := writeTestCertificate(t, dir)
	base := startService(t, nil, "-tls-cert", certFile, "-tls-key", keyFile).url
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("listening on %s, want https", base)
	}
	// The client trusts only the test certificate, and an https URL is
	// answered over TLS or not at all.
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	checkReply(t, send(t, base, call{method: "POST", path: "/v1/pets", body: `{"name":"Rex","categoryId":1}`, client: client}), 201,
		map[string]string{"Location": "/v1/pets/1"}, `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`)
	// Bad TLS settings are TestRunFailures'.
}

// writeTestCertificate makes a self-signed certificate for 127.0.0.1 and
// returns its files and a pool that trusts it.
func writeTestCertificate(t testing.TB, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "petstore test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	must(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	must(t, err)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestCrashSafety kills the real binary with SIGKILL in the middle of a
// stream of creates. After a restart every pet acknowledged with 201 must
// be there, unchanged, the file must pass integrity_check, and retries of
// the interrupted requests with their Idempotency-Key must not duplicate.
func TestCrashSafety(t *testing.T) {
	db := filepath.Join(t.TempDir(), "pets.db")
	base, proc := startBinary(t, nil, []string{"-db", db}, nil)
	load := startCreates(t, base, 8, "Pet")
	// Kill once a good number of creates were acknowledged, mid-stream.
	waitFor(t, patience, "300 creates to be acknowledged", func() bool { return load.statuses()[201] >= 300 })
	must(t, proc.Process.Signal(syscall.SIGKILL))
	proc.Wait()
	load.stop()
	for status, n := range load.statuses() {
		if status != 201 && status != 0 {
			t.Errorf("%d creates were answered %d before the kill", n, status)
		}
	}

	base, proc = startBinary(t, nil, []string{"-db", db}, nil)
	found, _, _ := checkStored(t, walkCatalogue(t, base), load)
	// Retries after the crash, with their Idempotency-Key: acknowledged
	// ones replay, interrupted ones are created at most once.
	replays, interrupted := 0, 0
	for _, c := range load.answers() {
		if c.header == nil {
			continue
		}
		got := send(t, base, c.call)
		switch {
		case c.status == 201 && (got.status != 201 || got.header.Get("Idempotent-Replayed") != "true" || got.header.Get("Location") != fmt.Sprintf("/v1/pets/%d", c.pet.ID)):
			t.Errorf("retry of acknowledged %s: %v %d %v %s", c.name, got.err, got.status, got.header, got.body)
		case c.status == 201:
			replays++
		case got.status != 201:
			t.Errorf("retry of interrupted %s: %v %d %s", c.name, got.err, got.status, got.body)
		default:
			interrupted++
		}
	}
	// And no name is stored twice.
	all := walkCatalogue(t, base)
	checkStored(t, all, load)
	must(t, proc.Process.Signal(syscall.SIGTERM))
	if err := proc.Wait(); err != nil {
		t.Errorf("SIGTERM: exit %v, want 0", err)
	}
	checkIntegrity(t, db)
	t.Logf("SIGKILL mid-stream: %d creates acknowledged, all found unchanged after restart; %d retries replayed, %d interrupted requests retried; %d pets stored",
		found, replays, interrupted, len(all))
}

// TestLoadWithFaults drives a stream of creates from 8 clients (every
// other one with an Idempotency-Key) beside 24 clients sending faults and
// reads: creates abandoned mid-flight (then retried with their
// Idempotency-Key), invalid bodies, lists, and gets of ids that may not
// exist. No answer may be a 5xx or mention a locked database, and
// afterwards the catalogue holds exactly the pets that were acknowledged.
func TestLoadWithFaults(t *testing.T) {
	svc := startService(t, nil)
	load := startCreates(t, svc.url, 8, "streamed")
	impatient := &http.Client{Timeout: time.Millisecond}
	invalid := []string{`{"name":""}`, `{"name":"x","categoryId":0}`, `[]`, `{"name":"x","categoryId":1,"id":3}`, `{`}
	var (
		mu      sync.Mutex
		counts  = map[string]int{}
		retried = map[string]Pet{} // the abandoned creates, by name, as their retries were answered
		ops     atomic.Int64
	)
	check := func(r reply) reply {
		if r.err == nil && (r.status >= 500 || bytes.Contains(r.body, []byte("locked")) || !json.Valid(r.body)) {
			t.Errorf("answered %d %s", r.status, r.body)
		}
		return r
	}
	stop := inLoops(t, 24, func() {
		op := ops.Add(1)
		rng := mathrand.New(mathrand.NewPCG(uint64(op), 7))
		kind := []string{"abandoned create", "invalid create", "list", "get"}[rng.IntN(4)]
		switch kind {
		case "abandoned create":
			name := fmt.Sprintf("abandoned %d", op)
			c := call{method: "POST", path: "/v1/pets", header: map[string]string{"Idempotency-Key": name}, client: impatient,
				body: fmt.Sprintf(`{"name":%q,"categoryId":%d,"status":%q}`, name, rng.IntN(9)+1, petStatuses[rng.IntN(3)])}
			check(send(t, svc.url, c))
			c.client = nil
			for try := 0; ; try++ {
				got := check(send(t, svc.url, c))
				if got.status == 201 {
					mu.Lock()
					retried[name] = decodePet(t, got.body)
					mu.Unlock()
					break
				}
				if try == 10 {
					t.Errorf("create %s never acknowledged: %v %d %s", name, got.err, got.status, got.body)
					break
				}
			}
		case "invalid create":
			if got := check(send(t, svc.url, call{method: "POST", path: "/v1/pets", body: invalid[rng.IntN(len(invalid))]})); got.status != 400 {
				t.Errorf("invalid create: %v %d %s", got.err, got.status, got.body)
			}
		case "list":
			q := fmt.Sprintf("/v1/pets?limit=%d&after=%d", rng.IntN(100)+1, rng.Int64N(op+1))
			if rng.IntN(2) == 0 {
				q += "&status=" + petStatuses[rng.IntN(3)]
			}
			if got := check(send(t, svc.url, call{method: "GET", path: q})); got.status != 200 {
				t.Errorf("list %s: %v %d %s", q, got.err, got.status, got.body)
			}
		default:
			id := rng.Int64N(op+5) + 1
			if got := check(send(t, svc.url, call{method: "GET", path: fmt.Sprintf("/v1/pets/%d", id)})); got.status != 200 && got.status != 404 {
				t.Errorf("get %d: %v %d %s", id, got.err, got.status, got.body)
			}
		}
		mu.Lock()
		counts[kind]++
		mu.Unlock()
	})
	waitFor(t, patience, "3,000 requests beside 1,000 creates", func() bool { return ops.Load() >= 3000 && load.statuses()[201] >= 1000 })
	stop()
	load.stop()
	if answers := load.statuses(); len(answers) != 1 {
		t.Errorf("the stream of creates was answered %v, want only 201", answers)
	}
	var streamed []Pet
	abandoned := map[string]Pet{}
	for _, p := range walkCatalogue(t, svc.url) {
		if strings.HasPrefix(p.Name, "abandoned ") {
			abandoned[p.Name] = p
		} else {
			streamed = append(streamed, p)
		}
	}
	acked, _, _ := checkStored(t, streamed, load)
	if diff := cmp.Diff(retried, abandoned); diff != "" {
		t.Errorf("stored abandoned creates differ from their acknowledged retries (-acknowledged +stored):\n%s", diff)
	}
	t.Logf("%d streamed creates acknowledged, all stored; beside them %v, %d abandoned creates retried to a 201, all stored once", acked, counts, len(retried))
}

// versionLineRE matches what petstore -version prints: the module version, and
// the VCS revision (or unknown), with its time and a dirty tree if the
// build recorded them.
var versionLineRE = regexp.MustCompile(`^petstore \S+ \(revision (?:[0-9a-f]+|unknown)(?:, \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)?(?:, modified)?\)\n$`)

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	must(t, run(context.Background(), []string{"petstore", "-version"}, func(string) string { return "" }, &out, io.Discard))
	if !versionLineRE.MatchString(out.String()) {
		t.Errorf("-version printed %q", out.String())
	}
	// The pattern holds real version lines and refuses anything else.
	for line, want := range map[string]bool{
		"petstore (devel) (revision unknown)\n":                                                                 true,
		"petstore v1.2.3 (revision 3f2a9c0d1e, 2025-11-23T12:08:00Z)\n":                                         true,
		"petstore v0.0.0-20251123120800-3f2a9c0d1e2b (revision 3f2a9c0d1e2b, 2025-11-23T12:08:00Z, modified)\n": true,
		"petstore v1 (revision abc123 and then garbage\n":                                                       false,
		"garbage unknown)\n":           false,
		"unknown)\n":                   false,
		"petstore v1 (revision xyz)\n": false,
		"petstore v1 (revision abc, modified, 2025-11-23T12:08:00Z)\n": false,
		"petstore v1 (revision abc)":                                   false,
		"petstore v1 (revision abc)\nmore\n":                           false,
		"":                                                             false,
	} {
		if versionLineRE.MatchString(line) != want {
			t.Errorf("the version pattern matches %q: %v, want %v", line, !want, want)
		}
	}
}

// TestBuiltWithoutCgo builds petstore with cgo off, as Go does by itself
// where it finds no C compiler: the binary prints the one message that
// says what it needs, nothing before or after it, and exits with status 2.
func TestBuiltWithoutCgo(t *testing.T) {
	goBin := needTool(t, "go", "https://go.dev/doc/install")
	bin := filepath.Join(t.TempDir(), "petstore")
	build := exec.Command(goBin, "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build with CGO_ENABLED=0: %v\n%s", err, out)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "-db", filepath.Join(t.TempDir(), "pets.db"))
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Errorf("the binary built without cgo exited with %v, want exit status 2", err)
	}
	if diff := cmp.Diff(needsCgo+"\n", stderr.String()); diff != "" || stdout.Len() > 0 {
		t.Errorf("stdout %q; stderr (-want +got):\n%s", stdout.String(), diff)
	}
}

// TestSystemdUnit checks petstore.service with systemd's own verifier and
// holds it to the hardening the README promises.
func TestSystemdUnit(t *testing.T) {
	hardened := []string{"DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes"}
	// The companions run as petstore's dynamic user, hardened as it is.
	companion := append(slices.Clone(hardened), "User=petstore", "CapabilityBoundingSet=", "SystemCallFilter=@system-service")
	for name, wants := range map[string][]string{
		"petstore.service": append(slices.Clone(hardened), "StateDirectory=petstore", "Restart=on-failure", "ExecReload=/bin/kill -HUP $MAINPID",
			"ExecStart=/usr/local/bin/petstore -db ${STATE_DIRECTORY}/petstore.db -api-keys-file /etc/petstore/keys"),
		"petstore-litestream.service": companion,
		// The daily snapshot, with retention.
		"petstore-backup.service": append(slices.Clone(companion),
			"ExecStart=/usr/local/bin/petstore backup -db /var/lib/petstore/petstore.db -dir /var/lib/petstore-backups/snapshots -keep 14"),
	} {
		unit, err := os.ReadFile(name)
		must(t, err)
		for _, want := range wants {
			if !slices.Contains(strings.Split(string(unit), "\n"), want) {
				t.Errorf("%s lacks the line %q", name, want)
			}
		}
	}
	analyze := needTool(t, "systemd-analyze", "apt-get install systemd")
	// verify wants ExecStart's program to exist: point it at an executable.
	self, err := os.Executable()
	must(t, err)
	// All the units ship together: the service, Litestream beside it, and
	// the daily snapshot with its timer.
	dir := t.TempDir()
	var paths []string
	for _, name := range []string{"petstore.service", "petstore-litestream.service", "petstore-backup.service", "petstore-backup.timer"} {
		b, err := os.ReadFile(name)
		must(t, err)
		b = bytes.ReplaceAll(b, []byte("/usr/local/bin/petstore"), []byte(self))
		b = bytes.ReplaceAll(b, []byte("/usr/local/bin/litestream"), []byte(self))
		path := filepath.Join(dir, name)
		os.WriteFile(path, b, 0o644)
		paths = append(paths, path)
	}
	if out, err := exec.Command(analyze, append([]string{"verify"}, paths...)...).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// systemd's own score, offline, at most 2.0 ("OK") for each unit.
	for _, path := range paths[:3] {
		out, err := exec.Command(analyze, "security", "--offline=true", path).CombinedOutput()
		m := regexp.MustCompile(`Overall exposure level for \S+: (\d+\.\d)`).FindSubmatch(out)
		if err != nil || m == nil {
			t.Errorf("systemd-analyze security %s: %v\n%s", path, err, out)
		} else if score, _ := strconv.ParseFloat(string(m[1]), 64); score > 2.0 {
			t.Errorf("systemd-analyze security scores %s %s, want at most 2.0:\n%s", path, m[1], out)
		}
	}
}

// TestCommandLines: every command answers -h on stdout and exits 0, usage
// names the program petstore, and backup says where its flags go.
func TestCommandLines(t *testing.T) {
	env := func(string) string { return "" }
	for _, args := range [][]string{{"-h"}, {"backup", "-h"}, {"restore", "-h"}, {"keygen", "-h"}} {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"/root/.cache/go-build/x/exe/petstore"}, args...), env, &out, io.Discard)
		if err != nil || !strings.HasPrefix(out.String(), "Usage: petstore") {
			t.Errorf("%v: %v, printed %q", args, err, out.String())
		}
	}
	// -h names the kind of each value, and its default.
	var help bytes.Buffer
	run(context.Background(), []string{"petstore", "-h"}, env, &help, io.Discard)
	for _, want := range []string{"\n  -addr host:port\n", "\n  -idle-timeout duration\n", `(default "2m0s")`, "\n  -max-header-bytes int\n",
		"\n  -cors-origins origins\n", "\n  -db file\n"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-h lacks %q:\n%s", want, help.String())
		}
	}
	// After --, a file name may begin with a dash.
	db := filepath.Join(t.TempDir(), "pets.db")
	preloadPets(t, db, 3)
	t.Chdir(t.TempDir())
	must(t, run(context.Background(), []string{"petstore", "backup", "-db", db, "--", "-dash.db"}, env, io.Discard, io.Discard))
	if _, err := os.Stat("-dash.db"); err != nil {
		t.Errorf("backup -- -dash.db: %v", err)
	}
	// Flags after the file name are refused with the order to use.
	err := run(context.Background(), []string{"petstore", "backup", "b.db", "-db", "pets.db"}, env, io.Discard, io.Discard)
	if want := "backup: flags go before the backup file: petstore backup [-db FILE] BACKUP-FILE | petstore backup [-db FILE] -dir DIR [-keep N]"; err == nil || err.Error() != want {
		t.Errorf("backup FILE -db X: %v, want %q", err, want)
	}
	// Their refusals are TestRunFailures'.
}

// TestUnknownVariables: at start, each PETSTORE_ variable petstore does
// not read gets a warning naming it: a misspelt variable is not ignored
// in silence.
func TestUnknownVariables(t *testing.T) {
	logs := &syncBuffer{}
	cmd := exec.Command(petstoreBinary(t), "-addr", "127.0.0.1:0", "-db", filepath.Join(t.TempDir(), "pets.db"))
	cmd.Env = binaryEnv("PETSTORE_API_KEYS="+testKey, "PETSTORE_PORT=8080", "PETSTORE_API_KEY=x", "PETSTORE_DB_FILE=pets.db", "PETSTORE_COLOUR=red",
		"PETSTORE_TLS_CERTIFICATE=cert.pem", "PETSTORE_MAX_CONN=5", "PETSTORE_READ_TIMEOUT=9s")
	cmd.Stderr = logs
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitForLog(t, logs, `msg=listening`, 1)
	for _, name := range []string{"PETSTORE_API_KEY", "PETSTORE_COLOUR", "PETSTORE_DB_FILE", "PETSTORE_MAX_CONN", "PETSTORE_PORT", "PETSTORE_TLS_CERTIFICATE"} {
		want := `level=WARN msg="environment variable not read by petstore: it has no effect" name=` + name + "\n"
		if n := countLines(logs, regexp.QuoteMeta(want)); n != 1 {
			t.Errorf("%d lines %s, want 1:\n%s", n, want, logs)
		}
	}
	if n := countLines(logs, "not read by petstore"); n != 6 {
		t.Errorf("%d warnings, want 6 (PETSTORE_API_KEYS and PETSTORE_READ_TIMEOUT are read):\n%s", n, logs)
	}
}
