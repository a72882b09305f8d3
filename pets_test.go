package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// testKey is the API key every test server accepts.
const testKey = "test-key-4f1d2c"

// newTestServer starts the real handler on a real listener over a fresh
// database file in a temp dir.
func newTestServer(t *testing.T) (*httptest.Server, *petStore) {
	t.Helper()
	store, err := openStore(filepath.Join(t.TempDir(), "pets.db"))
	if err != nil {
		t.Fatalf("openStore: %v", err)
	}
	t.Cleanup(func() { store.close() })
	digests, err := parseAPIKeys(testKey)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(newHandler(store, newKeyRing(digests), slog.New(slog.NewTextHandler(io.Discard, nil))))
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
	return reply{status: resp.StatusCode, header: resp.Header, body: b}
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
	if ct := got.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
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
			if !ring.accepts(k) {
				t.Errorf("parseAPIKeys(%q) does not accept %q", tt.list, k)
			}
		}
		if len(got) != len(tt.want) {
			t.Errorf("parseAPIKeys(%q) has %d keys, want %d", tt.list, len(got), len(tt.want))
		}
		if ring.accepts("") || ring.accepts(" one") {
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
	// A store failure on the API is a 500 that says nothing of the cause.
	checkReply(t, do(t, srv, call{method: "GET", path: "/v1/pets"}), 500, nil, errBody(500, codeInternalError, "internal error"))
	checkReply(t, do(t, srv, call{method: "POST", path: "/v1/pets", body: `{"name":"Rex","categoryId":1}`}), 500, nil,
		errBody(500, codeInternalError, "internal error"))
}

func TestPanicIsJSON500(t *testing.T) {
	var logged bytes.Buffer
	h := recoverPanics(slog.New(slog.NewTextHandler(&logged, nil)), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("boom: secret detail")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	got := do(t, srv, call{method: "GET", path: "/v1/pets"})
	checkReply(t, got, 500, nil, errBody(500, codeInternalError, "internal error"))
	if !strings.Contains(logged.String(), "boom: secret detail") {
		t.Errorf("panic cause not logged: %s", logged.String())
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
	next := "/v1/pets?limit=100"
	for next != "" {
		got := do(t, srv, call{method: "GET", path: next})
		var pets []Pet
		json.Unmarshal(got.body, &pets)
		for _, p := range pets {
			names[p.Name] = true
		}
		next = strings.TrimSuffix(strings.TrimPrefix(got.header.Get("Link"), "<"), `>; rel="next"`)
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
		p, err := s.createPet(context.Background(), NewPet{Name: "Rex", CategoryID: 1, Status: "available"})
		if err != nil {
			t.Fatal(err)
		}
		s.close()
		s, err = openStore(path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.close()
		got, err := s.getPet(context.Background(), p.ID)
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
	t.Run("status filter uses the index", func(t *testing.T) {
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
		if !strings.Contains(plan.String(), "pets_status_id") || strings.Contains(plan.String(), "TEMP B-TREE") {
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
	addrRE := regexp.MustCompile(`msg=listening addr=(http://\S+)`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := addrRE.FindStringSubmatch(stderr.String()); m != nil {
			baseURL = m[1]
			break
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
	return reply{resp.StatusCode, resp.Header, b}
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
		{"stray argument", []string{"serve"}, env, `unexpected argument "serve"`},
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
