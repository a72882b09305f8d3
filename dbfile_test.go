package main

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestOneServicePerFile: a second service on the same file refuses to
// start with one line naming the file, in the same process or another;
// petstore backup still works beside the running service.
func TestOneServicePerFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pets.db")
	_, first := newTestServerAt(t, path)
	want := "database " + path + " is in use by another petstore process; run one service per database file"
	if _, err := openStore(path, storeOptions{}); err == nil || err.Error() != want {
		t.Errorf("second store in the same process: %v, want %q", err, want)
	}
	first.close()

	bin := petstoreBinary(t)
	db := filepath.Join(t.TempDir(), "pets.db")
	base, _ := startBinary(t, nil, []string{"-db", db}, nil)
	if r := send(t, "POST", base+"/v1/pets", testKey, newPetBody); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	second := exec.Command(bin, "-addr", "127.0.0.1:0", "-db", db)
	second.Env = binaryEnv("PETSTORE_API_KEYS=" + testKey)
	out, err := second.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("second service: %v, want exit status 1; output %q", err, out)
	}
	if want := "petstore: database " + db + " is in use by another petstore process; run one service per database file\n"; string(out) != want {
		t.Errorf("second service said %q, want %q", out, want)
	}
	backup := filepath.Join(t.TempDir(), "b.db")
	if out, err := exec.Command(bin, "backup", "-db", db, backup).CombinedOutput(); err != nil {
		t.Fatalf("backup beside the service: %v: %s", err, out)
	}
	// The service still holds its lock and serves after the backup.
	if r := send(t, "POST", base+"/v1/pets", testKey, newPetBody); r.status != 201 {
		t.Errorf("create after the backup: %d %s", r.status, r.body)
	}
	again := exec.Command(bin, "-addr", "127.0.0.1:0", "-db", db)
	again.Env = second.Env
	if out, err := again.CombinedOutput(); err == nil || !strings.Contains(string(out), "is in use by another petstore process") {
		t.Errorf("a second service after a backup: %v %q", err, out)
	}
}

// TestFileReplacedUnderTheService deletes, or replaces, the database file
// while clients create pets. No create sent after that is acknowledged, so
// none is lost at the restart; /healthz says so and one error line tells
// the operator what to do. A replacing file is not corrupted by the old
// WAL.
func TestFileReplacedUnderTheService(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replace func(t *testing.T, path string) (want []Pet)
	}{
		{"rm", func(t *testing.T, path string) []Pet {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			return nil
		}},
		{"mv another petstore file over it", func(t *testing.T, path string) []Pet {
			other := filepath.Join(t.TempDir(), "other.db")
			osrv, ostore := newTestServerAt(t, other)
			createPets(t, osrv, `{"name":"Other","categoryId":7}`, `{"name":"Other2","categoryId":7}`)
			want, err := storedPets(ostore)
			if err != nil {
				t.Fatal(err)
			}
			ostore.close()
			if err := os.Rename(other, path); err != nil {
				t.Fatal(err)
			}
			return want
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "pets.db")
			srv, store, logs := newLoggedServer(t, path, storeOptions{})

			var (
				mu           sync.Mutex
				replacedAt   time.Time // zero until the file is replaced
				ackedBefore  int       // 201s to creates sent before it
				ackedAfter   []int64   // 201s to creates sent after it
				refusedAfter int
				stop         = make(chan struct{})
				wg           sync.WaitGroup
			)
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						mu.Lock()
						after := !replacedAt.IsZero()
						mu.Unlock()
						r, err := tryDo(t, srv, call{method: "POST", path: "/v1/pets", body: newPetBody})
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						if !after {
							if r.status == 201 {
								ackedBefore++
							}
							mu.Unlock()
							continue
						}
						if r.status == 201 {
							p, err := parsePet(r.body)
							if err != nil {
								t.Error(err)
							}
							ackedAfter = append(ackedAfter, p.ID)
						} else {
							refusedAfter++
							checkReply(t, r, 503, map[string]string{"Retry-After": "60"}, replacedBody)
						}
						mu.Unlock()
					}
				}()
			}
			// Stopped also if the test fails first, before the server is.
			var stopOnce sync.Once
			stopCreates := func() { stopOnce.Do(func() { close(stop); wg.Wait() }) }
			t.Cleanup(stopCreates)
			// Creates are flowing when the file is replaced, and go on until
			// a good number sent after it have been answered.
			answeredAfter := func() int {
				mu.Lock()
				defer mu.Unlock()
				return len(ackedAfter) + refusedAfter
			}
			waitFor(t, patience, "creates to be acknowledged", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return ackedBefore >= 20
			})
			mu.Lock()
			want := tc.replace(t, path)
			replacedAt = time.Now()
			mu.Unlock()
			waitFor(t, patience, "20 creates sent after the replacement to be answered", func() bool { return answeredAfter() >= 20 })
			stopCreates()

			checkReply(t, do(t, srv, call{method: "GET", path: "/healthz"}), 503, map[string]string{"Retry-After": "60"}, replacedBody)
			if n := countLines(logs, `level=ERROR msg="the database file was deleted or replaced under the running service: [^"]*restart the service[^"]*"`); n != 1 {
				t.Errorf("want one error line, got %d:\n%s", n, logs)
			}
			srv.Close()
			store.close()

			// The restart.
			restarted, err := openStore(path, storeOptions{})
			if err != nil {
				t.Fatalf("restart: %v", err)
			}
			defer restarted.close()
			got, err := storedPets(restarted)
			if err != nil {
				t.Fatal(err)
			}
			lost := 0
			for _, id := range ackedAfter {
				if _, err := storedPet(restarted, id); err != nil {
					lost++
				}
			}
			t.Logf("%s: %d creates sent after the file was replaced: %d refused with 503, %d acknowledged, %d of those lost at the restart",
				tc.name, refusedAfter+len(ackedAfter), refusedAfter, len(ackedAfter), lost)
			if len(ackedAfter) != 0 || refusedAfter == 0 {
				t.Errorf("creates sent after the replacement: %d acknowledged (want 0), %d refused", len(ackedAfter), refusedAfter)
			}
			if !slices.Equal(got, want) {
				t.Errorf("the file now at the path holds %v, want %v", got, want)
			}
			var check string
			if err := restarted.readers.QueryRow("PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
				t.Errorf("integrity_check of the file at the path: %q %v", check, err)
			}
		})
	}
}

// TestSQLiteWritesAreNotTampering runs an operator's sqlite3 shell beside
// the binary while clients create: inserts through SQLite, and passive,
// full and truncating checkpoints, which write the database file from
// another process. None of it is taken for tampering: every create is
// 201, no error is logged, and /healthz stays 200.
func TestSQLiteWritesAreNotTampering(t *testing.T) {
	shell := needTool(t, "sqlite3", "apt-get install sqlite3")
	db := filepath.Join(t.TempDir(), "pets.db")
	logs := &syncBuffer{}
	base, _ := startBinary(t, nil, []string{"-db", db}, logs)
	var mu sync.Mutex
	answers := map[int]int{}
	stop := inLoops(t, 4, func() {
		r, err := trySend(t, "POST", base+"/v1/pets", testKey, newPetBody)
		if err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		answers[r.status]++
		mu.Unlock()
	})
	cmd := exec.Command(shell, db)
	in, err := cmd.StdinPipe()
	must(t, err)
	var shellOut syncBuffer
	cmd.Stdout, cmd.Stderr = &shellOut, &shellOut
	must(t, cmd.Start())
	fmt.Fprintln(in, ".timeout 2000")
	statements := []string{
		"PRAGMA wal_checkpoint(PASSIVE);",
		"INSERT INTO pets (name, category_id, status) VALUES ('From the shell', 2, 'sold');",
		"PRAGMA wal_checkpoint(FULL);",
		"PRAGMA wal_checkpoint(PASSIVE);",
		"PRAGMA wal_checkpoint(TRUNCATE);",
	}
	for i := range 400 {
		fmt.Fprintln(in, statements[i%len(statements)])
		time.Sleep(10 * time.Millisecond)
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Errorf("the sqlite3 shell: %v\n%s", err, shellOut.String())
	}
	stop()
	mu.Lock()
	defer mu.Unlock()
	if len(answers) != 1 || answers[201] == 0 {
		t.Errorf("creates beside the shell's writes and checkpoints were answered %v, want only 201s", answers)
	}
	if n := countLines(logs, "level=ERROR"); n != 0 {
		t.Errorf("%d error lines:\n%s", n, logs)
	}
	if r := send(t, "GET", base+"/healthz", "", ""); r.status != 200 {
		t.Errorf("/healthz after the shell: %d %s", r.status, r.body)
	}
	t.Logf("%d creates, all 201, beside 80 inserts and 320 checkpoints of a sqlite3 shell", answers[201])
}

// noOtherWriter is the data_version of a writer's connection that no
// other connection commits beside.
func noOtherWriter() (int64, bool) { return 1, true }

// TestOverwriteNextToACheckpoint overwrites the file with a copy from
// before a checkpoint in the moments the service cannot look at it: just
// after a checkpoint (the service's own run inside a commit, where CI once
// found the overwrite unseen), and during the next commit, which starts
// the -wal over. It is told by the pages the checkpoint copied, the pages
// it left, and the size. Checkpoints that a reader holds back (Litestream
// keeps one), that reach past the first 4,062 frames of the -shm's index,
// or that are followed by a restart of the -wal are not taken for one.
func TestOverwriteNextToACheckpoint(t *testing.T) {
	for _, tt := range []struct {
		name    string
		reader  bool // a reader holds an older snapshot during the checkpoint
		rows    int  // rows committed at once after the copy is taken, before the reader
		restart bool // the overwrite lands during the commit that restarts the -wal
		copy    bool
		want    string // in the error; "" for none
	}{
		{"a checkpoint", false, 50, false, false, ""},
		{"a checkpoint a reader holds back", true, 50, false, false, ""},
		{"a checkpoint of more than 4,062 frames", true, 4500, false, false, ""},
		{"a checkpoint, then the -wal starts over", false, 50, true, false, ""},
		{"overwritten after a checkpoint", false, 50, false, true, "is not the one a checkpoint copied from the -wal"},
		{"overwritten after a checkpoint a reader held back", true, 50, false, true, "overwritten in place"},
		{"overwritten after a checkpoint of more than 4,062 frames", true, 4500, false, true, "overwritten in place"},
		{"overwritten as the -wal starts over", false, 50, true, true, "overwritten in place"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newLookedAtFile(t)
			db, path, look, insert := f.db, f.path, f.look, f.insert
			older, err := os.ReadFile(path)
			must(t, err)
			for range 50 {
				insert(1)
			}
			insert(tt.rows)
			if tt.reader {
				// A read transaction on another connection pins the WAL as
				// it is; the checkpoint cannot copy what comes after it.
				conn, err := db.Conn(context.Background())
				must(t, err)
				defer conn.Close()
				_, err = conn.ExecContext(context.Background(), "BEGIN")
				must(t, err)
				var n int
				must(t, conn.QueryRowContext(context.Background(), "SELECT count(*) FROM t").Scan(&n))
				defer conn.ExecContext(context.Background(), "ROLLBACK")
				insert(50)
			}
			var busy, frames, copied int
			must(t, db.QueryRow("PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &frames, &copied))
			switch {
			case copied == 0:
				t.Fatal("the checkpoint copied nothing")
			case tt.reader && copied == frames:
				t.Fatalf("the reader held nothing back: %d of %d frames copied", copied, frames)
			case !tt.reader && copied != frames:
				t.Fatalf("%d of %d frames copied, want all", copied, frames)
			}
			var err2 error
			if tt.restart {
				// The look after the checkpoint's commit, then a commit that
				// starts the -wal over, with the copy landing during it.
				if err := look(); err != nil {
					t.Fatalf("after the checkpoint: %v", err)
				}
				before := checkpointRecord(t, path)
				if tt.copy {
					must(t, os.WriteFile(path, older, 0o600))
				}
				_, err := db.Exec("INSERT INTO t (v) VALUES (randomblob(3000))")
				must(t, err)
				if after := checkpointRecord(t, path); before == after {
					t.Fatal("the -wal did not start over")
				}
				err2 = look()
			} else {
				if tt.copy {
					must(t, os.WriteFile(path, older, 0o600))
				}
				err2 = look()
			}
			switch {
			case tt.want == "" && err2 != nil:
				t.Errorf("taken for an overwrite: %v", err2)
			case tt.want != "" && (err2 == nil || !strings.Contains(err2.Error(), tt.want)):
				t.Errorf("got %v, want an error with %q", err2, tt.want)
			}
			if tt.want == "" {
				// And the next look, with nothing written, finds nothing.
				if err := look(); err != nil {
					t.Errorf("second look: %v", err)
				}
			}
		})
	}
}

// lookedAtFile is a database in WAL mode that a test writes and
// checkpoints through its own connections (automatic checkpoints off),
// with a dbFile that looks at it as the service does.
type lookedAtFile struct {
	t    *testing.T
	path string
	db   *sql.DB
	d    *dbFile
}

// newLookedAtFile makes the table t, 50 commits and a checkpoint, then
// starts looking at the file.
func newLookedAtFile(t *testing.T) *lookedAtFile {
	t.Helper()
	f := &lookedAtFile{t: t, path: filepath.Join(t.TempDir(), "pets.db")}
	var err error
	f.db, err = sql.Open("sqlite3", f.path+"?_journal_mode=WAL&_synchronous=OFF")
	must(t, err)
	t.Cleanup(func() { f.db.Close() })
	f.db.SetMaxOpenConns(2)
	// Checkpoints only when the test asks: both connections of the pool
	// get automatic ones turned off.
	var conns []*sql.Conn
	for range 2 {
		conn, err := f.db.Conn(context.Background())
		must(t, err)
		_, err = conn.ExecContext(context.Background(), "PRAGMA wal_autocheckpoint = 0")
		must(t, err)
		conns = append(conns, conn)
	}
	for _, conn := range conns {
		conn.Close()
	}
	f.exec("CREATE TABLE t (id INTEGER PRIMARY KEY, v BLOB)")
	for range 50 {
		f.insert(1)
	}
	f.exec("PRAGMA wal_checkpoint(PASSIVE)")
	f.d, err = openDBFile(f.path)
	must(t, err)
	t.Cleanup(func() { f.d.close() })
	f.d.noteWAL()
	if err := f.look(); err != nil {
		t.Fatalf("first look: %v", err)
	}
	return f
}

// look is the service's look at the file, before and after each commit.
func (f *lookedAtFile) look() error {
	if f.d == nil {
		return nil
	}
	return f.d.checkOverwritten(noOtherWriter)
}

func (f *lookedAtFile) exec(query string) {
	f.t.Helper()
	_, err := f.db.Exec(query)
	must(f.t, err)
}

// insert commits rows in one transaction, then looks.
func (f *lookedAtFile) insert(rows int) {
	f.t.Helper()
	f.insertUnseen(rows)
	if err := f.look(); err != nil {
		f.t.Fatalf("after a commit: %v", err)
	}
}

// insertUnseen commits rows in one transaction, with no look after.
func (f *lookedAtFile) insertUnseen(rows int) {
	f.t.Helper()
	tx, err := f.db.Begin()
	must(f.t, err)
	for range rows {
		_, err := tx.Exec("INSERT INTO t (v) VALUES (randomblob(3000))")
		must(f.t, err)
	}
	must(f.t, tx.Commit())
}

// TestOverwriteAroundTheWALStartingOver: the service bounds a long
// reader's -wal with a passive checkpoint, a look, then a truncating
// checkpoint, so a copy that lands after the truncation is seen; and the
// -wal starting over twice between two looks (when looks were skipped)
// is not taken for an overwrite.
func TestOverwriteAroundTheWALStartingOver(t *testing.T) {
	for _, tt := range []struct {
		name  string
		copy  bool
		twice bool
		want  string
	}{
		{"a passive checkpoint, a look, a truncating one", false, false, ""},
		{"overwritten after the truncating checkpoint", true, false, "overwritten in place"},
		{"the -wal started over twice between two looks", false, true, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newLookedAtFile(t)
			older, err := os.ReadFile(f.path)
			must(t, err)
			for range 50 {
				f.insert(1)
			}
			if tt.twice {
				// A full checkpoint, then commits and checkpoints nobody
				// looked at: the -wal starts over, is copied, starts over.
				// The row changed in between is on a page the last look
				// remembers, which the last -wal does not hold.
				f.exec("PRAGMA wal_checkpoint(PASSIVE)")
				must(t, f.look())
				before := checkpointRecord(t, f.path)
				f.exec("UPDATE t SET v = randomblob(3000) WHERE id = 80")
				f.exec("PRAGMA wal_checkpoint(PASSIVE)")
				f.insertUnseen(1)
				after := checkpointRecord(t, f.path)
				if binary.BigEndian.Uint32(after[0:4]) != binary.BigEndian.Uint32(before[0:4])+2 {
					t.Fatalf("the -wal did not start over twice: %x then %x", before, after)
				}
			} else {
				f.exec("PRAGMA wal_checkpoint(PASSIVE)")
				must(t, f.look())
				f.exec("PRAGMA wal_checkpoint(TRUNCATE)")
				if tt.copy {
					must(t, os.WriteFile(f.path, older, 0o600))
				}
				f.insertUnseen(1) // the next commit writes a new -wal
			}
			err = f.look()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("taken for an overwrite: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}
