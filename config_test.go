package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCommandLines: every command answers -h on stdout and exits 0, usage
// names the program petstore, and backup says where its flags go.
func TestCommandLines(t *testing.T) {
	env := func(string) string { return "" }
	for _, args := range [][]string{{"-h"}, {"backup", "-h"}, {"restore", "-h"}, {"keygen", "-h"}} {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"/root/.cache/go-build/x/exe/petstore"}, args...), env, &out, io.Discard)
		if err != nil || !strings.HasPrefix(out.String(), "Usage: petstore") {
			t.Errorf("%v: %v, printed %q", args, err, out.String())
		}
	}
	// -h names the kind of each value, and its default.
	var help bytes.Buffer
	run(context.Background(), []string{"petstore", "-h"}, env, &help, io.Discard)
	for _, want := range []string{"\n  -addr host:port\n", "\n  -idle-timeout duration\n", "(default 2m0s)", "\n  -max-header-bytes int\n",
		"\n  -cors-origins origins\n", "\n  -db file\n"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("-h lacks %q:\n%s", want, help.String())
		}
	}
	// After --, a file name may begin with a dash.
	db := filepath.Join(t.TempDir(), "pets.db")
	preloadPets(t, db, 3)
	t.Chdir(t.TempDir())
	must(t, run(context.Background(), []string{"petstore", "backup", "-db", db, "--", "-dash.db"}, env, io.Discard, io.Discard))
	if _, err := os.Stat("-dash.db"); err != nil {
		t.Errorf("backup -- -dash.db: %v", err)
	}
	// Flags after the file name are refused with the order to use.
	err := run(context.Background(), []string{"petstore", "backup", "b.db", "-db", "pets.db"}, env, io.Discard, io.Discard)
	if want := "backup: flags go before the backup file: petstore backup [-db FILE] BACKUP-FILE | petstore backup [-db FILE] -dir DIR [-keep N]"; err == nil || err.Error() != want {
		t.Errorf("backup FILE -db X: %v, want %q", err, want)
	}
	// Their refusals are TestRunFailures'.
}

// TestUnknownVariables: at start, each PETSTORE_ variable petstore does
// not read gets a warning naming the one meant, when one is near.
func TestUnknownVariables(t *testing.T) {
	logs := &syncBuffer{}
	cmd := exec.Command(petstoreBinary(t), "-addr", "127.0.0.1:0", "-db", filepath.Join(t.TempDir(), "pets.db"))
	cmd.Env = binaryEnv("PETSTORE_API_KEYS="+testKey, "PETSTORE_PORT=8080", "PETSTORE_API_KEY=x", "PETSTORE_DB_FILE=pets.db", "PETSTORE_COLOUR=red",
		"PETSTORE_TLS_CERTIFICATE=cert.pem", "PETSTORE_MAX_CONN=5")
	cmd.Stderr = logs
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitForLog(t, logs, `msg=listening`, 1)
	for _, want := range []string{
		`level=WARN msg="environment variable not read by petstore: it has no effect; did you mean PETSTORE_API_KEYS\?" name=PETSTORE_API_KEY`,
		`level=WARN msg="environment variable not read by petstore: it has no effect" name=PETSTORE_COLOUR`,
		`level=WARN msg="environment variable not read by petstore: it has no effect; did you mean PETSTORE_DB\?" name=PETSTORE_DB_FILE`,
		`level=WARN msg="environment variable not read by petstore: it has no effect; did you mean PETSTORE_ADDR\?" name=PETSTORE_PORT`,
		`level=WARN msg="environment variable not read by petstore: it has no effect; did you mean PETSTORE_MAX_CONNS\?" name=PETSTORE_MAX_CONN`,
		`level=WARN msg="environment variable not read by petstore: it has no effect; did you mean PETSTORE_TLS_CERT\?" name=PETSTORE_TLS_CERTIFICATE`,
	} {
		if n := countLines(logs, want); n != 1 {
			t.Errorf("%d lines %s, want 1:\n%s", n, want, logs)
		}
	}
	if n := countLines(logs, "not read by petstore"); n != 6 {
		t.Errorf("%d warnings, want 6 (PETSTORE_API_KEYS is read):\n%s", n, logs)
	}
}
