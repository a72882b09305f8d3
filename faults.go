// Storage faults: what the store does when the disk or the database file
// goes wrong underneath it. A fault is classified once, answered as a
// retryable 503 naming its cause, logged when it begins and when it ends
// (not once per request), and shown by /healthz until it clears.

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mattn/go-sqlite3"
)

// faultKind names a cause, outside the service, for which the store
// cannot store or read a pet.
type faultKind int

const (
	faultNone faultKind = iota
	faultDiskFull
	faultReadOnly
	faultIO
	faultLocked
	faultNotAnswering
	faultTimedOut // a create that could not be committed before its deadline
	faultDamaged  // lasts until the file is restored and the service restarted
	faultReplaced // lasts until the service is restarted
)

// message says what is wrong, starting with the short name of the failing
// check, for the client and for /healthz.
func (k faultKind) message() string {
	switch k {
	case faultDiskFull:
		return "disk full: the filesystem holding the database has no space left, so no pet can be stored until space is freed"
	case faultReadOnly:
		return "read-only: the database file or its filesystem cannot be written"
	case faultIO:
		return "I/O error: the storage holding the database reports errors"
	case faultLocked:
		return "database locked: another process holds the database's write lock"
	case faultDamaged:
		return "damaged: the database file is corrupt and must be restored from a backup"
	case faultReplaced:
		return "file replaced: the database file was deleted or replaced while the service ran; the service must be restarted"
	case faultTimedOut:
		return "timed out: the pet could not be committed before the write timeout, so it was not stored"
	}
	return "database not answering"
}

// retryAfter is the Retry-After of a 503 for the fault, in seconds: a lock
// passes quickly; the others wait for an operator.
func (k faultKind) retryAfter() string {
	switch k {
	case faultLocked, faultNotAnswering, faultTimedOut:
		return "1"
	case faultDamaged, faultReplaced:
		return "60"
	}
	return "5"
}

// storageError is a store failure with a known cause outside the service.
// Handlers answer it with 503 and Retry-After; it is logged by the
// faultLog, not per request.
type storageError struct {
	kind faultKind
	err  error
}

func (e *storageError) Error() string { return e.kind.message() + ": " + e.err.Error() }
func (e *storageError) Unwrap() error { return e.err }

// classifyFault tells whether err comes from the storage rather than from
// the service, and which fault it is. Unknown errors stay unknown (500).
func classifyFault(err error) (faultKind, bool) {
	var se *storageError
	if errors.As(err, &se) {
		return se.kind, true
	}
	var sqliteErr sqlite3.Error
	if errors.As(err, &sqliteErr) {
		// The system's errno says more than SQLite's code: a write refused
		// for an immutable file is SQLITE_IOERR_WRITE with EPERM.
		if kind, ok := classifyErrno(sqliteErr.SystemErrno); ok {
			return kind, true
		}
		switch sqliteErr.Code {
		case sqlite3.ErrFull:
			return faultDiskFull, true
		case sqlite3.ErrReadonly:
			if sqliteErr.ExtendedCode == sqlite3.ErrReadonlyDbMoved {
				return faultReplaced, true
			}
			return faultReadOnly, true
		case sqlite3.ErrPerm:
			return faultReadOnly, true
		case sqlite3.ErrIoErr, sqlite3.ErrCantOpen:
			return faultIO, true
		case sqlite3.ErrBusy, sqlite3.ErrLocked:
			return faultLocked, true
		case sqlite3.ErrCorrupt, sqlite3.ErrNotADB:
			return faultDamaged, true
		}
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return classifyErrno(errno)
	}
	return faultNone, false
}

// classifyErrno maps the system errors that mean a storage fault.
func classifyErrno(errno syscall.Errno) (faultKind, bool) {
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT:
		return faultDiskFull, true
	case syscall.EROFS, syscall.EPERM, syscall.EACCES:
		return faultReadOnly, true
	case syscall.EIO:
		return faultIO, true
	}
	return faultNone, false
}

// asStorageError wraps err as a storageError when it is a storage fault,
// and returns it unchanged otherwise.
func asStorageError(err error) error {
	if err == nil {
		return nil
	}
	if kind, ok := classifyFault(err); ok {
		var se *storageError
		if errors.As(err, &se) {
			return err
		}
		return &storageError{kind: kind, err: err}
	}
	return err
}

// faultLog remembers the storage fault in force, so it is logged once
// when it begins, once when it ends (with how many requests it refused
// and for how long), and reported by /healthz in between.
type faultLog struct {
	log  *slog.Logger
	path string

	mu      sync.Mutex
	kind    faultKind
	cause   error
	since   time.Time
	refused int
}

// failed records a fault that refused n requests.
func (f *faultLog) failed(kind faultKind, cause error, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kind == kind {
		f.refused += n
		f.cause = cause
		return
	}
	if f.kind != faultNone {
		f.endLocked("changed to " + kind.message())
	}
	f.kind, f.cause, f.since, f.refused = kind, cause, time.Now(), n
	f.log.Error("storage fault: requests that need it are refused with 503 until it clears",
		"fault", kind.message(), "err", rootCause(cause).Error(), "db", f.path)
}

// succeeded records that a write worked: any fault has ended.
func (f *faultLog) succeeded() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kind != faultNone {
		f.endLocked("a write succeeded")
	}
}

func (f *faultLog) endLocked(why string) {
	f.log.Warn("storage fault cleared", "fault", f.kind.message(), "why", why,
		"refused", f.refused, "lasted", time.Since(f.since).Round(time.Millisecond).String(), "db", f.path)
	f.kind, f.cause, f.refused = faultNone, nil, 0
}

// rootCause is the error under a storageError, for the log, which names
// the fault already.
func rootCause(err error) error {
	var se *storageError
	if errors.As(err, &se) {
		return se.err
	}
	return err
}

// current returns the fault in force, or nil.
func (f *faultLog) current() *storageError {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kind == faultNone {
		return nil
	}
	return &storageError{kind: f.kind, err: f.cause}
}

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

func (d *dbFile) close() error { return d.f.Close() }
