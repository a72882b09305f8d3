package main

import (
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// readmeSection is the shell in README.md's code blocks between two
// headings, and the answers written under it as "# " lines.
func readmeSection(t *testing.T, from, to string) (script, answers string) {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	must(t, err)
	_, section, _ := strings.Cut(string(readme), from)
	section, _, _ = strings.Cut(section, to)
	for _, block := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1) {
		for _, line := range strings.SplitAfter(block[1], "\n") {
			if answer, ok := strings.CutPrefix(line, "# "); ok {
				answers += answer
			} else {
				script += line
			}
		}
	}
	return script, answers
}

// TestREADME runs README.md's first session as written, in one shell,
// against the binary started as `go run .` starts it (in a directory of
// its own, no key configured, a new petstore.db there), and compares what
// it prints with the answers written under the commands. Then its
// commands: keygen, a backup while serving, a restore once stopped.
func TestREADME(t *testing.T) {
	needTool(t, "curl", "apt-get install curl")
	script, answers := readmeSection(t, "## A first session", "## The API")
	svc := startBinary(t, map[string]string{"PETSTORE_API_KEYS": ""}, "-db", "petstore.db")
	sh := exec.Command("bash", "-euo", "pipefail", "-c", strings.ReplaceAll(script, "http://127.0.0.1:8080", svc.url))
	sh.Dir = svc.dir
	out, err := sh.Output()
	if diff := cmp.Diff(answers, string(out)); err != nil || diff != "" {
		t.Errorf("the first session: %v (-README +got):\n%s", err, diff)
	}

	script, _ = readmeSection(t, "## Commands", "## Where it runs")
	path, err := binaryPath()
	must(t, err)
	for i, line := range strings.Split(strings.TrimSpace(script), "\n") {
		if i == 2 {
			must(t, svc.stop())
		}
		line, _, _ = strings.Cut(line, "#")
		cmd := exec.Command("bash", "-c", strings.Replace(line, "petstore ", path+" ", 1))
		cmd.Dir = svc.dir
		out, err := cmd.CombinedOutput()
		want := []string{`^key: (\S{43})\nkeys-file line: sha256:([0-9a-f]{64})\n$`, `^backed up petstore.db to copy.db: 3 pets, integrity ok\n$`, `^restored copy.db to petstore.db: 3 pets, integrity ok\n$`}[i]
		m := regexp.MustCompile(want).FindStringSubmatch(string(out))
		if err != nil || m == nil || i == 0 && fmt.Sprintf("%x", sha256.Sum256([]byte(m[1]))) != m[2] { // the line holds the key's digest
			t.Errorf("%s: %v %q", line, err, out)
		}
	}
}
