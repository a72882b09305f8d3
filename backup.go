// The database file at rest: whose it is, its lock, and the backup and
// restore commands. petstore-backup.timer schedules and prunes backups.

package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// fileURI is path as an escaped "file:" URI.
func fileURI(path string) string { return "file:" + (&url.URL{Path: path}).EscapedPath() }

// readOnlyDSN opens path read-only, without the options that would switch
// a foreign file to WAL. Without a -wal, the file is opened as immutable,
// so that no -wal or -shm is made beside it.
func readOnlyDSN(path string) string {
	if _, err := os.Stat(path + "-wal"); errors.Is(err, os.ErrNotExist) {
		return fileURI(path) + "?mode=ro&immutable=1"
	}
	return fileURI(path) + "?mode=ro&_busy_timeout=5000"
}

// checkNotEmptied refuses a database file that is missing or empty while
// its -wal holds data, because SQLite, even read-only, would then delete
// the -wal, and with it every pet committed since the last checkpoint.
func checkNotEmptied(path string) error {
	db, dbErr := os.Stat(path)
	wal, walErr := os.Stat(path + "-wal")
	if walErr == nil && wal.Size() > 0 && (dbErr != nil || db.Size() == 0) {
		return &storageError{faultDamaged, errors.New("the file is missing or empty while its -wal holds data; put back the file that was moved or emptied")}
	}
	return nil
}

// lockFile opens the file at path, creating it private to the user, and
// holds an exclusive flock on it, so that a second service on the file
// refuses to start. A file that cannot be written is opened to read.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		if f, err = os.Open(path); err != nil {
			return nil, err
		}
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errors.New("it is in use by another petstore process; run one service per database file")
		}
		return nil, err
	}
	return f, nil
}

// inspect reads whose file this is, and its schema version. Another
// application's SQLite file is refused, so that a wrong -db cannot add a
// table to it. Files of schemas 1 to 3 have no application_id: such a
// file is petstore's if it holds only petstore's tables, or none at
// version 0.
func inspect(path string) (version int, err error) {
	if err := checkNotEmptied(path); err != nil {
		return 0, err
	}
	db, _ := sql.Open(sqliteDriver, readOnlyDSN(path))
	defer db.Close()
	var appID int64
	var foreign string
	err = db.QueryRow(`SELECT application_id, user_version, (SELECT coalesce(group_concat(name, ', '), '') FROM sqlite_schema
		WHERE type IN ('table', 'view') AND (user_version = 0 OR name NOT IN ('pets', 'sqlite_sequence')))
		FROM pragma_application_id, pragma_user_version`).Scan(&appID, &version, &foreign)
	switch {
	case err != nil:
		return 0, err
	case appID != petstoreApplicationID && appID != 0:
		return 0, fmt.Errorf("%w: it belongs to another application (SQLite application_id %#x)", errNotPetstore, appID)
	case appID == 0 && foreign != "":
		return 0, fmt.Errorf("%w: it holds tables petstore did not make (%s)", errNotPetstore, foreign)
	case version > len(migrations):
		return 0, fmt.Errorf("schema version %d is newer than this build understands (%d); use a newer petstore", version, len(migrations))
	}
	return version, nil
}

// runBackupCommand is "petstore backup [-db FILE] BACKUP-FILE" and
// "petstore restore -from BACKUP [-db FILE] [-last-id N]".
func runBackupCommand(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	usage := map[string]string{
		"backup":  "petstore backup [-db FILE] BACKUP-FILE\n\nWrites a consistent, checked copy of the database, also while the service runs.",
		"restore": "petstore restore -from BACKUP [-db FILE] [-last-id N]\n\nReplaces the database with a checked backup, while no service holds it.",
	}[args[0]]
	fs := flag.NewFlagSet("petstore "+args[0], flag.ContinueOnError)
	db := fs.String("db", "petstore.db", "SQLite database `file`")
	from := fs.String("from", "", "restore: the backup `file` to put back, as petstore backup wrote it")
	lastID := fs.Int64("last-id", -1, "restore: the highest `id` the replaced file held or gave out, when it cannot be read from it")
	if err := parseArgs(fs, args[1:], getenv, stdout, usage); err != nil {
		return err
	}
	var pets int64
	var err error
	var done string
	switch {
	case args[0] == "backup" && fs.NArg() == 1 && *from == "":
		pets, err = backupDatabase(ctx, *db, fs.Arg(0))
		done = "backed up " + *db + " to " + fs.Arg(0)
	case args[0] == "restore" && fs.NArg() == 0 && *from != "":
		pets, err = restoreDatabase(ctx, *from, *db, *lastID)
		done = "restored " + *from + " to " + *db
	default:
		return fmt.Errorf("%s: name the files as the usage says, flags first: %s", args[0], strings.Split(usage, "\n")[0])
	}
	if err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	fmt.Fprintf(stdout, "%s: %d pets, integrity ok\n", done, pets)
	return nil
}

// backupDatabase writes a consistent copy of src to dst, also while a
// service writes to src, because VACUUM INTO reads one snapshot. The copy
// is written beside dst, checked and fsynced, and only then linked to
// dst, so that no half copy passes for a backup. It counts the pets.
func backupDatabase(ctx context.Context, src, dst string) (pets int64, err error) {
	if err := checkNotEmptied(src); err != nil {
		return 0, fmt.Errorf("back up %s: %w", src, err)
	}
	f, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".partial-*")
	if err != nil {
		return 0, err
	}
	f.Close()
	defer os.Remove(f.Name())
	defer os.Remove(f.Name() + "-journal") // VACUUM INTO's own, when it failed
	db, _ := sql.Open(sqliteDriver, readOnlyDSN(src))
	_, err = db.ExecContext(ctx, "VACUUM INTO ?", f.Name())
	db.Close()
	if err != nil {
		return 0, fmt.Errorf("back up %s: %w", src, err)
	}
	if _, err := inspect(f.Name()); err != nil {
		return 0, fmt.Errorf("check backup: %w", err)
	}
	copied, _ := sql.Open(sqliteDriver, readOnlyDSN(f.Name()))
	var check string
	err = copied.QueryRowContext(ctx, "SELECT integrity_check, (SELECT count(*) FROM pets) FROM pragma_integrity_check").Scan(&check, &pets)
	copied.Close()
	if err == nil && check != "ok" {
		err = fmt.Errorf("integrity_check says %q", check)
	}
	if err != nil {
		return 0, fmt.Errorf("check backup: %w", err)
	}
	// A link, unlike a rename, never replaces a file.
	if err := errors.Join(syncPath(f.Name()), os.Link(f.Name(), dst)); errors.Is(err, os.ErrExist) {
		return 0, fmt.Errorf("%s already exists; a backup never overwrites a file", dst)
	} else if err != nil {
		return 0, fmt.Errorf("backup file: %w", err)
	}
	return pets, syncPath(filepath.Dir(dst))
}

// restoreDatabase replaces the database at path, which no service may
// hold, with a checked copy of from. It raises the copy's id sequence to
// the highest id the old file holds or gave out, so that no id is given
// twice; lastID gives that id when it cannot be read. The copy keeps the
// old file's owner, group and mode.
func restoreDatabase(ctx context.Context, from, path string, lastID int64) (pets int64, err error) {
	lock, err := lockFile(path)
	if err != nil {
		return 0, fmt.Errorf("database %s: %w; stop it before restoring", path, err)
	}
	defer lock.Close()
	info, err := lock.Stat()
	if err != nil {
		return 0, err
	}
	if _, err := inspect(path); errors.Is(err, errNotPetstore) && lastID < 0 {
		return 0, fmt.Errorf("database %s: %w; it is left as it is (if it is petstore's, damaged, give -last-id)", path, err)
	}
	top, err := highestID(ctx, path)
	if err != nil && lastID < 0 {
		return 0, fmt.Errorf("database %s: the highest id it holds or gave out cannot be read (%v), so a restore could give a client's id to another pet; it is left as it is. "+
			"Find that id (sqlite3 %s .recover, or your clients' records) and run restore again with -last-id ID", path, err, path)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".restoring")
	// A copy left by a restore that was stopped holds the id it raised to,
	// which the old file may have lost since with its -wal.
	left, _ := highestID(ctx, tmp)
	top = max(top, lastID, left)
	os.Remove(tmp)
	defer os.Remove(tmp)
	if pets, err = backupDatabase(ctx, from, tmp); err != nil {
		return 0, err
	}
	copied, _ := sql.Open(sqliteDriver, fileURI(tmp)+"?_synchronous=FULL")
	_, err = copied.ExecContext(ctx, `INSERT INTO sqlite_sequence (name, seq) SELECT 'pets', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'pets');
		UPDATE sqlite_sequence SET seq = max(seq, ?1) WHERE name = 'pets';`, top)
	if err = errors.Join(err, copied.Close()); err != nil {
		return 0, fmt.Errorf("raise the copy's id sequence: %w", err)
	}
	owner := info.Sys().(*syscall.Stat_t)
	if err := errors.Join(os.Chown(tmp, int(owner.Uid), int(owner.Gid)), os.Chmod(tmp, info.Mode().Perm())); err != nil {
		return 0, fmt.Errorf("give the copy the owner and mode of %s: %w", path, err)
	}
	// The old -wal's pages must not be laid over the copy.
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

// highestID reads the highest id that the file at path holds or gave
// out. An empty file has given out none.
func highestID(ctx context.Context, path string) (top int64, err error) {
	info, err := os.Stat(path)
	if err != nil {
		return 0, err
	} else if info.Size() == 0 {
		return 0, checkNotEmptied(path)
	}
	db, _ := sql.Open(sqliteDriver, readOnlyDSN(path))
	defer db.Close()
	err = db.QueryRowContext(ctx, `SELECT max(coalesce((SELECT max(id) FROM pets), 0), coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'pets'), 0))`).Scan(&top)
	return top, err
}

// syncPath fsyncs a file or a directory.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
