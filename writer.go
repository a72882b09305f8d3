// The writer: creates queue for one goroutine that owns the one writer
// connection and commits whatever is queued in one transaction and one
// fsync (group commit). A 201 is sent only after its commit, and after
// the files it went to are seen still at their paths.

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// errClosed is returned for writes after close.
var errClosed = errors.New("store is closed")

// errTimedOut refuses a create whose commit could not begin before its
// deadline; it was not stored.
var errTimedOut = &storageError{kind: faultTimedOut, err: errors.New("the create's deadline passed before its commit began")}

// writeQueue carries creates to the writer loop.
type writeQueue struct {
	// writes feeds the group-commit loop. mu guards closing it: senders
	// hold it shared, close holds it exclusively.
	writes   chan *writeRequest
	mu       sync.RWMutex
	closed   bool
	loopDone chan struct{}
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
	var expired <-chan time.Time // never, without a deadline
	if !c.deadline.IsZero() {
		timer := time.NewTimer(time.Until(c.deadline))
		defer timer.Stop()
		expired = timer.C
	}
	s.queue.mu.RLock()
	err := errClosed
	if !s.queue.closed {
		select {
		case s.queue.writes <- w:
			err = nil
		case <-ctx.Done():
			err = ctx.Err()
		case <-expired:
			err = errTimedOut
		}
	}
	s.queue.mu.RUnlock()
	if err != nil {
		return Pet{}, false, err
	}
	// Once queued, wait for the outcome even if the client has gone: the
	// row may be committed, and the answer must say what happened. At the
	// deadline, a create the writer has not taken yet is given up, and so
	// never stored; one it has taken is answered with its outcome,
	// however late.
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

// checkpointEvery is how many commits the writer lets into the WAL
// before it checkpoints them into the database file, about SQLite's own
// 1,000 pages.
const checkpointEvery = 200

// writeLoop owns the writer connection. It takes whatever creates are
// queued, up to maxBatch, and commits them in one transaction with one
// fsync. A lone create is committed at once, and creates that arrive
// meanwhile queue for the next batch, which is how batches form under
// load; a batch after one with company waits a moment for as much (see
// gather). Once a second it also looks at the files,
// checkpoints, and tries a write that stores nothing while a storage
// fault is in force, to see it clear, or while the disk looks full or
// read-only, to see it begin (see storageDoubtful).
func (s *petStore) writeLoop(w *batchWriter, checked <-chan error) {
	defer close(s.queue.loopDone)
	w = s.startUp(w, checked)
	// A -wal laid at the path since the last look is moved aside before
	// a stop, so the restart the log asks for does not replay it.
	defer func() { s.keepIDs(w); s.keepInPlace(w); w.close() }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	watch := time.NewTicker(externalWriteCheck)
	defer watch.Stop()
	batch := make([]*writeRequest, 0, maxBatch)
	lastBatch := 0
	for {
		select {
		case first, ok := <-s.queue.writes:
			if !ok {
				return
			}
			batch = s.gather(append(batch[:0], first), lastBatch)
			lastBatch = len(batch)
			s.commit(w, batch)
		case <-watch.C:
			// The view catches up with the file, in a read transaction,
			// outside any commit.
			s.storageFault(w.tx(context.Background(), w.beginRead, func() error { return s.catchUp(w) }))
		case <-tick.C:
			// Also when idle, a file deleted or replaced under the service
			// is seen, and saved, within a second.
			switch which := s.file.vanished(); {
			case s.lasting.Load() != nil:
				s.keepIDs(w)
				s.keepInPlace(w)
			case which != "":
				s.saveVanished(w, which)
			case s.faults.current() != nil || s.storageDoubtful():
				// A probe's frames are checkpointed like a commit's: on a
				// nearly full disk the -wal must not grow by one a second.
				s.probeWrite(&w)
				if w.commits > 0 {
					s.checkpoint(w)
				}
			case w.commits > 0:
				s.checkpoint(w)
			}
			if s.countsShort.Swap(false) && s.lasting.Load() == nil {
				ctx := context.Background()
				s.storageFault(w.tx(ctx, w.beginRead, func() error {
					s.load(w, "the file holds fewer pets than its counts say")
					return nil
				}))
			}
		}
	}
}

// commitDelay is how long a batch waits for company when the one
// before it had some (see gather).
const commitDelay = time.Millisecond

// gather fills a batch: every create already queued, up to maxBatch.
// When nothing more is queued and the last batch held more than one
// create, it waits up to commitDelay for the batch to grow as large as
// that one: under load the clients answered by a commit send their next
// creates within a round trip, and without the wait each commit would
// take the first few of them and pay a whole fsync for those alone. A
// lone create, or the first after a lull, is committed at once.
func (s *petStore) gather(batch []*writeRequest, lastBatch int) []*writeRequest {
	var timer *time.Timer // started at the first wait
	for len(batch) < maxBatch {
		var r *writeRequest
		ok := true
		select {
		case r, ok = <-s.queue.writes:
		default:
			if lastBatch < 2 || len(batch) >= lastBatch {
				return batch
			}
			if timer == nil {
				timer = time.NewTimer(commitDelay)
				defer timer.Stop()
			}
			select {
			case r, ok = <-s.queue.writes:
			case <-timer.C:
				return batch
			}
		}
		if !ok {
			return batch // closed: the loop ends after this batch
		}
		batch = append(batch, r)
	}
	return batch
}

// commit stores a batch and answers every request in it. A storage fault
// refuses the whole batch with a storageError and is logged once, not per
// request.
func (s *petStore) commit(w *batchWriter, batch []*writeRequest) {
	refuse := func(err error) {
		for _, r := range batch {
			r.done <- writeResult{err: err}
		}
	}
	if f := s.lasting.Load(); f != nil {
		refuse(f)
		return
	}
	start := time.Now()
	s.commitStart.Store(start.UnixNano())
	stalled := time.AfterFunc(stalledCommit, func() {
		s.log.Warn("a commit is waiting on the storage: its creates are answered when it ends", "waited", stalledCommit.String(), "creates", len(batch), "db", s.file.path)
	})
	// Inside the transaction, before its inserts: the view catches up
	// with any outside change, and a file that went back is refused.
	results, err := w.commit(batch, func() error { return s.catchUp(w) }, s.view.highWater)
	var added []Pet
	if err == nil {
		added = newPets(results)
		// Before any 201, inside the stall's watch: on a frozen
		// filesystem this write waits as a commit does.
		s.noteAcked(added)
	}
	s.commitStart.Store(0)
	if !stalled.Stop() {
		s.log.Warn("the stalled commit ended", "took", time.Since(start).Round(time.Millisecond).String(), "committed", err == nil, "db", s.file.path)
	}
	if err == nil {
		// A file removed or replaced before or during the commit: the
		// batch went to the file SQLite holds open, and is acknowledged
		// only if it is in the saved file the log names. One look a
		// commit, after it, is enough: the first commit after the change
		// finds it.
		if which := s.file.vanished(); which != "" && !s.saveVanished(w, which) {
			refuse(s.lasting.Load())
			return
		}
		s.committed(w, batch, results, added)
		return
	}
	var se *storageError
	switch {
	case errors.As(s.storageFault(err), &se) && se.kind < faultIO:
		// A create given up at its deadline was answered "timed out", not
		// refused by this fault.
		refused := 0
		for _, r := range batch {
			if r.state.Load() != requestAbandoned {
				refused++
			}
		}
		s.faults.failed(se.kind, err, refused)
		refuse(se)
	case se != nil:
		refuse(se)
	case errors.Is(err, errIDNotNew):
		// The transaction is rolled back. The file went back in a way its
		// top id does not show (a pets table without AUTOINCREMENT, a
		// sequence row SQLite does not use), and lasts as checkWentBack's.
		refuse(s.lastingFault(&storageError{kind: faultWentBack, err: err}, "the database file went back: an insert got an id acknowledged before, "+
			"so creates are refused until a restart (docs/operations.md: Outside writes, restores and replicas)"))
		s.view.known = changeCount{-1, -1, -1} // the next look loads the view: reads serve what the file holds
	case len(batch) > 1:
		// One bad request must not fail its neighbours: the transaction is
		// rolled back, so commit each on its own and let only the culprit
		// fail.
		for _, r := range batch {
			s.commit(w, []*writeRequest{r})
		}
	default:
		if refusal := constraintRefusal(err); refusal != nil {
			err = fmt.Errorf("%w: %s", errRefusedByDatabase, refusal.Error())
		}
		batch[0].done <- writeResult{err: err}
	}
}

// newPets are the pets a committed batch stored, in id order (ids ascend
// within a transaction; view.add relies on it too): not those replayed
// for an Idempotency-Key, nor those given up at their deadline.
func newPets(results []writeResult) []Pet {
	added := make([]Pet, 0, len(results))
	for _, r := range results {
		if r.err == nil && !r.replayed {
			added = append(added, r.pet)
		}
	}
	return added
}

// committed answers a batch that was committed, which stored added. The
// view learns of the new pets before their clients do, so a client reads
// its own writes.
func (s *petStore) committed(w *batchWriter, batch []*writeRequest, results []writeResult, added []Pet) {
	if len(added) > 0 {
		// Only a commit that wrote shows the storage takes writes: one
		// whose every request had expired wrote nothing.
		s.faults.succeeded()
		w.commits++
		s.view.highWater = max(s.view.highWater, added[len(added)-1].ID)
	}
	s.view.add(added)
	for i, r := range batch {
		r.done <- results[i]
	}
	if w.commits >= checkpointEvery {
		s.checkpoint(w)
	}
}

// noteAcked records a committed batch's new pets in the -acked record
// (see ackedSuffix) before any of them is answered. Without a view the
// file's counts are not known, and the record is left as it was rather
// than made blind.
func (s *petStore) noteAcked(added []Pet) {
	if len(added) == 0 || s.view.master == nil {
		return
	}
	top := max(s.view.highWater, added[len(added)-1].ID) // ids ascend in a transaction
	s.file.noteAcked(s.view.known.inserted+int64(len(added)), top)
}

// checkpoint copies the committed pages into the database file. The
// writer connection checkpoints only here, never automatically inside a
// commit, where SQLite ignores a failed checkpoint: after one failed
// fsync, a later one may report success for pages the kernel dropped,
// and the WAL would then be started over with its frames lost. So a
// checkpoint that fails with an I/O error is a lasting fault (see
// storageFault), and none follows it.
func (s *petStore) checkpoint(w *batchWriter) {
	w.commits = 0 // one held back by a reader is tried again later
	// A lasting fault is recorded; any other error is tried again later.
	s.storageFault(w.checkpoint("PASSIVE"))
}

// errRefusedByDatabase is a create SQLite refused by a rule the service
// does not know of: an operator's trigger or constraint. The error that
// wraps it names the rule's message, so the client learns why.
var errRefusedByDatabase = errors.New("the database refused this pet")

// probeSQL is a write that stores nothing and touches what a create
// touches: a pet of the longest name and an Idempotency-Key is inserted
// and deleted, and the change count and the id sequence are put back. A
// write of fewer pages can fit on a disk where a create does not, and
// would clear a fault that creates still meet.
var probeSQL = `INSERT INTO pets (name, category_id, status, idempotency_key, idempotency_scope, request_fingerprint)
		VALUES ('` + strings.Repeat("p", maxNameLength) + `', 1, 'available', 'petstore-probe', x'00', x'00');
	DELETE FROM pets WHERE id = last_insert_rowid();
	UPDATE pets_changes SET inserted = inserted - 1, changed = changed - 1, deleted = deleted - 1;
	UPDATE sqlite_sequence SET seq = seq - 1 WHERE name = 'pets';`

// probeWrite runs probeSQL in a transaction, to learn whether a pet could
// be stored now; its outcome begins or ends a fault in the fault log.
// During a read-only fault the writer connection is replaced first, so
// the store recovers once the file can be written again.
func (s *petStore) probeWrite(w **batchWriter) {
	if s.lasting.Load() != nil {
		return
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
	defer (*w).setBusyTimeout(busyTimeoutMillis)
	s.commitStart.Store(time.Now().UnixNano())
	err := (*w).inTx(ctx, func() error {
		_, err := (*w).conn.ExecContext(ctx, probeSQL)
		return err
	})
	s.commitStart.Store(0)
	var se *storageError
	switch {
	case err == nil:
		s.faults.succeeded()
		s.file.readOnly.Store(false)
		(*w).commits++
	case errors.As(s.storageFault(err), &se) && se.kind < faultIO:
		s.faults.failed(se.kind, err, 0)
	}
}

// batchWriter runs the group commits on the one writer connection, with
// its statements prepared once.
type batchWriter struct {
	conn                      *sql.Conn
	findKey, insert           *sql.Stmt
	beginTx, commitTx, rollTx *sql.Stmt
	beginRead, changes        *sql.Stmt
	commits                   int // commits since the last checkpoint
}

func newBatchWriter(db *sql.DB) (*batchWriter, error) {
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	w := &batchWriter{conn: conn}
	// The writer checkpoints itself (see petStore.checkpoint). After a
	// checkpoint has emptied the WAL, the next commit cuts the file back
	// to 64 MiB, so a WAL that grew behind a long reader does not keep
	// its size on disk for ever.
	if _, err = conn.ExecContext(ctx, "PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = 67108864"); err != nil {
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
		{&w.changes, changeCountQuery},
	} {
		if *st.stmt, err = conn.PrepareContext(ctx, st.text); err != nil {
			w.close()
			return nil, err
		}
	}
	return w, nil
}

// close closes the statements and gives the connection back to its pool.
func (w *batchWriter) close() {
	for _, stmt := range []*sql.Stmt{w.findKey, w.insert, w.beginTx, w.commitTx, w.rollTx, w.beginRead, w.changes} {
		if stmt != nil {
			stmt.Close()
		}
	}
	w.conn.Close()
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
	w.conn.Raw(func(any) error { return driver.ErrBadConn }) // not back to the pool
	w.close()
	return fresh, nil
}

// setBusyTimeout sets how long the connection's statements wait for a
// lock another process holds before they fail.
func (w *batchWriter) setBusyTimeout(millis int) {
	w.conn.ExecContext(context.Background(), fmt.Sprintf("PRAGMA busy_timeout = %d", millis))
}

// checkpoint runs PRAGMA wal_checkpoint in the given mode. A checkpoint
// that readers kept from finishing is an error too: SQLite reports it
// with busy = 1, not with an error.
func (w *batchWriter) checkpoint(mode string) error {
	var busy, frames, done int
	err := w.conn.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint("+mode+")").Scan(&busy, &frames, &done)
	if err == nil && busy != 0 {
		err = fmt.Errorf("checkpoint(%s) held back by a reader: %d of %d frames copied", mode, done, frames)
	}
	return err
}

// commit stores a batch in one transaction and returns each request's
// result, or the error that rolled the transaction back. The statements
// run without the clients' contexts: one client going away must not abort
// the others' transaction. check runs first in the transaction; every
// new id must be above floor.
func (w *batchWriter) commit(batch []*writeRequest, check func() error, floor int64) ([]writeResult, error) {
	ctx := context.Background()
	results := make([]writeResult, len(batch))
	now := time.Now()
	for i, r := range batch {
		// A request is taken once; one retried on its own after its batch
		// failed was taken already, and its handler is waiting for it.
		taken := r.state.Load() == requestTaken || r.state.CompareAndSwap(requestPending, requestTaken)
		if !taken || !r.req.deadline.IsZero() && !r.req.deadline.After(now) {
			results[i].err = errTimedOut // its handler gave up, or will: not stored
		}
	}
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

// inTx runs fn in an immediate transaction on the writer connection.
func (w *batchWriter) inTx(ctx context.Context, fn func() error) error {
	return w.tx(ctx, w.beginTx, fn)
}

// tx runs fn between begin and COMMIT, and rolls back if either fails.
// A transaction the connection is still inside (its ROLLBACK failed) is
// left first: left open, it would fail every later BEGIN, and so every
// create. SQLite rolls back by itself after some errors (a full disk, an
// I/O error), so a ROLLBACK that fails is not alone the sign.
func (w *batchWriter) tx(ctx context.Context, begin *sql.Stmt, fn func() error) error {
	inTx := false
	w.conn.Raw(func(dc any) error {
		inTx = inTransaction(dc)
		return nil
	})
	if inTx {
		w.rollTx.ExecContext(ctx)
	}
	if _, err := begin.ExecContext(ctx); err != nil {
		return err
	}
	err := fn()
	if err == nil {
		_, err = w.commitTx.ExecContext(ctx)
	}
	if err != nil {
		w.rollTx.ExecContext(ctx)
	}
	return err
}

// raiseSequence raises the file's id sequence to at least top, in a
// transaction of its own.
func (w *batchWriter) raiseSequence(top int64) error {
	ctx := context.Background()
	return w.inTx(ctx, func() error {
		_, err := w.conn.ExecContext(ctx, raiseSequenceSQL, top)
		return err
	})
}

// topID is the highest id the file holds or has handed out: the next
// insert gets a higher one.
func (w *batchWriter) topID() (int64, error) {
	var top int64
	err := w.conn.QueryRowContext(context.Background(), topIDQuery).Scan(&top)
	return top, err
}

// insertPet does one create inside the batch's transaction. The key lookup
// and the insert share the transaction, so two requests with one key, even
// in the same batch, cannot both insert; the unique index would refuse the
// second anyway.
func (w *batchWriter) insertPet(ctx context.Context, c createRequest) (Pet, bool, error) {
	var key, scope, keyFP any // NULL without an idempotency key
	if c.idempotencyKey != "" {
		// The fingerprint identifies what the create asks for, after
		// defaults: two bodies that would store the same pet have the same
		// one. NUL cannot occur in a valid name, so the fields cannot run
		// together.
		sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%s", c.pet.Name, c.pet.CategoryID, c.pet.Status))
		key, scope, keyFP = c.idempotencyKey, c.scope, sum[:]
		var p Pet
		var storedFP []byte
		err := w.findKey.QueryRowContext(ctx, c.scope, c.idempotencyKey).
			Scan(&p.ID, &p.Name, &p.CategoryID, &p.Status, &storedFP)
		switch {
		case err == nil && bytes.Equal(storedFP, sum[:]):
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
	id, _ := res.LastInsertId() // go-sqlite3's never fails
	return Pet{ID: id, Name: c.pet.Name, CategoryID: c.pet.CategoryID, Status: c.pet.Status}, false, nil
}
