package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPanicIsJSON500(t *testing.T) {
	var logged bytes.Buffer
	log := newLogger(&logged, "text", slog.LevelInfo)
	h := secureHeaders(logRequests(log, recoverPanics(log, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("boom: secret detail")
	}))))
	srv := httptest.NewServer(h)
	defer srv.Close()
	got := send(t, srv.URL, call{method: "GET", path: "/v1/pets", header: map[string]string{"X-Request-Id": "req-7"}})
	checkReply(t, got, 500, map[string]string{"X-Request-Id": "req-7"}, errBody(500, codeInternalError, "internal error (request id req-7)"))
	for _, want := range []string{`msg="panic in handler" method=GET path=/v1/pets panic="boom: secret detail" request_id=req-7`,
		`msg=request method=GET path=/v1/pets status=500 `} {
		if !strings.Contains(logged.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logged.String())
		}
	}
}

func TestAccessLog(t *testing.T) {
	svc := startService(t, nil, "-log-format", "json")
	base, stderr := svc.url, svc.log

	got := send(t, base, call{method: "GET", path: "/v1/pets?limit=5&status=sold", header: map[string]string{"X-Request-Id": "back-office-42"}})
	if id := got.header.Get("X-Request-Id"); id != "back-office-42" {
		t.Errorf("X-Request-Id = %q, want the client's back-office-42", id)
	}
	// An id with unsafe characters or too long is replaced.
	generated := map[string]bool{}
	for _, bad := range []string{"two words", strings.Repeat("x", 129), "quote\"d"} {
		r := send(t, base, call{method: "GET", path: "/v1/pets", header: map[string]string{"Authorization": "Bearer wrong-key", "X-Request-Id": bad}})
		id := r.header.Get("X-Request-Id")
		if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) || generated[id] {
			t.Errorf("X-Request-Id for %q = %q, want a new generated id", bad, id)
		}
		generated[id] = true
	}
	svc.stop()

	type accessLine struct {
		Level, Msg, Method, Path string
		RequestID                string `json:"request_id"`
		KeyID                    string `json:"key_id"`
		Status, Bytes            int
		Duration                 int64
	}
	var lines []accessLine
	for _, text := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var l accessLine
		if err := json.Unmarshal([]byte(text), &l); err != nil {
			t.Fatalf("log line is not JSON: %q", text)
		}
		if l.Msg == "request" {
			lines = append(lines, l)
		}
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

// TestCORS: the origin in -cors-origins (a trailing slash forgiven: a
// browser's Origin has none) gets preflights and answers it can read;
// another origin gets neither, and is named in the log once, however many
// requests it sends; the service's own origin never is.
func TestCORS(t *testing.T) {
	const office = "https://office.example.com"
	svc := startService(t, nil, "-cors-origins", office+"/")
	srv, plain := svc.url, startService(t, nil).url

	preflight := func(origin, method, path string) map[string]string {
		return map[string]string{"Origin": origin, "Access-Control-Request-Method": method,
			"Access-Control-Request-Headers": "authorization,content-type", "Authorization": ""}
	}
	const expose = "Link, Location, X-Request-Id, Deprecation, Sunset, Idempotent-Replayed, WWW-Authenticate"
	tests := []struct {
		name   string
		base   string
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
		{"request from the service's own origin", srv, call{method: "GET", path: "/v1/pets", header: map[string]string{"Origin": srv}}, 200, nil},
		{"CORS off by default", plain, call{method: "OPTIONS", path: "/v1/pets", header: preflight(office, "POST", "")}, 401,
			map[string]string{"Access-Control-Allow-Origin": "", "Access-Control-Allow-Methods": ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := send(t, tt.base, tt.c)
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
	waitForLog(t, svc.log, `level=WARN msg="browser origin refused: it is not in -cors-origins[^"]*" origin=https://evil.example method=OPTIONS path=/v1/pets`, 1)
	// The log keeps the order of the requests: once a later request's
	// access line is in, any refused-origin line of the ones above is too.
	send(t, srv, call{method: "GET", path: "/healthz", header: map[string]string{"X-Request-Id": "after-the-origins"}})
	waitForLog(t, svc.log, `msg=request [^\n]*request_id=after-the-origins`, 1)
	checkLines(t, svc.log, "browser origin refused", 1)
}
