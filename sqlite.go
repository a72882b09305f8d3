//go:build cgo

// Everything that names go-sqlite3's own types: the driver as the service
// registers it, and SQLite's error codes read into the service's terms.
// Built only with cgo; nocgo.go stands in for it where cgo is off.

package main

import (
	"database/sql"
	"errors"

	"github.com/mattn/go-sqlite3"
)

// sqliteDriver is go-sqlite3 with every connection set up by
// setUpConnection.
const sqliteDriver = "sqlite3-petstore"

func init() {
	sql.Register(sqliteDriver, &sqlite3.SQLiteDriver{ConnectHook: setUpConnection})
}

// setUpConnection sets what the DSN cannot:
//   - the -wal and -shm files are kept when a connection closes (the WAL
//     emptied). SQLite deletes them on a clean close by default, and then
//     a restart on a full disk fails: a new -shm needs 32 KiB. Kept, they
//     let the service start and serve reads with no byte free.
//   - temporary files, among them an insert's statement journal (the
//     CHECK constraint's length() makes every insert keep one), live in
//     memory in SQLite's small chunks. Otherwise SQLite keeps each in one
//     64 KiB chunk, allocated and freed on every create; glibc's malloc
//     handed that back to the kernel each time, which cost a fifth of
//     create throughput (docs/performance.md).
func setUpConnection(c *sqlite3.SQLiteConn) error {
	if err := c.SetFileControlInt("main", sqlite3.SQLITE_FCNTL_PERSIST_WAL, 1); err != nil {
		return err
	}
	_, err := c.Exec("PRAGMA temp_store = MEMORY", nil)
	return err
}

// sqliteFault tells whether err is SQLite's, and which storage fault its
// code means (faultNone for a code that means no fault).
func sqliteFault(err error) (kind faultKind, isSQLite bool) {
	var sqliteErr sqlite3.Error
	if !errors.As(err, &sqliteErr) {
		return faultNone, false
	}
	// The system's errno says more than SQLite's code: a write refused
	// for an immutable file is SQLITE_IOERR_WRITE with EPERM. But a
	// failed fsync is an I/O fault whatever its errno: ENOSPC from a
	// thin-provisioned volume means written pages were dropped.
	fsync := sqliteErr.ExtendedCode == sqlite3.ErrIoErrFsync || sqliteErr.ExtendedCode == sqlite3.ErrIoErrDirFsync
	if kind, ok := classifyErrno(sqliteErr.SystemErrno); ok && !fsync {
		return kind, true
	}
	switch sqliteErr.Code {
	case sqlite3.ErrFull:
		return faultDiskFull, true
	case sqlite3.ErrReadonly, sqlite3.ErrPerm:
		if sqliteErr.ExtendedCode == sqlite3.ErrReadonlyDbMoved {
			return faultReplaced, true
		}
		return faultReadOnly, true
	case sqlite3.ErrIoErr, sqlite3.ErrCantOpen:
		return faultIO, true
	case sqlite3.ErrBusy, sqlite3.ErrLocked:
		return faultLocked, true
	case sqlite3.ErrCorrupt, sqlite3.ErrNotADB:
		return faultDamaged, true
	}
	return faultNone, true
}

// constraintRefusal returns SQLite's error if err is a constraint of the
// schema refusing a row, or nil.
func constraintRefusal(err error) error {
	var refusal sqlite3.Error
	if errors.As(err, &refusal) && refusal.Code == sqlite3.ErrConstraint {
		return refusal
	}
	return nil
}

// inTransaction reports whether the driver's connection dc is inside a
// transaction.
func inTransaction(dc any) bool {
	return !dc.(*sqlite3.SQLiteConn).AutoCommit()
}
