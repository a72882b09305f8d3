// The rescue: when the files under the service lose pets it acknowledged
// (a -wal cut short or overwritten, the database overwritten in place),
// every pet it holds in memory is written beside the database, and the
// next start puts back the ones the file no longer has.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// rescuePath is where the pets are saved: beside the database, so on the
// same storage and found by the next start without configuration.
func (d *dbFile) rescuePath() string { return d.path + "-rescue" }

// Where a rescue's pets came from, stored in it: they decide how the
// next start puts them back.
const (
	// rescueFromView: the view as it was, every pet acknowledged and every
	// outside change read in. A pet the file holds otherwise is set back
	// to what the view held.
	rescueFromView = "view"
	// rescueFromStale: the view as it was when an outside change started
	// a rebuild, and the pets acknowledged since. Only pets the file lacks
	// are put back: the file may hold newer outside changes.
	rescueFromStale = "stale view"
	// rescueFromFile: no view at all (the first load had not finished):
	// what could still be read from the files, and the pets acknowledged
	// since the start. Only pets the file lacks are put back.
	rescueFromFile = "file"
)

// rescueSource is what the rescue saves: the pets of c, then extra.
type rescueSource struct {
	c     *catalogue
	extra []Pet
	from  string
}

// writeRescue writes the pets to a new SQLite file at path: a name is
// kept byte for byte, whatever it holds. It is written beside, synced and
// renamed into place: a crash leaves the whole file or none.
func writeRescue(path string, src rescueSource) (n int, err error) {
	tmp := path + ".partial"
	os.Remove(tmp)
	defer os.Remove(tmp)
	// A rollback journal, not WAL: the rescue is one file.
	db, err := sql.Open("sqlite3", "file:"+tmp+"?_journal_mode=DELETE&_synchronous=FULL")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	tx, err := db.Begin()
	if err != nil {
		return 0, err
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`CREATE TABLE rescued_pets (
			id INTEGER PRIMARY KEY, name TEXT NOT NULL, category_id INTEGER NOT NULL, status TEXT NOT NULL);
		CREATE TABLE rescue (source TEXT NOT NULL, written TEXT NOT NULL);`); err != nil {
		return 0, err
	}
	if _, err := tx.Exec("INSERT INTO rescue VALUES (?, ?)", src.from, time.Now().UTC().Format(time.RFC3339)); err != nil {
		return 0, err
	}
	insert, err := tx.Prepare("INSERT OR REPLACE INTO rescued_pets VALUES (?, ?, ?, ?)")
	if err != nil {
		return 0, err
	}
	if src.c != nil {
		var r petRow
		for i := range src.c.ids {
			src.c.row(i, &r)
			// A string, not the bytes: bound as TEXT, byte for byte.
			if _, err := insert.Exec(r.id, string(r.name), r.categoryID, string(r.status)); err != nil {
				return 0, err
			}
		}
	}
	for _, p := range src.extra {
		if _, err := insert.Exec(p.ID, p.Name, p.CategoryID, p.Status); err != nil {
			return 0, err
		}
	}
	if err := tx.QueryRow("SELECT count(*) FROM rescued_pets").Scan(&n); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	if err := db.Close(); err != nil {
		return 0, err
	}
	if err := syncPath(tmp); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, err
	}
	return n, syncPath(filepath.Dir(path))
}

// rescue saves the pets the service holds, once the files were found to
// have lost some. It runs on the writer loop, which owns the view.
func (s *petStore) rescue() (n int, from string, err error) {
	v := &s.view
	src := rescueSource{c: v.master, from: rescueFromView}
	if v.master == nil {
		src = rescueSource{c: v.stale, extra: v.unviewed, from: rescueFromStale}
		if v.stale == nil {
			// Best effort: the files were just found tampered with.
			c, _, readErr := loadCatalogue(context.Background(), s.readers)
			src = rescueSource{c: c, extra: v.unviewed, from: rescueFromFile}
			if readErr != nil {
				src.c = nil
				err = fmt.Errorf("only the %d pets acknowledged since the start could be saved: the rest could not be read (%v)", len(v.unviewed), readErr)
			}
		}
	}
	n, writeErr := writeRescue(s.file.rescuePath(), src)
	return n, src.from, errors.Join(err, writeErr)
}

// logRescue saves the pets and says, in one line, what happened and what
// to do.
func (s *petStore) logRescue(se *storageError) {
	s.file.markForCheck()
	n, from, err := s.rescue()
	const happened = "the database file or its -wal was changed under the running service by something other than SQLite, and pets it acknowledged are no longer in them: creates are refused from now on"
	if err != nil && n == 0 {
		s.log.Error(happened+"; the pets could not be saved: stop nothing yet, fetch what the API still serves (GET /v1/pets), "+
			"then restore the file from the replica or a backup (README: Outside writes, restores and replicas)",
			"db", s.file.path, "err", se.err.Error(), "save_err", err.Error())
		return
	}
	args := []any{"db", s.file.path, "err", se.err.Error(), "saved", n, "saved_from", from, "rescue", s.file.rescuePath()}
	if err != nil {
		args = append(args, "save_err", err.Error())
	}
	s.log.Error(happened+"; the pets the service holds are saved: stop Litestream and any other process that has the database open, "+
		"then restart the service: it sets the -wal aside, checks the file and puts back each saved pet the file lacks (README: Outside writes, restores and replicas)",
		args...)
}

// setAsideTampered runs at start, before SQLite opens the file, when the
// last run left a rescue: the -wal it found cut short, or that belongs
// to the file as it was before it was overwritten, is renamed aside, and
// the -shm goes, so SQLite opens the database file alone: as it was at
// its last checkpoint, which is whole. Another process holding the file
// open (Litestream, a sqlite3 shell) would keep the old index: then the
// start is refused.
func setAsideTampered(d *dbFile) (setAside string, err error) {
	if _, err := os.Stat(d.rescuePath()); err != nil {
		return "", nil
	}
	shm := d.path + "-shm"
	if f, err := os.Open(shm); err == nil {
		// Every connection holds a read lock on this byte (SQLite's DMS).
		lk := syscall.Flock_t{Type: syscall.F_WRLCK, Start: 128, Len: 1}
		err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lk)
		f.Close()
		if err == nil && lk.Type != syscall.F_UNLCK {
			return "", fmt.Errorf("the last run saved its pets to %s after the files were tampered with, and process %d still has the database open: "+
				"stop it (Litestream, a sqlite3 shell), then start the service again to put the pets back", d.rescuePath(), lk.Pid)
		}
	}
	if _, err := os.Stat(d.path + "-wal"); err == nil {
		setAside = fmt.Sprintf("%s-wal.tampered-%s", d.path, time.Now().UTC().Format("20060102T150405Z"))
		if err := os.Rename(d.path+"-wal", setAside); err != nil {
			return "", fmt.Errorf("set aside the tampered -wal: %w", err)
		}
	}
	if err := os.Remove(shm); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("remove the -shm of the tampered -wal: %w", err)
	}
	return setAside, syncPath(filepath.Dir(d.path))
}

// putBackRescued runs at start, once the file is open and checked: every
// saved pet the file lacks is inserted with its id, and, when the rescue
// was of the whole view, one the file holds otherwise is set to what the
// service acknowledged; in one transaction. Then the rescue file is
// removed. Idempotency keys are not saved: a retry of one of these
// creates makes a new pet.
func (s *petStore) putBackRescued() error {
	path := s.file.rescuePath()
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	ctx := context.Background()
	conn, err := s.writer.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "ATTACH DATABASE ? AS rescue", path); err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer conn.ExecContext(ctx, "DETACH DATABASE rescue")
	var from string
	var saved int64
	if err := conn.QueryRowContext(ctx, "SELECT (SELECT source FROM rescue.rescue), (SELECT count(*) FROM rescue.rescued_pets)").Scan(&from, &saved); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	onConflict := "DO NOTHING"
	if from == rescueFromView {
		onConflict = `DO UPDATE SET name = excluded.name, category_id = excluded.category_id, status = excluded.status
			WHERE (name, category_id, status) IS NOT (excluded.name, excluded.category_id, excluded.status)`
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `INSERT INTO main.pets (id, name, category_id, status)
		SELECT id, name, category_id, status FROM rescue.rescued_pets WHERE true
		ON CONFLICT (id) `+onConflict)
	if err != nil {
		return fmt.Errorf("put back the pets of %s: %w", path, err)
	}
	putBack, _ := res.RowsAffected()
	if err := tx.Commit(); err != nil {
		return err
	}
	s.log.Info("the pets saved when the files were tampered with are back: the file lacked or differed on some, and now holds each as acknowledged",
		"db", s.file.path, "saved", saved, "saved_from", from, "put_back", putBack)
	if err := os.Remove(path); err != nil {
		return err
	}
	return syncPath(filepath.Dir(path))
}
