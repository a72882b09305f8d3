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

package main

import (
	"context"
	"database/sql"
	"fmt"
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
var statusBytes = [3][]byte{[]byte(petStatuses[0]), []byte(petStatuses[1]), []byte(petStatuses[2])}

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
// status filter walks that status's own positions,
// not the whole list.
func (c *catalogue) list(f petFilter, fn func(*petRow)) {
	var r petRow
	if f.status == "" {
		start := sort.Search(len(c.ids), func(k int) bool { return c.ids[k] > f.after })
		end := min(len(c.ids), start+f.limit)
		for i := start; i < end; i++ {
			c.row(i, &r)
			fn(&r)
		}
		return
	}
	positions := c.byStatus[statusIndex(f.status)]
	start := sort.Search(len(positions), func(k int) bool { return c.ids[positions[k]] > f.after })
	end := min(len(positions), start+f.limit)
	for k := start; k < end; k++ {
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

// changeCount is the pets_changes row, kept by triggers on pets: how many
// rows were ever inserted, and how many updated or deleted, by anyone.
// Unlike PRAGMA data_version, it moves only for the pets table, not for
// the tables Litestream or an operator's tool keep in the same file.
type changeCount struct{ inserted, changed int64 }

// view is the writer's side of the in-memory catalogue. Every field but
// published belongs to the writer loop.
type view struct {
	// published is what readers use; nil until a load has worked, and
	// after one failed: reads then get a 503, never a view known to be
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
// gets are answered 503 until the file is restored.
func loadCatalogue(ctx context.Context, q *sql.Conn) (*catalogue, changeCount, error) {
	var known changeCount
	if err := q.QueryRowContext(ctx, "SELECT inserted, changed FROM pets_changes").Scan(&known.inserted, &known.changed); err != nil {
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
		status := statusIndex(string(r.status))
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
		status := statusIndex(p.Status)
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
		s.log.Warn("the in-memory view could not be loaded: lists and gets are answered 503 until it is; it is tried again every 10 s unless the file is damaged",
			"err", err.Error(), "db", s.file.path)
		return
	}
	v.master, v.known = c, known
	v.publish()
	// The view replaced is garbage now, as large as the new one: given
	// back to the system at once, where the runtime would keep it for
	// minutes (at 1,000,000 pets, 140 MiB of RSS after a reload). In a
	// goroutine of its own: the writer, which may be inside a commit,
	// does not wait for a collection.
	go debug.FreeOSMemory()
	s.log.Info("in-memory view loaded", "pets", len(c.ids), "took", time.Since(start).Round(time.Millisecond).String())
}

// Why a load starts, for the log.
const (
	whyStart   = "start"
	whyRetry   = "an earlier load failed"
	whyOutside = "the pets table changed from outside the service"
)

// syncView brings the view up to date with the file, in a read
// transaction of the writer's connection, outside any commit.
func (s *petStore) syncView(w *batchWriter) {
	if err := w.inReadTx(func() error { return s.catchUp(w) }); err != nil {
		s.storageFault(err)
	}
}

// catchUp compares the file's change count with the one the view knows,
// inside a transaction of the writer's connection: in a commit, before
// its inserts, so no outside change is passed over. Any change, an
// append included, loads the view again. A file that went back is
// refused: checkWentBack.
func (s *petStore) catchUp(w *batchWriter) error {
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
	// A file that went back is loaded too: reads serve what it holds.
	wentBack := s.checkWentBack(w)
	switch {
	case v.master != nil:
		s.load(w, whyOutside)
	case s.lasting.Load() == nil && time.Since(v.failedAt) > 10*time.Second:
		s.load(w, whyRetry)
	}
	if wentBack != nil {
		return wentBack
	}
	// Damage the load found refuses the commit it ran in.
	if f := s.lasting.Load(); f != nil {
		return f
	}
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
	// Ids are dense unless rows were deleted by hand, so the count is of
	// the ids above the file's, at most that many pets.
	n, lo, hi := s.view.highWater-top, top+1, s.view.highWater
	se := &storageError{kind: faultWentBack, err: fmt.Errorf("the file's highest id is %d, but the service held pets up to id %d", top, s.view.highWater)}
	return s.lastingFault(se, "the database file went back: it no longer holds pets the service stored, so creates are refused until a restart; "+
		"if the older file is what you meant to serve, restart the service, which serves it and issues ids above every id in it; "+
		"otherwise stop the service and put the newer file back (docs/operations.md: Outside writes, restores and replicas)",
		"missing_pets", n, "missing_ids", fmt.Sprintf("%d-%d", lo, hi), "file_top_id", top)
}
