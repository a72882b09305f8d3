// What a connection meets before HTTP: caps on open client connections, so
// the process never runs out of descriptors and no client takes them all;
// the TLS certificate, reloaded on SIGHUP; and the server's own error log.

package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
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
	reserve := 32 + 3*(readerConns()+1) + maxAnswering
	return max(1, int(lim.Cur)-reserve)
}

// limitListener caps client connections. While max are open, new ones
// wait in the listen queue, so the process never runs out of descriptors
// for the ones it has or for its database; and to make room, the
// kept-alive connection idle the longest between requests is closed
// first, so a client from another address is served. One client address (for IPv6, its /64) may hold at most perClient
// connections: past that, a new one is answered 503 and closed, so one
// client cannot take them all.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	perClient int
	plainHTTP bool // a refused connection gets an HTTP answer (not on TLS)
	log       *slog.Logger
	refusals  *logLimiter
	answering chan struct{} // bounds the refused connections being answered
	wentIdle  chan struct{} // a connection went idle: Accept, waiting, may close it
	closed    chan struct{}
	closeOnce sync.Once

	mu     sync.Mutex
	open   map[string]int             // connections open per client address
	states map[*limitedConn]time.Time // when each went idle; zero while busy
}

func newLimitListener(ln net.Listener, max, perClient int, plainHTTP bool, log *slog.Logger) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, max), perClient: perClient, plainHTTP: plainHTTP,
		log: log, refusals: newLogLimiter(time.Minute, 10_000, 60), answering: make(chan struct{}, maxAnswering),
		wentIdle: make(chan struct{}, 1), closed: make(chan struct{}), open: map[string]int{}, states: map[*limitedConn]time.Time{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
	slot:
		for {
			select {
			case l.slots <- struct{}{}:
				break slot
			default:
			}
			// Full: make room. If nothing is idle now, wait for a slot, or
			// for a connection to go idle, and close that one.
			l.closeLongestIdle()
			select {
			case l.slots <- struct{}{}:
				break slot
			case <-l.wentIdle:
			case <-l.closed:
				return nil, net.ErrClosed
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			<-l.slots
			return nil, err
		}
		client := clientOf(c.RemoteAddr().String())
		l.mu.Lock()
		if n := l.open[client]; n >= l.perClient {
			l.mu.Unlock()
			<-l.slots
			l.refuse(c, client, n)
			continue
		}
		l.open[client]++
		lc := &limitedConn{Conn: c, l: l, client: client}
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

// refuse answers a connection past its address's cap, on plain HTTP with
// a 503 that says why, and closes it; it is logged at most once a minute
// per address, with a count.
func (l *limitListener) refuse(c net.Conn, client string, open int) {
	if ok, held, _ := l.refusals.allow(client, time.Now()); ok {
		l.log.Warn("connection refused: this client address has as many connections open as -max-conns-per-client allows",
			"client", client, "open", open, "refused_since_last_line", held)
	}
	if !l.plainHTTP {
		c.Close()
		return
	}
	select {
	case l.answering <- struct{}{}:
	default:
		c.Close() // too many being answered: no answer
		return
	}
	go func() {
		defer func() { <-l.answering }()
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		c.Write(tooManyConnections)
		// Read what the client sent, so closing does not reset the
		// connection before the client has read the answer.
		if tc, ok := c.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		io.Copy(io.Discard, io.LimitReader(c, 64<<10))
	}()
}

// maxAnswering bounds the refused connections answered at once (each for
// up to a second); past it, one is closed unanswered. The descriptors they
// hold are part of the reserve below the process's limit.
const maxAnswering = 16

// tooManyConnections is the answer on a connection past the cap.
var tooManyConnections = func() []byte {
	body := `{"code":"unavailable","message":"too many connections from this client address: close some, or reuse them (keep-alive), and retry","status":503}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n" +
		"X-Content-Type-Options: nosniff\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitedConn gives its slot back when it is closed.
type limitedConn struct {
	net.Conn
	l         *limitListener
	client    string
	closeOnce sync.Once
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.closeOnce.Do(func() {
		c.l.mu.Lock()
		delete(c.l.states, c)
		if c.l.open[c.client]--; c.l.open[c.client] <= 0 {
			delete(c.l.open, c.client)
		}
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

// clientAddress matches an address and port as the http package writes
// them, IPv4 or IPv6.
var clientAddress = regexp.MustCompile(`\[?[0-9A-Fa-f:.]+\]?:\d+`)

// truncateLine bounds what a client can make the service write.
func truncateLine(line string) string {
	if len(line) > 300 {
		return line[:300] + "…"
	}
	return line
}

// handshakeError is the http package's line for a failed handshake:
// "http: TLS handshake error from ADDR: CAUSE".
var handshakeError = regexp.MustCompile(`^http: TLS handshake error from (\S+): (.*)$`)

func (e *serverErrors) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	m := handshakeError.FindStringSubmatch(line)
	if m == nil {
		// Anything else the server says (HTTP/2 protocol errors among
		// them) is a client's doing too: as limited, by its kind, which
		// is the line without addresses and what the client sent.
		kind := clientAddress.ReplaceAllString(line, "CLIENT")
		if i := strings.IndexByte(kind, '"'); i > 0 {
			kind = kind[:i]
		}
		if len(kind) > 100 {
			kind = kind[:100]
		}
		if ok, held, others := e.lines.allow(kind, time.Now()); ok {
			e.log.Warn("http server: "+kind, "line", truncateLine(line), "since_last_line", held, "other_kinds_not_logged", others)
		}
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
