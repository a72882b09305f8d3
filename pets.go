package main

import (
	"cmp"
	"errors"
	"net/http"
	"strconv"
	"time"
)

// NewPet is the request body of createPet.
type NewPet struct {
	Name       string `json:"name"`
	CategoryID int64  `json:"categoryId"`
	Status     string `json:"status"`
}

// Pet is a stored animal: a NewPet with the id the service assigned.
type Pet struct {
	ID         int64  `json:"id"`
	Name       string `json:"name"`
	CategoryID int64  `json:"categoryId"`
	Status     string `json:"status"`
}

const (
	// defaultLimit and maxLimit are the page sizes of the specification.
	defaultLimit = 20
	maxLimit     = 100
	// maxNameLength is counted in characters (Unicode code points).
	maxNameLength = 100
	// maxBodyBytes bounds what a create may send: 16 KiB is twelve times
	// the largest valid NewPet (about 1.3 KB, a name of 100 four-byte
	// characters escaped), so no real client comes near it, and a flood
	// of large bodies holds little memory.
	maxBodyBytes = 16 << 10
	// defaultStatus is what an omitted status is stored as.
	defaultStatus = "available"

	// getPet was deprecated on 2026-11-22T00:00:00Z (RFC 9745 wants the
	// date as @unix-seconds) and goes away on the specification's date.
	getPetDeprecation = "@1795305600"
	getPetSunset      = "Thu, 05 Dec 2030 00:00:00 GMT"
	getPetSuccessor   = `</v1/pets>; rel="successor-version"`
)

// petStatuses is the PetStatus enumeration, in the specification's order.
var petStatuses = []string{"available", "pending", "sold"}

// listOrders stands for GET /store/orders, which the specification names
// but does not describe.
func listOrders(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusNotImplemented, codeNotImplemented,
		"GET /v1/store/orders is named by the specification but not specified, so it is not implemented")
}

// listPets answers GET /v1/pets: one page in ascending id, with a Link to
// the next page when more pets match.
func (s *server) listPets(w http.ResponseWriter, r *http.Request) {
	f, err := parseListQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeInvalidParameter, err.Error())
		return
	}
	// One row more than asked tells whether there is a next page, so the
	// last page, even an exactly full one, has no next link.
	limit := f.limit
	f.limit++
	buf := getBuffer()
	defer putBuffer(buf)
	b := append(*buf, '[')
	n, last := 0, int64(0)
	err = s.store.listPets(f, func(p *petRow) {
		if n == limit {
			n++ // the extra row: only its existence matters
			return
		}
		if n > 0 {
			b = append(b, ',')
		}
		b = appendPetJSON(b, p)
		n, last = n+1, p.id
	})
	*buf = b
	if err != nil {
		writeStoreError(w, r, s.log, err)
		return
	}
	if n > limit {
		w.Header()["Link"] = []string{nextPageLink(limit, f.status, last)}
	}
	*buf = append(b, ']', '\n')
	writeBody(w, http.StatusOK, *buf)
}

// nextPageLink is the RFC 8288 Link to the page after the pet with id
// after. It is relative, so it stays right behind any domain or proxy.
func nextPageLink(limit int, status string, after int64) string {
	q := "limit=" + strconv.Itoa(limit)
	if status != "" {
		q += "&status=" + status
	}
	return "</v1/pets?" + q + "&after=" + strconv.FormatInt(after, 10) + `>; rel="next"`
}

// getPet answers GET /v1/pets/{petId}.
func (s *server) getPet(w http.ResponseWriter, r *http.Request) {
	if err := checkNoQuery(r.URL.RawQuery); err != nil {
		writeError(w, http.StatusBadRequest, codeInvalidParameter, err.Error())
		return
	}
	id, ok := parseDecimal(r.PathValue("petId"))
	if !ok || id < 1 {
		writeError(w, http.StatusBadRequest, codeInvalidParameter,
			"petId must be a pet's id, an integer from 1 to 9223372036854775807, got "+quoteValue(r.PathValue("petId")))
		return
	}
	buf := getBuffer()
	defer putBuffer(buf)
	err := s.store.getPet(id, func(p *petRow) {
		*buf = append(appendPetJSON(*buf, p), '\n')
	})
	if errors.Is(err, errNotFound) {
		writeError(w, http.StatusNotFound, codeNotFound, "no pet with id "+strconv.FormatInt(id, 10))
		return
	}
	if err != nil {
		writeStoreError(w, r, s.log, err)
		return
	}
	writeBody(w, http.StatusOK, *buf)
}

// createPet answers POST /v1/pets. The 201 is sent only once the row is
// committed. With an Idempotency-Key, a retry of the same request gets the
// same 201 again instead of a second pet.
func (s *server) createPet(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	if !isJSONContentType(r.Header.Get("Content-Type")) {
		writeError(w, http.StatusUnsupportedMediaType, codeUnsupportedMediaType,
			"send the body as JSON with the header Content-Type: application/json (curl: --json)")
		return
	}
	key, err := idempotencyKey(r.Header)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeInvalidParameter, err.Error())
		return
	}
	// An oversized body is drained until the create's deadline at most;
	// without a write timeout, for 10 s.
	body, ok := readBody(w, r, start.Add(cmp.Or(s.createWithin, 10*time.Second)))
	if !ok {
		return
	}
	np, err := decodeNewPet(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, codeInvalidBody, err.Error())
		return
	}
	c := createRequest{pet: np, idempotencyKey: key}
	if info, _ := infoOf(r.Context()); info.hasKey {
		c.scope = idempotencyScope(info.key)
	}
	if s.createWithin > 0 {
		c.deadline = start.Add(s.createWithin)
		// A create whose commit has begun is answered with its outcome,
		// however long the commit takes: the server's write timeout must
		// not cut the client off from a pet that was stored.
		rc := http.NewResponseController(w)
		c.late = func() { rc.SetWriteDeadline(time.Time{}) }
	}
	p, replayed, err := s.store.createPet(r.Context(), c)
	var refused *refusedError
	if errors.As(err, &refused) {
		writeError(w, http.StatusUnprocessableEntity, codeRefusedByDatabase, refused.Error())
		return
	}
	if errors.Is(err, errIdempotencyKeyReused) {
		writeError(w, http.StatusUnprocessableEntity, codeIdempotencyKeyReused,
			"this Idempotency-Key was already used for a different pet; use a new key for a new request")
		return
	}
	if err != nil {
		writeStoreError(w, r, s.log, err)
		return
	}
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.Header().Set("Location", "/v1/pets/"+strconv.FormatInt(p.ID, 10))
	row := petRow{id: p.ID, name: []byte(p.Name), categoryID: p.CategoryID, status: []byte(p.Status)}
	writeBody(w, http.StatusCreated, append(appendPetJSON(nil, &row), '\n'))
}

// createDeadline is how long a create may take, from its handler's
// start, before it must be answered: a margin inside the server's write
// timeout, which cuts the connection. A create that cannot be committed
// by then is refused with 503 and not stored, so a client never gets EOF
// for a pet that was stored behind its back.
// The margin is a quarter of the timeout, from 0.25 to 2 s, and never
// more than half of it, so the deadline stays positive for any timeout.
func createDeadline(writeTimeout time.Duration) time.Duration {
	margin := min(2*time.Second, max(250*time.Millisecond, writeTimeout/4), writeTimeout/2)
	return writeTimeout - margin
}
