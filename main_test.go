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
	"math/big"
	"net"
	"net/http"
	"net/url"
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

	"github.com/google/go-cmp/cmp"
)

// TestRunFailures: each mistake of configuration stops the start with one
// error naming it, before the database is opened or made; the binary
// prints it in one line and exits 1.
func TestRunFailures(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer busy.Close()
	dir := t.TempDir()
	for i, keys := range []string{"two words-0123456789abcdef\n", "sha256:abcd\n", "# nothing\n"} {
		must(t, os.WriteFile(filepath.Join(dir, fmt.Sprint("keys", i)), []byte(keys), 0o600))
	}
	noKeys := map[string]string{"PETSTORE_API_KEYS": ""}
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
		// A key that could not be used is named by where it is, never shown.
		{nil, map[string]string{"PETSTORE_API_KEYS": "short-key"}, "PETSTORE_API_KEYS: key 1: the key is shorter than 20 characters, so it could be guessed; make one with petstore keygen"},
		{nil, map[string]string{"PETSTORE_API_KEYS": testKey + ", key-with-\x7f-0123456789"}, "PETSTORE_API_KEYS: key 2: the key has a character a client cannot send in an Authorization header (allowed: printable ASCII without spaces)"},
		{nil, map[string]string{"PETSTORE_API_KEYS": " , "}, "PETSTORE_API_KEYS holds no key"},
		{[]string{"-api-keys-file", filepath.Join(dir, "keys0")}, noKeys, "API keys file " + filepath.Join(dir, "keys0") + ": line 1: the key holds more than one word; write one key per entry, comments after #"},
		{[]string{"-api-keys-file", filepath.Join(dir, "keys1")}, noKeys, "API keys file " + filepath.Join(dir, "keys1") + ": line 1: the key is not sha256: followed by the 64 hex digits of the key's SHA-256 digest"},
		{[]string{"-api-keys-file", filepath.Join(dir, "keys2")}, noKeys, "API keys file " + filepath.Join(dir, "keys2") + " holds no key"},
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
	for _, want := range []string{"ExecReload=/bin/kill -HUP $MAINPID", "LimitNOFILE=65536", "Restart=on-failure", "StartLimitBurst=5", "DynamicUser=yes", "ProtectSystem=strict", "NoNewPrivileges=yes"} {
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
		command(t, "", "sh", "-c", script)
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

// TestFewDescriptors: at a limit of 96 descriptors, set once the service
// has started, 200 clients each on a connection of its own send 20 lists
// each, and every answer is 200. A client waits for a descriptor; no read
// runs out of one.
func TestFewDescriptors(t *testing.T) {
	prlimit := needTool(t, "prlimit", "apt-get install util-linux")
	svc := startBinary(t, nil)
	createPets(t, svc, `{"name":"Rex","categoryId":1}`)
	command(t, "", prlimit, "--pid", strconv.Itoa(svc.cmd.Process.Pid), "--nofile=96:96")
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for range 200 {
		wg.Add(1)
		client := *svc
		client.client = &http.Client{Transport: &http.Transport{}} // a connection of its own
		go func() {
			defer wg.Done()
			defer client.client.CloseIdleConnections()
			for range 20 {
				got, _ := client.send(t, call{method: "GET", path: "/v1/pets?limit=1"})
				mu.Lock()
				statuses[got.status]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if diff := cmp.Diff(map[int]int{200: 4000}, statuses); diff != "" {
		t.Errorf("answers by status at 96 descriptors (-want +got):\n%s", diff)
	}
}

// TestBehindCaddy runs the repository's Caddyfile in front of the service
// under the path prefix /shop, with TLS from Caddy's own CA. Each link,
// resolved against the URL it came from, stays under the prefix: the next
// pages return every pet once, a create's Location returns that pet, and
// getPet's successor link returns a list. The same walk straight to the
// service returns every pet too. fail2ban's filter, on Caddy's access log,
// bans the address of the client that sent a wrong key, and no key is
// logged.
func TestBehindCaddy(t *testing.T) {
	caddy := needTool(t, "caddy", "apt-get install caddy")
	fail2ban := needTool(t, "fail2ban-regex", "apt-get install fail2ban")
	svc := startService(t, nil)
	createPets(t, svc, `{"name":"Rex","categoryId":1}`, `{"name":"Tom","categoryId":2}`, `{"name":"Luna","categoryId":3}`, `{"name":"Max","categoryId":4}`, `{"name":"Kit","categoryId":5}`)
	here, err := os.Getwd()
	must(t, err)
	free, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	free.Close()
	dir, proxy := t.TempDir(), &service{url: "https://" + free.Addr().String() + "/shop"}
	must(t, os.WriteFile(filepath.Join(dir, "Caddyfile"), []byte("{\n\tadmin off\n\tskip_install_trust\n}\nimport "+filepath.Join(here, "Caddyfile")+"\n"), 0o600))
	cmd := exec.Command(caddy, "run", "--adapter", "caddyfile", "--config", filepath.Join(dir, "Caddyfile"))
	cmd.Env = []string{"HOME=" + dir, "XDG_DATA_HOME=" + dir, "XDG_CONFIG_HOME=" + dir, "PETSTORE_SITE=https://" + free.Addr().String(), "PETSTORE_PREFIX=/shop",
		"PETSTORE_UPSTREAM=" + strings.TrimPrefix(svc.url, "http://"), "PETSTORE_ACCESS_LOG=" + filepath.Join(dir, "access.log")}
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var root []byte
	waitFor(t, "Caddy's CA", func() bool {
		root, _ = os.ReadFile(filepath.Join(dir, "caddy", "pki", "authorities", "local", "root.crt"))
		return root != nil
	})
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(root)
	proxy.client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	waitFor(t, "Caddy to serve", func() bool { got, _ := proxy.send(t, call{method: "GET", path: "/healthz"}); return got.status == 200 })
	// follow resolves a link in header against the URL of the request
	// that got it, and returns its path below base's URL.
	follow := func(base *service, from, header string) string {
		reference := "" // no link: the page itself
		if m := regexp.MustCompile(`^<([^>]+)>; rel="(next|successor-version)"$`).FindStringSubmatch(header); m != nil {
			reference = m[1]
		}
		u, err := url.Parse(base.url + from)
		must(t, err)
		ref, err := url.Parse(reference)
		must(t, err)
		return strings.TrimPrefix(u.ResolveReference(ref).String(), base.url)
	}
	for _, base := range []*service{proxy, svc} {
		var ids []int64
		for path, next := "", "/v1/pets?limit=2"; next != path; {
			path = next
			got, header := base.send(t, call{method: "GET", path: path})
			var pets []Pet
			must(t, json.Unmarshal([]byte(got.body), &pets))
			for _, p := range pets {
				ids = append(ids, p.ID)
			}
			next = follow(base, path, header.Get("Link"))
		}
		if diff := cmp.Diff([]int64{1, 2, 3, 4, 5}, ids); diff != "" {
			t.Errorf("the pets walked from %s (-want +got):\n%s", base.url, diff)
		}
	}
	created, header := proxy.send(t, call{method: "POST", path: "/v1/pets", body: `{"name":"Nala","categoryId":6}`})
	location := follow(proxy, "/v1/pets", "<"+header.Get("Location")+">; rel=\"next\"")
	header = proxy.check(t, call{method: "GET", path: location}, reply{200, nil, created.body})
	successor := follow(proxy, location, header.Get("Link"))
	if got, _ := proxy.send(t, call{method: "GET", path: successor}); location != "/v1/pets/6" || successor != "/v1/pets" || got.status != 200 {
		t.Errorf("Location %s, then getPet's successor link %s: %d %s", location, successor, got.status, got.body)
	}
	// A wrong key from 127.0.0.55: fail2ban bans that address, not the
	// proxy's.
	proxy.client.Transport.(*http.Transport).DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 55)}}).DialContext
	proxy.client.CloseIdleConnections()
	proxy.check(t, call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": "Bearer wrong-key-0000000000000"}}, reply{401, nil, errorBody(401, "unauthorized", "invalid API key")})
	var banned []byte
	waitFor(t, "Caddy's access line of the 401", func() bool {
		banned, _ = exec.Command(fail2ban, "-o", "ip", filepath.Join(dir, "access.log"), filepath.Join(here, "fail2ban-petstore.conf")).Output()
		return len(banned) > 0
	})
	if logged, _ := os.ReadFile(filepath.Join(dir, "access.log")); string(banned) != "127.0.0.55\n" || strings.Contains(string(logged), testKey) || strings.Contains(string(logged), "wrong-key") {
		t.Errorf("fail2ban would ban %q, want 127.0.0.55; and no key may be logged:\n%s", banned, logged)
	}
}
