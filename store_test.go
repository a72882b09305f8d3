package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStore(t *testing.T) {
	// That a reopen keeps the pets is TestRun's restart, through the API.
	t.Run("a new file is private, in WAL mode, at the latest schema version", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "pets.db")
		s, err := openStore(path, discardLog)
		must(t, err)
		defer s.close()
		fi, err := os.Stat(path)
		must(t, err)
		var version int
		var mode string
		sqlReader(t, s.file.path).QueryRow("PRAGMA user_version").Scan(&version)
		sqlReader(t, s.file.path).QueryRow("PRAGMA journal_mode").Scan(&mode)
		if fi.Mode().Perm() != 0o600 || version != len(migrations) || mode != "wal" {
			t.Errorf("mode %v, user_version %d, journal_mode %q; want 0600, %d, wal", fi.Mode().Perm(), version, mode, len(migrations))
		}
	})
	t.Run("refuses a newer schema", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "pets.db")
		sqlExec(t, path, "PRAGMA user_version = 99")
		_, err := openStore(path, discardLog)
		want := fmt.Sprintf("open database %s: schema version 99 is newer than this build understands (%d); use a newer petstore", path, len(migrations))
		if err == nil || err.Error() != want {
			t.Errorf("openStore error = %v, want %q", err, want)
		}
	})
}

func TestMigrateFromVersion1(t *testing.T) {
	// A file written by the first release (schema version 1) is upgraded in
	// place, its pets kept, and idempotency works on it.
	path := filepath.Join(t.TempDir(), "v1.db")
	sqlExec(t, sqliteDSN(path), migrations[0], "PRAGMA user_version = 1", "INSERT INTO pets (name, category_id, status) VALUES ('Old', 4, 'sold')")
	s, err := openStore(path, discardLog)
	must(t, err)
	defer s.close()
	got, err := storedPet(s, 1)
	must(t, err)
	if diff := cmp.Diff(Pet{ID: 1, Name: "Old", CategoryID: 4, Status: "sold"}, got); diff != "" {
		t.Errorf("pet after migration (-want +got):\n%s", diff)
	}
	req := createRequest{pet: NewPet{Name: "New", CategoryID: 1, Status: "available"}, idempotencyKey: "k", scope: idempotencyScope(digestOf(testKey))}
	first, _, err := s.createPet(context.Background(), req)
	must(t, err)
	again, replayed, err := s.createPet(context.Background(), req)
	if err != nil || !replayed || again != first {
		t.Errorf("retry = %+v, %v, %v; want %+v replayed", again, replayed, err, first)
	}
}

// storedPet reads one pet straight from the store.
func storedPet(s *petStore, id int64) (Pet, error) {
	var p Pet
	err := s.getPet(id, func(r *petRow) { p = petOf(r) })
	return p, err
}

// storedPets reads the whole catalogue straight from the store.
func storedPets(s *petStore) ([]Pet, error) {
	var pets []Pet
	err := s.listPets(petFilter{limit: 1 << 30}, func(r *petRow) { pets = append(pets, petOf(r)) })
	return pets, err
}

// petOf copies a row into a Pet that outlives the callback.
func petOf(r *petRow) Pet {
	return Pet{ID: r.id, Name: string(r.name), CategoryID: r.categoryID, Status: string(r.status)}
}

// TestForeignFiles: the service marks its files and refuses, unchanged, a
// SQLite file of another application or one holding tables it did not
// make; an unmarked file of an earlier petstore is marked.
func TestForeignFiles(t *testing.T) {
	for _, tc := range []struct {
		name, wantErr string
		sqls          []string
	}{
		{"another application", "not a petstore database: it belongs to another application (SQLite application_id 0x2a); use another -db file",
			[]string{"PRAGMA application_id = 42", "CREATE TABLE t (x)"}},
		{"tables not its own", "not a petstore database: it holds tables petstore did not make (customers, orders); use another -db file",
			[]string{"CREATE TABLE orders (x)", "CREATE TABLE customers (x)"}},
		{"only a view", "not a petstore database: it holds tables petstore did not make (v); use another -db file",
			[]string{"CREATE VIEW v AS SELECT 1"}},
		{"another table beside pets", "not a petstore database: it holds tables petstore did not make (notes); use another -db file",
			[]string{"CREATE TABLE pets (x)", "CREATE TABLE notes (x)", "PRAGMA user_version = 2"}},
		{"a pets table of another shape", "not a petstore database: its pets table has the columns (id, species), not petstore's (id, name, category_id, status, idempotency_key, request_fingerprint); use another -db file",
			[]string{"CREATE TABLE pets (id INTEGER PRIMARY KEY, species TEXT)", "PRAGMA user_version = 2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.db")
			sqlExec(t, path, tc.sqls...)
			before, _ := os.ReadFile(path)
			_, err := openStore(path, discardLog)
			if want := "open database " + path + ": " + tc.wantErr; err == nil || err.Error() != want {
				t.Errorf("openStore: %v, want %q", err, want)
			}
			if after, _ := os.ReadFile(path); string(after) != string(before) {
				t.Error("the refused file was changed")
			}
			for _, companion := range []string{path + "-wal", path + "-shm"} {
				if _, err := os.Stat(companion); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s was made for a refused file", filepath.Base(companion))
				}
			}
		})
	}

	t.Run("unmarked file of an earlier petstore", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "p.db")
		s, err := openStore(path, discardLog)
		must(t, err)
		s.close()
		sqlExec(t, path, "DROP TRIGGER pets_inserted", "DROP TRIGGER pets_updated", "DROP TRIGGER pets_deleted", "DROP TRIGGER pets_replacing",
			"DROP INDEX pets_idempotency_key", "ALTER TABLE pets DROP COLUMN idempotency_scope",
			"CREATE UNIQUE INDEX pets_idempotency_key ON pets (idempotency_key) WHERE idempotency_key IS NOT NULL",
			"DROP TABLE pets_changes", "PRAGMA application_id = 0", "PRAGMA user_version = 3")
		s, err = openStore(path, discardLog)
		if err != nil {
			t.Fatalf("an earlier petstore's file: %v", err)
		}
		var id, version int64
		sqlReader(t, s.file.path).QueryRow("PRAGMA application_id").Scan(&id)
		sqlReader(t, s.file.path).QueryRow("PRAGMA user_version").Scan(&version)
		s.close()
		if id != petstoreApplicationID || version != int64(len(migrations)) {
			t.Errorf("application_id %#x, user_version %d; want %#x, %d", id, version, petstoreApplicationID, len(migrations))
		}
	})
}

// TestIdempotencyKeysBelongToTheirAPIKey: two API keys sending the same
// Idempotency-Key get two pets, each its own replay; a key used before the
// keys were scoped (a version 5 file) matches no client after the upgrade.
func TestIdempotencyKeysBelongToTheirAPIKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v5.db")
	sqlExec(t, sqliteDSN(path), append(slices.Clone(migrations[:5]), "PRAGMA user_version = 5",
		`INSERT INTO pets (name, category_id, status, idempotency_key, request_fingerprint) VALUES ('Old', 1, 'available', 'order-1', x'00')`)...)
	const second = "second-key-0123456789ab"
	svc := startService(t, map[string]string{"PETSTORE_API_KEYS": testKey + "," + second}, "-db", path)
	store := svc.store
	create := func(apiKey, body string) reply {
		return send(t, svc.url, call{method: "POST", path: "/v1/pets", body: body,
			header: map[string]string{"Authorization": "Bearer " + apiKey, "Idempotency-Key": "order-1"}})
	}
	rex := `{"name":"Rex","categoryId":1}`
	checkReply(t, create(testKey, rex), 201, map[string]string{"Idempotent-Replayed": ""}, `{"id":2,"name":"Rex","categoryId":1,"status":"available"}`)
	checkReply(t, create(second, rex), 201, map[string]string{"Idempotent-Replayed": ""}, `{"id":3,"name":"Rex","categoryId":1,"status":"available"}`)
	checkReply(t, create(testKey, rex), 201, map[string]string{"Idempotent-Replayed": "true"}, `{"id":2,"name":"Rex","categoryId":1,"status":"available"}`)
	checkReply(t, create(second, rex), 201, map[string]string{"Idempotent-Replayed": "true"}, `{"id":3,"name":"Rex","categoryId":1,"status":"available"}`)
	checkReply(t, create(second, `{"name":"Tom","categoryId":1}`), 422, nil,
		errBody(422, codeIdempotencyKeyReused, "this Idempotency-Key was already used for a different pet; use a new key for a new request"))
	var scoped int
	if err := sqlReader(t, store.file.path).QueryRow("SELECT count(DISTINCT idempotency_scope) FROM pets WHERE idempotency_key = 'order-1'").Scan(&scoped); err != nil || scoped != 2 {
		t.Errorf("%d scopes stored for order-1 (%v), want 2 (the old row has none)", scoped, err)
	}
}
