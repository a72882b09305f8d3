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
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRunFailures: each mistake of configuration stops the start with one
// error naming it, before the database is opened or made; the binary
// prints it in one line and exits 1.
func TestRunFailures(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer busy.Close()
	dir := t.TempDir()
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-nope"}, nil, "flag provided but not defined: -nope (-h lists the flags)"},
		{[]string{"serve"}, nil, `unexpected argument "serve" (commands: backup, restore, keygen)`},
		{nil, map[string]string{"PETSTORE_WRITE_TIMEOUT": "soon"}, `invalid value "soon" for PETSTORE_WRITE_TIMEOUT (-write-timeout): parse error`},
		{[]string{"-read-timeout", "0s"}, nil, `-read-timeout (PETSTORE_READ_TIMEOUT) must be a positive duration such as 5s or 1m30s, got 0s`},
		{[]string{"-log-level", "loud"}, nil, `invalid value "loud" for flag -log-level: slog: level string "loud": unknown name (-h lists the flags)`},
		{[]string{"-log-format", "xml"}, nil, `-log-format (PETSTORE_LOG_FORMAT) must be text or json, got "xml"`},
		{[]string{"-tls-cert", "cert.pem"}, nil, "-tls-cert and -tls-key go together: give both or neither"},
		{[]string{"-tls-cert", "none.pem", "-tls-key", "none.pem"}, nil, "TLS certificate: open none.pem: no such file or directory"},
		{[]string{"-addr", busy.Addr().String()}, nil, "listen on " + busy.Addr().String() + ": listen tcp " + busy.Addr().String() + ": bind: address already in use"},
		{[]string{"-db", filepath.Join(dir, "no", "such", "dir.db")}, nil, "open database " + filepath.Join(dir, "no", "such", "dir.db") + ": open " + filepath.Join(dir, "no", "such", "dir.db") + ": no such file or directory"},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			args := append([]string{"petstore", "-addr", "127.0.0.1:0", "-db", filepath.Join(dir, "pets.db")}, tt.args...)
			vars := testEnv(tt.env)
			err := run(context.Background(), args, func(k string) string { return vars[k] }, nil, &logLines{})
			if err == nil || err.Error() != tt.want {
				t.Errorf("run = %v\nwant %s", err, tt.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "pets.db")); err == nil {
		t.Error("a failed start made the database")
	}
	// The binary says so in one line, and exits 1.
	path, err := binaryPath()
	must(t, err)
	out, err := exec.Command(path, "-log-format", "xml").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || string(out) != "petstore: -log-format (PETSTORE_LOG_FORMAT) must be text or json, got \"xml\"\n" {
		t.Errorf("exit %v, output %q", err, out)
	}
}

// writeCertificate writes a self-signed certificate for 127.0.0.1 and
// its key, and returns the pool that trusts it.
func writeCertificate(t testing.TB, certFile, keyFile string, serial int64) *x509.CertPool {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "petstore test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	must(t, err)
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	must(t, err)
	must(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	must(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600))
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return pool
}

// TestTLS: HTTPS with HTTP/2, and a renewed certificate served after
// SIGHUP without a restart; one that does not load leaves the old in force.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	pool := writeCertificate(t, certFile, keyFile, 1)
	svc := startBinary(t, nil, "-tls-cert", certFile, "-tls-key", keyFile)
	served := func(pool *x509.CertPool) (int64, string) {
		t.Helper()
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
		resp, err := client.Get(svc.url + "/healthz")
		must(t, err)
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64(), resp.Proto
	}
	if serial, proto := served(pool); serial != 1 || proto != "HTTP/2.0" {
		t.Errorf("served certificate %d over %s, want 1 over HTTP/2.0", serial, proto)
	}
	pool = writeCertificate(t, certFile, keyFile, 2)
	must(t, svc.cmd.Process.Signal(syscall.SIGHUP))
	waitFor(t, "the reload", func() bool { return strings.Contains(svc.log.String(), `msg="SIGHUP: TLS certificate reloaded"`) })
	if serial, _ := served(pool); serial != 2 {
		t.Errorf("after SIGHUP served certificate %d, want 2", serial)
	}
	must(t, os.WriteFile(certFile, []byte("not a certificate"), 0o600))
	must(t, svc.cmd.Process.Signal(syscall.SIGHUP))
	waitFor(t, "the failed reload", func() bool { return strings.Contains(svc.log.String(), "TLS certificate not reloaded") })
	if serial, _ := served(pool); serial != 2 {
		t.Errorf("after a failed reload served certificate %d, want 2", serial)
	}
}

// TestCrashSafety: creates run from many clients while the binary is
// killed with SIGKILL; after a restart every pet answered 201 is there,
// as it was answered, and ids go on after the highest.
func TestCrashSafety(t *testing.T) {
	for round := range 3 {
		svc := startBinary(t, nil)
		var mu sync.Mutex
		acked := map[string]string{} // id: the body of its 201
		var wg sync.WaitGroup
		for client := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Until the kill: from then on no answer, and no promise either.
				for i, answered := 0, true; answered; i++ {
					got, header := svc.send(t, call{method: "POST", path: "/v1/pets", body: fmt.Sprintf(`{"name":"pet %d-%d","categoryId":%d}`, client, i, client+1)})
					answered = got.status != 0
					if got.status == 201 {
						mu.Lock()
						acked[strings.TrimPrefix(header.Get("Location"), "pets/")] = got.body
						mu.Unlock()
					}
				}
			}()
		}
		waitFor(t, "a thousand acknowledged creates", func() bool { mu.Lock(); defer mu.Unlock(); return len(acked) >= 1000 })
		must(t, svc.cmd.Process.Kill())
		wg.Wait()
		svc.stop()
		svc = startBinary(t, nil, "-db", svc.db)
		found, top := 0, int64(0)
		for id, want := range acked {
			got, _ := svc.send(t, call{method: "GET", path: "/v1/pets/" + id})
			if jsonValue(got.body) != jsonValue(want) {
				t.Errorf("pet %s: acknowledged %s, found %d %s", id, want, got.status, got.body)
			} else {
				found++
			}
			n, _ := strconv.ParseInt(id, 10, 64)
			top = max(top, n)
		}
		got, header := svc.send(t, call{method: "POST", path: "/v1/pets", body: `{"name":"After","categoryId":1}`})
		if id, _ := strconv.ParseInt(strings.TrimPrefix(header.Get("Location"), "pets/"), 10, 64); got.status != 201 || id <= top {
			t.Errorf("the create after the restart: %d, id %d, want above %d", got.status, id, top)
		}
		t.Logf("round %d: %d creates acknowledged before SIGKILL, %d found after the restart", round+1, len(acked), found)
		svc.stop()
	}
}

// TestSystemdUnits: the units verify, and petstore.service's limits and
// hardening are there.
func TestSystemdUnits(t *testing.T) {
	analyze := needTool(t, "systemd-analyze", "apt-get install systemd")
	unit, err := os.ReadFile("petstore.service")
	must(t, err)
	for _, want := range []string{"ExecReload=/bin/kill -HUP $MAINPID", "LimitNOFILE=65536", "DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes"} {
		if !bytes.Contains(unit, []byte("\n"+want+"\n")) {
			t.Errorf("petstore.service lacks %s", want)
		}
	}
	// verify wants ExecStart's programs to exist: the test binary stands in.
	self, err := os.Executable()
	must(t, err)
	var paths []string
	for _, name := range []string{"petstore.service", "petstore-litestream.service", "petstore-backup.service", "petstore-backup.timer"} {
		b, err := os.ReadFile(name)
		must(t, err)
		b = regexp.MustCompile(`/usr/local/bin/(petstore|litestream)`).ReplaceAll(b, []byte(self))
		paths = append(paths, filepath.Join(t.TempDir(), name))
		must(t, os.WriteFile(paths[len(paths)-1], b, 0o644))
	}
	if out, err := exec.Command(analyze, append([]string{"verify"}, paths...)...).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The backup unit's commands, in its order, as systemd runs them: a
	// snapshot named by its UTC time, and those over 14 days old deleted.
	svc := startService(t, nil)
	createPets(t, svc, `{"name":"Rex","categoryId":1}`)
	backups := t.TempDir()
	path, err := binaryPath()
	must(t, err)
	stale := filepath.Join(backups, "snapshots", "petstore-20200101T000000Z.db")
	unit, err = os.ReadFile("petstore-backup.service")
	must(t, err)
	for _, line := range regexp.MustCompile(`(?m)^ExecStart(?:Pre|Post)?=(.*)$`).FindAllStringSubmatch(string(unit), -1) {
		script := strings.NewReplacer("/var/lib/petstore/petstore.db", svc.db, "/var/lib/petstore-backups", backups, "/usr/local/bin/petstore", path, "$$", "$", "%%", "%").Replace(line[1])
		if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v %s", script, err, out)
		}
		if _, err := os.Stat(stale); os.IsNotExist(err) && strings.Contains(line[0], "Pre") {
			must(t, os.WriteFile(stale, nil, 0o600))
			must(t, os.Chtimes(stale, time.Now().AddDate(0, 0, -15), time.Now().AddDate(0, 0, -15)))
		}
	}
	snapshots, _ := filepath.Glob(filepath.Join(backups, "snapshots", "*"))
	if len(snapshots) != 1 || !regexp.MustCompile(`/petstore-\d{8}T\d{6}Z\.db$`).MatchString(snapshots[0]) || snapshots[0] == stale {
		t.Errorf("snapshots after the unit ran: %v", snapshots)
	}
}

// TestWithoutCgo: a build without a C compiler says, in one message,
// what it needs, and exits 2.
func TestWithoutCgo(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "petstore")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build with CGO_ENABLED=0: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput() // all of it on stderr: stdout is a pipe's data
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || string(out) != needsCgo+"\n" {
		t.Errorf("exit %v, output %q; want exit status 2 and %q", err, out, needsCgo+"\n")
	}
}
