// The rescue: when the files under the service lose pets it acknowledged
// (a -wal cut short, the database overwritten in place), every pet it
// holds in memory is written beside the database, and the next start
// puts back the ones the file no longer has.

package main

import (
	"bufio"
	"context"
	"encoding/json"
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

// writeRescue writes every pet of c to the rescue file, one JSON object a
// line as the API shows it, through a temporary file that is synced and
// renamed into place: a crash leaves the whole file or none.
func writeRescue(path string, c *catalogue) (n int, err error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	out := bufio.NewWriterSize(f, 64<<10)
	enc := json.NewEncoder(out)
	var r petRow
	for i := range c.ids {
		c.row(i, &r)
		if err := enc.Encode(Pet{ID: r.id, Name: string(r.name), CategoryID: r.categoryID, Status: string(r.status)}); err != nil {
			return 0, err
		}
	}
	if err := out.Flush(); err != nil {
		return 0, err
	}
	if err := f.Sync(); err != nil {
		return 0, err
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, err
	}
	return len(c.ids), syncPath(filepath.Dir(path))
}

// rescue saves the pets the service holds, once the files were found to
// have lost some: from the writer's view, or read afresh when there is
// none. It runs on the writer loop, which owns the view.
func (s *petStore) rescue() (n int, err error) {
	c := s.view.master
	if c == nil {
		if c, _, err = loadCatalogue(context.Background(), s.readers); err != nil {
			return 0, fmt.Errorf("the pets could not be read to be saved: %w", err)
		}
	}
	return writeRescue(s.file.rescuePath(), c)
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
// saved pet the file lacks is inserted with its id, and one the file holds
// otherwise is set to what the service acknowledged, in one transaction;
// then the rescue file is removed. Idempotency keys are not saved: a
// retry of one of these creates makes a new pet.
func (s *petStore) putBackRescued() error {
	path := s.file.rescuePath()
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	defer f.Close()
	tx, err := s.writer.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	insert, err := tx.Prepare(`INSERT INTO pets (id, name, category_id, status) VALUES (?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET name = excluded.name, category_id = excluded.category_id, status = excluded.status
		WHERE (name, category_id, status) IS NOT (excluded.name, excluded.category_id, excluded.status)`)
	if err != nil {
		return err
	}
	var saved, changed int64
	dec := json.NewDecoder(bufio.NewReaderSize(f, 64<<10))
	for dec.More() {
		var p Pet
		if err := dec.Decode(&p); err != nil {
			return fmt.Errorf("read %s, pet %d: %w", path, saved+1, err)
		}
		saved++
		res, err := insert.Exec(p.ID, p.Name, p.CategoryID, p.Status)
		if err != nil {
			return fmt.Errorf("put back pet %d from %s: %w", p.ID, path, err)
		}
		n, _ := res.RowsAffected()
		changed += n
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.log.Info("the pets saved when the files were tampered with are back: the file lacked or differed on some, and now holds each as acknowledged",
		"db", s.file.path, "saved", saved, "put_back", changed)
	if err := os.Remove(path); err != nil {
		return err
	}
	return syncPath(filepath.Dir(path))
}

// logRescue saves the pets and says, in one line, what happened and what
// to do.
func (s *petStore) logRescue(se *storageError) {
	s.file.markForCheck()
	n, err := s.rescue()
	if err != nil {
		s.log.Error("the database file or its -wal was changed under the running service by something other than SQLite, and pets it acknowledged are no longer in them: "+
			"creates are refused from now on, and the pets could not be saved: they are still served from memory, so do not stop the service "+
			"before you have fetched them (GET /v1/pets) or freed what the save needs",
			"db", s.file.path, "err", se.err.Error(), "save_err", err.Error())
		return
	}
	s.log.Error("the database file or its -wal was changed under the running service by something other than SQLite, and pets it acknowledged are no longer in them: "+
		"creates are refused from now on; every pet the service holds is saved: stop Litestream and any other process that has the database open, "+
		"then restart the service: it sets the -wal aside, checks the file and puts back each saved pet the file lacks (README: Outside writes, restores and replicas)",
		"db", s.file.path, "err", se.err.Error(), "saved", n, "rescue", s.file.rescuePath())
}
