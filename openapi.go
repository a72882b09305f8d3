// The OpenAPI document: openapi.yaml, built into the binary, served as
// written at /openapi.yaml and converted to JSON at /openapi.json, the
// form most client generators and browsers read directly.

package main

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// openapiDocument is openapi.yaml, built into the binary so the running
// service describes itself.
//
//go:embed openapi.yaml
var openapiDocument []byte

// serveOpenAPI answers GET /openapi.yaml without a key, for documentation
// platforms and client generators.
func serveOpenAPI(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h["Content-Type"] = []string{"application/yaml"} // RFC 9512
	h["Content-Length"] = []string{strconv.Itoa(len(openapiDocument))}
	w.Write(openapiDocument)
}

// openapiJSON is the document as JSON, converted once from the YAML.
var openapiJSON = sync.OnceValues(func() ([]byte, error) {
	v, err := parseYAMLSubset(openapiDocument)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
})

// serveOpenAPIJSON answers GET /openapi.json without a key.
func serveOpenAPIJSON(w http.ResponseWriter, r *http.Request) {
	doc, err := openapiJSON()
	if err != nil {
		// A test parses the document, so a build cannot ship one that
		// fails here; answer in the contract all the same.
		writeInternalError(w, r, slog.Default(), err)
		return
	}
	writeBody(w, http.StatusOK, doc)
}

// parseYAMLSubset reads the YAML subset openapi.yaml is written in: block
// mappings and sequences indented by two spaces, double-quoted strings,
// JSON for flow collections, plain one-line scalars. Anything else is an
// error, so the document cannot drift into YAML this reader would
// misread; Redocly in CI reads it as full YAML.
func parseYAMLSubset(data []byte) (any, error) {
	type line struct {
		indent int
		text   string
		num    int
	}
	var lines []line
	for i, raw := range strings.Split(string(data), "\n") {
		if strings.ContainsRune(raw, '\t') {
			return nil, fmt.Errorf("line %d: tab", i+1)
		}
		text := strings.TrimLeft(raw, " ")
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		indent := len(raw) - len(text)
		if indent%2 != 0 {
			return nil, fmt.Errorf("line %d: odd indentation", i+1)
		}
		lines = append(lines, line{indent, strings.TrimRight(text, " "), i + 1})
	}
	scalar := func(s string, num int) (any, error) {
		switch {
		case s == "true" || s == "false" || s == "null" || strings.ContainsAny(s[:1], `"{[`) || regexp.MustCompile(`^-?\d+(\.\d+)?$`).MatchString(s):
			dec := json.NewDecoder(strings.NewReader(s))
			dec.UseNumber()
			var v any
			if err := dec.Decode(&v); err != nil || dec.More() {
				return nil, fmt.Errorf("line %d: %q is not JSON: %v", num, s, err)
			}
			return v, nil
		case strings.Contains(s, ": ") || strings.Contains(s, " #") || strings.ContainsAny(s[:1], "&*!|>%@`'"):
			return nil, fmt.Errorf("line %d: plain scalar %q needs quotes", num, s)
		}
		return s, nil
	}
	isMappingEntry := func(s string) bool {
		return !strings.ContainsAny(s[:1], `{[`) && (strings.Contains(s, ": ") || strings.HasSuffix(s, ":"))
	}
	var node func(i, indent int) (any, int, error)
	node = func(i, indent int) (any, int, error) {
		if i >= len(lines) || lines[i].indent != indent {
			return nil, i, fmt.Errorf("line %d: expected a block at indentation %d", lines[min(i, len(lines)-1)].num, indent)
		}
		if strings.HasPrefix(lines[i].text, "- ") {
			var seq []any
			for i < len(lines) && lines[i].indent == indent && strings.HasPrefix(lines[i].text, "- ") {
				item := lines[i].text[2:]
				if isMappingEntry(item) {
					lines[i] = line{indent + 2, item, lines[i].num}
					v, next, err := node(i, indent+2)
					if err != nil {
						return nil, i, err
					}
					seq, i = append(seq, v), next
					continue
				}
				v, err := scalar(item, lines[i].num)
				if err != nil {
					return nil, i, err
				}
				seq, i = append(seq, v), i+1
			}
			return seq, i, nil
		}
		m := map[string]any{}
		for i < len(lines) && lines[i].indent == indent {
			l := lines[i]
			if !isMappingEntry(l.text) {
				return nil, i, fmt.Errorf("line %d: expected key: value", l.num)
			}
			key, rest, _ := strings.Cut(l.text, ":")
			rest = strings.TrimSpace(rest)
			if strings.HasPrefix(key, `"`) {
				if err := json.Unmarshal([]byte(key), &key); err != nil {
					return nil, i, fmt.Errorf("line %d: key %s: %v", l.num, key, err)
				}
			}
			if _, dup := m[key]; dup {
				return nil, i, fmt.Errorf("line %d: duplicate key %q", l.num, key)
			}
			if rest != "" {
				v, err := scalar(rest, l.num)
				if err != nil {
					return nil, i, err
				}
				m[key], i = v, i+1
				continue
			}
			if i+1 >= len(lines) || lines[i+1].indent <= indent {
				return nil, i, fmt.Errorf("line %d: key %q has no value", l.num, key)
			}
			v, next, err := node(i+1, lines[i+1].indent)
			if err != nil {
				return nil, i, err
			}
			m[key], i = v, next
		}
		return m, i, nil
	}
	v, next, err := node(0, 0)
	if err == nil && next != len(lines) {
		err = fmt.Errorf("line %d: unexpected indentation", lines[next].num)
	}
	return v, err
}
