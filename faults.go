// Storage faults: what the store does when the disk or the files go wrong
// underneath it. Everything here rests on what SQLite and the OS promise:
// SQLite's error codes, its checkpoints and VACUUM INTO, and the file
// system's locks, device and inode numbers. Nothing reads SQLite's file
// formats. A fault is classified once, returned as an error that names
// its cause, logged when it begins and when it ends, and shown by the
// health check.

package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// faultKind names a cause, outside the service, for which the store
// cannot store or read a pet.
type faultKind int

const (
	faultNone faultKind = iota
	faultDiskFull
	faultReadOnly
	faultLocked
	faultNotAnswering
	faultTimedOut // one create that could not be committed before its deadline
	faultStarting // the start-up's checks and the view's load are under way
	// The kinds below last until the service is restarted (see lasting).
	faultIO       // a write or fsync failed: the files are suspect
	faultDamaged  // SQLite found the file corrupt
	faultReplaced // the database file was removed or replaced at its path
	faultTampered // its -wal or -shm was removed or replaced
	faultWentBack // the file no longer holds pets this service stored
	faultMissing  // the file lacks pets it counted as stored, none deleted
)

// faultMessages say what each fault is, starting with the short name of
// the failing check: the log, the health check and a refused client read them.
var faultMessages = map[faultKind]string{
	faultDiskFull:     "disk full: the filesystem holding the database has no space left, so no pet can be stored until space is freed",
	faultReadOnly:     "read-only: the database file or its filesystem cannot be written",
	faultLocked:       "database locked: another process holds the database's write lock",
	faultNotAnswering: "database not answering",
	faultTimedOut:     "timed out: the pet could not be committed before the write timeout, so it was not stored",
	faultStarting:     "starting: the service is loading its catalogue and checking the database file",
	faultIO:           "I/O error: a write to the storage holding the database failed, so the service writes nothing more to it until it is restarted",
	faultDamaged:      "damaged: the database file is corrupt and must be restored from a backup",
	faultReplaced:     "file replaced: the database file was deleted or replaced while the service ran; the service must be restarted",
	faultTampered:     "storage tampered: the database's -wal or -shm file was deleted or replaced under the running service, so no pet can be stored safely; the service must be restarted",
	faultWentBack:     "catalogue went back: the database file no longer holds pets this service stored (an older copy was put under it), so new pets would reuse their ids; the service must be restarted",
	faultMissing:      "acknowledged pets missing: the database file lacks pets it recorded as stored, with no delete recorded; the service's log names them and the way back",
}

func (k faultKind) message() string { return faultMessages[k] }

// storageError is a store failure with a known cause outside the service,
// logged once per fault, not per request; errors.go tells clients of it.
type storageError struct {
	kind faultKind
	err  error
}

func (e *storageError) Error() string { return e.kind.message() + ": " + e.err.Error() }

func (e *storageError) Unwrap() error { return e.err }

// classifyFault tells whether err comes from the storage rather than from
// the service, and which fault it is. Unknown errors stay unknown.
func classifyFault(err error) (faultKind, bool) {
	var se *storageError
	if errors.As(err, &se) {
		return se.kind, true
	}
	if kind, isSQLite := sqliteFault(err); isSQLite {
		return kind, kind != faultNone
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return classifyErrno(errno)
	}
	return faultNone, false
}

// classifyErrno maps the system errors that mean a storage fault.
func classifyErrno(errno syscall.Errno) (faultKind, bool) {
	switch errno {
	case syscall.ENOSPC, syscall.EDQUOT:
		return faultDiskFull, true
	case syscall.EROFS, syscall.EPERM, syscall.EACCES:
		return faultReadOnly, true
	case syscall.EIO:
		return faultIO, true
	}
	return faultNone, false
}

// dbFile is the database file as the service opened it: its lock and the
// identities of the three files SQLite keeps open. The lock is an
// exclusive flock on the file, held for the life of the service, so a
// second petstore on the same file refuses to start; SQLite's own locks
// are POSIX locks, which flock does not touch. Its descriptor is closed
// only after every SQLite connection: closing any descriptor of the file
// releases the process's POSIX locks on it.
type dbFile struct {
	path string
	lock *os.File
	// acked is the -acked file beside the database: what the service had
	// acknowledged, written after every commit (see noteAcked).
	acked *os.File
	// readOnly: the file could be opened only for reading at start; it
	// is cleared once a write has worked.
	readOnly atomic.Bool
	// opened are the database, its -wal and its -shm as SQLite opened
	// them (nil: not opened), to tell by os.SameFile (device and inode)
	// whether the file at a path is still that one.
	opened [3]os.FileInfo
	// dirTime is the directory's modification time when the three files
	// were last all found in place.
	dirTime time.Time
}

// companions are the suffixes of the files SQLite keeps beside the
// database, in the order of dbFile.opened.
var companions = [3]string{"", "-wal", "-shm"}

// openDBFile opens the database file at path, creating it private to the
// service's user (SQLite would use the umask's mode, and gives the -wal
// and -shm files the database's mode), and takes the service's lock.
func openDBFile(path string) (*dbFile, error) {
	d := &dbFile{}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		// A file that cannot be written (read-only filesystem, immutable
		// file) is still served for reading; creates are refused.
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
	// The path is made absolute with its symbolic links resolved, as far
	// as it exists. SQLite follows a link to the database and keeps the
	// -wal and -shm beside its target: those are the files to watch, and
	// an absolute path in the log (db=, saved=) works from any directory.
	if resolved, err := filepath.EvalSymlinks(path); err == nil {
		path = resolved
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	d.lock, d.path = f, path
	return d, nil
}

// ackedSuffix names the file, beside the database, that records what the
// service acknowledged: the file's insert count and the highest id, as
// of the last commit answered 201. A file that loses its last commits
// (storage that dropped pages it had acknowledged, an older copy put in
// its place while the service was stopped) is consistent, and only this
// record, outside it, shows what it lacks at the next start. It is
// written with the kernel's page cache, not fsynced: it survives the
// process, and it is one block rewritten in place.
const ackedSuffix = "-acked"

// openAcked opens the record for writing, once the file is known to be
// petstore's. Where it cannot be (a read-only filesystem), nothing is
// committed, so there is nothing to note.
func (d *dbFile) openAcked() {
	d.acked, _ = os.OpenFile(d.path+ackedSuffix, os.O_WRONLY|os.O_CREATE, 0o600)
}

// noteAcked records what the service acknowledged (see ackedSuffix).
// An error is not fatal: the record only adds a check at the next start.
func (d *dbFile) noteAcked(inserted, top int64) {
	if d.acked != nil {
		d.acked.WriteAt(fmt.Appendf(nil, "%020d %020d\n", inserted, top), 0)
	}
}

// readAcked returns the record noteAcked wrote beside the database at
// path, if there is one.
func readAcked(path string) (inserted, top int64, ok bool) {
	b, err := os.ReadFile(path + ackedSuffix)
	if err == nil {
		_, err = fmt.Sscanf(string(b), "%d %d\n", &inserted, &top)
	}
	return inserted, top, err == nil
}

// noteOpened records the identities of the files SQLite has opened, once
// its connections have read: a -wal or -shm it has not created yet (a
// read-only start) is not watched.
func (d *dbFile) noteOpened() {
	for i, suffix := range companions {
		d.opened[i], _ = os.Stat(d.path + suffix) // nil on an error
	}
}

// vanished names the first of the files SQLite holds open that is no
// longer the file at its path (deleted, renamed or replaced), or "".
// Committing on would acknowledge pets that a restart cannot find.
//
// A file deleted, renamed or put in its place changes the directory's
// modification time, so the files are looked at only when it moved since
// the last look, or moved within the last second (the kernel's clock for
// it is coarse: two changes in one tick leave the same time). A stat of the
// -wal while SQLite writes it cost a tenth of create throughput under
// load, measured; the directory's costs nothing that shows.
func (d *dbFile) vanished() string {
	dir, dirErr := os.Stat(filepath.Dir(d.path))
	if dirErr == nil && dir.ModTime().Equal(d.dirTime) && time.Since(d.dirTime) > time.Second {
		return ""
	}
	for i, suffix := range companions {
		if cur, err := os.Stat(d.path + suffix); d.opened[i] != nil && (err != nil || !os.SameFile(cur, d.opened[i])) {
			return d.path + suffix
		}
	}
	if dirErr == nil {
		d.dirTime = dir.ModTime()
	}
	return ""
}

// close releases the lock: after SQLite's connections, see dbFile.
func (d *dbFile) close() {
	if d.acked != nil {
		d.acked.Close()
	}
	d.lock.Close()
}

// syncPath fsyncs a file or a directory, so what was written to it, or a
// name added to it, is on stable storage.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// vacuumInto writes a consistent, self-contained copy of what conn sees
// to a new file private to the service's user, in dir, named by pattern
// as os.CreateTemp names it, and fsyncs the file and dir; it returns the
// file's path. VACUUM INTO reads one snapshot, so it neither blocks a
// writer nor copies a half-committed state. A copy that fails is
// removed.
func vacuumInto(ctx context.Context, conn interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, dir, pattern string) (string, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return "", err
	}
	f.Close()
	if _, err = conn.ExecContext(ctx, "VACUUM INTO ?", f.Name()); err == nil {
		err = errors.Join(syncPath(f.Name()), syncPath(dir))
	}
	if err != nil {
		os.Remove(f.Name())
		os.Remove(f.Name() + "-journal") // VACUUM INTO's own, when it failed
		return "", err
	}
	return f.Name(), nil
}

// faultLog remembers the passing storage fault in force (a full disk, a
// read-only file, a lock), so it is logged once when it begins and once
// when it ends, with how many requests it refused and for how long, and
// reported by the health check in between.
type faultLog struct {
	log  *slog.Logger
	path string

	mu      sync.Mutex
	kind    faultKind
	cause   error
	since   time.Time
	refused int
}

// failed records a fault that refused n requests.
func (f *faultLog) failed(kind faultKind, cause error, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kind == kind {
		f.refused += n
		f.cause = cause
		return
	}
	if f.kind != faultNone {
		f.endLocked("changed to " + kind.message())
	}
	f.kind, f.cause, f.since, f.refused = kind, cause, time.Now(), n
	f.log.Error("storage fault: requests that need it are refused until it clears",
		"fault", kind.message(), "err", cause.Error(), "db", f.path)
}

// succeeded records that a write worked: any fault has ended.
func (f *faultLog) succeeded() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kind != faultNone {
		f.endLocked("a write succeeded")
	}
}

func (f *faultLog) endLocked(why string) {
	f.log.Warn("storage fault cleared", "fault", f.kind.message(), "why", why,
		"refused", f.refused, "lasted", time.Since(f.since).Round(time.Millisecond).String(), "db", f.path)
	f.kind, f.cause, f.refused = faultNone, nil, 0
}

// current returns the fault in force, or nil.
func (f *faultLog) current() *storageError {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kind == faultNone {
		return nil
	}
	return &storageError{kind: f.kind, err: f.cause}
}

// lastingFault records, once, a fault that lasts until the service is
// restarted, and tells the operator in one ERROR line what happened and
// what to do; it returns the fault in force, the first one recorded.
func (s *petStore) lastingFault(se *storageError, todo string, args ...any) *storageError {
	if s.lasting.CompareAndSwap(nil, se) {
		args = append(args, "fault", se.kind.message(), "err", se.err.Error(), "db", s.file.path)
		s.log.Error(todo, args...)
	}
	return s.lasting.Load()
}

// storageFault is err from SQLite as a storageError when the storage is
// at fault, and records the faults that last: a corrupt file, or an I/O
// error, after which the kernel may have dropped pages it had taken and
// report success on the next fsync (PostgreSQL's lesson of 2018), so
// nothing more is written to the files: no commit, no checkpoint, no
// close that checkpoints. The next start recovers from the -wal, which
// held every acknowledged pet when its commit was fsynced. A nil err is
// returned as it is, so a call's result can be passed straight in.
func (s *petStore) storageFault(err error) error {
	var se *storageError
	if !errors.As(err, &se) {
		kind, ok := classifyFault(err)
		if !ok {
			return err
		}
		se = &storageError{kind: kind, err: err}
	}
	switch se.kind {
	case faultDamaged:
		return s.lastingFault(se, "database file is damaged: stop the service, move the file and its -wal and -shm aside, and restore the latest backup (docs/operations.md: Backups and restore)")
	case faultIO:
		return s.lastingFault(se, "a write or an fsync failed with an I/O error: the kernel may have dropped pages it had taken, so the service writes nothing more to the files "+
			"(creates are refused, reads go on); check the storage (dmesg), then restart the service: SQLite recovers from the -wal what the storage kept, "+
			"and the start checks the file and its pets before it takes creates; if it then reports the file damaged or pets missing, "+
			"restore from the Litestream replica or the latest backup (docs/operations.md: A disk that fails under the service)")
	}
	return se
}

// saveVanished runs in the writer loop once a file SQLite holds open is
// no longer at its path. What the service holds is saved through its
// open connection: where the database at its path is still the one
// SQLite holds (only the -wal or -shm went), a checkpoint into it (see
// checkpointInPlace) is the save, and a restart is all it takes. Where
// the database itself went, or a reader holds the checkpoint back, VACUUM
// INTO writes every pet to a new file beside the path, which the log
// names (saved=) for a restore. It reports whether every pet
// the service committed is in the database at its path or in the saved
// file.
func (s *petStore) saveVanished(w *batchWriter, which string) bool {
	kind := faultTampered
	if which == s.file.path {
		kind = faultReplaced
	}
	se := &storageError{kind: kind, err: fmt.Errorf("%s was deleted or replaced", which)}
	const vanished = "a file SQLite holds open was deleted or replaced under the running service: creates are refused from now on; "
	if aside, ok := s.checkpointInPlace(w); ok {
		s.savedInPlace = true
		s.lastingFault(se, vanished+inPlace, aside...)
		return true
	}
	// Written under a name of its own and renamed once whole, so that a
	// file named as saved is never half a copy.
	dir := filepath.Dir(s.file.path)
	saving, err := vacuumInto(context.Background(), w.conn, dir, filepath.Base(s.file.path)+".saving-"+time.Now().UTC().Format("20060102T150405Z")+"-*")
	saved := strings.Replace(saving, ".saving-", ".saved-", 1)
	if err == nil {
		err = errors.Join(os.Rename(saving, saved), syncPath(dir))
	}
	if err != nil {
		s.lastingFault(se, vanished+"its pets could not be saved: fetch the pets the service still lists before you stop it", "save_err", err.Error())
		return false
	}
	s.lastingFault(se, vanished+"every pet it holds is saved to the file named saved: stop the service, restore that file in place of the database, then start it (docs/operations.md: The operator contract)",
		"saved", saved)
	return true
}

// inPlace is the advice once the database at its path holds every pet.
const inPlace = "every pet it holds is in the database at its path, checkpointed: restart the service"

// checkpointInPlace checkpoints every committed pet into the database
// SQLite holds, emptying its -wal (once: no commit follows), and reports
// whether that is the one at the path, with no -wal beside it but the
// service's: one another hand laid there, which the next start would
// lay over the database, is moved aside first, and kept.
func (s *petStore) checkpointInPlace(w *batchWriter) (aside []any, ok bool) {
	path := s.file.path
	db, err := os.Stat(path)
	if !s.savedInPlace && w.checkpoint("TRUNCATE") != nil || err != nil || !os.SameFile(db, s.file.opened[0]) {
		return nil, false
	}
	// An empty one, as a sqlite3 shell's read leaves, holds nothing to lay.
	if wal, err := os.Stat(path + "-wal"); err == nil && wal.Size() > 0 && !os.SameFile(wal, s.file.opened[1]) {
		aside = []any{"moved_aside", path + "-wal.not-the-services-" + time.Now().UTC().Format("20060102T150405.000Z")}
		return aside, os.Rename(path+"-wal", aside[1].(string)) == nil && syncPath(filepath.Dir(path)) == nil
	}
	return nil, true
}

// keepInPlace runs once a second while the -wal or -shm is known to have
// vanished: a checkpoint a reader held back (Litestream's, a sqlite3
// shell's) is tried again, and a -wal laid at the path since (an rm, then
// a cp) is moved aside, so that the restart the log asks for finds every
// pet. It logs when the database at its path came to hold them all, and
// when it moved a -wal aside.
func (s *petStore) keepInPlace(w *batchWriter) {
	if f := s.lasting.Load(); f == nil || f.kind != faultTampered {
		return
	}
	// A reader is waited out a second at a time, not in the writer loop,
	// which must go on refusing creates.
	w.setBusyTimeout(0)
	defer w.setBusyTimeout(busyTimeoutMillis)
	if aside, ok := s.checkpointInPlace(w); ok && (!s.savedInPlace || aside != nil) {
		s.savedInPlace = true
		s.log.Error("the database at its path holds every pet: "+inPlace, append(aside, "db", s.file.path)...)
	}
}

// health is the health check: nil while the store can both read and
// store a pet, and otherwise the failing check as a storageError. It does
// no I/O: reads are answered from memory, faults already known are read
// from memory too, and the rest comes from the writer loop's probes (see
// storageDoubtful), so any number of monitors asking at once costs
// nothing and cannot themselves look like a fault.
func (s *petStore) health() error {
	select {
	case <-s.ready:
	default:
		return &storageError{kind: faultStarting, err: errors.New("not ready yet")}
	}
	if f := s.lasting.Load(); f != nil {
		return f
	}
	if start := s.commitStart.Load(); start != 0 && time.Since(time.Unix(0, start)) > stalledCommit {
		return &storageError{kind: faultNotAnswering, err: fmt.Errorf("a commit has been waiting on the storage for %s", time.Since(time.Unix(0, start)).Round(time.Second))}
	}
	if f := s.faults.current(); f != nil {
		return f // the writer loop probes every second until it clears
	}
	_, err := s.catalogue() // no view: reads are refused
	return err
}

// stalledCommit is how long a commit may wait on the storage (a frozen
// filesystem, a stalled disk) before the log and the health check say so.
const stalledCommit = 5 * time.Second

// minFreeBytes is the free space below which the writer loop tries a
// real write: only that tells whether a pet can still be stored, whatever
// blocks the filesystem keeps for root and whether this process may use
// them.
const minFreeBytes = 1 << 20

// storageDoubtful reports whether only a real write (probeWrite) tells
// whether a pet can be stored: the filesystem is read-only or nearly
// full, or the file could be opened only for reading. Otherwise the
// creates, and the writer loop's probes after a fault, tell.
func (s *petStore) storageDoubtful() bool {
	var st syscall.Statfs_t
	err := syscall.Fstatfs(int(s.file.lock.Fd()), &st)
	// ST_RDONLY on Linux, MNT_RDONLY on the BSDs and macOS; the fields'
	// types differ between systems, hence the conversions (FreeBSD's
	// Bavail is signed, below zero inside the root reserve).
	const stRdonly = 1
	return err != nil || st.Flags&stRdonly != 0 || int64(st.Bavail)*int64(st.Bsize) < minFreeBytes || s.file.readOnly.Load()
}

// quickCheck runs PRAGMA quick_check on db, before the first write, a
// migration's included: a file damaged while the service was down (a
// disk that failed, a crash after an I/O error) is refused for writing
// instead of being written on, and what can be read of it is served if
// every row can be.
func quickCheck(db *sql.DB) error {
	var result string
	err := db.QueryRowContext(context.Background(), "PRAGMA quick_check(1)").Scan(&result)
	if err == nil && result != "ok" {
		err = &storageError{kind: faultDamaged, err: errors.New("quick_check: " + result)}
	}
	return err
}
