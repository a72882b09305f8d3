package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
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
	if out, err := exec.Command("mount", append(args, dir)...).CombinedOutput(); err != nil {
		t.Fatalf("mount %v: %v %s", args, err, out)
	}
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
	failed   = reply{503, map[string]string{"Retry-After": "60"}, errorBody(503, "storage_failed", string(faultIO))}
	damaged  = reply{503, map[string]string{"Retry-After": "60"}, errorBody(503, "storage_damaged", string(faultDamaged))}
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
	acked := 1
	for got, _ := svc.send(t, aPet); got.status == 201; got, _ = svc.send(t, aPet) {
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
	svc.check(t, health, diskFull)
	svc.check(t, aPet, diskFull)
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
		if out, err := exec.Command(how[0][0], how[0][1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", how[0], err, out)
		}
		svc = startService(t, nil, "-db", svc.db)
		svc.check(t, call{method: "GET", path: "/v1/pets"}, rex)
		svc.check(t, health, readOnly)
		svc.check(t, aPet, readOnly)
		if out, err := exec.Command(how[1][0], how[1][1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", how[1], err, out)
		}
		must(t, svc.stop())
		svc = startService(t, nil, "-db", svc.db)
		svc.check(t, health, healthy)
		got, header := svc.send(t, call{method: "POST", path: "/v1/pets", body: `{"name":"Tom","categoryId":2}`})
		if got.status != 201 {
			t.Fatalf("a create once writable: %d %s", got.status, got.body)
		}
		svc.check(t, call{method: "GET", path: header.Get("Location")}, reply{200, nil, got.body})
		must(t, svc.stop())
		rex.body = strings.TrimSuffix(rex.body, "]") + "," + got.body + "]"
	}
}

// TestDamagedFile: a file damaged while the service was down is found by
// the check the start begins; from then on creates and /healthz are 503
// storage_damaged, and a pet that cannot be found is not a 404.
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
	svc = startService(t, nil, "-db", svc.db)
	waitFor(t, "the check to find the damage", func() bool { got, _ := svc.send(t, health); return got.status == 503 })
	svc.check(t, aPet, damaged)
	svc.check(t, health, damaged)
	svc.check(t, call{method: "GET", path: "/v1/pets/999999"}, reply{503, map[string]string{"Deprecation": "@1795305600"}, damaged.body})
	line := `level=ERROR msg="storage fault: creates are refused until the service is restarted`
	waitFor(t, "a line naming the damage", func() bool { return strings.Contains(svc.log.String(), line) })
}

// TestIOError: ext4 on a loop device whose backing file, on a small
// tmpfs, runs out (as a thin volume does): writes fail with EIO, or, once
// ext4's journal has aborted on it, as on a read-only filesystem. Every
// create is answered; from the error on, creates and /healthz are 503,
// even once the space is back (storage_failed, and then a get of a pet
// not found is no 404; or read-only); after a restart every pet
// acknowledged is there.
func TestIOError(t *testing.T) {
	needTool(t, "mkfs.ext4", "apt-get install e2fsprogs")
	back := mount(t, "-t", "tmpfs", "-o", "size=16m", "tmpfs")
	img := filepath.Join(back, "disk.img")
	must(t, os.WriteFile(img, nil, 0o600))
	must(t, os.Truncate(img, 512<<20))
	if out, err := exec.Command("mkfs.ext4", "-q", "-b", "4096", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}
	// errors=continue: ext4 goes on after an I/O error, as on a volume
	// that gets its space back, rather than turning read-only.
	dir := mount(t, "-o", "loop,errors=continue", img)
	svc := startBinary(t, nil, "-db", filepath.Join(dir, "pets.db"))
	var mu sync.Mutex
	acked, refused := map[string]bool{}, 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for done := false; !done; {
				got, header := svc.send(t, call{method: "POST", path: "/v1/pets", body: `{"name":"` + strings.Repeat("n", 90) + `","categoryId":1}`})
				mu.Lock()
				switch got.status {
				case 201:
					acked[header.Get("Location")] = true
				case 503:
					refused++
				default:
					t.Errorf("a create: %d %s", got.status, got.body)
				}
				done = refused >= 20
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if out, err := exec.Command("mount", "-o", "remount,size=600m", back).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v %s", err, out)
	}
	if got, _ := svc.send(t, aPet); strings.Contains(got.body, "read-only") {
		svc.check(t, health, readOnly)
	} else {
		svc.check(t, aPet, failed)
		svc.check(t, health, failed)
		svc.check(t, call{method: "GET", path: "/v1/pets/99999999"}, reply{503, nil, failed.body})
	}
	must(t, svc.stop())
	exec.Command("umount", dir).Run()
	exec.Command("e2fsck", "-fy", img).Run() // mends what the aborted journal left; exit 1 says it did
	dir = mount(t, "-o", "loop", img)
	svc = startBinary(t, nil, "-db", filepath.Join(dir, "pets.db"))
	for location := range acked {
		if got, _ := svc.send(t, call{method: "GET", path: location}); got.status != 200 {
			t.Errorf("%s, acknowledged before the I/O error: %d %s", location, got.status, got.body)
		}
	}
	t.Logf("I/O error: %d creates acknowledged, %d refused; all acknowledged found after a restart", len(acked), refused)
}
