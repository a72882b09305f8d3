// The backup and restore commands: a consistent copy of the live
// database, written with VACUUM INTO and checked before it is called a
// backup, and its put-back while no service holds the file. Scheduling
// snapshots and pruning old ones is the timer's (petstore-backup.service).

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// runBackupCommand is "petstore backup [-db FILE] BACKUP-FILE" and
// "petstore restore -from BACKUP [-db FILE]".
func runBackupCommand(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	usage := map[string]string{
		"backup":  "petstore backup [-db FILE] BACKUP-FILE\n\nWrites a consistent, checked copy of the database, also while the service runs.",
		"restore": "petstore restore -from BACKUP [-db FILE]\n\nReplaces the database with a checked backup, while no service holds it.",
	}[args[0]]
	fs := newFlagSet()
	var db string
	envFlag(fs, getenv, &db, "db", "petstore.db", "SQLite database `file`")
	from := fs.String("from", "", "restore: the backup `file` to put back, as petstore backup wrote it")
	if err := parseArgs(fs, args[1:], stdout, usage); err != nil {
		return err
	}
	var pets int64
	var err error
	var done string
	switch {
	case args[0] == "backup" && fs.NArg() == 1 && *from == "":
		pets, err = backupDatabase(ctx, db, fs.Arg(0))
		done = "backed up " + db + " to " + fs.Arg(0)
	case args[0] == "restore" && fs.NArg() == 0 && *from != "":
		pets, err = restoreDatabase(ctx, *from, db)
		done = "restored " + *from + " to " + db
	default:
		return fmt.Errorf("%s: name the files as the usage says, flags first: %s", args[0], strings.Split(usage, "\n")[0])
	}
	if err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	fmt.Fprintf(stdout, "%s: %d pets, integrity ok\n", done, pets)
	return nil
}

// backupDatabase writes a consistent copy of src to dst while a service
// may be writing to src: VACUUM INTO reads one snapshot, so it neither
// blocks the writer nor copies half a commit, and the copy has no -wal.
// It is written beside dst, checked and fsynced, and only then linked to
// dst, which must not exist, so no half copy ever passes for a backup.
func backupDatabase(ctx context.Context, src, dst string) (pets int64, err error) {
	if _, err := os.Lstat(dst); err == nil {
		return 0, fmt.Errorf("%s already exists; a backup never overwrites a file", dst)
	}
	// Another application's file is refused with nothing written to it.
	if _, err := inspect(src); errors.Is(err, errNotPetstore) {
		return 0, fmt.Errorf("back up %s: %w; use another -db file", src, err)
	} else if err != nil {
		return 0, fmt.Errorf("back up %s: %w", src, err)
	}
	tmp, err := vacuumInto(ctx, src, dst)
	if err != nil {
		return 0, fmt.Errorf("back up %s: %w", src, err)
	}
	defer os.Remove(tmp)
	if pets, err = checkBackup(ctx, tmp); err != nil {
		return 0, err
	}
	// A link, unlike a rename, does not replace a file made at dst meanwhile.
	if err := os.Link(tmp, dst); err != nil {
		return 0, fmt.Errorf("backup file: %w", err)
	}
	return pets, syncPath(filepath.Dir(dst))
}

// checkBackup checks that the copy at path is a whole petstore file, of
// any schema it has deployed, and counts its pets.
func checkBackup(ctx context.Context, path string) (pets int64, err error) {
	if _, err := inspect(path); err != nil {
		return 0, fmt.Errorf("check backup: %w", err)
	}
	db, _ := sql.Open(sqliteDriver, readOnlyDSN(path)) // Open fails only for an unknown driver
	defer db.Close()
	var check string
	if err := db.QueryRowContext(ctx, "SELECT integrity_check, (SELECT count(*) FROM pets) FROM pragma_integrity_check").Scan(&check, &pets); err != nil {
		return 0, fmt.Errorf("check backup: %w", err)
	} else if check != "ok" {
		return 0, fmt.Errorf("check backup: integrity_check says %q", check)
	}
	return pets, nil
}

// restoreDatabase replaces the database at path with the backup at from.
// Copying over a live database corrupts it (SQLite would lay the old
// -wal's pages over the new file), so it takes the service's lock, or
// refuses while a service holds it. It writes a copy beside path, whose
// id sequence it raises to the highest id the file it replaces holds or
// gave out, so that no id a client was given is handed out again; then
// it removes the old -wal and -shm (a stopped service leaves them empty:
// another file's pages must never be laid over the copy) and renames the
// copy over path.
func restoreDatabase(ctx context.Context, from, path string) (pets int64, err error) {
	lock, err := lockFile(path)
	if err != nil {
		return 0, fmt.Errorf("database %s: %w; stop it before restoring", path, err)
	}
	defer lock.Close()
	// Another application's file, or one that is no SQLite file at all, is
	// not replaced; a damaged one of petstore's, the reason to restore, is.
	header := make([]byte, 16)
	if n, _ := io.ReadFull(lock, header); n > 0 && string(header[:n]) != "SQLite format 3\x00" {
		return 0, fmt.Errorf("database %s: not a SQLite database file (one of petstore's damaged in its first bytes must be removed by hand); it is left as it is", path)
	} else if _, err := inspect(path); errors.Is(err, errNotPetstore) {
		return 0, fmt.Errorf("database %s: %w; it is left as it is", path, err)
	}
	// The copy, made and checked as a backup is, beside the database.
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".restoring")
	os.Remove(tmp) // one left by a restore that was stopped
	defer os.Remove(tmp)
	if pets, err = backupDatabase(ctx, from, tmp); err != nil {
		return 0, err
	}
	// The highest id the file replaced holds or gave out, each as far as
	// it can be read: the sequence may survive a damaged table.
	old, _ := sql.Open(sqliteDriver, readOnlyDSN(path))
	var top, seq int64
	old.QueryRowContext(ctx, "SELECT max(id) FROM pets").Scan(&top)
	old.QueryRowContext(ctx, "SELECT seq FROM sqlite_sequence WHERE name = 'pets'").Scan(&seq)
	old.Close()
	top = max(top, seq)
	copied, _ := sql.Open(sqliteDriver, fileURI(tmp)+"?_synchronous=FULL")
	_, err = copied.ExecContext(ctx, `INSERT INTO sqlite_sequence (name, seq) SELECT 'pets', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'pets');
		UPDATE sqlite_sequence SET seq = max(seq, ?1) WHERE name = 'pets';`, top)
	if err = errors.Join(err, copied.Close()); err != nil {
		return 0, fmt.Errorf("raise the copy's id sequence: %w", err)
	}
	for _, companion := range []string{path + "-wal", path + "-shm"} {
		if err := os.Remove(companion); err != nil && !errors.Is(err, os.ErrNotExist) {
			return 0, err
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, err
	}
	return pets, syncPath(filepath.Dir(path))
}

// vacuumInto writes a consistent, self-contained copy of the database at
// src to a new file beside dst, private to the user, and fsyncs it and
// its directory; it returns its path. A copy that fails is removed. src
// is read without the service's DSN, which would make another
// application's file WAL.
func vacuumInto(ctx context.Context, src, dst string) (string, error) {
	f, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".partial-*")
	if err != nil {
		return "", err
	}
	f.Close()
	db, _ := sql.Open(sqliteDriver, readOnlyDSN(src))
	defer db.Close()
	if _, err = db.ExecContext(ctx, "VACUUM INTO ?", f.Name()); err == nil {
		err = errors.Join(syncPath(f.Name()), syncPath(filepath.Dir(dst)))
	}
	if err != nil {
		os.Remove(f.Name())
		os.Remove(f.Name() + "-journal") // VACUUM INTO's own, when it failed
	}
	return f.Name(), err
}

// syncPath fsyncs a file or a directory, so what was written to it, or a
// name added to it, is on stable storage.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
