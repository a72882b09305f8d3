package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestBackupSnapshots: backup -dir writes a timestamped snapshot and keeps
// the newest N. It never deletes the snapshot just written, nor a file it
// did not write.
func TestBackupSnapshots(t *testing.T) {
	db := filepath.Join(t.TempDir(), "pets.db")
	preloadPets(t, db, 10)
	dir := filepath.Join(t.TempDir(), "snapshots")
	must(t, os.MkdirAll(dir, 0o700))
	// Older snapshots, and files that are not snapshots.
	others := []string{"notes.txt", "petstore-old.db", "petstore-20200101T000000Z.db.partial", "mine.db"}
	old := []string{"petstore-20200101T000000Z.db", "petstore-20200102T000000Z.db", "petstore-20200103T000000Z.db"}
	for _, name := range append(slices.Clone(others), old...) {
		os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600)
	}
	env := func(string) string { return "" }
	var out bytes.Buffer
	must(t, run(context.Background(), []string{"petstore", "backup", "-db", db, "-dir", dir, "-keep", "2"}, env, &out, io.Discard))
	written := regexp.MustCompile(`to (\S+): 10 pets, integrity ok`).FindStringSubmatch(out.String())
	if written == nil {
		t.Fatalf("backup said %q", out.String())
	}
	if n, err := checkBackup(context.Background(), written[1]); err != nil || n != 10 {
		t.Errorf("the snapshot %s: %d pets, %v", written[1], n, err)
	}
	want := append(slices.Clone(others), "petstore-20200103T000000Z.db", filepath.Base(written[1]))
	var got []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("files after -keep 2 (-want +got):\n%s", diff)
	}
	if !strings.Contains(out.String(), "deleted the older snapshot "+filepath.Join(dir, "petstore-20200101T000000Z.db")+"\n") {
		t.Errorf("backup did not say what it deleted: %q", out.String())
	}
	// Its refusals are TestRunFailures'.
}

func TestBackupWhileWriting(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "pets.db")
	svc := startService(t, nil, "-db", dbPath)
	// Clients keep creating pets while the backup runs.
	load := startCreates(t, svc.url, 4, "Pet")
	waitFor(t, patience, "the clients to store 20 pets", func() bool { return load.statuses()[201] >= 20 })
	before := load.statuses()[201]

	backup := filepath.Join(t.TempDir(), "backup.db")
	var out bytes.Buffer
	err := run(context.Background(), []string{"petstore", "backup", "-db", dbPath, backup}, func(string) string { return "" }, &out, io.Discard)
	// Once the clients have stopped, every committed row has been
	// answered: a row the snapshot holds is among those answered 201.
	load.stop()
	acked := load.acked()
	after := len(acked)
	if answers := load.statuses(); len(answers) != 1 {
		t.Errorf("creates beside the backup were answered %v, want only 201", answers)
	}
	if err != nil {
		t.Fatalf("backup: %v", err)
	}
	if fi, err := os.Stat(backup); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("backup file: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}

	// The copy is a consistent snapshot: at least what was acknowledged
	// before it began, every row identical to the live one.
	copyStore, err := openStore(backup, discardLog)
	must(t, err)
	defer copyStore.close()
	got, err := storedPets(copyStore)
	must(t, err)
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
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/healthz"}), 200, nil, `{"status":"ok"}`)

	// A backup never overwrites.
	err = run(context.Background(), []string{"petstore", "backup", "-db", dbPath, backup}, func(string) string { return "" }, io.Discard, io.Discard)
	if want := "backup: backup file " + backup + " already exists; a backup never overwrites a file"; err == nil || err.Error() != want {
		t.Errorf("second backup: %v, want %q", err, want)
	}
}

// TestBackupInterrupted kills petstore backup at moments through its
// work: whatever is at the backup's name afterwards is a complete backup,
// never a partial file that a restore would accept.
func TestBackupInterrupted(t *testing.T) {
	bin := petstoreBinary(t)
	db := filepath.Join(t.TempDir(), "pets.db")
	const pets = 200000
	preloadPets(t, db, pets)
	complete, absent := 0, 0
	for i, delay := range []time.Duration{5, 20, 50, 100, 150, 250, 400, 800} {
		dir := t.TempDir()
		dst := filepath.Join(dir, "backup.db")
		cmd := exec.Command(bin, "backup", "-db", db, dst)
		must(t, cmd.Start())
		time.Sleep(delay * time.Millisecond)
		cmd.Process.Kill()
		cmd.Wait()
		if _, err := os.Stat(dst); errors.Is(err, os.ErrNotExist) {
			absent++
		} else {
			n, err := checkBackup(context.Background(), dst)
			if err != nil || n != pets {
				t.Errorf("kill %d after %s: %s holds %d pets (%v), want a complete backup or nothing", i, delay*time.Millisecond, dst, n, err)
			}
			complete++
		}
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.Name() != "backup.db" && !strings.HasPrefix(e.Name(), ".backup.db.partial-") {
				t.Errorf("kill %d: unexpected file %s beside the backup", i, e.Name())
			}
		}
	}
	t.Logf("backup killed 8 times: %d left nothing at the name, %d a complete backup", absent, complete)
	if absent == 0 {
		t.Error("no kill interrupted a backup; the test proves nothing")
	}
}

// TestRestore puts a backup back with petstore restore: refused while a
// service holds the file and for a file that is not a sound petstore
// backup, each leaving the database as it was; then done, with the old
// -wal and -shm gone, and the service starts on exactly the backup's pets
// and issues ids above them.
func TestRestore(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "pets.db")
	backup := filepath.Join(dir, "backup.db")
	ctx := context.Background()
	svc := startService(t, nil, "-db", db)
	createPets(t, svc.url, `{"name":"Kept","categoryId":1}`, `{"name":"Kept too","categoryId":2}`)
	_, err := backupDatabase(ctx, db, backup)
	must(t, err)
	createPets(t, svc.url, `{"name":"Lost","categoryId":3}`)
	restore := func(to, from string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, []string{"petstore", "restore", "-db", to, "-from", from}, func(string) string { return "" }, &out, io.Discard)
		return out.String(), err
	}
	before, err := os.ReadFile(db)
	must(t, err)
	unchanged := func(when string) {
		t.Helper()
		if now, err := os.ReadFile(db); err != nil || !bytes.Equal(now, before) {
			t.Errorf("%s: the database file changed", when)
		}
	}

	_, err = restore(db, backup)
	want := fmt.Sprintf("restore: database %s is in use by another petstore process; run one service per database file; stop it before restoring", db)
	if err == nil || err.Error() != want {
		t.Errorf("restore under a running service: %v, want %s", err, want)
	}
	unchanged("refused under a running service")
	svc.stop()
	before, _ = os.ReadFile(db)

	foreign := filepath.Join(dir, "foreign.db")
	sqlExec(t, foreign, "CREATE TABLE notes (text TEXT)")
	damaged := filepath.Join(dir, "damaged.db")
	data, _ := os.ReadFile(backup)
	for i := 4096; i < len(data); i++ {
		data[i] ^= 0x5a
	}
	os.WriteFile(damaged, data, 0o600)
	for _, tt := range []struct{ from, want string }{
		{foreign, "restore: check backup: not a petstore database (SQLite application_id 0x0)"},
		{damaged, "restore: check backup: "},
		{filepath.Join(dir, "missing.db"), "restore: check backup: "},
	} {
		if _, err := restore(db, tt.from); err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("restore -from %s: %v, want %q...", filepath.Base(tt.from), err, tt.want)
		}
		unchanged("refused " + filepath.Base(tt.from))
	}

	// A backup whose last pets are still in its -wal, as a killed
	// service leaves it, is restored whole.
	live := filepath.Join(dir, "live.db")
	liveSvc := startService(t, nil, "-db", live)
	createPets(t, liveSvc.url, `{"name":"In the WAL","categoryId":1}`, `{"name":"In the WAL too","categoryId":1}`, `{"name":"And this","categoryId":1}`)
	if fi, err := os.Stat(live + "-wal"); err != nil || fi.Size() == 0 {
		t.Fatalf("the live file's -wal holds nothing: %v", err)
	}
	walDB := filepath.Join(dir, "from-wal.db")
	said, err := restore(walDB, live)
	must(t, err)
	if n, err := checkBackup(ctx, walDB); err != nil || n != 3 || !strings.Contains(said, ": 3 pets, integrity ok") {
		t.Errorf("restored from a file with a -wal: %d pets (%v), said %q; want all 3", n, err, said)
	}
	liveSvc.stop()

	said, err = restore(db, backup)
	must(t, err)
	if want := fmt.Sprintf("restored %s to %s: 2 pets, integrity ok\n", backup, db); said != want {
		t.Errorf("restore said %q, want %q", said, want)
	}
	for _, companion := range []string{db + "-wal", db + "-shm"} {
		if _, err := os.Stat(companion); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after the restore: %v", companion, err)
		}
	}
	svc = startService(t, nil, "-db", db)
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets"}), 200, nil,
		`[{"id":1,"name":"Kept","categoryId":1,"status":"available"},{"id":2,"name":"Kept too","categoryId":2,"status":"available"}]`)
	// Id 3 was acknowledged for "Lost" in the file the backup replaced:
	// none of 50 new creates gets it.
	checkAfterRestart(t, svc.url, 3)
}

// TestBackupLeavesAForeignFileAlone runs petstore backup -db on another
// application's SQLite file: refused, the file byte-identical, nothing
// created beside it (no -wal, -shm or journal).
func TestBackupLeavesAForeignFileAlone(t *testing.T) {
	for _, mode := range []string{"DELETE", "WAL"} {
		t.Run(mode, func(t *testing.T) { testBackupOfForeignFile(t, mode) })
	}
}

func testBackupOfForeignFile(t *testing.T, journalMode string) {
	dir := t.TempDir()
	other := filepath.Join(dir, "other.db")
	sqlExec(t, other, "PRAGMA journal_mode = "+journalMode, "CREATE TABLE notes (text TEXT)", "INSERT INTO notes VALUES ('keep me')")
	before, err := os.ReadFile(other)
	must(t, err)
	err = run(context.Background(), []string{"petstore", "backup", "-db", other, filepath.Join(t.TempDir(), "copy.db")},
		func(string) string { return "" }, io.Discard, io.Discard)
	want := "backup: back up " + other + ": not a petstore database: it holds tables petstore did not make (notes); use another -db file"
	if err == nil || err.Error() != want {
		t.Errorf("backup of another application's file: %v, want it refused: %s", err, want)
	}
	if after, err := os.ReadFile(other); err != nil || !bytes.Equal(after, before) {
		t.Errorf("the other application's file changed (%v)", err)
	}
	entries, err := os.ReadDir(dir)
	must(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"other.db"}, names); diff != "" {
		t.Errorf("files beside the other application's (-want +got):\n%s", diff)
	}
}

// TestSnapshotsNamedAhead: snapshots named by a clock that once ran a
// year ahead sort as the newest; they are kept and named, not counted,
// so -keep still keeps that many fresh ones.
func TestSnapshotsNamedAhead(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"petstore-20271122T030000Z.db", "petstore-20271123T030000Z.db", "petstore-20261119T030000Z.db",
		"petstore-20261120T030000Z.db", "petstore-20261121T030000Z.db", "petstore-20261122T030000Z.db", "notes.txt"} {
		must(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}
	removed, ahead, err := pruneSnapshots(dir, 3, "petstore-20261122T030000Z.db")
	must(t, err)
	if diff := cmp.Diff([]string{"petstore-20261119T030000Z.db"}, removed); diff != "" {
		t.Errorf("deleted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"petstore-20271122T030000Z.db", "petstore-20271123T030000Z.db"}, ahead); diff != "" {
		t.Errorf("named ahead (-want +got):\n%s", diff)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(left) != 6 {
		t.Errorf("%d files left, want 6: %v", len(left), left)
	}
}
