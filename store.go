// The store keeps the catalogue in one SQLite file. One writer goroutine
// commits every queued create in one transaction and one fsync (group
// commit). Lists and gets are prepared SQL on a pool of read connections.
// The store speaks no HTTP: it returns values and errors.go's errors.

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
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// schema holds the migrations: file i takes a database from version i,
// in PRAGMA user_version, to version i+1.
//
//go:embed schema/*.sql
var schema embed.FS

// migrations are the schema's files in version order.
var migrations, _ = fs.Glob(schema, "schema/*.sql")

// petstoreApplicationID marks petstore's files ("PETS" in ASCII).
const petstoreApplicationID = 0x50455453

// dsn is the go-sqlite3 address of the file at path. The driver applies
// its options to every connection:
//   - _journal_mode=WAL lets reads run beside the writer.
//   - _synchronous=FULL fsyncs each commit, so that a 201 survives a
//     power loss.
//   - _busy_timeout=5000 waits up to 5 s for a lock that Litestream or an
//     operator's sqlite3 holds.
//   - _txlock=immediate takes the write lock when a transaction begins,
//     so that a create never fails halfway for want of it.
func dsn(path string) string {
	return fileURI(path) + "?_journal_mode=WAL&_synchronous=FULL&_busy_timeout=5000&_txlock=immediate"
}

// store keeps the catalogue. openStore sets its fields once.
type store struct {
	lock            *os.File
	writer, readers *sql.DB // writer has one connection, the writer loop's

	listAll, listStatus, getOne, findKey, insert *sql.Stmt

	creates  chan *createRequest // unbuffered: a create sent is taken
	closed   chan struct{}
	loopDone chan struct{}

	// failed is closed when the storage lost what it had, and failure
	// says why. Nothing more is written.
	failed   chan struct{}
	failure  error
	failOnce sync.Once

	lastWrite atomic.Pointer[writeOutcome]
	probeMu   sync.Mutex // one health probe at a time
	closeOnce sync.Once
	closeErr  error
}

// writeOutcome is what the last commit met, and when.
type writeOutcome struct {
	at  time.Time
	err error
}

// openStore opens the file at path, creating it if missing, checks whose
// it is, and migrates it. It writes only for a migration, so that it
// starts on a full or read-only disk and serves reads.
func openStore(path string) (*store, error) {
	s := &store{creates: make(chan *createRequest), closed: make(chan struct{}), loopDone: make(chan struct{}), failed: make(chan struct{})}
	if err := s.open(path); err != nil {
		s.closeFiles()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	go s.writeLoop()
	return s, nil
}

// open locks, checks and migrates the file, opens every connection and
// prepares every statement.
func (s *store) open(path string) (err error) {
	if s.lock, err = lockFile(path); err != nil {
		return err
	}
	version, err := inspect(path)
	if err != nil {
		return err
	}
	s.writer, _ = sql.Open(sqliteDriver, dsn(path)) // it fails only for an unknown driver
	s.writer.SetMaxOpenConns(1)
	s.readers, _ = sql.Open(sqliteDriver, dsn(path))
	if err := openConns(s.readers, 2*runtime.GOMAXPROCS(0)); err != nil {
		return err
	}
	if version < len(migrations) {
		if err := migrate(s.writer, version); err != nil {
			return err
		}
	}
	prepare := func(db *sql.DB, query string) *sql.Stmt {
		st, prepErr := db.Prepare(query)
		err = cmp.Or(err, prepErr)
		return st
	}
	// "LIMIT +?" is an expression, so that SQLite does not prepare the
	// statement again for each value bound.
	const columns = "SELECT id, name, category_id, status FROM pets "
	s.listAll = prepare(s.readers, columns+"WHERE id > ? ORDER BY id LIMIT +?")
	s.listStatus = prepare(s.readers, columns+"WHERE status = ? AND id > ? ORDER BY id LIMIT +?")
	s.getOne = prepare(s.readers, columns+"WHERE id = ?")
	s.findKey = prepare(s.writer, "SELECT id, name, category_id, status, request_fingerprint FROM pets WHERE idempotency_scope = ? AND idempotency_key = ?")
	s.insert = prepare(s.writer, "INSERT INTO pets (name, category_id, status, idempotency_key, idempotency_scope, request_fingerprint) VALUES (?, ?, ?, ?, ?, ?)")
	return err
}

// openConns opens n connections of db now, with their files, and keeps
// them, so that running out of descriptors later delays new clients and
// never fails a read.
func openConns(db *sql.DB, n int) error {
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	for range n {
		conn, err := db.Conn(context.Background())
		if err != nil {
			return err
		}
		defer conn.Close() // back to the pool, once all are open
		if _, err := conn.ExecContext(context.Background(), "SELECT count(*) FROM sqlite_schema"); err != nil {
			return err // a read opens the -wal and the -shm
		}
	}
	return nil
}

// migrate applies the migrations the file has not had, and sets its
// version, in one transaction, so that a failed upgrade changes nothing.
func migrate(db *sql.DB, version int) error {
	script := "BEGIN;\n"
	for _, name := range migrations[version:] {
		sql, _ := schema.ReadFile(name) // embedded: it cannot fail
		script += string(sql) + ";\n"   // ends a last statement that lacks its ";"
	}
	// On an error, closing the store rolls the transaction back.
	if _, err := db.Exec(script + fmt.Sprintf("PRAGMA user_version = %d;\nCOMMIT;", len(migrations))); err != nil {
		return fmt.Errorf("migrate schema from version %d to %d: %w", version, len(migrations), err)
	}
	return nil
}

// createRequest is one create, or a health probe, on its way to the
// writer loop, and its outcome, set before done is closed.
type createRequest struct {
	ctx   context.Context // done before the writer inserts the pet: it is not stored
	pet   NewPet
	key   string // the Idempotency-Key, "" for none
	scope []byte // the API key's idempotencyScope
	probe bool
	done  chan struct{}

	stored   Pet
	replayed bool
	err      error
}

// createPet stores the pet and returns it with its id once it is
// committed. With an Idempotency-Key already used for the same pet, it
// returns that pet and replayed.
func (s *store) createPet(ctx context.Context, pet NewPet, key string, scope []byte) (Pet, bool, error) {
	return s.send(&createRequest{ctx: ctx, pet: pet, key: key, scope: scope})
}

// send hands c to the writer loop and returns its outcome. If the
// storage fails during a create's commit, send never returns, because
// nobody knows whether the pet was stored.
func (s *store) send(c *createRequest) (Pet, bool, error) {
	c.done = make(chan struct{})
	select {
	case s.creates <- c:
	case <-c.ctx.Done():
		return Pet{}, false, notStored(c.ctx.Err())
	case <-s.loopDone:
		return Pet{}, false, &storageError{faultStopping, errors.New("no more pets are stored")}
	}
	var gaveUp <-chan struct{} // a create waits for its outcome; a probe, only until its deadline
	if c.probe {
		gaveUp = c.ctx.Done()
	}
	select {
	case <-c.done:
	case <-gaveUp:
		return Pet{}, false, notStored(c.ctx.Err())
	}
	return c.stored, c.replayed, c.err
}

// writeLoop owns the writer connection. It commits the queued creates in
// batches, and checkpoints the WAL every 200 commits, until the store
// closes or the storage fails.
func (s *store) writeLoop() {
	defer close(s.loopDone)
	commits, last := 0, 0 // last is the size of the batch before
	for {
		select {
		case <-s.closed:
			return
		case <-s.failed:
			return
		case c := <-s.creates:
			batch := s.gather([]*createRequest{c}, last)
			last = len(batch)
			if !s.commit(batch) {
				return
			}
			if commits++; commits%200 == 0 {
				// PASSIVE copies the WAL into the file without waiting for readers.
				if _, err := s.writer.Exec("PRAGMA wal_checkpoint(PASSIVE)"); isFatal(s.fault(err)) {
					return
				}
			}
		}
	}
}

// gather adds every queued create to the batch, up to 256. After a batch
// that had company it waits up to 1 ms for this one to grow as large,
// because the clients a commit answered send their next creates a round
// trip later. A lone create is committed at once.
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

// commit stores a batch and answers each of its creates. When the
// storage fails, it answers none and returns false.
func (s *store) commit(batch []*createRequest) bool {
	err := s.fault(s.insertBatch(batch))
	if isFatal(err) {
		return false
	}
	if err == nil || asFault(err) != nil {
		s.lastWrite.Store(&writeOutcome{time.Now(), err})
	}
	for _, c := range batch {
		if err != nil && c.err == nil {
			c.err = err
		}
		close(c.done)
	}
	return true
}

// insertBatch inserts a batch in one transaction and sets each create's
// outcome. An error means that nothing was stored. No client's context
// is passed down, because one client leaving must not abort the batch.
func (s *store) insertBatch(batch []*createRequest) error {
	select {
	case <-s.failed: // a read found the storage failed: nothing more is written
		return &storageError{faultStopping, errors.New("the storage failed")}
	default:
	}
	tx, err := s.writer.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, c := range batch {
		// The write lock is held now, so a create whose client left or
		// whose deadline passed is skipped.
		if c.err = notStored(c.ctx.Err()); c.err != nil {
			continue
		}
		// SQLite undoes only the statement that a rule of the file, such
		// as an operator's trigger, refuses, so that create fails alone.
		if err := s.insertPet(tx, c); isConstraint(err) {
			c.err = &refusedError{err}
		} else if err != nil {
			return err
		}
	}
	return tx.Commit()
}

// insertPet does one create in the batch's transaction. The key's lookup
// and the insert share it, so that two creates with one key store one
// pet, even in one batch.
func (s *store) insertPet(tx *sql.Tx, c *createRequest) error {
	var key, scope, fingerprint any // NULL without an Idempotency-Key
	if c.key != "" {
		// The fingerprint covers the pet after defaults; a name has no NUL.
		sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%s", c.pet.Name, c.pet.CategoryID, c.pet.Status))
		p := &c.stored
		var stored []byte
		err := tx.Stmt(s.findKey).QueryRow(c.scope, c.key).Scan(&p.ID, &p.Name, &p.CategoryID, &p.Status, &stored)
		switch {
		case err == nil && bytes.Equal(stored, sum[:]):
			c.replayed = true
			return nil
		case err == nil:
			c.err = errIdempotencyKeyReused
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		key, scope, fingerprint = c.key, c.scope, sum[:]
	}
	var res sql.Result
	var err error
	if c.probe {
		res, err = tx.Exec(probeWrite)
	} else {
		res, err = tx.Stmt(s.insert).Exec(c.pet.Name, c.pet.CategoryID, c.pet.Status, key, scope, fingerprint)
	}
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 { // an operator's trigger's RAISE(IGNORE)
		c.err = &refusedError{errors.New("a rule of the file dropped it without a word")}
		return nil
	}
	c.stored = Pet{NewPet: c.pet}
	c.stored.ID, err = res.LastInsertId()
	return err
}

// listPets returns up to limit pets with an id above after, of status
// unless it is "", in ascending id. Reads take no context, because
// go-sqlite3 would watch it with a goroutine per query.
func (s *store) listPets(status string, after int64, limit int) ([]Pet, error) {
	stmt, args := s.listAll, []any{after, limit}
	if status != "" {
		stmt, args = s.listStatus, []any{status, after, limit}
	}
	rows, err := stmt.Query(args...)
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
	if errors.Is(err, sql.ErrNoRows) {
		return Pet{}, notFoundError{id}
	}
	return p, s.fault(err)
}

// health returns nil while a pet can be both read and stored. The last
// commit's outcome stands for a second, so that a flood of checks costs
// at most one probe per second.
func (s *store) health() error {
	if _, err := s.listPets("", 0, 1); err != nil {
		return err
	}
	s.probeMu.Lock()
	defer s.probeMu.Unlock()
	if last := s.lastWrite.Load(); last != nil && time.Since(last.at) < time.Second {
		return last.err
	}
	// Not a client's context, because one client leaving must not be
	// every check's answer.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err := s.send(&createRequest{ctx: ctx, probe: true})
	if errors.As(err, new(*refusedError)) {
		err = &storageError{faultRefused, err}
	}
	s.lastWrite.Store(&writeOutcome{time.Now(), err})
	return err
}

// probeWrite writes more than any create does, with the id sequence and
// a row of 16 KiB, because a smaller write could fit where a create does
// not, and deletes the row. Its id is 0, which no create gets, so it
// consumes no id.
const probeWrite = `UPDATE sqlite_sequence SET seq = seq WHERE name = 'pets';
	INSERT INTO pets (id, name, category_id, status, idempotency_key, idempotency_scope, request_fingerprint)
	VALUES (0, printf('%.100c', 'p'), 1, 'available', printf('%.255c', 'k'), zeroblob(16), zeroblob(16384));
	DELETE FROM pets WHERE id = 0`

// fault returns err as a *storageError if the storage is at fault, and
// closes s.failed for an I/O error or a damaged file.
func (s *store) fault(err error) error {
	f := asFault(err)
	if f == nil {
		return err
	}
	if isFatal(f) {
		s.failOnce.Do(func() { s.failure = f; close(s.failed) })
	}
	return f
}

// close stops the writer loop after the commit under way and closes the
// file. After a failure it closes nothing, because closing the writer
// would checkpoint onto the failed storage; the next start recovers from
// the -wal.
func (s *store) close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		<-s.loopDone
		select {
		case <-s.failed:
		default:
			s.closeErr = s.closeFiles()
		}
	})
	return s.closeErr
}

// closeFiles closes the pools, then the lock, because closing any
// descriptor of the file drops the process's POSIX locks, SQLite's too.
func (s *store) closeFiles() error {
	var err error
	if s.writer != nil {
		s.readers.Close()
		err = s.writer.Close()
	}
	if s.lock != nil {
		s.lock.Close()
	}
	return err
}
