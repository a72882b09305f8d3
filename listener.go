// What a connection meets before HTTP: caps on open client connections, so
// the process never runs out of descriptors and no client takes them all;
// the TLS certificate, reloaded on SIGHUP; and the server's own error log.

package main

import (
	"container/list"
	"context"
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

// defaultMaxConns is the default cap on client connections: 4,096, which
// a small machine holds (an open connection costs about 20 KB, 47 KB with
// TLS: some 80 and 190 MiB), or the process's descriptor limit less room
// for the database's connection (three files), the listener
// and the rest, if that is lower.
func defaultMaxConns() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	return max(1, min(4096, int(min(lim.Cur, 1<<20))-32-3))
}

// limitListener caps client connections at max, so the process never
// runs out of descriptors or memory. At the cap, a new connection is
// taken and another closed to make room: first one whose request has not
// reached the handlers (silent, or slow to send it) after silentAfter,
// the oldest first, so that a flood of slow connections does not close a
// new client's before its request is read; then the one idle longest
// between requests. A connection whose request is being served is never
// closed for room; while every one is, new connections wait in the
// listen queue. At most one WARN line a minute says the cap is full, with
// how many were closed.
type limitListener struct {
	net.Listener
	max       int
	log       *slog.Logger
	freed     chan struct{} // a slot was freed, or a connection went idle
	closed    chan struct{}
	closeOnce sync.Once

	mu        sync.Mutex
	open      int
	waiting   list.List   // connections not served nor idle, oldest first
	idle      list.List   // connections idle between requests, longest first
	answered  list.List   // answered with Connection: close, oldest first
	fullLines *logLimiter // the WARN line, once a minute
}

func newLimitListener(ln net.Listener, max int, log *slog.Logger) *limitListener {
	return &limitListener{Listener: ln, max: max, log: log,
		fullLines: newLogLimiter(time.Minute, 1, 0), freed: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	lc := &limitedConn{Conn: c, l: l}
	for {
		l.mu.Lock()
		if l.open < l.max {
			l.open++
			lc.moveTo(&l.waiting)
			l.mu.Unlock()
			return lc, nil
		}
		victim := l.victim()
		if victim != nil {
			l.noteClosedForRoom()
		}
		l.mu.Unlock()
		if victim != nil {
			victim.Close()
			continue
		}
		// Room comes when a connection closes or goes idle, or when one
		// has waited or lingered long enough to be closed.
		timer := time.NewTimer(lingerFor)
		select {
		case <-l.freed:
		case <-timer.C:
		case <-l.closed:
			c.Close()
			return nil, net.ErrClosed
		}
		timer.Stop()
	}
}

// victim is the connection to close for room, nil when every one is
// being served or has just come. l.mu is held.
func (l *limitListener) victim() *limitedConn {
	// A connection answered with Connection: close lingers while Go's
	// server waits for the client to read its answer (half a second, so
	// that the close does not reset it away); after lingerFor it is done.
	if e := l.answered.Front(); e != nil && time.Since(e.Value.(*limitedConn).since) > lingerFor {
		return e.Value.(*limitedConn)
	}
	if e := l.waiting.Front(); e != nil && time.Since(e.Value.(*limitedConn).since) > silentAfter {
		return e.Value.(*limitedConn)
	}
	if e := l.idle.Front(); e != nil {
		return e.Value.(*limitedConn)
	}
	return nil
}

// silentAfter is how long a new connection may take to send its request
// before it can be closed for room: a real client's request follows its
// connection within a round trip.
const silentAfter = time.Second

// lingerFor is how long a connection answered with Connection: close is
// left for its client to read the answer before it may be closed for room.
const lingerFor = 50 * time.Millisecond

// noteClosedForRoom says that a connection was closed for room, at most
// once a minute, counting those closed since the last line.
func (l *limitListener) noteClosedForRoom() {
	if ok, held, _ := l.fullLines.allow("full", time.Now()); ok {
		l.log.Warn("connection limit reached: connections not being served were closed to make room for new ones",
			"max_conns", l.max, "closed", held+1)
	}
}

// signal wakes an Accept waiting for room.
func (l *limitListener) signal() {
	select {
	case l.freed <- struct{}{}:
	default:
	}
}

// connState is the http.Server's ConnState hook: a connection that has
// answered its request is idle until the next one begins.
func (l *limitListener) connState(c net.Conn, state http.ConnState) {
	lc, ok := limitedOf(c)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case lc.closed:
	case state == http.StateIdle:
		lc.moveTo(&l.idle)
		l.signal()
	case state == http.StateActive && lc.in == &l.idle:
		lc.moveTo(&l.waiting) // a new request begins: not served yet
	}
}

// connKey holds a request's connection in its context (see serving).
type connKey struct{}

// connContext is the http.Server's ConnContext hook.
func connContext(ctx context.Context, c net.Conn) context.Context {
	lc, _ := limitedOf(c)
	return context.WithValue(ctx, connKey{}, lc)
}

// limitedOf is the limitedConn under c, a TLS connection's included.
func limitedOf(c net.Conn) (*limitedConn, bool) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	return lc, ok
}

// serving marks a request's connection as being served once its request
// has reached the handlers, so it is not closed to make room.
func (l *limitListener) serving(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lc, _ := r.Context().Value(connKey{}).(*limitedConn)
		l.moveOpen(lc, nil)
		next.ServeHTTP(w, r)
		if lc != nil && w.Header().Get("Connection") == "close" {
			http.NewResponseController(w).Flush()
			l.moveOpen(lc, &l.answered)
		}
	})
}

// moveOpen moves c, if it is a limitedConn still open, to the list to.
func (l *limitListener) moveOpen(c *limitedConn, to *list.List) {
	if c == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !c.closed {
		c.moveTo(to)
	}
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitedConn gives its slot back when it is closed.
type limitedConn struct {
	net.Conn
	l     *limitListener
	since time.Time // when it was last put in a list
	// Guarded by l.mu: the list it is in (nil while served), its element
	// there, and whether it was closed.
	in     *list.List
	elem   *list.Element
	closed bool
}

// moveTo takes c out of its list and puts it at the back of to (none
// when nil). l.mu is held.
func (c *limitedConn) moveTo(to *list.List) {
	if c.in != nil {
		c.in.Remove(c.elem)
	}
	c.in, c.elem = to, nil
	if to != nil {
		c.elem, c.since = to.PushBack(c), time.Now()
	}
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.l.mu.Lock()
	if !c.closed {
		c.closed = true
		c.moveTo(nil)
		c.l.open--
		c.l.signal()
	}
	c.l.mu.Unlock()
	return err
}

// certificate holds the TLS certificate the service presents, swapped
// whole on SIGHUP, so a renewed certificate is served without a restart
// and without dropping a connection.
type certificate struct {
	certFile, keyFile string
	current           atomic.Pointer[tls.Certificate]
}

// reload reads the pair (again); a broken pair leaves the one in force,
// and fails a start.
func (c *certificate) reload() error {
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("TLS certificate %s and key %s: %w", c.certFile, c.keyFile, err)
	}
	c.current.Store(&pair)
	return nil
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
