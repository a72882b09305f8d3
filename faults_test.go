package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Every 503 of a storage fault has this body and a Retry-After.
var (
	diskFullBody = errBody(503, codeUnavailable, faultDiskFull.message())
	readOnlyBody = errBody(503, codeUnavailable, faultReadOnly.message())
	lockedBody   = errBody(503, codeUnavailable, faultLocked.message())
	damagedBody  = errBody(503, codeStorageDamaged, faultDamaged.message())
	replacedBody = errBody(503, codeUnavailable, faultReplaced.message())
)

const newPetBody = `{"name":"Rex","categoryId":1}`

// mountTmpfs mounts a tmpfs of the given size (such as "4m") on a temp
// dir: a real small filesystem to fill. Mounting needs root; CI runs as
// root, so these tests run there (the storage faults are also tested
// without root by the tests that need no mount).
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	needRoot(t, "to mount a tmpfs")
	mount := needTool(t, "mount", "apt-get install mount")
	dir := t.TempDir()
	mustMount(t, dir, exec.Command(mount, "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir))
	return dir
}

// mustMount runs a mount command for dir and unmounts dir when the test
// ends. Root without the right to mount (a container without
// CAP_SYS_ADMIN or loop devices) lacks what the test needs; any other
// failure fails the test.
func mustMount(t *testing.T, dir string, mount *exec.Cmd) {
	t.Helper()
	if out, err := mount.CombinedOutput(); err != nil {
		if regexp.MustCompile(`(?i)permission denied|not permitted|loop device`).Match(out) {
			lacking(t, "the right to mount filesystems", "root with CAP_SYS_ADMIN and loop devices, as CI has; "+strings.TrimSpace(string(out)))
		}
		t.Fatalf("%s: %v: %s", mount, err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
}

// mountExt4 makes an ext4 image of size bytes at img and loop-mounts it
// on a temp dir with the mount options opts: a real block filesystem,
// which can be shut down or frozen. It needs root.
func mountExt4(t *testing.T, img string, size int64, opts string) string {
	t.Helper()
	needRoot(t, "to loop-mount an ext4 image")
	mkfs := needTool(t, "mkfs.ext4", "apt-get install e2fsprogs")
	mount := needTool(t, "mount", "apt-get install mount")
	must(t, os.WriteFile(img, nil, 0o600))
	must(t, os.Truncate(img, size))
	mustRun(t, mkfs, "-q", "-b", "4096", img)
	dir := t.TempDir()
	mustMount(t, dir, exec.Command(mount, "-o", opts, img, dir))
	return dir
}

// mustRun runs a command, and fails the test at once, with its output,
// if it fails.
func mustRun(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

// fillDisk writes a file in dir until the filesystem has no byte left,
// and returns the function that deletes it.
func fillDisk(t *testing.T, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	must(t, err)
	buf := make([]byte, 64<<10)
	for _, chunk := range []int{64 << 10, 4 << 10, 512, 1} {
		for err == nil {
			_, err = f.Write(buf[:chunk])
		}
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatal(err)
		}
		err = nil
	}
	f.Close()
	return func() {
		t.Helper()
		must(t, os.Remove(path))
	}
}

// TestDiskFull fills a real filesystem under the service: creates get a
// retryable 503 that says the disk is full, reads go on, the fault is
// logged once when it begins and once when it ends, and the first create
// after space is freed succeeds without a restart. A restart on the full
// disk starts, serves reads and reports the full disk.
func TestDiskFull(t *testing.T) {
	t.Run("tmpfs", func(t *testing.T) { testDiskFull(t, mountTmpfs(t, "4m")) })
	t.Run("ext4", func(t *testing.T) {
		testDiskFull(t, mountExt4(t, filepath.Join(t.TempDir(), "disk.img"), 32<<20, "loop"))
	})
}

func testDiskFull(t *testing.T, dir string) {
	path := filepath.Join(dir, "pets.db")
	svc := startService(t, nil, "-db", path)
	acked, refused := map[int64]bool{}, 0
	// create sends a create and checks its answer: want 201, or the 503 of
	// the full disk, or (want 0) either.
	create := func(want int) {
		t.Helper()
		r := send(t, svc.url, call{method: "POST", path: "/v1/pets", body: newPetBody})
		switch {
		case r.status == 201 && want != 503:
			acked[decodePet(t, r.body).ID] = true
		case want == 201:
			t.Fatalf("create: %d %s", r.status, r.body)
		default:
			checkReply(t, r, 503, map[string]string{"Retry-After": "5"}, diskFullBody)
			refused++
		}
	}
	health := func(status int, body string) {
		t.Helper()
		checkReply(t, send(t, svc.url, call{method: "GET", path: "/healthz"}), status, map[string]string{"Retry-After": map[int]string{503: "5"}[status]}, body)
	}
	for range 5 {
		create(201)
	}

	free := fillDisk(t, dir)
	for i := 0; i < 5000 && refused == 0; i++ {
		create(0)
	}
	if refused == 0 {
		t.Fatal("5000 creates on a full disk were all stored")
	}
	for range 20 {
		create(503)
	}
	// A batch whose every create had expired commits an empty
	// transaction, which works on a full disk: it must not clear the
	// fault. The create after it is committed after it (one queue).
	late := createRequest{pet: NewPet{Name: "Late", CategoryID: 1, Status: "available"}, deadline: time.Now().Add(-time.Second)}
	if _, _, err := svc.store.createPet(context.Background(), late); !errors.Is(err, errTimedOut) {
		t.Errorf("a create past its deadline: %v, want timed out", err)
	}
	create(503)
	checkLines(t, svc.log, `msg="storage fault cleared"`, 0)
	if r := send(t, svc.url, call{method: "GET", path: "/v1/pets?limit=1"}); r.status != 200 {
		t.Errorf("list on a full disk: %d %s", r.status, r.body)
	}
	health(503, diskFullBody)
	checkLines(t, svc.log, `level=ERROR msg="storage fault`, 1)

	free()
	start := time.Now()
	create(201)
	t.Logf("disk full: %d creates acknowledged, %d refused with 503; first create after freeing space stored after %s",
		len(acked), refused, time.Since(start).Round(time.Millisecond))
	checkLines(t, svc.log, fmt.Sprintf(`level=WARN msg="storage fault cleared" fault="disk full: [^"]*" why="a write succeeded" refused=%d `, refused), 1)
	health(200, `{"status":"ok"}`)

	// A restart while the disk is full.
	svc.stop()
	free = fillDisk(t, dir)
	svc = startService(t, nil, "-db", path)
	if got := walkCatalogue(t, svc.url); len(got) != len(acked) {
		t.Errorf("after a restart on a full disk: %d pets listed, %d acknowledged", len(got), len(acked))
	}
	// From its first answer, and for as long as creates are refused,
	// /healthz says so (the tests run as root, whom ext4 lets use blocks
	// it keeps from others).
	for range 30 {
		health(503, diskFullBody)
		create(503)
	}
	free()
	create(201)
	health(200, `{"status":"ok"}`)
	for _, p := range walkCatalogue(t, svc.url) {
		delete(acked, p.ID)
	}
	if len(acked) != 0 {
		t.Errorf("acknowledged pets missing from the catalogue: %v", acked)
	}
}

// TestDiskFullForOthersOnly fills an ext4 filesystem as another user, up
// to the blocks ext4 keeps for root: the service, run as root as the
// tests are, still stores pets there, and /healthz says so, from a real
// write rather than a guess from the free space.
func TestDiskFullForOthersOnly(t *testing.T) {
	dir := mountExt4(t, filepath.Join(t.TempDir(), "disk.img"), 32<<20, "loop")
	must(t, os.Chmod(filepath.Dir(dir), 0o755))
	must(t, os.Chmod(dir, 0o1777))
	dd := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(dir, "filler"), "bs=64k")
	dd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, _ := dd.CombinedOutput(); !strings.Contains(string(out), "No space left on device") {
		t.Fatalf("dd as nobody did not fill the disk: %s", out)
	}
	svc := startService(t, nil, "-db", filepath.Join(dir, "pets.db"))
	for i := range 30 {
		checkReply(t, send(t, svc.url, call{method: "GET", path: "/healthz"}), 200, nil, `{"status":"ok"}`)
		checkReply(t, send(t, svc.url, call{method: "POST", path: "/v1/pets", body: newPetBody}), 201, nil,
			fmt.Sprintf(`{"id":%d,"name":"Rex","categoryId":1,"status":"available"}`, i+1))
	}
}

// TestReadOnlyStorage starts the service on a database file that cannot
// be written (immutable), then makes it writable: reads are served, creates
// and /healthz get 503 "read-only" with Retry-After, the fault is logged
// once when it begins and once when it ends, and the service recovers
// with no restart.
func TestReadOnlyStorage(t *testing.T) {
	dir := mountTmpfs(t, "16m")
	path := filepath.Join(dir, "pets.db")
	svc := startService(t, nil, "-db", path)
	createPets(t, svc.url, `{"name":"Rex","categoryId":1,"status":"sold"}`)
	svc.stop()
	chattrBin := needTool(t, "chattr", "apt-get install e2fsprogs")
	mustRun(t, chattrBin, "+i", path)
	defer exec.Command(chattrBin, "-i", path).Run()

	svc = startService(t, nil, "-db", path)
	logs := svc.log
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets"}), 200, nil,
		`[{"id":1,"name":"Rex","categoryId":1,"status":"sold"}]`)
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/healthz"}), 503, map[string]string{"Retry-After": "5"}, readOnlyBody)
	for range 30 {
		checkReply(t, send(t, svc.url, call{method: "POST", path: "/v1/pets", body: newPetBody}), 503, map[string]string{"Retry-After": "5"}, readOnlyBody)
	}
	mustRun(t, chattrBin, "-i", path)
	// No create needed: the store tries a write every second while a
	// fault is in force, so it recovers by itself.
	start := time.Now()
	waitForHealth(t, svc.url, 200)
	t.Logf("read-only: 30 creates refused, %d fault lines, recovered %s after the file was writable again",
		countLines(logs, `msg="storage fault`), time.Since(start).Round(time.Millisecond))
	createPets(t, svc.url, newPetBody)
	checkLines(t, logs, `level=ERROR msg="storage fault: [^"]*" fault="read-only: `, 1)
	checkLines(t, logs, `level=WARN msg="storage fault cleared" fault="read-only: [^"]*" why="a write succeeded" refused=30 `, 1)
}

// damagePage writes garbage over every seventh page of a database file
// from the fourth on, as failing storage might.
func damagePage(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	must(t, err)
	defer f.Close()
	fi, _ := f.Stat()
	garbage := []byte(strings.Repeat("\xde\xad\xbe\xef", 1024))
	for page := int64(4); page*4096 < fi.Size()-4096; page += 7 {
		f.WriteAt(garbage, page*4096)
	}
}

// TestLockedByAnotherProcess holds the database's write lock from another
// connection for longer than the busy timeout: creates get 503 "database
// locked" instead of hanging or 500, and the service recovers by itself
// when the lock is released.
func TestLockedByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pets.db")
	svc := startService(t, nil, "-db", path)
	createPets(t, svc.url, newPetBody)
	_, release := holdWriteLock(t, path)
	// Four creates at once, as a batch of clients sends them.
	replies := make(chan reply, 4)
	for range 4 {
		go func() { replies <- send(t, svc.url, call{method: "POST", path: "/v1/pets", body: newPetBody}) }()
	}
	for range 4 {
		checkReply(t, <-replies, 503, map[string]string{"Retry-After": "1"}, lockedBody)
	}
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/healthz"}), 503, map[string]string{"Retry-After": "1"}, lockedBody)
	release()
	waitForHealth(t, svc.url, 200)
	createPets(t, svc.url, newPetBody)
	checkFaultEpisodes(t, svc.log, "database locked", 4)
}

// checkFaultEpisodes holds the log of one storage fault, kind, that
// refused n requests and then cleared: it was logged when it began, and
// every fault begun was logged as ended, the last by a write that
// succeeded. A health check can find the database not answering
// meanwhile, which ends the fault ("changed to ...") and begins another:
// the test takes both sequences, so neither is required.
func checkFaultEpisodes(t testing.TB, logs *syncBuffer, kind string, n int) {
	t.Helper()
	line := regexp.MustCompile(`msg="storage fault(?:: [^"]*| (cleared))" fault="([^:"]+)[^"]*"(?: why="([^"]*)" refused=(\d+))?`)
	open, refused := "", 0
	var lines [][]string
	for _, m := range line.FindAllStringSubmatch(logs.String(), -1) {
		lines = append(lines, m)
		cleared, fault := m[1] != "", m[2]
		switch {
		case fault != kind && fault != faultNotAnswering.message():
			t.Errorf("a fault other than %q or not answering: %s", kind, m[0])
		case !cleared && open != "":
			t.Errorf("%q began while %q was in force, without an end: %s", fault, open, m[0])
		case cleared && fault != open:
			t.Errorf("%q cleared while %q was in force: %s", fault, open, m[0])
		}
		if cleared {
			open = ""
			if fault == kind {
				r, _ := strconv.Atoi(m[4])
				refused += r
			}
		} else {
			open = fault
		}
	}
	switch {
	case len(lines) == 0 || lines[0][1] != "" || lines[0][2] != kind:
		t.Errorf("the first fault line is not %q beginning:\n%s", kind, logs)
	case open != "" || lines[len(lines)-1][3] != "a write succeeded":
		t.Errorf("the last fault line is not a write clearing it:\n%s", logs)
	case refused != n:
		t.Errorf("the end lines of %q count %d refused requests, want %d:\n%s", kind, refused, n, logs)
	}
}

// TestDamagedFile damages a database file, by its pages or by a value no
// STRICT table holds: the service starts, its background quick_check
// finds the damage, /healthz answers 503 with the reason, one error line
// says how to restore, and no request gets a 500 or a 404. A row that
// cannot be read leaves no view to serve.
func TestDamagedFile(t *testing.T) {
	for name, damage := range map[string]func(*testing.T, string){"pages": damagePage, "row": garbleRow} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "pets.db")
			preloadPets(t, path, 5000)
			damage(t, path)
			svc := startService(t, nil, "-db", path)
			checkReply(t, waitForHealth(t, svc.url, 503), 503, map[string]string{"Retry-After": "60"}, damagedBody)
			checkLines(t, svc.log, `level=ERROR msg="database file is damaged: stop the service, [^"]*restore the latest backup[^"]*"`, 1)
			statuses := map[int]int{}
			for after := 0; after < 5000; after += 100 {
				r := send(t, svc.url, call{method: "GET", path: "/v1/pets?limit=100&after=" + strconv.Itoa(after)})
				statuses[r.status]++
				if r.status != 200 {
					checkReply(t, r, 503, map[string]string{"Retry-After": "60"}, damagedBody)
				}
			}
			checkReply(t, send(t, svc.url, call{method: "POST", path: "/v1/pets", body: newPetBody}), 503, map[string]string{"Retry-After": "60"}, damagedBody)
			// A pet the store cannot find may be in the damaged pages: not a 404.
			checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets/5001"}), 503, map[string]string{"Retry-After": "60"}, damagedBody)
			if name == "row" {
				// A row that cannot be read leaves no view: every read is a
				// 503, the pet before the damage included.
				checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets/1"}), 503, map[string]string{"Retry-After": "60"}, damagedBody)
				if statuses[200] != 0 {
					t.Errorf("list pages of a file with an unreadable row: %v, want every one 503", statuses)
				}
				checkLines(t, svc.log, `level=WARN msg="the in-memory view could not be loaded: [^"]*" err="damaged: `, 1)
			}
			t.Logf("damaged %s: list pages answered %v", name, statuses)
		})
	}
}

// garbleRow puts text in pet 2's category_id, through SQLite with the
// table's STRICT taken off for the moment.
func garbleRow(t *testing.T, path string) {
	// Each statement on a connection of its own, which reads the schema
	// as the one before left it.
	sqlExec(t, path, "PRAGMA writable_schema = ON; UPDATE sqlite_schema SET sql = replace(sql, ') STRICT', ')') WHERE name = 'pets'")
	sqlExec(t, path, "UPDATE pets SET category_id = 'garbage' WHERE id = 2")
	sqlExec(t, path, "PRAGMA writable_schema = ON; UPDATE sqlite_schema SET sql = sql || ' STRICT' WHERE name = 'pets'")
}

// TestFrozenStorage freezes the filesystem under the binary while clients
// create, until /healthz reports the stuck commit and the stall is logged
// (5 s, more than twice its write timeout): /healthz says so instead of
// ok; no client is cut off; the creates whose commit waited across the
// freeze are answered 201 after the thaw; the pets stored are exactly
// those answered 201; the stall is logged once when it passes 5 s and
// once when it ends; and /healthz is ok again.
func TestFrozenStorage(t *testing.T) {
	dir := mountExt4(t, filepath.Join(t.TempDir(), "disk.img"), 32<<20, "loop")
	fsfreeze := needTool(t, "fsfreeze", "apt-get install util-linux")
	logs := &syncBuffer{}
	base, _ := startBinary(t, nil, []string{"-db", filepath.Join(dir, "pets.db"), "-write-timeout", "2s"}, logs)
	load := startCreates(t, base, 8, "Rex")
	waitFor(t, patience, "50 creates before the freeze", func() bool { return load.statuses()[201] >= 50 })
	mustRun(t, fsfreeze, "-f", dir)
	thaw := sync.OnceFunc(func() { exec.Command(fsfreeze, "-u", dir).Run() })
	defer thaw()
	checkReply(t, waitForHealth(t, base, 503), 503, map[string]string{"Retry-After": "1"}, errBody(503, codeUnavailable, faultNotAnswering.message()))
	waitForLog(t, logs, `level=WARN msg="a commit is waiting on the storage`, 1)
	sentFrozen := len(load.answers())
	thaw()
	thawed := time.Now()
	before := load.statuses()[201]
	waitFor(t, patience, "50 creates after the thaw", func() bool { return load.statuses()[201] >= before+50 })
	load.stop()

	answers := load.statuses()
	if answers[0] != 0 {
		t.Errorf("%d creates were cut off without an answer", answers[0])
	}
	acrossFreeze := 0
	for _, c := range load.answers()[:sentFrozen] {
		if c.status == 201 && c.at.After(thawed) {
			acrossFreeze++
		}
	}
	if acrossFreeze == 0 {
		t.Error("no create sent before the thaw was answered 201 after it")
	}
	if acked, _, refusedStored := checkStored(t, walkCatalogue(t, base), load); refusedStored != 0 || acked == 0 {
		t.Errorf("%d creates answered 201 are stored, and %d refused ones are too", acked, refusedStored)
	}
	waitForLog(t, logs, `level=WARN msg="the stalled commit ended" took=\d+(\.\d+)?s committed=true`, 1)
	checkLines(t, logs, `msg="a commit is waiting on the storage`, 1)
	// A health read that the freeze held may still be finishing on a
	// loaded machine: health recovers once it has.
	checkReply(t, waitForHealth(t, base, 200), 200, nil, `{"status":"ok"}`)
	t.Logf("freeze under a 2 s write timeout: answers %v, %d answered 201 across the freeze, all answered 201 stored", answers, acrossFreeze)
}

// TestReadOnlyMountAtStart starts on files of a filesystem mounted
// read-only: one the service stopped cleanly is served for reading; one
// it could open only with a write (a rollback-journal copy, or a WAL file
// without its -wal and -shm) is refused with an error that says so, not
// SQLite's "unable to open database file: no such file or directory".
func TestReadOnlyMountAtStart(t *testing.T) {
	dir := mountTmpfs(t, "4m")
	stopped := filepath.Join(dir, "stopped.db")
	svc := startService(t, nil, "-db", stopped)
	createPets(t, svc.url, newPetBody)
	svc.stop()
	_, err := backupDatabase(context.Background(), stopped, filepath.Join(dir, "journal.db"))
	must(t, err)
	data, err := os.ReadFile(stopped)
	must(t, err)
	os.WriteFile(filepath.Join(dir, "bare.db"), data, 0o600)
	mustRun(t, "mount", "-o", "remount,ro", dir)

	svc = startService(t, nil, "-db", stopped)
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets/1"}), 200, nil, `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`)
	for _, tt := range []struct{ file, sqliteSaid string }{
		{"journal.db", "attempt to write a readonly database"},
		{"bare.db", "unable to open database file: no such file or directory"},
	} {
		path := filepath.Join(dir, tt.file)
		_, err := openStore(path, discardLog)
		want := "open database " + path + ": the database file or its filesystem is read-only, and to open it SQLite must write " +
			"(switch a rollback-journal file to WAL, or create the -wal and -shm of a WAL file) (" + tt.sqliteSaid + "): make it writable, or start once where it is (a clean stop keeps the -wal and -shm files, and then a read-only start serves reads)"
		if err == nil || err.Error() != want {
			t.Errorf("start on %s:\n got %v\nwant %s", tt.file, err, want)
		}
	}
}

// TestThinVolumeRunsOut runs the binary on an ext4 image whose backing
// store (a tmpfs) is smaller than the image, as a thin-provisioned volume
// is: once the backing runs out, writes fail with I/O errors, as on a
// failing disk. From then on no create is answered 201, also once the
// space comes back: creates and /healthz get 503 "I/O error" with
// Retry-After, never 500; reads go on, but a pet the store cannot find is
// a 503, not a 404; the fault is logged once, with what to do, and never
// cleared without a restart; the process writes nothing more
// to the files, SIGTERM included (strace watches); and after dropped
// caches, a file-system check and a restart, every acknowledged pet is
// there. The backing runs out early here (the image's own metadata takes
// most of it): with some 30,000 pets written first, ext4 was seen to lose
// pages of a checkpoint whose fsync had succeeded ("failed to convert
// unwritten extents ... potential data loss" in dmesg), a loss no program
// that trusts fsync survives (docs/operations.md: The operator contract).
func TestThinVolumeRunsOut(t *testing.T) {
	back := mountTmpfs(t, "16m")
	fsck := needTool(t, "e2fsck", "apt-get install e2fsprogs")
	img := filepath.Join(back, "disk.img")
	// errors=continue: ext4 goes on after an I/O error instead of turning
	// read-only, as a volume that gets its space back would.
	dir := mountExt4(t, img, 512<<20, "loop,errors=continue")
	db := filepath.Join(dir, "pets.db")
	logs := &syncBuffer{}
	base, cmd := startBinary(t, nil, []string{"-db", db}, logs)
	load := startCreates(t, base, 16, strings.Repeat("n", 80))
	waitFor(t, patience, "creates to be refused", func() bool { return load.refusals() >= 20 })
	load.stop()
	ackedAfter := 0
	for _, c := range load.answers() {
		if c.status == 201 && c.afterRefusal {
			ackedAfter++
		}
	}
	if n := load.statuses()[0]; n != 0 || ackedAfter > 0 {
		t.Errorf("%d creates were not answered; %d sent after the first refusal were answered 201", n, ackedAfter)
	}
	waitForLog(t, logs, `level=ERROR msg="a write or an fsync failed with an I/O error`, 1)
	// The space comes back: the pages the kernel dropped do not, so the
	// service must not take creates as if nothing had happened.
	mustRun(t, "mount", "-o", "remount,size=128m", back)
	ioBody := errBody(503, codeStorageFailed, faultIO.message())
	for range 20 {
		checkReply(t, send(t, base, call{method: "POST", path: "/v1/pets", body: newPetBody}), 503, map[string]string{"Retry-After": "60"}, ioBody)
	}
	checkReply(t, send(t, base, call{method: "GET", path: "/healthz"}), 503, map[string]string{"Retry-After": "60"}, ioBody)
	// A pet the store cannot find may be one it cannot read: not a 404.
	checkReply(t, send(t, base, call{method: "GET", path: "/v1/pets/999999"}), 503, map[string]string{"Retry-After": "60"}, ioBody)
	// Reads go on.
	first := load.answers()[0].pet
	checkReply(t, send(t, base, call{method: "GET", path: fmt.Sprintf("/v1/pets/%d", first.ID)}), 200, nil,
		fmt.Sprintf(`{"id":%d,"name":%q,"categoryId":%d,"status":"available"}`, first.ID, first.Name, first.CategoryID))
	checkLines(t, logs, `level=ERROR msg="a write or an fsync failed with an I/O error: [^"]*restart the service: SQLite recovers from the -wal what the storage kept, and the start checks the file and its pets`, 1)
	checkLines(t, logs, `level=ERROR`, 1)
	checkLines(t, logs, `msg="storage fault cleared"`, 0)
	// From the I/O error on, the process writes nothing more to the
	// files: no commit, no checkpoint, and no close that checkpoints.
	traced := straceOf(t, cmd, "write,pwrite64,pwritev,pwritev2,fsync,fdatasync,ftruncate", "-y")
	must(t, cmd.Process.Signal(syscall.SIGTERM))
	if err := cmd.Wait(); err != nil {
		t.Errorf("the binary after SIGTERM: %v", err)
	}
	if writes := regexp.MustCompile(`(?m)^.*pets\.db.*$`).FindAllString(traced(), -1); len(writes) > 0 {
		t.Errorf("%d writes, syncs or truncations of the files after the I/O error, the first: %s", len(writes), writes[0])
	}
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
	mustRun(t, "umount", dir)
	exec.Command(fsck, "-fy", img).Run() // repairs what the aborted journal left; exit 1 means it did
	mustMount(t, dir, exec.Command("mount", "-o", "loop", img, dir))
	base, _ = startBinary(t, nil, []string{"-db", db}, nil)
	// A refused create may be stored all the same: the commit that failed
	// may have reached the -wal whole.
	acked, refused, _ := checkStored(t, walkCatalogue(t, base), load)
	checkIntegrity(t, db)
	t.Logf("thin volume: %d creates acknowledged before the backing store ran out, %d refused after; SIGTERM, fsck, restart: all acknowledged there", acked, refused)
}

// straceOf attaches strace to the process of cmd, tracing the system
// calls calls with the further flags, once strace says it is attached to
// every thread; what it wrote is returned by the function, which first
// stops strace (SIGINT: with -c, it then prints its summary).
func straceOf(t *testing.T, cmd *exec.Cmd, calls string, flags ...string) (output func() string) {
	t.Helper()
	strace := needTool(t, "strace", "apt-get install strace")
	trace := exec.Command(strace, append(append([]string{"-f"}, flags...), "-e", "trace="+calls, "-p", strconv.Itoa(cmd.Process.Pid))...)
	traced := &syncBuffer{}
	trace.Stderr = traced
	must(t, trace.Start())
	waitFor(t, patience, "strace to attach", func() bool { return strings.Contains(traced.String(), "attached") })
	return func() string {
		trace.Process.Signal(os.Interrupt)
		trace.Wait()
		return traced.String()
	}
}

// TestHealthAnswersFromTheLatestCheck asks the binary's /healthz from 64
// clients at once, as monitors and load balancers do. On a healthy idle
// service every answer is 200 and nothing is logged; on a full disk every
// answer is the 503 of the fault, and the service's writes and fsyncs
// (counted by strace) follow the writer loop's probe, about one a second,
// not the requests.
func TestHealthAnswersFromTheLatestCheck(t *testing.T) {
	dir := mountTmpfs(t, "4m")
	logs := &syncBuffer{}
	base, cmd := startBinary(t, nil, []string{"-db", filepath.Join(dir, "pets.db")}, logs)
	ask := func(n int) map[string]int {
		var mu sync.Mutex
		answers := map[string]int{}
		var wg sync.WaitGroup
		for range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n / 64 {
					r := send(t, base, call{method: "GET", path: "/healthz", header: noKey})
					key := fmt.Sprint(r.status, " ", string(r.body))
					if r.err != nil {
						key = r.err.Error()
					}
					mu.Lock()
					answers[key]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return answers
	}
	const requests = 6400
	if got := ask(requests); got[`200 {"status":"ok"}`+"\n"] != requests {
		t.Errorf("a healthy idle service answered %d concurrent checks: %v", requests, got)
	}
	checkLines(t, logs, "level=(ERROR|WARN)", 0)

	fillDisk(t, dir)
	waitFor(t, patience, "/healthz to say the disk is full", func() bool {
		return strings.Contains(string(send(t, base, call{method: "GET", path: "/healthz", header: noKey}).body), "disk full")
	})
	summary := straceOf(t, cmd, "pwrite64,fsync,fdatasync", "-c")
	start := time.Now()
	got := ask(requests)
	took := time.Since(start)
	traced := summary()
	want := fmt.Sprintf("503 %s\n", errBody(503, codeUnavailable, faultDiskFull.message()))
	if got[want] != requests {
		t.Errorf("on a full disk, %d concurrent checks were answered %v", requests, got)
	}
	calls := 0
	for _, m := range regexp.MustCompile(`(?m)^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(pwrite64|fsync|fdatasync)$`).FindAllStringSubmatch(traced, -1) {
		n, _ := strconv.Atoi(m[1])
		calls += n
	}
	if limit := 10 * int(took.Seconds()+3); calls > limit {
		t.Errorf("%d writes and fsyncs for %d checks in %s, want at most %d (the probes'):\n%s", calls, requests, took, limit, traced)
	}
	t.Logf("%d checks of a healthy service, all 200; %d on a full disk in %s, all 503, with %d writes and fsyncs", requests, requests, took.Round(time.Millisecond), calls)
}

// TestFilesRemovedUnderLoad removes, renames or replaces the database,
// its -wal or its -shm under the binary while clients create, each with a
// name of its own, then kills the binary, restores the copy its ERROR
// line names (saved=), as docs/operations.md says, and starts it again.
// From the first refusal on no create is answered 201; creates and /healthz say why; and afterwards the
// names answered 201 are all in the catalogue, those answered 503 none of
// them. A -wal replaced by an older copy of itself is the case a
// checkpoint alone would lose: the copy is laid over the file at the next
// start.
func TestFilesRemovedUnderLoad(t *testing.T) {
	for _, tt := range []struct {
		name, file, how string
		linked          bool // -db names a symbolic link to the file
	}{
		{"wal", "-wal", "removed", false}, {"wal", "-wal", "renamed", false}, {"wal", "-wal", "replaced", false},
		{"shm", "-shm", "removed", false}, {"shm", "-shm", "renamed", false},
		{"database", "", "removed", false}, {"database", "", "renamed", false},
		{"linked wal", "-wal", "removed", true},
		{"wal", "-wal", "removed, then an older copy laid there", false}, {"wal", "-wal", "removed beside a reader", false},
	} {
		t.Run(tt.name+" "+tt.how, func(t *testing.T) {
			dir := t.TempDir()
			db, given := filepath.Join(dir, "pets.db"), filepath.Join(dir, "pets.db")
			if tt.linked {
				// SQLite keeps the -wal beside the link's target.
				db, given = filepath.Join(dir, "real", "pets.db"), filepath.Join(dir, "link.db")
				must(t, os.Mkdir(filepath.Dir(db), 0o700))
				must(t, os.Symlink(db, given))
			}
			logs := &syncBuffer{}
			base, cmd := startBinary(t, nil, []string{"-db", given}, logs)
			load := startCreates(t, base, 4, "Pet")
			waitFor(t, patience, "500 creates", func() bool { return load.statuses()[201] >= 500 })
			older, err := os.ReadFile(db + tt.file)
			must(t, err)
			waitFor(t, patience, "1,000 creates", func() bool { return load.statuses()[201] >= 1000 })
			// A reader's snapshot holds the checkpoint back past the busy
			// timeout, until it ends.
			var reader io.WriteCloser
			if tt.how == "removed beside a reader" {
				sqlite3 := exec.Command(needTool(t, "sqlite3", "apt-get install sqlite3"), db)
				reader, err = sqlite3.StdinPipe()
				must(t, err)
				out, err := sqlite3.StdoutPipe()
				must(t, err)
				must(t, sqlite3.Start())
				t.Cleanup(func() { sqlite3.Process.Kill(); sqlite3.Wait() })
				io.WriteString(reader, "BEGIN; SELECT count(*) FROM pets;\n")
				if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
					t.Fatalf("the reader: %v", err)
				}
			}
			switch tt.how {
			case "renamed":
				must(t, os.Rename(db+tt.file, db+tt.file+".moved"))
			case "replaced":
				must(t, os.WriteFile(db+tt.file+".older", older, 0o600))
				must(t, os.Rename(db+tt.file+".older", db+tt.file))
			default:
				must(t, os.Remove(db+tt.file))
			}
			waitFor(t, patience, "200 creates to be refused", func() bool { return load.refusals() >= 200 })
			load.stop()
			want := errBody(503, codeStorageTampered, faultTampered.message())
			if tt.file == "" {
				want = errBody(503, codeUnavailable, faultReplaced.message())
			}
			for _, c := range load.answers() {
				if c.status == 201 && c.afterRefusal {
					t.Errorf("%s, sent after the first refusal, was answered 201", c.name)
				} else if c.status != 201 && diffJSON([]byte(want), c.body) != "" {
					t.Errorf("%s was answered %d %s", c.name, c.status, c.body)
				}
			}
			checkReply(t, send(t, base, call{method: "POST", path: "/v1/pets", body: newPetBody}), 503, map[string]string{"Retry-After": "60"}, want)
			checkReply(t, send(t, base, call{method: "GET", path: "/healthz", header: noKey}), 503, map[string]string{"Retry-After": "60"}, want)
			// Where only the -wal or -shm went, the checkpoint is the save;
			// where the database went, a copy that docs/operations.md's
			// restore command puts back.
			logged := `level=ERROR msg="a file SQLite holds open was deleted or replaced[^"]*every pet it holds is saved to the file named saved: stop the service, restore that file in place of the database, then start it[^"]*" saved=(\S+)`
			if tt.file != "" && reader == nil {
				logged = `level=ERROR msg="a file SQLite holds open was deleted or replaced[^"]*every pet it holds is in the database at its path, checkpointed: restart the service"`
			}
			if tt.how == "replaced" {
				logged += ` moved_aside=` + regexp.QuoteMeta(db+"-wal.not-the-services-") + `\S+`
			}
			waitForLog(t, logs, logged+` fault=`, 1)
			checkLines(t, logs, `level=ERROR`, 1)
			// Later, the checkpoint the reader held back, or an older -wal
			// laid at the path, is seen to within a second: the database
			// at its path holds every pet, and a restart is all it takes.
			again := `level=ERROR msg="the database at its path holds every pet: every pet it holds is in the database at its path, checkpointed: restart the service"`
			switch {
			case reader != nil:
				reader.Close()
				waitForLog(t, logs, again+` db=`, 1)
			case strings.HasSuffix(tt.how, "laid there"):
				must(t, os.WriteFile(db+tt.file, older, 0o600))
				waitForLog(t, logs, again+` moved_aside=`+regexp.QuoteMeta(db+"-wal.not-the-services-")+`\S+ db=`, 1)
			}

			cmd.Process.Kill()
			cmd.Wait()
			if tt.file == "" {
				m := regexp.MustCompile(logged + ` fault=.* db=(\S+)`).FindStringSubmatch(logs.String())
				out, err := exec.Command(petstoreBinary(t), "restore", "-from", m[1], "-db", m[2]).CombinedOutput()
				if err != nil || m[2] != db {
					t.Fatalf("petstore restore -from %s -db %s: %v: %s", m[1], m[2], err, out)
				}
			}
			base, _ = startBinary(t, nil, []string{"-db", given}, nil)
			acked, refused, refusedStored := checkStored(t, walkCatalogue(t, base), load)
			if refusedStored != 0 {
				t.Errorf("%d creates answered 503 are stored", refusedStored)
			}
			t.Logf("%s %s under load: %d creates answered 201, all there after a SIGKILL and what the log said; %d answered 503, none stored", tt.name, tt.how, acked, refused)
		})
	}
}

// TestWalRemovedWithNoRoomForACopy removes the -wal under load on a
// filesystem with no room for a copy of the database. The checkpoint
// needs none: it puts every pet in the database at its path, so the
// batch that found the change is acknowledged, the ERROR line says a
// restart is all it takes, and after a SIGKILL and a restart every
// create answered 201 is there and none answered 503.
func TestWalRemovedWithNoRoomForACopy(t *testing.T) {
	// 3.8 MB, made elsewhere, as its making takes a -wal as large.
	made := filepath.Join(t.TempDir(), "pets.db")
	preloadPets(t, made, 100000)
	db := filepath.Join(mountTmpfs(t, "7m"), "pets.db")
	data, err := os.ReadFile(made)
	must(t, err)
	must(t, os.WriteFile(db, data, 0o600))
	logs := &syncBuffer{}
	base, cmd := startBinary(t, nil, []string{"-db", db}, logs)
	load := startCreates(t, base, 4, "Full")
	waitFor(t, patience, "500 creates", func() bool { return load.statuses()[201] >= 500 })
	must(t, os.Remove(db+"-wal"))
	waitFor(t, patience, "200 creates to be refused", func() bool { return load.refusals() >= 200 })
	load.stop()
	waitForLog(t, logs, `level=ERROR msg="a file SQLite holds open was deleted or replaced[^"]*every pet it holds is in the database at its path, checkpointed: restart the service" fault=`, 1)
	cmd.Process.Kill()
	cmd.Wait()
	base, _ = startBinary(t, nil, []string{"-db", db}, nil)
	var created []Pet
	for _, p := range walkCatalogue(t, base) {
		if strings.HasPrefix(p.Name, "Full ") {
			created = append(created, p)
		}
	}
	acked, refused, refusedStored := checkStored(t, created, load)
	if refusedStored != 0 {
		t.Errorf("%d creates answered 503 are stored", refusedStored)
	}
	t.Logf("wal removed, no room for a copy: %d creates answered 201, all there after a SIGKILL and a restart; %d answered 503, none stored", acked, refused)
}

// TestOperatorBesideTheService runs an operator's sqlite3 shell in a
// loop beside creating clients: every checkpoint mode, .backup, VACUUM
// INTO and reads. SQLite writes the files under the service as it is
// meant to, so not one create is refused and nothing is logged above
// INFO; every pet answered 201 is in the file.
func TestOperatorBesideTheService(t *testing.T) {
	sqlite3 := needTool(t, "sqlite3", "apt-get install sqlite3")
	dir := t.TempDir()
	db := filepath.Join(dir, "pets.db")
	logs := &syncBuffer{}
	base, _ := startBinary(t, nil, []string{"-db", db}, logs)
	load := startCreates(t, base, 4, "Rex")
	for i := range 20 {
		copy := filepath.Join(dir, fmt.Sprintf("copy-%d.db", i))
		script := fmt.Sprintf(`.timeout 5000
PRAGMA wal_checkpoint(PASSIVE);
SELECT count(*) FROM pets;
PRAGMA wal_checkpoint(FULL);
.backup %s.backup
PRAGMA wal_checkpoint(RESTART);
VACUUM INTO '%s';
PRAGMA wal_checkpoint(TRUNCATE);
SELECT max(id) FROM pets;
`, copy, copy)
		cmd := exec.Command(sqlite3, db)
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("sqlite3: %v: %s", err, out)
		}
	}
	load.stop()
	if answers := load.statuses(); answers[201] == 0 || len(answers) != 1 {
		t.Errorf("creates beside the operator were answered %v, want only 201", answers)
	}
	checkLines(t, logs, "level=(WARN|ERROR)", 0)
	acked, _, _ := checkStored(t, walkCatalogue(t, base), load)
	t.Logf("beside 20 rounds of an operator's checkpoints, .backup, VACUUM INTO and reads: %d creates, all 201, all stored", acked)
}
