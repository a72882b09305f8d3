package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// schemaOf lists what a database file holds: its objects, application id
// and schema version.
func schemaOf(t *testing.T, path string) string {
	t.Helper()
	var objects string
	must(t, sqlite(t, path).QueryRow(`SELECT group_concat(o, ', ') FROM (SELECT type || ' ' || name AS o FROM sqlite_schema WHERE name NOT LIKE 'sqlite_autoindex%'
		UNION ALL SELECT 'application_id ' || application_id FROM pragma_application_id
		UNION ALL SELECT 'user_version ' || user_version FROM pragma_user_version ORDER BY 1)`).Scan(&objects))
	return objects
}

// TestDeployedSchemas: a file of each schema petstore has deployed is
// migrated at start, keeps its pets, and ends as a new file is: one
// table, no trigger, nothing beside it but the -wal and -shm.
func TestDeployedSchemas(t *testing.T) {
	want := "application_id 1346720851, index pets_idempotency_key, index pets_status_id, table pets, table sqlite_sequence, user_version 9"
	pets := `[{"id":1,"name":"Rex","categoryId":1,"status":"available"},{"id":2,"name":"Tom","categoryId":2,"status":"pending"},{"id":3,"name":"Max","categoryId":3,"status":"sold"}]`
	for v := 0; v <= 8; v++ {
		t.Run(fmt.Sprintf("version %d", v), func(t *testing.T) {
			// A file as 2ef6b6d's migrations 1 to v made it, with three pets
			// and, from version 6, a create's Idempotency-Key of the test key.
			db, script := filepath.Join(t.TempDir(), "pets.db"), ""
			for i := 1; i <= v; i++ {
				step, err := os.ReadFile(fmt.Sprintf("testdata/schemas/%d.sql", i))
				must(t, err)
				script += string(step)
			}
			if v > 0 {
				script += "INSERT INTO pets (name, category_id, status) VALUES ('Rex', 1, 'available'), ('Tom', 2, 'pending'), ('Max', 3, 'sold');"
			}
			if v >= 6 {
				key := sha256.Sum256([]byte(testKey)) // the scope as 2ef6b6d derived it
				scope := sha256.Sum256(append([]byte("petstore idempotency scope\x00"), key[:]...))
				script += fmt.Sprintf(`INSERT INTO pets (name, category_id, status, idempotency_key, idempotency_scope, request_fingerprint)
					VALUES ('Luna', 1, 'available', 'order-1', x'%x', x'%x');`, scope[:16], sha256.Sum256([]byte("Luna\x001\x00available")))
			}
			execSQL(t, db, script+fmt.Sprintf("PRAGMA user_version = %d;", v))
			if _, err := runCommand("backup", "-db", db, db+".backup"); err != nil && v > 0 {
				t.Errorf("a backup of it: %v", err)
			}
			svc := startService(t, nil, "-db", db)
			if v > 0 {
				svc.check(t, call{method: "GET", path: "/v1/pets?limit=3"}, reply{200, nil, pets})
			}
			createPets(t, svc, `{"name":"Kit","categoryId":4}`)
			if v >= 6 { // a retry of 2ef6b6d's create, after the upgrade, replays it
				svc.check(t, call{method: "POST", path: "/v1/pets", body: `{"name":"Luna","categoryId":1}`, header: map[string]string{"Idempotency-Key": "order-1"}},
					reply{201, map[string]string{"Idempotent-Replayed": "true", "Location": "pets/4"}, `{"id":4,"name":"Luna","categoryId":1,"status":"available"}`})
			}
			must(t, svc.stop())
			if diff := cmp.Diff(want, schemaOf(t, db)); diff != "" {
				t.Errorf("schema (-want +got):\n%s", diff)
			}
			entries, _ := os.ReadDir(filepath.Dir(db))
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			if diff := cmp.Diff([]string{"pets.db", "pets.db-shm", "pets.db-wal", "pets.db.backup"}[:3+min(v, 1)], names); diff != "" {
				t.Errorf("beside the database (-want +got):\n%s", diff)
			}
		})
	}
}

// TestForeignFiles: a file that is not petstore's, or of a newer schema,
// is refused at start with one line naming why, and left as it was.
func TestForeignFiles(t *testing.T) {
	for _, tt := range []struct{ name, sql, want string }{
		{"another application's", "PRAGMA application_id = 42; CREATE TABLE notes (body TEXT);",
			"not a petstore database: it belongs to another application (SQLite application_id 0x2a); use another -db file (or, for petstore's own file damaged, petstore restore -last-id)"},
		{"unmarked, with tables of its own", "CREATE TABLE notes (body TEXT); CREATE TABLE pets (id INTEGER);",
			"not a petstore database: it holds tables petstore did not make (notes, pets); use another -db file (or, for petstore's own file damaged, petstore restore -last-id)"},
		{"a newer petstore's", "PRAGMA application_id = 1346720851; PRAGMA user_version = 10; CREATE TABLE pets (id INTEGER);",
			"schema version 10 is newer than this build understands (9); use a newer petstore"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			db := filepath.Join(t.TempDir(), "other.db")
			execSQL(t, db, tt.sql)
			before, _ := os.ReadFile(db)
			err := run(context.Background(), []string{"petstore", "-addr", "127.0.0.1:0", "-db", db}, func(k string) string { return testEnv(nil)[k] }, nil, &logLines{})
			if want := "open database " + db + ": " + tt.want; err == nil || err.Error() != want {
				t.Errorf("run = %v, want %s", err, want)
			}
			after, _ := os.ReadFile(db)
			entries, _ := os.ReadDir(filepath.Dir(db))
			if string(before) != string(after) || len(entries) != 1 {
				t.Errorf("the file was changed, or files made beside it: %d entries", len(entries))
			}
		})
	}
}

// TestOutsideTheService: an operator's sqlite3 beside the service. What
// it writes is seen at the next read, and a rule it adds that refuses
// writes fails the health check.
func TestOutsideTheService(t *testing.T) {
	svc := startService(t, nil)
	execSQL(t, svc.db, `INSERT INTO pets (name, category_id, status) VALUES ('Outside', 1, 'sold')`)
	svc.check(t, call{method: "GET", path: "/v1/pets/1"}, reply{200, nil, `{"id":1,"name":"Outside","categoryId":1,"status":"sold"}`})
	// A trigger that refuses writes, loudly or without a word, fails the
	// health check's probe, which takes nothing back but its own row. A
	// check's answer stands a second.
	for _, refusal := range []string{"RAISE(ABORT, 'catalogue frozen')", "RAISE(IGNORE)"} {
		execSQL(t, svc.db, `CREATE TRIGGER frozen BEFORE INSERT ON pets BEGIN SELECT `+refusal+`; END`)
		waitFor(t, "/healthz to fail", func() bool { got, _ := svc.send(t, health); return got.status != 200 })
		svc.check(t, health, reply{503, map[string]string{"Retry-After": "1"}, errorBody(503, "unavailable", string(faultRefused))})
		execSQL(t, svc.db, `DROP TRIGGER frozen`)
		waitFor(t, "/healthz to recover", func() bool { got, _ := svc.send(t, health); return got.status == 200 })
	}
	svc.check(t, call{method: "GET", path: "/v1/pets"}, reply{200, nil, `[{"id":1,"name":"Outside","categoryId":1,"status":"sold"}]`})
}

// TestHeldBehindALock: creates behind an outside write lock, on the
// service's handler with a second to begin a create. The one the writer
// holds waits the lock's 5 s out and fails locked; one queued meanwhile is
// answered 503 timed out; one whose client closes its sending half gets no
// answer, not an empty 200, and an access line of status 0. None is
// stored.
func TestHeldBehindALock(t *testing.T) {
	db, lines := filepath.Join(t.TempDir(), "pets.db"), &logLines{}
	log := newLogger(lines, "text", 0)
	st, err := openStore(db)
	must(t, err)
	defer st.close()
	keys := &keyRing{list: testKey}
	err = keys.reload()
	must(t, err)
	ts := httptest.NewServer(newHandler(&server{store: st, keys: keys, log: log, createWithin: time.Second}, nil))
	defer ts.Close()
	lock, err := sqlite(t, db).Conn(context.Background())
	must(t, err)
	defer lock.Close()
	_, err = lock.ExecContext(context.Background(), "BEGIN IMMEDIATE")
	must(t, err)
	held := &createRequest{ctx: context.Background(), pet: NewPet{Name: "Held", CategoryID: 1, Status: "available"}, done: make(chan struct{})}
	st.creates <- held // taken (the channel is unbuffered)
	waitFor(t, "the writer to wait for the lock", func() bool { return st.writer.Stats().InUse == 1 })
	request := "POST /v1/pets HTTP/1.1\r\nHost: petstore\r\nAuthorization: Bearer " + testKey + "\r\nContent-Length: 30\r\n\r\n{\"name\":\"Left\",\"categoryId\":1}"
	if answer := rawRequest(t, ts.Listener.Addr().String(), request, true); answer != "" {
		t.Errorf("a client that closed its sending half got %q, want no answer", answer)
	}
	if !strings.Contains(lines.String(), `method=POST path=/v1/pets status=0`) {
		t.Errorf("no access line of status 0 for the create not answered:\n%s", lines)
	}
	(&service{url: ts.URL}).check(t, call{method: "POST", path: "/v1/pets", body: `{"name":"Queued","categoryId":1}`}, reply{503, map[string]string{"Retry-After": "1"}, errorBody(503, "unavailable", string(faultTimedOut))})
	<-held.done
	if f := asFault(held.err); f == nil || f.kind != faultLocked {
		t.Errorf("the create the writer held: %v, want %q", f, faultLocked)
	}
	lock.ExecContext(context.Background(), "ROLLBACK")
	var stored int
	if must(t, sqlite(t, db).QueryRow("SELECT count(*) FROM pets").Scan(&stored)); stored != 0 {
		t.Errorf("%d creates answered otherwise than 201 were stored", stored)
	}
}

// TestRefusedCreateSparesItsBatch: a create that a rule of the file
// refuses (here an operator's trigger), or drops unsaid, fails alone; the
// creates committed in the same batch are stored and answered as if it
// were not there. So does one whose deadline passed before its insert.
func TestRefusedCreateSparesItsBatch(t *testing.T) {
	db := filepath.Join(t.TempDir(), "pets.db")
	st, err := openStore(db)
	must(t, err)
	defer st.close()
	execSQL(t, db, `CREATE TRIGGER no_cats BEFORE INSERT ON pets WHEN NEW.name = 'Cat' BEGIN SELECT RAISE(ABORT, 'no cats here'); END;
		CREATE TRIGGER no_ghosts BEFORE INSERT ON pets WHEN NEW.name = 'Ghost' BEGIN SELECT RAISE(IGNORE); END`)
	late, cancel := context.WithDeadline(context.Background(), time.Now()) // its deadline passed before its insert
	defer cancel()
	var batch []*createRequest
	for _, name := range []string{"Dog", "Cat", "Dog", "Ghost", "Late", "Dog"} {
		batch = append(batch, &createRequest{ctx: context.Background(), pet: NewPet{Name: name, CategoryID: 1, Status: "available"}, done: make(chan struct{})})
	}
	batch[4].ctx = late
	st.commit(batch)
	var got []string
	for _, c := range batch {
		<-c.done
		got = append(got, fmt.Sprintf("%d %s %v", c.stored.ID, c.stored.Name, c.err))
	}
	want := []string{"1 Dog <nil>", "0  the database refused this pet: no cats here", "2 Dog <nil>", "0  the database refused this pet: a rule of the file dropped it without a word", "0  " + string(faultTimedOut) + ": context deadline exceeded", "3 Dog <nil>"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("results (-want +got):\n%s", diff)
	}
	var dogs int
	must(t, sqlite(t, db).QueryRow("SELECT count(*) FROM pets WHERE name = 'Dog'").Scan(&dogs))
	if dogs != 3 {
		t.Errorf("%d dogs stored, want 3", dogs)
	}
}
