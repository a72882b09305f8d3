package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// The OpenAPI document and the code are held together here: the routes
// and the document's operations are the same set, and every answer the
// test helpers receive (do, send, the fuzz targets) is checked against the
// document's response for its operation and status: the status is
// documented, required headers are present and match their schemas, and
// the body validates against the schema.

// openapiDoc is openapi.json, parsed once.
var openapiDoc = sync.OnceValues(func() (map[string]any, error) {
	v, err := parseJSON(openapiDocument)
	doc, ok := v.(map[string]any)
	if err == nil && !ok {
		err = fmt.Errorf("openapi.json is not an object")
	}
	return doc, err
})

// resolve follows a local $ref ("#/components/...") in doc.
func resolve(doc map[string]any, v any) (any, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return v, nil
	}
	ref, ok := m["$ref"].(string)
	if !ok {
		return v, nil
	}
	var cur any = doc
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		part = strings.NewReplacer("~1", "/", "~0", "~").Replace(part)
		mm, ok := cur.(map[string]any)
		if !ok || mm[part] == nil {
			return nil, fmt.Errorf("unresolvable $ref %s", ref)
		}
		cur = mm[part]
	}
	return resolve(doc, cur)
}

// validateSchema checks value (decoded with UseNumber) against the JSON
// Schema subset the document uses, returning what does not fit.
func validateSchema(doc map[string]any, schema, value any, at string) []string {
	s, ok := schema.(map[string]any)
	if !ok {
		return []string{at + ": schema is not an object"}
	}
	var problems []string
	if _, ok := s["$ref"]; ok {
		target, err := resolve(doc, map[string]any{"$ref": s["$ref"]})
		if err != nil {
			return []string{at + ": " + err.Error()}
		}
		problems = append(problems, validateSchema(doc, target, value, at)...)
	}
	if enum, ok := s["enum"].([]any); ok && !slices.ContainsFunc(enum, func(e any) bool { return cmp.Equal(e, value) }) {
		problems = append(problems, fmt.Sprintf("%s: %v is not one of %v", at, value, enum))
	}
	bound := func(key string, n float64, less bool) {
		if b, ok := s[key].(json.Number); ok {
			limit, _ := b.Float64()
			if (less && n < limit) || (!less && n > limit) {
				problems = append(problems, fmt.Sprintf("%s: %v is beyond %s %v", at, n, key, b))
			}
		}
	}
	switch typ, _ := s["type"].(string); typ {
	case "":
	case "object":
		obj, ok := value.(map[string]any)
		if !ok {
			return append(problems, fmt.Sprintf("%s: %T is not an object", at, value))
		}
		props, _ := s["properties"].(map[string]any)
		for _, r := range s["required"].([]any) {
			if _, ok := obj[r.(string)]; !ok {
				problems = append(problems, fmt.Sprintf("%s: required %s missing", at, r))
			}
		}
		for k, v := range obj {
			if p, ok := props[k]; ok {
				problems = append(problems, validateSchema(doc, p, v, at+"."+k)...)
			} else if s["additionalProperties"] == false {
				problems = append(problems, fmt.Sprintf("%s: property %s not allowed", at, k))
			}
		}
	case "array":
		arr, ok := value.([]any)
		if !ok {
			return append(problems, fmt.Sprintf("%s: %T is not an array", at, value))
		}
		for i, v := range arr {
			problems = append(problems, validateSchema(doc, s["items"], v, fmt.Sprintf("%s[%d]", at, i))...)
		}
	case "string":
		str, ok := value.(string)
		if !ok {
			return append(problems, fmt.Sprintf("%s: %T is not a string", at, value))
		}
		n := float64(utf8.RuneCountInString(str))
		bound("minLength", n, true)
		bound("maxLength", n, false)
		if pattern, ok := s["pattern"].(string); ok && !regexp.MustCompile(pattern).MatchString(str) {
			problems = append(problems, fmt.Sprintf("%s: %q does not match %s", at, str, pattern))
		}
	case "integer":
		num, ok := value.(json.Number)
		if !ok {
			return append(problems, fmt.Sprintf("%s: %T is not a number", at, value))
		}
		i, err := strconv.ParseInt(num.String(), 10, 64)
		if err != nil {
			return append(problems, fmt.Sprintf("%s: %s is not an int64", at, num))
		}
		bound("minimum", float64(i), true)
		bound("maximum", float64(i), false)
	default:
		problems = append(problems, fmt.Sprintf("%s: type %s not supported by this validator", at, typ))
	}
	return problems
}

// operationFor finds the document's path template and operation for a
// request, or ok false when the document has none (unknown paths and
// methods, which the routing tests cover).
func operationFor(doc map[string]any, method, path string) (template string, op map[string]any, ok bool) {
	segments := strings.Split(path, "/")
	for tmpl, item := range doc["paths"].(map[string]any) {
		tsegs := strings.Split(tmpl, "/")
		if len(tsegs) != len(segments) {
			continue
		}
		match := true
		for i := range tsegs {
			if !(tsegs[i] == segments[i] || strings.HasPrefix(tsegs[i], "{") && segments[i] != "") {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		if method == http.MethodHead {
			method = http.MethodGet
		}
		op, ok = item.(map[string]any)[strings.ToLower(method)].(map[string]any)
		return tmpl, op, ok
	}
	return "", nil, false
}

// checkAgainstOpenAPI checks an answer against the document. It reports
// with t.Errorf only, so it is safe in any goroutine.
func checkAgainstOpenAPI(t testing.TB, method, target string, got reply) {
	t.Helper()
	doc, err := openapiDoc()
	if err != nil {
		t.Errorf("openapi.json: %v", err)
		return
	}
	path, _, _ := strings.Cut(target, "?")
	tmpl, op, ok := operationFor(doc, method, path)
	if !ok {
		return
	}
	where := fmt.Sprintf("%s %s (%s %s) answered %d", method, target, strings.ToUpper(method), tmpl, got.status)
	resp, ok := op["responses"].(map[string]any)[strconv.Itoa(got.status)]
	if !ok {
		t.Errorf("%s: status not documented", where)
		return
	}
	resp, err = resolve(doc, resp)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	r := resp.(map[string]any)
	headers, _ := r["headers"].(map[string]any)
	for name, h := range headers {
		h, err := resolve(doc, h)
		if err != nil {
			t.Errorf("%s: header %s: %v", where, name, err)
			continue
		}
		hm := h.(map[string]any)
		v := got.header.Get(name)
		if v == "" {
			if hm["required"] == true {
				t.Errorf("%s: required header %s missing", where, name)
			}
			continue
		}
		for _, p := range validateSchema(doc, hm["schema"], v, "header "+name) {
			t.Errorf("%s: %s", where, p)
		}
	}
	content, _ := r["content"].(map[string]any)
	ct, _, _ := mime.ParseMediaType(got.header.Get("Content-Type"))
	media, ok := content[ct].(map[string]any)
	if !ok {
		t.Errorf("%s: Content-Type %q not documented", where, ct)
		return
	}
	if method == http.MethodHead || ct != "application/json" {
		return
	}
	body, err := parseJSON(got.body)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	for _, p := range validateSchema(doc, media["schema"], body, "body") {
		t.Errorf("%s: %s", where, p)
	}
}

func TestOpenAPIDocumentParses(t *testing.T) {
	doc, err := openapiDoc()
	must(t, err)
	// Its version, 3.1.0, is what the generated clients read from it.
	// Every example in the document validates against its own schema, so
	// the examples a reader copies are right.
	var walk func(v any, at string)
	walk = func(v any, at string) {
		switch v := v.(type) {
		case map[string]any:
			if ex, ok := v["example"]; ok && v["schema"] != nil {
				for _, p := range validateSchema(doc, v["schema"], ex, at+".example") {
					t.Error(p)
				}
			}
			for k, child := range v {
				walk(child, at+"."+k)
			}
		case []any:
			for i, child := range v {
				walk(child, fmt.Sprintf("%s[%d]", at, i))
			}
		}
	}
	walk(doc, "#")
}

// TestOpenAPIMatchesRoutes: the routes the mux serves and the operations
// the document describes are the same set, and each documented operation
// is really served.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	doc, err := openapiDoc()
	must(t, err)
	var documented, served []string
	for path, item := range doc["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	for _, r := range (&server{}).routes() {
		served = append(served, r.method+" "+r.path)
	}
	slices.Sort(documented)
	slices.Sort(served)
	if diff := cmp.Diff(documented, served); diff != "" {
		t.Errorf("document and routes differ (-documented +served):\n%s", diff)
	}

	svc := startService(t, nil)
	createPets(t, svc.url, `{"name":"Rex","categoryId":1}`)
	for _, op := range documented {
		method, path, _ := strings.Cut(op, " ")
		path = regexp.MustCompile(`\{[^}]+\}`).ReplaceAllString(path, "1")
		c := call{method: method, path: path}
		if method == "POST" {
			c.body = `{"name":"Tom","categoryId":2}`
		}
		got := send(t, svc.url, c)
		if got.status == http.StatusNotFound && !strings.Contains(string(got.body), "no pet") || got.status == http.StatusMethodNotAllowed {
			t.Errorf("%s: %d %s; the document says it is served", op, got.status, got.body)
		}
	}
}

// TestOpenAPIServed: the document is served without a key, as written,
// as JSON and as YAML (JSON is YAML).
func TestOpenAPIServed(t *testing.T) {
	svc := startService(t, nil)
	for path, mediaType := range map[string]string{"/openapi.yaml": "application/yaml", "/openapi.json": "application/json"} {
		got := send(t, svc.url, call{method: "GET", path: path, header: noKey})
		if got.status != 200 || got.header.Get("Content-Type") != mediaType || !bytes.Equal(got.body, openapiDocument) {
			t.Errorf("GET %s = %d %q, %d bytes; want 200 %s with the document", path, got.status, got.header.Get("Content-Type"), len(got.body), mediaType)
		}
	}
	checkReply(t, send(t, svc.url, call{method: "DELETE", path: "/openapi.yaml"}), 405, map[string]string{"Allow": "GET, HEAD"},
		errBody(405, codeMethodNotAllowed, "method DELETE is not allowed on /openapi.yaml; allowed: GET, HEAD"))
}

// TestOpenAPICatchesMismatch makes sure the validator fails answers that
// break the document, so passing it means something.
func TestOpenAPICatchesMismatch(t *testing.T) {
	doc, err := openapiDoc()
	must(t, err)
	_, op, ok := operationFor(doc, "GET", "/v1/pets/7")
	if !ok {
		t.Fatal("getPet not found in the document")
	}
	pet, _ := resolve(doc, op["responses"].(map[string]any)["200"].(map[string]any)["content"].(map[string]any)["application/json"].(map[string]any)["schema"])
	for _, bad := range []string{
		`{"id":1,"name":"Rex","categoryId":1}`,
		`{"id":1,"name":"Rex","categoryId":1,"status":"lost"}`,
		`{"id":0,"name":"Rex","categoryId":1,"status":"sold"}`,
		`{"id":1,"name":"","categoryId":1,"status":"sold"}`,
		`{"id":1,"name":"Rex","categoryId":"1","status":"sold"}`,
		`{"id":1,"name":"Rex","categoryId":1,"status":"sold","extra":true}`,
		`[]`,
	} {
		v, _ := parseJSON([]byte(bad))
		if len(validateSchema(doc, pet, v, "body")) == 0 {
			t.Errorf("%s validated as a Pet", bad)
		}
	}
}
