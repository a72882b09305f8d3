// The database file's identity and lock: one service per file, and a
// path that no longer names the opened file is noticed.

package main

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
)

// fileID is a file's identity: the same path can name another file later.
type fileID struct{ dev, ino uint64 }

func fileIDOf(fi os.FileInfo) fileID {
	st := fi.Sys().(*syscall.Stat_t)
	return fileID{dev: uint64(st.Dev), ino: st.Ino}
}

// dbFile is the database file as the service opened it. Its descriptor
// holds an exclusive flock for the life of the service, so a second
// petstore on the same file refuses to start; SQLite's own locks are
// POSIX locks, which flock does not touch. It is closed only after every
// SQLite connection: closing any descriptor of the file releases the
// process's POSIX locks on it.
type dbFile struct {
	path string
	f    *os.File
	id   fileID
	// readOnly: the file could be opened only for reading at start; it
	// is cleared once a write has worked.
	readOnly atomic.Bool
}

// openDBFile opens the database file at path, creating it private to the
// service's user (SQLite would use the umask's mode, and gives the -wal
// and -shm files the database's mode), and takes the service's lock.
func openDBFile(path string) (*dbFile, error) {
	d := &dbFile{path: path}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		// A file that cannot be written (read-only filesystem, immutable
		// file) is still served for reading; creates get 503.
		ro, roErr := os.Open(path)
		if roErr != nil {
			return nil, fmt.Errorf("open database: %w", err)
		}
		f = ro
		d.readOnly.Store(true)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("database %s is in use by another petstore process; run one service per database file", path)
		}
		return nil, fmt.Errorf("lock database %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open database: %w", err)
	}
	d.f, d.id = f, fileIDOf(fi)
	return d, nil
}

// checkStillThere returns a faultReplaced storageError when the path no
// longer names the file that was opened: deleted, renamed or replaced.
// Writing on would acknowledge pets that a restart cannot find.
func (d *dbFile) checkStillThere() error {
	fi, err := os.Stat(d.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return &storageError{kind: faultReplaced, err: fmt.Errorf("%s was deleted or renamed", d.path)}
	case err != nil:
		return &storageError{kind: faultIO, err: err}
	case fileIDOf(fi) != d.id:
		return &storageError{kind: faultReplaced, err: fmt.Errorf("%s is now another file", d.path)}
	}
	return nil
}

// minFreeBytes is the free space below which /healthz checks, with a
// real write, whether a pet can still be stored: a WAL that is reused
// after a checkpoint may still take commits on a nearly full disk.
const minFreeBytes = 256 << 10

// looksUnwritable reports whether the filesystem is read-only or nearly
// full, or the file could be opened only for reading: then only a real
// write tells whether a pet can be stored.
func (d *dbFile) looksUnwritable() bool {
	if d.readOnly.Load() {
		return true
	}
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(d.f.Fd()), &st); err != nil {
		return true
	}
	const stRdonly = 1 // ST_RDONLY
	free := st.Bavail
	if os.Geteuid() == 0 {
		free = st.Bfree // root may use the reserved blocks
	}
	return st.Flags&stRdonly != 0 || free*uint64(st.Bsize) < minFreeBytes
}

// unreadable reports whether the file's first page cannot be read: the
// storage itself fails (EIO), whatever SQLite made of it.
func (d *dbFile) unreadable() bool {
	var page [512]byte
	_, err := d.f.ReadAt(page[:], 0)
	return errors.Is(err, syscall.EIO)
}

func (d *dbFile) close() error { return d.f.Close() }
