// What a connection meets before HTTP: a cap on the connections served,
// with the rest parked in turns by address, so the process never runs out
// of descriptors or memory and no few clients take every turn;
// the TLS certificate, reloaded on SIGHUP; and the server's own error log.

package main

import (
	"container/list"
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
// or half the descriptors to spare, if fewer: the other half park new
// connections, so that an idle one can be closed for a newcomer.
func defaultMaxConns() int { return max(1, min(2048, spareDescriptors()/2)) }

// spareDescriptors is the process's descriptor limit less room for the
// database's connection (three files), the listener and the rest.
func spareDescriptors() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 1024
	}
	return int(min(lim.Cur, 1<<20)) - 32 - 3
}

// maxStreams bounds the requests in progress on one HTTP/2 connection, so
// that the cap on connections also bounds the requests in progress and
// the memory they hold (Go's default, 250, let 4 connections carry 1,000
// creates at once). A client with more to send waits for a stream, or
// opens another connection, which waits its turn like any other.
const maxStreams = 16

// http2Config keeps what one HTTP/2 connection may hold near what an
// HTTP/1.1 connection holds: a few requests, each buffering at most a
// create's largest body ahead of its handler.
var http2Config = &http.HTTP2Config{
	MaxConcurrentStreams:          maxStreams,
	MaxReceiveBufferPerStream:     64 << 10,
	MaxReceiveBufferPerConnection: maxStreams * 64 << 10,
}

// limitListener caps the connections being served at max, so the
// process never runs out of descriptors or memory, and lets no few
// addresses crowd out the rest. It takes every connection from the
// kernel as it comes, so that the listen queue does not fill (the kernel
// then drops a new client's SYN, which is sent again only a second
// later), and parks those beyond the cap, with no goroutine or buffer,
// until their turn. Turns go round the client addresses: a client from
// its own address is served next, however many wait from others, and
// only a connection whose client has sent something (a request, a TLS
// hello) takes another's place: a real client sends with its
// connection; one that sends nothing is served only into a free slot.
//
// At the cap, a served connection is closed to give a parked one its
// turn, but only one with no request in progress, by net/http's own
// connection states, and never one in its first moments (see victim): an
// HTTP/2 connection carrying many requests is one connection, in
// progress while any of them is.
//
// At most maxParked wait (the descriptors the served leave, up to
// 32,768). When that many do, a newcomer takes the place of the oldest
// that has sent nothing, or, where all have and the oldest has waited
// shedAfter, of its own address's oldest parked connection, or, from an
// address with none, of the oldest of all. At
// most one WARN line a minute says the cap is full, with how many were
// closed or gave their place.
type limitListener struct {
	net.Listener
	max, maxParked int
	// firstRequestWithin is how long a connection that has sent something
	// may take to begin its first request (a TLS handshake over a slow
	// link, say) before it can be closed for room: the read-header
	// timeout, which would end it anyway.
	firstRequestWithin time.Duration
	log                *slog.Logger
	turn               chan struct{} // wakes Accept
	closed             chan struct{}
	closeOnce          sync.Once

	mu        sync.Mutex
	open      int                       // connections being served
	parked    list.List                 // waiting for a turn, oldest first
	byAddress map[string]*parkedAddress // the same, by client address
	turns     list.List                 // addresses with parked connections, next first
	fresh     list.List                 // served, no request yet, oldest first
	starting  list.List                 // the same, once they have sent something
	idle      list.List                 // idle between requests, longest first
	fullLines *logLimiter               // the WARN line, once a minute
}

// parkedAddress is one client address's parked connections.
type parkedAddress struct {
	address string
	conns   list.List     // oldest first
	turn    *list.Element // its place in turns
}

func newLimitListener(ln net.Listener, maxConns int, firstRequestWithin time.Duration, log *slog.Logger) *limitListener {
	l := &limitListener{Listener: ln, max: maxConns, maxParked: max(0, min(32768, spareDescriptors()-maxConns)),
		firstRequestWithin: firstRequestWithin, log: log,
		byAddress: map[string]*parkedAddress{}, fullLines: newLogLimiter(time.Minute, 1, 0),
		turn: make(chan struct{}, 1), closed: make(chan struct{})}
	go l.acceptLoop()
	return l
}

// acceptLoop takes connections from the kernel and parks them.
func (l *limitListener) acceptLoop() {
	failures := newLogLimiter(time.Minute, 1, 0)
	for {
		// With the parking full, a newcomer takes the place of a parked
		// connection that has sent nothing, or, where all have, of one
		// that has waited shedAfter (see park): until then, they are
		// served in turn, and a request sent is not lost.
		l.mu.Lock()
		full := l.parked.Len() >= max(1, l.maxParked) && l.oldestSilent() == nil &&
			time.Since(l.parked.Front().Value.(*limitedConn).since) <= shedAfter
		l.mu.Unlock()
		if full {
			time.Sleep(recheckEvery) // for a slot, with no descriptor to park on
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
			time.Sleep(recheckEvery)
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
	select {
	case <-l.closed: // Close has swept the parking already, or will not find c
		l.mu.Unlock()
		c.Conn.Close()
		return
	default:
	}
	// The one shed goes first: were it its address's last, the address
	// leaves the round, and c must then bring it back.
	var shed *limitedConn
	if l.parked.Len() >= max(1, l.maxParked) {
		shed = l.oldestSilent()
		if a := l.byAddress[c.address]; shed == nil && a != nil {
			shed = a.conns.Front().Value.(*limitedConn)
		}
		if shed == nil {
			shed = l.parked.Front().Value.(*limitedConn)
		}
		l.evict(shed)
		l.noteClosedForRoom()
	}
	a := l.byAddress[c.address]
	if a == nil {
		a = &parkedAddress{address: c.address}
		a.turn = l.turns.PushBack(a)
		l.byAddress[c.address] = a
	}
	c.since = time.Now()
	c.moveTo(&l.parked)
	c.parkedAt = a.conns.PushBack(c)
	l.mu.Unlock()
	l.signal()
	if shed != nil {
		shed.Conn.Close()
	}
}

// oldestSilent is the oldest parked connection that has sent nothing
// silentAfter after it was parked, of the maxPeeks oldest, or nil: the
// one to close first for room, as it loses nothing. l.mu is held.
func (l *limitListener) oldestSilent() *limitedConn {
	e := l.parked.Front()
	for range min(maxPeeks, l.parked.Len()) {
		c := e.Value.(*limitedConn)
		if time.Since(c.since) <= silentAfter {
			return nil // the rest are younger still
		}
		if !c.sentSomething(false) { // no silence remembered: it may lose a request
			return c
		}
		e = e.Next()
	}
	return nil
}

// shedAfter is how long the oldest parked connection, when every one
// parked has sent its request, waits for its turn before a newcomer may
// take its place, losing that request: past it, the parked are not being
// served in turn, and the listen queue must not fill.
const shedAfter = 2 * time.Second

// nextTurn takes the oldest parked connection of the address a, and
// puts the address at the back of the round. l.mu is held.
func (l *limitListener) nextTurn(a *parkedAddress) *limitedConn {
	c := a.conns.Front().Value.(*limitedConn)
	c.unpark()
	if a.conns.Len() > 0 {
		l.turns.MoveToBack(a.turn)
	}
	return c
}

// readyAddress is the first address in the round whose oldest parked
// connection has sent something (a request, a TLS hello), of the first
// maxPeeks looked at, and otherwise the address of the newest parked
// connection that has, of the maxPeeks newest; nil if none has. Those
// passed over in the round go to its back. A real client sends with its
// connection: only such a one is worth closing another for, and a new
// one among thousands of silent connections is found at once. l.mu is
// held.
func (l *limitListener) readyAddress() *parkedAddress {
	for range min(maxPeeks, l.turns.Len()) {
		a := l.turns.Front().Value.(*parkedAddress)
		if a.conns.Front().Value.(*limitedConn).sentSomething(true) {
			return a
		}
		l.turns.MoveToBack(a.turn)
	}
	e := l.parked.Back()
	for range min(maxPeeks, l.parked.Len()) {
		if c := e.Value.(*limitedConn); c.sentSomething(true) {
			// Its own, not its address's oldest: that one is silent.
			a := l.byAddress[c.address]
			a.conns.MoveToFront(c.parkedAt)
			return a
		}
		e = e.Prev()
	}
	return nil
}

// maxPeeks bounds the parked connections looked at for one turn, twice:
// a peek is a system call made with l.mu held.
const maxPeeks = 256

// Accept hands the http.Server a parked connection in its turn: the
// next one that has sent something, once a slot is free or made free,
// or, while a slot is free, the next of all.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		l.mu.Lock()
		var c, victim *limitedConn
		var aging <-chan time.Time // while parked ones wait for a victim
		if l.parked.Len() > 0 {
			ready := l.readyAddress()
			switch {
			case l.open < l.max && ready == nil:
				c = l.nextTurn(l.turns.Front().Value.(*parkedAddress))
			case l.open < l.max:
				c = l.nextTurn(ready)
			case ready != nil:
				victim = l.victim()
			}
			if c != nil {
				l.open++
				c.since = time.Now()
				c.moveTo(&l.fresh)
			} else if victim != nil {
				l.evict(victim)
				l.noteClosedForRoom()
			} else {
				aging = time.After(recheckEvery)
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
		// A turn comes when a connection is parked or closes, or when one
		// has sent something or waited long enough to be closed.
		select {
		case <-l.turn:
		case <-aging:
		case <-l.closed:
			return nil, net.ErrClosed
		}
	}
}

// victim is the served connection to close for a parked one's turn, nil
// when there is none to close. None with a request in progress is ever
// chosen, nor one in its first moments, before its first request could
// have come. In order: one that has sent nothing silentAfter after it was
// handed to the server (a real client sends its request, or its TLS
// hello, with the connection), the oldest first; one that sent something
// but began no request within firstRequestWithin; then the one idle
// longest between requests, once idle for lingerIdle. l.mu is held.
func (l *limitListener) victim() *limitedConn {
	now := time.Now()
	for e := l.fresh.Front(); e != nil && now.Sub(e.Value.(*limitedConn).since) > silentAfter; e = l.fresh.Front() {
		c := e.Value.(*limitedConn)
		if !c.heard.Load() {
			return c
		}
		c.moveTo(&l.starting) // a slow handshake, say: it has longer
	}
	if e := l.starting.Front(); e != nil && now.Sub(e.Value.(*limitedConn).since) > l.firstRequestWithin {
		return e.Value.(*limitedConn)
	}
	if e := l.idle.Front(); e != nil && now.Sub(e.Value.(*limitedConn).since) > lingerIdle {
		return e.Value.(*limitedConn)
	}
	return nil
}

// silentAfter is how long a new connection may stay silent before it can
// be closed for a turn: a real client's first bytes come with its
// connection, a round trip after its SYN, and those are counted from the
// service's accept.
const silentAfter = 500 * time.Millisecond

// lingerIdle is how long a connection stays idle before it can be closed
// for a turn, so that its last answer, on its way to a distant client, is
// not reset by the close.
const lingerIdle = 250 * time.Millisecond

// recheckEvery is how often the listener looks again for a victim while
// connections wait for a turn, and for a descriptor when it has none.
const recheckEvery = 50 * time.Millisecond

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

// connState is the http.Server's ConnState hook, which says when a
// connection has a request in progress (Active) and when none (Idle).
// HTTP/2 reports a new connection Active and then Idle once its preface
// is read, before any request: it is still in its first moments.
func (l *limitListener) connState(c net.Conn, state http.ConnState) {
	lc, ok := limitedOf(c)
	if !ok {
		return
	}
	tc, isTLS := c.(*tls.Conn)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case lc.closed:
	case state == http.StateActive:
		lc.moveTo(nil) // in progress: never closed for room
	case state != http.StateIdle:
	case !lc.prefaced && isTLS && tc.ConnectionState().NegotiatedProtocol == "h2":
		lc.prefaced = true
		lc.since = time.Now()
		lc.moveTo(&l.starting)
	default:
		lc.since = time.Now()
		lc.moveTo(&l.idle)
	}
}

// limitedOf is the limitedConn under c, a TLS connection's included.
func limitedOf(c net.Conn) (*limitedConn, bool) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	return lc, ok
}

// Close closes the listener and the parked connections, whose clients
// would otherwise wait for the process to end.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	err := l.Listener.Close()
	l.mu.Lock()
	var parked []*limitedConn
	for e := l.parked.Front(); e != nil; e = e.Next() {
		parked = append(parked, e.Value.(*limitedConn))
	}
	l.mu.Unlock()
	for _, c := range parked {
		c.Close()
	}
	return err
}

// limitedConn gives its slot back when it is closed.
type limitedConn struct {
	net.Conn
	l     *limitListener
	heard atomic.Bool // the client has sent something
	// Guarded by l.mu: the list it is in (nil while in progress), its
	// element there, whether it was closed, when it was parked, handed to
	// the server or went idle, and whether its HTTP/2 preface was read.
	in       *list.List
	elem     *list.Element
	closed   bool
	since    time.Time
	prefaced bool
	quietAt  time.Time     // when a peek last found it silent
	address  string        // the client's, without the port
	parkedAt *list.Element // its place in its address's queue, while parked
}

func (c *limitedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.heard.Load() {
		c.heard.Store(true)
	}
	return n, err
}

// sentSomething tells, without reading it, whether the client has sent
// anything on c: a peek at the socket, which never waits. Only for a
// parked c: for a served one, the peek would wait for the server's own
// read to return. That the client sent is kept for good (it stays until
// read); with remembered, silence found is kept for recheckEvery once c
// has been parked silentAfter, the bulk of a flood, while a young one,
// whose request may come any moment, is looked at each time (a
// long-parked client that sends just after such a look is seen up to 50
// ms later: a review measured 67 ms at most). Under a flood of 22,000
// connections the peeks, made with l.mu held, had taken 31-43% of the
// service's CPU (9-10% now), and the accept loop waited on l.mu while
// the kernel's listen queue filled: at a descriptor limit of 16,384, a
// fresh client was answered within 1 s 1 to 5 times of 10, and 3 to 10
// with what is kept.
func (c *limitedConn) sentSomething(remembered bool) bool {
	if c.heard.Load() {
		return true // seen before: what was sent stays until it is read
	}
	if remembered && time.Since(c.quietAt) < recheckEvery && time.Since(c.since) > silentAfter {
		return false // found silent a moment ago, and long parked
	}
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	sent := false
	raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, _ := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		sent = n > 0 // not a client that closed (0) or reset (an error): no one to serve
		return true  // done: do not wait for it to become readable
	})
	if sent {
		c.heard.Store(true)
	} else {
		c.quietAt = time.Now()
	}
	return sent
}

// CloseWrite lets Go's server half-close a connection it answered with
// Connection: close, so that its client reads the answer before the close.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
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
		c.elem = to.PushBack(c)
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
