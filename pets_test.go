package main

import (
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// The deprecated route's headers, on its every answer.
var deprecated = map[string]string{"Deprecation": "@1795305600", "Sunset": "Thu, 05 Dec 2030 00:00:00 GMT", "Link": `<../pets>; rel="successor-version"`}

// with is h with one header more.
func with(h map[string]string, k, v string) map[string]string {
	out := maps.Clone(h)
	out[k] = v
	return out
}

// TestSession runs a session of calls against one service, in order: each
// answer depends on what the calls before it stored.
func TestSession(t *testing.T) {
	svc := startService(t, nil)
	noKey := map[string]string{"Authorization": ""}
	rex := `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`
	tom := `{"id":2,"name":"Tom","categoryId":2,"status":"pending"}`
	luna := `{"id":3,"name":"Luna","categoryId":9007199254740993,"status":"available"}`
	for _, tt := range []struct {
		name string
		c    call
		want reply
	}{
		{"an empty catalogue", call{method: "GET", path: "/v1/pets"}, reply{status: 200, header: map[string]string{"Link": ""}, body: `[]`}},
		{"create", call{method: "POST", path: "/v1/pets", body: `{"name":"Rex","categoryId":1}`}, reply{201, map[string]string{"Location": "pets/1"}, rex}},
		{"create with a status", call{method: "POST", path: "/v1/pets", body: `{"status":"pending","categoryId":2,"name":"Tom"}`}, reply{201, map[string]string{"Location": "pets/2"}, tom}},
		{"an int64 above 2^53 kept exactly", call{method: "POST", path: "/v1/pets", body: `{"name":"Luna","categoryId":9007199254740993}`}, reply{201, nil, luna}},
		{"list", call{method: "GET", path: "/v1/pets"}, reply{200, map[string]string{"Link": ""}, "[" + rex + "," + tom + "," + luna + "]"}},
		{"a page with a next link", call{method: "GET", path: "/v1/pets?limit=2"}, reply{200, map[string]string{"Link": `<pets?limit=2&after=2>; rel="next"`}, "[" + rex + "," + tom + "]"}},
		{"the last page, exactly full, has none", call{method: "GET", path: "/v1/pets?limit=1&after=2"}, reply{200, map[string]string{"Link": ""}, "[" + luna + "]"}},
		{"a filtered page keeps the filter", call{method: "GET", path: "/v1/pets?status=available&limit=1"}, reply{200, map[string]string{"Link": `<pets?limit=1&status=available&after=1>; rel="next"`}, "[" + rex + "]"}},
		{"its next page", call{method: "GET", path: "/v1/pets?limit=1&status=available&after=1"}, reply{200, map[string]string{"Link": ""}, "[" + luna + "]"}},
		{"sold: none", call{method: "GET", path: "/v1/pets?status=sold"}, reply{200, nil, `[]`}},
		{"empty pairs mean nothing", call{method: "GET", path: "/v1/pets?&limit=1&&"}, reply{200, nil, "[" + rex + "]"}},
		{"get, deprecated", call{method: "GET", path: "/v1/pets/2"}, reply{200, deprecated, tom}},
		{"get an unknown id", call{method: "GET", path: "/v1/pets/99"}, reply{404, deprecated, errorBody(404, "not_found", "no pet with id 99")}},
		{"HEAD is GET without a body", call{method: "HEAD", path: "/v1/pets"}, reply{200, nil, ""}},
		{"no key", call{method: "GET", path: "/v1/pets", header: noKey}, reply{401, map[string]string{"WWW-Authenticate": `Bearer realm="petstore"`},
			errorBody(401, "unauthorized", "missing API key: send the header Authorization: Bearer <key>")}},
		{"a wrong key", call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": "Bearer wrong-key-0000000000000"}}, reply{401,
			map[string]string{"WWW-Authenticate": `Bearer realm="petstore", error="invalid_token"`}, errorBody(401, "unauthorized", "invalid API key")}},
		{"the scheme in any case", call{method: "GET", path: "/v1/pets?limit=1", header: map[string]string{"Authorization": "bEARER " + testKey}}, reply{200, nil, "[" + rex + "]"}},
		{"another scheme", call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": "Basic " + testKey}}, reply{401, nil,
			errorBody(401, "unauthorized", "malformed Authorization header: expected Authorization: Bearer <key>")}},
		{"a key before a 404 under /v1", call{method: "GET", path: "/v1/animals", header: noKey}, reply{401, nil, errorBody(401, "unauthorized", "missing API key: send the header Authorization: Bearer <key>")}},
		{"a key before a 405", call{method: "DELETE", path: "/v1/pets/1", header: noKey}, reply{401, deprecated, errorBody(401, "unauthorized", "missing API key: send the header Authorization: Bearer <key>")}},
		{"no update", call{method: "PUT", path: "/v1/pets/1", body: rex}, reply{405, with(deprecated, "Allow", "GET, HEAD"), errorBody(405, "method_not_allowed", "method PUT is not allowed on /v1/pets/1; allowed: GET, HEAD")}},
		{"no delete", call{method: "DELETE", path: "/v1/pets"}, reply{405, map[string]string{"Allow": "GET, HEAD, POST"}, errorBody(405, "method_not_allowed", "method DELETE is not allowed on /v1/pets; allowed: GET, HEAD, POST")}},
		{"a 405 on a public path", call{method: "POST", path: "/healthz", header: noKey}, reply{405, map[string]string{"Allow": "GET, HEAD"}, errorBody(405, "method_not_allowed", "method POST is not allowed on /healthz; allowed: GET, HEAD")}},
		{"orders are named, not specified", call{method: "GET", path: "/v1/store/orders"}, reply{501, nil,
			errorBody(501, "not_implemented", "GET /v1/store/orders is named by the specification but not specified, so it is not implemented")}},
		{"an unknown path", call{method: "GET", path: "/v1/animals"}, reply{404, nil, errorBody(404, "not_found", "no such resource: /v1/animals")}},
		{"a trailing slash", call{method: "GET", path: "/v1/pets/"}, reply{404, nil, errorBody(404, "not_found", "no such resource: /v1/pets/")}},
		{"no version", call{method: "GET", path: "/pets", header: noKey}, reply{404, nil, errorBody(404, "not_found", "no such resource: /pets")}},
		{"health, no key", call{method: "GET", path: "/healthz", header: noKey}, reply{200, nil, `{"status":"ok"}`}},
		{"the index, no key", call{method: "GET", path: "/", header: noKey}, reply{200, nil, `{"name":"petstore","description":"A store's catalogue of animals: list, add and get pets under /v1 with a bearer API key.",` +
			`"links":{"pets":"v1/pets","openapi":"openapi.yaml","openapiJson":"openapi.json","health":"healthz"}}`}},
		{"the index, another method", call{method: "POST", path: "/", header: noKey}, reply{405, map[string]string{"Allow": "GET, HEAD"}, errorBody(405, "method_not_allowed", "method POST is not allowed on /; allowed: GET, HEAD")}},
		{"the client's request id", call{method: "GET", path: "/v1/pets/77", header: map[string]string{"X-Request-Id": "office-42.a_b:c"}}, reply{404,
			map[string]string{"X-Request-Id": "office-42.a_b:c", "X-Content-Type-Options": "nosniff"}, errorBody(404, "not_found", "no pet with id 77")}},
	} {
		t.Run(tt.name, func(t *testing.T) { svc.check(t, tt.c, tt.want) })
	}
	// A wrong key on a public path leaves no trace of itself in the log.
	svc.check(t, call{method: "GET", path: "/healthz", header: map[string]string{"Authorization": "Bearer wrong-key-1111111111111"}}, reply{200, nil, `{"status":"ok"}`})
	// The access log: a line per request, the accepted key by its
	// digest's first 8 hex digits, never a key, and each failed
	// authentication by the client's address.
	svc.stop()
	log := svc.log.String()
	for _, want := range []string{`request_id=office-42.a_b:c method=GET path=/v1/pets/77 status=404`, `key_id=` + fmt.Sprintf("%x", digestOf(testKey))[:8],
		`msg="authentication failed" client=127.0.0.1 key=invalid path=/v1/pets`, `msg="authentication failed" client=127.0.0.1 key=missing path=/v1/animals`} {
		if !strings.Contains(log, want) {
			t.Errorf("the log lacks %q:\n%s", want, log)
		}
	}
	for _, key := range []string{"wrong-key-0000000000000", "wrong-key-1111111111111"} {
		if strings.Contains(log, key) || strings.Contains(log, fmt.Sprintf("%x", digestOf(key))[:8]) {
			t.Errorf("the log holds %s, or its digest:\n%s", key, log)
		}
	}
	if strings.Contains(log, testKey) {
		t.Errorf("the log holds the key:\n%s", log)
	}
}

// TestConcurrentReads: lists, gets and health checks from many clients at
// once, for two seconds, are all answered: none holds a reader another
// waits for. The checks write one probe a second, however many they are.
func TestConcurrentReads(t *testing.T) {
	svc := startService(t, nil)
	createPets(t, svc, `{"name":"Rex","categoryId":1}`, `{"name":"Tom","categoryId":2,"status":"sold"}`)
	execSQL(t, svc.db, `CREATE TABLE probes (at); CREATE TRIGGER count_probes AFTER INSERT ON pets BEGIN INSERT INTO probes VALUES (1); END`)
	start, clients := time.Now(), make(chan bool, 80)
	for i := range cap(clients) {
		go func() {
			path := []string{"/v1/pets?status=sold", "/v1/pets?limit=1", "/v1/pets/2", "/healthz"}[i%4]
			for time.Since(start) < 2*time.Second { // across a second's turn, at least
				if got, _ := svc.send(t, call{method: "GET", path: path}); got.status != 200 {
					t.Errorf("GET %s: %d %s", path, got.status, got.body)
				}
			}
			clients <- true
		}()
	}
	for range cap(clients) {
		<-clients
	}
	var probes int
	if must(t, sqlite(t, svc.db).QueryRow("SELECT count(*) FROM probes").Scan(&probes)); probes > int(time.Since(start).Seconds())+1 {
		t.Errorf("%d probes written by 20 clients of /healthz in %v", probes, time.Since(start))
	}
}

// TestCreate: each body is stored, and read back, as it is answered.
func TestCreate(t *testing.T) {
	long := strings.Repeat("é", 100)
	for _, tt := range []struct {
		name, body string
		header     map[string]string
		want       string
	}{
		{"sold, fields in any order", `{"status":"sold","categoryId":2,"name":"Max"}`, nil, `{"id":1,"name":"Max","categoryId":2,"status":"sold"}`},
		{"categoryId at int64's top", `{"name":"Max","categoryId":9223372036854775807}`, nil, `{"id":1,"name":"Max","categoryId":9223372036854775807,"status":"available"}`},
		{"100 characters, two bytes each", `{"name":"` + long + `","categoryId":1}`, nil, `{"id":1,"name":"` + long + `","categoryId":1,"status":"available"}`},
		{"HTML and quotes as sent", `{"name":"<Rex & \"Co\">","categoryId":1}`, nil, `{"id":1,"name":"<Rex & \"Co\">","categoryId":1,"status":"available"}`},
		{"a charset parameter", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": "application/json; charset=UTF-8"}, `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`},
		{"no Content-Type is JSON", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": ""}, `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`},
		{"exactly 16 KiB", `{"name":"Rex","categoryId":1}` + strings.Repeat(" ", maxBodyBytes-29), nil, `{"id":1,"name":"Rex","categoryId":1,"status":"available"}`},
		{"a surrogate pair", `{"name":"Dog \ud83d\udc36","categoryId":1}`, nil, `{"id":1,"name":"Dog 🐶","categoryId":1,"status":"available"}`},
		{"an escaped backslash, then ud800", `{"name":"\\ud800","categoryId":1}`, nil, `{"id":1,"name":"\\ud800","categoryId":1,"status":"available"}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			svc := startService(t, nil)
			svc.check(t, call{method: "POST", path: "/v1/pets", body: tt.body, header: tt.header}, reply{201, map[string]string{"Location": "pets/1"}, tt.want})
			svc.check(t, call{method: "GET", path: "/v1/pets/1"}, reply{200, nil, tt.want})
			svc.check(t, call{method: "GET", path: "/v1/pets"}, reply{200, nil, "[" + tt.want + "]"})
		})
	}
}

// TestRefused: each bad request gets its named 4xx, and stores nothing.
func TestRefused(t *testing.T) {
	const catRange = "categoryId must be a JSON integer from 1 to 9223372036854775807"
	const statusEnum = "status must be one of available, pending, sold (or omitted, for available), got "
	const cf = "name must not contain control, format or line separator characters (such as tab, newline, U+200B zero-width space, U+202E right-to-left override or U+2028)"
	const surrogate = `name must not contain U+FFFD, the replacement character, or a \u escape of half a UTF-16 surrogate pair (such as \ud800 alone)`
	const json415 = "send the body as JSON with the header Content-Type: application/json (curl: --json)"
	svc := startService(t, nil)
	for _, tt := range []struct {
		name, body string
		header     map[string]string
		status     int
		message    string
	}{
		{"empty", "", nil, 400, `request body is empty; send a JSON object such as {"name":"Rex","categoryId":1}`},
		{"cut short", `{"name":"Rex","categoryId":1`, nil, 400, "request body is not valid JSON: unexpected end of JSON input (at byte 28)"},
		{"not JSON", `name=Rex`, nil, 400, "request body must be a JSON object"},
		{"a bare word", `{"name":Rex}`, nil, 400, "request body is not valid JSON: invalid character 'R' looking for beginning of value (at byte 9)"},
		{"an array", `[{"name":"Rex","categoryId":1}]`, nil, 400, "request body must be a JSON object"},
		{"two objects", `{"name":"Rex","categoryId":1} {"name":"Tom","categoryId":1}`, nil, 400, "request body is not valid JSON: invalid character '{' after top-level value (at byte 31)"},
		{"invalid UTF-8", "{\"name\":\"R\xffx\",\"categoryId\":1}", nil, 400, "request body is not valid UTF-8"},
		{"empty object", `{}`, nil, 400, "name is required; categoryId is required"},
		{"null name", `{"name":null,"categoryId":1}`, nil, 400, "name is required"},
		{"null categoryId", `{"name":"Rex","categoryId":null}`, nil, 400, "categoryId is required"},
		{"name a number", `{"name":42,"categoryId":1}`, nil, 400, "name must be a string"},
		{"whitespace name", `{"name":" \t ","categoryId":1}`, nil, 400, "name must not be empty or only whitespace"},
		{"101 characters", `{"name":"` + strings.Repeat("a", 101) + `","categoryId":1}`, nil, 400, "name must be at most 100 characters, got 101"},
		{"a newline", `{"name":"Rex\nTom","categoryId":1}`, nil, 400, "name must not contain control, format or line separator characters (such as tab, newline, U+200B zero-width space, U+202E right-to-left override or U+2028)"},
		{"zero-width spaces", `{"name":"\u200b\u200b","categoryId":1}`, nil, 400, cf},
		{"a right-to-left override", `{"name":"Rex` + "\u202e" + `xoF","categoryId":1}`, nil, 400, cf},
		{"a line separator", `{"name":"Rex\u2028Admin","categoryId":1}`, nil, 400, "name must not contain control, format or line separator characters (such as tab, newline, U+200B zero-width space, U+202E right-to-left override or U+2028)"},
		{"a lone high surrogate", `{"name":"Rex\ud800","categoryId":1}`, nil, 400, surrogate},
		{"a lone half after an escaped backslash", `{"name":"a\\\ud800","categoryId":1}`, nil, 400, surrogate},
		{"U+FFFD itself", `{"name":"\ufffd","categoryId":1}`, nil, 400, surrogate},
		{"categoryId a string", `{"name":"Rex","categoryId":"1"}`, nil, 400, catRange + `, got "\"1\""`},
		{"categoryId 1.0", `{"name":"Rex","categoryId":1.0}`, nil, 400, catRange + `, got "1.0"`},
		{"categoryId 1e3", `{"name":"Rex","categoryId":1e3}`, nil, 400, catRange + `, got "1e3"`},
		{"categoryId 0", `{"name":"Rex","categoryId":0}`, nil, 400, catRange + `, got "0"`},
		{"categoryId above int64", `{"name":"Rex","categoryId":9223372036854775808}`, nil, 400, catRange + `, got "9223372036854775808"`},
		{"status in capitals", `{"name":"Rex","categoryId":1,"status":"Sold"}`, nil, 400, statusEnum + `"Sold"`},
		{"null status", `{"name":"Rex","categoryId":1,"status":null}`, nil, 400, statusEnum + `null`},
		{"id sent", `{"id":5,"name":"Rex","categoryId":1}`, nil, 400, "id must not be sent: the service assigns it"},
		{"a misspelt field", `{"name":"Rex","categoryID":1}`, nil, 400, `unknown field "categoryID" (a NewPet has name, categoryId and status); categoryId is required`},
		{"every field wrong", `{"name":"","categoryId":"x","status":"gone"}`, nil, 400, "name must not be empty or only whitespace; " + catRange + `, got "\"x\""; ` + statusEnum + `"gone"`},
		{"text/plain", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": "text/plain"}, 415, json415},
		{"another charset", `{"name":"Rex","categoryId":1}`, map[string]string{"Content-Type": "application/json; charset=latin1"}, 415, json415},
		{"one byte over 16 KiB", `{"name":"Rex","categoryId":1}` + strings.Repeat(" ", maxBodyBytes-28), nil, 413, "request body is larger than 16384 bytes (16 KiB); a pet's body is well under 2 KB"},
		{"a chunked body over 16 KiB", `{"name":"Rex","categoryId":1}` + strings.Repeat(" ", maxBodyBytes), map[string]string{"Transfer-Encoding": "chunked"}, 413, "request body is larger than 16384 bytes (16 KiB); a pet's body is well under 2 KB"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code := map[int]string{400: "invalid_body", 413: "body_too_large", 415: "unsupported_media_type"}[tt.status]
			svc.check(t, call{method: "POST", path: "/v1/pets", body: tt.body, header: tt.header}, reply{tt.status, map[string]string{"Location": ""}, errorBody(tt.status, code, tt.message)})
		})
	}
	for _, tt := range []struct{ path, message string }{
		{"/v1/pets?limit=0", `limit must be an integer from 1 to 100, got "0"`},
		{"/v1/pets?limit=101", `limit must be an integer from 1 to 100, got "101"`},
		{"/v1/pets?limit=1.5", `limit must be an integer from 1 to 100, got "1.5"`},
		{"/v1/pets?limit=%2B1", `limit must be an integer from 1 to 100, got "+1"`},
		{"/v1/pets?status=lost", `status must be one of available, pending, sold, got "lost"`},
		{"/v1/pets?after=-1", `after must be the id of the last pet seen (an integer from 0 to 9223372036854775807), got "-1"`},
		{"/v1/pets?stauts=sold", `unknown query parameter "stauts"; known: limit, status, after`},
		{"/v1/pets?zeta=1&alpha=2", `unknown query parameter "alpha"; known: limit, status, after`},
		{"/v1/pets?limit=1&limit=2", "query parameter limit is given more than once"},
		{"/v1/pets?limit=%zz", "malformed query string: use name=value pairs joined by &, percent-encoded"},
		{"/v1/pets/0", `petId must be a pet's id, an integer from 1 to 9223372036854775807, got "0"`},
		{"/v1/pets/abc", `petId must be a pet's id, an integer from 1 to 9223372036854775807, got "abc"`},
		{"/v1/pets/9223372036854775808", `petId must be a pet's id, an integer from 1 to 9223372036854775807, got "9223372036854775808"`},
		{"/v1/pets/1?status=sold", `getPet takes no query parameters, got "status=sold"`},
	} {
		t.Run(tt.path, func(t *testing.T) {
			svc.check(t, call{method: "GET", path: tt.path}, reply{400, nil, errorBody(400, "invalid_parameter", tt.message)})
		})
	}
	svc.check(t, call{method: "GET", path: "/v1/pets"}, reply{200, nil, `[]`})
}

// TestIdempotencyKey: a retry with the same key gets the same 201 and
// stores nothing; a key belongs to the API key that sent it.
func TestIdempotencyKey(t *testing.T) {
	other := "other-key-5d8c1e-77aa02bb"
	svc := startService(t, map[string]string{"PETSTORE_API_KEYS": testKey + "," + other})
	luna := `{"id":1,"name":"Luna","categoryId":3,"status":"available"}`
	key := map[string]string{"Idempotency-Key": "order-42"}
	created := map[string]string{"Location": "pets/1", "Idempotent-Replayed": ""}
	svc.check(t, call{method: "POST", path: "/v1/pets", body: `{"name":"Luna","categoryId":3}`, header: key}, reply{201, created, luna})
	replayed := with(created, "Idempotent-Replayed", "true")
	svc.check(t, call{method: "POST", path: "/v1/pets", body: `{"categoryId":3,"status":"available","name":"Luna"}`, header: key}, reply{201, replayed, luna})
	svc.check(t, call{method: "POST", path: "/v1/pets", body: `{"name":"Milo","categoryId":3}`, header: key}, reply{422, nil, errorBody(422, "idempotency_key_reused",
		"this Idempotency-Key was already used for a different pet; use a new key for a new request")})
	// Another client's order-42 is its own.
	otherKey := map[string]string{"Idempotency-Key": "order-42", "Authorization": "Bearer " + other}
	svc.check(t, call{method: "POST", path: "/v1/pets", body: `{"name":"Luna","categoryId":3}`, header: otherKey}, reply{201, map[string]string{"Location": "pets/2"}, strings.Replace(luna, `"id":1`, `"id":2`, 1)})
	// Twenty at once with one key store one pet; every answer is its 201.
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, header := svc.send(t, call{method: "POST", path: "/v1/pets", body: `{"name":"Kit","categoryId":4}`, header: map[string]string{"Idempotency-Key": "batch-7"}})
			if got.status != 201 || header.Get("Location") != "pets/3" {
				t.Errorf("concurrent create with one key: %d %s %s", got.status, header.Get("Location"), got.body)
			}
		}()
	}
	wg.Wait()
	svc.check(t, call{method: "GET", path: "/v1/pets?after=2"}, reply{200, nil, `[{"id":3,"name":"Kit","categoryId":4,"status":"available"}]`})
	for _, bad := range []string{"order-ü", strings.Repeat("k", 256)} {
		svc.check(t, call{method: "POST", path: "/v1/pets", body: `{"name":"Kit","categoryId":4}`, header: map[string]string{"Idempotency-Key": bad}},
			reply{400, nil, errorBody(400, "invalid_parameter", "send one Idempotency-Key header of 1 to 255 printable ASCII characters")})
	}
}

// TestCORS: the back office's origin may call the API from a browser.
// Others get no CORS headers, and leave no line about themselves.
func TestCORS(t *testing.T) {
	office := "https://office.example.com"
	svc := startService(t, nil, "-cors-origins", office+"/")
	preflight := func(origin, method, path string) call {
		return call{method: "OPTIONS", path: path, header: map[string]string{"Origin": origin, "Access-Control-Request-Method": method, "Authorization": ""}}
	}
	allowed := map[string]string{"Access-Control-Allow-Origin": office, "Access-Control-Allow-Methods": "GET, POST", "Vary": "Origin",
		"Access-Control-Allow-Headers": "Authorization, Content-Type, Idempotency-Key, X-Request-Id", "Access-Control-Max-Age": "600"}
	svc.check(t, preflight(office, "POST", "/v1/pets"), reply{204, allowed, ""})
	svc.check(t, preflight(office, "GET", "/v1/pets/1"), reply{204, allowed, ""})
	svc.check(t, call{method: "GET", path: "/v1/pets", header: map[string]string{"Origin": office}}, reply{200, map[string]string{"Access-Control-Allow-Origin": office,
		"Access-Control-Expose-Headers": "Link, Location, Retry-After, X-Request-Id, Deprecation, Sunset, Idempotent-Replayed, WWW-Authenticate"}, `[]`})
	refused := map[string]string{"Access-Control-Allow-Origin": "", "Vary": "Origin"}
	// Refused without the key check: a browser's visit is no failed login.
	svc.check(t, preflight("https://evil.example", "POST", "/v1/pets"), reply{204, with(refused, "Access-Control-Allow-Methods", ""), ""})
	for range 20 {
		svc.check(t, call{method: "GET", path: "/v1/pets", header: map[string]string{"Origin": "https://evil.example"}}, reply{200, refused, `[]`})
	}
	if n := strings.Count(svc.log.String(), "evil.example"); n > 1 {
		t.Errorf("20 requests from a refused origin left %d lines about it", n)
	}
}

// TestPanicIsJSON: a handler's panic is a JSON 500 that names only the
// request id; its cause goes to the log.
func TestPanicIsJSON(t *testing.T) {
	log := &logLines{}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(http.ResponseWriter, *http.Request) { panic("the cause") })
	logger := newLogger(log, "text", slog.LevelInfo)
	ts := httptest.NewServer(logRequests(logger, recoverPanics(logger, mux)))
	defer ts.Close()
	svc := &service{url: ts.URL}
	svc.check(t, call{method: "GET", path: "/x", header: map[string]string{"X-Request-Id": "r-1"}}, reply{500, nil, errorBody(500, "internal_error", "internal error (request id r-1)")})
	if !strings.Contains(log.String(), `msg="internal error" method=GET path=/x err="panic in handler: the cause" request_id=r-1`) {
		t.Errorf("the log lacks the panic:\n%s", log)
	}
}
