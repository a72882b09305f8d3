package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mattn/go-sqlite3"
	// also registers the "sqlite3" driver
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

	// 3 -> 4: mark the file as petstore's, so a start on another
	// application's SQLite file is refused instead of adding a table to it.
	fmt.Sprintf("PRAGMA application_id = %d;", petstoreApplicationID),
}

// petstoreApplicationID is PRAGMA application_id of petstore's files:
// "PETS" in ASCII. file(1) and other tools show it too.
const petstoreApplicationID = 0x50455453

// ownTables are the tables a petstore file holds; a file without the
// application id that holds any other table is not petstore's.
var ownTables = []string{"pets", "sqlite_sequence"}

// petStore keeps the catalogue in one SQLite file. Writes go through a
// single connection owned by one goroutine, which commits concurrent
// creates together (group commit), so writers queue in Go rather than
// fighting over the file lock ("database is locked"); reads use a pool of
// read-only connections that WAL lets run beside the writer.
type petStore struct {
	file    *dbFile
	writer  *sql.DB
	readers *sql.DB
	log     *slog.Logger
	faults  *faultLog
	opts    storeOptions

	// damage is why the file is known to be corrupt ("" while it is not):
	// found by the quick_check at start or by a query. It lasts until the
	// file is restored and the service restarted.
	damage atomic.Pointer[string]
	// replaced is set once the path no longer names the opened file; it
	// lasts until restart.
	replaced atomic.Pointer[storageError]
	// commitStart is when the commit in progress began (Unix nanoseconds),
	// 0 between commits: a commit stuck on a frozen filesystem shows in
	// /healthz.
	commitStart atomic.Int64
	// pinging is set while a health check's read runs.
	pinging atomic.Bool
	// viewFailedAt is when the view last failed to load (writer only).
	viewFailedAt time.Time
	// probes asks the writer loop for a write that changes nothing, to
	// learn whether a pet can be stored.
	probes chan chan error

	// view answers lists and gets from memory once it is loaded; until
	// then, and while it is rebuilt, they are read from SQLite.
	view view

	// Prepared once; database/sql prepares them again on each pooled
	// reader connection the first time it runs them there. Nothing in
	// them depends on a bound value for its plan: a bound LIMIT or status
	// would make SQLite re-prepare the statement on every query, since
	// the driver clears the bindings each time. So the page is cut in Go,
	// and each status has its own statement.
	getStmt, listStmt *sql.Stmt
	listByStatusStmts [3]*sql.Stmt

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

// errTimedOut refuses a create whose commit could not begin before its
// deadline; it was not stored.
var errTimedOut = &storageError{kind: faultTimedOut, err: errors.New("the create's deadline passed before its commit began")}

// sqliteDriver is go-sqlite3 with every connection set to keep the -wal
// and -shm files when it closes (the WAL emptied). SQLite deletes them on
// a clean close by default, and then a restart on a full disk fails: a
// new -shm needs 32 KiB. Kept, they let the service start and serve reads
// with no byte free.
const sqliteDriver = "sqlite3-petstore"

func init() {
	sql.Register(sqliteDriver, &sqlite3.SQLiteDriver{
		ConnectHook: func(c *sqlite3.SQLiteConn) error {
			return c.SetFileControlInt("main", sqlite3.SQLITE_FCNTL_PERSIST_WAL, 1)
		},
	})
}

// busyTimeoutMillis is how long a connection waits for a lock another
// process holds before the request gets a 503 "database locked".
const busyTimeoutMillis = 5000

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
		"_busy_timeout=" + strconv.Itoa(busyTimeoutMillis),
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

// storeOptions are the store's settings; the zero value is the default.
type storeOptions struct {
	log *slog.Logger // nil: discard
	// walLimit is the WAL size past which the writer forces a truncating
	// checkpoint; 0 means defaultWALLimit.
	walLimit int64
}

// defaultWALLimit bounds the WAL file on disk (see checkWAL).
const defaultWALLimit = 64 << 20

// openStore opens (creating if needed) the database file at path and brings
// its schema up to date. It writes to the file only when a migration is
// due, so it starts, and serves reads, on a full or read-only disk.
func openStore(path string, opts storeOptions) (*petStore, error) {
	if opts.log == nil {
		opts.log = slog.New(slog.DiscardHandler)
	}
	if opts.walLimit == 0 {
		opts.walLimit = defaultWALLimit
	}
	file, err := openDBFile(path)
	if err != nil {
		return nil, err
	}

	due, err := inspect(path)
	if err != nil {
		file.close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}

	// _txlock=immediate: a write transaction takes the write lock when it
	// begins, so it never has to be retried after reading.
	writer, err := sql.Open(sqliteDriver, sqliteDSN(path, "_txlock=immediate"))
	if err != nil {
		file.close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetConnMaxIdleTime(0)
	writer.SetConnMaxLifetime(0)

	readers, err := sql.Open(sqliteDriver, sqliteDSN(path, "_query_only=on"))
	if err != nil {
		writer.Close()
		file.close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	n := readerConns()
	readers.SetMaxOpenConns(n)
	readers.SetMaxIdleConns(n)

	s := &petStore{file: file, writer: writer, readers: readers, log: opts.log, opts: opts,
		faults: &faultLog{log: opts.log, path: path},
		writes: make(chan *writeRequest, maxBatch), probes: make(chan chan error),
		loopDone: make(chan struct{})}
	fail := func(err error) (*petStore, error) {
		readers.Close()
		writer.Close()
		file.close()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	if due {
		if err := s.migrate(); err != nil {
			return fail(err)
		}
	}
	for _, p := range []struct {
		stmt **sql.Stmt
		sql  string
	}{
		{&s.getStmt, "SELECT id, name, category_id, status FROM pets WHERE id = ?"},
		{&s.listStmt, "SELECT id, name, category_id, status FROM pets WHERE id > ? ORDER BY id"},
		{&s.listByStatusStmts[0], "SELECT id, name, category_id, status FROM pets WHERE status = 'available' AND id > ? ORDER BY id"},
		{&s.listByStatusStmts[1], "SELECT id, name, category_id, status FROM pets WHERE status = 'pending' AND id > ? ORDER BY id"},
		{&s.listByStatusStmts[2], "SELECT id, name, category_id, status FROM pets WHERE status = 'sold' AND id > ? ORDER BY id"},
	} {
		if *p.stmt, err = readers.Prepare(p.sql); err != nil {
			return fail(err)
		}
	}
	if err := openAll(readers, n); err != nil {
		return fail(err)
	}
	w, err := newBatchWriter(writer)
	if err != nil {
		return fail(err)
	}
	go s.writeLoop(w)
	go s.quickCheck()
	return s, nil
}

// readerConns is the size of the reader pool. More readers than cores: a
// request waiting for a free connection parks and wakes a goroutine,
// which costs more than an idle connection's few pages of cache.
func readerConns() int { return max(8, 4*runtime.GOMAXPROCS(0)) }

// openAll opens all n connections of a pool at start, and keeps them
// (database/sql closes idle ones only past SetMaxIdleConns, which is n):
// a pool that opened connections on demand would fail requests once the
// process had run out of descriptors.
func openAll(db *sql.DB, n int) error {
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range cap(conns) {
		c, err := db.Conn(context.Background())
		if err != nil {
			return err
		}
		// A read opens the -wal file too, which a connection keeps.
		var n int
		if err := c.QueryRowContext(context.Background(), "SELECT count(*) FROM sqlite_schema").Scan(&n); err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// inspect reads whose file this is and whether a migration is due. A
// SQLite file of another application is refused, so a wrong -db cannot
// add a table to it. It reads through a read-only connection of its own,
// without the service's DSN, which would switch a refused file to WAL.
func inspect(path string) (migrationDue bool, err error) {
	ctx := context.Background()
	db, err := sql.Open("sqlite3", "file:"+(&url.URL{Path: path}).EscapedPath()+"?mode=ro")
	if err != nil {
		return false, err
	}
	defer db.Close()
	var appID, version int64
	if err := db.QueryRowContext(ctx, "PRAGMA application_id").Scan(&appID); err != nil {
		return false, err
	}
	if err := db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return false, err
	}
	if appID != petstoreApplicationID && appID != 0 {
		return false, fmt.Errorf("not a petstore database: it belongs to another application (SQLite application_id %#x); use another -db file", appID)
	}
	if appID == 0 {
		rows, err := db.QueryContext(ctx, "SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
		if err != nil {
			return false, err
		}
		var foreign []string
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				rows.Close()
				return false, err
			}
			if version == 0 || !slices.Contains(ownTables, name) {
				foreign = append(foreign, name)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return false, err
		}
		if len(foreign) > 0 {
			return false, fmt.Errorf("not a petstore database: it holds tables petstore did not make (%s); use another -db file", strings.Join(foreign, ", "))
		}
	}
	if version > int64(len(migrations)) {
		return false, fmt.Errorf("schema version %d is newer than this build understands (%d); use a newer petstore", version, len(migrations))
	}
	return version < int64(len(migrations)), nil
}

// quickCheck runs PRAGMA quick_check once, in the background so a large
// file does not delay the start; damage it finds shows in /healthz.
func (s *petStore) quickCheck() {
	var result string
	err := s.readers.QueryRowContext(context.Background(), "PRAGMA quick_check(1)").Scan(&result)
	if err != nil {
		if kind, ok := classifyFault(err); ok && kind == faultDamaged {
			s.markDamaged(err.Error())
		}
		return
	}
	if result != "ok" {
		s.markDamaged("quick_check: " + result)
	}
}

// markDamaged records that the file is corrupt, and tells the operator
// what to do, once.
func (s *petStore) markDamaged(why string) {
	if s.damage.CompareAndSwap(nil, &why) {
		s.log.Error("database file is damaged: stop the service, move the file and its -wal and -shm aside, and restore the latest backup (README: Backups and restore)",
			"db", s.file.path, "damage", why)
	}
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
		s.view.published.Store(nil) // a closed store answers nothing
		// The lock's descriptor goes last: closing it releases SQLite's
		// POSIX locks on the file too.
		s.closeErr = errors.Join(s.readers.Close(), s.writer.Close())
		s.file.close()
	})
	return s.closeErr
}

// health returns nil while the store can both read and store a pet, and
// otherwise the failing check as a storageError. It is cheap enough to
// poll every second: a stat, a statfs and one read; it writes only when
// the disk looks full or read-only, or a fault is in force.
func (s *petStore) health(ctx context.Context) error {
	if r := s.replaced.Load(); r != nil {
		return r
	}
	if d := s.damage.Load(); d != nil {
		return &storageError{kind: faultDamaged, err: errors.New(*d)}
	}
	if err := s.file.checkStillThere(); err != nil {
		s.markReplaced(err)
		return asStorageError(err)
	}
	if start := s.commitStart.Load(); start != 0 && time.Since(time.Unix(0, start)) > stuckCommit {
		return &storageError{kind: faultNotAnswering, err: fmt.Errorf("a commit has been waiting on the storage for %s", time.Since(time.Unix(0, start)).Round(time.Second))}
	}
	if err := s.ping(ctx); err != nil {
		if se := s.readFault(err); se != nil {
			return se
		}
		s.faults.failed(faultNotAnswering, err, 0)
		return &storageError{kind: faultNotAnswering, err: err}
	}
	if fault := s.faults.current(); fault != nil {
		return fault // the writer loop probes every second until it clears
	}
	if s.file.looksUnwritable() {
		return asStorageError(s.probe(ctx))
	}
	return nil
}

// ping runs one read, and waits for it no longer than ctx allows. On a
// frozen filesystem a read blocks in the kernel (SQLite writes to the -shm
// mapping), where no context reaches, so the read runs in a goroutine of
// its own; while one is stuck, the next ping fails at once instead of
// stacking up another.
func (s *petStore) ping(ctx context.Context) error {
	if !s.pinging.CompareAndSwap(false, true) {
		return &storageError{kind: faultNotAnswering, err: errors.New("an earlier read has not finished")}
	}
	done := make(chan error, 1)
	go func() {
		defer s.pinging.Store(false)
		var one int
		done <- s.readers.QueryRowContext(context.Background(), "SELECT 1 FROM sqlite_schema LIMIT 1").Scan(&one)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return &storageError{kind: faultNotAnswering, err: errors.New("a read did not finish in time")}
	}
}

// stuckCommit is how long a commit may wait on the storage before
// /healthz says the database is not answering.
const stuckCommit = 5 * time.Second

// probe asks the writer loop for a write that changes nothing, and
// returns its outcome.
func (s *petStore) probe(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case s.probes <- done:
	case <-s.loopDone:
		return errClosed
	case <-ctx.Done():
		return &storageError{kind: faultNotAnswering, err: errors.New("the writer is busy")}
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return &storageError{kind: faultNotAnswering, err: errors.New("a test write did not finish in time")}
	}
}

// markReplaced records, once, that the path no longer names the opened
// file, and tells the operator what to do. It reports whether err was
// such a replacement.
func (s *petStore) markReplaced(err error) bool {
	var se *storageError
	if !errors.As(err, &se) || se.kind != faultReplaced {
		return false
	}
	if s.replaced.CompareAndSwap(nil, se) {
		s.log.Error("the database file was deleted or replaced under the running service: creates are refused from now on; "+
			"restart the service to open the file now at the path, or restore it from a backup (README: Backups and restore)",
			"db", s.file.path, "err", se.err.Error())
	}
	return true
}

// readFault classifies a read error: damage is recorded, another storage
// fault goes to the fault log, and either comes back as a storageError
// for a 503; nil for other errors.
func (s *petStore) readFault(err error) *storageError {
	kind, ok := s.classify(err)
	if !ok {
		return nil
	}
	if kind == faultDamaged {
		s.markDamaged(err.Error())
	} else {
		s.faults.failed(kind, err, 1)
	}
	return &storageError{kind: kind, err: err}
}

// classify is classifyFault in the light of the fault in force: pages
// read back from failing storage can look corrupt, and while an I/O fault
// is in force that is put down to it, not recorded as damage to the file.
func (s *petStore) classify(err error) (faultKind, bool) {
	kind, ok := classifyFault(err)
	if kind == faultDamaged {
		if f := s.faults.current(); f != nil && f.kind == faultIO {
			return faultIO, true
		}
	}
	return kind, ok
}

// readError is err from a read, as a storageError when the storage is at
// fault.
func (s *petStore) readError(err error) error {
	if err == nil {
		return nil
	}
	if se := s.readFault(err); se != nil {
		return se
	}
	return err
}

// createRequest is one create: the pet and, when the client sent one, its
// Idempotency-Key with a fingerprint of what it asked for.
type createRequest struct {
	pet            NewPet
	idempotencyKey string // "" when the client sent none
	// deadline is when the client must have its answer; a create whose
	// commit has not begun by then is not stored. Zero: none.
	deadline time.Time
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
	// state settles a race at the deadline: the writer takes a request
	// (pending to taken) before its transaction begins, or the waiting
	// handler gives it up (pending to abandoned), never both.
	state atomic.Int32
}

const (
	requestPending int32 = iota
	requestTaken
	requestAbandoned
)

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
	default:
		// The queue is full: wait, but not past the deadline.
		var expired <-chan time.Time
		if !c.deadline.IsZero() {
			timer := time.NewTimer(time.Until(c.deadline))
			defer timer.Stop()
			expired = timer.C
		}
		select {
		case s.writes <- w:
			s.mu.RUnlock()
		case <-ctx.Done():
			s.mu.RUnlock()
			return Pet{}, false, ctx.Err()
		case <-expired:
			s.mu.RUnlock()
			return Pet{}, false, errTimedOut
		}
	}
	// Once queued, wait for the outcome even if the client has gone: the
	// row may be committed, and the answer must say what happened. At the
	// deadline, a create the writer has not taken yet is given up, and so
	// never stored; one it has taken is answered within the deadline
	// (its lock wait is bounded by it) or, if its commit is slow, late.
	var expired <-chan time.Time
	if !c.deadline.IsZero() {
		timer := time.NewTimer(time.Until(c.deadline))
		defer timer.Stop()
		expired = timer.C
	}
	select {
	case r := <-w.done:
		return r.pet, r.replayed, r.err
	case <-expired:
		if w.state.CompareAndSwap(requestPending, requestAbandoned) {
			return Pet{}, false, errTimedOut
		}
		r := <-w.done
		return r.pet, r.replayed, r.err
	}
}

// writeLoop owns the writer connection. It takes whatever creates are
// queued, up to maxBatch, and commits them in one transaction with one
// fsync. It never waits for company: a lone create is committed at once,
// and creates that arrive meanwhile queue for the next batch, which is
// how batches form under load. Once a second it also bounds the WAL and,
// while a storage fault is in force, tries a write to see it clear.
func (s *petStore) writeLoop(w *batchWriter) {
	defer close(s.loopDone)
	defer func() { w.close() }()
	// The view is loaded here, by the writer, so that no commit can fall
	// between reading the table and extending the view. Reads go to
	// SQLite until it is ready, so a large file answers at once.
	s.loadView(w)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	watch := time.NewTicker(externalWriteCheck)
	defer watch.Stop()
	batch := make([]*writeRequest, 0, maxBatch)
	for {
		select {
		case first, ok := <-s.writes:
			if !ok {
				return
			}
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
			s.commit(w, batch)
		case done := <-s.probes:
			done <- s.probeWrite(&w)
		case <-watch.C:
			if w.externalWrite() || s.view.master == nil && s.viewRetry() {
				s.loadView(w)
			}
		case <-tick.C:
			if s.faults.current() != nil || s.replaced.Load() != nil {
				s.probeWrite(&w)
			}
			w.checkWAL(s.file.path+"-wal", s.opts.walLimit)
		}
	}
}

// externalWriteCheck is how often the writer asks SQLite whether another
// process wrote to the file, to rebuild the view.
const externalWriteCheck = 250 * time.Millisecond

// loadView (re)builds the in-memory view from the file. If it cannot be
// built, reads are served from SQLite, and it is tried again later.
func (s *petStore) loadView(w *batchWriter) {
	start := time.Now()
	if err := s.view.load(context.Background(), w.conn); err != nil {
		s.viewFailedAt = time.Now()
		if kind, ok := s.classify(err); ok && kind == faultDamaged {
			s.markDamaged(err.Error())
		}
		s.log.Warn("lists and gets are read from SQLite: the in-memory view could not be loaded", "err", err.Error(), "db", s.file.path)
		return
	}
	w.externalWrite() // what was loaded is the state seen
	c := s.view.published.Load()
	s.view.limitMemory()
	s.log.Info("in-memory view loaded", "pets", len(c.ids), "bytes", c.bytes(),
		"took", time.Since(start).Round(time.Millisecond).String())
}

// viewRetry reports whether a view that failed to load should be tried
// again: not more often than every 10 s.
func (s *petStore) viewRetry() bool {
	return time.Since(s.viewFailedAt) > 10*time.Second
}

// commit stores a batch and answers every request in it. Before and after
// the commit it checks that the path still names the opened file: a 201
// is never sent for a pet that a restart would not find. A storage fault
// refuses the whole batch with a storageError and is logged once, by the
// fault log, not per request.
func (s *petStore) commit(w *batchWriter, batch []*writeRequest) {
	refuse := func(err error) {
		kind, _ := classifyFault(err)
		if kind != faultReplaced && kind != faultDamaged {
			s.faults.failed(kind, err, len(batch))
		}
		for _, r := range batch {
			r.done <- writeResult{err: err}
		}
	}
	if err := s.checkFile(w); err != nil {
		refuse(err)
		return
	}
	if d := s.damage.Load(); d != nil {
		refuse(&storageError{kind: faultDamaged, err: errors.New(*d)})
		return
	}
	s.commitStart.Store(time.Now().UnixNano())
	results, err := w.commit(batch)
	s.commitStart.Store(0)
	if err == nil {
		if err := s.checkFile(w); err != nil {
			// Committed, but to a file no longer at the path.
			refuse(err)
			return
		}
		s.faults.succeeded()
		// The view learns of the new pets before their clients do, so a
		// client reads its own writes.
		added := make([]Pet, 0, len(batch))
		for _, r := range results {
			if r.err == nil && !r.replayed {
				added = append(added, r.pet)
			}
		}
		if !s.view.add(added) && s.viewRetry() {
			s.loadView(w)
		}
		for i, r := range batch {
			r.done <- results[i]
		}
		return
	}
	if kind, ok := s.classify(err); ok {
		if kind == faultDamaged {
			s.markDamaged(err.Error())
		}
		refuse(&storageError{kind: kind, err: err})
		return
	}
	if len(batch) > 1 {
		// One bad request must not fail its neighbours: the transaction is
		// rolled back, so commit each on its own and let only the culprit
		// fail.
		for _, r := range batch {
			s.commit(w, []*writeRequest{r})
		}
		return
	}
	batch[0].done <- writeResult{err: err}
}

// checkFile returns an error once the path no longer names the opened
// file. The first time, the writer empties the WAL, which is still this
// file's: left with frames, it could be paired with the new file at the
// next start and corrupt it.
func (s *petStore) checkFile(w *batchWriter) error {
	if s.replaced.Load() == nil {
		if err := s.file.checkStillThere(); err != nil {
			if !s.markReplaced(err) {
				return err // not a replacement: stat itself failed
			}
		}
	}
	r := s.replaced.Load()
	if r == nil {
		return nil
	}
	if !w.walEmptied {
		w.conn.ExecContext(context.Background(), "PRAGMA wal_checkpoint(TRUNCATE)")
		w.walEmptied = true
	}
	return r
}

// probeWrite rewrites the schema version with the value it has: a real
// write and fsync that changes nothing, to learn whether a pet could be
// stored now. During a read-only fault the writer connection is replaced
// first, so the store recovers once the file can be written again.
func (s *petStore) probeWrite(w **batchWriter) error {
	if err := s.checkFile(*w); err != nil {
		return err
	}
	if f := s.faults.current(); f != nil && f.kind == faultReadOnly {
		if fresh, err := (*w).reopen(s.writer); err == nil {
			*w = fresh
		}
	}
	// A probe does not wait for a lock another process holds: that would
	// hold up the creates queued behind it.
	ctx := context.Background()
	(*w).setBusyTimeout(0)
	s.commitStart.Store(time.Now().UnixNano())
	err := (*w).inTx(ctx, func() error {
		_, err := (*w).conn.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", len(migrations)))
		return err
	})
	s.commitStart.Store(0)
	if err != nil {
		kind, ok := s.classify(err)
		if !ok {
			return err
		}
		s.faults.failed(kind, err, 0)
		return &storageError{kind: kind, err: err}
	}
	s.faults.succeeded()
	s.file.readOnly.Store(false)
	return nil
}

// batchWriter runs the group commits on the one writer connection, with
// its statements prepared once.
type batchWriter struct {
	conn                      *sql.Conn
	findKey, insert           *sql.Stmt
	beginTx, commitTx, rollTx *sql.Stmt
	walEmptied                bool          // after the file was replaced
	dataVersion               int64         // PRAGMA data_version when last asked
	busyTimeout               time.Duration // the connection's busy_timeout now
}

func newBatchWriter(db *sql.DB) (*batchWriter, error) {
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	w := &batchWriter{conn: conn, busyTimeout: busyTimeoutMillis * time.Millisecond}
	// After a checkpoint has emptied the WAL, the next commit truncates
	// the file to this size, so a WAL that grew once does not keep its
	// size on disk for ever. Only this connection writes.
	if _, err = conn.ExecContext(ctx, fmt.Sprintf("PRAGMA journal_size_limit = %d", defaultWALLimit)); err != nil {
		conn.Close()
		return nil, err
	}
	// Every statement the writer runs per create is prepared once, the
	// transaction's own included: parsing BEGIN and COMMIT each time costs
	// the writer as much as an insert.
	for _, st := range []struct {
		stmt **sql.Stmt
		text string
	}{
		{&w.findKey, "SELECT id, name, category_id, status, request_fingerprint FROM pets WHERE idempotency_key = ?"},
		{&w.insert, "INSERT INTO pets (name, category_id, status, idempotency_key, request_fingerprint) VALUES (?, ?, ?, ?, ?)"},
		{&w.beginTx, "BEGIN IMMEDIATE"},
		{&w.commitTx, "COMMIT"},
		{&w.rollTx, "ROLLBACK"},
	} {
		if *st.stmt, err = conn.PrepareContext(ctx, st.text); err != nil {
			w.close()
			return nil, err
		}
	}
	return w, nil
}

func (w *batchWriter) close() {
	w.closeStatements()
	w.conn.Close()
}

func (w *batchWriter) closeStatements() {
	for _, stmt := range []*sql.Stmt{w.findKey, w.insert, w.beginTx, w.commitTx, w.rollTx} {
		if stmt != nil {
			stmt.Close()
		}
	}
}

// setBusyTimeout sets how long the writer waits for a lock another
// process holds. It is remembered, so the same setting is not sent to
// SQLite again on every commit.
func (w *batchWriter) setBusyTimeout(d time.Duration) {
	if d == w.busyTimeout {
		return
	}
	w.busyTimeout = d
	if _, err := w.conn.ExecContext(context.Background(), fmt.Sprintf("PRAGMA busy_timeout = %d", d.Milliseconds())); err != nil {
		w.busyTimeout = -1 // unknown: set it again next time
	}
}

// externalWrite reports whether another connection has committed to the
// file since the last call. PRAGMA data_version on the writer's own
// connection changes only for commits made by others: an operator's
// sqlite3 shell, a restore, another process.
func (w *batchWriter) externalWrite() bool {
	var v int64
	if err := w.conn.QueryRowContext(context.Background(), "PRAGMA data_version").Scan(&v); err != nil {
		return false
	}
	changed := w.dataVersion != 0 && v != w.dataVersion
	w.dataVersion = v
	return changed
}

// reopen replaces the writer connection with a new one, and discards
// the old one only once the new one is ready. A connection that SQLite
// opened read-only, because the file could not then be written, stays
// read-only: a new one sees that the file can be written again.
func (w *batchWriter) reopen(db *sql.DB) (*batchWriter, error) {
	db.SetMaxOpenConns(2)
	defer db.SetMaxOpenConns(1)
	fresh, err := newBatchWriter(db)
	if err != nil {
		return nil, err
	}
	w.closeStatements()
	w.conn.Raw(func(any) error { return driver.ErrBadConn }) // not back to the pool
	w.conn.Close()
	return fresh, nil
}

// checkWAL bounds the WAL on disk. SQLite's automatic checkpoints are
// passive: while a reader holds an old snapshot they cannot reach the end
// of the WAL, which then grows with every commit and keeps its size. Once
// a second, a WAL over limit gets a TRUNCATE checkpoint that does not
// wait: if a reader still holds it back, it is tried again a second
// later, and once the reader has let go the WAL shrinks to nothing.
func (w *batchWriter) checkWAL(walPath string, limit int64) {
	fi, err := os.Stat(walPath)
	if err != nil || fi.Size() <= limit {
		return
	}
	// A busy timeout would stall every create behind a long reader.
	w.setBusyTimeout(0)
	w.conn.ExecContext(context.Background(), "PRAGMA wal_checkpoint(TRUNCATE)")
}

// commit stores a batch in one transaction and returns each request's
// result, or the error that rolled the transaction back. The statements
// run without the clients' contexts: one client going away must not abort
// the others' transaction.
func (w *batchWriter) commit(batch []*writeRequest) ([]writeResult, error) {
	ctx := context.Background()
	results := make([]writeResult, len(batch))
	now := time.Now()
	// No lock wait may outlast the soonest deadline in the batch: a create
	// answered after its client's write timeout would be stored behind
	// the client's back.
	wait := time.Duration(busyTimeoutMillis) * time.Millisecond
	for i, r := range batch {
		if !r.state.CompareAndSwap(requestPending, requestTaken) {
			results[i].err = errTimedOut // its handler gave up: not stored
			continue
		}
		if d := r.req.deadline; !d.IsZero() {
			if !d.After(now) {
				results[i].err = errTimedOut
				continue
			}
			wait = min(wait, d.Sub(now))
		}
	}
	// Rounded down to a tenth of a second, so that under load, with
	// deadlines alike, the setting rarely changes from batch to batch.
	if wait >= 100*time.Millisecond {
		wait = wait.Truncate(100 * time.Millisecond)
	}
	w.setBusyTimeout(wait)
	err := w.inTx(ctx, func() error {
		for i, r := range batch {
			if results[i].err != nil {
				continue // past its deadline: not stored
			}
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
	return results, err
}

// inTx runs fn in an immediate transaction on the writer connection.
func (w *batchWriter) inTx(ctx context.Context, fn func() error) error {
	if _, err := w.beginTx.ExecContext(ctx); err != nil {
		return err
	}
	if err := fn(); err != nil {
		w.rollTx.ExecContext(ctx)
		return err
	}
	if _, err := w.commitTx.ExecContext(ctx); err != nil {
		w.rollTx.ExecContext(ctx)
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
	if c := s.view.published.Load(); c != nil {
		if !c.get(id, fn) {
			return errNotFound
		}
		return nil
	}
	return s.getPetFromSQLite(ctx, id, fn)
}

// getPetFromSQLite is getPet read from the file.
func (s *petStore) getPetFromSQLite(ctx context.Context, id int64, fn func(*petRow)) error {
	rows, err := s.getStmt.QueryContext(boundedRead(ctx), id)
	if err != nil {
		return s.readError(err)
	}
	n, err := scanRows(rows, 1, fn)
	if err == nil && n == 0 {
		return errNotFound
	}
	return s.readError(err)
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
	if c := s.view.published.Load(); c != nil {
		c.list(f, fn)
		return nil
	}
	return s.listPetsFromSQLite(ctx, f, fn)
}

// listPetsFromSQLite is listPets read from the file.
func (s *petStore) listPetsFromSQLite(ctx context.Context, f petFilter, fn func(*petRow)) error {
	stmt := s.listStmt
	if f.status != "" {
		stmt = s.listByStatusStmts[statusIndex(f.status)]
	}
	rows, err := stmt.QueryContext(boundedRead(ctx), f.after)
	if err != nil {
		return s.readError(err)
	}
	_, err = scanRows(rows, f.limit, fn)
	return s.readError(err)
}

// boundedRead detaches a read from the request's cancellation. The reads
// are index seeks of at most maxLimit+1 rows and finish in well under a
// millisecond; a cancellable context would cost a watcher goroutine per
// query in database/sql and in the driver, to interrupt nothing. The
// request's values stay available.
func boundedRead(ctx context.Context) context.Context {
	return context.WithoutCancel(ctx)
}

// scanRows calls fn with each row, up to limit of them, and closes rows;
// it returns how many rows there were.
func scanRows(rows *sql.Rows, limit int, fn func(*petRow)) (int, error) {
	defer rows.Close()
	var r petRow
	n := 0
	for n < limit && rows.Next() {
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
	// Created empty and private here; VACUUM INTO fills an empty file.
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".partial-*")
	if err != nil {
		return 0, fmt.Errorf("backup file: %w", err)
	}
	tmpPath := tmp.Name()
	tmp.Close()
	defer func() {
		os.Remove(tmpPath)
		os.Remove(tmpPath + "-journal")
	}()

	db, err := sql.Open(sqliteDriver, sqliteDSN(src))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, "VACUUM INTO ?", tmpPath); err != nil {
		return 0, fmt.Errorf("back up %s: %w", src, err)
	}
	if pets, err = checkBackup(ctx, tmpPath); err != nil {
		return 0, err
	}
	if err := syncPath(tmpPath); err != nil {
		return 0, fmt.Errorf("backup file: %w", err)
	}
	// A link, unlike a rename, refuses to replace a file that appeared at
	// dst meanwhile.
	if err := os.Link(tmpPath, dst); err != nil {
		return 0, fmt.Errorf("backup file: %w", err)
	}
	if err := syncPath(filepath.Dir(dst)); err != nil {
		return 0, fmt.Errorf("backup file: %w", err)
	}
	return pets, nil
}

// checkBackup checks a copy before it is called a backup, and counts its
// pets. It opens the copy read-only and without our DSN options, which
// would turn it into a WAL database with -wal and -shm files beside it.
func checkBackup(ctx context.Context, path string) (pets int64, err error) {
	out, err := sql.Open("sqlite3", "file:"+(&url.URL{Path: path}).EscapedPath()+"?mode=ro")
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
