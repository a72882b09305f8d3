package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/big"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testKey is the API key every test server accepts.
const testKey = "test-key-4f1d2c"

// newTestServer starts the real handler on a real listener over a fresh
// database file in a temp dir.
func newTestServer(t testing.TB) (*httptest.Server, *petStore) {
	t.Helper()
	return newTestServerAt(t, filepath.Join(t.TempDir(), "pets.db"))
}

// newTestServerAt is newTestServer over the database file at path.
func newTestServerAt(t testing.TB, path string) (*httptest.Server, *petStore) {
	t.Helper()
	store, err := openStore(path)
	if err != nil {
		t.Fatalf("openStore: %v", err)
	}
	t.Cleanup(func() { store.close() })
	digests, err := parseAPIKeys(testKey)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(newHandler(&server{store: store, keys: newKeyRing(digests), log: quietLogger()}))
	t.Cleanup(srv.Close)
	return srv, store
}

// call is one request a test sends. Unless header says otherwise it
// carries the test key.
type call struct {
	method string
	path   string
	body   string
	header map[string]string
}

// reply is what came back.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// do sends c to srv.
func do(t *testing.T, srv *httptest.Server, c call) reply {
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, srv.URL+c.path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	if c.method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range c.header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", c.method, c.path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := reply{status: resp.StatusCode, header: resp.Header, body: b}
	checkAgainstOpenAPI(t, c.method, c.path, r)
	return r
}

// decodeJSON decodes b keeping numbers exact, so an int64 above 2^53 is
// compared digit for digit.
func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("body is not JSON: %v: %q", err, b)
	}
	return v
}

// checkReply compares a reply with the expected status, the listed
// headers and the body, given as JSON text.
func checkReply(t *testing.T, got reply, status int, header map[string]string, body string) {
	t.Helper()
	if got.status != status {
		t.Errorf("status = %d, want %d; body %s", got.status, status, got.body)
	}
	for k, want := range map[string]string{"Content-Type": "application/json", "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"} {
		if g := got.header.Get(k); g != want {
			t.Errorf("header %s = %q, want %q", k, g, want)
		}
	}
	for k, want := range header {
		if g := strings.Join(got.header.Values(k), ", "); g != want {
			t.Errorf("header %s = %q, want %q", k, g, want)
		}
	}
	if diff := cmp.Diff(decodeJSON(t, []byte(body)), decodeJSON(t, got.body)); diff != "" {
		t.Errorf("body mismatch (-want +got):\n%s", diff)
	}
}

// errBody is the Error body as JSON text.
func errBody(status int, code, message string) string {
	b, _ := json.Marshal(apiError{Code: code, Message: message, Status: status})
	return string(b)
}

// createPets stores pets through the API and returns their bodies.
func createPets(t *testing.T, srv *httptest.Server, bodies ...string) {
	t.Helper()
	for _, b := range bodies {
		if r := do(t, srv, call{method: "POST", path: "/v1/pets", body: b}); r.status != http.StatusCreated {
			t.Fatalf("create %s: status %d: %s", b, r.status, r.body)
		}
	}
}

func TestCreatePet(t *testing.T) {
	long := strings.Repeat("é", 100)
	tests := []struct {
		name   string
		body   string
		header map[string]string
		want   string
	}{
		{"minimal, status defaults to available", `{"name":"Rex","categoryId":1}`, nil,
			`{"id":1,"name":"Rex","categoryId":1,"status":"available"}`},
		{"with status", `{"name":"Tom","categoryId":7,"status":"pending"}`, nil,
			`{"id":1,"name":"Tom","categoryId":7,"status":"pending"}`},
		{"sold", `{"status":"sold","categoryId":2,"name":"Max"}`, nil,
			`{"id":1,"name":"Max","categoryId":2,"status":"sold"}`},
		{"categoryId above 2^53 kept exactly", `{"name":"Big","categoryId":9007199254740993}`, nil,
			`{"id":1,"name":"Big","categoryId":9007199254740993,"status":"available"}`},
		{"categoryId at int64 max", `{"name":"Max","categoryId":9223372036854775807}`, nil,
			`{"id":1,"name":"Max","categoryId":9223372036854775807,"status":"available"}`},
		{"100 characters of name, multibyte", `{"name":"` + long + `","categoryId":1}`, nil,
			`{"id":1,"name":"` + long + `","categoryId":1,"status":"available"}`},
		{"HTML and quotes not mangled", `{"name":"<Rex & \"Co\">","categoryId":1}`, nil,
			`{"id":1,"name":"<Rex & \"Co\">","categoryId":1,"status":"available"}`},
		{"charset parameter", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": "application/json; charset=UTF-8"},
			`{"id":1,"name":"Rex","categoryId":1,"status":"available"}`},
		{"no Content-Type read as JSON", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": ""},
			`{"id":1,"name":"Rex","categoryId":1,"status":"available"}`},
		{"whitespace around the object", " \n\t{\"name\":\"Rex\",\"categoryId\":1}\r\n", nil,
			`{"id":1,"name":"Rex","categoryId":1,"status":"available"}`},
		{"body of exactly 1 MiB", padTo(`{"name":"Rex","categoryId":1}`, maxBodyBytes), nil,
			`{"id":1,"name":"Rex","categoryId":1,"status":"available"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := newTestServer(t)
			got := do(t, srv, call{method: "POST", path: "/v1/pets", body: tt.body, header: tt.header})
			checkReply(t, got, http.StatusCreated, map[string]string{"Location": "/v1/pets/1"}, tt.want)

			// What was acknowledged is what is stored.
			got = do(t, srv, call{method: "GET", path: "/v1/pets/1"})
			checkReply(t, got, http.StatusOK, nil, tt.want)
			got = do(t, srv, call{method: "GET", path: "/v1/pets"})
			checkReply(t, got, http.StatusOK, nil, "["+tt.want+"]")
		})
	}
}

// padTo pads a JSON body with trailing spaces to exactly n bytes.
func padTo(body string, n int) string {
	return body + strings.Repeat(" ", n-len(body))
}

func TestCreatePetRejects(t *testing.T) {
	const catRange = "categoryId must be a JSON integer from 1 to 9223372036854775807"
	const statusEnum = "status must be one of available, pending, sold (or omitted, for available), got "
	bad := func(msg string) string { return errBody(400, codeInvalidBody, msg) }
	tests := []struct {
		name   string
		body   string
		header map[string]string
		status int
		want   string
	}{
		{"empty body", "", nil, 400, bad(`request body is empty; send a JSON object such as {"name":"Rex","categoryId":1}`)},
		{"only whitespace", " \n ", nil, 400, bad(`request body is empty; send a JSON object such as {"name":"Rex","categoryId":1}`)},
		{"malformed JSON", `{"name":"Rex",`, nil, 400, bad("request body is not valid JSON: it ends before the object is complete")},
		{"unclosed object", `{"name":"Rex","categoryId":1`, nil, 400, bad("request body is not valid JSON: it ends before the object is complete")},
		{"not JSON at all", `name=Rex`, nil, 400, bad("request body is not valid JSON: invalid character 'a' in literal null (expecting 'u')")},
		{"array", `[{"name":"Rex","categoryId":1}]`, nil, 400, bad("request body must be a JSON object")},
		{"string", `"Rex"`, nil, 400, bad("request body must be a JSON object")},
		{"null", `null`, nil, 400, bad("request body must be a JSON object")},
		{"data after the object", `{"name":"Rex","categoryId":1} {"name":"Tom","categoryId":1}`, nil, 400,
			bad("request body has data after the JSON object; send exactly one object")},
		{"garbage after the object", `{"name":"Rex","categoryId":1}x`, nil, 400,
			bad("request body has data after the JSON object; send exactly one object")},
		{"invalid UTF-8", "{\"name\":\"R\xffx\",\"categoryId\":1}", nil, 400, bad("request body is not valid UTF-8")},
		{"duplicate field", `{"name":"Rex","name":"Tom","categoryId":1}`, nil, 400, bad(`field "name" appears more than once`)},
		{"empty object", `{}`, nil, 400, bad("name is required; categoryId is required")},
		{"missing name", `{"categoryId":1}`, nil, 400, bad("name is required")},
		{"null name", `{"name":null,"categoryId":1}`, nil, 400, bad("name is required")},
		{"missing categoryId", `{"name":"Rex"}`, nil, 400, bad("categoryId is required")},
		{"null categoryId", `{"name":"Rex","categoryId":null}`, nil, 400, bad("categoryId is required")},
		{"name not a string", `{"name":42,"categoryId":1}`, nil, 400, bad("name must be a string")},
		{"name an object", `{"name":{"first":"Rex"},"categoryId":1}`, nil, 400, bad("name must be a string")},
		{"empty name", `{"name":"","categoryId":1}`, nil, 400, bad("name must not be empty or only whitespace")},
		{"whitespace name", `{"name":" \t ","categoryId":1}`, nil, 400, bad("name must not be empty or only whitespace")},
		{"name of 101 characters", `{"name":"` + strings.Repeat("a", 101) + `","categoryId":1}`, nil, 400,
			bad("name must be at most 100 characters, got 101")},
		{"name with newline", `{"name":"Rex\nTom","categoryId":1}`, nil, 400,
			bad("name must not contain control characters (such as tab or newline)")},
		{"name with NUL", `{"name":"Rex\u0000","categoryId":1}`, nil, 400,
			bad("name must not contain control characters (such as tab or newline)")},
		{"categoryId as string", `{"name":"Rex","categoryId":"1"}`, nil, 400, bad(catRange + ", not a string")},
		{"categoryId fraction", `{"name":"Rex","categoryId":1.5}`, nil, 400, bad(catRange + `, got "1.5"`)},
		{"categoryId 1.0", `{"name":"Rex","categoryId":1.0}`, nil, 400, bad(catRange + `, got "1.0"`)},
		{"categoryId exponent", `{"name":"Rex","categoryId":1e3}`, nil, 400, bad(catRange + `, got "1e3"`)},
		{"categoryId zero", `{"name":"Rex","categoryId":0}`, nil, 400, bad(catRange + `, got "0"`)},
		{"categoryId negative", `{"name":"Rex","categoryId":-3}`, nil, 400, bad(catRange + `, got "-3"`)},
		{"categoryId above int64", `{"name":"Rex","categoryId":9223372036854775808}`, nil, 400,
			bad(catRange + `, got "9223372036854775808"`)},
		{"categoryId boolean", `{"name":"Rex","categoryId":true}`, nil, 400, bad(catRange + `, got "true"`)},
		{"unknown status", `{"name":"Rex","categoryId":1,"status":"lost"}`, nil, 400, bad(statusEnum + `"\"lost\""`)},
		{"status in capitals", `{"name":"Rex","categoryId":1,"status":"Sold"}`, nil, 400, bad(statusEnum + `"\"Sold\""`)},
		{"null status", `{"name":"Rex","categoryId":1,"status":null}`, nil, 400, bad(statusEnum + `"null"`)},
		{"status not a string", `{"name":"Rex","categoryId":1,"status":1}`, nil, 400, bad(statusEnum + `"1"`)},
		{"client sends id", `{"id":5,"name":"Rex","categoryId":1}`, nil, 400, bad("id must not be sent: the service assigns it")},
		{"unknown field", `{"name":"Rex","categoryId":1,"colour":"brown"}`, nil, 400,
			bad(`unknown field "colour" (a NewPet has name, categoryId and status)`)},
		{"misspelt field", `{"name":"Rex","categoryID":1}`, nil, 400,
			bad(`unknown field "categoryID" (a NewPet has name, categoryId and status); categoryId is required`)},
		{"every problem at once", `{"id":1,"name":"","categoryId":"x","status":"gone"}`, nil, 400,
			bad(`id must not be sent: the service assigns it; name must not be empty or only whitespace; ` + catRange + `, not a string; ` + statusEnum + `"\"gone\""`)},
		{"text/plain", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": "text/plain"}, 415,
			errBody(415, codeUnsupportedMediaType, "send the body as JSON with the header Content-Type: application/json (curl: --json)")},
		{"form", `name=Rex`, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415,
			errBody(415, codeUnsupportedMediaType, "send the body as JSON with the header Content-Type: application/json (curl: --json)")},
		{"JSON in another charset", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": "application/json; charset=latin1"}, 415,
			errBody(415, codeUnsupportedMediaType, "send the body as JSON with the header Content-Type: application/json (curl: --json)")},
		{"unparsable Content-Type", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": "application/json; ;"}, 415,
			errBody(415, codeUnsupportedMediaType, "send the body as JSON with the header Content-Type: application/json (curl: --json)")},
		{"one byte over 1 MiB", padTo(`{"name":"Rex","categoryId":1}`, maxBodyBytes+1), nil, 413,
			errBody(413, codeBodyTooLarge, "request body is larger than 1048576 bytes (1 MiB)")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := newTestServer(t)
			got := do(t, srv, call{method: "POST", path: "/v1/pets", body: tt.body, header: tt.header})
			checkReply(t, got, tt.status, map[string]string{"Location": ""}, tt.want)
			// Nothing was stored.
			checkReply(t, do(t, srv, call{method: "GET", path: "/v1/pets"}), 200, nil, `[]`)
		})
	}
}

// TestCreatePetTooLargeUnknownLength covers a chunked body, whose size is
// only known once it has been read past the limit.
func TestCreatePetTooLargeUnknownLength(t *testing.T) {
	srv, _ := newTestServer(t)
	body := io.MultiReader(strings.NewReader(`{"name":"`), strings.NewReader(strings.Repeat("a", maxBodyBytes)), strings.NewReader(`","categoryId":1}`))
	req, _ := http.NewRequest("POST", srv.URL+"/v1/pets", body)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	checkReply(t, reply{resp.StatusCode, resp.Header, b}, 413, nil,
		errBody(413, codeBodyTooLarge, "request body is larger than 1048576 bytes (1 MiB)"))
}

func TestListPets(t *testing.T) {
	srv, _ := newTestServer(t)
	// 25 pets: ids 1..25; every third is pending, every fifth sold.
	var all []string
	statusOf := func(id int) string {
		switch {
		case id%5 == 0:
			return "sold"
		case id%3 == 0:
			return "pending"
		}
		return "available"
	}
	for id := 1; id <= 25; id++ {
		body := fmt.Sprintf(`{"name":"pet %d","categoryId":%d,"status":"%s"}`, id, id%4+1, statusOf(id))
		createPets(t, srv, body)
		all = append(all, fmt.Sprintf(`{"id":%d,"name":"pet %d","categoryId":%d,"status":"%s"}`, id, id, id%4+1, statusOf(id)))
	}
	page := func(ids ...int) string {
		var items []string
		for _, id := range ids {
			items = append(items, all[id-1])
		}
		return "[" + strings.Join(items, ",") + "]"
	}
	span := func(from, to int) []int {
		var ids []int
		for id := from; id <= to; id++ {
			ids = append(ids, id)
		}
		return ids
	}
	bad := func(msg string) string { return errBody(400, codeInvalidParameter, msg) }

	tests := []struct {
		name   string
		query  string
		status int
		link   string
		want   string
	}{
		{"default limit is 20", "", 200, `</v1/pets?limit=20&after=20>; rel="next"`, page(span(1, 20)...)},
		{"limit", "?limit=5", 200, `</v1/pets?limit=5&after=5>; rel="next"`, page(span(1, 5)...)},
		{"after", "?limit=5&after=5", 200, `</v1/pets?limit=5&after=10>; rel="next"`, page(span(6, 10)...)},
		{"last page, exactly full, has no next link", "?limit=5&after=20", 200, "", page(span(21, 25)...)},
		{"last page, short", "?limit=20&after=20", 200, "", page(span(21, 25)...)},
		{"limit 100 takes all", "?limit=100", 200, "", page(span(1, 25)...)},
		{"after past the end", "?after=1000", 200, "", `[]`},
		{"after 0 is the start", "?after=0&limit=1", 200, `</v1/pets?limit=1&after=1>; rel="next"`, page(1)},
		{"status filter keeps status in the link", "?status=sold&limit=2", 200,
			`</v1/pets?limit=2&status=sold&after=10>; rel="next"`, page(5, 10)},
		{"status filter, next page", "?status=sold&limit=2&after=10", 200,
			`</v1/pets?limit=2&status=sold&after=20>; rel="next"`, page(15, 20)},
		{"status filter, last page", "?status=sold&limit=2&after=20", 200, "", page(25)},
		{"pending", "?status=pending", 200, "", page(3, 6, 9, 12, 18, 21, 24)},
		{"percent-encoded value", "?status=%73old&limit=1&after=24", 200, "", page(25)},
		{"limit 0", "?limit=0", 400, "", bad(`limit must be an integer from 1 to 100, got "0"`)},
		{"limit 101", "?limit=101", 400, "", bad(`limit must be an integer from 1 to 100, got "101"`)},
		{"limit -1", "?limit=-1", 400, "", bad(`limit must be an integer from 1 to 100, got "-1"`)},
		{"limit abc", "?limit=abc", 400, "", bad(`limit must be an integer from 1 to 100, got "abc"`)},
		{"limit 1.5", "?limit=1.5", 400, "", bad(`limit must be an integer from 1 to 100, got "1.5"`)},
		{"limit empty", "?limit=", 400, "", bad(`limit must be an integer from 1 to 100, got ""`)},
		{"limit with plus", "?limit=%2B5", 400, "", bad(`limit must be an integer from 1 to 100, got "+5"`)},
		{"limit huge", "?limit=99999999999999999999", 400, "", bad(`limit must be an integer from 1 to 100, got "99999999999999999999"`)},
		{"unknown status", "?status=lost", 400, "", bad(`status must be one of available, pending, sold, got "lost"`)},
		{"status in capitals", "?status=SOLD", 400, "", bad(`status must be one of available, pending, sold, got "SOLD"`)},
		{"empty status", "?status=", 400, "", bad(`status must be one of available, pending, sold, got ""`)},
		{"after abc", "?after=abc", 400, "", bad(`after must be the id of the last pet seen (an integer from 0 to 9223372036854775807), got "abc"`)},
		{"after negative", "?after=-1", 400, "", bad(`after must be the id of the last pet seen (an integer from 0 to 9223372036854775807), got "-1"`)},
		{"after above int64", "?after=9223372036854775808", 400, "", bad(`after must be the id of the last pet seen (an integer from 0 to 9223372036854775807), got "9223372036854775808"`)},
		{"unknown parameter", "?stauts=sold", 400, "", bad(`unknown query parameter "stauts"; known: limit, status, after`)},
		{"repeated parameter", "?limit=1&limit=2", 400, "", bad(`query parameter limit is given more than once`)},
		{"malformed escape", "?limit=%zz", 400, "", bad(`malformed query string: use name=value pairs joined by &, percent-encoded`)},
		{"semicolon separator", "?limit=1;status=sold", 400, "", bad(`malformed query string: use name=value pairs joined by &, percent-encoded`)},
		{"malformed escape after an unknown name", "?zzz=1&limit=%zz", 400, "", bad(`malformed query string: use name=value pairs joined by &, percent-encoded`)},
		{"empty pairs are ignored", "?&&limit=1&&after=24&", 200, "", page(25)},
		{"name without a value", "?limit", 400, "", bad(`limit must be an integer from 1 to 100, got ""`)},
		{"plus is a space", "?status=sold+", 400, "", bad(`status must be one of available, pending, sold, got "sold "`)},
		{"encoded name", "?%6Cimit=1&after=24", 200, "", page(25)},
		{"first bad name in sorted order", "?zeta=1&limit=1&limit=2&alpha=1", 400, "", bad(`unknown query parameter "alpha"; known: limit, status, after`)},
		{"repeated before unknown in sorted order", "?status=sold&zeta=1&status=sold", 400, "", bad(`query parameter status is given more than once`)},
		{"empty name", "?=5", 400, "", bad(`unknown query parameter ""; known: limit, status, after`)},
		{"empty name sorts first", "?zeta=1&=5", 400, "", bad(`unknown query parameter ""; known: limit, status, after`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := do(t, srv, call{method: "GET", path: "/v1/pets" + tt.query})
			checkReply(t, got, tt.status, map[string]string{"Link": tt.link}, tt.want)
		})
	}
}

// TestListPetsFollowLinks walks the whole catalogue by following next
// links, as a client would, and must see every pet exactly once.
func TestListPetsFollowLinks(t *testing.T) {
	srv, _ := newTestServer(t)
	for i := 1; i <= 23; i++ {
		status := []string{"available", "pending", "sold"}[i%3]
		createPets(t, srv, fmt.Sprintf(`{"name":"p%d","categoryId":1,"status":"%s"}`, i, status))
	}
	linkRE := regexp.MustCompile(`^<(/v1/pets\?[^>]*)>; rel="next"$`)
	for _, tt := range []struct {
		start string
		want  int
	}{{"/v1/pets?limit=4", 23}, {"/v1/pets?limit=3&status=pending", 8}, {"/v1/pets?limit=7&status=available", 7}} {
		seen := map[int64]bool{}
		next := tt.start
		for pages := 0; next != ""; pages++ {
			if pages > 30 {
				t.Fatalf("%s: more pages than pets", tt.start)
			}
			got := do(t, srv, call{method: "GET", path: next})
			if got.status != 200 {
				t.Fatalf("GET %s: %d %s", next, got.status, got.body)
			}
			var pets []Pet
			if err := json.Unmarshal(got.body, &pets); err != nil {
				t.Fatal(err)
			}
			for _, p := range pets {
				if seen[p.ID] {
					t.Errorf("%s: pet %d seen twice", tt.start, p.ID)
				}
				seen[p.ID] = true
			}
			next = ""
			if l := got.header.Get("Link"); l != "" {
				m := linkRE.FindStringSubmatch(l)
				if m == nil {
					t.Fatalf("Link %q is not a relative next link", l)
				}
				next = m[1]
			}
		}
		if len(seen) != tt.want {
			t.Errorf("%s: saw %d pets, want %d", tt.start, len(seen), tt.want)
		}
	}
}

func TestGetPet(t *testing.T) {
	srv, _ := newTestServer(t)
	createPets(t, srv, `{"name":"Rex","categoryId":3,"status":"sold"}`)
	deprecation := map[string]string{
		"Deprecation": "@1795305600",
		"Sunset":      "Thu, 05 Dec 2030 00:00:00 GMT",
		"Link":        `</v1/pets>; rel="successor-version"`,
	}
	badID := func(v string) string {
		return errBody(400, codeInvalidParameter, "petId must be a pet's id, an integer from 1 to 9223372036854775807, got "+v)
	}
	tests := []struct {
		name   string
		path   string
		header map[string]string
		status int
		want   string
	}{
		{"found", "/v1/pets/1", nil, 200, `{"id":1,"name":"Rex","categoryId":3,"status":"sold"}`},
		{"leading zero is the same id", "/v1/pets/001", nil, 200, `{"id":1,"name":"Rex","categoryId":3,"status":"sold"}`},
		{"unknown id", "/v1/pets/2", nil, 404, errBody(404, codeNotFound, "no pet with id 2")},
		{"int64 max, unknown", "/v1/pets/9223372036854775807", nil, 404, errBody(404, codeNotFound, "no pet with id 9223372036854775807")},
		{"zero", "/v1/pets/0", nil, 400, badID(`"0"`)},
		{"negative", "/v1/pets/-1", nil, 400, badID(`"-1"`)},
		{"not a number", "/v1/pets/rex", nil, 400, badID(`"rex"`)},
		{"fraction", "/v1/pets/1.5", nil, 400, badID(`"1.5"`)},
		{"above int64", "/v1/pets/9223372036854775808", nil, 400, badID(`"9223372036854775808"`)},
		{"no key", "/v1/pets/1", map[string]string{"Authorization": ""}, 401,
			errBody(401, codeUnauthorized, "missing API key: send the header Authorization: Bearer <key>")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := do(t, srv, call{method: "GET", path: tt.path, header: tt.header})
			checkReply(t, got, tt.status, deprecation, tt.want)
		})
	}
}

func TestAuth(t *testing.T) {
	srv, _ := newTestServer(t)
	const missing = "missing API key: send the header Authorization: Bearer <key>"
	const malformed = "malformed Authorization header: expected Authorization: Bearer <key>"
	challenge := `Bearer realm="petstore"`
	invalid := `Bearer realm="petstore", error="invalid_token"`
	tests := []struct {
		name      string
		auth      string
		status    int
		challenge string
		want      string
	}{
		{"valid", "Bearer " + testKey, 200, "", `[]`},
		{"scheme in lower case", "bearer " + testKey, 200, "", `[]`},
		{"scheme in capitals", "BEARER " + testKey, 200, "", `[]`},
		{"missing", "", 401, challenge, errBody(401, codeUnauthorized, missing)},
		{"wrong key", "Bearer not-the-key", 401, invalid, errBody(401, codeUnauthorized, "invalid API key")},
		{"key with a suffix", "Bearer " + testKey + "x", 401, invalid, errBody(401, codeUnauthorized, "invalid API key")},
		{"key prefix", "Bearer " + testKey[:5], 401, invalid, errBody(401, codeUnauthorized, "invalid API key")},
		{"basic scheme", "Basic dXNlcjpwYXNz", 401, challenge, errBody(401, codeUnauthorized, malformed)},
		{"bare key", testKey, 401, challenge, errBody(401, codeUnauthorized, malformed)},
		{"scheme without key", "Bearer", 401, challenge, errBody(401, codeUnauthorized, malformed)},
		{"scheme and space", "Bearer ", 401, challenge, errBody(401, codeUnauthorized, malformed)},
		{"two tokens", "Bearer " + testKey + " extra", 401, challenge, errBody(401, codeUnauthorized, malformed)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := do(t, srv, call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": tt.auth}})
			checkReply(t, got, tt.status, map[string]string{"WWW-Authenticate": tt.challenge}, tt.want)
			if bytes.Contains(got.body, []byte(testKey)) {
				t.Errorf("body echoes the key: %s", got.body)
			}
		})
	}

	t.Run("two Authorization headers", func(t *testing.T) {
		req, _ := http.NewRequest("GET", srv.URL+"/v1/pets", nil)
		req.Header.Add("Authorization", "Bearer "+testKey)
		req.Header.Add("Authorization", "Bearer "+testKey)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		checkReply(t, reply{resp.StatusCode, resp.Header, b}, 401, map[string]string{"WWW-Authenticate": challenge}, errBody(401, codeUnauthorized, malformed))
	})

	// Every /v1 path needs the key, including ones that do not exist and
	// methods that are not allowed.
	for _, c := range []call{
		{method: "GET", path: "/v1/pets"},
		{method: "POST", path: "/v1/pets", body: `{"name":"Rex","categoryId":1}`},
		{method: "GET", path: "/v1/pets/1"},
		{method: "GET", path: "/v1/store/orders"},
		{method: "DELETE", path: "/v1/pets"},
		{method: "GET", path: "/v1/nothing"},
		{method: "GET", path: "/v1"},
	} {
		t.Run("no key "+c.method+" "+c.path, func(t *testing.T) {
			c.header = map[string]string{"Authorization": ""}
			got := do(t, srv, c)
			checkReply(t, got, 401, map[string]string{"WWW-Authenticate": challenge}, errBody(401, codeUnauthorized, missing))
		})
	}
	// Nothing was created without a key.
	checkReply(t, do(t, srv, call{method: "GET", path: "/v1/pets"}), 200, nil, `[]`)
}

func TestParseAPIKeys(t *testing.T) {
	tests := []struct {
		list    string
		want    []string
		wantErr string
	}{
		{"", nil, ""},
		{" , ,", nil, ""},
		{"one", []string{"one"}, ""},
		{" one , two ,, three ", []string{"one", "two", "three"}, ""},
		{"good, bad key", nil, "API key number 2 has a character a client cannot send in an Authorization header (allowed: printable ASCII without spaces)"},
		{"ключ", nil, "API key number 1 has a character a client cannot send in an Authorization header (allowed: printable ASCII without spaces)"},
	}
	for _, tt := range tests {
		got, err := parseAPIKeys(tt.list)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("parseAPIKeys(%q) error = %v, want %q", tt.list, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseAPIKeys(%q): %v", tt.list, err)
			continue
		}
		ring := newKeyRing(got)
		for _, k := range tt.want {
			if !ring.acceptsDigest(sha256Sum(k)) {
				t.Errorf("parseAPIKeys(%q) does not accept %q", tt.list, k)
			}
		}
		if len(got) != len(tt.want) {
			t.Errorf("parseAPIKeys(%q) has %d keys, want %d", tt.list, len(got), len(tt.want))
		}
		if ring.acceptsDigest(sha256Sum("")) || ring.acceptsDigest(sha256Sum(" one")) {
			t.Errorf("parseAPIKeys(%q) accepts a key it should not", tt.list)
		}
	}
}

func TestRouting(t *testing.T) {
	srv, _ := newTestServer(t)
	deprecation := map[string]string{"Deprecation": "@1795305600", "Sunset": "Thu, 05 Dec 2030 00:00:00 GMT"}
	tests := []struct {
		name   string
		c      call
		status int
		header map[string]string
		want   string
	}{
		{"unknown path", call{method: "GET", path: "/nothing"}, 404, nil, errBody(404, codeNotFound, "no such resource: /nothing")},
		{"root", call{method: "GET", path: "/"}, 404, nil, errBody(404, codeNotFound, "no such resource: /")},
		{"unknown /v1 path", call{method: "GET", path: "/v1/animals"}, 404, nil, errBody(404, codeNotFound, "no such resource: /v1/animals")},
		{"/v1 itself, not redirected", call{method: "GET", path: "/v1"}, 404, nil, errBody(404, codeNotFound, "no such resource: /v1")},
		{"trailing slash", call{method: "GET", path: "/v1/pets/"}, 404, nil, errBody(404, codeNotFound, "no such resource: /v1/pets/")},
		{"double slash, not redirected", call{method: "GET", path: "/v1//pets"}, 404, nil, errBody(404, codeNotFound, "no such resource: /v1//pets")},
		{"dot segment, not redirected", call{method: "GET", path: "/v1/./pets"}, 404, nil, errBody(404, codeNotFound, "no such resource: /v1/./pets")},
		{"unversioned path", call{method: "GET", path: "/pets"}, 404, nil, errBody(404, codeNotFound, "no such resource: /pets")},
		{"DELETE /v1/pets", call{method: "DELETE", path: "/v1/pets"}, 405, map[string]string{"Allow": "GET, HEAD, POST"},
			errBody(405, codeMethodNotAllowed, "method DELETE is not allowed on /v1/pets; allowed: GET, HEAD, POST")},
		{"PUT /v1/pets/1", call{method: "PUT", path: "/v1/pets/1", body: `{}`}, 405, map[string]string{"Allow": "GET, HEAD", "Deprecation": deprecation["Deprecation"], "Sunset": deprecation["Sunset"]},
			errBody(405, codeMethodNotAllowed, "method PUT is not allowed on /v1/pets/1; allowed: GET, HEAD")},
		{"POST /v1/pets/1", call{method: "POST", path: "/v1/pets/1", body: `{}`}, 405, map[string]string{"Allow": "GET, HEAD"},
			errBody(405, codeMethodNotAllowed, "method POST is not allowed on /v1/pets/1; allowed: GET, HEAD")},
		{"POST /healthz", call{method: "POST", path: "/healthz", body: `{}`}, 405, map[string]string{"Allow": "GET, HEAD"},
			errBody(405, codeMethodNotAllowed, "method POST is not allowed on /healthz; allowed: GET, HEAD")},
		{"DELETE /v1/store/orders", call{method: "DELETE", path: "/v1/store/orders"}, 405, map[string]string{"Allow": "GET, HEAD"},
			errBody(405, codeMethodNotAllowed, "method DELETE is not allowed on /v1/store/orders; allowed: GET, HEAD")},
		{"orders are not implemented", call{method: "GET", path: "/v1/store/orders"}, 501, nil,
			errBody(501, codeNotImplemented, "GET /v1/store/orders is named by the specification but not specified, so it is not implemented")},
		{"health needs no key", call{method: "GET", path: "/healthz", header: map[string]string{"Authorization": ""}}, 200, nil, `{"status":"ok"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkReply(t, do(t, srv, tt.c), tt.status, tt.header, tt.want)
		})
	}

	t.Run("HEAD is GET without a body", func(t *testing.T) {
		got := do(t, srv, call{method: "HEAD", path: "/v1/pets"})
		if got.status != 200 || len(got.body) != 0 || got.header.Get("Content-Type") != "application/json" {
			t.Errorf("HEAD /v1/pets = %d %q %q", got.status, got.header.Get("Content-Type"), got.body)
		}
	})
}

func TestHealthUnavailable(t *testing.T) {
	srv, store := newTestServer(t)
	store.close()
	checkReply(t, do(t, srv, call{method: "GET", path: "/healthz"}), 503, nil, errBody(503, codeUnavailable, "database unavailable"))
	// A store failure on the API is a 500 that says nothing of the cause,
	// only the request id to quote.
	id := map[string]string{"X-Request-Id": "back-office-42"}
	checkReply(t, do(t, srv, call{method: "GET", path: "/v1/pets", header: id}), 500, id,
		errBody(500, codeInternalError, "internal error (request id back-office-42)"))
	checkReply(t, do(t, srv, call{method: "POST", path: "/v1/pets", body: `{"name":"Rex","categoryId":1}`, header: id}), 500, id,
		errBody(500, codeInternalError, "internal error (request id back-office-42)"))
}

func TestPanicIsJSON500(t *testing.T) {
	var logged bytes.Buffer
	log := newLogger(&logged, "text", slog.LevelInfo)
	h := secureHeaders(logRequests(log, recoverPanics(log, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("boom: secret detail")
	}))))
	srv := httptest.NewServer(h)
	defer srv.Close()
	got := do(t, srv, call{method: "GET", path: "/v1/pets", header: map[string]string{"X-Request-Id": "req-7"}})
	checkReply(t, got, 500, map[string]string{"X-Request-Id": "req-7"}, errBody(500, codeInternalError, "internal error (request id req-7)"))
	for _, want := range []string{`msg="panic in handler" method=GET path=/v1/pets panic="boom: secret detail" request_id=req-7`,
		`msg=request method=GET path=/v1/pets status=500 `} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logged.String())
		}
	}
}

// TestConcurrentCreates sends many creates at once: none may fail with
// "database is locked", and every acknowledged pet is stored once.
func TestConcurrentCreates(t *testing.T) {
	srv, _ := newTestServer(t)
	const workers, each = 16, 20
	var wg sync.WaitGroup
	errs := make(chan string, workers*each)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				req, _ := http.NewRequest("POST", srv.URL+"/v1/pets", strings.NewReader(fmt.Sprintf(`{"name":"w%d-%d","categoryId":1}`, w, i)))
				req.Header.Set("Authorization", "Bearer "+testKey)
				resp, err := srv.Client().Do(req)
				if err != nil {
					errs <- err.Error()
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 201 {
					errs <- fmt.Sprintf("%d %s", resp.StatusCode, b)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	names := map[string]bool{}
	for _, p := range walkCatalogue(t, func(path string) reply { return do(t, srv, call{method: "GET", path: path}) }) {
		names[p.Name] = true
	}
	if len(names) != workers*each {
		t.Errorf("stored %d distinct pets, want %d", len(names), workers*each)
	}
}

func TestStore(t *testing.T) {
	t.Run("database file is private", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "pets.db")
		s, err := openStore(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("mode = %v, want 0600", fi.Mode().Perm())
		}
	})
	t.Run("schema version is recorded and reopening keeps data", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "pets.db")
		s, err := openStore(path)
		if err != nil {
			t.Fatal(err)
		}
		p, _, err := s.createPet(context.Background(), createRequest{pet: NewPet{Name: "Rex", CategoryID: 1, Status: "available"}})
		if err != nil {
			t.Fatal(err)
		}
		s.close()
		s, err = openStore(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		got, err := storedPet(s, p.ID)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(p, got, cmp.AllowUnexported()); diff != "" {
			t.Errorf("after reopen (-want +got):\n%s", diff)
		}
		var version int
		s.readers.QueryRow("PRAGMA user_version").Scan(&version)
		if version != len(migrations) {
			t.Errorf("user_version = %d, want %d", version, len(migrations))
		}
		var mode string
		s.readers.QueryRow("PRAGMA journal_mode").Scan(&mode)
		if mode != "wal" {
			t.Errorf("journal_mode = %q, want wal", mode)
		}
	})
	t.Run("refuses a newer schema", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "pets.db")
		db, _ := sql.Open("sqlite3", path)
		if _, err := db.Exec("PRAGMA user_version = 99"); err != nil {
			t.Fatal(err)
		}
		db.Close()
		_, err := openStore(path)
		want := fmt.Sprintf("open database %s: schema version 99 is newer than this build understands (%d); use a newer petstore", path, len(migrations))
		if err == nil || err.Error() != want {
			t.Errorf("openStore error = %v, want %q", err, want)
		}
	})
	t.Run("status filter reads only the covering index, in id order", func(t *testing.T) {
		s, err := openStore(filepath.Join(t.TempDir(), "pets.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		var plan strings.Builder
		rows, err := s.readers.Query("EXPLAIN QUERY PLAN SELECT id, name, category_id, status FROM pets WHERE status = ? AND id > ? ORDER BY id LIMIT ?", "sold", 0, 20)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, parent, notused int
			var detail string
			rows.Scan(&id, &parent, &notused, &detail)
			plan.WriteString(detail + "\n")
		}
		rows.Close()
		if !strings.Contains(plan.String(), "COVERING INDEX pets_status_cover") || strings.Contains(plan.String(), "TEMP B-TREE") {
			t.Errorf("plan does not use the index without a sort:\n%s", plan.String())
		}
	})
}

// syncBuffer is a bytes.Buffer safe for run's logger and the test to
// share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startRun runs the whole program in-process and returns its base URL
// once it listens, and a function that stops it and returns run's error.
func startRun(t *testing.T, args []string, env map[string]string) (baseURL string, stderr *syncBuffer, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stderr = &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"petstore"}, args...), func(k string) string { return env[k] }, io.Discard, stderr)
	}()
	// The "listening" line in text or JSON format; at a level above info
	// there is none, and the caller names a fixed address in args.
	addrRE := regexp.MustCompile(`msg=listening addr=(https?://\S+)|"msg":"listening","addr":"(https?://[^"]+)"`)
	fixed := ""
	for i, a := range args {
		if a == "-addr" && i+1 < len(args) && !strings.HasSuffix(args[i+1], ":0") {
			fixed = "http://" + args[i+1]
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := addrRE.FindStringSubmatch(stderr.String()); m != nil {
			baseURL = m[1] + m[2]
			break
		}
		if fixed != "" {
			if resp, err := http.Get(fixed + "/healthz"); err == nil {
				resp.Body.Close()
				baseURL = fixed
				break
			}
		}
		select {
		case err := <-done:
			cancel()
			t.Fatalf("run exited before listening: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("run did not start listening:\n%s", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(15 * time.Second):
			t.Fatal("run did not return after cancel")
			return nil
		}
	}
	t.Cleanup(func() { stop() })
	return baseURL, stderr, stop
}

// send makes one request to a running service.
func send(t *testing.T, method, url, key, body string) reply {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, r)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	got := reply{resp.StatusCode, resp.Header, b}
	checkAgainstOpenAPI(t, method, req.URL.RequestURI(), got)
	return got
}

// TestRun drives the real program: start, create, list, stop, and the data
// is still there after a restart.
func TestRun(t *testing.T) {
	db := filepath.Join(t.TempDir(), "run.db")
	env := map[string]string{"PETSTORE_API_KEYS": " k1 , " + testKey + " ,", "PETSTORE_DB": db}
	base, stderr, stop := startRun(t, []string{"-addr", "127.0.0.1:0"}, env)

	checkReply(t, send(t, "GET", base+"/healthz", "", ""), 200, nil, `{"status":"ok"}`)
	checkReply(t, send(t, "POST", base+"/v1/pets", "k1", `{"name":"Rex","categoryId":1}`), 201,
		map[string]string{"Location": "/v1/pets/1"}, `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`)
	checkReply(t, send(t, "GET", base+"/v1/pets", testKey, ""), 200, nil, `[{"id":1,"name":"Rex","categoryId":1,"status":"available"}]`)
	if err := stop(); err != nil {
		t.Fatalf("run returned %v after cancel, want nil", err)
	}
	for _, secret := range []string{"k1", testKey} {
		if strings.Contains(stderr.String(), "Bearer "+secret) || strings.Contains(stderr.String(), secret+" ") {
			t.Errorf("log shows a key:\n%s", stderr.String())
		}
	}

	base, _, _ = startRun(t, []string{"-addr", "127.0.0.1:0"}, env)
	checkReply(t, send(t, "GET", base+"/v1/pets/1", "k1", ""), 200, nil, `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`)
}

// TestRunGeneratesKey: with no key configured the first start works at
// once with a printed key.
func TestRunGeneratesKey(t *testing.T) {
	env := map[string]string{"PETSTORE_DB": filepath.Join(t.TempDir(), "run.db")}
	base, stderr, _ := startRun(t, []string{"-addr", "127.0.0.1:0"}, env)
	m := regexp.MustCompile(`changes on every start:\n\n    (\S+)\n`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("no generated key on stderr:\n%s", stderr.String())
	}
	if len(m[1]) < 22 { // 128 bits of base64
		t.Errorf("generated key %d characters, want at least 22", len(m[1]))
	}
	checkReply(t, send(t, "GET", base+"/v1/pets", m[1], ""), 200, nil, `[]`)
	checkReply(t, send(t, "GET", base+"/v1/pets", "guess", ""), 401, nil, errBody(401, codeUnauthorized, "invalid API key"))
}

func TestRunFailures(t *testing.T) {
	dir := t.TempDir()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	corrupt := filepath.Join(dir, "corrupt.db")
	os.WriteFile(corrupt, bytes.Repeat([]byte("not a database "), 500), 0o600)
	env := map[string]string{"PETSTORE_API_KEYS": testKey}

	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"busy port", []string{"-addr", busy.Addr().String(), "-db", filepath.Join(dir, "a.db")}, env,
			"listen on " + busy.Addr().String() + ": listen tcp " + busy.Addr().String() + ": bind: address already in use"},
		{"corrupt database", []string{"-addr", "127.0.0.1:0", "-db", corrupt}, env,
			"open database " + corrupt + ": file is not a database"},
		{"database in a missing directory", []string{"-addr", "127.0.0.1:0", "-db", filepath.Join(dir, "no", "such.db")}, env,
			"open database: open " + filepath.Join(dir, "no", "such.db") + ": no such file or directory"},
		{"unknown flag", []string{"-nope"}, env, "flag provided but not defined: -nope"},
		{"bad key list", []string{"-addr", "127.0.0.1:0"}, map[string]string{"PETSTORE_API_KEYS": "a b"},
			"PETSTORE_API_KEYS: API key number 1 has a character a client cannot send in an Authorization header (allowed: printable ASCII without spaces)"},
		{"stray argument", []string{"serve"}, env, `unexpected argument "serve" (commands: backup, keygen)`},
		{"bad log format", []string{"-log-format", "xml"}, env, `-log-format must be text or json, got "xml"`},
		{"bad log level", []string{"-log-level", "loud"}, env, `-log-level must be debug, info, warn or error, got "loud"`},
		{"CORS origin without scheme", []string{"-cors-origins", "office.example.com"}, env, `-cors-origins: "office.example.com" is not an origin such as https://office.example.com`},
		{"CORS origin with a path", []string{"-cors-origins", "https://a.example, https://b.example/app"}, env, `-cors-origins: "https://b.example/app" is not an origin such as https://office.example.com`},
		{"bad duration in the environment", nil, map[string]string{"PETSTORE_READ_TIMEOUT": "soon"}, `PETSTORE_READ_TIMEOUT: "soon" is not a positive duration such as 5s`},
		{"bad number in the environment", nil, map[string]string{"PETSTORE_MAX_HEADER_BYTES": "-1"}, `PETSTORE_MAX_HEADER_BYTES: "-1" is not a positive integer`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(context.Background(), append([]string{"petstore"}, tt.args...), func(k string) string { return tt.env[k] }, io.Discard, io.Discard)
			if err == nil || err.Error() != tt.want {
				t.Errorf("run error = %v, want %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("error is more than one line: %q", err)
			}
		})
	}
}

func TestIdempotencyKey(t *testing.T) {
	const rex = `{"name":"Rex","categoryId":1}`
	created := `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`
	withKey := func(key string) map[string]string { return map[string]string{"Idempotency-Key": key} }
	badKey := func(msg string) string { return errBody(400, codeInvalidParameter, msg) }

	t.Run("retries replay the first answer", func(t *testing.T) {
		srv, _ := newTestServer(t)
		first := do(t, srv, call{method: "POST", path: "/v1/pets", body: rex, header: withKey("order-42")})
		checkReply(t, first, 201, map[string]string{"Location": "/v1/pets/1", "Idempotent-Replayed": ""}, created)
		for _, tt := range []struct{ name, body, key string }{
			{"same body", rex, "order-42"},
			{"same pet written differently", `{ "categoryId": 1, "status": "available", "name": "Rex" }`, "order-42"},
			{"key as a structured-field string", rex, `"order-42"`},
		} {
			got := do(t, srv, call{method: "POST", path: "/v1/pets", body: tt.body, header: withKey(tt.key)})
			checkReply(t, got, 201, map[string]string{"Location": "/v1/pets/1", "Idempotent-Replayed": "true"}, created)
		}
		// Another key is another pet; the same key with another pet is refused.
		checkReply(t, do(t, srv, call{method: "POST", path: "/v1/pets", body: rex, header: withKey("order-43")}), 201,
			map[string]string{"Location": "/v1/pets/2"}, `{"id":2,"name":"Rex","categoryId":1,"status":"available"}`)
		checkReply(t, do(t, srv, call{method: "POST", path: "/v1/pets", body: `{"name":"Tom","categoryId":1}`, header: withKey("order-42")}), 422,
			map[string]string{"Location": ""},
			errBody(422, codeIdempotencyKeyReused, "this Idempotency-Key was already used for a different pet; use a new key for a new request"))
		checkReply(t, do(t, srv, call{method: "POST", path: "/v1/pets", body: `{"name":"Rex","categoryId":1,"status":"sold"}`, header: withKey("order-42")}), 422,
			nil, errBody(422, codeIdempotencyKeyReused, "this Idempotency-Key was already used for a different pet; use a new key for a new request"))
		// An invalid body is a 400 whatever the key.
		checkReply(t, do(t, srv, call{method: "POST", path: "/v1/pets", body: `{"name":"Rex"}`, header: withKey("order-42")}), 400,
			nil, errBody(400, codeInvalidBody, "categoryId is required"))
		checkReply(t, do(t, srv, call{method: "GET", path: "/v1/pets"}), 200, nil,
			`[`+created+`,{"id":2,"name":"Rex","categoryId":1,"status":"available"}]`)
	})

	t.Run("key rules", func(t *testing.T) {
		srv, _ := newTestServer(t)
		for _, tt := range []struct {
			name   string
			key    string
			status int
			want   string
		}{
			{"255 characters", strings.Repeat("k", 255), 201, created},
			{"256 characters", strings.Repeat("k", 256), 400, badKey("Idempotency-Key must be 1 to 255 printable ASCII characters, got 256")},
			{"quoted empty", `""`, 400, badKey("Idempotency-Key must be 1 to 255 printable ASCII characters, got 0")},
			{"control character (tab)", "a\tb", 400, badKey("Idempotency-Key must be 1 to 255 printable ASCII characters")},
			{"non-ASCII", "clé", 400, badKey("Idempotency-Key must be 1 to 255 printable ASCII characters")},
			{"bad escape in quotes", `"a\b"`, 400, badKey(`Idempotency-Key must be 1 to 255 printable ASCII characters (a quoted key may escape only \ and ")`)},
		} {
			t.Run(tt.name, func(t *testing.T) {
				got := do(t, srv, call{method: "POST", path: "/v1/pets", body: rex, header: withKey(tt.key)})
				checkReply(t, got, tt.status, nil, tt.want)
			})
		}
		req, _ := http.NewRequest("POST", srv.URL+"/v1/pets", strings.NewReader(rex))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Add("Idempotency-Key", "a")
		req.Header.Add("Idempotency-Key", "b")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		checkReply(t, reply{resp.StatusCode, resp.Header, b}, 400, nil, badKey("send one Idempotency-Key header, not several"))
		// Only the 255-character key created a pet.
		checkReply(t, do(t, srv, call{method: "GET", path: "/v1/pets"}), 200, nil, "["+created+"]")
	})

	t.Run("concurrent requests with one key create one pet", func(t *testing.T) {
		srv, _ := newTestServer(t)
		const n = 24
		var wg sync.WaitGroup
		replies := make([]reply, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies[i] = do(t, srv, call{method: "POST", path: "/v1/pets", body: rex, header: withKey("same")})
			}()
		}
		wg.Wait()
		replayed := 0
		for _, r := range replies {
			checkReply(t, r, 201, map[string]string{"Location": "/v1/pets/1"}, created)
			if r.header.Get("Idempotent-Replayed") == "true" {
				replayed++
			}
		}
		if replayed != n-1 {
			t.Errorf("%d replays, want %d", replayed, n-1)
		}
		checkReply(t, do(t, srv, call{method: "GET", path: "/v1/pets"}), 200, nil, "["+created+"]")
	})
}

func TestMigrateFromVersion1(t *testing.T) {
	// A file written by the first release (schema version 1) is upgraded in
	// place, its pets kept, and idempotency works on it.
	path := filepath.Join(t.TempDir(), "v1.db")
	db, err := sql.Open("sqlite3", sqliteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{migrations[0], "PRAGMA user_version = 1",
		"INSERT INTO pets (name, category_id, status) VALUES ('Old', 4, 'sold')"} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	s, err := openStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	got, err := storedPet(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Pet{ID: 1, Name: "Old", CategoryID: 4, Status: "sold"}, got); diff != "" {
		t.Errorf("pet after migration (-want +got):\n%s", diff)
	}
	req := createRequest{pet: NewPet{Name: "New", CategoryID: 1, Status: "available"}, idempotencyKey: "k"}
	first, _, err := s.createPet(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	again, replayed, err := s.createPet(context.Background(), req)
	if err != nil || !replayed || again != first {
		t.Errorf("retry = %+v, %v, %v; want %+v replayed", again, replayed, err, first)
	}
}

func TestKeysFile(t *testing.T) {
	digestOf := func(k string) keyDigest { return sha256Sum(k) }
	tests := []struct {
		name    string
		file    string
		want    []keyDigest
		wantErr string
	}{
		{"plain and hashed keys with comments", "# back office\nplain-key\n\n  sha256:" + hexDigest("hashed-key") + "  # scripts\n#old-key\n",
			[]keyDigest{digestOf("plain-key"), digestOf("hashed-key")}, ""},
		{"empty file", "", nil, ""},
		{"only comments", "# nothing yet\n", nil, ""},
		{"CRLF line ends", "a-key\r\nb-key\r\n", []keyDigest{digestOf("a-key"), digestOf("b-key")}, ""},
		{"two words", "good-key\nsecret-one secret-two\n", nil, "line 2: more than one word; write one key a line, comments after #"},
		{"short digest", "sha256:abcd\n", nil, "line 1: sha256: must be followed by the 64 hex digits of the key's SHA-256 digest"},
		{"digest not hex", "sha256:" + strings.Repeat("z", 64) + "\n", nil, "line 1: sha256: must be followed by the 64 hex digits of the key's SHA-256 digest"},
		{"non-ASCII key", "ключ\n", nil, "line 1: a key must be printable ASCII without spaces"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseKeysFile([]byte(tt.file))
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if gotErr != tt.wantErr {
				t.Fatalf("error = %q, want %q", gotErr, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("digests (-want +got):\n%s", diff)
			}
			if strings.Contains(gotErr, "secret") {
				t.Errorf("error shows a key: %s", gotErr)
			}
		})
	}
}

// sha256Sum and hexDigest compute a key's digest independently of the code
// under test's helpers.
func sha256Sum(k string) keyDigest { return keyDigest(sha256.Sum256([]byte(k))) }

func hexDigest(k string) string { d := sha256Sum(k); return hex.EncodeToString(d[:]) }

func TestKeygen(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"petstore", "keygen"}, func(string) string { return "" }, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`^key: ([A-Za-z0-9_-]{43})\nkeys-file line: sha256:([0-9a-f]{64})\n$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("keygen output %q", out.String())
	}
	if m[2] != hexDigest(m[1]) {
		t.Errorf("line's digest %s is not the key's %s", m[2], hexDigest(m[1]))
	}
}

// waitForLog waits until the service's log has grown a line matching re
// beyond the first skip matches.
func waitForLog(t *testing.T, log *syncBuffer, re string, count int) {
	t.Helper()
	pattern := regexp.MustCompile(re)
	deadline := time.Now().Add(5 * time.Second)
	for len(pattern.FindAllString(log.String(), -1)) < count {
		if time.Now().After(deadline) {
			t.Fatalf("log never had %d lines matching %q:\n%s", count, re, log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestKeysFileReloadOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	keysFile := filepath.Join(dir, "keys")
	write := func(content string) {
		if err := os.WriteFile(keysFile, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("old-key\nsha256:" + hexDigest("new-key") + "\n")
	env := map[string]string{"PETSTORE_API_KEYS_FILE": keysFile, "PETSTORE_DB": filepath.Join(dir, "pets.db")}
	base, stderr, _ := startRun(t, []string{"-addr", "127.0.0.1:0"}, env)
	hup := func() {
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	ok := func(key string) { checkReply(t, send(t, "GET", base+"/v1/pets", key, ""), 200, nil, `[]`) }
	refused := func(key string) {
		checkReply(t, send(t, "GET", base+"/v1/pets", key, ""), 401, nil, errBody(401, codeUnauthorized, "invalid API key"))
	}
	ok("old-key")
	ok("new-key")

	// Revoke old-key without a restart.
	write("# old-key revoked\nsha256:" + hexDigest("new-key") + "\n")
	hup()
	waitForLog(t, stderr, `API keys reloaded" keys=1`, 1)
	refused("old-key")
	ok("new-key")

	// A broken file changes nothing and says why.
	write("new-key\nsha256:broken\n")
	hup()
	waitForLog(t, stderr, `API keys not reloaded; the previous keys stay in force" err="API keys file \S+ line 2: sha256: must be followed`, 1)
	ok("new-key")
	refused("old-key")
	if strings.Contains(stderr.String(), "old-key") || strings.Contains(stderr.String(), "new-key") {
		t.Errorf("log shows a key:\n%s", stderr.String())
	}
}

func TestBackupWhileWriting(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "pets.db")
	srv, store := newTestServerAt(t, dbPath)
	// Writers keep creating pets while the backup runs.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	acked := map[int64]Pet{}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				p, _, err := store.createPet(context.Background(), createRequest{pet: NewPet{Name: fmt.Sprintf("w%d-%d", w, i), CategoryID: int64(w + 1), Status: "pending"}})
				if err != nil {
					t.Errorf("create: %v", err)
					return
				}
				mu.Lock()
				acked[p.ID] = p
				mu.Unlock()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	before := len(acked)
	mu.Unlock()

	backup := filepath.Join(t.TempDir(), "backup.db")
	var out bytes.Buffer
	err := run(context.Background(), []string{"petstore", "backup", "-db", dbPath, backup}, func(string) string { return "" }, &out, io.Discard)
	// Once the writers have stopped, every committed row has been
	// recorded as acknowledged: a row the snapshot holds is among them.
	close(stop)
	wg.Wait()
	after := len(acked)
	if err != nil {
		t.Fatalf("backup: %v", err)
	}
	if fi, err := os.Stat(backup); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("backup file: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}

	// The copy is a consistent snapshot: at least what was acknowledged
	// before it began, every row identical to the live one.
	copyStore, err := openStore(backup)
	if err != nil {
		t.Fatal(err)
	}
	defer copyStore.close()
	got, err := storedPets(copyStore)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < before || len(got) > after {
		t.Errorf("backup holds %d pets; %d were acknowledged before it began, %d in all", len(got), before, after)
	}
	for i, p := range got {
		if p != acked[p.ID] {
			t.Errorf("backup pet %+v differs from the acknowledged %+v", p, acked[p.ID])
		}
		if p.ID != int64(i+1) {
			t.Fatalf("backup has a gap: pet %d at position %d", p.ID, i+1)
		}
	}
	if want := fmt.Sprintf("backed up %s to %s: %d pets, integrity ok\n", dbPath, backup, len(got)); out.String() != want {
		t.Errorf("backup said %q, want %q", out.String(), want)
	}
	t.Logf("backup of a live database: %d pets acknowledged before it began, %d in all, %d in the copy", before, after, len(got))

	// The live service is unaffected.
	checkReply(t, do(t, srv, call{method: "GET", path: "/healthz"}), 200, nil, `{"status":"ok"}`)

	// A backup never overwrites.
	err = run(context.Background(), []string{"petstore", "backup", "-db", dbPath, backup}, func(string) string { return "" }, io.Discard, io.Discard)
	if want := "backup: backup file: open " + backup + ": file exists"; err == nil || err.Error() != want {
		t.Errorf("second backup: %v, want %q", err, want)
	}
	err = run(context.Background(), []string{"petstore", "backup", "-db", filepath.Join(t.TempDir(), "missing.db"), filepath.Join(t.TempDir(), "b.db")}, func(string) string { return "" }, io.Discard, io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "backup: database to back up: stat ") {
		t.Errorf("backup of a missing file: %v", err)
	}
}

func TestSlowClientIsCutOff(t *testing.T) {
	env := map[string]string{"PETSTORE_API_KEYS": testKey, "PETSTORE_DB": filepath.Join(t.TempDir(), "pets.db")}
	base, _, _ := startRun(t, []string{"-addr", "127.0.0.1:0", "-read-header-timeout", "500ms"}, env)
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Trickle a header one byte every 50 ms: 200 bytes would take 10 s.
	closed := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		io.Copy(io.Discard, conn)
		closed <- time.Since(start)
	}()
	go func() {
		fmt.Fprint(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n")
		for _, b := range []byte(strings.Repeat("X-Slow: trickle\r\n", 12)) {
			if _, err := conn.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	// Others are served meanwhile.
	for range 5 {
		checkReply(t, send(t, "GET", base+"/healthz", "", ""), 200, nil, `{"status":"ok"}`)
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case d := <-closed:
		if d > 3*time.Second {
			t.Errorf("slow client cut off after %v, want about 500ms", d)
		}
		t.Logf("trickling client cut off after %v", d.Round(time.Millisecond))
	case <-time.After(8 * time.Second):
		t.Fatal("slow client still connected after 8s")
	}
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := writeTestCertificate(t, dir)
	env := map[string]string{"PETSTORE_API_KEYS": testKey, "PETSTORE_DB": filepath.Join(dir, "pets.db")}
	base, _, _ := startRun(t, []string{"-addr", "127.0.0.1:0", "-tls-cert", certFile, "-tls-key", keyFile}, env)
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("listening on %s, want https", base)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest("POST", base+"/v1/pets", strings.NewReader(`{"name":"Rex","categoryId":1}`))
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.TLS == nil {
		t.Error("answer did not come over TLS")
	}
	checkReply(t, reply{resp.StatusCode, resp.Header, b}, 201, map[string]string{"Location": "/v1/pets/1"},
		`{"id":1,"name":"Rex","categoryId":1,"status":"available"}`)

	// Bad TLS settings fail the start with one line.
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-tls-cert", certFile}, "-tls-cert and -tls-key go together: give both or neither"},
		{[]string{"-tls-cert", keyFile, "-tls-key", keyFile}, "TLS certificate: tls: failed to find certificate PEM data in certificate input, but did find a private key; PEM inputs may have been switched"},
	} {
		err := run(context.Background(), append([]string{"petstore", "-addr", "127.0.0.1:0"}, tt.args...), func(k string) string { return env[k] }, io.Discard, io.Discard)
		if err == nil || err.Error() != tt.want {
			t.Errorf("run %v: %v, want %q", tt.args, err, tt.want)
		}
	}
}

// writeTestCertificate makes a self-signed certificate for 127.0.0.1 and
// returns its files and a pool that trusts it.
func writeTestCertificate(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "petstore test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// startBinary starts the built petstore binary on db and returns its base
// URL once it listens. Its log is drained so it never blocks on stderr.
func startBinary(t *testing.T, bin, db string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(bin, "-addr", "127.0.0.1:0", "-db", db)
	cmd.Env = append(os.Environ(), "PETSTORE_API_KEYS="+testKey)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`msg=listening addr=(http://\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	select {
	case a := <-addr:
		return a, cmd
	case <-time.After(20 * time.Second):
		t.Fatal("binary did not start listening")
		return "", nil
	}
}

// TestCrashSafety kills the real binary with SIGKILL in the middle of a
// stream of creates. After a restart every pet acknowledged with 201 must
// be there, unchanged, the file must pass integrity_check, and retries of
// the interrupted requests with their Idempotency-Key must not duplicate.
func TestCrashSafety(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the crash test builds the binary and needs the go command: %v", err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "petstore")
	if out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	db := filepath.Join(dir, "pets.db")
	base, proc := startBinary(t, bin, db)

	type request struct{ body, key string }
	var (
		mu       sync.Mutex
		acked    = map[int64]Pet{}
		ackedReq = map[int64]request{}
		inFlight []request // sent with a key, no answer before the kill
	)
	client := &http.Client{Timeout: 10 * time.Second}
	post := func(r request) (reply, error) {
		req, _ := http.NewRequest("POST", base+"/v1/pets", strings.NewReader(r.body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		if r.key != "" {
			req.Header.Set("Idempotency-Key", r.key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return reply{}, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return reply{resp.StatusCode, resp.Header, b}, err
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				r := request{body: fmt.Sprintf(`{"name":"w%d-%d","categoryId":%d,"status":"pending"}`, w, i, w+1)}
				if i%2 == 0 {
					r.key = fmt.Sprintf("crash-w%d-%d", w, i)
				}
				got, err := post(r)
				mu.Lock()
				if err != nil {
					if r.key != "" {
						inFlight = append(inFlight, r)
					}
					mu.Unlock()
					return // the server is gone
				}
				if got.status != 201 {
					mu.Unlock()
					t.Errorf("create: %d %s", got.status, got.body)
					return
				}
				var p Pet
				json.Unmarshal(got.body, &p)
				acked[p.ID], ackedReq[p.ID] = p, r
				mu.Unlock()
			}
		}()
	}
	// Kill once a good number of creates were acknowledged, mid-stream.
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 300 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := proc.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	proc.Wait()
	wg.Wait()
	if len(acked) == 0 {
		t.Fatal("no create was acknowledged before the kill")
	}

	base, proc = startBinary(t, bin, db)
	found := 0
	for id, want := range acked {
		got := send(t, "GET", fmt.Sprintf("%s/v1/pets/%d", base, id), testKey, "")
		var p Pet
		if got.status == 200 && json.Unmarshal(got.body, &p) == nil && p == want {
			found++
		} else {
			t.Errorf("acknowledged pet %+v after restart: %d %s", want, got.status, got.body)
		}
	}
	// Retries after the crash: acknowledged ones replay, interrupted ones
	// are created at most once.
	replays := 0
	for id, r := range ackedReq {
		if r.key == "" {
			continue
		}
		got, err := post(r)
		if err != nil || got.status != 201 || got.header.Get("Idempotent-Replayed") != "true" || got.header.Get("Location") != fmt.Sprintf("/v1/pets/%d", id) {
			t.Errorf("retry of acknowledged %s: %v %d %v %s", r.key, err, got.status, got.header, got.body)
			continue
		}
		replays++
	}
	for _, r := range inFlight {
		if got, err := post(r); err != nil || got.status != 201 {
			t.Errorf("retry of interrupted %s: %v %d %s", r.key, err, got.status, got.body)
		}
	}
	names := map[string]int{}
	all := walkCatalogue(t, func(path string) reply { return send(t, "GET", base+path, testKey, "") })
	for _, p := range all {
		names[p.Name]++
	}
	total := len(all)
	for name, n := range names {
		if n > 1 {
			t.Errorf("pet %s stored %d times", name, n)
		}
	}
	if err := proc.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := proc.Wait(); err != nil {
		t.Errorf("SIGTERM: exit %v, want 0", err)
	}

	check, err := sql.Open("sqlite3", db)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	var integrity string
	if err := check.QueryRow("PRAGMA integrity_check").Scan(&integrity); err != nil || integrity != "ok" {
		t.Errorf("integrity_check = %q, %v", integrity, err)
	}
	t.Logf("SIGKILL mid-stream: %d creates acknowledged, %d found unchanged after restart; %d retries replayed, %d interrupted requests retried; %d pets stored; integrity_check %s",
		len(acked), found, replays, len(inFlight), total, integrity)
}

// TestLoadWithFaults drives mixed reads and writes from 32 clients, with
// faults among them: requests abandoned mid-flight (then retried with
// their Idempotency-Key), invalid bodies, unknown ids. No answer may be a
// 5xx or mention a locked database, and afterwards the catalogue holds
// exactly the pets that were acknowledged.
func TestLoadWithFaults(t *testing.T) {
	srv, _ := newTestServer(t)
	const clients = 32
	duration := 3 * time.Second
	var (
		mu      sync.Mutex
		acked   = map[int64]Pet{}
		counts  = map[string]int{}
		maxID   int64
		failure []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		if len(failure) < 20 {
			failure = append(failure, fmt.Sprintf(format, args...))
		}
		mu.Unlock()
	}
	impatient := &http.Client{Transport: srv.Client().Transport, Timeout: time.Millisecond}
	patient := &http.Client{Transport: srv.Client().Transport, Timeout: 30 * time.Second}
	request := func(client *http.Client, method, path, body, key string) (reply, error) {
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, _ := http.NewRequest(method, srv.URL+path, rd)
		req.Header.Set("Authorization", "Bearer "+testKey)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := client.Do(req)
		if err != nil {
			return reply{}, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return reply{}, err
		}
		if resp.StatusCode >= 500 || bytes.Contains(b, []byte("locked")) || !json.Valid(b) {
			fail("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return reply{resp.StatusCode, resp.Header, b}, nil
	}
	record := func(b []byte) {
		var p Pet
		json.Unmarshal(b, &p)
		mu.Lock()
		acked[p.ID] = p
		maxID = max(maxID, p.ID)
		mu.Unlock()
	}
	invalid := []string{`{"name":""}`, `{"name":"x","categoryId":0}`, `[]`, `{"name":"x","categoryId":1,"id":3}`, `{`}
	stop := time.Now().Add(duration)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := mathrand.New(mathrand.NewPCG(uint64(c), 7))
			for op := 0; op < 5000 && time.Now().Before(stop); op++ {
				kind := ""
				switch n := rng.IntN(100); {
				case n < 30: // create with a key, sometimes abandoned first
					kind = "create"
					key := fmt.Sprintf("load-%d-%d", c, op)
					body := fmt.Sprintf(`{"name":"%s","categoryId":%d,"status":"%s"}`, key, rng.IntN(9)+1, petStatuses[rng.IntN(3)])
					if rng.IntN(4) == 0 {
						kind = "abandoned create"
						request(impatient, "POST", "/v1/pets", body, key)
					}
					for try := 0; ; try++ {
						got, err := request(patient, "POST", "/v1/pets", body, key)
						if err == nil && got.status == 201 {
							record(got.body)
							break
						}
						if try == 10 {
							fail("create %s never acknowledged: %v %d %s", key, err, got.status, got.body)
							break
						}
					}
				case n < 40: // create without a key
					kind = "create"
					got, err := request(patient, "POST", "/v1/pets", fmt.Sprintf(`{"name":"plain-%d-%d","categoryId":1}`, c, op), "")
					if err != nil || got.status != 201 {
						fail("plain create: %v %d %s", err, got.status, got.body)
						continue
					}
					record(got.body)
				case n < 50:
					kind = "invalid create"
					got, err := request(patient, "POST", "/v1/pets", invalid[rng.IntN(len(invalid))], "")
					if err != nil || got.status != 400 {
						fail("invalid create: %v %d %s", err, got.status, got.body)
					}
				case n < 80:
					kind = "list"
					q := fmt.Sprintf("/v1/pets?limit=%d&after=%d", rng.IntN(100)+1, rng.IntN(int(maxIDNow(&mu, &maxID))+1))
					if rng.IntN(2) == 0 {
						q += "&status=" + petStatuses[rng.IntN(3)]
					}
					if got, err := request(patient, "GET", q, "", ""); err != nil || got.status != 200 {
						fail("list %s: %v %d %s", q, err, got.status, got.body)
					}
				default:
					kind = "get"
					id := rng.Int64N(maxIDNow(&mu, &maxID)+5) + 1
					if got, err := request(patient, "GET", fmt.Sprintf("/v1/pets/%d", id), "", ""); err != nil || (got.status != 200 && got.status != 404) {
						fail("get %d: %v %d %s", id, err, got.status, got.body)
					}
				}
				mu.Lock()
				counts[kind]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, f := range failure {
		t.Error(f)
	}
	stored := map[int64]Pet{}
	for _, p := range walkCatalogue(t, func(path string) reply { return do(t, srv, call{method: "GET", path: path}) }) {
		stored[p.ID] = p
	}
	if diff := cmp.Diff(acked, stored); diff != "" {
		t.Errorf("stored pets differ from acknowledged (-acknowledged +stored):\n%s", diff)
	}
	t.Logf("%d clients for %v: %v; %d pets acknowledged, %d stored", clients, duration, counts, len(acked), len(stored))
}

// maxIDNow reads the highest acknowledged id under mu.
func maxIDNow(mu *sync.Mutex, maxID *int64) int64 {
	mu.Lock()
	defer mu.Unlock()
	return *maxID
}

// storedPet reads one pet straight from the store.
func storedPet(s *petStore, id int64) (Pet, error) {
	var p Pet
	err := s.getPet(context.Background(), id, func(r *petRow) { p = r.pet() })
	return p, err
}

// storedPets reads the whole catalogue straight from the store.
func storedPets(s *petStore) ([]Pet, error) {
	var pets []Pet
	err := s.listPets(context.Background(), petFilter{limit: 1 << 30}, func(r *petRow) { pets = append(pets, r.pet()) })
	return pets, err
}

// jsonEncodingJSON is how encoding/json writes a Pet with HTML escaping
// off: the reference appendPetJSON must match byte for byte.
func jsonEncodingJSON(t testing.TB, p Pet) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(p); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func checkPetEncoding(t testing.TB, p Pet) {
	row := petRow{id: p.ID, name: []byte(p.Name), categoryID: p.CategoryID, status: []byte(p.Status)}
	got, want := appendPetJSON(nil, &row), jsonEncodingJSON(t, p)
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

// TestReadYourWrites: while others create concurrently (so creates are
// committed in shared batches), every client that got a 201 sees its pet
// at once by get and by list.
func TestReadYourWrites(t *testing.T) {
	srv, _ := newTestServer(t)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 15 {
				body := fmt.Sprintf(`{"name":"ryw %d-%d","categoryId":%d,"status":"sold"}`, w, i, w+1)
				created := do(t, srv, call{method: "POST", path: "/v1/pets", body: body})
				if created.status != 201 {
					t.Errorf("create: %d %s", created.status, created.body)
					return
				}
				got := do(t, srv, call{method: "GET", path: created.header.Get("Location")})
				if got.status != 200 || !bytes.Equal(got.body, created.body) {
					t.Errorf("get after 201: %d %s, want %s", got.status, got.body, created.body)
				}
				var p Pet
				json.Unmarshal(created.body, &p)
				for _, q := range []string{"", "&status=sold"} {
					list := do(t, srv, call{method: "GET", path: fmt.Sprintf("/v1/pets?limit=1&after=%d%s", p.ID-1, q)})
					if want := "[" + strings.TrimSpace(string(created.body)) + "]\n"; string(list.body) != want {
						t.Errorf("list after 201: %s, want %s", list.body, want)
					}
				}
			}
		}()
	}
	wg.Wait()
}

func TestAccessLog(t *testing.T) {
	env := map[string]string{"PETSTORE_API_KEYS": testKey, "PETSTORE_DB": filepath.Join(t.TempDir(), "pets.db")}
	base, stderr, stop := startRun(t, []string{"-addr", "127.0.0.1:0", "-log-format", "json"}, env)

	req, _ := http.NewRequest("GET", base+"/v1/pets?limit=5&status=sold", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("X-Request-Id", "back-office-42")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := resp.Header.Get("X-Request-Id"); got != "back-office-42" {
		t.Errorf("X-Request-Id = %q, want the client's back-office-42", got)
	}
	// An id with unsafe characters or too long is replaced.
	generated := map[string]bool{}
	for _, bad := range []string{"two words", strings.Repeat("x", 129), "quote\"d"} {
		req, _ := http.NewRequest("GET", base+"/v1/pets", nil)
		req.Header.Set("Authorization", "Bearer wrong-key")
		req.Header.Set("X-Request-Id", bad)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		id := resp.Header.Get("X-Request-Id")
		if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) || generated[id] {
			t.Errorf("X-Request-Id for %q = %q, want a new generated id", bad, id)
		}
		generated[id] = true
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	type accessLine struct {
		Level, Msg, Method, Path, RequestID, KeyID string
		Status, Bytes                              int
		Duration                                   int64
	}
	var lines []accessLine
	for _, l := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", l)
		}
		if m["msg"] != "request" {
			continue
		}
		lines = append(lines, accessLine{Level: m["level"].(string), Msg: "request", Method: m["method"].(string), Path: m["path"].(string),
			RequestID: m["request_id"].(string), KeyID: m["key_id"].(string), Status: int(m["status"].(float64)), Bytes: int(m["bytes"].(float64)),
			Duration: int64(m["duration"].(float64))})
	}
	if len(lines) != 4 {
		t.Fatalf("%d access lines, want 4:\n%s", len(lines), stderr.String())
	}
	first := lines[0]
	if first.Duration <= 0 || first.Bytes != 3 {
		t.Errorf("first line duration %d, bytes %d; want > 0 and 3 ([]\\n)", first.Duration, first.Bytes)
	}
	first.Duration, first.Bytes = 0, 0
	want := accessLine{Level: "INFO", Msg: "request", Method: "GET", Path: "/v1/pets", RequestID: "back-office-42", KeyID: hexDigest(testKey)[:8], Status: 200}
	if diff := cmp.Diff(want, first); diff != "" {
		t.Errorf("access line (-want +got):\n%s", diff)
	}
	for _, l := range lines[1:] {
		if l.Status != 401 || l.KeyID != hexDigest("wrong-key")[:8] || !generated[l.RequestID] {
			t.Errorf("access line for a wrong key: %+v", l)
		}
	}
	if strings.Contains(stderr.String(), testKey) || strings.Contains(stderr.String(), "wrong-key") || strings.Contains(stderr.String(), "status=sold") {
		t.Errorf("log shows a key or the query:\n%s", stderr.String())
	}
}

func TestLogLevelAndFormat(t *testing.T) {
	for _, tt := range []struct {
		args       []string
		wantAccess string // a substring of the access line, or "" for none
	}{
		{nil, `level=INFO msg=request method=GET path=/healthz status=200 bytes=16 duration=`},
		{[]string{"-log-level", "warn", "-addr", freeAddr(t)}, ""},
		{[]string{"-log-format", "json", "-log-level", "DEBUG"}, `"msg":"request","method":"GET","path":"/healthz","status":200,"bytes":16,"duration":`},
	} {
		env := map[string]string{"PETSTORE_API_KEYS": testKey, "PETSTORE_DB": filepath.Join(t.TempDir(), "pets.db")}
		base, stderr, stop := startRun(t, append([]string{"-addr", "127.0.0.1:0"}, tt.args...), env)
		send(t, "GET", base+"/healthz", "", "")
		stop()
		if got := strings.Contains(stderr.String(), `msg=request`) || strings.Contains(stderr.String(), `"msg":"request"`); got != (tt.wantAccess != "") || !strings.Contains(stderr.String(), tt.wantAccess) {
			t.Errorf("%v: log\n%s\nwant access line %q", tt.args, stderr.String(), tt.wantAccess)
		}
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"petstore", "-version"}, func(string) string { return "" }, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^petstore \S+ \(revision [0-9a-f]+|unknown(, \S+)?(, modified)?\)\n$`).MatchString(out.String()) {
		t.Errorf("-version printed %q", out.String())
	}
}

func TestCORS(t *testing.T) {
	store, err := openStore(filepath.Join(t.TempDir(), "pets.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.close()
	digests, _ := parseAPIKeys(testKey)
	const office = "https://office.example.com"
	srv := httptest.NewServer(newHandler(&server{store: store, keys: newKeyRing(digests), log: quietLogger(), corsOrigins: []string{office}}))
	defer srv.Close()
	plain, _ := newTestServer(t)

	preflight := func(origin, method, path string) map[string]string {
		return map[string]string{"Origin": origin, "Access-Control-Request-Method": method,
			"Access-Control-Request-Headers": "authorization,content-type", "Authorization": ""}
	}
	const expose = "Link, Location, X-Request-Id, Deprecation, Sunset, Idempotent-Replayed, WWW-Authenticate"
	tests := []struct {
		name   string
		srv    *httptest.Server
		c      call
		status int
		want   map[string]string
	}{
		{"preflight for createPet", srv, call{method: "OPTIONS", path: "/v1/pets", header: preflight(office, "POST", "/v1/pets")}, 204,
			map[string]string{"Access-Control-Allow-Origin": office, "Access-Control-Allow-Methods": "GET, POST", "Vary": "Origin",
				"Access-Control-Allow-Headers": "Authorization, Content-Type, Idempotency-Key, X-Request-Id", "Access-Control-Max-Age": "600"}},
		{"preflight for listPets", srv, call{method: "OPTIONS", path: "/v1/pets?limit=5", header: preflight(office, "GET", "")}, 204,
			map[string]string{"Access-Control-Allow-Origin": office, "Access-Control-Allow-Methods": "GET, POST"}},
		{"preflight for getPet", srv, call{method: "OPTIONS", path: "/v1/pets/7", header: preflight(office, "GET", "")}, 204,
			map[string]string{"Access-Control-Allow-Origin": office, "Access-Control-Allow-Methods": "GET"}},
		{"preflight for a method not served", srv, call{method: "OPTIONS", path: "/v1/pets/7", header: preflight(office, "DELETE", "")}, 401,
			map[string]string{"Access-Control-Allow-Methods": ""}},
		{"preflight from another origin", srv, call{method: "OPTIONS", path: "/v1/pets", header: preflight("https://evil.example", "POST", "")}, 401,
			map[string]string{"Access-Control-Allow-Origin": "", "Vary": "Origin"}},
		{"request from the origin", srv, call{method: "GET", path: "/v1/pets", header: map[string]string{"Origin": office}}, 200,
			map[string]string{"Access-Control-Allow-Origin": office, "Access-Control-Expose-Headers": expose}},
		{"error to the origin is readable", srv, call{method: "GET", path: "/v1/pets", header: map[string]string{"Origin": office, "Authorization": ""}}, 401,
			map[string]string{"Access-Control-Allow-Origin": office}},
		{"request from another origin", srv, call{method: "GET", path: "/v1/pets", header: map[string]string{"Origin": "https://evil.example"}}, 200,
			map[string]string{"Access-Control-Allow-Origin": ""}},
		{"CORS off by default", plain, call{method: "OPTIONS", path: "/v1/pets", header: preflight(office, "POST", "")}, 401,
			map[string]string{"Access-Control-Allow-Origin": "", "Access-Control-Allow-Methods": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := do(t, tt.srv, tt.c)
			if got.status != tt.status {
				t.Errorf("status %d, want %d: %s", got.status, tt.status, got.body)
			}
			for k, v := range tt.want {
				if g := strings.Join(got.header.Values(k), ", "); g != v {
					t.Errorf("%s = %q, want %q", k, g, v)
				}
			}
		})
	}
}

// freeAddr returns a loopback address with a port that was free a moment
// ago, for a service whose log will not say where it listens.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestSystemdUnit checks petstore.service with systemd's own verifier and
// holds it to the hardening the README promises.
func TestSystemdUnit(t *testing.T) {
	unit, err := os.ReadFile("petstore.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"DynamicUser=yes", "StateDirectory=petstore", "ProtectSystem=strict", "NoNewPrivileges=yes",
		"Restart=on-failure", "ExecReload=/bin/kill -HUP $MAINPID",
		"ExecStart=/usr/local/bin/petstore -db ${STATE_DIRECTORY}/petstore.db -api-keys-file /etc/petstore/keys",
	} {
		if !slices.Contains(strings.Split(string(unit), "\n"), want) {
			t.Errorf("petstore.service lacks the line %q", want)
		}
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze is needed to verify the unit (apt-get install systemd): %v", err)
	}
	// verify wants ExecStart's program to exist: point it at an executable.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "petstore.service")
	os.WriteFile(path, bytes.ReplaceAll(unit, []byte("/usr/local/bin/petstore"), []byte(self)), 0o644)
	if out, err := exec.Command(analyze, "verify", path).CombinedOutput(); err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// readmeExample is a curl command of README.md and the output written
// under it as "# " lines.
type readmeExample struct {
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
func TestREADMEExamples(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("the README examples need curl: %v", err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	examples := readmeCurlExamples(string(readme))
	if len(examples) < 15 {
		t.Fatalf("found %d curl examples in README.md; the reader is broken", len(examples))
	}
	env := map[string]string{"PETSTORE_API_KEYS": "s3cret-key", "PETSTORE_CORS_ORIGINS": "https://office.example.com",
		"PETSTORE_DB": filepath.Join(t.TempDir(), "readme.db")}
	base, _, _ := startRun(t, []string{"-addr", "127.0.0.1:0"}, env)
	for _, ex := range examples {
		where := fmt.Sprintf("README.md:%d: %s", ex.line, ex.cmd)
		if len(ex.want) == 0 {
			t.Errorf("%s: no output documented under the example", where)
			continue
		}
		cmd := strings.ReplaceAll(ex.cmd, "http://127.0.0.1:8080", base)
		out, err := exec.Command("bash", "-c", "set -o pipefail; "+cmd).Output()
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
	decode := func(s string) any {
		dec := json.NewDecoder(strings.NewReader(s))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Errorf("%s: not JSON: %v: %q", where, err, s)
		}
		return v
	}
	if diff := cmp.Diff(decode(want), decode(got)); diff != "" {
		t.Errorf("%s: body differs from the README (-README +service):\n%s", where, diff)
	}
}

// TestREADMEConfigurationTable: every flag of the service, and the
// variable it defaults from, has its row in the README's table.
func TestREADMEConfigurationTable(t *testing.T) {
	var usage bytes.Buffer
	if err := run(context.Background(), []string{"petstore", "-h"}, func(string) string { return "" }, &usage, io.Discard); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
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
	}
	if len(rows) != len(flags) {
		t.Errorf("README's table has %d flag rows, the service %d flags", len(rows), len(flags))
	}
}

// walkCatalogue lists every pet by following next links from the first
// page, as a client would, fetching each page with get.
func walkCatalogue(t *testing.T, get func(path string) reply) []Pet {
	t.Helper()
	var all []Pet
	for next := "/v1/pets?limit=100"; next != ""; {
		got := get(next)
		var pets []Pet
		if got.status != 200 || json.Unmarshal(got.body, &pets) != nil {
			t.Fatalf("GET %s: %d %s", next, got.status, got.body)
		}
		all = append(all, pets...)
		next = strings.TrimSuffix(strings.TrimPrefix(got.header.Get("Link"), "<"), `>; rel="next"`)
	}
	return all
}
