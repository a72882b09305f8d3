// What a connection meets before HTTP: caps on open client connections, so
// the process never runs out of descriptors and no client takes them all;
// the TLS certificate, reloaded on SIGHUP; and the server's own error log.

package main

import (
	"crypto/tls"
	"fmt"
	"log"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// defaultMaxConns is the default cap on client connections: the process's
// descriptor limit less room for the database's connections (two files
// each), the listener and the rest.
func defaultMaxConns() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<20 {
		return 1 << 16
	}
	reserve := 32 + 3*(readerConns()+1)
	return max(1, int(lim.Cur)-reserve)
}

// limitListener makes new connections wait in the listen queue while max
// are open, so the process never runs out of descriptors for the ones it
// has accepted or for its database.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, max int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, max), closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, release: sync.OnceFunc(func() { <-l.slots })}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitedConn gives its slot back when it is closed.
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// certificate holds the TLS certificate the service presents, swapped
// whole on SIGHUP, so a renewed certificate is served without a restart
// and without dropping a connection.
type certificate struct {
	certFile, keyFile string
	current           atomic.Pointer[tls.Certificate]
}

// loadCertificate reads the pair; a start with a broken pair fails.
func loadCertificate(certFile, keyFile string) (*certificate, error) {
	c := &certificate{certFile: certFile, keyFile: keyFile}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads the pair again; a broken pair leaves the one in force.
func (c *certificate) reload() error {
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate %s and key %s: %w", c.certFile, c.keyFile, err)
	}
	c.current.Store(&pair)
	return nil
}

// tlsConfig serves the current certificate to every new handshake.
func (c *certificate) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.current.Load(), nil
		},
	}
}

// serverErrors is the http.Server's error log. A failed TLS handshake (a
// port scanner's bare connect, an old client's TLS 1.0 hello) costs an
// attacker nothing to cause, so it is logged at most once a minute per
// kind, with the count; everything else goes to the log as a warning.
type serverErrors struct {
	log   *slog.Logger
	lines *logLimiter
}

func newServerErrors(logger *slog.Logger) *log.Logger {
	return log.New(&serverErrors{log: logger, lines: newLogLimiter(time.Minute, 100, 20)}, "", 0)
}

// handshakeError is the http package's line for a failed handshake:
// "http: TLS handshake error from ADDR: CAUSE".
var handshakeError = regexp.MustCompile(`^http: TLS handshake error from (\S+): (.*)$`)

func (e *serverErrors) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	m := handshakeError.FindStringSubmatch(line)
	if m == nil {
		e.log.Warn(line)
		return len(p), nil
	}
	// The cause names the client's address in some errors: the kind is
	// the cause without it.
	client, kind := m[1], strings.ReplaceAll(m[2], m[1], "CLIENT")
	if ok, held, others := e.lines.allow(kind, time.Now()); ok {
		e.log.Warn("TLS handshake failed", "cause", kind, "client", client,
			"failures_since_last_line", held, "other_causes_not_logged", others)
	}
	return len(p), nil
}
