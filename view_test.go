package main

import (
	"context"
	"database/sql"
	"fmt"
	mathrand "math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// pageJSON encodes what a read gives, as the handlers would.
func pageJSON(read func(fn func(*petRow)) error) (string, error) {
	var b []byte
	err := read(func(r *petRow) { b = append(appendPetJSON(b, r), '\n') })
	return string(b), err
}

// checkViewMatchesSQLite compares every page and get that the view
// answers with what SQLite answers for the same request, byte for byte.
func checkViewMatchesSQLite(t *testing.T, s *petStore, maxID int64) {
	t.Helper()
	ctx := context.Background()
	if s.view.published.Load() == nil {
		t.Fatal("the view is not loaded")
	}
	checked := 0
	for _, status := range []string{"", "available", "pending", "sold"} {
		for _, limit := range []int{1, 7, 21, 101} {
			for after := int64(0); after <= maxID+1; after += 1 + after/3 {
				f := petFilter{after: after, status: status, limit: limit}
				fromView, _ := pageJSON(func(fn func(*petRow)) error { return s.listPets(ctx, f, fn) })
				fromFile, err := pageJSON(func(fn func(*petRow)) error { return s.listPetsFromSQLite(ctx, f, fn) })
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(fromFile, fromView); diff != "" {
					t.Fatalf("list %+v (-sqlite +view):\n%s", f, diff)
				}
				checked++
			}
		}
	}
	for id := int64(-1); id <= maxID+2; id++ {
		fromView, viewErr := pageJSON(func(fn func(*petRow)) error { return s.getPet(ctx, id, fn) })
		fromFile, fileErr := pageJSON(func(fn func(*petRow)) error { return s.getPetFromSQLite(ctx, id, fn) })
		if fromView != fromFile || (viewErr == nil) != (fileErr == nil) {
			t.Fatalf("get %d: view %q %v, sqlite %q %v", id, fromView, viewErr, fromFile, fileErr)
		}
		checked++
	}
	t.Logf("%d lists and gets answered the same from the view and from SQLite", checked)
}

// TestViewMatchesSQLite stores pets of every status with awkward names,
// through the writer (which extends the view) and at a restart (which
// loads it), and compares the view's answers with SQLite's.
func TestViewMatchesSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pets.db")
	s, err := openStore(path, storeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, patience, "the view to load", func() bool { return s.view.published.Load() != nil })
	names := []string{"Rex", "Ünïcödé 猫", `quote " and \ backslash`, "<b>&amp;</b>", "line\u2028sep", strings.Repeat("長", 100), " spaced "}
	rng := mathrand.New(mathrand.NewPCG(1, 2))
	const n = 600
	for i := range n {
		np := NewPet{Name: names[i%len(names)], CategoryID: rng.Int64N(1 << 62), Status: petStatuses[rng.IntN(3)]}
		if _, _, err := s.createPet(context.Background(), createRequest{pet: np}); err != nil {
			t.Fatal(err)
		}
	}
	checkViewMatchesSQLite(t, s, n)
	s.close()

	s, err = openStore(path, storeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	waitFor(t, patience, "the view to load at the restart", func() bool { return s.view.published.Load() != nil })
	checkViewMatchesSQLite(t, s, n)
}

// TestViewSeesExternalWrites edits the file from another connection, as
// an operator's sqlite3 shell would: inserts, an update and deletes
// (leaving ids no longer dense). The API comes to answer the new state,
// exactly; how long that took is logged (the service checks every
// 250 ms, which a loaded machine may stretch).
func TestViewSeesExternalWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pets.db")
	srv, s := newTestServerAt(t, path)
	for i := range 10 {
		createPets(t, srv, fmt.Sprintf(`{"name":"Pet %d","categoryId":%d}`, i+1, i+1))
	}
	other, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, q := range []string{
		"DELETE FROM pets WHERE id IN (2, 3, 7)",
		"UPDATE pets SET name = 'Renamed', status = 'sold' WHERE id = 5",
		"INSERT INTO pets (id, name, category_id, status) VALUES (100, 'Hand-made', 9, 'pending')",
	} {
		if _, err := other.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	edited := time.Now()
	want := `[{"id":1,"name":"Pet 1","categoryId":1,"status":"available"},{"id":4,"name":"Pet 4","categoryId":4,"status":"available"},` +
		`{"id":5,"name":"Renamed","categoryId":5,"status":"sold"},{"id":6,"name":"Pet 6","categoryId":6,"status":"available"},` +
		`{"id":8,"name":"Pet 8","categoryId":8,"status":"available"},{"id":9,"name":"Pet 9","categoryId":9,"status":"available"},` +
		`{"id":10,"name":"Pet 10","categoryId":10,"status":"available"},{"id":100,"name":"Hand-made","categoryId":9,"status":"pending"}]`
	waitFor(t, patience, "the API to show the edit", func() bool {
		r := do(t, srv, call{method: "GET", path: "/v1/pets"})
		return strings.TrimSpace(string(r.body)) == want
	})
	t.Logf("an edit from another connection was served %s later", time.Since(edited).Round(time.Millisecond))
	checkReply(t, do(t, srv, call{method: "GET", path: "/v1/pets/3"}), 404, nil, errBody(404, codeNotFound, "no pet with id 3"))
	checkReply(t, do(t, srv, call{method: "GET", path: "/v1/pets?status=sold"}), 200, nil,
		`[{"id":5,"name":"Renamed","categoryId":5,"status":"sold"}]`)
	checkReply(t, do(t, srv, call{method: "GET", path: "/v1/pets?status=pending&after=5"}), 200, nil,
		`[{"id":100,"name":"Hand-made","categoryId":9,"status":"pending"}]`)
	// New pets go above every id, also the hand-made one.
	checkReply(t, do(t, srv, call{method: "POST", path: "/v1/pets", body: `{"name":"After","categoryId":1}`}), 201, nil,
		`{"id":101,"name":"After","categoryId":1,"status":"available"}`)
	checkReply(t, do(t, srv, call{method: "GET", path: "/v1/pets?after=99"}), 200, nil,
		`[{"id":100,"name":"Hand-made","categoryId":9,"status":"pending"},{"id":101,"name":"After","categoryId":1,"status":"available"}]`)
	checkViewMatchesSQLite(t, s, 102)
}
