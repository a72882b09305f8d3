//go:build cgo

// go-sqlite3's own types: the driver, and SQLite's errors read as the
// store's faults. nocgo.go stands in when cgo is off.

package main

import (
	"database/sql"
	"errors"
	"syscall"

	"github.com/mattn/go-sqlite3"
)

// sqliteDriver is go-sqlite3 with setUpConnection.
const sqliteDriver = "sqlite3-petstore"

func init() {
	sql.Register(sqliteDriver, &sqlite3.SQLiteDriver{ConnectHook: setUpConnection})
}

// setUpConnection sets what the DSN cannot:
//   - PERSIST_WAL keeps the -wal and -shm, so that a start on a full or
//     read-only disk need not make them again (TestDiskFull, TestReadOnly).
//   - temp_store=MEMORY keeps a create's statement journal in memory.
//   - wal_autocheckpoint=0 leaves checkpoints to the writer loop, because
//     SQLite ignores a failed checkpoint after a commit (TestFailedFsync).
func setUpConnection(c *sqlite3.SQLiteConn) error {
	if err := c.SetFileControlInt("main", sqlite3.SQLITE_FCNTL_PERSIST_WAL, 1); err != nil {
		return err
	}
	_, err := c.Exec("PRAGMA temp_store = MEMORY; PRAGMA wal_autocheckpoint = 0", nil)
	return err
}

// sqliteFault returns the fault a SQLite error stands for, if any. The
// errno is checked first, because it is more precise. A failed fsync is
// an I/O error whatever its errno.
func sqliteFault(err error) (faultKind, bool) {
	var e sqlite3.Error
	if !errors.As(err, &e) {
		return "", false
	}
	errno := e.SystemErrno
	switch {
	case e.ExtendedCode == sqlite3.ErrIoErrFsync || e.ExtendedCode == sqlite3.ErrIoErrDirFsync:
		return faultIO, true
	case errno == syscall.ENOSPC || errno == syscall.EDQUOT || e.Code == sqlite3.ErrFull:
		return faultDiskFull, true
	case errno == syscall.EMFILE || errno == syscall.ENFILE:
		return faultTooManyFiles, true
	case errno == syscall.EROFS || errno == syscall.EPERM || errno == syscall.EACCES:
		return faultReadOnly, true
	case errno == syscall.EIO || e.Code == sqlite3.ErrIoErr:
		return faultIO, true
	case e.Code == sqlite3.ErrReadonly || e.Code == sqlite3.ErrPerm || e.Code == sqlite3.ErrCantOpen:
		return faultReadOnly, true
	case e.Code == sqlite3.ErrBusy || e.Code == sqlite3.ErrLocked:
		return faultLocked, true
	case e.Code == sqlite3.ErrCorrupt || e.Code == sqlite3.ErrNotADB:
		return faultDamaged, true
	}
	return "", false
}

// isConstraint reports whether a rule of the file refused a row.
func isConstraint(err error) bool {
	var e sqlite3.Error
	return errors.As(err, &e) && e.Code == sqlite3.ErrConstraint
}
