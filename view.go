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
// catchUp): appends are read in, anything else rebuilds the view in the
// background while creates go on.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"slices"
	"sort"
	"sync/atomic"
	"time"
	"unsafe"
)

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
var statusBytes = func() [3][]byte {
	var b [3][]byte
	for i, s := range petStatuses {
		b[i] = []byte(s)
	}
	return b
}()

// statusIndex is s's position in petStatuses, or -1.
func statusIndex(s string) int {
	return slices.Index(petStatuses, s)
}

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
// status filter walks that status's own positions, not the whole list.
func (c *catalogue) list(f petFilter, fn func(*petRow)) {
	var r petRow
	if f.status == "" {
		start := sort.Search(len(c.ids), func(k int) bool { return c.ids[k] > f.after })
		for i := start; i < len(c.ids) && i < start+f.limit; i++ {
			c.row(i, &r)
			fn(&r)
		}
		return
	}
	positions := c.byStatus[statusIndex(f.status)]
	start := sort.Search(len(positions), func(k int) bool { return c.ids[positions[k]] > f.after })
	for k := start; k < len(positions) && k < start+f.limit; k++ {
		c.row(int(positions[k]), &r)
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

// bytes is the memory the catalogue's arrays hold.
func (c *catalogue) bytes() int {
	n := 8*cap(c.ids) + 8*cap(c.categories) + 4*cap(c.nameEnds) + cap(c.names) + cap(c.statuses)
	for _, p := range c.byStatus {
		n += 4 * cap(p)
	}
	return n
}

// errViewUnloadable: the file holds rows out of order or with an unknown
// status, which the view cannot hold; reads then go to SQLite.
var errViewUnloadable = errors.New("the pets table cannot be held in memory as it is")

// changeCount is the pets_changes row, kept by triggers on pets: how many
// rows were ever inserted, and how many updated or deleted, by anyone.
// Unlike PRAGMA data_version, it moves only for the pets table, not for
// the tables Litestream or an operator's tool keep in the same file.
type changeCount struct{ inserted, changed int64 }

// view is the writer's side of the in-memory catalogue. Every field but
// published belongs to the writer loop.
type view struct {
	// published is what readers use; nil while the view is being loaded
	// or rebuilt, and then reads go to SQLite: never to a view known to
	// be behind the file.
	published atomic.Pointer[catalogue]
	// master is the writer's copy, appended to and then published as a
	// new snapshot; nil while a load runs.
	master *catalogue
	// known is the change count that master reflects: the file has
	// changed under it when the count in the file differs, after the
	// writer's own inserts are counted.
	known changeCount

	// A load runs in the background, on a reader connection, and lands
	// in the writer loop through loaded; reload asks for another, since
	// the file changed again while it ran.
	loading, reload bool
	loaded          chan loadedView
	cancelLoad      context.CancelFunc
	failedAt        time.Time // when a load last failed
	lastFailure     string    // why, so a failure that stays is logged once
	loads           int       // loads so far, the first included, for the log

	// highWater is the highest id the file has held while the service
	// ran: at start, or acknowledged since. A file whose ids no longer
	// reach it went back (see checkWentBack).
	highWater int64
}

// loadedView is a load's outcome.
type loadedView struct {
	c     *catalogue
	known changeCount
	took  time.Duration
	err   error
}

// publish makes the master's current state what readers see.
func (v *view) publish() {
	snapshot := *v.master
	v.published.Store(&snapshot)
}

// loadCatalogue reads the whole table, with the change count it
// reflects, in one read transaction, so no commit falls between the two.
func loadCatalogue(ctx context.Context, db *sql.DB) (*catalogue, changeCount, error) {
	var known changeCount
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, known, err
	}
	defer tx.Rollback()
	var count, nameBytes int
	if err := tx.QueryRowContext(ctx, "SELECT inserted, changed FROM pets_changes").Scan(&known.inserted, &known.changed); err != nil {
		return nil, known, err
	}
	if err := tx.QueryRowContext(ctx, "SELECT count(*), coalesce(sum(length(CAST(name AS BLOB))), 0) FROM pets").Scan(&count, &nameBytes); err != nil {
		return nil, known, err
	}
	// Sized for what is there and an eighth more, so the first appends do
	// not copy every array.
	room := count + count/8 + 1024
	c := &catalogue{
		ids:        make([]int64, 0, room),
		categories: make([]int64, 0, room),
		nameEnds:   make([]uint32, 0, room),
		names:      make([]byte, 0, nameBytes+nameBytes/8+32<<10),
		statuses:   make([]uint8, 0, room),
	}
	rows, err := tx.QueryContext(ctx, "SELECT id, name, category_id, status FROM pets ORDER BY id")
	if err != nil {
		return nil, known, err
	}
	defer rows.Close()
	var r petRow
	for rows.Next() {
		if err := scanPet(rows, &r); err != nil {
			return nil, known, err
		}
		status := statusIndex(string(r.status))
		if status < 0 || !c.add(r.id, r.name, r.categoryID, status) {
			// The CHECK constraint and ORDER BY make this impossible for a
			// sound file; a file that breaks them is served from SQLite.
			return nil, known, errViewUnloadable
		}
	}
	return c, known, rows.Err()
}

// gcHeadroom is the memory the garbage collector may let the rest of the
// heap take above the view before it collects.
const gcHeadroom = 32 << 20

// limitMemory sets the runtime's soft memory limit to the view's arrays
// plus gcHeadroom. The view is long-lived and holds no pointers, so the
// collector never scans it, but by default it would let the heap grow to
// twice the live heap, view included, before collecting: at 1,000,000
// pets that is some 50 MiB of garbage for nothing. The garbage of a
// request is a few KiB, so 32 MiB still means few collections. An operator's
// GOMEMLIMIT wins.
func (v *view) limitMemory() {
	if v.master == nil || os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	limit := int64(math.MaxInt64) // the runtime's default: no limit
	if size := int64(v.master.bytes()); size >= minLimitedView {
		limit = size + gcHeadroom
	}
	debug.SetMemoryLimit(limit)
}

// minLimitedView is the view size from which limitMemory sets a limit;
// below it the default doubling costs little.
const minLimitedView = 16 << 20

// add appends committed pets and publishes them. It reports false, and
// leaves the master as it was, when they do not all come after its last
// id: the view must then be rebuilt.
func (v *view) add(pets []Pet) bool {
	if v.master == nil {
		return false
	}
	if n := len(v.master.ids); n > 0 && len(pets) > 0 && pets[0].ID <= v.master.ids[n-1] {
		return false
	}
	grown := cap(v.master.ids)
	for _, p := range pets {
		// The name's bytes are only copied into the arena, never changed.
		name := unsafe.Slice(unsafe.StringData(p.Name), len(p.Name))
		status := statusIndex(p.Status)
		if status < 0 || !v.master.add(p.ID, name, p.CategoryID, status) {
			v.published.Store(nil)
			v.master = nil
			return false
		}
	}
	if cap(v.master.ids) != grown {
		v.limitMemory()
	}
	v.known.inserted += int64(len(pets))
	v.publish()
	return true
}

// lastID is the highest id in the master, 0 when it is empty.
func (c *catalogue) lastID() int64 {
	if len(c.ids) == 0 {
		return 0
	}
	return c.ids[len(c.ids)-1]
}

// countAbove counts the pets with an id above top, and gives the lowest
// and highest of them.
func (c *catalogue) countAbove(top int64) (n, lo, hi int64) {
	i := sort.Search(len(c.ids), func(k int) bool { return c.ids[k] > top })
	if i == len(c.ids) {
		return 0, 0, 0
	}
	return int64(len(c.ids) - i), c.ids[i], c.ids[len(c.ids)-1]
}

// externalWriteCheck is how often the writer asks SQLite whether another
// connection committed to the file, to bring the view up to date.
const externalWriteCheck = 250 * time.Millisecond

// maxCaughtUp is the most outside appends read in the writer's path; a
// larger import is loaded in the background instead.
const maxCaughtUp = 4096

// startLoad builds the view afresh in the background from a reader
// connection, while creates go on committing. Reads go to SQLite until it
// lands and has caught up (landLoad).
func (s *petStore) startLoad(why string) {
	v := &s.view
	v.published.Store(nil)
	v.master = nil
	if v.loading {
		v.reload = true
		return
	}
	v.loading, v.reload = true, false
	v.loads++
	if v.loads > 1 && why != whyRetry {
		s.log.Info("in-memory view is rebuilt", "why", why, "db", s.file.path)
	}
	ctx, cancel := context.WithCancel(context.Background())
	v.cancelLoad = cancel
	go func() {
		start := time.Now()
		c, known, err := loadCatalogue(ctx, s.readers)
		v.loaded <- loadedView{c: c, known: known, took: time.Since(start), err: err}
	}()
}

// Why a load starts, for the log.
const (
	whyStart   = "start"
	whyRetry   = "an earlier load failed"
	whyOutside = "the pets table changed from outside the service: rows updated, deleted, replaced, or inserted below the last id"
	whyAgain   = "the pets table changed from outside again while the view loaded"
	whyUnsound = "the view could not be brought up to date"
)

// landLoad takes a finished load into the writer loop, catches it up with
// what was committed while it ran, and publishes it.
func (s *petStore) landLoad(w *batchWriter, l loadedView) {
	v := &s.view
	v.loading = false
	v.cancelLoad()
	if v.reload {
		s.startLoad(whyAgain)
		return
	}
	if l.err != nil {
		v.failedAt = time.Now()
		s.storageFault(l.err)
		// Tried again every 10 s; said again only when the cause changes.
		if msg := l.err.Error(); msg != v.lastFailure {
			v.lastFailure = msg
			s.log.Warn("lists and gets are read from SQLite: the in-memory view could not be loaded; it is tried again every 10 s", "err", msg, "db", s.file.path)
		}
		return
	}
	v.lastFailure = ""
	v.master, v.known = l.c, l.known
	// Everything committed while it loaded is read in, however much: the
	// service's own creates go on during a load.
	s.syncView(w, math.MaxInt32)
	if v.master == nil {
		return // the file changed in a way that needs another load
	}
	v.publish()
	v.limitMemory()
	s.log.Info("in-memory view loaded", "pets", len(v.master.ids), "bytes", v.master.bytes(),
		"took", l.took.Round(time.Millisecond).String())
}

// syncView brings the view up to date with the file, in a read
// transaction of the writer's connection, outside any commit, reading in
// at most limit appended rows.
func (s *petStore) syncView(w *batchWriter, limit int) {
	if err := w.inReadTx(func() error { return s.catchUp(w, limit) }); err != nil {
		if _, ok := classifyFault(err); !ok {
			s.log.Warn("in-memory view could not be brought up to date; it is rebuilt", "err", err.Error(), "db", s.file.path)
		}
		s.startLoad(whyUnsound)
	}
}

// catchUp compares the file's change count with the one the view knows,
// inside a transaction of the writer's connection: in a commit, before
// its inserts, so no outside change is passed over. Outside appends are
// read and added; any other change (an update, a delete, a restore)
// starts a rebuild. A file that went back is refused: checkWentBack.
// At most limit appended rows are read in; more are loaded in the
// background instead.
func (s *petStore) catchUp(w *batchWriter, limit int) error {
	v := &s.view
	cur, err := w.changeCount()
	if err != nil {
		if _, ok := classifyFault(err); ok {
			return err
		}
		cur = changeCount{-1, -1} // no count: an older copy of the file, say
	}
	if v.master != nil && cur == v.known {
		return nil
	}
	if err := s.checkWentBack(w); err != nil {
		return err
	}
	if v.master == nil {
		return nil // a load is on its way, and catches up when it lands
	}
	if added := cur.inserted - v.known.inserted; cur.changed == v.known.changed && added > 0 && added <= int64(limit) {
		pets, err := w.petsAfter(v.master.lastID(), limit)
		if err != nil {
			return err
		}
		if int64(len(pets)) == added && v.add(pets) {
			v.known = cur
			return nil
		}
	}
	s.startLoad(whyOutside)
	return nil
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
	// The view, when it is loaded, knows every pet the file held; while
	// it loads, the ids above the file's are counted as missing (dense
	// unless rows were deleted by hand).
	n, lo, hi := s.view.highWater-top, top+1, s.view.highWater
	if c := s.view.master; c != nil {
		n, lo, hi = c.countAbove(top)
	}
	se := &storageError{kind: faultWentBack, err: fmt.Errorf("the file's highest id is %d, but the service held pets up to id %d", top, s.view.highWater)}
	return s.lastingFault(se, "the database file went back: it no longer holds pets the service stored, so creates are refused until a restart; "+
		"if the older file is what you meant to serve, restart the service, which serves it and issues ids above every id in it; "+
		"otherwise stop the service and put the newer file back (docs/operations.md: Outside writes, restores and replicas)",
		"missing_pets", n, "missing_ids", fmt.Sprintf("%d-%d", lo, hi), "file_top_id", top)
}
