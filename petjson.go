// What a client sends and gets back: the list query, the create's
// headers and body, decoded and validated with messages that name the
// field, and a pet encoded as JSON without reflection.

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// listParams are listPets' query parameters, in the order their values
// are checked.
var listParams = [...]string{"limit", "status", "after"}

// parseListQuery validates listPets' query string. Unknown and repeated
// parameters are errors: a misspelt "stauts" must not silently return
// every pet. Of several bad names the first in sorted order is reported,
// so the message does not depend on the order they were sent in.
func parseListQuery(rawQuery string) (petFilter, error) {
	f := petFilter{limit: defaultLimit}
	if rawQuery == "" {
		return f, nil
	}
	if strings.Contains(rawQuery, "&&") || strings.HasPrefix(rawQuery, "&") || strings.HasSuffix(rawQuery, "&") {
		// Empty pairs mean nothing, and url.ParseQuery counts them toward
		// its limit of 10,000 pairs.
		rawQuery = strings.Join(slices.DeleteFunc(strings.Split(rawQuery, "&"), func(p string) bool { return p == "" }), "&")
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return f, errMalformedQuery
	}
	for _, name := range slices.Sorted(maps.Keys(q)) {
		if !slices.Contains(listParams[:], name) {
			return f, fmt.Errorf("unknown query parameter %s; known: limit, status, after", quoteValue(name))
		}
		if len(q[name]) > 1 {
			return f, fmt.Errorf("query parameter %s is given more than once", name)
		}
	}
	if v, ok := q["limit"]; ok {
		n, ok := parseDecimal(v[0])
		if !ok || n < 1 || n > maxLimit {
			return f, fmt.Errorf("limit must be an integer from 1 to %d, got %s", maxLimit, quoteValue(v[0]))
		}
		f.limit = int(n)
	}
	if v, ok := q["status"]; ok {
		if !slices.Contains(petStatuses, v[0]) {
			return f, fmt.Errorf("status must be one of available, pending, sold, got %s", quoteValue(v[0]))
		}
		f.status = v[0]
	}
	if v, ok := q["after"]; ok {
		n, ok := parseDecimal(v[0])
		if !ok {
			return f, fmt.Errorf("after must be the id of the last pet seen (an integer from 0 to 9223372036854775807), got %s", quoteValue(v[0]))
		}
		f.after = n
	}
	return f, nil
}

// checkNoQuery refuses any query parameter, for the operations that take
// none (getPet): a typo must not be taken for a filter that worked.
func checkNoQuery(rawQuery string) error {
	for _, pair := range strings.Split(rawQuery, "&") {
		if pair == "" {
			continue
		}
		name, _, _ := strings.Cut(pair, "=")
		if unescaped, err := url.QueryUnescape(name); err == nil {
			name = unescaped
		}
		return fmt.Errorf("unknown query parameter %s; this operation takes none", quoteValue(name))
	}
	return nil
}

// errMalformedQuery is the answer to a query string that is not
// name=value pairs.
var errMalformedQuery = errors.New("malformed query string: use name=value pairs joined by &, percent-encoded")

// parseDecimal parses a non-negative int64 written as plain digits: no
// sign, no spaces, no fraction, no exponent. ParseUint takes no sign, and
// in base 10 nothing but digits; 63 bits bound it to an int64.
func parseDecimal(s string) (int64, bool) {
	n, err := strconv.ParseUint(s, 10, 63)
	return int64(n), err == nil
}

// quoteValue quotes a client's value for an error message, cut short so a
// huge value does not make a huge error.
func quoteValue(s string) string {
	const maxQuoted = 64
	if utf8.RuneCountInString(s) > maxQuoted {
		s = string([]rune(s)[:maxQuoted]) + "..."
	}
	return strconv.Quote(s)
}

// maxIdempotencyKey is the longest Idempotency-Key accepted, in bytes.
const maxIdempotencyKey = 255

// idempotencyKey reads the Idempotency-Key header
// (draft-ietf-httpapi-idempotency-key-header): 1 to 255 printable ASCII
// characters, taken as sent. The draft writes the key as a quoted
// structured-field string; quotes a client sends are part of its key, so
// a client that always sends the same form always meets its own key.
// "" means no key was sent.
func idempotencyKey(h http.Header) (string, error) {
	values := h.Values("Idempotency-Key")
	if len(values) == 0 {
		return "", nil
	}
	const rule = "Idempotency-Key must be 1 to 255 printable ASCII characters"
	if len(values) > 1 {
		return "", errors.New("send one Idempotency-Key header, not several")
	}
	key := values[0]
	if key == "" || len(key) > maxIdempotencyKey {
		return "", fmt.Errorf("%s, got %d", rule, len(key))
	}
	for i := 0; i < len(key); i++ {
		if key[i] < ' ' || key[i] > '~' {
			return "", errors.New(rule)
		}
	}
	return key, nil
}

// isJSONContentType accepts application/json, with parameters, as long as
// any charset is UTF-8 (the only one JSON allows, RFC 8259). No header at
// all is read as JSON, for curl -d users.
func isJSONContentType(ct string) bool {
	if ct == "" {
		return true
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	cs, ok := params["charset"]
	return !ok || strings.EqualFold(cs, "utf-8")
}

// readBody reads the request body, at most maxBodyBytes of it, and
// answers 413 past that; no more than that is ever held in memory. ok is
// false when an answer has been written. A body read whole lets the
// connection be kept (see closeAfterUnreadBody).
func readBody(w http.ResponseWriter, r *http.Request) (body []byte, ok bool) {
	if r.ContentLength <= maxBodyBytes {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
		if err != nil {
			writeError(w, http.StatusBadRequest, codeInvalidBody, "could not read the request body")
			return nil, false
		}
		if len(body) <= maxBodyBytes {
			delete(w.Header(), "Connection")
			return body, true
		}
	}
	// A client still sending when the connection closes is reset by the
	// kernel and loses the answer, so the rest of a body up to
	// maxDrainBytes is read and thrown away first, within -read-timeout.
	// A body announced larger than that, or one that waits for 100
	// Continue, is answered at once, unread.
	announcedLarge := r.ContentLength > maxDrainBytes
	awaitsContinue := strings.EqualFold(r.Header.Get("Expect"), "100-continue") && r.ContentLength > maxBodyBytes
	if !announcedLarge && !awaitsContinue {
		io.Copy(io.Discard, io.LimitReader(r.Body, maxDrainBytes))
	}
	writeError(w, http.StatusRequestEntityTooLarge, codeBodyTooLarge,
		fmt.Sprintf("request body is larger than %d bytes (16 KiB); a pet's body is well under 2 KB", maxBodyBytes))
	return nil, false
}

// maxDrainBytes bounds how much of a body over the limit is read, and
// discarded, so that its client gets the 413.
const maxDrainBytes = 2 << 20

// decodeNewPet parses and validates a create body. It walks the object
// itself rather than json.Unmarshal into the struct, because
// Unmarshal accepts what this API must refuse: duplicate keys,
// "categoryId": 1.0 or "1", null for a required field. The error names
// every offending field.
func decodeNewPet(body []byte) (NewPet, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return NewPet{}, errors.New(`request body is empty; send a JSON object such as {"name":"Rex","categoryId":1}`)
	}
	if !utf8.Valid(body) {
		return NewPet{}, errors.New("request body is not valid UTF-8")
	}
	fields, err := splitObject(body)
	if err != nil {
		return NewPet{}, err
	}

	problems := fieldProblems(fields)
	np := NewPet{Status: defaultStatus}
	for _, msg := range []string{
		decodeName(fields["name"], &np.Name),
		decodeCategoryID(fields["categoryId"], &np.CategoryID),
		decodeStatus(fields["status"], &np.Status),
	} {
		if msg != "" {
			problems = append(problems, msg)
		}
	}
	if len(problems) > 0 {
		return NewPet{}, errors.New(joinProblems(problems))
	}
	return np, nil
}

// fieldProblems names the fields a NewPet does not have, in order, so
// the message is the same whatever order they came in. A body of only
// NewPet's fields, nearly every one, costs no sort and no allocation.
func fieldProblems(fields map[string]json.RawMessage) []string {
	var others []string
	for name := range fields {
		if name != "name" && name != "categoryId" && name != "status" {
			others = append(others, name)
		}
	}
	slices.Sort(others)
	problems := make([]string, 0, len(others))
	for _, name := range others {
		if name == "id" {
			problems = append(problems, "id must not be sent: the service assigns it")
		} else {
			problems = append(problems, fmt.Sprintf("unknown field %s (a NewPet has name, categoryId and status)", quoteValue(name)))
		}
	}
	return problems
}

// maxProblemsMessage bounds the list of what is wrong with a body, in
// bytes: a body of thousands of unknown fields gets the first few named
// and a count of the rest, not a message larger than the body.
const maxProblemsMessage = 1000

// joinProblems lists problems, "; "-separated, as many as fit in
// maxProblemsMessage, and counts the rest.
func joinProblems(problems []string) string {
	msg := problems[0]
	for i, p := range problems[1:] {
		if len(msg)+2+len(p) > maxProblemsMessage {
			return fmt.Sprintf("%s; and %d more problems", msg, len(problems)-1-i)
		}
		msg += "; " + p
	}
	return msg
}

// splitObject parses body as exactly one JSON object and returns its
// members, unparsed. Duplicate keys and anything after the object are
// errors. A valid body, which nearly every create sends, is walked token
// by token for its members; one that is not valid JSON is decoded once
// more, only to say what is wrong with it.
func splitObject(body []byte) (map[string]json.RawMessage, error) {
	if trimmed := bytes.TrimLeft(body, " \t\r\n"); trimmed[0] != '{' {
		return nil, errors.New("request body must be a JSON object")
	}
	if !json.Valid(body) {
		var first json.RawMessage
		err := json.NewDecoder(bytes.NewReader(body)).Decode(&first)
		switch {
		case err == nil:
			return nil, errors.New("request body has data after the JSON object; send exactly one object")
		case errors.Is(err, io.ErrUnexpectedEOF):
			return nil, errors.New("request body is not valid JSON: it ends before the object is complete")
		}
		return nil, fmt.Errorf("request body is not valid JSON: %v", err)
	}
	// Valid: every token and value below decodes without an error.
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.Token() // {
	fields := make(map[string]json.RawMessage, 3)
	for dec.More() {
		key, _ := dec.Token()
		var value json.RawMessage
		dec.Decode(&value)
		if _, dup := fields[key.(string)]; dup {
			return nil, fmt.Errorf("field %s appears more than once", quoteValue(key.(string)))
		}
		fields[key.(string)] = value
	}
	return fields, nil
}

// isNull reports whether a member is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	return raw == nil || string(raw) == "null"
}

// decodeName validates the name member; it returns what is wrong, or "".
func decodeName(raw json.RawMessage, name *string) string {
	if isNull(raw) {
		return "name is required"
	}
	if raw[0] != '"' || json.Unmarshal(raw, name) != nil {
		return "name must be a string"
	}
	if loneSurrogates(raw, *name) {
		// Unmarshal would store U+FFFD in its place without a word.
		return "name must not contain a \\u escape of half a UTF-16 surrogate pair (such as \\ud800 alone): it is not a character"
	}
	return nameProblem(*name)
}

// loneSurrogates reports whether decoding raw (valid UTF-8) into name
// made up a U+FFFD: Unmarshal does that, and only that, for a \u escape
// of half a UTF-16 surrogate pair. Every U+FFFD the client sent is in
// raw, as itself or as \ufffd.
func loneSurrogates(raw []byte, name string) bool {
	if !strings.Contains(name, "\uFFFD") {
		return false
	}
	// Escaped backslashes go first, left to right as a decoder reads
	// them, so "\\ufffd" (a backslash, then text) is not counted.
	escapes := bytes.ReplaceAll(bytes.ToLower(raw), []byte(`\\`), nil)
	sent := bytes.Count(raw, []byte("\uFFFD")) + bytes.Count(escapes, []byte(`\ufffd`))
	return strings.Count(name, "\uFFFD") > sent
}

// isFormatCharacter reports whether r is of Unicode category Cf: invisible
// characters that change how the text around them shows, so a name made
// of them looks empty, or reads differently from what is stored ("Trojan
// Source"). The first is U+00AD.
func isFormatCharacter(r rune) bool {
	return r >= 0xAD && unicode.Is(unicode.Cf, r)
}

// nameProblem checks a decoded name against the rules for a pet's name;
// it returns what is wrong, or "".
func nameProblem(name string) string {
	switch {
	case strings.TrimSpace(name) == "":
		return "name must not be empty or only whitespace"
	case utf8.RuneCountInString(name) > maxNameLength:
		return fmt.Sprintf("name must be at most %d characters, got %d", maxNameLength, utf8.RuneCountInString(name))
	case strings.IndexFunc(name, unicode.IsControl) >= 0:
		return "name must not contain control characters (such as tab or newline)"
	case strings.ContainsAny(name, "\u2028\u2029"):
		return "name must not contain line or paragraph separators (U+2028, U+2029)"
	case strings.IndexFunc(name, isFormatCharacter) >= 0:
		return "name must not contain invisible format characters (Unicode category Cf, such as U+200B zero-width space, U+FEFF or the U+202E right-to-left override)"
	}
	return ""
}

// decodeCategoryID validates the categoryId member as a JSON integer in
// 1..MaxInt64, parsed from its text so no float64 rounds it.
func decodeCategoryID(raw json.RawMessage, id *int64) string {
	if isNull(raw) {
		return "categoryId is required"
	}
	const want = "categoryId must be a JSON integer from 1 to 9223372036854775807"
	s := string(raw)
	if strings.HasPrefix(s, `"`) {
		return want + ", not a string"
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return want + ", got " + quoteValue(s)
	}
	*id = n
	return ""
}

// decodeStatus validates a status member against the enumeration; an
// absent one leaves *status as it is.
func decodeStatus(raw json.RawMessage, status *string) string {
	const want = "status must be one of available, pending, sold (or omitted, for available)"
	var s string
	switch {
	case raw == nil:
		return ""
	case raw[0] != '"' || json.Unmarshal(raw, &s) != nil:
		return want + ", got " + jsonKind(raw)
	case !slices.Contains(petStatuses, s):
		return want + ", got " + quoteValue(s) // the value, not its JSON: quoted once
	}
	*status = s
	return ""
}

// jsonKind names the kind of a JSON value that is not a string, for a
// message.
func jsonKind(raw json.RawMessage) string {
	switch {
	case raw[0] == '{':
		return "a JSON object"
	case raw[0] == '[':
		return "a JSON array"
	case string(raw) == "true" || string(raw) == "false":
		return "a JSON boolean"
	case string(raw) == "null":
		return "null"
	}
	return "a JSON number"
}

// buffers recycles answer buffers between requests.
var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func getBuffer() *[]byte { return buffers.Get().(*[]byte) }

func putBuffer(b *[]byte) {
	if cap(*b) > 64<<10 {
		return // an unusually large answer: let it go rather than pin it
	}
	*b = (*b)[:0]
	buffers.Put(b)
}

// appendPetJSON appends a pet as a JSON object, byte for byte what
// encoding/json makes of Pet with HTML escaping off (a test holds the two
// together), without reflection or allocation.
func appendPetJSON(b []byte, p *petRow) []byte {
	b = append(b, `{"id":`...)
	b = strconv.AppendInt(b, p.id, 10)
	b = append(b, `,"name":`...)
	b = appendJSONString(b, p.name)
	b = append(b, `,"categoryId":`...)
	b = strconv.AppendInt(b, p.categoryID, 10)
	b = append(b, `,"status":`...)
	b = appendJSONString(b, p.status)
	return append(b, '}')
}

// appendJSONString appends s as a JSON string the way encoding/json does
// with HTML escaping off. A name as the service stores it (printable, no
// quote or backslash) is copied as it is; anything else, such as a row an
// operator wrote, goes through encoding/json.
func appendJSONString(b []byte, s []byte) []byte {
	plain := utf8.Valid(s)
	for _, c := range s {
		plain = plain && c >= ' ' && c != '"' && c != '\\' && c != 0xE2 // 0xE2 leads U+2028 and U+2029
	}
	if plain {
		b = append(b, '"')
		b = append(b, s...)
		return append(b, '"')
	}
	return append(b, bytes.TrimSuffix(marshalJSON(string(s)), []byte("\n"))...)
}
