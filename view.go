// The in-memory view: lists and gets are answered from memory, at memory
// speed, while SQLite stays the durable store and the view's source.
//
// Pets never change once stored (no update, no delete) and one writer in
// this process commits every create, so an exact copy is cheap to keep:
// an append-only columnar catalogue that the writer extends after each
// commit, before any client hears of it, and publishes to readers as an
// immutable snapshot through one atomic pointer. Readers never wait on the
// writer. A write from outside the process (an operator's sqlite3 shell, a
// restore) is seen through PRAGMA data_version, and the view is rebuilt.

package main

import (
	"context"
	"database/sql"
	"errors"
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

// view is the writer's side of the in-memory catalogue.
type view struct {
	// published is what readers use; nil while the view is being loaded
	// or rebuilt, and then reads go to SQLite.
	published atomic.Pointer[catalogue]
	// master is the writer's copy, appended to and then published as a
	// new snapshot. Only the writer loop touches it.
	master *catalogue
	// failedAt is when the view last failed to load (writer only).
	failedAt time.Time
}

// publish makes the master's current state what readers see.
func (v *view) publish() {
	snapshot := *v.master
	v.published.Store(&snapshot)
}

// load builds the view afresh from the database, read through conn (the
// writer's connection, so no commit of ours can fall between the read and
// the publication). Readers use SQLite meanwhile.
func (v *view) load(ctx context.Context, conn *sql.Conn) error {
	v.published.Store(nil)
	v.master = nil
	var count, nameBytes int
	if err := conn.QueryRowContext(ctx, "SELECT count(*), coalesce(sum(length(CAST(name AS BLOB))), 0) FROM pets").Scan(&count, &nameBytes); err != nil {
		return err
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
	rows, err := conn.QueryContext(ctx, "SELECT id, name, category_id, status FROM pets ORDER BY id")
	if err != nil {
		return err
	}
	defer rows.Close()
	var r petRow
	for rows.Next() {
		if err := rows.Scan(&r.id, &r.name, &r.categoryID, &r.status); err != nil {
			return err
		}
		status := statusIndex(string(r.status))
		if status < 0 || !c.add(r.id, r.name, r.categoryID, status) {
			// The CHECK constraint and ORDER BY make this impossible for a
			// sound file; a file that breaks them is served from SQLite.
			return errViewUnloadable
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	v.master = c
	v.publish()
	return nil
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

// add appends committed pets and publishes them. It reports false when
// the view can no longer be extended and must be rebuilt.
func (v *view) add(pets []Pet) bool {
	if v.master == nil {
		return false
	}
	grown := cap(v.master.ids)
	defer func() {
		if v.master != nil && cap(v.master.ids) != grown {
			v.limitMemory()
		}
	}()
	for _, p := range pets {
		// The name's bytes are only copied into the arena, never changed.
		name := unsafe.Slice(unsafe.StringData(p.Name), len(p.Name))
		if !v.master.add(p.ID, name, p.CategoryID, statusIndex(p.Status)) {
			v.published.Store(nil)
			v.master = nil
			return false
		}
	}
	v.publish()
	return true
}

// externalWriteCheck is how often the writer asks SQLite whether another
// process wrote to the file, to rebuild the view.
const externalWriteCheck = 250 * time.Millisecond

// loadView (re)builds the in-memory view from the file. If it cannot be
// built, reads are served from SQLite, and it is tried again later.
func (s *petStore) loadView(w *batchWriter) {
	start := time.Now()
	if err := s.view.load(context.Background(), w.conn); err != nil {
		s.view.failedAt = time.Now()
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
	return time.Since(s.view.failedAt) > 10*time.Second
}
