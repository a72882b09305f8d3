// The store: the catalogue in one SQLite file. Creates go through one
// writer goroutine, which commits whatever is queued in one transaction
// and one fsync (group commit); lists and gets are prepared SQL on a pool
// of read connections, and SQLite's page cache is the only cache. The
// store speaks no HTTP: it returns Go values and typed errors, which
// errors.go defines and alone turns into answers.

package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// schema holds the migrations: file i takes a database from schema
// version i to i+1; PRAGMA user_version holds the version, so an older
// binary refuses a file it does not understand.
//
//go:embed schema/*.sql
var schema embed.FS

// migrations are the schema's files, in version order (a valid pattern
// on an embedded tree: it cannot fail).
var migrations, _ = fs.Glob(schema, "schema/*.sql")

// petstoreApplicationID is PRAGMA application_id of petstore's files,
// "PETS" in ASCII (schema/0004).
const petstoreApplicationID = 0x50455453

// dsn is the go-sqlite3 address of the file at path. Options are DSN
// parameters, not a one-off PRAGMA, because the driver applies them to
// every connection database/sql opens:
//   - WAL: readers run beside the writer, and a commit is one append;
//   - synchronous FULL: a commit is fsynced before it returns, so a 201
//     survives a power loss, not only a crash;
//   - a 5 s busy timeout: a backup or an operator's sqlite3 may hold the
//     lock a moment;
//   - txlock immediate: a write transaction takes the write lock as it
//     begins, so a create never has to be retried after reading;
//   - no mutex: database/sql gives a connection to one goroutine at a
//     time, so SQLite's own lock on every call only costs time;
//   - 4 MB of page cache a connection, not 2: a list read another page
//     from the OS a tenth of the time (0.27 of the floor's rate, 0.33
//     with it), and with 2 readers a CPU it stays within the memory
//     target at a million pets (BenchmarkMillionPets).
func dsn(path string) string {
	return fileURI(path) + "?_journal_mode=WAL&_synchronous=FULL&_busy_timeout=5000&_txlock=immediate&_mutex=no&_cache_size=-4000"
}

// fileURI is path in SQLite's "file:" form, escaped: a '?' or '#' in a
// name must not start the options.
func fileURI(path string) string { return "file:" + (&url.URL{Path: path}).EscapedPath() }

// readOnlyDSN reads path with SQLite's defaults, as the service's DSN
// would switch another application's file to WAL. Without a -wal beside
// it, it is read as immutable, so no -wal or -shm is made beside it.
func readOnlyDSN(path string) string {
	if _, err := os.Stat(path + "-wal"); errors.Is(err, os.ErrNotExist) {
		return fileURI(path) + "?mode=ro&immutable=1"
	}
	return fileURI(path) + "?mode=ro&_busy_timeout=5000"
}

// store keeps the catalogue; openStore sets its fields once.
type store struct {
	path            string
	lock            *os.File // one service a file; closed last
	writer, readers *sql.DB  // the writer: one connection, the writer loop's
	log             *slog.Logger

	listAll, listStatus, getOne, findKey, insert *sql.Stmt

	creates  chan *createRequest // unbuffered: a create sent is taken
	closed   chan struct{}
	loopDone chan struct{}

	lasting   atomic.Pointer[storageError] // a fault that lasts until a restart
	commits   atomic.Int64
	probeMu   sync.Mutex
	probed    probe // the health check's last write
	closeOnce sync.Once
	closeErr  error
}

// openStore opens the file at path, creating it if missing, checks whose
// it is and that it is whole, and migrates it. It writes only when a
// migration is due, so it starts on a full or read-only disk, and reads.
func openStore(path string, log *slog.Logger) (*store, error) {
	s := &store{path: path, log: log, creates: make(chan *createRequest), closed: make(chan struct{}), loopDone: make(chan struct{})}
	if err := s.open(); err != nil {
		s.closeFiles()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	go s.writeLoop()
	return s, nil
}

// lockFile creates the file at path private to the user (SQLite would
// take the umask, and gives the -wal and -shm the file's mode), or opens
// it to read if it cannot be written, and takes an exclusive flock, held
// until the file is closed: a second service on it refuses to start.
// SQLite's own locks are POSIX locks, which flock does not touch.
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

// open locks the file, checks it, migrates it and prepares every
// statement. sql.Open fails only for an unknown driver.
func (s *store) open() (err error) {
	if s.lock, err = lockFile(s.path); err != nil {
		return err
	}
	version, err := inspect(s.path)
	if err != nil {
		return err
	}
	s.writer, _ = sql.Open(sqliteDriver, dsn(s.path))
	s.writer.SetMaxOpenConns(1)
	s.readers, _ = sql.Open(sqliteDriver, dsn(s.path))
	s.readers.SetMaxOpenConns(2 * runtime.GOMAXPROCS(0))
	s.readers.SetMaxIdleConns(2 * runtime.GOMAXPROCS(0)) // database/sql keeps 2, and would open the rest anew
	// quick_check reads every page (0.6 to 0.9 s a million pets): damage
	// done while the service was down is found, and creates refused from
	// then on (see fault), while it already answers. Before a migration
	// writes, it runs first, so no damaged file is written on.
	quickCheck := func() {
		var check string
		if err := s.fault(s.readers.QueryRow("PRAGMA quick_check(1)").Scan(&check)); err == nil && check != "ok" {
			s.fault(&storageError{faultDamaged, errors.New("quick_check: " + check)})
		} else if err != nil && s.lasting.Load() == nil {
			s.log.Warn("quick_check could not run: the file goes unchecked until the next start", "err", err, "db", s.path)
		}
	}
	if version < len(migrations) {
		if quickCheck(); s.lasting.Load() == nil {
			err = migrate(s.writer, version)
		}
	} else {
		go quickCheck()
	}
	prepare := func(db *sql.DB, query string) *sql.Stmt {
		st, prepErr := db.Prepare(query)
		err = cmp.Or(err, prepErr)
		return st
	}
	const columns = "SELECT id, name, category_id, status FROM pets "
	s.listAll = prepare(s.readers, columns+"WHERE id > ? ORDER BY id LIMIT ?")
	s.listStatus = prepare(s.readers, columns+"WHERE status = ? AND id > ? ORDER BY id LIMIT ?")
	s.getOne = prepare(s.readers, columns+"WHERE id = ?")
	s.findKey = prepare(s.writer, "SELECT id, name, category_id, status, request_fingerprint FROM pets WHERE idempotency_scope = ? AND idempotency_key = ?")
	s.insert = prepare(s.writer, "INSERT INTO pets (name, category_id, status, idempotency_key, idempotency_scope, request_fingerprint) VALUES (?, ?, ?, ?, ?, ?)")
	return err
}

// inspect reads, on a read-only connection of its own, whose file this is
// and its schema version. Another application's SQLite file is refused,
// so a wrong -db cannot add a table to it.
func inspect(path string) (version int, err error) {
	db, _ := sql.Open(sqliteDriver, readOnlyDSN(path))
	defer db.Close()
	// An unmarked file (schemas 1 to 3 were) is petstore's only if it
	// holds petstore's tables alone; one of version 0, none.
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

// migrate applies the migrations the file has not had, and sets its
// version, in one transaction: a failed upgrade leaves the file as it
// was. (The writer is one connection, so the ROLLBACK meets the BEGIN.)
func migrate(db *sql.DB, version int) error {
	script := "BEGIN;\n"
	for _, name := range migrations[version:] {
		sql, _ := schema.ReadFile(name) // embedded: it cannot fail
		script += string(sql) + ";\n"   // ";": a file of comments alone is a statement of none
	}
	// PRAGMA takes no bound parameter; the value is our own integer.
	if _, err := db.Exec(script + fmt.Sprintf("PRAGMA user_version = %d;\nCOMMIT;", len(migrations))); err != nil {
		db.Exec("ROLLBACK")
		return fmt.Errorf("migrate schema from version %d to %d: %w", version, len(migrations), err)
	}
	return nil
}

// createRequest is one create on its way to the writer loop.
type createRequest struct {
	ctx   context.Context // its deadline, or its client leaving, keeps it from being stored
	pet   NewPet
	key   string // the Idempotency-Key, "" for none
	scope []byte // the API key's idempotencyScope
	done  chan createResult
}

// createResult is the writer loop's answer to one create.
type createResult struct {
	pet      Pet
	replayed bool
	err      error
}

// createPet stores the pet and returns it with its id, only once it is
// committed. With an Idempotency-Key already used for the same pet it
// returns that pet and replayed; used for another, errIdempotencyKeyReused.
func (s *store) createPet(ctx context.Context, pet NewPet, key string, scope []byte) (Pet, bool, error) {
	c := &createRequest{ctx: ctx, pet: pet, key: key, scope: scope, done: make(chan createResult, 1)}
	select {
	case s.creates <- c:
	case <-ctx.Done():
		return Pet{}, false, notStored(ctx.Err())
	case <-s.closed:
		return Pet{}, false, &storageError{faultNotAnswering, errors.New("the service is stopping")}
	}
	// Taken: the writer answers it, whatever the client does meanwhile.
	r := <-c.done
	return r.pet, r.replayed, r.err
}

// writeLoop owns the writer connection: it commits the creates queued in
// batches (gather), and every 200 commits checkpoints the WAL into the
// database file.
func (s *store) writeLoop() {
	defer close(s.loopDone)
	last := 0 // the size of the batch before
	for {
		select {
		case <-s.closed:
			return
		case c := <-s.creates:
			batch := s.gather([]*createRequest{c}, last)
			last = len(batch)
			s.commit(batch)
			s.committed()
		}
	}
}

// gather makes a batch of every create queued, up to 256. After a batch
// that had company it waits up to 1 ms for this one to grow as large:
// under load, the clients a commit answered send their next creates a
// round trip later, and without the wait each commit would take the first
// few of them and pay a whole fsync for those alone. A lone create, or
// the first after a lull, is committed at once.
func (s *store) gather(batch []*createRequest, last int) []*createRequest {
	wait := time.NewTimer(time.Millisecond)
	defer wait.Stop()
	for len(batch) < 256 {
		select {
		case c := <-s.creates:
			batch = append(batch, c)
			continue
		default:
		}
		if len(batch) >= last {
			return batch
		}
		select {
		case c := <-s.creates:
			batch = append(batch, c)
		case <-wait.C:
			return batch
		}
	}
	return batch
}

// committed counts a commit, a create's or a probe's, and every 200th
// checkpoints the WAL's pages into the database file, passively: a reader
// is never waited for, and what it holds back goes at a later one; the
// -wal is then used again from its start, and cut back to 4 MiB. Its I/O
// error is a fault that lasts (see fault). After such a fault nothing is
// written: the next start recovers from the -wal.
func (s *store) committed() {
	if s.commits.Add(1)%200 == 0 && s.lasting.Load() == nil {
		var busy, frames, copied int // what SQLite says of it: nothing to do with here
		s.fault(s.writer.QueryRow("PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied))
	}
}

// commit stores a batch and answers each of its creates.
func (s *store) commit(batch []*createRequest) {
	results := make([]createResult, len(batch))
	err := s.insertBatch(batch, results)
	if _, isFault := classifyFault(err); err != nil && !isFault && len(batch) > 1 {
		// One create SQLite refused (an operator's trigger, a constraint)
		// must not fail its neighbours: the transaction was rolled back,
		// and each is tried again alone.
		for _, c := range batch {
			s.commit([]*createRequest{c})
		}
		return
	}
	if err = s.fault(err); isConstraint(err) {
		err = &refusedError{err}
	}
	for i, c := range batch {
		if err != nil && results[i].err == nil {
			results[i] = createResult{err: err}
		}
		c.done <- results[i]
	}
}

// insertBatch inserts a batch in one transaction and fills in results;
// an error means nothing was stored. The statements run without the
// clients' contexts: one client leaving must not abort the others'.
func (s *store) insertBatch(batch []*createRequest, results []createResult) error {
	if f := s.lasting.Load(); f != nil {
		return f
	}
	ctx := context.Background()
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for i, c := range batch {
		// Checked once the write lock is held: a create whose client
		// left, or whose deadline passed, before its insert is not stored.
		if err := c.ctx.Err(); err != nil {
			results[i].err = notStored(err)
		} else if results[i], err = s.insertPet(ctx, tx, c); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// probeInsert writes what a create writes, a longest name and a key: a
// smaller write could fit on a disk where a create does not.
const probeInsert = `INSERT INTO pets (name, category_id, status, idempotency_key, idempotency_scope, request_fingerprint)
	VALUES (printf('%.100c', 'p'), 1, 'available', 'petstore-probe', x'00', x'00')`

// insertPet does one create in the batch's transaction. The key's lookup
// and the insert share it, so two creates with one key, even in one
// batch, store one pet; the unique index would refuse a second anyway.
func (s *store) insertPet(ctx context.Context, tx *sql.Tx, c *createRequest) (createResult, error) {
	var key, scope, fingerprint any // NULL without an Idempotency-Key
	if c.key != "" {
		// What the create asks for, after defaults; NUL is never in a name.
		sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%s", c.pet.Name, c.pet.CategoryID, c.pet.Status))
		var p Pet
		var stored []byte
		err := tx.StmtContext(ctx, s.findKey).QueryRowContext(ctx, c.scope, c.key).Scan(&p.ID, &p.Name, &p.CategoryID, &p.Status, &stored)
		switch {
		case err == nil && bytes.Equal(stored, sum[:]):
			return createResult{pet: p, replayed: true}, nil
		case err == nil:
			return createResult{err: errIdempotencyKeyReused}, nil
		case !errors.Is(err, sql.ErrNoRows):
			return createResult{}, err
		}
		key, scope, fingerprint = c.key, c.scope, sum[:]
	}
	res, err := tx.StmtContext(ctx, s.insert).ExecContext(ctx, c.pet.Name, c.pet.CategoryID, c.pet.Status, key, scope, fingerprint)
	if err != nil {
		return createResult{}, err
	}
	if n, _ := res.RowsAffected(); n != 1 { // an operator's trigger's RAISE(IGNORE)
		return createResult{err: &refusedError{errors.New("a rule of the file dropped it without a word")}}, nil
	}
	id, err := res.LastInsertId()
	return createResult{pet: Pet{ID: id, NewPet: c.pet}}, err
}

// listPets returns up to limit pets with an id above after, of status
// unless it is "", in ascending id. Reads take no request's context: a
// page is read in a millisecond, and go-sqlite3 watches a context with a
// goroutine of its own for every query, which cost a fifth of a list's
// time.
func (s *store) listPets(status string, after int64, limit int) ([]Pet, error) {
	var rows *sql.Rows
	var err error
	if status == "" {
		rows, err = s.listAll.Query(after, limit)
	} else {
		rows, err = s.listStatus.Query(status, after, limit)
	}
	if err != nil {
		return nil, s.fault(err)
	}
	defer rows.Close()
	pets := make([]Pet, 0, limit)
	for rows.Next() {
		var p Pet
		if err := rows.Scan(&p.ID, &p.Name, &p.CategoryID, &p.Status); err != nil {
			return nil, s.fault(err)
		}
		pets = append(pets, p)
	}
	return pets, s.fault(rows.Err())
}

// getPet returns the pet with the id, or a notFoundError.
func (s *store) getPet(id int64) (Pet, error) {
	var p Pet
	err := s.getOne.QueryRow(id).Scan(&p.ID, &p.Name, &p.CategoryID, &p.Status)
	if f := s.lasting.Load(); errors.Is(err, sql.ErrNoRows) && f != nil {
		return Pet{}, f // a file that failed a write, or is damaged, may hold the pet in what it cannot give
	} else if errors.Is(err, sql.ErrNoRows) {
		return Pet{}, notFoundError{id}
	}
	return p, s.fault(err)
}

// probe is what a health check's write met, and when.
type probe struct {
	at  time.Time
	err error
}

// health is nil while the store can both read and store a pet, and
// otherwise the failing check, as a *storageError: it reads a page, and
// writes a probe. One check writes at a time, and its answer stands for
// a second, so that a flood of checks costs one write a second.
func (s *store) health() error {
	if f := s.lasting.Load(); f != nil {
		return f
	}
	if _, err := s.listPets("", 0, 1); err != nil {
		return err
	}
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if time.Since(s.probed.at) >= time.Second {
		err := s.fault(s.probe())
		s.probed = probe{time.Now(), err}
	}
	return s.probed.err
}

// probe commits probeInsert, on the writer's connection between its
// batches, within 5 s, and takes it back: it deletes its own row, and
// puts the id sequence back unless something else moved it. It takes no
// client's context: one client gone must not be every check's answer.
func (s *store) probe() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tx, err := s.writer.BeginTx(ctx, nil)
	if err == nil {
		defer tx.Rollback()
		var res sql.Result
		if res, err = tx.ExecContext(ctx, probeInsert); err == nil {
			id, _ := res.LastInsertId()
			if n, _ := res.RowsAffected(); n != 1 { // an operator's trigger's RAISE(IGNORE)
				return &storageError{faultRefused, errors.New("the probe's row was dropped")}
			}
			if _, err = tx.ExecContext(ctx, "DELETE FROM pets WHERE id = ?", id); err == nil {
				_, err = tx.ExecContext(ctx, "UPDATE sqlite_sequence SET seq = ?1 - 1 WHERE name = 'pets' AND seq = ?1", id)
			}
		}
		if err == nil {
			err = tx.Commit()
			s.committed()
		}
	}
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &storageError{faultNotAnswering, errors.New("a write has waited on the storage for 5 s")}
	case isConstraint(err):
		return &storageError{faultRefused, err}
	}
	return err
}

// close stops the writer loop after the commit under way and closes the
// file; later calls return the first call's result.
func (s *store) close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		<-s.loopDone
		s.closeErr = s.closeFiles()
	})
	return s.closeErr
}

// closeFiles closes the pools, then the lock: closing any descriptor of
// the file drops the process's POSIX locks, SQLite's among them. After an
// I/O error the writer is not closed, as its last close would checkpoint
// onto the suspect storage: the next start recovers from the -wal.
func (s *store) closeFiles() (err error) {
	if s.readers != nil {
		s.readers.Close()
	}
	if f := s.lasting.Load(); s.writer != nil && (f == nil || f.kind != faultIO) {
		err = s.writer.Close()
	}
	if s.lock != nil {
		s.lock.Close()
	}
	return err
}

// fault returns err as a *storageError when the storage is at fault, and
// records, logging it once, a fault that lasts until a restart: a corrupt
// file, or an I/O error, after which the kernel may have dropped pages it
// had taken and report the next fsync a success (PostgreSQL's lesson of
// 2018), so nothing more is written. Other errors, and nil, pass as they
// are.
func (s *store) fault(err error) error {
	kind, ok := classifyFault(err)
	if !ok {
		return err
	}
	se := &storageError{kind, err}
	errors.As(err, &se) // one already made is kept
	if (kind == faultIO || kind == faultDamaged) && s.lasting.CompareAndSwap(nil, se) {
		s.log.Error("storage fault: creates are refused until the service is restarted; see docs/operations.md, When the storage fails", "fault", se.Error(), "db", s.path)
	}
	return se
}
