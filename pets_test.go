package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRouting(t *testing.T) {
	svc := startService(t, nil)
	deprecation := map[string]string{"Deprecation": "@1795305600", "Sunset": "Thu, 05 Dec 2030 00:00:00 GMT"}
	tests := []struct {
		name   string
		c      call
		status int
		header map[string]string
		want   string
	}{
		{"unknown path", call{method: "GET", path: "/nothing"}, 404, nil, errBody(404, codeNotFound, "no such resource: /nothing")},
		{"root points the way", call{method: "GET", path: "/", header: map[string]string{"Authorization": ""}}, 200, nil,
			`{"name":"petstore","description":"A store's catalogue of animals: list, add and get pets under /v1 with a bearer API key.",` +
				`"links":{"pets":"/v1/pets","openapi":"/openapi.yaml","openapiJson":"/openapi.json","health":"/healthz"}}`},
		{"root with another method", call{method: "POST", path: "/", body: "{}"}, 405, map[string]string{"Allow": "GET, HEAD"},
			errBody(405, codeMethodNotAllowed, "method POST is not allowed on /; allowed: GET, HEAD")},
		{"unknown path below the root", call{method: "GET", path: "/index.html"}, 404, nil, errBody(404, codeNotFound, "no such resource: /index.html")},
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
			checkReply(t, send(t, svc.url, tt.c), tt.status, tt.header, tt.want)
		})
	}

	t.Run("HEAD is GET without a body", func(t *testing.T) {
		got := send(t, svc.url, call{method: "HEAD", path: "/v1/pets"})
		if got.status != 200 || len(got.body) != 0 || got.header.Get("Content-Type") != "application/json" {
			t.Errorf("HEAD /v1/pets = %d %q %q", got.status, got.header.Get("Content-Type"), got.body)
		}
	})
}

func TestHealthUnavailable(t *testing.T) {
	svc := startService(t, nil)
	svc.store.close()
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/healthz"}), 503, map[string]string{"Retry-After": "1"},
		errBody(503, codeUnavailable, "database not answering"))
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets"}), 503, map[string]string{"Retry-After": "1"},
		errBody(503, codeUnavailable, "database not answering"))
	// A store failure of no known cause is a 500 that says nothing of it,
	// only the request id to quote.
	id := map[string]string{"X-Request-Id": "back-office-42"}
	checkReply(t, send(t, svc.url, call{method: "POST", path: "/v1/pets", body: `{"name":"Rex","categoryId":1}`, header: id}), 500, id,
		errBody(500, codeInternalError, "internal error (request id back-office-42)"))
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
		{"body of exactly 16 KiB", padTo(`{"name":"Rex","categoryId":1}`, maxBodyBytes), nil,
			`{"id":1,"name":"Rex","categoryId":1,"status":"available"}`},
		{"an escaped letter", `{"name":"R\u0065x","categoryId":1}`, nil,
			`{"id":1,"name":"Rex","categoryId":1,"status":"available"}`},
		{"U+FFFD sent, escaped and not", `{"name":"\ufffd\uFFFD�","categoryId":1}`, nil,
			`{"id":1,"name":"���","categoryId":1,"status":"available"}`},
		{"a surrogate pair", `{"name":"Dog \ud83d\udc36","categoryId":1}`, nil,
			`{"id":1,"name":"Dog 🐶","categoryId":1,"status":"available"}`},
		{"an escaped backslash before ud800", `{"name":"\\ud800","categoryId":1}`, nil,
			`{"id":1,"name":"\\ud800","categoryId":1,"status":"available"}`},
		{"escapes of a quote and a backslash", `{"name":"\u00e9\"\\","categoryId":1}`, nil,
			`{"id":1,"name":"é\"\\","categoryId":1,"status":"available"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := startService(t, nil)
			got := send(t, svc.url, call{method: "POST", path: "/v1/pets", body: tt.body, header: tt.header})
			checkReply(t, got, http.StatusCreated, map[string]string{"Location": "/v1/pets/1"}, tt.want)

			// What was acknowledged is what is stored.
			got = send(t, svc.url, call{method: "GET", path: "/v1/pets/1"})
			checkReply(t, got, http.StatusOK, nil, tt.want)
			got = send(t, svc.url, call{method: "GET", path: "/v1/pets"})
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
		{"not JSON at all", `name=Rex`, nil, 400, bad("request body must be a JSON object")},
		{"a bare word in the object", `{"name":Rex}`, nil, 400, bad("request body is not valid JSON: invalid character 'R' looking for beginning of value")},
		{"array", `[{"name":"Rex","categoryId":1}]`, nil, 400, bad("request body must be a JSON object")},
		{"string", `"Rex"`, nil, 400, bad("request body must be a JSON object")},
		{"null", `null`, nil, 400, bad("request body must be a JSON object")},
		{"a number past float64", `1e999`, nil, 400, bad("request body must be a JSON object")},
		{"members with escapes and nesting", `{"n\u0061me":"a\"b\\c","x":[{"}":"]"}],"categoryId":1}`, nil, 400,
			bad(`unknown field "x" (a NewPet has name, categoryId and status)`)},
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
		{"name of zero-width spaces", `{"name":"\u200b\u200b","categoryId":1}`, nil, 400, bad("name must not contain invisible format characters (Unicode category Cf, such as U+200B zero-width space, U+FEFF or the U+202E right-to-left override)")},
		{"name with a byte order mark", `{"name":"\ufeffRex","categoryId":1}`, nil, 400, bad("name must not contain invisible format characters (Unicode category Cf, such as U+200B zero-width space, U+FEFF or the U+202E right-to-left override)")},
		{"name with a right-to-left override, unescaped", `{"name":"Rex` + "\u202e" + `xoF","categoryId":1}`, nil, 400, bad("name must not contain invisible format characters (Unicode category Cf, such as U+200B zero-width space, U+FEFF or the U+202E right-to-left override)")},
		{"name with a soft hyphen", `{"name":"Re` + "\u00ad" + `x","categoryId":1}`, nil, 400, bad("name must not contain invisible format characters (Unicode category Cf, such as U+200B zero-width space, U+FEFF or the U+202E right-to-left override)")},
		{"name with a line separator", `{"name":"Rex\u2028Admin","categoryId":1}`, nil, 400, bad("name must not contain line or paragraph separators (U+2028, U+2029)")},
		{"name with a paragraph separator, unescaped", `{"name":"Rex` + "\u2029" + `Admin","categoryId":1}`, nil, 400, bad("name must not contain line or paragraph separators (U+2028, U+2029)")},
		{"name with a lone high surrogate", `{"name":"Rex\ud800","categoryId":1}`, nil, 400, bad(`name must not contain a \u escape of half a UTF-16 surrogate pair (such as \ud800 alone): it is not a character`)},
		{"name with a lone low surrogate", `{"name":"\udc36Rex","categoryId":1}`, nil, 400, bad(`name must not contain a \u escape of half a UTF-16 surrogate pair (such as \ud800 alone): it is not a character`)},
		{"name with a high surrogate before a letter", `{"name":"\ud83d\u0041","categoryId":1}`, nil, 400, bad(`name must not contain a \u escape of half a UTF-16 surrogate pair (such as \ud800 alone): it is not a character`)},
		{"name with two high surrogates", `{"name":"\uDBFF\uDBFF","categoryId":1}`, nil, 400, bad(`name must not contain a \u escape of half a UTF-16 surrogate pair (such as \ud800 alone): it is not a character`)},
		{"name with a lone half after an escaped backslash", `{"name":"a\\\ud800","categoryId":1}`, nil, 400, bad(`name must not contain a \u escape of half a UTF-16 surrogate pair (such as \ud800 alone): it is not a character`)},
		{"name with a pair and a lone low surrogate", `{"name":"\ud83d\udc36\udc36","categoryId":1}`, nil, 400, bad(`name must not contain a \u escape of half a UTF-16 surrogate pair (such as \ud800 alone): it is not a character`)},
		{"name with text ufffd, then a lone half", `{"name":"\\ufffd\ud800","categoryId":1}`, nil, 400, bad(`name must not contain a \u escape of half a UTF-16 surrogate pair (such as \ud800 alone): it is not a character`)},
		{"categoryId as string", `{"name":"Rex","categoryId":"1"}`, nil, 400, bad(catRange + ", not a string")},
		{"categoryId fraction", `{"name":"Rex","categoryId":1.5}`, nil, 400, bad(catRange + `, got "1.5"`)},
		{"categoryId 1.0", `{"name":"Rex","categoryId":1.0}`, nil, 400, bad(catRange + `, got "1.0"`)},
		{"categoryId exponent", `{"name":"Rex","categoryId":1e3}`, nil, 400, bad(catRange + `, got "1e3"`)},
		{"categoryId zero", `{"name":"Rex","categoryId":0}`, nil, 400, bad(catRange + `, got "0"`)},
		{"categoryId negative", `{"name":"Rex","categoryId":-3}`, nil, 400, bad(catRange + `, got "-3"`)},
		{"categoryId above int64", `{"name":"Rex","categoryId":9223372036854775808}`, nil, 400,
			bad(catRange + `, got "9223372036854775808"`)},
		{"categoryId boolean", `{"name":"Rex","categoryId":true}`, nil, 400, bad(catRange + `, got "true"`)},
		{"unknown status", `{"name":"Rex","categoryId":1,"status":"lost"}`, nil, 400, bad(statusEnum + `"lost"`)},
		{"status in capitals", `{"name":"Rex","categoryId":1,"status":"Sold"}`, nil, 400, bad(statusEnum + `"Sold"`)},
		{"null status", `{"name":"Rex","categoryId":1,"status":null}`, nil, 400, bad(statusEnum + `null`)},
		{"status not a string", `{"name":"Rex","categoryId":1,"status":1}`, nil, 400, bad(statusEnum + `a JSON number`)},
		{"client sends id", `{"id":5,"name":"Rex","categoryId":1}`, nil, 400, bad("id must not be sent: the service assigns it")},
		{"unknown field", `{"name":"Rex","categoryId":1,"colour":"brown"}`, nil, 400,
			bad(`unknown field "colour" (a NewPet has name, categoryId and status)`)},
		{"misspelt field", `{"name":"Rex","categoryID":1}`, nil, 400,
			bad(`unknown field "categoryID" (a NewPet has name, categoryId and status); categoryId is required`)},
		{"every problem at once", `{"id":1,"name":"","categoryId":"x","status":"gone"}`, nil, 400,
			bad(`id must not be sent: the service assigns it; name must not be empty or only whitespace; ` + catRange + `, not a string; ` + statusEnum + `"gone"`)},
		{"text/plain", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": "text/plain"}, 415,
			errBody(415, codeUnsupportedMediaType, "send the body as JSON with the header Content-Type: application/json (curl: --json)")},
		{"form", `name=Rex`, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415,
			errBody(415, codeUnsupportedMediaType, "send the body as JSON with the header Content-Type: application/json (curl: --json)")},
		{"JSON in another charset", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": "application/json; charset=latin1"}, 415,
			errBody(415, codeUnsupportedMediaType, "send the body as JSON with the header Content-Type: application/json (curl: --json)")},
		{"unparsable Content-Type", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": "application/json; ;"}, 415,
			errBody(415, codeUnsupportedMediaType, "send the body as JSON with the header Content-Type: application/json (curl: --json)")},
		{"one byte over 16 KiB", padTo(`{"name":"Rex","categoryId":1}`, maxBodyBytes+1), nil, 413,
			errBody(413, codeBodyTooLarge, "request body is larger than 16384 bytes (16 KiB); a pet's body is well under 2 KB")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			svc := startService(t, nil)
			got := send(t, svc.url, call{method: "POST", path: "/v1/pets", body: tt.body, header: tt.header})
			checkReply(t, got, tt.status, map[string]string{"Location": ""}, tt.want)
			// Nothing was stored.
			checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets"}), 200, nil, `[]`)
		})
	}
}

// TestRawBodies sends bodies as no client library would. One that comes
// chunked, with a Content-Length beside it or not, gets one 411 and its
// connection is closed: a request smuggled behind it gets no answer. One
// announced over the limit that waits for 100 Continue, or is announced
// larger than the service drains, is answered 413 at once, unread; one
// that stalls while it is drained is answered when the drain's time runs
// out, not never. Nothing is stored.
func TestRawBodies(t *testing.T) {
	// A create deadline of about a second, as a write timeout of 1.25 s
	// gives.
	svc := startService(t, nil, "-write-timeout", "1250ms")
	smuggled := "GET /v1/pets/1 HTTP/1.1\r\nHost: petstore\r\nAuthorization: Bearer " + testKey + "\r\n\r\n"
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n%s", len(newPetBody), newPetBody, smuggled)
	lengthRequired := errBody(411, codeLengthRequired, "send the request body with a Content-Length header, not Transfer-Encoding: chunked")
	tooLarge := errBody(413, codeBodyTooLarge, "request body is larger than 16384 bytes (16 KiB); a pet's body is well under 2 KB")
	for _, tt := range []struct {
		name, headers, sent string
		status              int
		want                string
	}{
		{"chunked and Content-Length", "Transfer-Encoding: chunked\r\nContent-Length: 35\r\n", chunked, 411, lengthRequired},
		{"chunked", "Transfer-Encoding: chunked\r\n", chunked, 411, lengthRequired},
		{"waits for 100 Continue", "Content-Length: 10000000\r\nExpect: 100-continue\r\n", "", 413, tooLarge},
		{"announced larger than the drain", "Content-Length: 10000000\r\n", strings.Repeat("x", 1024), 413, tooLarge},
		{"stalls while drained", "Content-Length: 1048576\r\n", strings.Repeat("x", 1024), 413, tooLarge},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", strings.TrimPrefix(svc.url, "http://"))
			must(t, err)
			defer conn.Close()
			fmt.Fprintf(conn, "POST /v1/pets HTTP/1.1\r\nHost: petstore\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n%s\r\n%s", testKey, tt.headers, tt.sent)
			conn.SetReadDeadline(time.Now().Add(patience))
			r := bufio.NewReader(conn)
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			checkReply(t, reply{status: resp.StatusCode, header: resp.Header, body: b}, tt.status, nil, tt.want)
			if tt.status != 411 {
				return
			}
			// The service closes the connection (no deadline passes), and
			// the smuggled request is not answered.
			if rest, err := io.ReadAll(r); err != nil || len(rest) > 0 {
				t.Errorf("after the 411: %v, read %q", err, rest)
			}
		})
	}
	checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets"}), 200, nil, `[]`)

	// With the default write timeout (a create deadline of 28 s), a body
	// over the limit that stalls is read off until -read-timeout, no
	// longer: the build before answered it after 28 s.
	svc = startService(t, nil, "-read-timeout", "1s")
	conn, err := net.Dial("tcp", strings.TrimPrefix(svc.url, "http://"))
	must(t, err)
	defer conn.Close()
	sent := time.Now()
	fmt.Fprintf(conn, "POST /v1/pets HTTP/1.1\r\nHost: petstore\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n%s",
		testKey, strings.Repeat("x", 20<<10))
	conn.SetReadDeadline(time.Now().Add(patience))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("a stalled body over the limit: no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	checkReply(t, reply{status: resp.StatusCode, header: resp.Header, body: b}, 413, nil, tooLarge)
	if took := time.Since(sent); took > 10*time.Second {
		t.Errorf("a stalled body over the limit was answered after %s, want about -read-timeout (1s), far below the create deadline (28 s)", took.Round(time.Millisecond))
	}
}

func TestListPets(t *testing.T) {
	svc := startService(t, nil)
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
		createPets(t, svc.url, body)
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
		{"empty pairs, more than 10,000", "?&limit=1&status=sold" + strings.Repeat("&", 10001), 200,
			`</v1/pets?limit=1&status=sold&after=5>; rel="next"`, page(5)},
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
			got := send(t, svc.url, call{method: "GET", path: "/v1/pets" + tt.query})
			checkReply(t, got, tt.status, map[string]string{"Link": tt.link}, tt.want)
		})
	}
}

// TestListPetsFollowLinks walks the whole catalogue by following next
// links, as a client would, and must see every pet exactly once.
func TestListPetsFollowLinks(t *testing.T) {
	svc := startService(t, nil)
	for i := 1; i <= 23; i++ {
		status := []string{"available", "pending", "sold"}[i%3]
		createPets(t, svc.url, fmt.Sprintf(`{"name":"p%d","categoryId":1,"status":"%s"}`, i, status))
	}
	for _, tt := range []struct {
		start string
		want  int
	}{{"/v1/pets?limit=4", 23}, {"/v1/pets?limit=3&status=pending", 8}, {"/v1/pets?limit=7&status=available", 7}} {
		// walkFrom follows each Link as a relative path: an absolute or
		// malformed link fails the walk.
		seen := map[int64]bool{}
		for _, p := range walkFrom(t, svc.url, tt.start) {
			if seen[p.ID] {
				t.Errorf("%s: pet %d seen twice", tt.start, p.ID)
			}
			seen[p.ID] = true
		}
		if len(seen) != tt.want {
			t.Errorf("%s: saw %d pets, want %d", tt.start, len(seen), tt.want)
		}
	}
}

func TestGetPet(t *testing.T) {
	svc := startService(t, nil)
	createPets(t, svc.url, `{"name":"Rex","categoryId":3,"status":"sold"}`)
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
		{"a query parameter, as listPets would refuse it", "/v1/pets/1?x=1", nil, 400,
			errBody(400, codeInvalidParameter, `unknown query parameter "x"; this operation takes none`)},
		{"a listPets parameter", "/v1/pets/1?status=sold", nil, 400,
			errBody(400, codeInvalidParameter, `unknown query parameter "status"; this operation takes none`)},
		{"empty pairs are nothing", "/v1/pets/1?&&", nil, 200, `{"id":1,"name":"Rex","categoryId":3,"status":"sold"}`},
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
			got := send(t, svc.url, call{method: "GET", path: tt.path, header: tt.header})
			checkReply(t, got, tt.status, deprecation, tt.want)
		})
	}
}

func TestIdempotencyKey(t *testing.T) {
	const rex = `{"name":"Rex","categoryId":1}`
	created := `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`
	withKey := func(key string) map[string]string { return map[string]string{"Idempotency-Key": key} }
	badKey := func(msg string) string { return errBody(400, codeInvalidParameter, msg) }

	t.Run("retries replay the first answer", func(t *testing.T) {
		svc := startService(t, nil)
		first := send(t, svc.url, call{method: "POST", path: "/v1/pets", body: rex, header: withKey("order-42")})
		checkReply(t, first, 201, map[string]string{"Location": "/v1/pets/1", "Idempotent-Replayed": ""}, created)
		for _, tt := range []struct{ name, body, key string }{
			{"same body", rex, "order-42"},
			{"same pet written differently", `{ "categoryId": 1, "status": "available", "name": "Rex" }`, "order-42"},
		} {
			got := send(t, svc.url, call{method: "POST", path: "/v1/pets", body: tt.body, header: withKey(tt.key)})
			checkReply(t, got, 201, map[string]string{"Location": "/v1/pets/1", "Idempotent-Replayed": "true"}, created)
		}
		// Another key is another pet; the same key with another pet is refused.
		checkReply(t, send(t, svc.url, call{method: "POST", path: "/v1/pets", body: rex, header: withKey("order-43")}), 201,
			map[string]string{"Location": "/v1/pets/2"}, `{"id":2,"name":"Rex","categoryId":1,"status":"available"}`)
		checkReply(t, send(t, svc.url, call{method: "POST", path: "/v1/pets", body: `{"name":"Tom","categoryId":1}`, header: withKey("order-42")}), 422,
			map[string]string{"Location": ""},
			errBody(422, codeIdempotencyKeyReused, "this Idempotency-Key was already used for a different pet; use a new key for a new request"))
		checkReply(t, send(t, svc.url, call{method: "POST", path: "/v1/pets", body: `{"name":"Rex","categoryId":1,"status":"sold"}`, header: withKey("order-42")}), 422,
			nil, errBody(422, codeIdempotencyKeyReused, "this Idempotency-Key was already used for a different pet; use a new key for a new request"))
		// An invalid body is a 400 whatever the key.
		checkReply(t, send(t, svc.url, call{method: "POST", path: "/v1/pets", body: `{"name":"Rex"}`, header: withKey("order-42")}), 400,
			nil, errBody(400, codeInvalidBody, "categoryId is required"))
		checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets"}), 200, nil,
			`[`+created+`,{"id":2,"name":"Rex","categoryId":1,"status":"available"}]`)
	})

	t.Run("key rules", func(t *testing.T) {
		svc := startService(t, nil)
		for _, tt := range []struct {
			name   string
			key    string
			status int
			want   string
		}{
			{"255 characters", strings.Repeat("k", 255), 201, created},
			{"256 characters", strings.Repeat("k", 256), 400, badKey("Idempotency-Key must be 1 to 255 printable ASCII characters, got 256")},
			{"control character (tab)", "a\tb", 400, badKey("Idempotency-Key must be 1 to 255 printable ASCII characters")},
			{"non-ASCII", "clé", 400, badKey("Idempotency-Key must be 1 to 255 printable ASCII characters")},
		} {
			t.Run(tt.name, func(t *testing.T) {
				got := send(t, svc.url, call{method: "POST", path: "/v1/pets", body: rex, header: withKey(tt.key)})
				checkReply(t, got, tt.status, nil, tt.want)
			})
		}
		got := send(t, svc.url, call{method: "POST", path: "/v1/pets", body: rex, header: withKey("a"), extra: http.Header{"Idempotency-Key": {"b"}}})
		checkReply(t, got, 400, nil, badKey("send one Idempotency-Key header, not several"))
		// Only the 255-character key created a pet.
		checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets"}), 200, nil, "["+created+"]")
	})

	t.Run("concurrent requests with one key create one pet", func(t *testing.T) {
		svc := startService(t, nil)
		const n = 24
		var wg sync.WaitGroup
		replies := make([]reply, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				replies[i] = send(t, svc.url, call{method: "POST", path: "/v1/pets", body: rex, header: withKey("same")})
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
		checkReply(t, send(t, svc.url, call{method: "GET", path: "/v1/pets"}), 200, nil, "["+created+"]")
	})
}

// TestReadYourWrites: while others create concurrently (so creates are
// committed in shared batches), every create is answered 201, never
// "database is locked"; every client that got a 201 sees its pet at once
// by get and by list; and every pet is stored once.
func TestReadYourWrites(t *testing.T) {
	svc := startService(t, nil)
	const workers, each = 16, 15
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				body := fmt.Sprintf(`{"name":"ryw %d-%d","categoryId":%d,"status":"sold"}`, w, i, w+1)
				created := send(t, svc.url, call{method: "POST", path: "/v1/pets", body: body})
				if created.err != nil || created.status != 201 {
					t.Errorf("create: %v %d %s", created.err, created.status, created.body)
					return
				}
				got := send(t, svc.url, call{method: "GET", path: created.header.Get("Location")})
				if got.err != nil || got.status != 200 || !bytes.Equal(got.body, created.body) {
					t.Errorf("get after 201: %v %d %s, want %s", got.err, got.status, got.body, created.body)
				}
				p := decodePet(t, created.body)
				for _, q := range []string{"", "&status=sold"} {
					list := send(t, svc.url, call{method: "GET", path: fmt.Sprintf("/v1/pets?limit=1&after=%d%s", p.ID-1, q)})
					if want := "[" + strings.TrimSpace(string(created.body)) + "]\n"; list.err != nil || string(list.body) != want {
						t.Errorf("list after 201: %v %s, want %s", list.err, list.body, want)
					}
				}
			}
		}()
	}
	wg.Wait()
	names := map[string]bool{}
	all := walkCatalogue(t, svc.url)
	for _, p := range all {
		names[p.Name] = true
	}
	if len(all) != workers*each || len(names) != workers*each {
		t.Errorf("stored %d pets, %d distinct, want %d", len(all), len(names), workers*each)
	}
}

// TestCreateDeadline: a create's deadline is a margin inside the write
// timeout, and positive for any timeout, so the no-late-commit rule is
// never off.
func TestCreateDeadline(t *testing.T) {
	for _, tt := range []struct{ timeout, want time.Duration }{
		{30 * time.Second, 28 * time.Second},
		{5 * time.Second, 3750 * time.Millisecond},
		{time.Second, 750 * time.Millisecond},
		{400 * time.Millisecond, 200 * time.Millisecond},
		{250 * time.Millisecond, 125 * time.Millisecond},
		{time.Millisecond, 500 * time.Microsecond},
	} {
		if got := createDeadline(tt.timeout); got != tt.want {
			t.Errorf("createDeadline(%v) = %v, want %v", tt.timeout, got, tt.want)
		}
	}
}
