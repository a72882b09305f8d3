// Backups and restore, as the backup and restore commands (main.go) call
// them: one consistent copy, written with VACUUM INTO and checked before
// it is called a backup; retention of a directory of snapshots; and the
// put-back, while no service holds the file.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

// snapshotPattern matches the names of the snapshots that -dir writes,
// and only those: retention never touches another file.
var snapshotPattern = regexp.MustCompile(`^petstore-\d{8}T\d{6}Z\.db$`)

// pruneSnapshots deletes the oldest snapshots in dir beyond the newest
// keep, by the UTC time in their names, never the one just written and
// never a file whose name is not a snapshot's. A snapshot named after the
// one just written (by a clock that once ran ahead) would sort as the
// newest for ever: it is neither counted nor deleted, but returned in
// ahead. It returns the names it deleted.
func pruneSnapshots(dir string, keep int, justWritten string) (removed, ahead []string, err error) {
	entries, err := os.ReadDir(dir) // sorted by name: oldest first
	if err != nil {
		return nil, nil, err
	}
	var snapshots []string
	for _, e := range entries {
		switch {
		case !e.Type().IsRegular() || !snapshotPattern.MatchString(e.Name()):
		case e.Name() > justWritten:
			ahead = append(ahead, e.Name())
		default:
			snapshots = append(snapshots, e.Name())
		}
	}
	for ; len(snapshots) > keep; snapshots = snapshots[1:] {
		if snapshots[0] == justWritten {
			continue
		}
		if err := os.Remove(filepath.Join(dir, snapshots[0])); err != nil {
			return removed, ahead, err
		}
		removed = append(removed, snapshots[0])
	}
	return removed, ahead, nil
}

// backupDatabase writes a consistent copy of the database file src to dst
// while the service may be writing to src. VACUUM INTO reads one snapshot
// (a WAL read transaction) and so neither blocks the writer nor copies a
// half-committed state; the copy is compacted and self-contained (no
// -wal file). The copy is written to a temporary file beside dst, checked,
// fsynced, and only then linked into place, so an interrupted backup
// leaves nothing at dst that could pass for a backup. dst must not exist.
// It returns how many pets the copy holds.
func backupDatabase(ctx context.Context, src, dst string) (pets int64, err error) {
	if _, err := os.Stat(src); err != nil {
		return 0, fmt.Errorf("database to back up: %w", err)
	}
	if _, err := os.Lstat(dst); err == nil {
		return 0, fmt.Errorf("backup file %s already exists; a backup never overwrites a file", dst)
	}
	// Whose file it is is read first, and the copy is read, through a
	// read-only connection: another application's file is refused with
	// nothing written to it or beside it.
	if _, err := inspect(src); err != nil {
		return 0, fmt.Errorf("back up %s: %w", src, err)
	}
	db, err := sql.Open("sqlite3", readOnlyDSN(src))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	tmp, err := vacuumInto(ctx, db, filepath.Dir(dst), "."+filepath.Base(dst)+".partial-*")
	if err != nil {
		return 0, fmt.Errorf("back up %s: %w", src, err)
	}
	defer os.Remove(tmp)
	if pets, err = checkBackup(ctx, tmp); err != nil {
		return 0, err
	}
	// A link, unlike a rename, refuses to replace a file that appeared at
	// dst meanwhile.
	if err := os.Link(tmp, dst); err != nil {
		return 0, fmt.Errorf("backup file: %w", err)
	}
	return pets, syncPath(filepath.Dir(dst))
}

// checkBackup checks a copy before it is called a backup, or put back,
// and counts its pets: a petstore file, whole. It opens the copy
// read-only and without our DSN options, which would turn it into a WAL
// database with -wal and -shm files beside it.
func checkBackup(ctx context.Context, path string) (pets int64, err error) {
	out, err := sql.Open("sqlite3", readOnlyDSN(path))
	if err != nil {
		return 0, err
	}
	defer out.Close()
	var appID int64
	if err := out.QueryRowContext(ctx, "PRAGMA application_id").Scan(&appID); err != nil {
		return 0, fmt.Errorf("check backup: %w", err)
	}
	if appID != petstoreApplicationID {
		return 0, fmt.Errorf("check backup: %w (SQLite application_id %#x)", errNotPetstore, appID)
	}
	var check string
	if err := out.QueryRowContext(ctx, "PRAGMA integrity_check").Scan(&check); err != nil {
		return 0, fmt.Errorf("check backup: %w", err)
	}
	if check != "ok" {
		return 0, fmt.Errorf("check backup: integrity_check says %q", check)
	}
	if err := out.QueryRowContext(ctx, "SELECT count(*) FROM pets").Scan(&pets); err != nil {
		return 0, fmt.Errorf("check backup: %w", err)
	}
	return pets, nil
}

// restoreDatabase replaces the database at db with the backup at from.
// Copying a file over a live database corrupts it: the service's open
// connections, its -wal and its -shm still describe the old file, and
// SQLite would lay the old WAL's pages over the new one. So it refuses
// while a service holds db (its lock), checks the backup (integrity and
// application id), writes a copy beside db and fsyncs it, removes the old
// -wal and -shm, and renames the copy over db, so db is at every moment
// either the old file or the whole backup.
func restoreDatabase(ctx context.Context, from, db string) (pets int64, err error) {
	if pets, err = checkBackup(ctx, from); err != nil {
		return 0, err
	}
	// The service's lock, held until the new file is in place: no service
	// can start on db meanwhile.
	old, err := openDBFile(db)
	if err != nil {
		return 0, fmt.Errorf("%w; stop it before restoring", err)
	}
	defer old.close()
	db = old.path // a link's target: the file SQLite opens
	// The copy is written by SQLite from the backup as SQLite reads it,
	// its -wal included (a backup left by a killed service has one), then
	// checked and counted itself.
	src, err := sql.Open("sqlite3", readOnlyDSN(from))
	if err != nil {
		return 0, err
	}
	defer src.Close()
	tmp, err := vacuumInto(ctx, src, filepath.Dir(db), "."+filepath.Base(db)+".restore-*")
	if err != nil {
		return 0, fmt.Errorf("copy the backup beside %s: %w", db, err)
	}
	defer os.Remove(tmp)
	if err := keepReplacedIDs(ctx, db, tmp); err != nil {
		return 0, err
	}
	if pets, err = checkBackup(ctx, tmp); err != nil {
		return 0, err
	}
	// The record of what a service acknowledged on the replaced file is
	// in the copy's sequence now (keepReplacedIDs), and the copy is the
	// catalogue: the next start begins a new record.
	for _, companion := range []string{db + "-wal", db + "-shm", db + ackedSuffix} {
		if err := os.Remove(companion); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, err
		}
	}
	if err := os.Rename(tmp, db); err != nil {
		return 0, err
	}
	return pets, syncPath(filepath.Dir(db))
}

// keepReplacedIDs readies the copy at tmp to replace the file at db: its
// id sequence is raised to the highest id db holds or handed out, where
// db can be read, so no id a client was given is handed out again; and
// its counts are made to agree with the pets it holds, so pets its own
// counts say are missing (a copy of a file that lost them) are taken as
// deleted: putting a file back says that it is the catalogue.
func keepReplacedIDs(ctx context.Context, db, tmp string) error {
	var top int64
	if old, err := sql.Open("sqlite3", readOnlyDSN(db)); err == nil {
		// Each apart: a damaged file may still give one of the two. One
		// that gives neither (not SQLite) leaves the record's, below.
		for _, q := range []string{"SELECT coalesce(max(id), 0) FROM pets", "SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'pets'"} {
			var id int64
			if old.QueryRowContext(ctx, q).Scan(&id) == nil {
				top = max(top, id)
			}
		}
		old.Close()
	}
	// What a service acknowledged on it, which the file may have lost.
	if _, acked, ok := readAcked(db); ok {
		top = max(top, acked)
	}
	copied, err := sql.Open("sqlite3", fileURI(tmp))
	if err != nil {
		return err
	}
	defer copied.Close()
	var version int
	if err := copied.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fmt.Errorf("read the copy: %w", err)
	}
	fix := raiseSequenceSQL
	if version >= 8 { // the schema that counts deletes
		fix += "UPDATE pets_changes SET deleted = inserted - (SELECT count(*) FROM pets);"
	}
	if _, err := copied.ExecContext(ctx, fix, top); err != nil {
		return fmt.Errorf("raise the copy's id sequence: %w", err)
	}
	return nil
}
