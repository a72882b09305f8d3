// Logging: the service's logger, which tags every line of a request with
// its id, and the asynchronous writer that keeps a stalled log output
// from ever holding up a request.

package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync"
	"time"
)

// newLogger builds the service's logger. Every line logged with a
// request's context carries that request's id.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(requestIDHandler{h})
}

// requestIDHandler adds the request id of the context to each record.
type requestIDHandler struct{ slog.Handler }

func (h requestIDHandler) Handle(ctx context.Context, r slog.Record) error {
	if info, ok := infoOf(ctx); ok {
		r.AddAttrs(slog.String("request_id", info.id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h requestIDHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return requestIDHandler{h.Handler.WithAttrs(attrs)}
}

func (h requestIDHandler) WithGroup(name string) slog.Handler {
	return requestIDHandler{h.Handler.WithGroup(name)}
}

// logWriter stands between the logger and its output (a terminal, a
// pipe, journald, a file), so that an output which stalls never holds up a
// request. Lines wait in a bounded queue that one goroutine writes out,
// several at a time; a full queue drops lines and counts them, and once
// writing works again the count is logged.
type logWriter struct {
	out    io.Writer
	format string

	mu      sync.Mutex
	queue   []byte // whole lines waiting to be written
	dropped int    // lines lost since the last notice
	closed  bool
	wake    chan struct{}
	done    chan struct{}
}

// maxQueuedLog bounds the lines waiting for a stalled output.
const maxQueuedLog = 4 << 20

func newLogWriter(out io.Writer, format string) *logWriter {
	w := &logWriter{out: out, format: format, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go w.loop()
	return w
}

// Write queues one line; it never blocks on the output.
func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || len(w.queue)+len(p) > maxQueuedLog {
		w.dropped++
		return len(p), nil
	}
	w.queue = append(w.queue, p...)
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return len(p), nil
}

// logBatchDelay is how long the writer lets lines gather after the first
// before it writes them out. Under load that makes one write(2) of a few
// hundred access lines, not one of a dozen, and a pipe's reader (journald,
// a supervisor) wakes once for them: gets rose from 0.65-0.68 to
// 0.83-0.88 of BenchmarkLoad's floor, creates from 0.37-0.38 to 0.38-0.40
// (docs/performance.md).
// The price: a line is written up to this much later (under load, p99
// 16 ms after its time=), and a SIGKILL or a crash loses what is queued,
// now up to that much more.
const logBatchDelay = 10 * time.Millisecond

func (w *logWriter) loop() {
	defer close(w.done)
	for range w.wake {
		time.Sleep(logBatchDelay)
		w.drain()
	}
	w.drain() // closed: what is left, at once
}

// drain writes out the queue until it is empty.
func (w *logWriter) drain() {
	var batch []byte
	for {
		w.mu.Lock()
		batch, w.queue = w.queue, batch[:0]
		dropped := w.dropped
		w.mu.Unlock()
		if len(batch) == 0 {
			return
		}
		if _, err := w.out.Write(batch); err != nil {
			w.mu.Lock()
			w.dropped += bytes.Count(batch, []byte{'\n'})
			w.mu.Unlock()
			continue
		}
		if dropped > 0 {
			// How many lines were lost, in the log's own format.
			var line bytes.Buffer
			newLogger(&line, w.format, slog.LevelWarn).Warn("log lines were dropped: the log output did not take them", "lines", dropped)
			if _, err := w.out.Write(line.Bytes()); err == nil {
				w.mu.Lock()
				w.dropped -= dropped
				w.mu.Unlock()
			}
		}
	}
}

// close writes out what is queued, waiting at most wait for an output
// that does not take it.
func (w *logWriter) close(wait time.Duration) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	close(w.wake)
	w.mu.Unlock()
	select {
	case <-w.done:
	case <-time.After(wait):
	}
}

// logLimiter lets a repeated warning through at most once per key (an
// origin, an address, a kind of error) per period, and counts the ones it
// held back, so the next line for the key can say how many. Memory is
// bounded: it remembers at most max keys, and when full forgets the ones
// whose period is over, or else half of them (a forgotten key may be
// logged again early). With perMinute > 0 it also lets through at most
// that many lines a minute over all keys, so a flood of made-up keys
// cannot flood the log; a key held back by that limit is not marked as
// logged, so it shows at its next occurrence once the flood thins.
type logLimiter struct {
	period    time.Duration
	max       int
	perMinute int

	mu       sync.Mutex
	seen     map[string]*limitedLine
	minute   time.Time // start of the minute the lines count in
	used     int       // lines let through in it
	heldBack int       // lines the per-minute limit held back since the last one let through
}

type limitedLine struct {
	last time.Time
	held int // lines held back since last
}

func newLogLimiter(period time.Duration, max, perMinute int) *logLimiter {
	return &logLimiter{period: period, max: max, perMinute: perMinute, seen: map[string]*limitedLine{}}
}

// allow reports whether a line for key may be logged now, with how many
// lines for it were held back since its last one, and how many lines for
// any key the per-minute limit held back since the last line let through.
func (l *logLimiter) allow(key string, now time.Time) (ok bool, held, others int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.seen[key]
	if e != nil && now.Sub(e.last) < l.period {
		e.held++
		return false, 0, 0
	}
	if now.Sub(l.minute) >= time.Minute {
		l.minute, l.used = now, 0
	}
	if l.perMinute > 0 && l.used >= l.perMinute {
		l.heldBack++
		return false, 0, 0
	}
	l.used++
	if e == nil {
		if len(l.seen) >= l.max {
			l.forget(now)
		}
		e = &limitedLine{}
		l.seen[key] = e
	}
	held, others = e.held, l.heldBack
	e.last, e.held, l.heldBack = now, 0, 0
	return true, held, others
}

// forget makes room: keys whose period is over go, and if that is not
// enough, half of the rest, whichever the map's order gives.
func (l *logLimiter) forget(now time.Time) {
	for k, e := range l.seen {
		if now.Sub(e.last) >= l.period {
			delete(l.seen, k)
		}
	}
	for k := range l.seen {
		if len(l.seen) < l.max/2 {
			break
		}
		delete(l.seen, k)
	}
}
