package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzCreatePet sends any body to a real service: it is answered 201 with
// the pet, which reads back as answered and keeps the rules of a name, or
// 400 invalid_body (413 past 16 KiB); never another answer.
func FuzzCreatePet(f *testing.F) {
	for _, seed := range []string{`{"name":"Rex","categoryId":1}`, `{"name":"Tom","categoryId":9223372036854775807,"status":"sold"}`,
		`{"name":"\ud83d\udc36","categoryId":1e3}`, `{"name":"a","name":"b","categoryId":1}`, `{"id":1}`, `[]`, `{"name":"\u200b"}`, "{\"name\":\"R\xffx\"}"} {
		f.Add(seed)
	}
	svc := startService(f, nil)
	f.Fuzz(func(t *testing.T, body string) {
		got, header := svc.send(t, call{method: "POST", path: "/v1/pets", body: body})
		switch got.status {
		case http.StatusCreated:
			var p Pet // its fields checked against the document's Pet as send gets it
			if err := json.Unmarshal([]byte(got.body), &p); err != nil || p.ID < 1 || p.CategoryID < 1 || utf8.RuneCountInString(p.Name) > maxNameLength || strings.TrimSpace(p.Name) == "" {
				t.Fatalf("%q: a 201 that breaks the rules: %s", body, got.body)
			}
			if back, _ := svc.send(t, call{method: "GET", path: "/v1/" + header.Get("Location")}); jsonValue(back.body) != jsonValue(got.body) {
				t.Fatalf("%q: answered %s, stored %s", body, got.body, back.body)
			}
		case http.StatusRequestEntityTooLarge:
			if len(body) <= maxBodyBytes {
				t.Fatalf("%q: 413 for %d bytes", body, len(body))
			}
		case http.StatusBadRequest:
			var e apiError
			if json.Unmarshal([]byte(got.body), &e) != nil || e.Code != "invalid_body" || e.Status != 400 || e.Message == "" {
				t.Fatalf("%q: a 400 that is not invalid_body: %s", body, got.body)
			}
		default:
			t.Fatalf("%q: %d %s", body, got.status, got.body)
		}
	})
}
