package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestLitestream: Litestream replicates the live file beside the service
// with the settings litestream.yml ships; the replica, restored and put
// back with petstore restore, holds every pet acknowledged before the
// service stopped, and ids go on above them.
func TestLitestream(t *testing.T) {
	ls := needTool(t, "litestream", "go install github.com/benbjohnson/litestream/cmd/litestream@v0.5.18")
	svc := startService(t, nil)
	dir := t.TempDir()
	config := filepath.Join(dir, "litestream.yml")
	must(t, os.WriteFile(config, []byte(fmt.Sprintf("dbs:\n  - path: %s\n    truncate-page-n: 0\n    replica:\n      type: file\n      path: %s\n      sync-interval: 1s\n",
		svc.db, filepath.Join(dir, "replica"))), 0o600))
	log := &logLines{}
	replicate := exec.Command(ls, "replicate", "-config", config)
	replicate.Stdout, replicate.Stderr = log, log
	must(t, replicate.Start())
	defer func() { replicate.Process.Kill(); replicate.Wait() }()
	waitFor(t, "Litestream's first snapshot", func() bool { return strings.Contains(log.String(), "snapshot complete") })
	var bodies []string
	for i := range 200 {
		bodies = append(bodies, fmt.Sprintf(`{"name":"pet %d","categoryId":%d}`, i, i+1))
	}
	createPets(t, svc, bodies...)
	want, _ := svc.send(t, call{method: "GET", path: "/v1/pets?limit=100&after=100"})
	must(t, svc.stop())
	// The replica has caught up once a restore of it holds the last pet.
	restored := filepath.Join(t.TempDir(), "restored.db")
	waitFor(t, "the replica to hold the last pet", func() bool {
		os.Remove(restored)
		if exec.Command(ls, "restore", "-config", config, "-o", restored, svc.db).Run() != nil {
			return false
		}
		db := sqlite(t, restored)
		defer db.Close()
		var n int
		return db.QueryRow("SELECT count(*) FROM pets WHERE id = 200").Scan(&n) == nil && n == 1
	})
	replicate.Process.Kill()
	out, err := runCommand("restore", "-db", svc.db, "-from", restored)
	if err != nil || !strings.HasSuffix(out, ": 200 pets, integrity ok\n") {
		t.Fatalf("petstore restore: %v %s", err, out)
	}
	svc = startService(t, nil, "-db", svc.db)
	svc.check(t, call{method: "GET", path: "/v1/pets?limit=100&after=100"}, reply{200, nil, want.body})
	svc.check(t, call{method: "POST", path: "/v1/pets", body: `{"name":"After","categoryId":1}`}, reply{201, map[string]string{"Location": "pets/201"},
		`{"id":201,"name":"After","categoryId":1,"status":"available"}`})
}
