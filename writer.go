// The writer: creates queue for one goroutine that owns the one writer
// connection and commits whatever is queued in one transaction and one
// fsync (group commit). A 201 is sent only after its commit.

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mattn/go-sqlite3"
)

// errClosed is returned for writes after close.
var errClosed = errors.New("store is closed")

// errTimedOut refuses a create whose commit could not begin before its
// deadline; it was not stored.
var errTimedOut = &storageError{kind: faultTimedOut, err: errors.New("the create's deadline passed before its commit began")}

// writeQueue carries creates, and probes, to the writer loop.
type writeQueue struct {
	// writes feeds the group-commit loop. mu guards closing it: senders
	// hold it shared, close holds it exclusively.
	writes   chan *writeRequest
	mu       sync.RWMutex
	closed   bool
	loopDone chan struct{}
	// probes asks the writer loop for a write that changes nothing, to
	// learn whether a pet can be stored.
	probes chan chan error
}

// createRequest is one create: the pet and, when the client sent one, its
// Idempotency-Key with a fingerprint of what it asked for.
type createRequest struct {
	pet            NewPet
	idempotencyKey string // "" when the client sent none
	// scope is the API key's idempotencyScope: a key belongs to its client.
	scope []byte
	// deadline is when the client must have its answer; a create whose
	// commit has not begun by then is not stored. Zero: none.
	deadline time.Time
	// late, if set, is called when the deadline passes while the create's
	// commit runs: its answer will come late, and the truth, so whoever
	// bounds the answer's time must wait for it (the handler lifts the
	// connection's write deadline).
	late func()
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
	s.queue.mu.RLock()
	if s.queue.closed {
		s.queue.mu.RUnlock()
		return Pet{}, false, errClosed
	}
	var expired <-chan time.Time // never, without a deadline
	if !c.deadline.IsZero() {
		timer := time.NewTimer(time.Until(c.deadline))
		defer timer.Stop()
		expired = timer.C
	}
	select {
	case s.queue.writes <- w:
		s.queue.mu.RUnlock()
	default:
		// The queue is full: wait, but not past the deadline.
		select {
		case s.queue.writes <- w:
			s.queue.mu.RUnlock()
		case <-ctx.Done():
			s.queue.mu.RUnlock()
			return Pet{}, false, ctx.Err()
		case <-expired:
			s.queue.mu.RUnlock()
			return Pet{}, false, errTimedOut
		}
	}
	// Once queued, wait for the outcome even if the client has gone: the
	// row may be committed, and the answer must say what happened. At the
	// deadline, a create the writer has not taken yet is given up, and so
	// never stored; one it has taken is answered within the deadline
	// (its lock wait is bounded by it) or, if its commit is slow, late,
	// with its outcome.
	select {
	case r := <-w.done:
		return r.pet, r.replayed, r.err
	case <-expired:
		if w.state.CompareAndSwap(requestPending, requestAbandoned) {
			return Pet{}, false, errTimedOut
		}
		if c.late != nil {
			c.late()
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
	defer close(s.queue.loopDone)
	defer func() { w.close() }()
	// The view loads in the background; creates are taken at once, and
	// reads go to SQLite until it is ready, so a large file answers at
	// once too.
	s.startLoad(whyStart)
	defer func() {
		if s.view.loading {
			s.view.cancelLoad()
			<-s.view.loaded
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	watch := time.NewTicker(externalWriteCheck)
	defer watch.Stop()
	batch := make([]*writeRequest, 0, maxBatch)
	for {
		select {
		case first, ok := <-s.queue.writes:
			if !ok {
				return
			}
			batch = append(batch[:0], first)
		fill:
			for len(batch) < maxBatch {
				select {
				case r, ok := <-s.queue.writes:
					if !ok {
						break fill
					}
					batch = append(batch, r)
				default:
					break fill
				}
			}
			s.commit(w, batch)
		case done := <-s.queue.probes:
			done <- s.probeWrite(&w)
		case l := <-s.view.loaded:
			s.landLoad(w, l)
		case <-watch.C:
			if w.externalWrite() {
				s.syncView(w, maxCaughtUp)
			}
			if v := &s.view; v.master == nil && !v.loading && time.Since(v.failedAt) > 10*time.Second {
				s.startLoad(whyRetry)
			}
		case <-tick.C:
			// Also when idle, a file deleted or replaced under the service
			// is seen within a second.
			s.checkFile(w)
			if s.storage.faults.current() != nil || s.storage.replaced.Load() != nil {
				s.probeWrite(&w)
			}
			if !s.storage.framesLost.Load() && s.storage.replaced.Load() == nil {
				s.boundWAL(w, walLimit)
			}
		}
	}
}

// commit stores a batch and answers every request in it. Before and after
// the commit it checks that the path still names the opened file: a 201
// is never sent for a pet that a restart would not find. A storage fault
// refuses the whole batch with a storageError and is logged once, by the
// fault log, not per request.
func (s *petStore) commit(w *batchWriter, batch []*writeRequest) {
	refuse := func(err error) {
		kind, _ := classifyFault(err)
		// Faults that last until a restart are logged once, when marked.
		if kind != faultReplaced && kind != faultTampered && kind != faultDamaged && kind != faultWentBack && (kind != faultIO || s.storage.ioFailed.Load() == nil) {
			s.storage.faults.failed(kind, err, len(batch))
		}
		for _, r := range batch {
			r.done <- writeResult{err: err}
		}
	}
	if err := s.checkFile(w); err != nil {
		refuse(err)
		return
	}
	if d := s.storage.damage.Load(); d != nil {
		refuse(&storageError{kind: faultDamaged, err: errors.New(*d)})
		return
	}
	if r := s.storage.wentBack.Load(); r != nil {
		refuse(r)
		return
	}
	if r := s.storage.ioFailed.Load(); r != nil {
		s.file.markForCheck()
		refuse(r)
		return
	}
	start := time.Now()
	s.storage.commitStart.Store(start.UnixNano())
	stalled := time.AfterFunc(stalledCommit, func() {
		s.log.Warn("a commit is waiting on the storage: its creates are answered when it ends", "waited", stalledCommit.String(), "creates", len(batch), "db", s.file.path)
	})
	// Inside the transaction, before its inserts: the view catches up
	// with any outside change, and a file that went back is refused.
	results, err := w.commit(batch, func() error { return s.catchUp(w, maxCaughtUp) }, s.view.highWater)
	s.storage.commitStart.Store(0)
	if !stalled.Stop() {
		s.log.Warn("the stalled commit ended", "took", time.Since(start).Round(time.Millisecond).String(), "committed", err == nil, "db", s.file.path)
	}
	if err == nil {
		if err := s.checkFile(w); err != nil {
			// Committed, but to a file no longer at the path.
			refuse(err)
			return
		}
		// The view learns of the new pets before their clients do, so a
		// client reads its own writes.
		added := make([]Pet, 0, len(batch))
		for _, r := range results {
			if r.err == nil && !r.replayed {
				added = append(added, r.pet)
				s.view.highWater = max(s.view.highWater, r.pet.ID)
			}
		}
		if len(added) > 0 {
			// Only a commit that wrote shows the storage takes writes: one
			// whose every request had expired wrote nothing.
			s.storage.faults.succeeded()
		}
		switch {
		case s.view.master == nil:
			s.view.keepUnviewed(added)
		case s.view.add(added):
			s.view.known.inserted += int64(len(added))
		default:
			s.view.keepUnviewed(added)
			s.startLoad(whyUnsound)
		}
		for i, r := range batch {
			r.done <- results[i]
		}
		return
	}
	if kind, ok := s.classify(err); ok {
		switch kind {
		case faultDamaged:
			s.markDamaged(err.Error())
		case faultIO:
			s.markIOFailed(err)
		}
		refuse(&storageError{kind: kind, err: rootCause(err)})
		return
	}
	if errors.Is(err, errIDNotNew) {
		// The transaction is rolled back: the file went back between the
		// check and the insert.
		s.checkWentBack(w)
		refuse(&storageError{kind: faultWentBack, err: err})
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
	var refusal sqlite3.Error
	if errors.As(err, &refusal) && refusal.Code == sqlite3.ErrConstraint {
		err = &refusedError{cause: refusal.Error()}
	}
	batch[0].done <- writeResult{err: err}
}

// stalledCommit is how long a commit may wait on the storage (a frozen
// filesystem, a stalled disk) before the log says so.
const stalledCommit = 5 * time.Second

// refusedError is a create SQLite refused by a rule the service does not
// know of: an operator's trigger or constraint. It names the rule's
// message, so the client learns why.
type refusedError struct{ cause string }

func (e *refusedError) Error() string { return "the database refused this pet: " + e.cause }

// checkFile returns an error once the path no longer names the opened
// file. The first time, the writer empties the WAL, which is still this
// file's: left with frames, it could be paired with the new file at the
// next start and corrupt it.
func (s *petStore) checkFile(w *batchWriter) error {
	if s.storage.replaced.Load() == nil {
		lost := false
		err := s.file.checkStillThere()
		if err == nil {
			err, lost = s.file.checkWAL()
		}
		if err == nil {
			err = s.file.checkOverwritten(w.currentDataVersion)
			lost = err != nil
		}
		if lost {
			s.storage.framesLost.Store(true)
		}
		if err != nil && !s.markReplaced(err, lost) {
			return err // not a replacement: stat itself failed
		}
	}
	r := s.storage.replaced.Load()
	if r == nil {
		return nil
	}
	// A -wal cut short lost its frames: a checkpoint would read past its
	// end; one that belongs to a file overwritten since would be copied
	// into another file. Any other is still the one SQLite holds open,
	// whole, and is saved.
	if !w.walEmptied && !s.storage.framesLost.Load() {
		w.walEmptied = w.truncateWAL() // else tried again at the next check
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
	if f := s.storage.faults.current(); f != nil && f.kind == faultReadOnly {
		if fresh, err := (*w).reopen(s.writer); err == nil {
			*w = fresh
		}
	}
	// A probe does not wait for a lock another process holds: that would
	// hold up the creates queued behind it.
	ctx := context.Background()
	(*w).setBusyTimeout(0)
	s.storage.commitStart.Store(time.Now().UnixNano())
	err := (*w).inTx(ctx, func() error {
		_, err := (*w).conn.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", len(migrations)))
		return err
	})
	s.storage.commitStart.Store(0)
	if err != nil {
		kind, ok := s.classify(err)
		if !ok {
			return err
		}
		s.storage.faults.failed(kind, err, 0)
		return &storageError{kind: kind, err: err}
	}
	s.storage.faults.succeeded()
	s.file.readOnly.Store(false)
	return nil
}

// batchWriter runs the group commits on the one writer connection, with
// its statements prepared once.
type batchWriter struct {
	conn                      *sql.Conn
	findKey, insert           *sql.Stmt
	beginTx, commitTx, rollTx *sql.Stmt
	beginRead, changes, after *sql.Stmt
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
	if _, err = conn.ExecContext(ctx, fmt.Sprintf("PRAGMA journal_size_limit = %d", walLimit)); err != nil {
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
		{&w.findKey, "SELECT id, name, category_id, status, request_fingerprint FROM pets WHERE idempotency_scope = ? AND idempotency_key = ?"},
		{&w.insert, "INSERT INTO pets (name, category_id, status, idempotency_key, idempotency_scope, request_fingerprint) VALUES (?, ?, ?, ?, ?, ?)"},
		{&w.beginTx, "BEGIN IMMEDIATE"},
		{&w.commitTx, "COMMIT"},
		{&w.rollTx, "ROLLBACK"},
		{&w.beginRead, "BEGIN DEFERRED"},
		{&w.changes, "SELECT inserted, changed FROM pets_changes"},
		{&w.after, "SELECT id, name, category_id, status FROM pets WHERE id > ? ORDER BY id LIMIT ?"},
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
	for _, stmt := range []*sql.Stmt{w.findKey, w.insert, w.beginTx, w.commitTx, w.rollTx, w.beginRead, w.changes, w.after} {
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
	v, ok := w.currentDataVersion()
	if !ok {
		return false
	}
	// The first ask, on a new connection, counts as a change: the file may
	// have changed before there was a value to compare with.
	changed := v != w.dataVersion
	w.dataVersion = v
	return changed
}

// currentDataVersion reads PRAGMA data_version on the writer's connection.
func (w *batchWriter) currentDataVersion() (int64, bool) {
	var v int64
	err := w.conn.QueryRowContext(context.Background(), "PRAGMA data_version").Scan(&v)
	return v, err == nil
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

// walLimit bounds the WAL file on disk (see boundWAL).
const walLimit = 64 << 20

// boundWAL bounds the WAL on disk. SQLite's automatic checkpoints are
// passive: while a reader holds an old snapshot they cannot reach the end
// of the WAL, which then grows with every commit and keeps its size. Once
// a second, a WAL over limit gets a TRUNCATE checkpoint that does not
// wait: if a reader still holds it back, it is tried again a second
// later, and once the reader has let go the WAL shrinks to nothing. A
// passive checkpoint and a look at the file come first: the look checks
// the pages copied against their frames while the WAL still holds them,
// so the truncating checkpoint has nothing left to copy, and a copy of
// the file that lands around it is seen (see checkOverwritten).
func (s *petStore) boundWAL(w *batchWriter, limit int64) {
	fi, err := os.Stat(s.file.path + "-wal")
	if err != nil || fi.Size() <= limit {
		return
	}
	// A busy timeout would stall every create behind a long reader.
	w.setBusyTimeout(0)
	if _, err := w.conn.ExecContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
		return
	}
	if s.checkFile(w) == nil {
		w.truncateWAL()
	}
}

// truncateWAL checkpoints the whole WAL into the database file and
// empties it, without waiting for readers; it reports whether it did.
// SQLite answers a checkpoint that a reader holds back with busy = 1, not
// with an error.
func (w *batchWriter) truncateWAL() bool {
	var busy, frames, done int
	err := w.conn.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(TRUNCATE)").Scan(&busy, &frames, &done)
	return err == nil && busy == 0
}

// commit stores a batch in one transaction and returns each request's
// result, or the error that rolled the transaction back. The statements
// run without the clients' contexts: one client going away must not abort
// the others' transaction.
// check runs first in the transaction; every new id must be above floor.
func (w *batchWriter) commit(batch []*writeRequest, check func() error, floor int64) ([]writeResult, error) {
	ctx := context.Background()
	results := make([]writeResult, len(batch))
	now := time.Now()
	// No lock wait may outlast the soonest deadline in the batch: a create
	// answered after its client's write timeout would be stored behind
	// the client's back.
	wait := time.Duration(busyTimeoutMillis) * time.Millisecond
	for i, r := range batch {
		// A request is taken once; one retried on its own after its batch
		// failed was taken already, and its handler is waiting for it.
		if r.state.Load() != requestTaken && !r.state.CompareAndSwap(requestPending, requestTaken) {
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
		if err := check(); err != nil {
			return err
		}
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
			if err == nil && !replayed && p.ID <= floor {
				return fmt.Errorf("%w: id %d, the highest held %d", errIDNotNew, p.ID, floor)
			}
			results[i] = writeResult{p, replayed, err}
		}
		return nil
	})
	return results, err
}

// errIDNotNew: an insert got an id the service has held before, which
// only a file that went back can give; its transaction is rolled back.
var errIDNotNew = errors.New("an insert got an id already held")

// inReadTx runs fn in a read transaction on the writer connection: a
// snapshot of the file that takes no lock.
func (w *batchWriter) inReadTx(fn func() error) error {
	ctx := context.Background()
	w.leaveTx()
	if _, err := w.beginRead.ExecContext(ctx); err != nil {
		return err
	}
	if err := fn(); err != nil {
		w.rollTx.ExecContext(ctx)
		return err
	}
	_, err := w.commitTx.ExecContext(ctx)
	return err
}

// leaveTx rolls back a transaction the connection is still inside: one
// whose ROLLBACK failed. Left open, it would fail every later BEGIN, and
// so every create. SQLite rolls back by itself after some errors (a full
// disk, an I/O error), so a ROLLBACK that fails is not alone the sign.
func (w *batchWriter) leaveTx() {
	inTx := false
	w.conn.Raw(func(dc any) error {
		inTx = !dc.(*sqlite3.SQLiteConn).AutoCommit()
		return nil
	})
	if inTx {
		w.rollTx.ExecContext(context.Background())
	}
}

// changeCount reads the pets_changes row.
func (w *batchWriter) changeCount() (changeCount, error) {
	var c changeCount
	err := w.changes.QueryRowContext(context.Background()).Scan(&c.inserted, &c.changed)
	return c, err
}

// topID is the highest id the file holds or has handed out: the next
// insert gets a higher one.
func (w *batchWriter) topID() (int64, error) {
	var top int64
	err := w.conn.QueryRowContext(context.Background(), topIDQuery).Scan(&top)
	return top, err
}

// petsAfter reads the pets above id, in order, at most limit+1.
func (w *batchWriter) petsAfter(id int64, limit int) ([]Pet, error) {
	rows, err := w.after.QueryContext(context.Background(), id, limit+1)
	if err != nil {
		return nil, err
	}
	var pets []Pet
	_, err = scanRows(rows, limit+1, func(r *petRow) {
		pets = append(pets, Pet{ID: r.id, Name: string(r.name), CategoryID: r.categoryID, Status: string(r.status)})
	})
	return pets, err
}

// inTx runs fn in an immediate transaction on the writer connection.
func (w *batchWriter) inTx(ctx context.Context, fn func() error) error {
	w.leaveTx()
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
	var key, scope, keyFP any // NULL without an idempotency key
	if c.idempotencyKey != "" {
		fp := c.fingerprint()
		key, scope, keyFP = c.idempotencyKey, c.scope, fp
		var p Pet
		var storedFP []byte
		err := w.findKey.QueryRowContext(ctx, c.scope, c.idempotencyKey).
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
	res, err := w.insert.ExecContext(ctx, c.pet.Name, c.pet.CategoryID, c.pet.Status, key, scope, keyFP)
	if err != nil {
		return Pet{}, false, err
	}
	id, err := res.LastInsertId()
	if err != nil {
		return Pet{}, false, err
	}
	return Pet{ID: id, Name: c.pet.Name, CategoryID: c.pet.CategoryID, Status: c.pet.Status}, false, nil
}
