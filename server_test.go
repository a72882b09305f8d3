package main

import (
	"testing"
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
