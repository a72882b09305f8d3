package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestNoCommitBehindTheClientsBack holds the database's write lock from
// another process for longer than the binary's write timeout: every
// create is answered before the timeout cuts its connection, and no pet
// is stored that was not answered 201.
func TestNoCommitBehindTheClientsBack(t *testing.T) {
	db := filepath.Join(t.TempDir(), "pets.db")
	// An 8 s write timeout: the service gives up on a create 2 s before
	// it (its widest margin), time enough to write the 503 on a loaded
	// machine.
	const writeTimeout = 8 * time.Second
	base, _ := startBinary(t, nil, []string{"-db", db, "-write-timeout", writeTimeout.String()}, nil)
	other, release := holdWriteLock(t, db)
	const creates = 20
	var wg sync.WaitGroup
	replies := make([]reply, creates)
	client := &http.Client{Timeout: patience}
	held := time.Now()
	for i := range creates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = send(t, base, call{method: "POST", path: "/v1/pets", body: fmt.Sprintf(`{"name":"Held %d","categoryId":1}`, i), client: client})
		}()
	}
	// The lock is held until every create has its answer, however long
	// that takes: longer than any create's deadline.
	wg.Wait()
	heldFor := time.Since(held)
	release()
	acked := 0
	for i, r := range replies {
		switch {
		case r.err != nil:
			t.Errorf("create %d was not answered: %v", i, r.err)
		case r.status == 201:
			acked++
		case r.status != 503:
			t.Errorf("create %d: status %d, want 503 or 201", i, r.status)
		}
	}
	// A create sent now is committed after anything the writer still
	// held from before: once it is answered, a commit behind the
	// clients' back would be in the file.
	createPets(t, base, `{"name":"After the lock","categoryId":1}`)
	var stored int
	must(t, other.QueryRow("SELECT count(*) FROM pets").Scan(&stored))
	stored-- // the create after the lock
	t.Logf("write lock held %s, write timeout %s: %d creates, %d answered 201, %d answered 503, %d stored, %d stored but not answered 201",
		heldFor.Round(time.Millisecond), writeTimeout, creates, acked, creates-acked, stored, stored-acked)
	if stored != acked {
		t.Errorf("%d pets stored, %d answered 201", stored, acked)
	}
}

// TestWALIsBounded holds a read transaction open from another connection
// while creates stream in, so the WAL cannot be checkpointed and grows;
// once the reader lets go, the WAL shrinks back under the limit while
// creates go on (how long that took is logged).
func TestWALIsBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pets.db")
	const limit = 64 << 20 // journal_size_limit
	s, err := openStore(path, discardLog)
	must(t, err)
	defer s.close()
	walSize := func() int64 {
		fi, err := os.Stat(path + "-wal")
		must(t, err)
		return fi.Size()
	}

	reader, err := sql.Open("sqlite3", path)
	must(t, err)
	defer reader.Close()
	conn, _ := reader.Conn(context.Background())
	defer conn.Close()
	var n int
	conn.ExecContext(context.Background(), "BEGIN")
	must(t, conn.QueryRowContext(context.Background(), "SELECT count(*) FROM pets").Scan(&n))

	var failed atomic.Bool // the first failure is reported, not every one
	stop := inLoops(t, 8, func() {
		if _, _, err := s.createPet(context.Background(), createRequest{pet: NewPet{Name: strings.Repeat("n", 90), CategoryID: 1, Status: "sold"}}); err != nil && !failed.Swap(true) {
			t.Error(err)
		}
	})
	defer stop()
	waitFor(t, 2*patience, "the WAL to grow past the limit", func() bool { return walSize() > limit+limit/4 })
	grown := walSize()
	conn.ExecContext(context.Background(), "COMMIT")
	released := time.Now()
	waitFor(t, patience, "the WAL to shrink under the limit", func() bool { return walSize() <= limit })
	t.Logf("WAL: %d bytes while the reader held it (limit %d); %d bytes %s after it let go, creates going on",
		grown, limit, walSize(), time.Since(released).Round(time.Millisecond))
}

// TestWriterRefusesAnIDHeldBefore: the last guard against a file that
// went back. An insert that gets an id at or below the highest the
// service has held rolls its whole transaction back.
func TestWriterRefusesAnIDHeldBefore(t *testing.T) {
	w, db := newTestBatchWriter(t)
	request := func(name string) *writeRequest {
		return &writeRequest{ctx: context.Background(), done: make(chan writeResult, 1),
			req: createRequest{pet: NewPet{Name: name, CategoryID: 1, Status: "sold"}}}
	}
	none := func() error { return nil }
	if _, err := w.commit([]*writeRequest{request("A"), request("B")}, none, 1); !errors.Is(err, errIDNotNew) {
		t.Errorf("a batch whose first id is at the floor: %v, want errIDNotNew", err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pets").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d pets stored (%v), want none", n, err)
	}
	results, err := w.commit([]*writeRequest{request("C")}, none, 0)
	if err != nil || results[0].err != nil || results[0].pet.ID != 1 {
		t.Errorf("above the floor: %+v, %v; want pet 1 stored", results, err)
	}
}

// TestOneRefusedCreateSparesItsBatch: a trigger an operator added refuses
// one name. A batch of five valid creates and the refused one, formed
// behind a create that waits for a lock, stores the five and the blocker,
// and answers the refused one with its own cause.
func TestOneRefusedCreateSparesItsBatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pets.db")
	svc := startService(t, nil, "-db", path)
	sqlExec(t, path, `CREATE TRIGGER refuse_some BEFORE INSERT ON pets WHEN NEW.name = 'Refused'
		BEGIN SELECT RAISE(ABORT, 'no pet may be named Refused'); END`)
	other, release := holdWriteLock(t, path)
	var wg sync.WaitGroup
	replies := map[string]*reply{}
	create := func(name string) {
		r := &reply{}
		replies[name] = r
		wg.Add(1)
		go func() {
			defer wg.Done()
			*r = send(t, svc.url, call{method: "POST", path: "/v1/pets", body: `{"name":"` + name + `","categoryId":1}`})
		}()
	}
	create("Blocker")
	waitFor(t, patience, "the blocker's commit to wait for the lock", func() bool { return svc.store.commitStart.Load() != 0 })
	names := []string{"One", "Two", "Refused", "Three", "Four", "Five"}
	for _, name := range names {
		create(name)
	}
	waitFor(t, patience, "six creates to queue behind the blocker", func() bool { return len(svc.store.queue.writes) == len(names) })
	release()
	wg.Wait()
	checkReply(t, *replies["Blocker"], 201, nil, `{"id":1,"name":"Blocker","categoryId":1,"status":"available"}`)
	for _, name := range names {
		if name == "Refused" {
			checkReply(t, *replies[name], 422, nil, errBody(422, codeRefusedByDatabase, "the database refused this pet: no pet may be named Refused"))
		} else if replies[name].status != 201 {
			t.Errorf("create %s: %d %s", name, replies[name].status, replies[name].body)
		}
	}
	var stored int
	if err := other.QueryRow("SELECT count(*) FROM pets").Scan(&stored); err != nil || stored != 6 {
		t.Errorf("%d pets stored (%v), want 6: the blocker and the five valid ones", stored, err)
	}
}

// TestWriterLeavesAStuckTransaction: a writer connection left inside a
// transaction (its ROLLBACK failed) would fail every later BEGIN, and so
// every create; the next transaction rolls it back first.
func TestWriterLeavesAStuckTransaction(t *testing.T) {
	w, db := newTestBatchWriter(t)
	ctx := context.Background()
	if _, err := w.conn.ExecContext(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	err := w.inTx(ctx, func() error {
		_, _, err := w.insertPet(ctx, createRequest{pet: NewPet{Name: "After", CategoryID: 1, Status: "sold"}})
		return err
	})
	if err != nil {
		t.Fatalf("a transaction after a stuck one: %v", err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM pets WHERE name = 'After'").Scan(&n); err != nil || n != 1 {
		t.Errorf("%d pets stored (%v), want 1", n, err)
	}
}

// newTestBatchWriter opens a batch writer on a new petstore file of its
// own, with no store around it.
func newTestBatchWriter(t *testing.T) (*batchWriter, *sql.DB) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pets.db")
	s, err := openStore(path, discardLog)
	must(t, err)
	s.close()
	db, err := sql.Open(sqliteDriver, sqliteDSN(path, "_txlock=immediate"))
	must(t, err)
	t.Cleanup(func() { db.Close() })
	w, err := newBatchWriter(db)
	must(t, err)
	t.Cleanup(w.close)
	return w, db
}
