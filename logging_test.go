package main

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestLogLevelAndFormat(t *testing.T) {
	for _, tt := range []struct {
		args       []string
		wantAccess string // a substring of the access line, or "" for none
	}{
		{nil, `level=INFO msg=request method=GET path=/healthz status=200 bytes=16 duration=`},
		{[]string{"-log-level", "warn"}, ""},
		{[]string{"-log-format", "json", "-log-level", "DEBUG"}, `"msg":"request","method":"GET","path":"/healthz","status":200,"bytes":16,"duration":`},
	} {
		svc := startService(t, nil, tt.args...)
		send(t, svc.url, call{method: "GET", path: "/healthz", header: noKey})
		svc.stop()
		logged := svc.log.String()
		if got := strings.Contains(logged, `msg=request`) || strings.Contains(logged, `"msg":"request"`); got != (tt.wantAccess != "") || !strings.Contains(logged, tt.wantAccess) {
			t.Errorf("%v: log\n%s\nwant access line %q", tt.args, logged, tt.wantAccess)
		}
	}
}

// TestStalledLogPipe gives the binary a stderr pipe that nobody reads:
// requests go on being answered at normal speed; once the pipe is read
// again the dropped lines are counted in the log; when the reader goes
// away the process keeps running (no SIGPIPE) and stops cleanly.
func TestStalledLogPipe(t *testing.T) {
	// The binary's stderr is a pipe that startBinary reads into this
	// one, which nobody reads yet: the pipe fills, and stays full.
	r, w := io.Pipe()
	base, cmd := startBinary(t, nil, []string{"-db", filepath.Join(t.TempDir(), "pets.db")}, w)

	// A request held up by the log would hang: the timeout only has to
	// tell a hang from a slow machine.
	client := &http.Client{Timeout: patience}
	get := func() error {
		if r := send(t, base, call{method: "GET", path: "/v1/pets?limit=1", client: client}); r.status != 200 {
			return fmt.Errorf("status %d: %v", r.status, r.err)
		}
		return nil
	}
	// Enough requests to overflow both the pipe (64 KiB) and the log's
	// own queue (4 MiB, about 25,000 lines), so lines are dropped.
	const clients, each = 8, 5000
	var failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := get(); err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("log pipe stalled: %d of %d requests answered (%d failed) in %s",
		clients*each-failed.Load(), clients*each, failed.Load(), time.Since(start).Round(time.Millisecond))
	if failed.Load() != 0 {
		t.Fatalf("%d requests failed with the log pipe stalled; the first: %v", failed.Load(), firstErr.Load())
	}

	// Read the pipe again: the count of lost lines is logged.
	logs := &syncBuffer{}
	copied := make(chan struct{})
	go func() { io.Copy(logs, r); close(copied) }()
	for range 5 {
		get()
	}
	waitForLog(t, logs, `level=WARN msg="log lines were dropped: the log output did not take them" lines=[1-9][0-9]*`, 1)
	t.Logf("after the stall: %s", regexp.MustCompile(`msg="log lines were dropped[^\n]*`).FindString(logs.String()))

	// The reader goes away: writes to stderr fail with EPIPE, and the
	// process goes on serving.
	r.Close()
	<-copied
	for i := range 200 {
		if err := get(); err != nil {
			t.Fatalf("request %d after the log reader went away: %v", i, err)
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Errorf("exit after SIGTERM with no log reader: %v, want status 0", err)
	}
}

// TestLogLimiter: a key is let through once per period with the count
// of what it held back; a flood of new keys gets at most perMinute lines
// a minute and bounded memory, and a key that comes after the flood is
// still logged, with the count of the lines the flood did not get.
func TestLogLimiter(t *testing.T) {
	l := newLogLimiter(time.Hour, 1000, 60)
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	type got struct {
		ok           bool
		held, others int
	}
	allow := func(key string, at time.Duration) got {
		ok, held, others := l.allow(key, t0.Add(at))
		return got{ok, held, others}
	}
	if diff := cmp.Diff(got{true, 0, 0}, allow("https://a.example", 0), cmp.AllowUnexported(got{})); diff != "" {
		t.Errorf("first line (-want +got):\n%s", diff)
	}
	for i := range 5 {
		if g := allow("https://a.example", time.Duration(i+1)*time.Second); g.ok {
			t.Errorf("repeat %d within the hour let through", i)
		}
	}
	let := 0
	for i := range 20_000 {
		if allow(fmt.Sprintf("https://junk-%d.example", i), 10*time.Second).ok {
			let++
		}
	}
	if let != 59 { // a.example took one of the minute's 60
		t.Errorf("%d of 20,000 new keys let through in one minute, want 59", let)
	}
	if len(l.seen) > 1000 {
		t.Errorf("%d keys remembered, want at most 1000", len(l.seen))
	}
	if diff := cmp.Diff(got{true, 0, 20_000 - 59}, allow("https://office-moved.example", 2*time.Minute), cmp.AllowUnexported(got{})); diff != "" {
		t.Errorf("a key after the flood (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(got{true, 5, 0}, allow("https://a.example", time.Hour+time.Second), cmp.AllowUnexported(got{})); diff != "" {
		t.Errorf("the first key an hour later (-want +got):\n%s", diff)
	}
}
