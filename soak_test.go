package main

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The soak tests meet storage faults at the scale where they bite: tens
// of thousands of pets, several runs. They take minutes each and need
// root, so they run only with PETSTORE_TEST_SOAK=1, never in CI:
//
//	PETSTORE_TEST_ALL=1 PETSTORE_TEST_SOAK=1 go test -run 'Soak' -v -timeout 2h .
//
// PETSTORE_TEST_SOAK_RUNS (default 5) sets the runs of each kind.

// litestreamLag is how far the Litestream replica may be behind the
// file at its default settings: it looks at the -wal every second
// (monitor interval) and ships what it found every second (sync
// interval), so a pet acknowledged up to about 2 s before the machine is
// lost may not be in the replica.
const litestreamLag = 2 * time.Second

// soakRuns skips a soak test unless PETSTORE_TEST_SOAK=1, and returns the
// number of runs.
func soakRuns(t *testing.T) int {
	if os.Getenv("PETSTORE_TEST_SOAK") != "1" {
		t.Skip("soak test: runs only with PETSTORE_TEST_SOAK=1 (minutes, root); skipped")
	}
	return benchEnvInt(t, "PETSTORE_TEST_SOAK_RUNS", 5)
}

// thinBacking is the real space under the thin volume: ext4's journal
// takes 16 MiB of it, and the -wal grows while Litestream holds its
// checkpoints back, so that about 60,000 pets fit.
const thinBacking = "40m"

// thinVolume makes the thin-provisioned volume of issue 37: ext4 on a
// loop device whose sparse 512 MiB image sits on a thinBacking tmpfs, so
// the volume runs out of real space after some 60,000 pets. It returns the
// mount point and a function that, after the fault, gives the backing
// store its space back, drops the page cache, checks the filesystem
// with e2fsck -fy and mounts it again.
func thinVolume(t *testing.T) (dir string, recover func()) {
	back := mountTmpfs(t, thinBacking)
	fsck := needTool(t, "e2fsck", "apt-get install e2fsprogs")
	img := filepath.Join(back, "disk.img")
	dir = mountExt4(t, img, 512<<20, "loop")
	return dir, func() {
		mustRun(t, "mount", "-o", "remount,size=1g", back)
		os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
		mustRun(t, "umount", dir)
		exec.Command(fsck, "-fy", img).Run() // exit 1: it repaired something
		mustMount(t, dir, exec.Command("mount", "-o", "loop", img, dir))
	}
}

// idsIn returns the ids of the pets the file at path holds, or the error
// that reading them met (a malformed file).
func idsIn(path string) (map[int64]bool, error) {
	db, err := sql.Open("sqlite3", readOnlyDSN(path))
	if err != nil {
		return nil, err
	}
	defer db.Close()
	rows, err := db.Query("SELECT id FROM pets")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	ids := map[int64]bool{}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids[id] = true
	}
	return ids, rows.Err()
}

// TestSoakThinVolume runs the binary with Litestream beside it on the
// thin volume; 8 clients create pets with 95-character names until a
// create is refused, at 50,000 acknowledged or more; the service is
// stopped (SIGKILL, then SIGTERM, PETSTORE_TEST_SOAK_RUNS each), the
// volume given its space back, checked and mounted again. Either every
// acknowledged pet is in the file and integrity_check says ok, or the
// loss is not silent (the store refuses to open the file, or its
// /healthz answer is not ok) and the Litestream replica holds every pet
// acknowledged more than litestreamLag before the first refusal. The
// counts are printed either way.
func TestSoakThinVolume(t *testing.T) {
	runs := soakRuns(t)
	ls := litestreamBinary(t)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		for run := 1; run <= runs; run++ {
			t.Run(fmt.Sprintf("%s %d", sig, run), func(t *testing.T) {
				dir, recoverVolume := thinVolume(t)
				db := filepath.Join(dir, "pets.db")
				replica := filepath.Join(t.TempDir(), "replica")
				base, cmd := startBinary(t, nil, []string{"-db", db}, nil)
				// Litestream keeps a copy of each sync beside the database
				// by default: on the thin volume that fills it at some
				// 3,300 pets. Its working files go elsewhere here.
				litestream := startLitestream(t, ls, db, replica, filepath.Join(t.TempDir(), "meta"))
				load := startCreates(t, base, 8, strings.Repeat("n", 88))
				waitFor(t, 10*time.Minute, "a create to be refused", func() bool { return load.refusals() > 0 })
				load.stop()
				faultAt, first := time.Now(), ""
				for _, c := range load.answers() {
					if c.done && c.status != 201 && c.at.Before(faultAt) {
						faultAt, first = c.at, fmt.Sprintf("%d %s", c.status, c.body)
					}
				}
				acked := load.acked()
				if len(acked) < 50000 {
					t.Fatalf("%d creates acknowledged before the first refusal (%s), want 50,000 or more: the volume ran out too early", len(acked), first)
				}
				must(t, cmd.Process.Signal(sig))
				cmd.Wait()
				litestream.Process.Signal(syscall.SIGTERM)
				litestream.Wait()
				recoverVolume()

				ids, readErr := idsIn(db)
				lost := 0
				for id := range acked {
					if !ids[id] {
						lost++
					}
				}
				var logs strings.Builder
				s, openErr := openStore(db, slog.New(slog.NewTextHandler(&logs, nil)))
				said := "refused to open it: " + fmt.Sprint(openErr)
				if openErr == nil {
					said = "/healthz: " + fmt.Sprint(s.health())
					healthy := s.health() == nil
					s.close()
					if healthy && (lost > 0 || readErr != nil) {
						t.Errorf("silent loss: %d acknowledged pets are not in the file (%v), and the service says it is healthy", lost, readErr)
					}
				}
				if lost == 0 && readErr == nil {
					checkIntegrity(t, db)
					t.Logf("%d acknowledged; all in the file after the restart, integrity ok", len(acked))
					return
				}
				r := &replicaRun{replica: replica}
				_, replicated, err := r.tryRestore(ls, t.TempDir())
				must(t, err)
				early, late := 0, 0
				for _, c := range load.answers() {
					if _, ok := replicated[c.pet.ID]; c.status != 201 || ok {
						continue
					}
					if c.at.Before(faultAt.Add(-litestreamLag)) {
						early++
					} else {
						late++
					}
				}
				if early > 0 {
					t.Errorf("the replica lacks %d pets acknowledged more than %s before the fault", early, litestreamLag)
				}
				t.Logf("%d acknowledged; the file lost %d (read: %v); the restart %q; the replica lacks %d acknowledged within %s of the fault, %d before",
					len(acked), lost, readErr, said, late, litestreamLag, early)
			})
		}
	}
}

// TestSoakThinVolumeControl is the control for TestSoakThinVolume: a
// plain go-sqlite3 program (this test binary, PETSTORE_TEST_HELPER=insert:
// WAL, synchronous FULL, SQLite's own checkpoints) meets the same fault
// on the same volume, stops writing at its first error and is killed.
// It prints what the file lost of what its commits acknowledged, and
// whether the kernel logged ext4's "potential data loss". It fails only
// if the fault was not met at scale: the loss is the finding.
func TestSoakThinVolumeControl(t *testing.T) {
	runs := soakRuns(t)
	for run := 1; run <= runs; run++ {
		t.Run(strconv.Itoa(run), func(t *testing.T) {
			dir, recoverVolume := thinVolume(t)
			db := filepath.Join(dir, "pets.db")
			exec.Command("dmesg", "-C").Run()
			cmd := exec.Command(os.Args[0], "-test.run", "^$")
			cmd.Env = append(os.Environ(), "PETSTORE_TEST_HELPER=insert", "PETSTORE_TEST_HELPER_DB="+db)
			out, err := cmd.StdoutPipe()
			must(t, err)
			must(t, cmd.Start())
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			acked := map[int64]bool{}
			var fault string
			lines := bufio.NewScanner(out)
			for fault == "" && lines.Scan() {
				if id, err := strconv.ParseInt(lines.Text(), 10, 64); err == nil {
					acked[id] = true
				} else {
					fault = lines.Text()
				}
			}
			cmd.Process.Kill()
			cmd.Wait()
			if len(acked) < 50000 || fault == "" {
				t.Fatalf("the control acknowledged %d pets, want 50,000 or more before its first error (%q)", len(acked), fault)
			}
			recoverVolume()
			dmesg, _ := exec.Command("dmesg").CombinedOutput()
			ids, readErr := idsIn(db)
			lost := 0
			for id := range acked {
				if !ids[id] {
					lost++
				}
			}
			integrity := "not run: the file cannot be read"
			if readErr == nil {
				if r, err := sql.Open("sqlite3", readOnlyDSN(db)); err == nil {
					r.QueryRow("PRAGMA integrity_check(1)").Scan(&integrity)
					r.Close()
				}
			}
			t.Logf("control: %d acknowledged, first error %q; the file lost %d (read: %v), integrity_check %q; kernel: potential data loss logged: %v",
				len(acked), fault, lost, readErr, integrity, strings.Contains(string(dmesg), "potential data loss"))
		})
	}
}

// TestSoakOutsideCheckpointers runs, 30 rounds for each, two outside
// checkpointers (PRAGMA wal_checkpoint(PASSIVE) back to back) beside
// the binary under 8 creating clients, 10,000 creates a round: the
// sqlite3 shell on PATH (Debian 12's is 3.40.1, inside SQLite's
// WAL-reset bug) and go-sqlite3's SQLite (3.54.1, outside it). A round that loses acknowledged pets must be
// reported by the running service (its ERROR line, /healthz) before the
// kill, and again at the restart; with go-sqlite3's, no round may lose
// one.
func TestSoakOutsideCheckpointers(t *testing.T) {
	soakRuns(t)
	shell := needTool(t, "sqlite3", "apt-get install sqlite3")
	version, _ := exec.Command(shell, "--version").Output()
	for _, checkpointer := range []struct {
		name string
		argv func(db string) *exec.Cmd
	}{
		{"sqlite3 " + strings.Fields(string(version) + " ?")[0], func(db string) *exec.Cmd {
			c := exec.Command("sh", "-c", `while :; do echo 'PRAGMA wal_checkpoint(PASSIVE);'; done | "$0" "$1" >/dev/null 2>&1`, shell, db)
			return c
		}},
		{"go-sqlite3 " + goSQLiteVersion(t), func(db string) *exec.Cmd {
			c := exec.Command(os.Args[0], "-test.run", "^$")
			c.Env = append(os.Environ(), "PETSTORE_TEST_HELPER=checkpoint", "PETSTORE_TEST_HELPER_DB="+db)
			return c
		}},
	} {
		lostRounds, lostPets := 0, 0
		for round := 1; round <= 30; round++ {
			dir := t.TempDir()
			db := filepath.Join(dir, "pets.db")
			logs := &syncBuffer{}
			base, cmd := startBinary(t, nil, []string{"-db", db}, logs)
			load := startCreates(t, base, 8, "Client pet")
			var checkpointers []*exec.Cmd
			for range 2 {
				c := checkpointer.argv(db)
				c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				must(t, c.Start())
				checkpointers = append(checkpointers, c)
			}
			waitFor(t, patience, "10,000 creates", func() bool { return load.statuses()[201] >= 10000 })
			for _, c := range checkpointers {
				syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
				c.Wait()
			}
			load.stop()
			acked := load.acked()
			ids, err := idsIn(db)
			must(t, err)
			lost := 0
			for id := range acked {
				if !ids[id] {
					lost++
				}
			}
			if lost > 0 {
				lostRounds++
				lostPets += lost
				// The count check runs every countCheckEvery.
				waitForLog(t, logs, `level=ERROR msg="acknowledged pets are missing from the database file`, 1)
				if r := send(t, base, call{method: "GET", path: "/healthz"}); r.status != 503 {
					t.Errorf("%s round %d: %d acknowledged pets lost, and /healthz answers %d", checkpointer.name, round, lost, r.status)
				}
			}
			must(t, cmd.Process.Signal(syscall.SIGKILL))
			cmd.Wait()
			if lost > 0 {
				again := &syncBuffer{}
				base, cmd = startBinary(t, nil, []string{"-db", db}, again)
				if r := send(t, base, call{method: "GET", path: "/healthz"}); r.status != 503 || !strings.Contains(again.String(), "acknowledged pets are missing") {
					t.Errorf("%s round %d: after the restart /healthz answers %d and the log says:\n%s", checkpointer.name, round, r.status, again)
				}
				cmd.Process.Kill()
				cmd.Wait()
			}
		}
		t.Logf("%s: %d of 30 rounds lost acknowledged pets (%d in all); each was reported before the kill and at the restart", checkpointer.name, lostRounds, lostPets)
		if strings.HasPrefix(checkpointer.name, "go-sqlite3") && lostRounds > 0 {
			t.Errorf("with SQLite %s, outside the WAL-reset bug, %d rounds lost pets", checkpointer.name, lostRounds)
		}
	}
}

// goSQLiteVersion is the version of the SQLite compiled into the tests.
func goSQLiteVersion(t *testing.T) string {
	db, err := sql.Open("sqlite3", ":memory:")
	must(t, err)
	defer db.Close()
	var v string
	must(t, db.QueryRow("SELECT sqlite_version()").Scan(&v))
	return v
}

// runHelper runs the soak tests' outside programs, in this test binary
// started again with PETSTORE_TEST_HELPER set, on PETSTORE_TEST_HELPER_DB:
//   - insert: the control, a plain go-sqlite3 program with the service's
//     pragmas, 8 goroutines inserting pets of 95-character names, each
//     id printed once its commit returned; at the first error it prints
//     the error and writes nothing more.
//   - checkpoint: PRAGMA wal_checkpoint(PASSIVE), back to back.
func runHelper(kind string) {
	db, err := sql.Open("sqlite3", "file:"+os.Getenv("PETSTORE_TEST_HELPER_DB")+"?_journal_mode=WAL&_synchronous=FULL&_busy_timeout=5000")
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	ctx := context.Background()
	switch kind {
	case "checkpoint":
		for {
			db.ExecContext(ctx, "PRAGMA wal_checkpoint(PASSIVE)")
		}
	case "insert":
		db.SetMaxOpenConns(1)
		if _, err := db.Exec("CREATE TABLE IF NOT EXISTS pets (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, category_id INTEGER NOT NULL, status TEXT NOT NULL) STRICT"); err != nil {
			fmt.Println("error:", err)
			select {}
		}
		printed := make(chan string, 1024)
		var stopped atomic.Bool
		for range 8 {
			go func() {
				for !stopped.Load() {
					res, err := db.Exec("INSERT INTO pets (name, category_id, status) VALUES (?, 1, 'available')", strings.Repeat("n", 95))
					if err != nil {
						stopped.Store(true)
						printed <- "error: " + err.Error()
						return
					}
					id, _ := res.LastInsertId()
					printed <- strconv.FormatInt(id, 10)
				}
			}()
		}
		for line := range printed {
			fmt.Println(line)
			if strings.HasPrefix(line, "error") {
				select {}
			}
		}
	}
}
