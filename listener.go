// The listener: a cap on open client connections, so the process never
// runs out of descriptors for the connections it has or for its database.

package main

import (
	"net"
	"sync"
	"syscall"
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
