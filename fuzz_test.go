package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The fuzz targets hold the service to one property on hostile input:
// never a 5xx or a panic, always either a valid result or the JSON Error
// body with a known code; and a created pet reads back identically. With
// their seeds they run in every `go test`; CI also fuzzes each for 30 s.

// errorCodes is the closed code vocabulary, by status.
var errorCodes = map[int][]string{
	400: {codeInvalidBody, codeInvalidParameter},
	401: {codeUnauthorized},
	413: {codeBodyTooLarge},
	415: {codeUnsupportedMediaType},
	422: {codeIdempotencyKeyReused},
}

// fuzzRequest sends a request; ok is false when the input cannot be put on
// the wire at all (the client refuses it), which is not the service's
// concern.
func fuzzRequest(t *testing.T, req *http.Request) (r reply, ok bool) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if strings.Contains(err.Error(), "invalid header field") || strings.Contains(err.Error(), "invalid method") {
			return reply{}, false
		}
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	r = reply{status: resp.StatusCode, header: resp.Header, body: b}
	checkAgainstOpenAPI(t, req.Method, req.URL.RequestURI(), r)
	return r, true
}

// checkErrorBody asserts that r is the Error body with a code of the
// vocabulary for its status.
func checkErrorBody(t *testing.T, r reply) {
	t.Helper()
	if r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d with Content-Type %q", r.status, r.header.Get("Content-Type"))
	}
	dec := json.NewDecoder(bytes.NewReader(r.body))
	dec.DisallowUnknownFields()
	var e apiError
	if err := dec.Decode(&e); err != nil {
		t.Fatalf("status %d body is not the Error body: %v: %s", r.status, err, r.body)
	}
	if e.Status != r.status || e.Message == "" || !slices.Contains(errorCodes[r.status], e.Code) {
		t.Fatalf("status %d with Error body %+v", r.status, e)
	}
}

// decodePet decodes b as exactly one Pet with valid fields; it reports
// with t.Errorf only, so it is safe in any goroutine.
func decodePet(t testing.TB, b []byte) Pet {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var p Pet
	if err := dec.Decode(&p); err != nil {
		t.Errorf("not a Pet: %v: %s", err, b)
	} else if err := petProblem(p); err != nil {
		t.Error(err)
	}
	return p
}

// petProblem says what in p no stored pet may be, or nil.
func petProblem(p Pet) error {
	if p.ID < 1 || p.CategoryID < 1 || strings.TrimSpace(p.Name) == "" || len([]rune(p.Name)) > maxNameLength || !slices.Contains(petStatuses, p.Status) {
		return fmt.Errorf("invalid pet %+v", p)
	}
	return nil
}

// createBodySeeds are create bodies good and bad, for both create fuzz
// targets.
var createBodySeeds = []string{
	`{"name":"Rex","categoryId":1}`,
	`{"name":"Tom","categoryId":9223372036854775807,"status":"sold"}`,
	`{"name":"Big","categoryId":9007199254740993,"status":"pending"}`,
	`{"name":"Rex","categoryId":1.0}`,
	`{"name":"Rex","categoryId":"1"}`,
	`{"name":"","categoryId":1}`,
	`{"name":"a\u0000b","categoryId":1}`,
	`{"name":"\ud800","categoryId":1}`,
	`{"name":"Rex","categoryId":1,"id":2}`,
	`{"name":"Rex","name":"Tom","categoryId":1}`,
	`{"name":"Rex","categoryId":1} x`,
	`[1,2,3]`,
	`null`,
	``,
	`{`,
	`{"name":"Rex","categoryId":1e400}`,
	"{\"name\":\"\xff\",\"categoryId\":1}",
	// Edges: spaces, missing fields, a leading zero.
	` { "categoryId" : 12 ,"status":"pending",	"name" : "Rex" } `,
	`{"name":"Rex"}`,
	`{"categoryId":1,"status":"sold"}`,
	`{"name":"Rex","categoryId":01}`,
	`{"name":"Rex","categoryId":0}`,
	`{"name":"Rex","categoryId":-1}`,
	`{"name":"Rex","categoryId":9223372036854775808}`,
	`{"name":"Rex","categoryId":1.5}`,
	`{"name":"   ","categoryId":1}`,
	"{\"name\":\"a\x7fb\",\"categoryId\":1}",
	"{\"name\":\"a\u0085b\",\"categoryId\":1}",
	`{"name":"Rex","categoryId":1,}`,
	`{"name":"Rex","categoryId":1,"status":"sold","status":"sold"}`,
	`{"name":"Rex","categoryId":1}}`,
	`{"name":"Rex","categoryId":1,"status":"Sold"}`,
	`{"name":"Rex","categoryId":1,"status":null}`,
	`{"name":"R\u0065x","categoryId":1}`,
	`{"name":"` + strings.Repeat("é", maxNameLength) + `","categoryId":1}`,
	`{"name":"` + strings.Repeat("é", maxNameLength+1) + `","categoryId":1}`,
}

func FuzzCreatePet(f *testing.F) {
	for i, s := range createBodySeeds {
		f.Add(s, "application/json", "")
		f.Add(s, "", fmt.Sprintf("seed-%d", i%3))
	}
	f.Add(`{"name":"Rex","categoryId":1}`, "text/plain", "")
	f.Add(`{"name":"Rex","categoryId":1}`, "application/json; charset=utf-16", "")
	svc := startService(f, nil)

	f.Fuzz(func(t *testing.T, body, contentType, idempotencyKey string) {
		req, err := http.NewRequest("POST", svc.url+"/v1/pets", strings.NewReader(body))
		must(t, err)
		req.Header.Set("Authorization", "Bearer "+testKey)
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		if idempotencyKey != "" {
			req.Header.Set("Idempotency-Key", idempotencyKey)
		}
		got, ok := fuzzRequest(t, req)
		if !ok {
			return
		}
		if got.status != http.StatusCreated {
			checkErrorBody(t, got)
			return
		}
		p := decodePet(t, got.body)
		if loc := got.header.Get("Location"); loc != fmt.Sprintf("/v1/pets/%d", p.ID) {
			t.Fatalf("Location %q for pet %d", loc, p.ID)
		}
		// What was acknowledged reads back byte for byte.
		back := send(t, svc.url, call{method: "GET", path: got.header.Get("Location")})
		if back.status != 200 || !bytes.Equal(back.body, got.body) {
			t.Fatalf("created %s, read back %d %s", got.body, back.status, back.body)
		}
	})
}

// nextLinkRE is the shape of every next link the list may send.
var nextLinkRE = regexp.MustCompile(`^</v1/pets\?limit=(\d+)(&status=(available|pending|sold))?&after=(\d+)>; rel="next"$`)

func FuzzListPets(f *testing.F) {
	for _, q := range []string{
		"", "limit=5", "limit=100", "limit=0", "limit=101", "limit=-1", "limit=abc", "limit=1.5",
		"status=sold", "status=lost", "after=3", "after=-1", "after=99999999999999999999",
		"limit=2&status=pending&after=4", "limit=1&limit=2", "stauts=sold", "limit=%zz",
		"limit=1;status=sold", "status=%73old", "&&", "=", "limit", "after=0&status=available",
	} {
		f.Add(q)
	}
	svc := startService(f, nil)
	for i := range 30 {
		createPets(f, svc.url, fmt.Sprintf(`{"name":"pet %d","categoryId":%d,"status":"%s"}`, i, i+1, petStatuses[i%3]))
	}

	f.Fuzz(func(t *testing.T, query string) {
		// Only what can stand in a request line: visible ASCII, no '#'.
		for i := 0; i < len(query); i++ {
			if query[i] <= ' ' || query[i] > '~' || query[i] == '#' {
				return
			}
		}
		req, err := http.NewRequest("GET", svc.url+"/v1/pets", nil)
		must(t, err)
		req.URL.RawQuery = query
		req.Header.Set("Authorization", "Bearer "+testKey)
		got, ok := fuzzRequest(t, req)
		if !ok {
			return
		}
		if got.status != http.StatusOK {
			checkErrorBody(t, got)
			if got.status != 400 {
				t.Fatalf("status %d for query %q", got.status, query)
			}
			return
		}
		if got.header.Get("Content-Type") != "application/json" {
			t.Fatalf("Content-Type %q", got.header.Get("Content-Type"))
		}
		var pets []Pet
		dec := json.NewDecoder(bytes.NewReader(got.body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&pets); err != nil || pets == nil {
			t.Fatalf("list body is not an array of Pet: %v: %s", err, got.body)
		}
		if len(pets) > maxLimit {
			t.Fatalf("%d pets, more than %d", len(pets), maxLimit)
		}
		for i, p := range pets {
			must(t, petProblem(p))
			if i > 0 && p.ID <= pets[i-1].ID {
				t.Fatalf("ids not ascending: %s", got.body)
			}
		}
		if link := got.header.Get("Link"); link != "" {
			m := nextLinkRE.FindStringSubmatch(link)
			if m == nil || len(pets) == 0 || m[4] != fmt.Sprint(pets[len(pets)-1].ID) || m[1] != fmt.Sprint(len(pets)) {
				t.Fatalf("bad next link %q for %d pets", link, len(pets))
			}
		}
	})
}
