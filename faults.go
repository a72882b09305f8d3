// Storage health: what the store does when the disk or the database file
// goes wrong underneath it. A fault is classified once, answered as a
// retryable 503 naming its cause, logged when it begins and when it ends
// (not once per request), and shown by /healthz, whose checks are here,
// until it clears.

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mattn/go-sqlite3"
)

// faultKind names a cause, outside the service, for which the store
// cannot store or read a pet.
type faultKind int

const (
	faultNone faultKind = iota
	faultDiskFull
	faultReadOnly
	faultIO
	faultLocked
	faultNotAnswering
	faultTimedOut // a create that could not be committed before its deadline
	faultDamaged  // lasts until the file is restored and the service restarted
	faultReplaced // lasts until the service is restarted
	faultWentBack // the file lost pets it held; lasts until restart
	faultTampered // the file or its -wal changed outside SQLite; lasts until restart
)

// message says what is wrong, starting with the short name of the failing
// check, for the client and for /healthz.
func (k faultKind) message() string {
	switch k {
	case faultDiskFull:
		return "disk full: the filesystem holding the database has no space left, so no pet can be stored until space is freed"
	case faultReadOnly:
		return "read-only: the database file or its filesystem cannot be written"
	case faultIO:
		return "I/O error: the storage holding the database reports errors"
	case faultLocked:
		return "database locked: another process holds the database's write lock"
	case faultDamaged:
		return "damaged: the database file is corrupt and must be restored from a backup"
	case faultReplaced:
		return "file replaced: the database file was deleted or replaced while the service ran; the service must be restarted"
	case faultTimedOut:
		return "timed out: the pet could not be committed before the write timeout, so it was not stored"
	case faultTampered:
		return "storage tampered: the database file or its -wal file was changed under the running service by something other than SQLite (deleted, replaced, cut short or overwritten in place), so no pet can be stored safely; the service must be restarted"
	case faultWentBack:
		return "catalogue went back: the database file no longer holds pets this service stored (an older copy was put under it), so new pets would reuse their ids; the service must be restarted"
	}
	return "database not answering"
}

// retryAfter is the Retry-After of a 503 for the fault, in seconds: a lock
// passes quickly; the others wait for an operator.
func (k faultKind) retryAfter() string {
	switch k {
	case faultLocked, faultNotAnswering, faultTimedOut:
		return "1"
	case faultDamaged, faultReplaced, faultWentBack, faultTampered:
		return "60"
	case faultIO:
		return "60" // refused until a restart: a failed fsync is not retried
	}
	return "5"
}

// code is the Error body's code for the fault: the catalogue going back
// has its own, since a client that retries blindly on "unavailable" must
// learn that pets it was told were stored are gone.
func (k faultKind) code() string {
	switch k {
	case faultWentBack:
		return codeAcknowledgedPetsMissing
	case faultTampered:
		return codeStorageTampered
	}
	return codeUnavailable
}

// storageError is a store failure with a known cause outside the service.
// Handlers answer it with 503 and Retry-After; it is logged by the
// faultLog, not per request.
type storageError struct {
	kind faultKind
	err  error
}

func (e *storageError) Error() string { return e.kind.message() + ": " + e.err.Error() }
func (e *storageError) Unwrap() error { return e.err }

// classifyFault tells whether err comes from the storage rather than from
// the service, and which fault it is. Unknown errors stay unknown (500).
func classifyFault(err error) (faultKind, bool) {
	var se *storageError
	if errors.As(err, &se) {
		return se.kind, true
	}
	var sqliteErr sqlite3.Error
	if errors.As(err, &sqliteErr) {
		// The system's errno says more than SQLite's code: a write refused
		// for an immutable file is SQLITE_IOERR_WRITE with EPERM. But a
		// failed fsync is an I/O fault whatever its errno: ENOSPC from a
		// thin-provisioned volume means written pages were dropped.
		fsync := sqliteErr.ExtendedCode == sqlite3.ErrIoErrFsync || sqliteErr.ExtendedCode == sqlite3.ErrIoErrDirFsync
		if kind, ok := classifyErrno(sqliteErr.SystemErrno); ok && !fsync {
			return kind, true
		}
		switch sqliteErr.Code {
		case sqlite3.ErrFull:
			return faultDiskFull, true
		case sqlite3.ErrReadonly:
			if sqliteErr.ExtendedCode == sqlite3.ErrReadonlyDbMoved {
				return faultReplaced, true
			}
			return faultReadOnly, true
		case sqlite3.ErrPerm:
			return faultReadOnly, true
		case sqlite3.ErrIoErr, sqlite3.ErrCantOpen:
			return faultIO, true
		case sqlite3.ErrBusy, sqlite3.ErrLocked:
			return faultLocked, true
		case sqlite3.ErrCorrupt, sqlite3.ErrNotADB:
			return faultDamaged, true
		}
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

// asStorageError wraps err as a storageError when it is a storage fault,
// and returns it unchanged otherwise.
func asStorageError(err error) error {
	if err == nil {
		return nil
	}
	if kind, ok := classifyFault(err); ok {
		var se *storageError
		if errors.As(err, &se) {
			return err
		}
		return &storageError{kind: kind, err: err}
	}
	return err
}

// storeHealth is what the store knows of its storage's health.
type storeHealth struct {
	faults *faultLog
	// damage is why the file is known to be corrupt ("" while it is not):
	// found by the quick_check at start or by a query. It lasts until the
	// file is restored and the service restarted.
	damage atomic.Pointer[string]
	// replaced is set once the path no longer names the opened file; it
	// lasts until restart.
	replaced atomic.Pointer[storageError]
	// framesLost is set with replaced when the files no longer hold pets
	// the service acknowledged (see rescue.go).
	framesLost atomic.Bool
	// ioFailed is set once a write or an fsync failed with an I/O error:
	// the kernel may have dropped pages it had taken, and report success
	// on the next fsync, so it is not retried; it lasts until restart,
	// and the next start checks the whole file first (checkMarker).
	ioFailed atomic.Pointer[storageError]
	// wentBack is set once the file no longer holds pets the service
	// held (see view.checkWentBack); it lasts until restart.
	wentBack atomic.Pointer[storageError]
	// commitStart is when the commit in progress began (Unix nanoseconds),
	// 0 between commits: a commit stuck on a frozen filesystem shows in
	// /healthz.
	commitStart atomic.Int64
	// pinging is set while a health check's read runs.
	pinging atomic.Bool
	// checked is the latest background health check (watchHealth), and
	// recheck asks for one now.
	checked atomic.Pointer[healthCheck]
	recheck chan struct{}
	// checkMu orders a check's result after the fault changes counted in
	// faultChanges: a check that a change overtook is not kept.
	checkMu      sync.Mutex
	faultChanges int
	// stopWatch ends watchHealth, which closes watchDone.
	stopWatch, watchDone chan struct{}
}

// faultLog remembers the storage fault in force, so it is logged once
// when it begins, once when it ends (with how many requests it refused
// and for how long), and reported by /healthz in between.
type faultLog struct {
	log  *slog.Logger
	path string
	// changed is called when a fault begins (false) or ends (true).
	changed func(ended bool)

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
	if f.changed != nil {
		defer f.changed(false)
	}
	f.log.Error("storage fault: requests that need it are refused with 503 until it clears",
		"fault", kind.message(), "err", rootCause(cause).Error(), "db", f.path)
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
	if f.changed != nil {
		defer f.changed(true)
	}
}

// rootCause is the error under a storageError, for the log, which names
// the fault already.
func rootCause(err error) error {
	var se *storageError
	if errors.As(err, &se) {
		return se.err
	}
	return err
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

// health is /healthz's answer: nil while the store can both read and
// store a pet, and otherwise the failing check as a storageError. It does
// no I/O: faults already known are read from memory, and the rest comes
// from the latest background check (watchHealth), so any number of
// monitors asking at once costs nothing and cannot themselves look like a
// fault.
func (s *petStore) health() error {
	if err := s.knownFault(); err != nil {
		return err
	}
	if last := s.storage.checked.Load(); last != nil && last.err != nil {
		return last.err
	}
	return nil
}

// knownFault is the fault the store already knows of, from memory.
func (s *petStore) knownFault() error {
	if r := s.storage.replaced.Load(); r != nil {
		return r
	}
	if r := s.storage.wentBack.Load(); r != nil {
		return r
	}
	if r := s.storage.ioFailed.Load(); r != nil {
		return r
	}
	if d := s.storage.damage.Load(); d != nil {
		return &storageError{kind: faultDamaged, err: errors.New(*d)}
	}
	if start := s.storage.commitStart.Load(); start != 0 && time.Since(time.Unix(0, start)) > stuckCommit {
		return &storageError{kind: faultNotAnswering, err: fmt.Errorf("a commit has been waiting on the storage for %s", time.Since(time.Unix(0, start)).Round(time.Second))}
	}
	if f := s.storage.faults.current(); f != nil {
		return f // the writer loop probes every second until it clears
	}
	return nil
}

// healthCheckEvery is how often watchHealth checks the storage when
// nothing asks it to sooner.
const healthCheckEvery = time.Second

// healthCheck is one background check's outcome.
type healthCheck struct{ err error }

// watchHealth checks the storage about once a second, and at once when a
// fault begins or ends, until stop is closed; health answers from the
// latest check.
func (s *petStore) watchHealth(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(healthCheckEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		case <-s.storage.recheck:
		}
		s.checkHealthNow()
	}
}

// checkHealthNow runs one check and makes it what health answers.
func (s *petStore) checkHealthNow() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s.storage.checkMu.Lock()
	generation := s.storage.faultChanges
	s.storage.checkMu.Unlock()
	err := s.checkHealth(ctx)
	s.storage.checkMu.Lock()
	defer s.storage.checkMu.Unlock()
	if s.storage.faultChanges != generation {
		s.recheckHealth() // a fault began or ended meanwhile: this check may be stale
		return
	}
	s.storage.checked.Store(&healthCheck{err: err})
}

// faultChanged is the fault log's hook. A fault that began or ended makes
// the latest check stale, and another is run at once. One that ended did
// so because a write worked, which is the proof a check looks for:
// /healthz says so at once, without waiting for that check.
func (s *petStore) faultChanged(ended bool) {
	s.storage.checkMu.Lock()
	s.storage.faultChanges++
	if ended {
		s.storage.checked.Store(&healthCheck{})
	}
	s.storage.checkMu.Unlock()
	s.recheckHealth()
}

// recheckHealth asks watchHealth for a check now, without waiting.
func (s *petStore) recheckHealth() {
	select {
	case s.storage.recheck <- struct{}{}:
	default:
	}
}

// checkHealth returns nil while the store can both read and store a pet,
// and otherwise the failing check as a storageError: a stat, a statfs and
// one read; it writes only when the disk looks full or read-only. Only
// checkHealthNow calls it.
func (s *petStore) checkHealth(ctx context.Context) error {
	if s.storage.replaced.Load() == nil {
		if err := s.file.checkStillThere(); err != nil {
			s.markReplaced(err, false)
			return asStorageError(err)
		}
	}
	if err := s.knownFault(); err != nil {
		return err
	}
	if err := s.ping(ctx); err != nil {
		// A check refuses no request: it counts none.
		if se := s.readFault(err, 0); se != nil {
			return se
		}
		s.storage.faults.failed(faultNotAnswering, err, 0)
		return &storageError{kind: faultNotAnswering, err: err}
	}
	if fault := s.storage.faults.current(); fault != nil {
		return fault // the writer loop probes every second until it clears
	}
	if s.file.looksUnwritable() {
		return asStorageError(s.probe(ctx))
	}
	return nil
}

// ping runs one read, and waits for it no longer than ctx allows. On a
// frozen filesystem a read blocks in the kernel (SQLite writes to the -shm
// mapping), where no context reaches, so the read runs in a goroutine of
// its own; while one is stuck, the next ping fails at once instead of
// stacking up another.
func (s *petStore) ping(ctx context.Context) error {
	if !s.storage.pinging.CompareAndSwap(false, true) {
		return &storageError{kind: faultNotAnswering, err: errors.New("an earlier read has not finished")}
	}
	done := make(chan error, 1)
	go func() {
		var one int
		err := s.readers.QueryRowContext(context.Background(), "SELECT 1 FROM sqlite_schema LIMIT 1").Scan(&one)
		// Cleared before the answer goes out: a check that follows at once
		// must not find this one still running.
		s.storage.pinging.Store(false)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return &storageError{kind: faultNotAnswering, err: errors.New("a read did not finish in time")}
	}
}

// stuckCommit is how long a commit may wait on the storage before
// /healthz says the database is not answering.
const stuckCommit = 5 * time.Second

// probe asks the writer loop for a write that changes nothing, and
// returns its outcome.
func (s *petStore) probe(ctx context.Context) error {
	done := make(chan error, 1)
	select {
	case s.queue.probes <- done:
	case <-s.queue.loopDone:
		return errClosed
	case <-ctx.Done():
		return &storageError{kind: faultNotAnswering, err: errors.New("the writer is busy")}
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return &storageError{kind: faultNotAnswering, err: errors.New("a test write did not finish in time")}
	}
}

// markReplaced records, once, that the path no longer names the opened
// file, or that the files were tampered with, and tells the operator what
// to do. It reports whether err was such a fault. lost says the files no
// longer hold pets that were acknowledged: then, the first time, every pet
// is saved to the rescue file (only the writer loop passes it).
func (s *petStore) markReplaced(err error, lost bool) bool {
	var se *storageError
	if !errors.As(err, &se) || se.kind != faultReplaced && se.kind != faultTampered {
		return false
	}
	if !s.storage.replaced.CompareAndSwap(nil, se) {
		return true
	}
	if se.kind == faultReplaced {
		s.log.Error("the database file was deleted or replaced under the running service: creates are refused from now on; "+
			"restart the service to open the file now at the path, or restore it from a backup (README: Backups and restore)",
			"db", s.file.path, "err", se.err.Error())
		return true
	}
	if lost {
		s.logRescue(se)
		return true
	}
	s.log.Error("the database's -wal or -shm file was deleted or replaced under the running service: creates are refused from now on; "+
		"a -wal the service still held open is saved into the database file first; then restart the service, and if pets are missing "+
		"restore from the replica or a backup (README: Outside writes, restores and replicas)",
		"db", s.file.path, "err", se.err.Error())
	return true
}

// markIOFailed records, once, that a write or an fsync failed with an
// I/O error, says what to do, and leaves the mark that makes the next
// start check the file (tried again each second while it cannot be
// written).
func (s *petStore) markIOFailed(err error) {
	se := &storageError{kind: faultIO, err: rootCause(err)}
	s.file.markForCheck()
	if !s.storage.ioFailed.CompareAndSwap(nil, se) {
		return
	}
	then := "the next start checks the whole file (integrity_check) before it takes creates"
	if !s.file.markedForCheck.Load() {
		then = "the mark that makes the next start check the whole file could not be written (" + s.file.checkMark() +
			"), so run sqlite3 " + s.file.path + " 'PRAGMA integrity_check' before you start it again"
	}
	s.log.Error("a write or an fsync failed with an I/O error: the kernel may have dropped pages it had taken, so creates are refused "+
		"until a restart; check the storage (dmesg), then restart: "+then, "db", s.file.path, "err", se.err.Error())
}

// readFault classifies a read error: damage is recorded, another storage
// fault goes to the fault log with the requests it refused, and either
// comes back as a storageError for a 503; nil for other errors.
func (s *petStore) readFault(err error, refused int) *storageError {
	kind, ok := s.classify(err)
	if !ok {
		return nil
	}
	if kind == faultDamaged {
		s.markDamaged(err.Error())
	} else {
		s.storage.faults.failed(kind, err, refused)
	}
	return &storageError{kind: kind, err: err}
}

// classify is classifyFault in the light of the storage: pages read back
// from failing storage can look corrupt, and while an I/O fault is in
// force, or while the file cannot be read at all, that is put down to the
// storage, not recorded as damage to the file.
func (s *petStore) classify(err error) (faultKind, bool) {
	kind, ok := classifyFault(err)
	if kind == faultDamaged {
		if f := s.storage.faults.current(); f != nil && f.kind == faultIO || s.file.unreadable() {
			return faultIO, true
		}
	}
	return kind, ok
}

// readError is err from a read, as a storageError when the storage is at
// fault.
func (s *petStore) readError(err error) error {
	if err == nil {
		return nil
	}
	if se := s.readFault(err, 1); se != nil {
		return se
	}
	return err
}

// quickCheck runs PRAGMA quick_check once, in the background so a large
// file does not delay the start; damage it finds shows in /healthz.
func (s *petStore) quickCheck() {
	var result string
	err := s.readers.QueryRowContext(context.Background(), "PRAGMA quick_check(1)").Scan(&result)
	if err != nil {
		if kind, ok := classifyFault(err); ok && kind == faultDamaged {
			s.markDamaged(err.Error())
		}
		return
	}
	if result != "ok" {
		s.markDamaged("quick_check: " + result)
	}
}

// markDamaged records that the file is corrupt, and tells the operator
// what to do, once.
func (s *petStore) markDamaged(why string) {
	if s.storage.damage.CompareAndSwap(nil, &why) {
		s.log.Error("database file is damaged: stop the service, move the file and its -wal and -shm aside, and restore the latest backup (README: Backups and restore)",
			"db", s.file.path, "damage", why)
	}
}
