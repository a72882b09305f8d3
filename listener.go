// What a connection meets before HTTP: a cap on the connections served,
// with the rest parked in turns by address, so the process never runs out
// of descriptors or memory and no few clients take every turn;
// the TLS certificate, reloaded on SIGHUP; and the server's own error log.

package main

import (
	"container/list"
	"context"
	"crypto/tls"
	"errors"
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

// defaultMaxConns is the default cap on connections being served:
// 2,048, which a small machine holds (one costs about 20 KB, 47 KB with
// TLS: some 40 and 95 MiB, twice that at the garbage collector's peak),
// or the descriptors to spare, if fewer.
func defaultMaxConns() int { return max(1, min(2048, spareDescriptors())) }

// spareDescriptors is the process's descriptor limit less room for the
// database's connection (three files), the listener and the rest.
func spareDescriptors() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	return int(min(lim.Cur, 1<<20)) - 32 - 3
}

// limitListener caps the connections being served at max, so the
// process never runs out of descriptors or memory, and lets no few
// addresses crowd out the rest. It takes every connection from the
// kernel as it comes, so that the listen queue does not fill (the kernel
// then drops a new client's SYN, which is sent again only a second
// later), and parks those beyond the cap, with no goroutine or buffer,
// until their turn. Turns go round the client addresses: a client from
// its own address is served next, however many wait from others.
//
// At most maxParked wait (the descriptors the served leave, up to
// 32,768). When that many do, a newcomer takes the place of its own
// address's oldest parked connection, or, from an address with none, of
// the oldest of all. With no descriptor to spare, new connections wait in
// the listen queue for a slot instead. At the cap a served connection is
// closed to give a parked one its turn (see victim); one whose request is
// being served never is. At most one WARN line a minute says the cap is
// full, with how many were closed or gave their place.
type limitListener struct {
	net.Listener
	max, maxParked int
	log            *slog.Logger
	turn           chan struct{} // wakes Accept
	closed         chan struct{}
	closeOnce      sync.Once

	mu        sync.Mutex
	open      int                       // connections being served
	parked    list.List                 // waiting for a turn, oldest first
	byAddress map[string]*parkedAddress // the same, by client address
	turns     list.List                 // addresses with parked connections, next first
	waiting   list.List                 // served, request not read yet, oldest first
	idle      list.List                 // idle between requests, longest first
	answered  list.List                 // answered with Connection: close, oldest first
	fullLines *logLimiter               // the WARN line, once a minute
}

// parkedAddress is one client address's parked connections.
type parkedAddress struct {
	address string
	conns   list.List     // oldest first
	turn    *list.Element // its place in turns
}

func newLimitListener(ln net.Listener, maxConns int, log *slog.Logger) *limitListener {
	l := &limitListener{Listener: ln, max: maxConns, maxParked: max(0, min(32768, spareDescriptors()-maxConns)), log: log,
		byAddress: map[string]*parkedAddress{}, fullLines: newLogLimiter(time.Minute, 1, 0),
		turn: make(chan struct{}, 1), closed: make(chan struct{})}
	go l.acceptLoop()
	return l
}

// acceptLoop takes connections from the kernel and parks them.
func (l *limitListener) acceptLoop() {
	failures := newLogLimiter(time.Minute, 1, 0)
	for {
		l.mu.Lock()
		full := l.parked.Len() > l.maxParked
		l.mu.Unlock()
		if full {
			time.Sleep(lingerFor) // for a slot, with no descriptor to park on
			continue
		}
		c, err := l.Listener.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, say: wait a moment, as http.Server would.
			if ok, held, _ := failures.allow("", time.Now()); ok {
				l.log.Warn("accepting a connection failed", "err", err.Error(), "since_last_line", held)
			}
			time.Sleep(lingerFor)
			continue
		}
		l.park(&limitedConn{Conn: c, l: l})
	}
}

// park puts c in its address's queue, after the oldest of that address,
// or of all, when the parking is full (see limitListener).
func (l *limitListener) park(c *limitedConn) {
	c.address, _, _ = net.SplitHostPort(c.RemoteAddr().String())
	l.mu.Lock()
	// The one shed goes first: were it its address's last, the address
	// leaves the round, and c must then bring it back.
	var shed *list.Element
	if l.parked.Len() >= l.maxParked {
		if a := l.byAddress[c.address]; a != nil {
			shed = a.conns.Front()
		}
		if shed == nil {
			shed = l.parked.Front()
		}
	}
	if shed != nil {
		l.evict(shed.Value.(*limitedConn))
		l.noteClosedForRoom()
	}
	a := l.byAddress[c.address]
	if a == nil {
		a = &parkedAddress{address: c.address}
		a.turn = l.turns.PushBack(a)
		l.byAddress[c.address] = a
	}
	c.moveTo(&l.parked)
	c.parkedAt = a.conns.PushBack(c)
	l.mu.Unlock()
	l.signal()
	if shed != nil {
		shed.Value.(*limitedConn).Conn.Close()
	}
}

// nextTurn takes the oldest parked connection of the address whose turn
// it is, and puts the address at the back of the round. l.mu is held.
func (l *limitListener) nextTurn() *limitedConn {
	a := l.turns.Front().Value.(*parkedAddress)
	c := a.conns.Front().Value.(*limitedConn)
	c.unpark()
	if a.conns.Len() > 0 {
		l.turns.MoveToBack(a.turn)
	}
	return c
}

// Accept hands the http.Server the parked connection whose turn it is,
// once a slot is free or made free.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		var c, victim *limitedConn
		var aging <-chan time.Time // while parked ones wait for a victim
		if l.parked.Len() > 0 && l.open < l.max {
			c = l.nextTurn()
			l.open++
			c.moveTo(&l.waiting)
		} else if l.parked.Len() > 0 {
			if victim = l.victim(); victim != nil {
				l.evict(victim)
				l.noteClosedForRoom()
			} else {
				aging = time.After(lingerFor)
			}
		}
		l.mu.Unlock()
		if c != nil {
			return c, nil
		}
		if victim != nil {
			victim.Conn.Close()
			continue
		}
		// A turn comes when a connection is parked, closes or goes idle,
		// or when one has waited or lingered long enough to be closed.
		select {
		case <-l.turn:
		case <-aging:
		case <-l.closed:
			return nil, net.ErrClosed
		}
	}
}

// victim is the served connection to close for a parked one's turn, nil
// when there is none to close: one answered with Connection: close after
// lingerFor, then one whose request has not come after silentAfter
// (silent, or slow to send it), the oldest first, then the one idle
// longest between requests. A client whose request follows its
// connection is never closed, nor one whose request is being served.
// l.mu is held.
func (l *limitListener) victim() *limitedConn {
	// One answered with Connection: close lingers while Go's server reads
	// the rest of its body, so that the close does not reset the answer
	// away; after lingerFor it is done.
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
// before it can be closed for a turn: a real client's request follows
// its connection within a round trip.
const silentAfter = time.Second

// lingerFor is how long a connection answered with Connection: close is
// left for its client to read the answer before it may be closed for a
// turn.
const lingerFor = 50 * time.Millisecond

// noteClosedForRoom says that a connection was closed for room, at most
// once a minute, counting those closed since the last line.
func (l *limitListener) noteClosedForRoom() {
	if ok, held, _ := l.fullLines.allow("full", time.Now()); ok {
		l.log.Warn("connection limit reached: connections not being served were closed to make room for new ones",
			"max_conns", l.max, "closed", held+1)
	}
}

// signal wakes an Accept waiting for a turn.
func (l *limitListener) signal() {
	select {
	case l.turn <- struct{}{}:
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
		// A chunked body is refused once read off (see refuseChunked),
		// which can take the read timeout: meanwhile its connection may be
		// closed for room, as one already answered.
		var to *list.List // being served
		if len(r.TransferEncoding) > 0 {
			to = &l.answered
		}
		l.moveOpen(lc, to)
		// Go's server reads off a body the handler left before it sends
		// the answer, until the read timeout for a slow one, unless the
		// connection is to close (see requireAPIKey); only a create reads
		// its body.
		if r.ContentLength != 0 && (r.Method != http.MethodPost || r.URL.Path != "/v1/pets") {
			w.Header().Set("Connection", "close")
		}
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

// Close closes the listener, the parked connections, whose clients would
// otherwise wait for the process to end, and those already answered with
// Connection: close, which a graceful stop would otherwise wait for while
// Go's server reads the rest of a slow body.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	err := l.Listener.Close()
	l.mu.Lock()
	var done []*limitedConn
	for _, conns := range []*list.List{&l.parked, &l.answered} {
		for e := conns.Front(); e != nil; e = e.Next() {
			done = append(done, e.Value.(*limitedConn))
		}
	}
	l.mu.Unlock()
	for _, c := range done {
		c.Close()
	}
	return err
}

// limitedConn gives its slot back when it is closed.
type limitedConn struct {
	net.Conn
	l     *limitListener
	since time.Time // when it was last put in a list
	// Guarded by l.mu: the list it is in (nil while served), its element
	// there, and whether it was closed.
	in       *list.List
	elem     *list.Element
	closed   bool
	address  string        // the client's, without the port
	parkedAt *list.Element // its place in its address's queue, while parked
}

// unpark takes a parked c out of its address's queue, and the address
// out of the round once its queue is empty. l.mu is held.
func (c *limitedConn) unpark() {
	a := c.l.byAddress[c.address]
	a.conns.Remove(c.parkedAt)
	c.parkedAt = nil
	if a.conns.Len() == 0 {
		c.l.turns.Remove(a.turn)
		delete(c.l.byAddress, c.address)
	}
	c.moveTo(nil)
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
		c.l.evict(c)
		c.l.signal()
	}
	c.l.mu.Unlock()
	return err
}

// evict takes c off the books, as closing it does: chosen to be closed
// for room, it is then neither handed out nor served, though its
// descriptor is closed only once l.mu is released. l.mu is held.
func (l *limitListener) evict(c *limitedConn) {
	c.closed = true
	if c.parkedAt != nil {
		c.unpark()
		return
	}
	c.moveTo(nil)
	l.open--
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
