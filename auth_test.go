package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
)

// TestKeysFile: keys come from a file of plain keys and sha256: lines,
// which SIGHUP reads again; a file that does not load changes nothing.
func TestKeysFile(t *testing.T) {
	plain, hashed, added := "plain-key-0123456789abcdef", "hashed-key-0123456789abcdef", "added-key-0123456789abcdef"
	keys := filepath.Join(t.TempDir(), "keys")
	write := func(text string) { must(t, os.WriteFile(keys, []byte(text), 0o600)) }
	write(fmt.Sprintf("# the office\n%s\n\n  SHA256:%x   # the scripts, the prefix in any case\n", plain, sha256.Sum256([]byte(hashed))))
	svc := startBinary(t, map[string]string{"PETSTORE_API_KEYS": ""}, "-api-keys-file", keys)
	accepts := func(key string, want bool) {
		t.Helper()
		got, _ := svc.send(t, call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": "Bearer " + key}})
		if (got.status == 200) != want {
			t.Errorf("key %s: %d, want accepted %v", key, got.status, want)
		}
	}
	for key, want := range map[string]bool{plain: true, hashed: true, added: false, testKey: false} {
		accepts(key, want)
	}

	hup := func(line string) {
		t.Helper()
		n := strings.Count(svc.log.String(), "SIGHUP")
		must(t, svc.cmd.Process.Signal(syscall.SIGHUP))
		waitFor(t, "the reload's line", func() bool { return strings.Count(svc.log.String(), "SIGHUP") > n })
		if !strings.Contains(svc.log.String(), line) {
			t.Errorf("the log lacks %q:\n%s", line, svc.log)
		}
	}
	write(added + "\n" + plain + "\n")
	hup(`msg="SIGHUP: API keys reloaded" keys=2`)
	accepts(added, true)
	accepts(hashed, false)
	write("# emptied by a > typed for >>\n")
	hup(`msg="SIGHUP: API keys not reloaded; the previous keys stay in force" err="API keys file ` + keys + ` holds no key"`)
	accepts(added, true)
}

// TestGeneratedKey: with no key configured, the first start writes one to
// DB.key beside the database (mode 0600) and serves with it; the log
// names the file and never the key, in JSON on every line; the next
// start serves with the same key.
func TestGeneratedKey(t *testing.T) {
	env := map[string]string{"PETSTORE_API_KEYS": ""}
	svc := startBinary(t, env, "-log-format", "json")
	keyFile := svc.db + ".key"
	text, err := os.ReadFile(keyFile)
	must(t, err)
	key := strings.TrimSpace(string(text))
	if info, err := os.Stat(keyFile); err != nil || info.Mode().Perm() != 0o600 || !regexp.MustCompile(`^[A-Za-z0-9_-]{43}$`).MatchString(key) {
		t.Fatalf("the key file: %v %v %q", info.Mode(), err, key)
	}
	bearer := map[string]string{"Authorization": "Bearer " + key}
	svc.check(t, call{method: "GET", path: "/v1/pets", header: bearer}, reply{200, nil, `[]`})
	must(t, svc.stop())
	svc = startBinary(t, env, "-log-format", "json", "-db", svc.db)
	svc.check(t, call{method: "GET", path: "/v1/pets", header: bearer}, reply{200, nil, `[]`})
	must(t, svc.stop())
	log := svc.log.String()
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Errorf("a line not JSON: %s", line)
		}
	}
	if !strings.Contains(log, `"key_file":"`+keyFile+`"`) || strings.Contains(log, key) {
		t.Errorf("the log should name %s and never the key:\n%s", keyFile, log)
	}
}
