package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The OpenAPI document held to the service: its operations are pets.go's
// route table, and every answer a test receives through svc.send is
// checked against it (checkAgainstOpenAPI).

// openapiDoc is openapi.json, parsed once.
var openapiDoc = sync.OnceValues(func() (doc map[string]any, err error) { return doc, decodeJSON(string(openapiDocument), &doc) })

// decodeJSON decodes one JSON value, its numbers exact (json.Number).
func decodeJSON(text string, v any) error {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	return dec.Decode(v)
}

// rat is a JSON number's exact value; ok is false for any other value.
func rat(v any) (*big.Rat, bool) { n, _ := v.(json.Number); return new(big.Rat).SetString(string(n)) }

// resolve follows a "#/components/<kind>/<name>" $ref (nil if it leads
// nowhere); any other value is returned as it is.
func resolve(doc map[string]any, v any) map[string]any {
	m, _ := v.(map[string]any)
	if ref, ok := m["$ref"].(string); ok {
		parts := append(strings.Split(ref, "/"), "", "", "")
		kind, _ := doc["components"].(map[string]any)[parts[2]].(map[string]any)
		return resolve(doc, kind[parts[3]])
	}
	return m
}

// jsonTypes names the Go types decodeJSON makes in JSON Schema's words.
var jsonTypes = map[string]string{"map[string]interface {}": "object", "[]interface {}": "array", "string": "string", "json.Number": "number", "bool": "boolean"}

// fits reports whether v fits the schema s, in the keywords the document
// uses: type, properties, required, enum, items, $ref and
// additionalProperties false, numbers compared exactly. A schema with any
// other assertion panics, so that none passes unchecked.
func fits(doc, s map[string]any, v any) bool {
	obj, isObject := v.(map[string]any)
	n, isNumber := rat(v)
	ok := s != nil // nil: an unresolvable $ref
	for key, want := range s {
		switch key {
		case "$ref":
			ok = ok && fits(doc, resolve(doc, s), v)
		case "type":
			ok = ok && (jsonTypes[fmt.Sprintf("%T", v)] == want || want == "integer" && isNumber && n.IsInt())
		case "enum": // == on any: no enum holds an object or an array
			ok = ok && slices.ContainsFunc(want.([]any), func(e any) bool { m, isNum := rat(e); return e == v || isNum && isNumber && m.Cmp(n) == 0 })
		case "required":
			ok = ok && !slices.ContainsFunc(want.([]any), func(name any) bool { _, has := obj[name.(string)]; return isObject && !has })
		case "properties":
			for name, p := range want.(map[string]any) {
				value, has := obj[name]
				ok = ok && (!has || fits(doc, resolve(doc, p), value))
			}
		case "additionalProperties":
			props, _ := s["properties"].(map[string]any)
			ok = ok && (want != false || !slices.ContainsFunc(slices.Collect(maps.Keys(obj)), func(name string) bool { return props[name] == nil }))
		case "items":
			items, _ := v.([]any)
			ok = ok && !slices.ContainsFunc(items, func(item any) bool { return !fits(doc, resolve(doc, want), item) })
		case "description", "format", "default", "example":
		default:
			panic("openapi_test.go's validator does not know the schema keyword " + key)
		}
	}
	return ok
}

// checkAgainstOpenAPI checks an answer against the document: its status
// is documented for its operation, the required headers are there, and
// the headers and the JSON body fit their schemas. An answer no operation
// gave (another method or path) must be an Error of a status the routing
// gives, or a CORS preflight's 204. It reports with t.Errorf only, so it
// may run in any goroutine.
func checkAgainstOpenAPI(t testing.TB, method, target string, status int, header http.Header, body string) {
	t.Helper()
	doc, _ := openapiDoc() // TestOpenAPIRoutes reports an error
	u, _ := url.Parse(target)
	var resp map[string]any
	if slices.Contains([]int{401, 404, 405, 500, map[bool]int{true: 204}[method == "OPTIONS"]}, status) {
		resp = map[string]any{"content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/Error"}}}}
	}
	paths, _ := doc["paths"].(map[string]any)
	for template, item := range paths {
		op, _ := item.(map[string]any)[strings.ToLower(strings.Replace(method, "HEAD", "GET", 1))].(map[string]any)
		pattern := regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(template, "*") // a parameter is one segment
		if matched, _ := path.Match(pattern, u.EscapedPath()); matched && op != nil && path.Clean(u.Path) == u.Path {
			resp = resolve(doc, op["responses"].(map[string]any)[fmt.Sprint(status)])
		}
	}
	where := fmt.Sprintf("%s %s answered %d", method, target, status)
	if resp == nil {
		t.Errorf("%s: the document does not give this status here", where)
		return
	}
	headers, _ := resp["headers"].(map[string]any)
	for name, h := range headers {
		if h, values := resolve(doc, h), header.Values(name); len(values) == 0 && h["required"] == true || len(values) > 0 && !fits(doc, resolve(doc, h["schema"]), strings.Join(values, ", ")) {
			t.Errorf("%s: header %s %q does not fit the document", where, name, values)
		}
	}
	content, _ := resp["content"].(map[string]any)
	mediaType, _, _ := strings.Cut(header.Get("Content-Type"), ";")
	var v any
	if media, ok := content[mediaType].(map[string]any); !ok && body != "" {
		t.Errorf("%s: Content-Type %q is not documented", where, mediaType)
	} else if ok && media["schema"] != nil && method != "HEAD" && (decodeJSON(body, &v) != nil || !fits(doc, resolve(doc, media["schema"]), v)) {
		t.Errorf("%s: the body does not fit its schema: %.300s", where, body)
	}
}

// TestOpenAPIRoutes: the document parses, and its operations are the
// route table in pets.go.
func TestOpenAPIRoutes(t *testing.T) {
	doc, err := openapiDoc()
	must(t, err)
	src, err := os.ReadFile("pets.go")
	must(t, err)
	routes, documented := map[string]bool{}, map[string]bool{}
	for _, m := range regexp.MustCompile(`Handle\("([A-Z]+) (/[^"]*)"`).FindAllStringSubmatch(string(src), -1) {
		routes[m[1]+" "+strings.TrimSuffix(m[2], "{$}")] = true // "/{$}" is the mux's "/ alone"
	}
	for p, item := range doc["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			documented[strings.ToUpper(method)+" "+p] = true
		}
	}
	if !maps.Equal(routes, documented) || len(routes) == 0 {
		t.Errorf("pets.go's routes and the document's operations differ:\n%q\n%q", slices.Sorted(maps.Keys(routes)), slices.Sorted(maps.Keys(documented)))
	}
}
