package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStore(t *testing.T) {
	t.Run("database file is private", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "pets.db")
		s, err := openStore(path, storeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("mode = %v, want 0600", fi.Mode().Perm())
		}
	})
	t.Run("schema version is recorded and reopening keeps data", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "pets.db")
		s, err := openStore(path, storeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p, _, err := s.createPet(context.Background(), createRequest{pet: NewPet{Name: "Rex", CategoryID: 1, Status: "available"}})
		if err != nil {
			t.Fatal(err)
		}
		s.close()
		s, err = openStore(path, storeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		got, err := storedPet(s, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(p, got, cmp.AllowUnexported()); diff != "" {
			t.Errorf("after reopen (-want +got):\n%s", diff)
		}
		var version int
		s.readers.QueryRow("PRAGMA user_version").Scan(&version)
		if version != len(migrations) {
			t.Errorf("user_version = %d, want %d", version, len(migrations))
		}
		var mode string
		s.readers.QueryRow("PRAGMA journal_mode").Scan(&mode)
		if mode != "wal" {
			t.Errorf("journal_mode = %q, want wal", mode)
		}
	})
	t.Run("refuses a newer schema", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "pets.db")
		db, _ := sql.Open("sqlite3", path)
		if _, err := db.Exec("PRAGMA user_version = 99"); err != nil {
			t.Fatal(err)
		}
		db.Close()
		_, err := openStore(path, storeOptions{})
		want := fmt.Sprintf("open database %s: schema version 99 is newer than this build understands (%d); use a newer petstore", path, len(migrations))
		if err == nil || err.Error() != want {
			t.Errorf("openStore error = %v, want %q", err, want)
		}
	})
	t.Run("status filter reads only the covering index, in id order", func(t *testing.T) {
		s, err := openStore(filepath.Join(t.TempDir(), "pets.db"), storeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		var plan strings.Builder
		rows, err := s.readers.Query("EXPLAIN QUERY PLAN SELECT id, name, category_id, status FROM pets WHERE status = ? AND id > ? ORDER BY id LIMIT ?", "sold", 0, 20)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, parent, notused int
			var detail string
			rows.Scan(&id, &parent, &notused, &detail)
			plan.WriteString(detail + "\n")
		}
		rows.Close()
		if !strings.Contains(plan.String(), "COVERING INDEX pets_status_cover") || strings.Contains(plan.String(), "TEMP B-TREE") {
			t.Errorf("plan does not use the index without a sort:\n%s", plan.String())
		}
	})
}

func TestMigrateFromVersion1(t *testing.T) {
	// A file written by the first release (schema version 1) is upgraded in
	// place, its pets kept, and idempotency works on it.
	path := filepath.Join(t.TempDir(), "v1.db")
	db, err := sql.Open("sqlite3", sqliteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{migrations[0], "PRAGMA user_version = 1",
		"INSERT INTO pets (name, category_id, status) VALUES ('Old', 4, 'sold')"} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	s, err := openStore(path, storeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	got, err := storedPet(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Pet{ID: 1, Name: "Old", CategoryID: 4, Status: "sold"}, got); diff != "" {
		t.Errorf("pet after migration (-want +got):\n%s", diff)
	}
	req := createRequest{pet: NewPet{Name: "New", CategoryID: 1, Status: "available"}, idempotencyKey: "k"}
	first, _, err := s.createPet(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	again, replayed, err := s.createPet(context.Background(), req)
	if err != nil || !replayed || again != first {
		t.Errorf("retry = %+v, %v, %v; want %+v replayed", again, replayed, err, first)
	}
}

func TestBackupWhileWriting(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "pets.db")
	srv, store := newTestServerAt(t, dbPath)
	// Writers keep creating pets while the backup runs.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := map[int64]Pet{}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p, _, err := store.createPet(context.Background(), createRequest{pet: NewPet{Name: fmt.Sprintf("w%d-%d", w, i), CategoryID: int64(w + 1), Status: "pending"}})
				if err != nil {
					t.Errorf("create: %v", err)
					return
				}
				mu.Lock()
				acked[p.ID] = p
				mu.Unlock()
			}
		}()
	}
	// Stopped also if the test fails first, before the store is closed.
	var stopOnce sync.Once
	stopWriters := func() { stopOnce.Do(func() { close(stop); wg.Wait() }) }
	t.Cleanup(stopWriters)
	waitFor(t, patience, "the writers to store 20 pets", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acked) >= 20
	})
	mu.Lock()
	before := len(acked)
	mu.Unlock()

	backup := filepath.Join(t.TempDir(), "backup.db")
	var out bytes.Buffer
	err := run(context.Background(), []string{"petstore", "backup", "-db", dbPath, backup}, func(string) string { return "" }, &out, io.Discard)
	// Once the writers have stopped, every committed row has been
	// recorded as acknowledged: a row the snapshot holds is among them.
	stopWriters()
	after := len(acked)
	if err != nil {
		t.Fatalf("backup: %v", err)
	}
	if fi, err := os.Stat(backup); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("backup file: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}

	// The copy is a consistent snapshot: at least what was acknowledged
	// before it began, every row identical to the live one.
	copyStore, err := openStore(backup, storeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer copyStore.close()
	got, err := storedPets(copyStore)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < before || len(got) > after {
		t.Errorf("backup holds %d pets; %d were acknowledged before it began, %d in all", len(got), before, after)
	}
	for i, p := range got {
		if p != acked[p.ID] {
			t.Errorf("backup pet %+v differs from the acknowledged %+v", p, acked[p.ID])
		}
		if p.ID != int64(i+1) {
			t.Fatalf("backup has a gap: pet %d at position %d", p.ID, i+1)
		}
	}
	if want := fmt.Sprintf("backed up %s to %s: %d pets, integrity ok\n", dbPath, backup, len(got)); out.String() != want {
		t.Errorf("backup said %q, want %q", out.String(), want)
	}
	t.Logf("backup of a live database: %d pets acknowledged before it began, %d in all, %d in the copy", before, after, len(got))

	// The live service is unaffected.
	checkReply(t, do(t, srv, call{method: "GET", path: "/healthz"}), 200, nil, `{"status":"ok"}`)

	// A backup never overwrites.
	err = run(context.Background(), []string{"petstore", "backup", "-db", dbPath, backup}, func(string) string { return "" }, io.Discard, io.Discard)
	if want := "backup: backup file " + backup + " already exists; a backup never overwrites a file"; err == nil || err.Error() != want {
		t.Errorf("second backup: %v, want %q", err, want)
	}
	err = run(context.Background(), []string{"petstore", "backup", "-db", filepath.Join(t.TempDir(), "missing.db"), filepath.Join(t.TempDir(), "b.db")}, func(string) string { return "" }, io.Discard, io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "backup: database to back up: stat ") {
		t.Errorf("backup of a missing file: %v", err)
	}
}

// storedPet reads one pet straight from the store.
func storedPet(s *petStore, id int64) (Pet, error) {
	var p Pet
	err := s.getPet(context.Background(), id, func(r *petRow) { p = petOf(r) })
	return p, err
}

// storedPets reads the whole catalogue straight from the store.
func storedPets(s *petStore) ([]Pet, error) {
	var pets []Pet
	err := s.listPets(context.Background(), petFilter{limit: 1 << 30}, func(r *petRow) { pets = append(pets, petOf(r)) })
	return pets, err
}

// petOf copies a row into a Pet that outlives the callback.
func petOf(r *petRow) Pet {
	return Pet{ID: r.id, Name: string(r.name), CategoryID: r.categoryID, Status: string(r.status)}
}
