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

	// 2 -> 3: the status filter reads a covering index, so a page of one
	// status is one range scan of the index instead of a table lookup per
	// pet; it replaces the (status, id) index, which it contains.
	`CREATE INDEX pets_status_cover ON pets (status, id, name, category_id);
	DROP INDEX pets_status_id;`,
}

// petStore keeps the catalogue in one SQLite file. Writes go through a
// single connection owned by one goroutine, which commits concurrent
// creates together (group commit), so writers queue in Go rather than
// fighting over the file lock ("database is locked"); reads use a pool of
// read-only connections that WAL lets run beside the writer.
type petStore struct {
	writer  *sql.DB
	readers *sql.DB

	// Prepared once; database/sql prepares them again on each pooled
	// reader connection the first time it runs them there.
	getStmt, listStmt, listByStatusStmt *sql.Stmt

	// writes feeds the group-commit loop. mu guards closing it: senders
	// hold it shared, close holds it exclusively.
	writes    chan *writeRequest
	mu        sync.RWMutex
	closed    bool
	loopDone  chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// errClosed is returned for writes after close.
var errClosed = errors.New("store is closed")

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
		// database/sql hands a connection to one goroutine at a time, so
		// SQLite's own per-call mutex (FULLMUTEX) only costs time.
		"_mutex=no",
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
	// More readers than cores: a request waiting for a free connection
	// parks and wakes a goroutine, which costs more than an idle
	// connection's few pages of cache.
	n := max(8, 4*runtime.GOMAXPROCS(0))
	readers.SetMaxOpenConns(n)
	readers.SetMaxIdleConns(n)

	s := &petStore{writer: writer, readers: readers,
		writes: make(chan *writeRequest, maxBatch), loopDone: make(chan struct{})}
	fail := func(err error) (*petStore, error) {
		readers.Close()
		writer.Close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	if err := s.migrate(); err != nil {
		return fail(err)
	}
	for _, p := range []struct {
		stmt **sql.Stmt
		sql  string
	}{
		{&s.getStmt, "SELECT id, name, category_id, status FROM pets WHERE id = ?"},
		{&s.listStmt, "SELECT id, name, category_id, status FROM pets WHERE id > ? ORDER BY id LIMIT ?"},
		{&s.listByStatusStmt, "SELECT id, name, category_id, status FROM pets WHERE status = ? AND id > ? ORDER BY id LIMIT ?"},
	} {
		if *p.stmt, err = readers.Prepare(p.sql); err != nil {
			return fail(err)
		}
	}
	w, err := newBatchWriter(writer)
	if err != nil {
		return fail(err)
	}
	go s.writeLoop(w)
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

// close stops the writer loop after the writes already queued, then
// closes both connection pools; later calls return the first call's
// result, so an error path and a deferred close can both call it.
func (s *petStore) close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.writes)
		s.mu.Unlock()
		<-s.loopDone
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

// maxBatch bounds how many creates share one transaction.
const maxBatch = 256

// writeRequest is a create waiting for the writer loop.
type writeRequest struct {
	ctx  context.Context
	req  createRequest
	done chan writeResult // buffered: the loop never blocks on it
}

// writeResult is the writer loop's answer to one writeRequest.
type writeResult struct {
	pet      Pet
	replayed bool
	err      error
}

// createPet stores the pet and returns it with its new id; it returns
// only after the row is committed. With an idempotency key already used
// for the same request it returns the pet that request created and
// replayed true; used for another request, errIdempotencyKeyReused.
func (s *petStore) createPet(ctx context.Context, c createRequest) (Pet, bool, error) {
	w := &writeRequest{ctx: ctx, req: c, done: make(chan writeResult, 1)}
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return Pet{}, false, errClosed
	}
	select {
	case s.writes <- w:
		s.mu.RUnlock()
	case <-ctx.Done():
		s.mu.RUnlock()
		return Pet{}, false, ctx.Err()
	}
	// Once queued, wait for the outcome even if the client has gone: the
	// row may be committed, and the answer must say what happened.
	r := <-w.done
	return r.pet, r.replayed, r.err
}

// writeLoop owns the writer connection. It takes whatever creates are
// queued, up to maxBatch, and commits them in one transaction with one
// fsync. It never waits for company: a lone create is committed at once,
// and creates that arrive meanwhile queue for the next batch, which is
// how batches form under load.
func (s *petStore) writeLoop(w *batchWriter) {
	defer close(s.loopDone)
	defer w.close()
	batch := make([]*writeRequest, 0, maxBatch)
	for first := range s.writes {
		batch = append(batch[:0], first)
	fill:
		for len(batch) < maxBatch {
			select {
			case r, ok := <-s.writes:
				if !ok {
					break fill
				}
				batch = append(batch, r)
			default:
				break fill
			}
		}
		w.commit(batch)
	}
}

// batchWriter runs the group commits on the one writer connection, with
// its statements prepared once.
type batchWriter struct {
	conn            *sql.Conn
	findKey, insert *sql.Stmt
}

func newBatchWriter(db *sql.DB) (*batchWriter, error) {
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	w := &batchWriter{conn: conn}
	if w.findKey, err = conn.PrepareContext(ctx,
		"SELECT id, name, category_id, status, request_fingerprint FROM pets WHERE idempotency_key = ?"); err != nil {
		conn.Close()
		return nil, err
	}
	if w.insert, err = conn.PrepareContext(ctx,
		"INSERT INTO pets (name, category_id, status, idempotency_key, request_fingerprint) VALUES (?, ?, ?, ?, ?)"); err != nil {
		conn.Close()
		return nil, err
	}
	return w, nil
}

func (w *batchWriter) close() {
	w.findKey.Close()
	w.insert.Close()
	w.conn.Close()
}

// commit stores a batch in one transaction and answers every request in
// it. The statements run without the clients' contexts: one client going
// away must not abort the others' transaction.
func (w *batchWriter) commit(batch []*writeRequest) {
	ctx := context.Background()
	results := make([]writeResult, len(batch))
	err := w.inTx(ctx, func() error {
		for i, r := range batch {
			if err := r.ctx.Err(); err != nil {
				results[i].err = err // gone before its turn: not stored
				continue
			}
			p, replayed, err := w.insertPet(ctx, r.req)
			if err != nil && !errors.Is(err, errIdempotencyKeyReused) {
				return err
			}
			results[i] = writeResult{p, replayed, err}
		}
		return nil
	})
	if err != nil && len(batch) > 1 {
		// One bad request must not fail its neighbours: the transaction is
		// rolled back, so commit each on its own and let only the culprit
		// fail.
		for _, r := range batch {
			w.commit([]*writeRequest{r})
		}
		return
	}
	for i, r := range batch {
		if err != nil {
			results[i] = writeResult{err: err}
		}
		r.done <- results[i]
	}
}

// inTx runs fn in an immediate transaction on the writer connection.
func (w *batchWriter) inTx(ctx context.Context, fn func() error) error {
	if _, err := w.conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return err
	}
	if err := fn(); err != nil {
		w.conn.ExecContext(ctx, "ROLLBACK")
		return err
	}
	if _, err := w.conn.ExecContext(ctx, "COMMIT"); err != nil {
		w.conn.ExecContext(ctx, "ROLLBACK")
		return err
	}
	return nil
}

// insertPet does one create inside the batch's transaction. The key lookup
// and the insert share the transaction, so two requests with one key, even
// in the same batch, cannot both insert; the unique index would refuse the
// second anyway.
func (w *batchWriter) insertPet(ctx context.Context, c createRequest) (Pet, bool, error) {
	var key, keyFP any // NULL without an idempotency key
	if c.idempotencyKey != "" {
		fp := c.fingerprint()
		key, keyFP = c.idempotencyKey, fp
		var p Pet
		var storedFP []byte
		err := w.findKey.QueryRowContext(ctx, c.idempotencyKey).
			Scan(&p.ID, &p.Name, &p.CategoryID, &p.Status, &storedFP)
		switch {
		case err == nil && bytes.Equal(storedFP, fp):
			return p, true, nil
		case err == nil:
			return Pet{}, false, errIdempotencyKeyReused
		case !errors.Is(err, sql.ErrNoRows):
			return Pet{}, false, err
		}
	}
	res, err := w.insert.ExecContext(ctx, c.pet.Name, c.pet.CategoryID, c.pet.Status, key, keyFP)
	if err != nil {
		return Pet{}, false, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return Pet{}, false, err
	}
	return Pet{ID: id, Name: c.pet.Name, CategoryID: c.pet.CategoryID, Status: c.pet.Status}, false, nil
}

// petRow is a pet as read from the database. name and status alias the
// driver's buffers and are valid only during the callback that gets the
// row: the handlers encode them straight into the answer, with no copy
// and no allocation per row.
type petRow struct {
	id         int64
	name       sql.RawBytes
	categoryID int64
	status     sql.RawBytes
}

// pet copies a row into a Pet that outlives the callback.
func (r *petRow) pet() Pet {
	return Pet{ID: r.id, Name: string(r.name), CategoryID: r.categoryID, Status: string(r.status)}
}

// getPet calls fn with the pet with the given id, or returns errNotFound.
func (s *petStore) getPet(ctx context.Context, id int64, fn func(*petRow)) error {
	rows, err := s.getStmt.QueryContext(boundedRead(ctx), id)
	if err != nil {
		return err
	}
	n, err := scanRows(rows, fn)
	if err == nil && n == 0 {
		return errNotFound
	}
	return err
}

// petFilter selects a page of the catalogue: pets with an id above after,
// optionally of one status, at most limit of them, in ascending id.
type petFilter struct {
	after  int64
	status string // "" for any status
	limit  int
}

// listPets calls fn with each pet of the page that f selects, in order.
func (s *petStore) listPets(ctx context.Context, f petFilter, fn func(*petRow)) error {
	var rows *sql.Rows
	var err error
	ctx = boundedRead(ctx)
	if f.status == "" {
		rows, err = s.listStmt.QueryContext(ctx, f.after, f.limit)
	} else {
		rows, err = s.listByStatusStmt.QueryContext(ctx, f.status, f.after, f.limit)
	}
	if err != nil {
		return err
	}
	_, err = scanRows(rows, fn)
	return err
}

// boundedRead detaches a read from the request's cancellation. The reads
// are index seeks of at most maxLimit+1 rows and finish in well under a
// millisecond; a cancellable context would cost a watcher goroutine per
// query in database/sql and in the driver, to interrupt nothing. The
// request's values stay available.
func boundedRead(ctx context.Context) context.Context {
	return context.WithoutCancel(ctx)
}

// scanRows calls fn with each row and closes rows; it returns how many
// rows there were.
func scanRows(rows *sql.Rows, fn func(*petRow)) (int, error) {
	defer rows.Close()
	var r petRow
	n := 0
	for rows.Next() {
		if err := rows.Scan(&r.id, &r.name, &r.categoryID, &r.status); err != nil {
			return n, err
		}
		fn(&r)
		n++
	}
	return n, rows.Err()
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
