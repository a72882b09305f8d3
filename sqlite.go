//go:build cgo

// All that names go-sqlite3's own types: the driver as the service
// registers it, and SQLite's error codes read as the store's faults.
// nocgo.go stands in where cgo is off.

package main

import (
	"database/sql"
	"errors"
	"syscall"

	"github.com/mattn/go-sqlite3"
)

// sqliteDriver is go-sqlite3 with every connection set up by
// setUpConnection.
const sqliteDriver = "sqlite3-petstore"

func init() {
	sql.Register(sqliteDriver, &sqlite3.SQLiteDriver{ConnectHook: setUpConnection})
}

// setUpConnection sets what the DSN cannot:
//   - the -wal and -shm are kept when the last connection closes (the WAL
//     emptied): SQLite deletes them by default, and then a start on a
//     full disk fails, as a new -shm needs 32 KiB, and one on a read-only
//     disk cannot make them. Kept, the service starts and serves reads.
//   - temporary files, an insert's statement journal among them, live in
//     memory: a 64 KiB one made and freed for every create cost a fifth
//     of create throughput in glibc's malloc.
//   - no checkpoint runs by itself at the end of a commit, where SQLite
//     ignores one that fails: after a failed fsync, Linux may report the
//     next one a success for pages it dropped, and the WAL would then be
//     started over with its frames lost. The writer checkpoints itself,
//     and a checkpoint's I/O error lasts (store.checkpoint).
func setUpConnection(c *sqlite3.SQLiteConn) error {
	if err := c.SetFileControlInt("main", sqlite3.SQLITE_FCNTL_PERSIST_WAL, 1); err != nil {
		return err
	}
	_, err := c.Exec("PRAGMA temp_store = MEMORY; PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = 4194304", nil)
	return err
}

// sqliteFault tells which storage fault an error of SQLite's is, if any.
func sqliteFault(err error) (faultKind, bool) {
	var e sqlite3.Error
	if !errors.As(err, &e) {
		return "", false
	}
	// The system's errno says more than SQLite's code (a write refused
	// for an immutable file is SQLITE_IOERR_WRITE with EPERM), except for
	// a failed fsync, an I/O fault whatever its errno: ENOSPC from a thin
	// volume means written pages were dropped.
	fsync := e.ExtendedCode == sqlite3.ErrIoErrFsync || e.ExtendedCode == sqlite3.ErrIoErrDirFsync
	if kind, ok := classifyErrno(e.SystemErrno); ok && !fsync {
		return kind, true
	}
	switch e.Code {
	case sqlite3.ErrFull:
		return faultDiskFull, true
	case sqlite3.ErrReadonly, sqlite3.ErrPerm, sqlite3.ErrCantOpen:
		// CANTOPEN: a file SQLite must make (the -wal, the -shm) cannot be,
		// as on a read-only disk after an outside sqlite3 removed them.
		return faultReadOnly, true
	case sqlite3.ErrIoErr:
		return faultIO, true
	case sqlite3.ErrBusy, sqlite3.ErrLocked:
		return faultLocked, true
	case sqlite3.ErrCorrupt, sqlite3.ErrNotADB:
		return faultDamaged, true
	}
	return "", false
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
	return "", false
}

// isConstraint reports whether err is a rule of the file refusing a row:
// a CHECK, a unique index, or an operator's trigger's RAISE.
func isConstraint(err error) bool {
	var e sqlite3.Error
	return errors.As(err, &e) && e.Code == sqlite3.ErrConstraint
}
