package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// command runs one of petstore's commands as main does and returns what
// it printed, or its error.
func runCommand(args ...string) (string, error) {
	var out logLines
	err := run(context.Background(), append([]string{"petstore"}, args...), func(string) string { return "" }, &out, nil)
	return out.String(), err
}

// TestBackupAndRestore: a backup taken while creates run is whole and
// checked; a backup is never written over a file, nor taken of another
// application's file; restore refuses while the service holds the file,
// and puts a backup back so that no id handed out before is given again.
func TestBackupAndRestore(t *testing.T) {
	svc := startService(t, nil)
	dir := filepath.Dir(svc.db)
	createPets(t, svc, `{"name":"Rex","categoryId":1}`)
	first := filepath.Join(dir, "first.db")
	if out, err := runCommand("backup", "-db", svc.db, first); err != nil || out != fmt.Sprintf("backed up %s to %s: 1 pets, integrity ok\n", svc.db, first) {
		t.Fatalf("backup: %v %q", err, out)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 300 {
			createPets(t, svc, fmt.Sprintf(`{"name":"pet %d","categoryId":1}`, i))
		}
	}()
	for i := range 5 { // backups while the creates run
		out, err := runCommand("backup", "-db", svc.db, filepath.Join(dir, fmt.Sprintf("during-%d.db", i)))
		if err != nil || !strings.HasSuffix(out, " pets, integrity ok\n") {
			t.Errorf("a backup under load: %v %q", err, out)
		}
	}
	wg.Wait()
	foreign := filepath.Join(dir, "notes.db")
	execSQL(t, foreign, "CREATE TABLE notes (body TEXT)")
	must(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("my notes"), 0o600))
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"backup", "-db", svc.db, first}, "backup: " + first + " already exists; a backup never overwrites a file"},
		{[]string{"backup", "-db", svc.db}, "backup: name the files as the usage says, flags first: petstore backup [-db FILE] BACKUP-FILE"},
		{[]string{"backup", "-db", "testdata/schemas/1.sql", filepath.Join(dir, "x.db")}, "backup: back up testdata/schemas/1.sql: file is not a database"},
		{[]string{"restore", "-db", svc.db, "-from", first}, "restore: database " + svc.db + ": it is in use by another petstore process; run one service per database file; stop it before restoring"},
		{[]string{"restore", "-db", svc.db}, "restore: name the files as the usage says, flags first: petstore restore -from BACKUP [-db FILE] [-last-id N]"},
		{[]string{"restore", "-db", filepath.Join(dir, "y.db"), "-from", svc.db + "-wal"}, "restore: back up " + svc.db + "-wal: file is not a database"},
		{[]string{"restore", "-db", foreign, "-from", first}, "restore: database " + foreign + ": not a petstore database: it holds tables petstore did not make (notes); it is left as it is (if it is petstore's, damaged, give -last-id)"},
		{[]string{"restore", "-db", filepath.Join(dir, "notes.txt"), "-from", first}, "restore: database " + filepath.Join(dir, "notes.txt") + ": the highest id it holds or gave out cannot be read (file is not a database), so a restore could give a client's id to another pet; it is left as it is. " +
			"Find that id (sqlite3 " + filepath.Join(dir, "notes.txt") + " .recover, or your clients' records) and run restore again with -last-id ID"},
	} {
		if _, err := runCommand(tt.args...); err == nil || err.Error() != tt.want {
			t.Errorf("%v: %v\nwant %s", tt.args, err, tt.want)
		}
	}
	// Put the first backup back, where 301 pets had been stored, over a
	// file whose table is damaged. Its highest id cannot be read, so the
	// restore refuses and leaves the file as it was, unless given it.
	must(t, svc.stop())
	must(t, os.Remove(svc.db+"-wal")) // checkpointed at the stop: it holds nothing the file lacks
	f, err := os.OpenFile(svc.db, os.O_WRONLY, 0)
	must(t, err)
	f.WriteAt(make([]byte, 4096), 4096) // page 2, the table's root
	f.Close()
	if os.Geteuid() == 0 { // owned by another user, as under systemd's DynamicUser
		must(t, os.Chown(svc.db, 4242, 4343))
	}
	must(t, os.Chmod(svc.db, 0o640))
	before, _ := os.ReadFile(svc.db)
	infoBefore, _ := os.Stat(svc.db)
	if _, err := runCommand("restore", "-db", svc.db, "-from", first); err == nil || !strings.Contains(err.Error(), "the highest id it holds or gave out cannot be read") ||
		!strings.HasSuffix(err.Error(), "run restore again with -last-id ID") {
		t.Errorf("a restore over a file whose highest id cannot be read: %v", err)
	}
	if after, _ := os.ReadFile(svc.db); !bytes.Equal(before, after) {
		t.Error("a refused restore changed the file")
	}
	if out, err := runCommand("restore", "-db", svc.db, "-from", first, "-last-id", "301"); err != nil || out != fmt.Sprintf("restored %s to %s: 1 pets, integrity ok\n", first, svc.db) {
		t.Fatalf("restore: %v %q", err, out)
	}
	infoAfter, _ := os.Stat(svc.db)
	owner := func(i os.FileInfo) string {
		st := i.Sys().(*syscall.Stat_t)
		return fmt.Sprintf("%d:%d %v", st.Uid, st.Gid, i.Mode())
	}
	if owner(infoAfter) != owner(infoBefore) {
		t.Errorf("the restored file is %s, the one it replaced was %s", owner(infoAfter), owner(infoBefore))
	}
	// A copy left by a restore that was stopped after it removed the old
	// -wal holds the id it raised to, 500 here: a restore run again keeps it.
	execSQL(t, first, "UPDATE sqlite_sequence SET seq = 500")
	left, _ := os.ReadFile(first)
	must(t, os.WriteFile(filepath.Join(dir, ".pets.db.restoring"), left, 0o600))
	execSQL(t, first, "UPDATE sqlite_sequence SET seq = 1")
	if _, err := runCommand("restore", "-db", svc.db, "-from", first); err != nil {
		t.Fatal(err)
	}
	svc = startService(t, nil, "-db", svc.db)
	svc.check(t, call{method: "GET", path: "/v1/pets"}, reply{200, nil, `[{"id":1,"name":"Rex","categoryId":1,"status":"available"}]`})
	svc.check(t, call{method: "POST", path: "/v1/pets", body: `{"name":"Tom","categoryId":2}`}, reply{201, map[string]string{"Location": "pets/501"},
		`{"id":501,"name":"Tom","categoryId":2,"status":"available"}`})
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}
