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
	"net/http"
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
	return max(1, int(lim.Cur)-32-3*(readerConns()+1))
}

// limitListener caps client connections. While max are open, new ones
// wait in the listen queue, so the process never runs out of descriptors
// for the ones it has or for its database; and to make room, the
// kept-alive connection idle the longest between requests is closed
// first, so a new client is served.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	log       *slog.Logger
	wentIdle  chan struct{} // a connection went idle: Accept, waiting, may close it
	closed    chan struct{}
	closeOnce sync.Once

	mu     sync.Mutex
	states map[*limitedConn]time.Time // when each went idle; zero while busy
}

func newLimitListener(ln net.Listener, max int, log *slog.Logger) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, max), log: log,
		wentIdle: make(chan struct{}, 1), closed: make(chan struct{}), states: map[*limitedConn]time.Time{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		select {
		case l.slots <- struct{}{}:
		default:
			// Full: make room. If nothing is idle now, wait for a slot, or
			// for a connection to go idle, and close that one.
			l.closeLongestIdle()
			select {
			case l.slots <- struct{}{}:
			case <-l.wentIdle:
				continue
			case <-l.closed:
				return nil, net.ErrClosed
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		lc := &limitedConn{Conn: c, l: l}
		l.mu.Lock()
		// Not idle until its first request is answered: a client that has
		// just connected must not lose its connection to the next one.
		// (One that sends nothing is cut off by -read-header-timeout.)
		l.states[lc] = time.Time{}
		l.mu.Unlock()
		return lc, nil
	}
}

// connState is the http.Server's ConnState hook: it tells which
// connections are idle, and since when.
func (l *limitListener) connState(c net.Conn, state http.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, open := l.states[lc]; !open {
		return
	}
	switch state {
	case http.StateIdle:
		l.states[lc] = time.Now()
		select {
		case l.wentIdle <- struct{}{}:
		default:
		}
	case http.StateActive:
		l.states[lc] = time.Time{}
	}
}

// closeLongestIdle closes the connection that has been idle the longest,
// if any is.
func (l *limitListener) closeLongestIdle() {
	l.mu.Lock()
	var oldest *limitedConn
	var since time.Time
	for c, idle := range l.states {
		if !idle.IsZero() && (oldest == nil || idle.Before(since)) {
			oldest, since = c, idle
		}
	}
	l.mu.Unlock()
	if oldest != nil {
		oldest.Close()
	}
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitedConn gives its slot back when it is closed.
type limitedConn struct {
	net.Conn
	l         *limitListener
	closeOnce sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() {
		c.l.mu.Lock()
		delete(c.l.states, c)
		c.l.mu.Unlock()
		<-c.l.slots
	})
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

// serverErrors is the http.Server's error log. What it says is a
// client's doing (a port scanner's bare connect to a TLS port, an old
// client's TLS 1.0 hello, an HTTP/2 protocol error) and costs an attacker
// nothing to cause, so each kind of line is logged at most once a minute,
// with the count since its last line. A line's kind is the line with the
// client's address made CLIENT, up to what the client sent.
type serverErrors struct {
	log   *slog.Logger
	lines *logLimiter
}

func newServerErrors(logger *slog.Logger) *log.Logger {
	return log.New(&serverErrors{log: logger, lines: newLogLimiter(time.Minute, 100, 20)}, "", 0)
}

// clientAddress matches an address and port as the http package writes
// them, IPv4 or IPv6.
var clientAddress = regexp.MustCompile(`\[?[0-9A-Fa-f:.]+\]?:\d+`)

func (e *serverErrors) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	kind := clientAddress.ReplaceAllString(line, "CLIENT")
	if i := strings.IndexByte(kind, '"'); i > 0 {
		kind = kind[:i]
	}
	kind = kind[:min(len(kind), 100)]
	if ok, held, others := e.lines.allow(kind, time.Now()); ok {
		e.log.Warn("http server: "+kind, "line", line[:min(len(line), 300)], "since_last_line", held, "other_kinds_not_logged", others)
	}
	return len(p), nil
}
