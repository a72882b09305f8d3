package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// mount mounts what args say on a new directory, as root, until the test ends.
func mount(t *testing.T, args ...string) string {
	t.Helper()
	if os.Geteuid() != 0 && os.Getenv("PETSTORE_TEST_ALL") == "1" {
		t.Fatal("needs root (it mounts filesystems), and PETSTORE_TEST_ALL=1")
	} else if os.Geteuid() != 0 {
		t.Skip("needs root (it mounts filesystems); skipped")
	}
	dir := t.TempDir()
	command(t, "", "mount", append(args, dir)...)
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// fill writes a file until the filesystem at dir is full; free removes it.
func fill(t *testing.T, dir string) (free func()) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	must(t, err)
	defer f.Close()
	for _, chunk := range []int{64 << 10, 512, 1} {
		for err == nil {
			_, err = f.Write(make([]byte, chunk))
		}
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatal(err)
		}
		err = nil
	}
	return func() { must(t, os.Remove(f.Name())) }
}

var (
	diskFull = reply{503, map[string]string{"Retry-After": "5"}, errorBody(503, "unavailable", string(faultDiskFull))}
	readOnly = reply{503, map[string]string{"Retry-After": "5"}, errorBody(503, "unavailable", string(faultReadOnly))}
	healthy  = reply{200, nil, `{"status":"ok"}`}
	aPet     = call{method: "POST", path: "/v1/pets", body: `{"name":"Rex","categoryId":1}`}
	health   = call{method: "GET", path: "/healthz"}
)

// TestDiskFull: on a full tmpfs, creates and /healthz are 503 disk full
// and reads go on; once space is freed they work again, without a
// restart; and the service starts on a full disk.
func TestDiskFull(t *testing.T) {
	dir := mount(t, "-t", "tmpfs", "-o", "size=4m", "tmpfs")
	svc := startService(t, nil, "-db", filepath.Join(dir, "pets.db"))
	createPets(t, svc, aPet.body)
	free := fill(t, dir)
	acked, big := 1, call{method: "POST", path: "/v1/pets", body: `{"name":"` + strings.Repeat("😀", 100) + `","categoryId":1}`}
	for got, _ := svc.send(t, big); got.status == 201; got, _ = svc.send(t, big) {
		acked++ // what the last free pages took
	}
	svc.check(t, aPet, diskFull)
	svc.check(t, health, diskFull)
	svc.check(t, call{method: "GET", path: "/v1/pets?limit=1"}, reply{200, nil, `[{"id":1,"name":"Rex","categoryId":1,"status":"available"}]`})
	free()
	waitFor(t, "the health check's next write", func() bool { got, _ := svc.send(t, health); return got.status == 200 }) // one a second
	svc.check(t, aPet, reply{201, nil, fmt.Sprintf(`{"id":%d,"name":"Rex","categoryId":1,"status":"available"}`, acked+1)})
	line := `level=WARN msg="storage fault" fault="disk full: the filesystem holding the database has no space left, so no pet can be stored until space is freed: database or disk is full"`
	waitFor(t, "a line naming the fault", func() bool { return strings.Contains(svc.log.String(), line) })
	must(t, svc.stop())
	free = fill(t, dir)
	svc = startService(t, nil, "-db", svc.db)
	svc.check(t, health, diskFull) // the probe's own write, larger than any create
	svc.check(t, big, diskFull)
	svc.check(t, call{method: "GET", path: fmt.Sprintf("/v1/pets/%d", acked+1)}, reply{200, nil, fmt.Sprintf(`{"id":%d,"name":"Rex","categoryId":1,"status":"available"}`, acked+1)})
	free()
	svc.check(t, aPet, reply{201, nil, fmt.Sprintf(`{"id":%d,"name":"Rex","categoryId":1,"status":"available"}`, acked+2)})
}

// TestReadOnly: a database that cannot be written (an immutable file, a
// filesystem mounted read-only) is served for reading with creates and
// /healthz 503 read-only, from the start; made writable again, and the
// service restarted (SQLite keeps a file it opened read-only so), it
// takes creates.
func TestReadOnly(t *testing.T) {
	needTool(t, "chattr", "apt-get install e2fsprogs")
	dir := mount(t, "-t", "tmpfs", "-o", "size=16m", "tmpfs")
	svc := startService(t, nil, "-db", filepath.Join(dir, "pets.db"))
	createPets(t, svc, `{"name":"Rex","categoryId":1}`)
	must(t, svc.stop())
	rex := reply{200, nil, `[{"id":1,"name":"Rex","categoryId":1,"status":"available"}]`}
	for _, how := range [][2][]string{
		{{"chattr", "+i", svc.db}, {"chattr", "-i", svc.db}},
		{{"mount", "-o", "remount,ro", dir}, {"mount", "-o", "remount,rw", dir}},
	} {
		command(t, "", how[0][0], how[0][1:]...)
		svc = startService(t, nil, "-db", svc.db)
		svc.check(t, call{method: "GET", path: "/v1/pets"}, rex)
		svc.check(t, health, readOnly)
		svc.check(t, aPet, readOnly)
		command(t, "", how[1][0], how[1][1:]...)
		must(t, svc.stop())
		svc = startService(t, nil, "-db", svc.db)
		svc.check(t, health, healthy)
		got, header := svc.send(t, call{method: "POST", path: "/v1/pets", body: `{"name":"Tom","categoryId":2}`})
		if got.status != 201 {
			t.Fatalf("a create once writable: %d %s", got.status, got.body)
		}
		svc.check(t, call{method: "GET", path: "/v1/" + header.Get("Location")}, reply{200, nil, got.body})
		must(t, svc.stop())
		rex.body = strings.TrimSuffix(rex.body, "]") + "," + got.body + "]"
	}
}

// TestDamagedFile: a file damaged while the service was stopped stops the
// service once a read meets the damage, with exit status 1 and one ERROR
// line that names petstore restore.
func TestDamagedFile(t *testing.T) {
	svc := startService(t, nil)
	var bodies []string
	for i := range 3000 {
		bodies = append(bodies, fmt.Sprintf(`{"name":"pet %d with a long name to fill pages","categoryId":1}`, i))
	}
	createPets(t, svc, bodies...)
	must(t, svc.stop())
	f, err := os.OpenFile(svc.db, os.O_RDWR, 0)
	must(t, err)
	info, _ := f.Stat()
	for page := int64(8); page*4096 < info.Size()-4096; page += 9 {
		f.WriteAt([]byte(strings.Repeat("\xde\xad\xbe\xef", 1024)), page*4096)
	}
	f.Close()
	svc = startBinary(t, nil, "-db", svc.db)
	for after, got := 0, (reply{status: 200}); got.status == 200; after += 100 { // a walk through every pet
		got, _ = svc.send(t, call{method: "GET", path: fmt.Sprintf("/v1/pets?limit=100&after=%d", after)})
	}
	var exit *exec.ExitError
	if err := svc.exit(); !errors.As(err, &exit) || exit.ExitCode() != 1 || strings.Count(svc.log.String(), "level=ERROR") != 1 || !strings.Contains(svc.log.String(), "petstore restore") ||
		strings.Contains(svc.log.String(), "petstore: ") {
		t.Errorf("a service that read a damaged file: %v, want exit status 1, one ERROR line and petstore restore named:\n%s", err, svc.log)
	}
}

// TestEmptiedFile: a database file emptied by hand, or removed, beside a
// -wal that holds its pets, is refused at start, naming petstore restore,
// and by restore, because SQLite would drop the -wal and reuse its ids.
func TestEmptiedFile(t *testing.T) {
	svc := startBinary(t, nil)
	createPets(t, svc, aPet.body, aPet.body)
	backup := filepath.Join(t.TempDir(), "backup.db")
	_, err := runCommand("backup", "-db", svc.db, backup)
	must(t, err)
	must(t, svc.cmd.Process.Kill()) // the pets are in the -wal only
	svc.exit()
	for _, empty := range []func() error{func() error { return os.Truncate(svc.db, 0) }, func() error { return os.Remove(svc.db) }} {
		must(t, empty())
		stopped, stop := context.WithCancel(context.Background())
		stop() // a start that is not refused serves nothing, and returns
		err := run(stopped, []string{"petstore", "-addr", "127.0.0.1:0", "-db", svc.db}, func(k string) string { return testEnv(nil)[k] }, nil, &logLines{})
		if err == nil || !strings.Contains(err.Error(), "its -wal holds data") || !strings.Contains(err.Error(), "petstore restore") {
			t.Errorf("a start on an emptied file: %v", err)
		}
		if _, err := runCommand("restore", "-db", svc.db, "-from", backup); err == nil || !strings.Contains(err.Error(), "cannot be read") {
			t.Errorf("a restore over an emptied file: %v", err)
		}
	}
}

// TestFailedFsync: while fsync fails with EIO (an LD_PRELOAD shim), on
// the -wal in a commit or on the database file in a checkpoint, the
// service stops within 15 s with exit status 1 and an ERROR line. After
// a restart on good storage, every pet answered 201 is there.
func TestFailedFsync(t *testing.T) {
	gcc := needTool(t, "gcc", "apt-get install gcc")
	dir := t.TempDir()
	shim := filepath.Join(dir, "failfsync.so")
	command(t, "", gcc, "-shared", "-fPIC", "-o", shim, "testdata/failfsync/failfsync.c", "-ldl")
	for _, suffix := range []string{"pets.db-wal", "pets.db"} {
		trigger := filepath.Join(t.TempDir(), "fail")
		svc := startBinary(t, map[string]string{"LD_PRELOAD": shim, "FAIL_FSYNC_WHEN": trigger, "FAIL_FSYNC_SUFFIX": suffix})
		var mu sync.Mutex
		var acked []string
		var failedAt time.Time
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for got, start := (reply{status: 201}), time.Now(); got.status != 0 && time.Since(start) < time.Minute; {
					var header http.Header
					got, header = svc.send(t, aPet)
					mu.Lock()
					if got.status == 201 {
						acked = append(acked, header.Get("Location"))
					}
					if len(acked) == 100 && failedAt.IsZero() {
						failedAt = time.Now()
						must(t, os.WriteFile(trigger, nil, 0o600))
					}
					mu.Unlock()
				}
			}()
		}
		err := svc.exit()
		took := time.Since(failedAt)
		wg.Wait()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 || took > 15*time.Second || !strings.Contains(svc.log.String(), `level=ERROR msg="storage failed: the service stops without writing more"`) {
			t.Fatalf("fsync failing on %s: %v after %s, want exit status 1 within 15 s and an ERROR line:\n%s", suffix, err, took, svc.log)
		}
		svc = startBinary(t, nil, "-db", svc.db)
		for _, location := range acked {
			if got, _ := svc.send(t, call{method: "GET", path: "/v1/" + location}); got.status != 200 {
				t.Errorf("%s, answered 201 before fsync failed: %d %s", location, got.status, got.body)
			}
		}
		t.Logf("fsync failing on %s: stopped %s after; %d creates answered 201, all found after a restart", suffix, took.Round(time.Millisecond), len(acked))
	}
}
