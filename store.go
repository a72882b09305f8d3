package main

import (
	"bytes"
	"context"
	"crypto/sha256"
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

var (
	// errNotFound: no pet has the requested id.
	errNotFound = errors.New("not found")
	// errIdempotencyKeyReused: the Idempotency-Key already created a pet
	// from a different request.
	errIdempotencyKeyReused = errors.New("idempotency key reused with a different request")
)

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

	// 1 -> 2: Idempotency-Key. The key and a fingerprint of the request
	// live in the pet's own row, so they commit with it: a retry after a
	// crash finds exactly the pets that were acknowledged. Partial unique
	// index: most rows have no key and cost nothing in it.
	`ALTER TABLE pets ADD COLUMN idempotency_key TEXT;
	ALTER TABLE pets ADD COLUMN request_fingerprint BLOB;
	CREATE UNIQUE INDEX pets_idempotency_key ON pets (idempotency_key)
		WHERE idempotency_key IS NOT NULL;`,
}

// petStore keeps the catalogue in one SQLite file. Writes go through a
// single connection, so writers queue in Go rather than fighting over the
// file lock ("database is locked"); reads use a pool of read-only
// connections that WAL lets run beside the writer.
type petStore struct {
	path    string
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

	s := &petStore{path: path, writer: writer, readers: readers}
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

// createRequest is one create: the pet and, when the client sent one, its
// Idempotency-Key with a fingerprint of what it asked for.
type createRequest struct {
	pet            NewPet
	idempotencyKey string // "" when the client sent none
}

// fingerprint identifies what a create asks for, after defaults: two
// bodies that would store the same pet have the same fingerprint. NUL
// cannot occur in a valid name, so the fields cannot run together.
func (c createRequest) fingerprint() []byte {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%s", c.pet.Name, c.pet.CategoryID, c.pet.Status))
	return sum[:]
}

// createPet stores the pet and returns it with its new id; it returns
// only after the row is committed. With an idempotency key already used
// for the same request it returns the pet that request created and
// replayed true; used for another request, errIdempotencyKeyReused.
func (s *petStore) createPet(ctx context.Context, c createRequest) (p Pet, replayed bool, err error) {
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return Pet{}, false, err
	}
	defer tx.Rollback()
	p, replayed, err = insertPet(ctx, tx, c)
	if err != nil {
		return Pet{}, false, err
	}
	if err := tx.Commit(); err != nil {
		return Pet{}, false, err
	}
	return p, replayed, nil
}

// insertPet does createPet's work inside tx. The lookup and the insert
// share the write transaction, so two requests with one key cannot both
// insert; the unique index would refuse the second anyway.
func insertPet(ctx context.Context, tx *sql.Tx, c createRequest) (Pet, bool, error) {
	fp := c.fingerprint()
	if c.idempotencyKey != "" {
		var p Pet
		var storedFP []byte
		err := tx.QueryRowContext(ctx,
			"SELECT id, name, category_id, status, request_fingerprint FROM pets WHERE idempotency_key = ?",
			c.idempotencyKey).Scan(&p.ID, &p.Name, &p.CategoryID, &p.Status, &storedFP)
		switch {
		case err == nil && bytes.Equal(storedFP, fp):
			return p, true, nil
		case err == nil:
			return Pet{}, false, errIdempotencyKeyReused
		case !errors.Is(err, sql.ErrNoRows):
			return Pet{}, false, err
		}
	}
	var key, keyFP any // NULL without an idempotency key
	if c.idempotencyKey != "" {
		key, keyFP = c.idempotencyKey, fp
	}
	res, err := tx.ExecContext(ctx,
		"INSERT INTO pets (name, category_id, status, idempotency_key, request_fingerprint) VALUES (?, ?, ?, ?, ?)",
		c.pet.Name, c.pet.CategoryID, c.pet.Status, key, keyFP)
	if err != nil {
		return Pet{}, false, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return Pet{}, false, err
	}
	return Pet{ID: id, Name: c.pet.Name, CategoryID: c.pet.CategoryID, Status: c.pet.Status}, false, nil
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
	pets := make([]Pet, 0, min(f.limit, maxLimit+1))
	for rows.Next() {
		var p Pet
		if err := rows.Scan(&p.ID, &p.Name, &p.CategoryID, &p.Status); err != nil {
			return nil, err
		}
		pets = append(pets, p)
	}
	return pets, rows.Err()
}

// backupDatabase writes a consistent copy of the database file src to dst
// while the service may be writing to src. VACUUM INTO reads one snapshot
// (a WAL read transaction) and so neither blocks the writer nor copies a
// half-committed state; the copy is compacted and self-contained (no
// -wal file). dst must not exist. It returns how many pets the copy holds.
func backupDatabase(ctx context.Context, src, dst string) (pets int64, err error) {
	if _, err := os.Stat(src); err != nil {
		return 0, fmt.Errorf("database to back up: %w", err)
	}
	// Created empty and private here; VACUUM INTO fills an empty file.
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fmt.Errorf("backup file: %w", err)
	}
	f.Close()
	defer func() {
		if err != nil {
			os.Remove(dst)
		}
	}()

	db, err := sql.Open("sqlite3", sqliteDSN(src))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", dst); err != nil {
		return 0, fmt.Errorf("back up %s: %w", src, err)
	}

	// Check the copy before calling it a backup.
	// Read-only and without our DSN options, which would turn the copy
	// into a WAL database with -wal and -shm files beside it.
	out, err := sql.Open("sqlite3", "file:"+(&url.URL{Path: dst}).EscapedPath()+"?mode=ro")
	if err != nil {
		return 0, err
	}
	defer out.Close()
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
