// The database file's identity and lock: one service per file, and a
// path that no longer names the opened file is noticed.

package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
)

// fileID is a file's identity: the same path can name another file later.
type fileID struct{ dev, ino uint64 }

func fileIDOf(fi os.FileInfo) fileID {
	st := fi.Sys().(*syscall.Stat_t)
	return fileID{dev: uint64(st.Dev), ino: st.Ino}
}

// dbFile is the database file as the service opened it. Its descriptor
// holds an exclusive flock for the life of the service, so a second
// petstore on the same file refuses to start; SQLite's own locks are
// POSIX locks, which flock does not touch. It is closed only after every
// SQLite connection: closing any descriptor of the file releases the
// process's POSIX locks on it.
type dbFile struct {
	path string
	f    *os.File
	id   fileID
	// readOnly: the file could be opened only for reading at start; it
	// is cleared once a write has worked.
	readOnly atomic.Bool
	// The -wal file as SQLite opened it, and its -shm (see checkWAL).
	walID fileID
	shm   *os.File
	// print is checkOverwritten's; only the writer loop calls it.
	print contentPrint
	// markedForCheck: the -check mark is on disk (see markForCheck).
	markedForCheck atomic.Bool
}

// openDBFile opens the database file at path, creating it private to the
// service's user (SQLite would use the umask's mode, and gives the -wal
// and -shm files the database's mode), and takes the service's lock.
func openDBFile(path string) (*dbFile, error) {
	d := &dbFile{path: path}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		// A file that cannot be written (read-only filesystem, immutable
		// file) is still served for reading; creates get 503.
		ro, roErr := os.Open(path)
		if roErr != nil {
			return nil, fmt.Errorf("open database: %w", err)
		}
		f = ro
		d.readOnly.Store(true)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("database %s is in use by another petstore process; run one service per database file", path)
		}
		return nil, fmt.Errorf("lock database %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open database: %w", err)
	}
	d.f, d.id = f, fileIDOf(fi)
	return d, nil
}

// checkStillThere returns a faultReplaced storageError when the path no
// longer names the file that was opened: deleted, renamed or replaced.
// Writing on would acknowledge pets that a restart cannot find.
func (d *dbFile) checkStillThere() error {
	fi, err := os.Stat(d.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return &storageError{kind: faultReplaced, err: fmt.Errorf("%s was deleted or renamed", d.path)}
	case err != nil:
		return &storageError{kind: faultIO, err: err}
	case fileIDOf(fi) != d.id:
		return &storageError{kind: faultReplaced, err: fmt.Errorf("%s is now another file", d.path)}
	}
	return nil
}

// minFreeBytes is the free space below which /healthz checks, with a
// real write, whether a pet can still be stored: a WAL that is reused
// after a checkpoint may still take commits on a nearly full disk.
const minFreeBytes = 256 << 10

// looksUnwritable reports whether the filesystem is read-only or nearly
// full, or the file could be opened only for reading: then only a real
// write tells whether a pet can be stored.
func (d *dbFile) looksUnwritable() bool {
	if d.readOnly.Load() {
		return true
	}
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(d.f.Fd()), &st); err != nil {
		return true
	}
	const stRdonly = 1 // ST_RDONLY
	free := st.Bavail
	if os.Geteuid() == 0 {
		free = st.Bfree // root may use the reserved blocks
	}
	return st.Flags&stRdonly != 0 || free*uint64(st.Bsize) < minFreeBytes
}

// unreadable reports whether the file's first page cannot be read: the
// storage itself fails (EIO), whatever SQLite made of it.
func (d *dbFile) unreadable() bool {
	var page [512]byte
	_, err := d.f.ReadAt(page[:], 0)
	return errors.Is(err, syscall.EIO)
}

// checkMark is the file whose presence makes a start run a full
// integrity_check before it takes creates: left after an I/O error.
func (d *dbFile) checkMark() string { return d.path + "-check" }

// markForCheck leaves the check mark, once; on storage that fails it may
// not be written, and is tried again at the next call.
func (d *dbFile) markForCheck() {
	if d.markedForCheck.Load() {
		return
	}
	err := os.WriteFile(d.checkMark(), []byte("petstore: a write or an fsync failed with an I/O error, or the files were tampered with; the next start runs integrity_check before it takes creates\n"), 0o600)
	if err == nil {
		err = syncPath(d.checkMark())
	}
	if err == nil {
		err = syncPath(filepath.Dir(d.path))
	}
	d.markedForCheck.Store(err == nil)
}

// noteWAL records the -wal file SQLite has open, and keeps its -shm open
// to read SQLite's index of it. It is called once the connections have
// opened them; until it has seen them, checkWAL has nothing to compare.
func (d *dbFile) noteWAL() {
	fi, err := os.Stat(d.path + "-wal")
	if err != nil {
		return
	}
	shm, err := os.Open(d.path + "-shm")
	if err != nil {
		return
	}
	d.walID, d.shm = fileIDOf(fi), shm
}

// checkWAL returns a faultTampered storageError once the -wal file SQLite
// has open is no longer at its path, or holds fewer bytes than SQLite's
// index says were written to it; cutShort tells the last apart, whose
// frames are lost. Committing on would acknowledge pets that a crash, or
// the next start, loses.
func (d *dbFile) checkWAL() (err error, cutShort bool) {
	if d.shm == nil {
		d.noteWAL()
		return nil, false
	}
	// SQLite's index is read before and after the file: a commit or a
	// checkpoint of another process in between tells nothing.
	indexBefore, okBefore := walWritten(d.shm)
	gone := func(format string, args ...any) error {
		return &storageError{kind: faultTampered, err: fmt.Errorf(format, args...)}
	}
	fi, statErr := os.Stat(d.path + "-wal")
	switch {
	case errors.Is(statErr, os.ErrNotExist):
		return gone("%s-wal was deleted", d.path), false
	case statErr != nil:
		return &storageError{kind: faultIO, err: statErr}, false
	case fileIDOf(fi) != d.walID:
		return gone("%s-wal is now another file", d.path), false
	}
	written, ok := walWritten(d.shm)
	if !ok || !okBefore || written != indexBefore {
		return nil, false
	}
	if fi.Size() < written {
		return gone("%s-wal holds %d bytes, but SQLite's index says %d were written to it", d.path, fi.Size(), written), true
	}
	// Cut short while a commit ran, it was written on past the cut: SQLite
	// writes every byte of the -wal, so a hole where frames were is them
	// lost. (A filesystem that cannot tell holes says there are none.)
	if hole := firstHole(d.path + "-wal"); hole < written {
		return gone("%s-wal was cut short at %d bytes and written on past the cut: SQLite's index says %d were written to it", d.path, hole, written), true
	}
	return nil, false
}

// walWritten reads from the -shm file how many bytes of the -wal hold
// committed frames: the WAL header and mxFrame frames of a page and its
// 24-byte frame header. SQLite keeps two copies of the index header; a
// read that finds them different met a commit and tells nothing.
func walWritten(shm *os.File) (int64, bool) {
	var h [96]byte
	if _, err := shm.ReadAt(h[:], 0); err != nil || !bytes.Equal(h[:48], h[48:]) || h[12] == 0 {
		return 0, false
	}
	pageSize := int64(binary.NativeEndian.Uint16(h[14:16]))
	if pageSize == 1 {
		pageSize = 65536
	}
	frames := int64(binary.NativeEndian.Uint32(h[16:20]))
	if frames == 0 {
		return 0, true
	}
	return 32 + frames*(pageSize+24), true
}

func (d *dbFile) close() error {
	if d.shm != nil {
		d.shm.Close()
	}
	return d.f.Close()
}

// contentPrint is what the service knows of the database file's content
// between two checkpoints. In WAL mode only a checkpoint writes the file,
// copying pages from the -wal under SQLite's checkpoint lock, and it moves
// the checkpoint record in the -shm as it does. So while that record
// stands still and nobody holds the lock, the file's size and first page
// cannot change: a change then was made by something other than SQLite
// (cp over the live file, an editor, a restore tool).
type contentPrint struct {
	ckpt  [24]byte // the -shm's checkpoint record and WAL salts
	size  int64
	page1 [4096]byte
	valid bool
}

// shm offsets (SQLite's wal.c): the index header's salts, the checkpoint
// record (nBackfill, then nBackfillAttempted after the locks), and the
// checkpoint lock's byte, which every checkpoint holds while it writes.
const (
	shmSalts         = 32
	shmBackfill      = 96
	shmBackfillTried = 128
	shmCheckpointBit = 121
)

// checkpointState reads the part of the -shm that changes whenever a
// checkpoint writes the database file, and whether another process holds
// the checkpoint lock now (this process's own locks are not reported, and
// its own checkpoints run on the writer, which calls this between them).
func checkpointState(shm *os.File) (state [24]byte, locked, ok bool) {
	var b [136]byte
	if _, err := shm.ReadAt(b[:], 0); err != nil {
		return state, false, false
	}
	copy(state[0:8], b[shmSalts:shmSalts+8])
	copy(state[8:12], b[shmBackfill:shmBackfill+4])
	copy(state[12:16], b[shmBackfillTried:shmBackfillTried+4])
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: 0, Start: shmCheckpointBit, Len: 1}
	if err := syscall.FcntlFlock(shm.Fd(), syscall.F_GETLK, &lk); err != nil {
		return state, false, false
	}
	return state, lk.Type != syscall.F_UNLCK, true
}

// checkOverwritten returns a faultTampered storageError once the database
// file's size or first page changed while no checkpoint ran, or its header
// no longer says it is this service's file, or its change counter went
// back. A checkpoint in progress, or one since the last look, takes what
// the file holds now as the new baseline.
func (d *dbFile) checkOverwritten() error {
	if d.shm == nil {
		return nil
	}
	before, lockedBefore, ok := checkpointState(d.shm)
	if !ok {
		return nil
	}
	var now contentPrint
	n, err := d.f.ReadAt(now.page1[:], 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil // a read error is the I/O checks' business
	}
	fi, err := d.f.Stat()
	if err != nil {
		return nil
	}
	after, lockedAfter, ok := checkpointState(d.shm)
	if !ok || lockedBefore || lockedAfter || before != after {
		d.print.valid = false // a checkpoint is writing: look again later
		return nil
	}
	now.ckpt, now.size, now.valid = after, fi.Size(), true
	overwritten := func(format string, args ...any) error {
		return &storageError{kind: faultTampered, err: fmt.Errorf("%s was overwritten in place: "+format, append([]any{d.path}, args...)...)}
	}
	if n >= 100 && !bytes.Equal(now.page1[:16], []byte("SQLite format 3\x00")) {
		return overwritten("it is no longer a SQLite database")
	}
	if n >= 100 && appID(now.page1[:]) != petstoreApplicationID && appID(now.page1[:]) != 0 {
		return overwritten("it is no longer a petstore database (application_id %#x)", appID(now.page1[:]))
	}
	last := &d.print
	switch {
	case !last.valid:
	case now.ckpt != last.ckpt:
		// A checkpoint ran: the file moved on, but never back.
		if binary.BigEndian.Uint32(now.page1[24:28]) < binary.BigEndian.Uint32(last.page1[24:28]) {
			return overwritten("its change counter went back from %d to %d", binary.BigEndian.Uint32(last.page1[24:28]), binary.BigEndian.Uint32(now.page1[24:28]))
		}
	case now.size != last.size:
		return overwritten("its size changed from %d to %d bytes while no checkpoint ran", last.size, now.size)
	case now.page1 != last.page1:
		return overwritten("its first page changed while no checkpoint ran")
	}
	*last = now
	return nil
}

// appID is the application_id in a database header; the file shows 0
// until a checkpoint has copied the page that set it.
func appID(header []byte) uint32 { return binary.BigEndian.Uint32(header[68:72]) }

// firstHole is the offset of the first hole in the file (its size when
// it has none), or the largest int64 when it cannot be told.
func firstHole(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return math.MaxInt64
	}
	defer f.Close()
	const seekHole = 4 // SEEK_HOLE
	off, err := f.Seek(0, seekHole)
	if err != nil {
		return math.MaxInt64
	}
	return off
}
