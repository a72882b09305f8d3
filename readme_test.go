package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// documents are the project's documents, in the order their examples
// run: README.md, then what it links to.
var documents = []string{"README.md", "docs/clients.md", "docs/operations.md", "docs/performance.md", "docs/development.md"}

// readmeExample is a curl command of a document and the output written
// under it as "# " lines.
type readmeExample struct {
	file string
	line int
	cmd  string
	want []string
}

// readmeCurlExamples finds the curl commands in README.md's sh blocks.
func readmeCurlExamples(readme string) []readmeExample {
	var examples []readmeExample
	lines := strings.Split(readme, "\n")
	inSh := false
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.HasPrefix(l, "```sh"):
			inSh = true
			continue
		case strings.HasPrefix(l, "```"):
			inSh = false
			continue
		}
		if !inSh || !strings.HasPrefix(l, "curl ") {
			continue
		}
		ex := readmeExample{line: i + 1, cmd: l}
		for strings.HasSuffix(ex.cmd, `\`) && i+1 < len(lines) {
			i++
			ex.cmd = strings.TrimSuffix(ex.cmd, `\`) + " " + strings.TrimSpace(lines[i])
		}
		for i+1 < len(lines) && strings.HasPrefix(lines[i+1], "# ") {
			i++
			ex.want = append(ex.want, strings.TrimPrefix(lines[i], "# "))
		}
		examples = append(examples, ex)
	}
	return examples
}

// TestREADMEExamples runs every curl example of README.md, in order, as
// one session against a real server, and checks each against the output
// the README shows: the status line, the headers shown, and the JSON body
// exactly. A README that drifts from the service fails here.
// readmeSession reads how the README's first session starts the server:
// the variables it exports and the flags of the "./petstore ... &" line.
// Only the address (a free port) and the database's directory (a temp
// dir) are changed, so the examples run with the configuration the README
// shows, and nothing else.
func readmeSession(t *testing.T, readme string) (env map[string]string, args []string) {
	t.Helper()
	env = map[string]string{}
	start := regexp.MustCompile(`(?m)^\./petstore (.*) &\s*(#.*)?$`).FindStringSubmatch(readme)
	if start == nil {
		t.Fatal("README.md has no ./petstore ... & line to start its session")
	}
	for _, m := range regexp.MustCompile(`(?m)^export (\w+)=(\S+)`).FindAllStringSubmatch(readme[:strings.Index(readme, start[0])], -1) {
		env[m[1]] = m[2]
	}
	// Redirections (the log to a file) are the shell's, not flags.
	args = slices.DeleteFunc(strings.Fields(start[1]), func(f string) bool { return strings.ContainsAny(f[:1], "<>") || strings.HasPrefix(f, "2>") })
	for i := range args {
		if args[i] == "-db" && i+1 < len(args) {
			args[i+1] = filepath.Join(t.TempDir(), args[i+1])
		}
	}
	return env, args
}

// TestREADMESize: the README is a newcomer's page, read in minutes; what
// an operator or a developer needs is in docs/.
func TestREADMESize(t *testing.T) {
	fi, err := os.Stat("README.md")
	must(t, err)
	if fi.Size() >= 20000 {
		t.Errorf("README.md is %d bytes, want under 20,000: move what is not for a newcomer to docs/", fi.Size())
	}
}

// TestDocumentLinks: every link between the documents reaches a file and,
// where it names one, a heading (as GitHub spells its anchor).
func TestDocumentLinks(t *testing.T) {
	anchors := map[string]bool{}
	for _, doc := range documents {
		text, err := os.ReadFile(doc)
		must(t, err)
		for _, h := range regexp.MustCompile(`(?m)^#+ (.*)$`).FindAllStringSubmatch(string(text), -1) {
			slug := regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(strings.ToLower(h[1]), "")
			anchors[doc+"#"+strings.ReplaceAll(slug, " ", "-")] = true
		}
	}
	for _, doc := range documents {
		text, _ := os.ReadFile(doc)
		for _, l := range regexp.MustCompile(`\]\(([^)#:]*)(#[^)]*)?\)`).FindAllStringSubmatch(string(text), -1) {
			target := filepath.Join(filepath.Dir(doc), l[1])
			if l[1] == "" {
				target = doc
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s links to %s, which is not there", doc, l[0])
			} else if l[2] != "" && !anchors[target+l[2]] {
				t.Errorf("%s links to %s, whose heading is not there", doc, l[0])
			}
		}
	}
}

func TestREADMEExamples(t *testing.T) {
	needTool(t, "curl", "apt-get install curl")
	bash := needTool(t, "bash", "apt-get install bash")
	readme, err := os.ReadFile("README.md")
	must(t, err)
	// The README's session first, then the documents it links to, which
	// go on from where it ends.
	var examples []readmeExample
	for _, doc := range documents {
		text, err := os.ReadFile(doc)
		must(t, err)
		for _, ex := range readmeCurlExamples(string(text)) {
			ex.file = doc
			examples = append(examples, ex)
		}
	}
	if len(examples) < 17 {
		t.Fatalf("found %d curl examples in the documents; the reader is broken", len(examples))
	}
	env, args := readmeSession(t, string(readme))
	base := startService(t, env, args...).url
	for _, ex := range examples {
		where := fmt.Sprintf("%s:%d: %s", ex.file, ex.line, ex.cmd)
		if len(ex.want) == 0 {
			t.Errorf("%s: no output documented under the example", where)
			continue
		}
		cmd := strings.ReplaceAll(ex.cmd, "http://127.0.0.1:8080", base)
		out, err := exec.Command(bash, "-c", "set -o pipefail; "+cmd).Output()
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		got := strings.ReplaceAll(string(out), "\r\n", "\n")
		want := ex.want
		if strings.HasPrefix(want[0], "HTTP/") {
			head, body, _ := strings.Cut(got, "\n\n")
			headLines := strings.Split(head, "\n")
			if headLines[0] != want[0] {
				t.Errorf("%s: status line %q, README says %q", where, headLines[0], want[0])
			}
			header := http.Header{}
			for _, h := range headLines[1:] {
				name, value, _ := strings.Cut(h, ": ")
				header.Add(name, value)
			}
			for _, w := range want[1:] {
				if strings.HasPrefix(w, "{") || strings.HasPrefix(w, "[") {
					checkSameJSON(t, where, w, body)
					continue
				}
				name, value, _ := strings.Cut(w, ": ")
				if !slices.Contains(header.Values(name), value) {
					t.Errorf("%s: header %s is %q, README says %q", where, name, header.Values(name), value)
				}
			}
			continue
		}
		if strings.HasPrefix(want[0], "{") || strings.HasPrefix(want[0], "[") {
			checkSameJSON(t, where, strings.Join(want, "\n"), got)
			continue
		}
		if strings.TrimRight(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: printed %q, README says %q", where, got, strings.Join(want, "\n"))
		}
	}
}

// checkSameJSON compares two JSON texts as values, numbers exact.
func checkSameJSON(t *testing.T, where, want, got string) {
	t.Helper()
	if diff := diffJSON([]byte(want), []byte(got)); diff != "" {
		t.Errorf("%s: body differs from the README (-README +service):\n%s", where, diff)
	}
}

// TestREADMEConfigurationTable: every flag of the service, the variable
// it defaults from and its default have their row in the README's table.
func TestREADMEConfigurationTable(t *testing.T) {
	var usage bytes.Buffer
	must(t, run(context.Background(), []string{"petstore", "-h"}, func(string) string { return "" }, &usage, io.Discard))
	readme, err := os.ReadFile("README.md")
	must(t, err)
	rows := regexp.MustCompile("(?m)^\\| `-[a-z-]+` \\|.*$").FindAllString(string(readme), -1)
	flags := regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(usage.String(), -1)
	if len(flags) < 10 {
		t.Fatalf("found %d flags in the usage; the reader is broken:\n%s", len(flags), usage.String())
	}
	for _, f := range flags {
		name := f[1]
		i := slices.IndexFunc(rows, func(r string) bool { return strings.HasPrefix(r, "| `-"+name+"` |") })
		if i < 0 {
			t.Errorf("README's configuration table has no row for -%s", name)
			continue
		}
		// The flag's variable, as the usage names it, is in the same row.
		entry := regexp.MustCompile(`(?ms)^  -` + name + `\b.*?(\n  -|\z)`).FindString(usage.String())
		if m := regexp.MustCompile(`\(env (PETSTORE_[A-Z_]+)\)`).FindStringSubmatch(entry); m != nil && !strings.Contains(rows[i], "`"+m[1]+"`") {
			t.Errorf("README's row for -%s does not name %s: %s", name, m[1], rows[i])
		}
		// And its default, where the usage gives one as a value.
		if m := regexp.MustCompile(`\(default "?([^")]*)"?\)`).FindStringSubmatch(entry); m != nil {
			if cells := strings.Split(rows[i], "|"); len(cells) < 4 || strings.TrimSpace(cells[3]) != "`"+m[1]+"`" && !strings.Contains(cells[3], m[1]) {
				t.Errorf("README's row for -%s does not give its default %s: %s", name, m[1], rows[i])
			}
		}
	}
	if len(rows) != len(flags) {
		t.Errorf("README's table has %d flag rows, the service %d flags", len(rows), len(flags))
	}
}
