// The database file's identity and lock: one service per file, and a
// path that no longer names the opened file is noticed.

package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
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
	// The -wal file as SQLite opened it, and its -shm (see checkWAL),
	// both kept open to read: the -wal while it is still the one at the
	// path, the -shm for SQLite's index of it.
	walID fileID
	shmID fileID
	wal   *os.File
	shm   *os.File
	// print is checkOverwritten's; only the writer loop calls it.
	// skipped: a look since the print could not tell what happened (another
	// process's checkpoint was running), so frames may have been copied
	// that no look saw.
	print   contentPrint
	skipped bool
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
	wal, err := os.Open(d.path + "-wal")
	if err != nil {
		return
	}
	fi, err := wal.Stat()
	if err != nil {
		wal.Close()
		return
	}
	// Like the lock's descriptor of the database, it is closed only after
	// SQLite's connections: closing a descriptor of the -shm releases the
	// process's locks on it, SQLite's own included.
	shm, err := os.Open(d.path + "-shm")
	if err != nil {
		wal.Close()
		return
	}
	shmInfo, err := shm.Stat()
	if err != nil {
		wal.Close()
		shm.Close()
		return
	}
	d.walID, d.shmID, d.wal, d.shm = fileIDOf(fi), fileIDOf(shmInfo), wal, shm
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
	// The -shm is SQLite's index of the -wal, shared by every process: one
	// deleted or replaced leaves this process on its own copy, and another
	// process would build a new one and write frames this one cannot see.
	switch shmInfo, err := os.Stat(d.path + "-shm"); {
	case errors.Is(err, os.ErrNotExist):
		return gone("%s-shm was deleted", d.path), false
	case err == nil && fileIDOf(shmInfo) != d.shmID:
		return gone("%s-shm is now another file", d.path), false
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
	if hole := firstHole(d.wal); hole < written {
		return gone("%s-wal was cut short at %d bytes and written on past the cut: SQLite's index says %d were written to it", d.path, hole, written), true
	}
	// Overwritten in place with other content (an older copy of it): its
	// header's salts and its last frame's checksum are no longer the ones
	// SQLite's index holds.
	if why := d.walContentDiffers(); why != "" {
		return gone("%s-wal was overwritten in place: %s", d.path, why), true
	}
	return nil, false
}

// walContentDiffers compares the -wal's header and last committed frame
// with SQLite's index of it, which holds their salts and the frame's
// checksum; it says what differs, or "". A commit between the two reads
// tells nothing.
func (d *dbFile) walContentDiffers() string {
	var h [96]byte // both copies of the index header: unequal while a commit writes them
	if _, err := d.shm.ReadAt(h[:], 0); err != nil || !bytes.Equal(h[:48], h[48:]) {
		return ""
	}
	written, ok := walWrittenBy(h[:48])
	if !ok || written <= 32 {
		return ""
	}
	var header [32]byte
	var frame [24]byte
	if _, err := d.wal.ReadAt(header[:], 0); err != nil {
		return ""
	}
	// The last frame: its 24-byte header and a page, at the end.
	if _, err := d.wal.ReadAt(frame[:], written-(shmPageSize(h[:48])+24)); err != nil {
		return ""
	}
	var again [96]byte
	if _, err := d.shm.ReadAt(again[:], 0); err != nil || again != h {
		return ""
	}
	// The index copies the salts byte for byte from the -wal, and keeps
	// the last frame's checksum as numbers, which the frame holds in big
	// endian.
	salts := h[32:40]
	checksum := [2]uint32{binary.NativeEndian.Uint32(h[24:28]), binary.NativeEndian.Uint32(h[28:32])}
	switch {
	case !bytes.Equal(header[16:24], salts):
		return "its header is not the one SQLite wrote (another generation's salts)"
	case !bytes.Equal(frame[8:16], salts),
		[2]uint32{binary.BigEndian.Uint32(frame[16:20]), binary.BigEndian.Uint32(frame[20:24])} != checksum:
		return "its last committed frame is not the one SQLite wrote"
	}
	return ""
}

// walWritten reads from the -shm file how many bytes of the -wal hold
// committed frames: the WAL header and mxFrame frames of a page and its
// 24-byte frame header. SQLite keeps two copies of the index header; a
// read that finds them different met a commit and tells nothing.
func walWritten(shm *os.File) (int64, bool) {
	var h [96]byte
	if _, err := shm.ReadAt(h[:], 0); err != nil || !bytes.Equal(h[:48], h[48:]) {
		return 0, false
	}
	return walWrittenBy(h[:48])
}

// walWrittenBy is walWritten of one copy of the index header.
func walWrittenBy(h []byte) (int64, bool) {
	if h[12] == 0 {
		return 0, false
	}
	frames := int64(binary.NativeEndian.Uint32(h[16:20]))
	if frames == 0 {
		return 0, true
	}
	return 32 + frames*(shmPageSize(h)+24), true
}

// shmPageSize is the page size in an index header of the -shm: native
// endian, and 1 for 65536.
func shmPageSize(h []byte) int64 {
	if size := int64(binary.NativeEndian.Uint16(h[14:16])); size != 1 {
		return size
	}
	return 65536
}

func (d *dbFile) close() error {
	if d.shm != nil {
		d.wal.Close()
		d.shm.Close()
	}
	return d.f.Close()
}

// The database file overwritten in place (cp over the live file) is told
// from SQLite's own writes this way. In WAL mode only a checkpoint writes
// the file, holding SQLite's checkpoint lock, and moving the checkpoint
// record in the -shm as it does; this process's own checkpoints run on
// the writer, between these checks. So while the record stands still and
// no other process holds the lock, the file's content cannot change: when
// its size or times have, its first page, its last 32 KiB and the pages
// the last checkpoints wrote are compared with what they were; a touch or
// a chmod changes none. When the record moved, a checkpoint ran: the file
// must still be petstore's, its change counter must not have gone back,
// and the pages are compared with what the checkpoint wrote (see
// checkCheckpoint).

// contentPrint is what the service knows of the database file's content
// since the last checkpoint.
type contentPrint struct {
	ckpt  [16]byte // the -shm's checkpoint record and WAL salts
	size  int64
	mtime int64
	ctime int64      // set by the kernel at every write, and by chmod
	head  [4096]byte // the first page or pages
	tail  [32 << 10]byte
	// written holds a digest of each page the last checkpoints wrote, as
	// the file held it after them: an older copy of the file differs in
	// those, wherever they are.
	written map[uint32]uint64
	// frames is the -wal's frame count at the last look, also one that
	// found the file unchanged: when it equals the backfill, every frame
	// was in the file then. dataVersion is PRAGMA data_version of the
	// writer's connection when the print was taken: it moves only when
	// another connection commits.
	frames      uint32
	dataVersion int64
	valid       bool
}

// maxWrittenPages bounds the pages whose digests a print keeps.
const maxWrittenPages = 512

// shm offsets (SQLite's wal.c): the index header's salts, the checkpoint
// record (nBackfill, then nBackfillAttempted after the locks), and the
// checkpoint lock's byte.
const (
	shmSalts         = 32
	shmBackfill      = 96
	shmBackfillTried = 128
	shmCheckpointBit = 121
)

// checkpointLockHeld reports whether another process holds SQLite's
// checkpoint lock: its checkpoint may be writing the file (this process's
// own locks are not reported).
func (d *dbFile) checkpointLockHeld() bool {
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Start: shmCheckpointBit, Len: 1}
	return syscall.FcntlFlock(d.shm.Fd(), syscall.F_GETLK, &lk) != nil || lk.Type != syscall.F_UNLCK
}

// checkpointState reads the part of the -shm that changes whenever a
// checkpoint writes the database file, and the -wal's frame count.
func checkpointState(shm *os.File) (state [16]byte, frames uint32, ok bool) {
	var b [136]byte
	if _, err := shm.ReadAt(b[:], 0); err != nil || !bytes.Equal(b[:48], b[48:96]) {
		return state, 0, false // a commit is writing the index header
	}
	copy(state[0:8], b[shmSalts:shmSalts+8])
	copy(state[8:12], b[shmBackfill:shmBackfill+4])
	copy(state[12:16], b[shmBackfillTried:shmBackfillTried+4])
	return state, binary.NativeEndian.Uint32(b[16:20]), true
}

// checkOverwritten returns a faultTampered storageError once the database
// file was changed by something other than a checkpoint. Only the writer
// loop calls it, between commits; dataVersion reads PRAGMA data_version
// on the writer's connection. The checkpoint record is read before and
// after the file: when it moved in between, a checkpoint was writing, and
// the file is looked at again at the next check.
func (d *dbFile) checkOverwritten(dataVersion func() (int64, bool)) error {
	if d.shm == nil {
		return nil
	}
	// While another process's checkpoint may be writing the file, it is
	// looked at again once that one has let go.
	if d.checkpointLockHeld() {
		d.skipped = true
		return nil
	}
	var now contentPrint
	var ok bool
	if now.ckpt, now.frames, ok = checkpointState(d.shm); !ok {
		d.skipped = true
		return nil
	}
	fi, err := d.f.Stat()
	if err != nil {
		return nil
	}
	st := fi.Sys().(*syscall.Stat_t)
	now.size, now.mtime, now.ctime, now.valid = fi.Size(), fi.ModTime().UnixNano(), st.Ctim.Nano(), true
	last := &d.print
	if last.valid && now.ckpt == last.ckpt && now.size == last.size && now.mtime == last.mtime && now.ctime == last.ctime {
		last.frames = now.frames
		return nil // nothing wrote the file: the cheap path, every commit
	}
	var versionOK bool
	now.dataVersion, versionOK = dataVersion()
	if err := d.readPrint(&now); err != nil {
		return nil // a read error is the I/O checks' business
	}
	if after, _, ok := checkpointState(d.shm); !ok || after != now.ckpt || d.checkpointLockHeld() {
		d.skipped = true
		return nil
	}
	overwritten := func(format string, args ...any) error {
		return &storageError{kind: faultTampered, err: fmt.Errorf("%s was overwritten in place: "+format, append([]any{d.path}, args...)...)}
	}
	if fi.Size() >= 100 && !bytes.Equal(now.head[:16], []byte("SQLite format 3\x00")) {
		return overwritten("it is no longer a SQLite database")
	}
	if fi.Size() >= 100 && appID(now.head[:]) != petstoreApplicationID && appID(now.head[:]) != 0 {
		return overwritten("it is no longer a petstore database (application_id %#x)", appID(now.head[:]))
	}
	switch {
	case !last.valid:
	case now.ckpt != last.ckpt:
		// A checkpoint ran: the file moved on, but never back.
		if changeCounter(now.head[:]) < changeCounter(last.head[:]) {
			return overwritten("its change counter went back from %d to %d", changeCounter(last.head[:]), changeCounter(now.head[:]))
		}
		// A -wal that started over since the last look hides what the
		// checkpoints before the restart copied, unless there was nothing
		// left to copy then: every frame was in the file, no look since
		// was skipped, nobody else has committed, and it started over once
		// (SQLite adds 1 to the first salt at each restart).
		restarted := !bytes.Equal(last.ckpt[:8], now.ckpt[:8])
		nothingLeft := last.frames == backfill(last.ckpt) && !d.skipped &&
			versionOK && now.dataVersion == last.dataVersion &&
			binary.BigEndian.Uint32(now.ckpt[0:4]) == binary.BigEndian.Uint32(last.ckpt[0:4])+1
		var written map[uint32]uint64
		differs, outcome := "", checkpointUnknown
		if !restarted || nothingLeft {
			written, differs, outcome = d.checkCheckpoint(last, &now, restarted)
		}
		switch outcome {
		case checkpointUnsure:
			d.skipped = true
			return nil // looked at again at the next check
		case checkpointUnknown:
			written = d.checkpointedPages(last.ckpt, now.ckpt) // nil when it cannot tell
		}
		// Another process's checkpoint may have written meanwhile.
		if after, _, ok := checkpointState(d.shm); !ok || after != now.ckpt || d.checkpointLockHeld() {
			d.skipped = true
			return nil
		}
		if differs != "" {
			return overwritten("%s", differs)
		}
		now.written = written
	case now.size != last.size:
		return overwritten("its size changed from %d to %d bytes while no checkpoint ran", last.size, now.size)
	case now.head != last.head || now.tail != last.tail:
		return overwritten("its content changed while no checkpoint ran")
	default:
		for page, digest := range last.written {
			if d.pageDigest(page, headerPageSize(now.head[:])) != digest {
				return overwritten("page %d changed while no checkpoint ran", page)
			}
		}
		now.written = last.written
	}
	*last = now
	d.skipped = false
	return nil
}

// What a checkpoint writes is known from SQLite's wal.c: for each page
// with frames after the checkpoint record's backfill, it takes the
// page's newest frame in the -wal, and copies it into the file only when
// that frame is at or below the new backfill and the page within the
// database's size; other pages it leaves as they were. So between two
// records of the same -wal generation, a page the checkpoint copied must
// equal its frame, and a page the print knows with no frame since the
// older backfill must be what it was: an overwrite that lands next to a
// checkpoint (the service's own, which runs inside a commit) is told.

// checkpointOutcome is what checkCheckpoint could tell.
type checkpointOutcome int

const (
	checkpointChecked checkpointOutcome = iota // every page it knows was compared
	checkpointUnsure                           // the -shm moved while read: look again later
	checkpointUnknown                          // the -wal restarted, or a checkpoint failed part way: which pages were written is gone
)

// shm layout (SQLite's wal.c): 32 KiB blocks of frame page numbers and
// their hash table; the first block starts after the 136-byte header.
const (
	shmBlock         = 32 << 10
	shmHeaderSize    = 136
	shmFramesInFirst = 4096 - shmHeaderSize/4
	shmFramesInBlock = 4096
)

// checkCheckpoint compares the file with what the checkpoints between
// last and now wrote (see above). It returns digests of the pages they
// copied and of the pages last knew that they left, and what differs.
func (d *dbFile) checkCheckpoint(last, now *contentPrint, restarted bool) (written map[uint32]uint64, differs string, outcome checkpointOutcome) {
	from := backfill(last.ckpt)
	if restarted {
		from = 0 // every frame of the new -wal is new
	}
	to := backfill(now.ckpt)
	tried := binary.NativeEndian.Uint32(now.ckpt[12:16])
	switch {
	case to < from || tried != to:
		return nil, "", checkpointUnknown
	case now.size < last.size && to == from:
		return nil, fmt.Sprintf("its size went back from %d to %d bytes while no checkpoint ran", last.size, now.size), checkpointChecked
	case now.size < last.size:
		return nil, "", checkpointUnknown // a checkpoint may cut the file to a smaller database
	}
	index, stable, ok := d.readFrameIndex()
	if !ok || !stable || index.frames() < to || index.pageSize() != headerPageSize(now.head[:]) {
		return nil, "", checkpointUnsure
	}
	pageSize, dbPages := index.pageSize(), index.dbPages()
	// Each page's newest frame after the older backfill.
	newest := map[uint32]uint32{}
	for i := index.frames(); i > from; i-- {
		if n := index.page(i); newest[n] == 0 {
			newest[n] = i
		}
	}
	written = map[uint32]uint64{}
	frame := make([]byte, pageSize)
	for i := to; i > from && len(written) < maxWrittenPages; i-- {
		n := index.page(i)
		if newest[n] != i || n > dbPages {
			continue // not copied: a newer frame, or past the end
		}
		if _, err := d.wal.ReadAt(frame, 32+int64(i-1)*(pageSize+24)+24); err != nil {
			return nil, "", checkpointUnsure
		}
		digest := digestOf(frame)
		if d.pageDigest(n, pageSize) != digest {
			return nil, fmt.Sprintf("page %d is not the one a checkpoint copied from the -wal", n), checkpointChecked
		}
		written[n] = digest
	}
	// Pages with no frame since the older backfill were not written.
	left := func(offset int64) bool { return newest[uint32(offset/pageSize)+1] == 0 }
	for off := int64(0); off < int64(len(now.head)); off += min(pageSize, int64(len(now.head))) {
		end := min(off+pageSize, int64(len(now.head)))
		if left(off) && !bytes.Equal(now.head[off:end], last.head[off:end]) {
			return nil, fmt.Sprintf("page %d changed, which no checkpoint wrote", off/pageSize+1), checkpointChecked
		}
	}
	tailAt := max(0, last.size-int64(len(last.tail)))
	tail := make([]byte, len(last.tail))
	if _, err := d.f.ReadAt(tail, tailAt); err != nil && !errors.Is(err, io.EOF) {
		return nil, "", checkpointUnsure
	}
	for off := tailAt; off < tailAt+int64(len(tail)); {
		end := min((off/pageSize+1)*pageSize, tailAt+int64(len(tail)))
		if left(off) && !bytes.Equal(tail[off-tailAt:end-tailAt], last.tail[off-tailAt:end-tailAt]) {
			return nil, fmt.Sprintf("page %d changed, which no checkpoint wrote", off/pageSize+1), checkpointChecked
		}
		off = end
	}
	for n, digest := range last.written {
		if newest[n] != 0 {
			continue
		}
		if d.pageDigest(n, pageSize) != digest {
			return nil, fmt.Sprintf("page %d changed, which no checkpoint wrote", n), checkpointChecked
		}
		if len(written) < maxWrittenPages {
			written[n] = digest
		}
	}
	return written, "", checkpointChecked
}

// backfill is the checkpoint record's count of frames in the file.
func backfill(ckpt [16]byte) uint32 { return binary.NativeEndian.Uint32(ckpt[8:12]) }

// frameIndex is SQLite's index of the -wal, read from the -shm: the first
// copy of its header, then for each frame the page it holds.
type frameIndex []byte

// readFrameIndex reads the index up to the frame count its header gives;
// stable says the header's two copies agreed (they differ while a commit
// of another process writes them).
func (d *dbFile) readFrameIndex() (index frameIndex, stable, ok bool) {
	var h [96]byte
	if _, err := d.shm.ReadAt(h[:], 0); err != nil {
		return nil, false, false
	}
	index = make(frameIndex, (shmBlockOf(frameIndex(h[:]).frames())+1)*shmBlock)
	if _, err := d.shm.ReadAt(index, 0); err != nil {
		return nil, false, false
	}
	return index, bytes.Equal(h[:48], h[48:]) && bytes.Equal(index[:96], h[:]), true
}

func (x frameIndex) frames() uint32  { return binary.NativeEndian.Uint32(x[16:20]) }
func (x frameIndex) dbPages() uint32 { return binary.NativeEndian.Uint32(x[20:24]) }
func (x frameIndex) pageSize() int64 { return shmPageSize(x[:48]) }

// shmBlockOf is the index block of the -shm that holds frame i (from 1).
func shmBlockOf(i uint32) int {
	if i <= shmFramesInFirst {
		return 0
	}
	return int((i-shmFramesInFirst-1)/shmFramesInBlock) + 1
}

// page is the page number the index holds for frame i (from 1).
func (x frameIndex) page(i uint32) uint32 {
	block := shmBlockOf(i)
	at := block * shmBlock
	if block == 0 {
		at += shmHeaderSize + int(i-1)*4
	} else {
		at += int(i-shmFramesInFirst-1-uint32(block-1)*shmFramesInBlock) * 4
	}
	return binary.NativeEndian.Uint32(x[at : at+4])
}

// checkpointedPages digests, as the file holds them now, the pages that
// the checkpoints between two records copied from the -wal: its frames
// after the older record's backfill (from the start, after a restart of
// the -wal) up to the newer one's.
func (d *dbFile) checkpointedPages(before, after [16]byte) map[uint32]uint64 {
	from, to := backfill(before), backfill(after)
	if !bytes.Equal(before[:8], after[:8]) || to < from {
		from = 0 // the -wal restarted since
	}
	index, _, ok := d.readFrameIndex()
	if !ok || index.frames() < to {
		return nil
	}
	pages := map[uint32]uint64{}
	// Newest first: when there are more than the bound, the newest count.
	for i := to; i > from && len(pages) < maxWrittenPages; i-- {
		if n := index.page(i); pages[n] == 0 {
			pages[n] = d.pageDigest(n, index.pageSize())
		}
	}
	return pages
}

// digestOf is a digest of a page's bytes, never 0.
func digestOf(b []byte) uint64 {
	sum := fnv.New64a()
	sum.Write(b)
	return sum.Sum64() | 1
}

// pageDigest is digestOf page n (from 1), of pageSize bytes, of the
// database file: of whatever can be read there.
func (d *dbFile) pageDigest(n uint32, pageSize int64) uint64 {
	page := make([]byte, pageSize)
	k, _ := d.f.ReadAt(page, int64(n-1)*pageSize)
	return digestOf(page[:k])
}

// headerPageSize is the page size in a database header: big endian, and
// 1 for 65536; 4096 for a header that holds none yet.
func headerPageSize(header []byte) int64 {
	switch size := int64(binary.BigEndian.Uint16(header[16:18])); {
	case size == 1:
		return 65536
	case size >= 512:
		return size
	}
	return 4096
}

// readPrint reads the file's first 4 KiB and last 32 KiB into p.
func (d *dbFile) readPrint(p *contentPrint) error {
	if _, err := d.f.ReadAt(p.head[:], 0); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	off := max(0, p.size-int64(len(p.tail)))
	if _, err := d.f.ReadAt(p.tail[:], off); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// changeCounter is the file change counter in a database header.
func changeCounter(header []byte) uint32 { return binary.BigEndian.Uint32(header[24:28]) }

// appID is the application_id in a database header; the file shows 0
// until a checkpoint has copied the page that set it.
func appID(header []byte) uint32 { return binary.BigEndian.Uint32(header[68:72]) }

// firstHole is the offset of the first hole in f (its size when it has
// none), or the largest int64 when it cannot be told. It moves f's
// offset, which ReadAt does not use.
func firstHole(f *os.File) int64 {
	const seekHole = 4 // SEEK_HOLE
	off, err := f.Seek(0, seekHole)
	if err != nil {
		return math.MaxInt64
	}
	return off
}
