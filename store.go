package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"

	_ "github.com/mattn/go-sqlite3" // registers the "sqlite3" driver
)

// errNotFound is returned by the store when no pet has the requested id.
var errNotFound = errors.New("not found")

// migrations[i] moves a database from schema version i to i+1. The version
// lives in PRAGMA user_version, so a newer binary can upgrade a store's
// existing file in place and an older binary refuses a file it cannot read.
var migrations = []string{
	// 0 -> 1: the catalogue. AUTOINCREMENT so an id is never handed out
	// twice, even if rows are ever removed by hand. STRICT and the CHECKs
	// keep the file valid even if it is written by something other than
	// this service. The (status, id) index serves the status filter in id
	// order without a sort.
	`CREATE TABLE pets (
		id          INTEGER PRIMARY KEY AUTOINCREMENT,
		name        TEXT    NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
		category_id INTEGER NOT NULL CHECK (category_id >= 1),
		status      TEXT    NOT NULL CHECK (status IN ('available', 'pending', 'sold'))
	) STRICT;
	CREATE INDEX pets_status_id ON pets (status, id);`,
}

// petStore keeps the catalogue in one SQLite file. Writes go through a
// single connection, so writers queue in Go rather than fighting over the
// file lock ("database is locked"); reads use a pool of read-only
// connections that WAL lets run beside the writer.
type petStore struct {
	writer  *sql.DB
	readers *sql.DB

	closeOnce sync.Once
	closeErr  error
}

// sqliteDSN builds a go-sqlite3 DSN. Options are DSN parameters, not a
// one-off db.Exec("PRAGMA ..."), because the driver applies them to every
// connection it opens, and database/sql opens connections at will.
func sqliteDSN(path string, extra ...string) string {
	params := []string{
		// WAL lets readers run while the writer commits, and a commit is
		// one append to the log instead of a rewrite of pages.
		"_journal_mode=WAL",
		// A backup or an operator's sqlite3 shell may hold the lock for a
		// moment; wait for it instead of failing the request.
		"_busy_timeout=5000",
		// No foreign keys today, but a later schema version may add a
		// category table; the setting must already be on for every
		// connection when it does.
		"_foreign_keys=on",
		// FULL: a commit is on stable storage (WAL fsynced) before it
		// returns, so a 201 survives a power loss, not only a crash.
		"_synchronous=FULL",
	}
	params = append(params, extra...)
	// The "file:" form lets SQLite read the path as a URI, so the path is
	// escaped: a '?' or '#' in a file name must not start the options.
	return "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + strings.Join(params, "&")
}

// openStore opens (creating if needed) the database file at path and brings
// its schema up to date.
func openStore(path string) (*petStore, error) {
	// Create the file ourselves so it is private to the service's user:
	// SQLite would create it with the umask's mode. SQLite gives the -wal
	// and -shm files the same mode as the database file.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	f.Close()

	// _txlock=immediate: a write transaction takes the write lock when it
	// begins, so it never has to be retried after reading.
	writer, err := sql.Open("sqlite3", sqliteDSN(path, "_txlock=immediate"))
	if err != nil {
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetConnMaxIdleTime(0)
	writer.SetConnMaxLifetime(0)

	readers, err := sql.Open("sqlite3", sqliteDSN(path, "_query_only=on"))
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	n := max(4, 2*runtime.GOMAXPROCS(0))
	readers.SetMaxOpenConns(n)
	readers.SetMaxIdleConns(n)

	s := &petStore{writer: writer, readers: readers}
	if err := s.migrate(); err != nil {
		s.close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	return s, nil
}

// migrate applies the migrations the file has not seen yet, all in one
// transaction, so a failed upgrade leaves the file as it was.
func (s *petStore) migrate() (err error) {
	ctx := context.Background()
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback()
		}
	}()
	var version int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return err
	}
	if version > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this build understands (%d); use a newer petstore", version, len(migrations))
	}
	for i := version; i < len(migrations); i++ {
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			return fmt.Errorf("migrate schema to version %d: %w", i+1, err)
		}
	}
	// PRAGMA does not take bound parameters; the value is our own integer.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", len(migrations))); err != nil {
		return err
	}
	return tx.Commit()
}

// close closes both connection pools; later calls return the first
// call's result, so an error path and a deferred close can both call it.
func (s *petStore) close() error {
	s.closeOnce.Do(func() {
		s.closeErr = errors.Join(s.readers.Close(), s.writer.Close())
	})
	return s.closeErr
}

// ping checks that the database answers a query.
func (s *petStore) ping(ctx context.Context) error {
	var one int
	return s.readers.QueryRowContext(ctx, "SELECT 1 FROM sqlite_schema LIMIT 1").Scan(&one)
}

// createPet stores p and returns it with its new id. It returns only after
// the row is committed.
func (s *petStore) createPet(ctx context.Context, p NewPet) (Pet, error) {
	res, err := s.writer.ExecContext(ctx,
		"INSERT INTO pets (name, category_id, status) VALUES (?, ?, ?)",
		p.Name, p.CategoryID, p.Status)
	if err != nil {
		return Pet{}, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return Pet{}, err
	}
	return Pet{ID: id, Name: p.Name, CategoryID: p.CategoryID, Status: p.Status}, nil
}

// getPet returns the pet with the given id, or errNotFound.
func (s *petStore) getPet(ctx context.Context, id int64) (Pet, error) {
	var p Pet
	err := s.readers.QueryRowContext(ctx,
		"SELECT id, name, category_id, status FROM pets WHERE id = ?", id).
		Scan(&p.ID, &p.Name, &p.CategoryID, &p.Status)
	if errors.Is(err, sql.ErrNoRows) {
		return Pet{}, errNotFound
	}
	return p, err
}

// petFilter selects a page of the catalogue: pets with an id above after,
// optionally of one status, at most limit of them, in ascending id.
type petFilter struct {
	after  int64
	status string // "" for any status
	limit  int
}

// listPets returns the page that f selects.
func (s *petStore) listPets(ctx context.Context, f petFilter) ([]Pet, error) {
	var rows *sql.Rows
	var err error
	if f.status == "" {
		rows, err = s.readers.QueryContext(ctx,
			"SELECT id, name, category_id, status FROM pets WHERE id > ? ORDER BY id LIMIT ?",
			f.after, f.limit)
	} else {
		rows, err = s.readers.QueryContext(ctx,
			"SELECT id, name, category_id, status FROM pets WHERE status = ? AND id > ? ORDER BY id LIMIT ?",
			f.status, f.after, f.limit)
	}
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	pets := make([]Pet, 0, f.limit)
	for rows.Next() {
		var p Pet
		if err := rows.Scan(&p.ID, &p.Name, &p.CategoryID, &p.Status); err != nil {
			return nil, err
		}
		pets = append(pets, p)
	}
	return pets, rows.Err()
}
