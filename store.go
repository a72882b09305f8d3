// The store: one SQLite file, its schema and migrations, its one
// connection, and the reads. Creates go through the writer (writer.go);
// lists and gets are answered from the in-memory view, at the end of this
// file.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// The catalogue's own terms, which the API and the storage both speak.

// NewPet is a pet to be stored: the body of a create.
type NewPet struct {
	Name       string `json:"name"`
	CategoryID int64  `json:"categoryId"`
	Status     string `json:"status"`
}

// Pet is a stored animal: a NewPet with the id the store assigned.
type Pet struct {
	ID         int64  `json:"id"`
	Name       string `json:"name"`
	CategoryID int64  `json:"categoryId"`
	Status     string `json:"status"`
}

const (
	// maxNameLength is counted in characters (Unicode code points).
	maxNameLength = 100
	// defaultStatus is what an omitted status is stored as.
	defaultStatus = "available"
)

// petStatuses is the PetStatus enumeration, in the specification's order.
var petStatuses = []string{"available", "pending", "sold"}

var (
	// errNotFound: no pet has the requested id.
	errNotFound = errors.New("not found")
	// errIdempotencyKeyReused: the Idempotency-Key already created a pet
	// from a different request.
	errIdempotencyKeyReused = errors.New("idempotency key reused with a different request")
	// errNotPetstore: the file is another application's, and is left
	// untouched.
	errNotPetstore = errors.New("not a petstore database")
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

	// 4 -> 5: count the changes to pets, so the service tells appends
	// from any other change made from outside (an operator's sqlite3, a
	// restore) whatever else shares the file: PRAGMA data_version moves
	// for a commit to any table, and Litestream keeps tables of its own
	// here. Triggers count every row inserted, and every row updated or
	// deleted, by anyone; the writer counts its own inserts (see view).
	`CREATE TABLE pets_changes (
		id       INTEGER PRIMARY KEY CHECK (id = 1),
		inserted INTEGER NOT NULL,
		changed  INTEGER NOT NULL
	) STRICT;
	INSERT INTO pets_changes VALUES (1, (SELECT count(*) FROM pets), 0);
	CREATE TRIGGER pets_inserted AFTER INSERT ON pets
		BEGIN UPDATE pets_changes SET inserted = inserted + 1; END;
	CREATE TRIGGER pets_updated AFTER UPDATE ON pets
		BEGIN UPDATE pets_changes SET changed = changed + 1; END;
	CREATE TRIGGER pets_deleted AFTER DELETE ON pets
		BEGIN UPDATE pets_changes SET changed = changed + 1; END;
	-- INSERT OR REPLACE deletes the row it replaces without firing delete
	-- triggers (recursive_triggers is off by default): count it here.
	CREATE TRIGGER pets_replacing BEFORE INSERT ON pets
		WHEN EXISTS (SELECT 1 FROM pets WHERE id = NEW.id)
			OR (NEW.idempotency_key IS NOT NULL
				AND EXISTS (SELECT 1 FROM pets WHERE idempotency_key = NEW.idempotency_key))
		BEGIN UPDATE pets_changes SET changed = changed + 1; END;`,

	// 5 -> 6: an Idempotency-Key belongs to the API key that sent it, as
	// in Stripe's API and the IETF draft: two clients that both number
	// their orders must not get each other's pets. The scope is a digest
	// derived from the API key's (idempotencyScope), never the key. Rows
	// from before this version have no scope, and match no request: which
	// client sent them is not known, and replaying one to another client
	// is the loss this prevents (a retry that spans the upgrade makes a
	// second pet instead).
	`ALTER TABLE pets ADD COLUMN idempotency_scope BLOB;
	DROP INDEX pets_idempotency_key;
	CREATE UNIQUE INDEX pets_idempotency_key ON pets (idempotency_scope, idempotency_key)
		WHERE idempotency_key IS NOT NULL AND idempotency_scope IS NOT NULL;
	DROP TRIGGER pets_replacing;
	CREATE TRIGGER pets_replacing BEFORE INSERT ON pets
		WHEN EXISTS (SELECT 1 FROM pets WHERE id = NEW.id)
			OR (NEW.idempotency_key IS NOT NULL AND NEW.idempotency_scope IS NOT NULL
				AND EXISTS (SELECT 1 FROM pets WHERE idempotency_scope = NEW.idempotency_scope
					AND idempotency_key = NEW.idempotency_key))
		BEGIN UPDATE pets_changes SET changed = changed + 1; END;`,

	// 6 -> 7: lists and gets are answered from the in-memory view, never
	// from the file, so the status index only cost every insert the write
	// of a second b-tree holding the name.
	`DROP INDEX IF EXISTS pets_status_cover;`,

	// 7 -> 8: deletes are counted apart from updates, so that the rows
	// the file should hold are known (inserted - deleted), and pets lost
	// with no delete recorded are found (see petsMissing). Rows missing
	// at the upgrade cannot be told apart: they count as deleted. A row
	// that INSERT OR REPLACE removes fires no delete trigger: the BEFORE
	// INSERT trigger counts it, as it counts the change. It cannot tell
	// INSERT OR IGNORE, which removes nothing, and counts one delete too
	// many for it (docs/operations.md: Pets missing from the file).
	`ALTER TABLE pets_changes ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0;
	UPDATE pets_changes SET deleted = inserted - (SELECT count(*) FROM pets);
	DROP TRIGGER pets_deleted;
	CREATE TRIGGER pets_deleted AFTER DELETE ON pets
		BEGIN UPDATE pets_changes SET changed = changed + 1, deleted = deleted + 1; END;
	DROP TRIGGER pets_replacing;
	CREATE TRIGGER pets_replacing BEFORE INSERT ON pets
		WHEN EXISTS (SELECT 1 FROM pets WHERE id = NEW.id)
			OR (NEW.idempotency_key IS NOT NULL AND NEW.idempotency_scope IS NOT NULL
				AND EXISTS (SELECT 1 FROM pets WHERE idempotency_scope = NEW.idempotency_scope
					AND idempotency_key = NEW.idempotency_key))
		BEGIN UPDATE pets_changes SET changed = changed + 1, deleted = deleted + 1; END;`,
}

// topIDQuery is the highest id the file holds or has handed out
// (AUTOINCREMENT keeps the latter in sqlite_sequence).
const topIDQuery = `SELECT max(coalesce((SELECT max(id) FROM pets), 0),
	coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'pets'), 0))`

// petstoreApplicationID is PRAGMA application_id of petstore's files:
// "PETS" in ASCII. file(1) and other tools show it too.
const petstoreApplicationID = 0x50455453

// petStore keeps the catalogue in one SQLite file. Writes go through a
// single connection owned by one goroutine, which commits concurrent
// creates together (group commit), so writers queue in Go rather than
// fighting over the file lock ("database is locked"); reads are answered
// from the in-memory view (below).
type petStore struct {
	file   *dbFile
	writer *sql.DB // one connection, owned by the writer loop
	log    *slog.Logger

	view  view       // lists and gets from memory (below)
	queue writeQueue // creates on their way to the writer (writer.go)

	// What is wrong with the storage (faults.go): a fault that lasts until
	// a restart, the passing fault in force, and when the commit under way
	// began (0 between commits).
	lasting atomic.Pointer[storageError]
	// savedInPlace: after the -wal or -shm vanished, the database at its
	// path came to hold every pet (see checkpointInPlace). Writer loop only.
	savedInPlace bool
	faults       faultLog
	commitStart  atomic.Int64

	// The count check (countLoop): countsShort is set when the file held
	// fewer rows than its counts; stopCount ends the loop, which closes
	// counted.
	countsShort        atomic.Bool
	stopCount, counted chan struct{}
	// ready is closed once the writer loop's start-up work is done (see
	// startUp).
	ready chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// busyTimeoutMillis is how long a connection waits for a lock another
// process holds before the request is refused as "database locked".
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
	return fileURI(path) + "?" + strings.Join(params, "&")
}

// fileURI is path in the "file:" form that lets SQLite read it as a URI,
// escaped: a '?' or '#' in a file name must not start the options.
func fileURI(path string) string {
	return "file:" + (&url.URL{Path: path}).EscapedPath()
}

// readOnlyDSN opens path for reading only, with SQLite's defaults (not
// the service's DSN, which would switch a rollback-journal file to WAL
// and create a -wal and -shm beside it), waiting out a lock as the
// service does.
func readOnlyDSN(path string) string {
	return fileURI(path) + "?mode=ro&_busy_timeout=" + strconv.Itoa(busyTimeoutMillis)
}

// firstLookDSN is readOnlyDSN for a file not yet known to be petstore's:
// where no -wal is beside it, immutable, so that SQLite creates no -wal
// and -shm beside a WAL-mode file of another application either.
func firstLookDSN(path string) string {
	if _, err := os.Stat(path + "-wal"); errors.Is(err, os.ErrNotExist) {
		return readOnlyDSN(path) + "&immutable=1"
	}
	return readOnlyDSN(path)
}

// openStore opens (creating if needed) the database file at path and brings
// its schema up to date. It writes to the file only when a migration is
// due, so it starts, and serves reads, on a full or read-only disk.
func openStore(path string, log *slog.Logger) (*petStore, error) {
	file, err := openDBFile(path)
	if err != nil {
		return nil, err
	}
	var writer *sql.DB
	fail := func(err error) (*petStore, error) {
		if writer != nil {
			writer.Close()
		}
		file.close()
		if _, isSQLite := sqliteFault(err); file.readOnly.Load() && isSQLite {
			// SQLite's own message ("unable to open database file",
			// "attempt to write a readonly database") does not say that
			// opening the file needs a write.
			err = fmt.Errorf("the database file or its filesystem is read-only, and to open it SQLite must write "+
				"(switch a rollback-journal file to WAL, or create the -wal and -shm of a WAL file) (%v): "+
				"make it writable, or start once where it is (a clean stop keeps the -wal and -shm files, and then a read-only start serves reads)", err)
		}
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	due, err := inspect(path)
	if err != nil {
		return fail(err)
	}
	file.openAcked()
	// _txlock=immediate: a write transaction takes the write lock when it
	// begins, so it never has to be retried after reading.
	if writer, err = sql.Open(sqliteDriver, sqliteDSN(path, "_txlock=immediate")); err != nil {
		return fail(err)
	}
	writer.SetMaxOpenConns(1) // never closed for idling or age: database/sql's defaults

	s := &petStore{file: file, writer: writer, log: log,
		queue:     writeQueue{writes: make(chan *writeRequest, maxBatch), loopDone: make(chan struct{})},
		faults:    faultLog{log: log, path: file.path},
		stopCount: make(chan struct{}), counted: make(chan struct{}), ready: make(chan struct{})}
	if due {
		s.storageFault(quickCheck(writer)) // before the migration's writes
		if s.lasting.Load() == nil {
			if err := s.migrate(); err != nil {
				return fail(err)
			}
		}
	}
	w, err := newBatchWriter(writer)
	if f := s.lasting.Load(); err != nil && f != nil && f.kind == faultDamaged {
		// A damaged file can fail even to prepare a statement (a schema
		// page lost): what quick_check found is the cause to name.
		err = fmt.Errorf("%s (then: %v); restore the Litestream replica or the latest backup (docs/operations.md: Backups and restore)",
			strings.ReplaceAll(f.Error(), "\n", "; "), err)
	}
	if err != nil {
		return fail(err)
	}
	// The read opens the -wal and -shm files too, which are then watched.
	if s.view.highWater, err = w.topID(); err != nil {
		w.close()
		return fail(err)
	}
	file.noteOpened()
	counter, err := sql.Open("sqlite3", readOnlyDSN(file.path))
	if err != nil {
		w.close()
		return fail(err)
	}
	// A file damaged while the service was down is found before the
	// first write; quick_check reads every page, so it runs on a
	// connection of its own while the view loads (at 1,000,000 pets each
	// takes about a second).
	checked := make(chan error, 1)
	if due {
		checked <- nil // checked before the migration
	} else {
		go func() { checked <- quickCheck(counter) }()
	}
	go s.writeLoop(w, checked)
	go s.countLoop(counter)
	return s, nil
}

// startUp is the writer loop's first work, done while the service
// already answers: at 1,000,000 pets it takes about a second, and
// meanwhile the health check says "starting", reads wait for the view and
// creates queue. It loads the view, takes quick_check's verdict, checks
// what the service had acknowledged, and, on storage that looks full or
// read-only, tries a write, so that the health check is true from its first "ok".
func (s *petStore) startUp(w *batchWriter, checked <-chan error) *batchWriter {
	defer close(s.ready)
	// In a read transaction: a snapshot that takes no lock.
	w.tx(context.Background(), w.beginRead, func() error {
		s.load(w, "start")
		return nil
	})
	if err := s.storageFault(<-checked); err != nil && s.lasting.Load() == nil {
		// A passing cause (a lock held for longer than the busy timeout):
		// the file goes unchecked until the next start, and the log says
		// so.
		s.log.Warn("quick_check could not run at start: the database file was not checked for damage", "err", err.Error(), "db", s.file.path)
	}
	s.checkAcked(w)
	if s.storageDoubtful() {
		s.probeWrite(&w)
	}
	return w
}

// inspect reads whose file this is and whether a migration is due. A
// SQLite file of another application is refused, so a wrong -db cannot
// add a table to it. It reads through a read-only connection of its own,
// without the service's DSN, which would switch a refused file to WAL.
func inspect(path string) (migrationDue bool, err error) {
	ctx := context.Background()
	db, err := sql.Open("sqlite3", firstLookDSN(path))
	if err != nil {
		return false, err
	}
	defer db.Close()
	var appID, version int64
	if err := db.QueryRowContext(ctx, "SELECT * FROM pragma_application_id, pragma_user_version").Scan(&appID, &version); err != nil {
		return false, err
	}
	if appID != petstoreApplicationID && appID != 0 {
		return false, fmt.Errorf("%w: it belongs to another application (SQLite application_id %#x)", errNotPetstore, appID)
	}
	if appID == 0 {
		// An unmarked file is an earlier petstore's only if it holds
		// petstore's tables alone, and a file of version 0 holds none.
		var foreign string
		if err := db.QueryRowContext(ctx, `SELECT coalesce(group_concat(name, ', '), '') FROM (SELECT name FROM sqlite_schema
			WHERE type IN ('table', 'view') AND (? = 0 OR name NOT IN ('pets', 'pets_changes', 'sqlite_sequence')) ORDER BY name)`, version).Scan(&foreign); err != nil {
			return false, err
		}
		if foreign != "" {
			return false, fmt.Errorf("%w: it holds tables petstore did not make (%s)", errNotPetstore, foreign)
		}
		// An earlier petstore's file, unmarked: its pets table must be the
		// one that version made, or the migrations would change (and
		// first switch to WAL, or mark as petstore's) another
		// application's file.
		if version >= 1 && version < int64(len(migrations)) {
			want := "id, name, category_id, status"
			if version >= 2 {
				want += ", idempotency_key, request_fingerprint"
			}
			var got string
			if err := db.QueryRowContext(ctx, "SELECT coalesce(group_concat(name, ', '), '') FROM (SELECT name FROM pragma_table_info('pets') ORDER BY cid)").Scan(&got); err != nil {
				return false, err
			}
			if got != want {
				return false, fmt.Errorf("%w: its pets table has the columns (%s), not petstore's (%s)", errNotPetstore, got, want)
			}
		}
	}
	if version > int64(len(migrations)) {
		return false, fmt.Errorf("schema version %d is newer than this build understands (%d); use a newer petstore", version, len(migrations))
	}
	return version < int64(len(migrations)), nil
}

// migrate applies the migrations the file has not seen yet, all in one
// transaction, so a failed upgrade leaves the file as it was.
func (s *petStore) migrate() error {
	ctx := context.Background()
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // after Commit, a no-op
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
		s.queue.mu.Lock()
		s.queue.closed = true
		close(s.queue.writes)
		s.queue.mu.Unlock()
		<-s.queue.loopDone
		close(s.stopCount)
		<-s.counted
		s.view.published.Store(nil) // a closed store answers nothing
		// After an I/O error the files are not closed through SQLite,
		// whose last close checkpoints: the process's exit lets go, and
		// the next start recovers from the -wal (see storageFault).
		if f := s.lasting.Load(); f == nil || f.kind != faultIO {
			s.closeErr = s.writer.Close()
		}
		// The lock's descriptor goes last: closing it releases SQLite's
		// POSIX locks on the file too.
		s.file.close()
	})
	return s.closeErr
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

// catalogue is the view readers use, or why there is none: the lasting
// fault that keeps it from loading, or a fault that passes.
func (s *petStore) catalogue() (*catalogue, error) {
	if c := s.view.published.Load(); c != nil {
		return c, nil
	}
	<-s.ready // the view is loaded at start (see startUp)
	if c := s.view.published.Load(); c != nil {
		return c, nil
	}
	if f := s.lasting.Load(); f != nil {
		return nil, f
	}
	return nil, &storageError{kind: faultNotAnswering, err: errors.New("the catalogue is not loaded")}
}

// getPet calls fn with the pet with the given id, or returns errNotFound.
func (s *petStore) getPet(id int64, fn func(*petRow)) error {
	c, err := s.catalogue()
	if err != nil {
		return err
	}
	if c.get(id, fn) {
		return nil
	}
	// A file that cannot be read whole (an I/O error, damage), or that
	// lost pets it held, may hold the pet it did not give: that is no
	// answer to give as "not found".
	if f := s.lasting.Load(); f != nil && (f.kind == faultIO || f.kind == faultDamaged || f.kind >= faultWentBack) {
		return f
	}
	return errNotFound
}

// petFilter selects a page of the catalogue: pets with an id above after,
// optionally of one status, at most limit of them, in ascending id.
type petFilter struct {
	after  int64
	status string // "" for any status
	limit  int
}

// listPets calls fn with each pet of the page that f selects, in order.
func (s *petStore) listPets(f petFilter, fn func(*petRow)) error {
	c, err := s.catalogue()
	if err != nil {
		return err
	}
	c.list(f, fn)
	return nil
}

// The in-memory view: lists and gets are answered from memory, at memory
// speed, while SQLite stays the durable store and the view's source.
//
// Pets never change once stored (no update, no delete) and one writer in
// this process commits every create, so an exact copy is cheap to keep:
// an append-only columnar catalogue that the writer extends after each
// commit, before any client hears of it, and publishes to readers as an
// immutable snapshot through one atomic pointer. Readers never wait on the
// writer. A write from outside the process (an operator's sqlite3 shell, a
// restore) is seen through a change count that triggers keep (see
// catchUp), and the view is loaded again.

// catalogue is the view as published: readers use the slices up to their
// lengths, which never change for a published catalogue; the writer only
// appends beyond them, or starts new arrays.
type catalogue struct {
	ids        []int64 // ascending, not necessarily dense
	categories []int64
	nameEnds   []uint32 // name i is names[nameEnds[i-1]:nameEnds[i]]
	names      []byte
	statuses   []uint8    // index into petStatuses
	byStatus   [3][]int32 // positions of each status's pets, ascending
}

// statusBytes are the status names, as the encoder takes them.
var statusBytes = [3][]byte{[]byte(petStatuses[0]), []byte(petStatuses[1]), []byte(petStatuses[2])}

// row fills r with the pet at position i; r's slices alias the
// catalogue, which never changes, so they stay valid.
func (c *catalogue) row(i int, r *petRow) {
	start := uint32(0)
	if i > 0 {
		start = c.nameEnds[i-1]
	}
	r.id = c.ids[i]
	r.name = c.names[start:c.nameEnds[i]]
	r.categoryID = c.categories[i]
	r.status = statusBytes[c.statuses[i]]
}

// get calls fn with the pet with the given id, and reports whether there
// is one. Ids are dense unless rows were deleted by hand, so the guess
// id-1 is tried before a binary search.
func (c *catalogue) get(id int64, fn func(*petRow)) bool {
	i := int(id - 1)
	if id < 1 || i >= len(c.ids) || c.ids[i] != id {
		i = sort.Search(len(c.ids), func(k int) bool { return c.ids[k] >= id })
		if i == len(c.ids) || c.ids[i] != id {
			return false
		}
	}
	var r petRow
	c.row(i, &r)
	fn(&r)
	return true
}

// list calls fn with each pet of the page that f selects, in id order:
// at most f.limit pets with an id above f.after, of f.status if set. The
// status filter walks that status's own positions,
// not the whole list.
func (c *catalogue) list(f petFilter, fn func(*petRow)) {
	n, at := len(c.ids), func(k int) int { return k }
	if f.status != "" {
		positions := c.byStatus[slices.Index(petStatuses, f.status)]
		n, at = len(positions), func(k int) int { return int(positions[k]) }
	}
	start := sort.Search(n, func(k int) bool { return c.ids[at(k)] > f.after })
	var r petRow
	for k := start; k < min(n, start+f.limit); k++ {
		c.row(at(k), &r)
		fn(&r)
	}
}

// add appends one pet. It reports false if the pet's id is not above the
// last one, which only a write from outside could cause: the view must
// then be rebuilt.
func (c *catalogue) add(id int64, name []byte, category int64, status int) bool {
	if n := len(c.ids); n > 0 && id <= c.ids[n-1] {
		return false
	}
	c.byStatus[status] = append(c.byStatus[status], int32(len(c.ids)))
	c.ids = append(c.ids, id)
	c.categories = append(c.categories, category)
	c.names = append(c.names, name...)
	c.nameEnds = append(c.nameEnds, uint32(len(c.names)))
	c.statuses = append(c.statuses, uint8(status))
	return true
}

// changeCount is the pets_changes row, kept by triggers on pets: how many
// rows were ever inserted, how many updated or deleted, and how many
// deleted, by anyone. Unlike PRAGMA data_version, it moves only for the
// pets table, not for the tables Litestream or an operator's tool keep in
// the same file.
type changeCount struct{ inserted, changed, deleted int64 }

const changeCountQuery = "SELECT inserted, changed, deleted FROM pets_changes"

// view is the writer's side of the in-memory catalogue. Every field but
// published belongs to the writer loop.
type view struct {
	// published is what readers use; nil until a load has worked, and
	// after one failed: reads are then refused, never given a view known to be
	// behind the file.
	published atomic.Pointer[catalogue]
	// master is the writer's copy, appended to and then published as a
	// new snapshot; nil when published is.
	master *catalogue
	// known is the change count that master reflects: the file has
	// changed under it when the count in the file differs, after the
	// writer's own inserts are counted.
	known    changeCount
	loads    int       // loads so far, the first included, for the log
	failedAt time.Time // when a load last failed; tried again 10 s on

	// highWater is the highest id the file has held while the service
	// ran: at start, or acknowledged since. A file whose ids no longer
	// reach it went back (see checkWentBack).
	highWater int64
}

// publish makes the master's current state what readers see.
func (v *view) publish() {
	snapshot := *v.master
	v.published.Store(&snapshot)
}

// loadCatalogue reads the whole table, with the change count it
// reflects, through the writer's connection. It runs inside a
// transaction, so no commit falls between the two. A row it cannot
// read means the file is damaged: there is then no view, and lists and
// gets are refused until the file is restored.
func loadCatalogue(ctx context.Context, q *sql.Conn) (*catalogue, changeCount, error) {
	var known changeCount
	if err := q.QueryRowContext(ctx, changeCountQuery).Scan(&known.inserted, &known.changed, &known.deleted); err != nil {
		return nil, known, err
	}
	// Sized for every row ever inserted (no count(*): on a damaged file
	// it fails before the scan could read what is readable), so the
	// arrays are rarely copied while they fill.
	room := int(min(known.inserted, 1<<31)) + 1024
	c := &catalogue{
		ids:        make([]int64, 0, room),
		categories: make([]int64, 0, room),
		nameEnds:   make([]uint32, 0, room),
		names:      make([]byte, 0, 16*room),
		statuses:   make([]uint8, 0, room),
	}
	rows, err := q.QueryContext(ctx, "SELECT id, name, category_id, status FROM pets ORDER BY id")
	if err != nil {
		return nil, known, err
	}
	defer rows.Close()
	var r petRow
	for rows.Next() {
		if err := rows.Scan(&r.id, &r.name, &r.categoryID, &r.status); err != nil {
			// The table is STRICT: a value that does not convert was not
			// written by SQLite, so the file is damaged.
			return nil, known, &storageError{kind: faultDamaged, err: err}
		}
		status := slices.Index(petStatuses, string(r.status))
		if status < 0 || !c.add(r.id, r.name, r.categoryID, status) {
			// The CHECK constraint and ORDER BY make this impossible for a
			// sound file.
			return nil, known, &storageError{kind: faultDamaged, err: fmt.Errorf("pet %d breaks the table's rules", r.id)}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, known, err
	}
	return c, known, nil
}

// add appends committed pets and publishes them. Without a master, or
// when they do not all come after its last id, there is no view until
// the writer loop's next look loads it again.
func (v *view) add(pets []Pet) {
	if v.master == nil {
		return
	}
	for _, p := range pets {
		// The name's bytes are only copied into the arena, never changed.
		name := unsafe.Slice(unsafe.StringData(p.Name), len(p.Name))
		status := slices.Index(petStatuses, p.Status)
		if status < 0 || !v.master.add(p.ID, name, p.CategoryID, status) {
			v.published.Store(nil)
			v.master = nil
			return
		}
	}
	v.known.inserted += int64(len(pets))
	v.publish()
}

// externalWriteCheck is how often the writer reads the file's change
// count, to bring the view up to date with writes made from outside.
const externalWriteCheck = 250 * time.Millisecond

// load reads the view afresh, in the writer's transaction, and publishes
// it. It runs in the writer loop, so no create commits meanwhile, and
// readers keep the snapshot they had until the new one is published: a
// client still reads its own writes. Pets are never changed by the
// service, so a load is rare: at start, and after a change made from
// outside (an operator's sqlite3, a restore).
func (s *petStore) load(w *batchWriter, why string) {
	v := &s.view
	v.loads++
	if v.loads > 1 {
		s.log.Info("in-memory view is rebuilt", "why", why, "db", s.file.path)
	}
	start := time.Now()
	c, known, err := loadCatalogue(context.Background(), w.conn)
	if err != nil {
		err = s.storageFault(err)
		v.published.Store(nil)
		v.master, v.failedAt = nil, time.Now()
		s.log.Warn("the in-memory view could not be loaded: lists and gets are refused until it is; it is tried again every 10 s unless the file is damaged",
			"err", err.Error(), "db", s.file.path)
		return
	}
	v.master, v.known = c, known
	v.publish()
	if missing := known.inserted - known.deleted - int64(len(c.ids)); missing > 0 {
		s.petsMissing(c.ids, missing)
	}
	// The view replaced is garbage now, as large as the new one: given
	// back to the system at once, where the runtime would keep it for
	// minutes (at 1,000,000 pets, 140 MiB of RSS after a reload). In a
	// goroutine of its own: the writer, which may be inside a commit,
	// does not wait for a collection.
	go debug.FreeOSMemory()
	s.log.Info("in-memory view loaded", "pets", len(c.ids), "took", time.Since(start).Round(time.Millisecond).String())
}

// catchUp compares the file's change count with the one the view knows,
// inside a transaction of the writer's connection: in a commit, before
// its inserts, so no outside change is passed over. Any change, an
// append included, loads the view again. A file that went back is
// refused: checkWentBack.
func (s *petStore) catchUp(w *batchWriter) error {
	v := &s.view
	var cur changeCount
	err := w.changes.QueryRowContext(context.Background()).Scan(&cur.inserted, &cur.changed, &cur.deleted)
	if err != nil {
		if _, ok := classifyFault(err); ok {
			return err
		}
		cur = changeCount{-1, -1, -1} // no count: an older copy of the file, say
	}
	if v.master != nil && cur == v.known {
		return nil
	}
	// A file that went back is loaded too: reads serve what it holds. One
	// whose count or top id does not show it is refused by the commit
	// (errIDNotNew).
	wentBack := s.checkWentBack(w)
	switch {
	case v.master != nil:
		s.load(w, "the pets table changed from outside the service")
	case s.lasting.Load() == nil && time.Since(v.failedAt) > 10*time.Second:
		s.load(w, "an earlier load failed")
	}
	// Damage the load found refuses the commit it ran in.
	if f := s.lasting.Load(); f != nil && wentBack == nil {
		return f
	}
	return wentBack
}

// checkAcked compares, at start, the file with what the service last
// acknowledged (ackedSuffix): a file whose insert count or highest id is
// below the record lost commits a client was answered 201 for. That is a
// lasting fault, reported as pets missing; the file's id sequence is
// raised to the record's id first, so no id is handed out twice. The
// record is not written again while the fault lasts, so every restart
// says it again, until petstore restore puts a file back.
func (s *petStore) checkAcked(w *batchWriter) {
	inserted, top, ok := readAcked(s.file.path)
	if !ok || s.view.master == nil || (s.view.known.inserted >= inserted && s.view.highWater >= top) {
		return
	}
	if s.lasting.Load() == nil { // a damaged file is not written on
		w.raiseSequence(top)
	}
	held := int64(0) // the highest id the file holds (its sequence is raised)
	if ids := s.view.master.ids; len(ids) > 0 {
		held = ids[len(ids)-1]
	}
	se := &storageError{kind: faultMissing, err: fmt.Errorf("the file has had %d pets inserted and holds ids up to %d, but the service had acknowledged %d inserted and ids up to %d",
		s.view.known.inserted, held, inserted, top)}
	s.lastingFault(se, "the database file lacks pets the service acknowledged before it stopped (its last commits were lost: storage that dropped pages, or an older copy put in its place); "+
		"creates are refused and the health check fails until it is repaired; the file's id sequence is raised above them. "+
		"Stop the service, then restore a copy that holds them (the Litestream replica), "+
		"or accept their loss by restoring a backup of this file (docs/operations.md: Pets missing from the file)",
		"missing_pets", inserted-s.view.known.inserted, "missing_ids", fmt.Sprintf("%d-%d", held+1, max(top, held+1)))
}

// countCheckEvery is how often countLoop compares the rows the file
// holds with the rows its counts say it should hold.
const countCheckEvery = 5 * time.Second

// countQuery reads, in one snapshot, the rows the pets table holds and
// the rows its triggers' counts say it should hold.
const countQuery = "SELECT (SELECT count(*) FROM pets), (SELECT inserted - deleted FROM pets_changes)"

// countLoop finds rows the file lost with no delete counted: SQLite
// 3.7.0 to 3.51.2 can lose committed rows when another process
// checkpoints beside the service (the WAL-reset bug), and the triggers'
// counts, in another page, still hold them. count(*) reads every page of
// the table (about 50 ms at 1,000,000 pets), so it runs on a read-only
// connection of its own, which the writer never waits for; a shortfall
// has the writer load the view again, and the load names the missing
// pets (petsMissing).
func (s *petStore) countLoop(db *sql.DB) {
	defer close(s.counted)
	defer db.Close()
	tick := time.NewTicker(countCheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.stopCount:
			return
		case <-tick.C:
		}
		var rows, expected int64
		if db.QueryRow(countQuery).Scan(&rows, &expected) == nil && rows < expected {
			s.countsShort.Store(true)
		}
	}
}

// checkWentBack refuses creates, until a restart, once the file's ids no
// longer reach the highest the service has held: an older copy was put
// under it (sqlite3 .restore, a cp of a backup). New pets would then get
// ids already acknowledged for other pets. Pets deleted by hand do not
// count: AUTOINCREMENT never hands their ids out again.
func (s *petStore) checkWentBack(w *batchWriter) error {
	if f := s.lasting.Load(); f != nil && f.kind == faultWentBack {
		return f
	}
	top, err := w.topID()
	if err != nil || top >= s.view.highWater {
		return err
	}
	se := &storageError{kind: faultWentBack, err: fmt.Errorf("the file's highest id is %d, but the service held pets up to id %d", top, s.view.highWater)}
	// Ids are dense unless rows were deleted by hand, so missing_pets
	// counts the ids above the file's: at most that many pets.
	return s.lastingFault(se, "the database file went back: it no longer holds pets the service stored, so creates are refused until a restart; "+
		"the file's id sequence is raised to the highest id the service acknowledged, so no id is handed out twice, after a restart too; "+
		"if the older file is what you meant to serve, restart the service; "+
		"otherwise stop the service and put the newer file back (docs/operations.md: Outside writes, restores and replicas)",
		"missing_pets", s.view.highWater-top, "missing_ids", fmt.Sprintf("%d-%d", top+1, s.view.highWater), "file_top_id", top)
}

// keepIDs raises the file's id sequence to the highest id the service
// acknowledged whenever the file's ids fall short of it while a lasting
// fault refuses creates (an older copy put under the service, once or
// again, also after pets were found missing): an insert from then on,
// by this service after its restart or by anyone, gets an id above
// every one a client was given. It runs every second and at the stop.
func (s *petStore) keepIDs(w *batchWriter) {
	if f := s.lasting.Load(); f == nil || (f.kind != faultWentBack && f.kind != faultMissing) {
		return
	}
	if top, err := w.topID(); err != nil || top >= s.view.highWater {
		return
	}
	if err := w.raiseSequence(s.view.highWater); err != nil {
		s.log.Warn("the file's id sequence could not be raised; tried again in a second", "err", err.Error(), "db", s.file.path)
		return
	}
	// The restart the log advises accepts the older file: the record says
	// what it holds now, with the ids kept out of its sequence.
	s.file.noteAcked(s.view.known.inserted, s.view.highWater)
	s.log.Info("the file's id sequence is raised to the highest id the service acknowledged", "seq", s.view.highWater, "db", s.file.path)
}

// raiseSequenceSQL raises the pets table's AUTOINCREMENT sequence to at
// least ?1, through SQLite's own sqlite_sequence table.
const raiseSequenceSQL = `INSERT INTO sqlite_sequence (name, seq)
		SELECT 'pets', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'pets');
	UPDATE sqlite_sequence SET seq = max(seq, ?1) WHERE name = 'pets';`

// petsMissing is a load's finding that the file holds fewer pets than
// its own counts say were inserted and not deleted: rows lost with no
// delete recorded (an outside SQLite older than 3.51.3 checkpointing
// beside the service, a disk that dropped pages). It refuses creates and
// fails the health check until the file is repaired, and names the ids the file
// lacks: those up to its top id not among ids, ids deleted by hand
// among them, in at most 100 ranges (more_ranges counts the rest).
func (s *petStore) petsMissing(ids []int64, missing int64) {
	var gaps []string // at most 100 ranges of ids, for one log line
	more := 0
	gap := func(from, to int64) {
		switch {
		case to < from:
		case len(gaps) == 100:
			more++
		case to == from:
			gaps = append(gaps, strconv.FormatInt(from, 10))
		default:
			gaps = append(gaps, strconv.FormatInt(from, 10)+"-"+strconv.FormatInt(to, 10))
		}
	}
	next := int64(1)
	for _, id := range ids {
		gap(next, id-1)
		next = max(next, id+1)
	}
	gap(next, s.view.highWater)
	se := &storageError{kind: faultMissing, err: fmt.Errorf("the file holds %d pets, %d fewer than it recorded as inserted and not deleted", len(ids), missing)}
	s.lastingFault(se, "acknowledged pets are missing from the database file: creates are refused and the health check fails until it is repaired; "+
		"stop the service, then restore a copy that holds them (the Litestream replica, or the latest backup that does), "+
		"or accept their loss by restoring a backup of this file (docs/operations.md: Pets missing from the file)",
		"missing_pets", missing, "missing_ids", strings.Join(gaps, ","), "more_ranges", more)
}
