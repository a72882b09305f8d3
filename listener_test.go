package main

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// TestLowDescriptorLimit runs the binary with RLIMIT_NOFILE 128 and more
// clients than that, each on its own connection: connections above the
// cap wait at the listener, and no request on an accepted connection
// fails.
func TestLowDescriptorLimit(t *testing.T) {
	stderr := &syncBuffer{}
	sh := needTool(t, "sh", "apt-get install dash")
	base, _ := startBinary(t, []string{sh, "-c", `ulimit -n 128 && exec "$0" "$@"`},
		[]string{"-db", filepath.Join(t.TempDir(), "pets.db")}, stderr)
	const clients, each = 150, 5
	var failed, answered atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			transport := &http.Transport{MaxConnsPerHost: 1}
			defer transport.CloseIdleConnections()
			client := &http.Client{Transport: transport, Timeout: patience}
			for range each {
				req, _ := http.NewRequest("GET", base+"/v1/pets?limit=5", nil)
				req.Header.Set("Authorization", "Bearer "+testKey)
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
					continue
				}
				answered.Add(1)
			}
		}()
	}
	wg.Wait()
	t.Logf("RLIMIT_NOFILE 128, %d clients on their own connections: %d requests answered 200, %d failed", clients, answered.Load(), failed.Load())
	if failed.Load() != 0 || strings.Contains(stderr.String(), "too many open files") {
		t.Errorf("%d requests failed at the descriptor limit; log:\n%s", failed.Load(), stderr)
	}
}
