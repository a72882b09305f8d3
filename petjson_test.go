package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestHostileBodies sends the binary 1,000 concurrent creates of about
// 1 MiB each with a valid key, half with their length announced and half
// chunked, and small creates meanwhile; then 16 concurrent bodies of
// thousands of unknown fields. Every announced large body gets 413, every
// chunked one 411, and every unknown-field body a 400 of at most 4 KiB
// that names the first few fields and counts the rest, never a 500, a 503
// or a hang; every small create is stored, also after all of that; the peak
// resident memory stays within 64 MiB.
func TestHostileBodies(t *testing.T) {
	logs := &syncBuffer{}
	// Timeouts well above what a loaded machine needs: this test is about
	// bodies, and a 5 s header timeout cuts off clients whose connection
	// waited that long for a CPU, before any body was read. Its 1,000
	// clients all come from one address.
	base, cmd := startBinary(t, nil, []string{"-db", filepath.Join(t.TempDir(), "pets.db"),
		"-read-header-timeout", "2m", "-read-timeout", "2m", "-write-timeout", "2m"}, logs)
	big := `{"name":"` + strings.Repeat("x", 1<<20-64) + `","categoryId":1}`
	post := func(client *http.Client, body io.Reader) (status int, answer []byte) {
		req, _ := http.NewRequest("POST", base+"/v1/pets", body)
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := client.Do(req)
		if err != nil {
			t.Log(err)
			return -1, nil
		}
		defer resp.Body.Close()
		answer, _ = io.ReadAll(resp.Body)
		return resp.StatusCode, answer
	}
	createSmall := func(client *http.Client, what string) {
		if status, answer := post(client, strings.NewReader(`{"name":"Small","categoryId":1}`)); status != 201 {
			t.Errorf("small create %s: %d %s", what, status, answer)
		}
	}
	const large = 1000
	statuses := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	// Each upload on a connection of its own, as 1,000 clients would be.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: patience}
	for i := range large {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var body io.Reader = strings.NewReader(big) // Content-Length sent
			kind := "announced"
			if i%2 == 1 {
				body = io.MultiReader(strings.NewReader(big)) // chunked
				kind = "chunked"                              // refused unread: 411
			}
			status, _ := post(client, body)
			mu.Lock()
			statuses[fmt.Sprintf("%s %d", kind, status)]++
			mu.Unlock()
		}()
	}
	small := &http.Client{Timeout: patience}
	for i := range 50 {
		createSmall(small, fmt.Sprintf("%d beside the large bodies", i))
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	want := map[string]int{"announced 413": large / 2, "chunked 411": large / 2}
	if diff := cmp.Diff(want, statuses); diff != "" {
		t.Errorf("answers to the large bodies (-want +got; -1: no answer):\n%s", diff)
	}

	var unknown strings.Builder
	unknown.WriteString(`{"name":"Rex","categoryId":1`)
	fields := 0
	for ; unknown.Len() < maxBodyBytes-16; fields++ {
		fmt.Fprintf(&unknown, `,"k%d":0`, fields)
	}
	unknown.WriteString("}")
	largest := 0
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, answer := post(client, strings.NewReader(unknown.String()))
			mu.Lock()
			defer mu.Unlock()
			// The first few fields are named, and the rest counted.
			var e apiError
			json.Unmarshal(answer, &e)
			named := strings.Count(e.Message, "unknown field")
			if status != 400 || e.Code != codeInvalidBody || named < 5 || !strings.HasSuffix(e.Message, fmt.Sprintf("; and %d more problems", fields-named)) ||
				!strings.HasPrefix(e.Message, `unknown field "k0" (a NewPet has name, categoryId and status); unknown field "k1"`) {
				t.Errorf("unknown fields: %d %.300s", status, answer)
			}
			largest = max(largest, len(answer))
		}()
	}
	wg.Wait()
	if largest > 4096 {
		t.Errorf("largest 400 body %d bytes, want at most 4096", largest)
	}
	createSmall(small, "after the hostile bodies")

	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	peak := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(status)
	peakKB, _ := strconv.Atoi(string(peak[1]))
	t.Logf("%d concurrent ~1 MiB creates (answers %v) and 16 bodies of %d bytes of unknown fields (largest answer %d bytes): peak RSS %d kB",
		large, statuses, unknown.Len(), largest, peakKB)
	if peakKB > 64<<10 {
		t.Errorf("peak RSS %d kB, want at most 64 MiB", peakKB)
	}
}

// checkPetEncoding holds appendPetJSON to how encoding/json writes a Pet
// with HTML escaping off, byte for byte.
func checkPetEncoding(t testing.TB, p Pet) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	must(t, enc.Encode(p))
	row := petRow{id: p.ID, name: []byte(p.Name), categoryID: p.CategoryID, status: []byte(p.Status)}
	got, want := appendPetJSON(nil, &row), bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if !bytes.Equal(got, want) {
		t.Errorf("appendPetJSON(%+q)\n got %s\nwant %s", p.Name, got, want)
	}
}

func TestAppendPetJSONMatchesEncodingJSON(t *testing.T) {
	var every []byte
	for c := range 256 {
		every = append(every, byte(c))
	}
	names := []string{"", "Rex", `quote " and backslash \\`, "<b>&amp;</b>", "tab\tnew\nline\rcr\bbs\fff",
		"\x00\x01\x1f\x7f", "é ü 日本 🐕", "\u2028 and \u2029", "bad \xff\xfe utf-8", "\xe2\x80", "\xed\xa0\x80 surrogate",
		string(every), strings.Repeat("a", 100)}
	for _, name := range names {
		for _, p := range []Pet{
			{ID: 1, Name: name, CategoryID: 1, Status: "available"},
			{ID: math.MaxInt64, Name: name, CategoryID: math.MaxInt64, Status: name},
			{ID: -1, Name: name, CategoryID: 0, Status: ""},
		} {
			checkPetEncoding(t, p)
		}
	}
}

func FuzzAppendPetJSON(f *testing.F) {
	f.Add(int64(1), "Rex", int64(1), "available")
	f.Add(int64(9007199254740993), "\u2028\xff\\\"<>&", int64(-5), "\x00")
	f.Fuzz(func(t *testing.T, id int64, name string, categoryID int64, status string) {
		checkPetEncoding(t, Pet{ID: id, Name: name, CategoryID: categoryID, Status: status})
	})
}
