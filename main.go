// Command petstore serves a store's catalogue of animals over a small JSON
// HTTP API backed by one SQLite file.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "petstore: %v\n", err)
		stop()
		os.Exit(1)
	}
}

// shutdownGrace bounds how long requests in flight may take to finish
// after SIGINT or SIGTERM.
const shutdownGrace = 10 * time.Second

// run is the whole program. With no subcommand it serves until ctx is
// cancelled; "backup" and "keygen" are one-shot commands. Every failure is
// returned, never printed and swallowed.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 1 {
		switch args[1] {
		case "backup":
			return runBackup(ctx, args[1:], getenv, stdout)
		case "keygen":
			return runKeygen(args[1:], stdout)
		}
	}
	return serve(ctx, args, getenv, stdout, stderr)
}

// config is what the flags and environment say.
type config struct {
	addr              string
	db                string
	apiKeysFile       string
	tlsCert, tlsKey   string
	readHeaderTimeout time.Duration
	readTimeout       time.Duration
	writeTimeout      time.Duration
	idleTimeout       time.Duration
	maxHeaderBytes    int
	logFormat         string
	logLevel          slog.Level
	corsOrigins       []string
	maxConns          int
	rateLimit         rateLimit // zero: off
	version           bool
}

// flagEnv defines flags whose defaults come from environment variables,
// so systemd units and shells can use either. A malformed variable is
// remembered and reported after parsing, like a malformed flag.
type flagEnv struct {
	fs     *flag.FlagSet
	getenv func(string) string
	err    error
}

func (f *flagEnv) string(p *string, name, env, def, usage string) {
	if v := f.getenv(env); v != "" {
		def = v
	}
	f.fs.StringVar(p, name, def, usage+" (env "+env+")")
}

func (f *flagEnv) duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	checked(f, p, name, env, def, def.String(), "a positive duration such as 5s or 1m30s", usage, func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err == nil && d <= 0 {
			err = errors.New("not positive")
		}
		return d, err
	})
}

func (f *flagEnv) int(p *int, name, env string, def int, usage string) {
	checked(f, p, name, env, def, strconv.Itoa(def), "a positive integer", usage, func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err == nil && n <= 0 {
			err = errors.New("not positive")
		}
		return n, err
	})
}

// checked defines a flag whose value, given on the command line or in
// its environment variable, goes through the same parse, so both accept
// the same values and are refused with the same message, naming both.
func checked[T any](f *flagEnv, p *T, name, env string, def T, defText, want, usage string, parse func(string) (T, error)) {
	*p = def
	v := &checkedValue[T]{p: p, text: defText, parse: parse,
		refuse: func(value string) error {
			err := fmt.Errorf("-%s (%s) must be %s, got %q", name, env, want, value)
			f.err = errors.Join(f.err, err)
			return err
		}}
	if e := f.getenv(env); e != "" {
		v.Set(e)
	}
	f.fs.Var(v, name, usage+" (env "+env+")")
}

// checkedValue is the flag.Value of checked.
type checkedValue[T any] struct {
	p      *T
	text   string
	parse  func(string) (T, error)
	refuse func(string) error
}

func (v *checkedValue[T]) String() string { return v.text }

func (v *checkedValue[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return v.refuse(s)
	}
	*v.p, v.text = x, s
	return nil
}

// newFlagSet returns a FlagSet that does not print: main prints the one
// error line instead, and -h prints usage to stdout.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parseFlags reads the serving command line.
func parseFlags(args []string, getenv func(string) string, stdout io.Writer) (config, error) {
	var c config
	fs := newFlagSet("petstore")
	f := &flagEnv{fs: fs, getenv: getenv}
	f.string(&c.addr, "addr", "PETSTORE_ADDR", "127.0.0.1:8080", "listen address, host:port")
	f.string(&c.db, "db", "PETSTORE_DB", "petstore.db", "SQLite database file, created if missing")
	f.string(&c.apiKeysFile, "api-keys-file", "PETSTORE_API_KEYS_FILE", "", "file of API keys, one a line, plain or sha256:<hex>; SIGHUP re-reads it")
	f.string(&c.tlsCert, "tls-cert", "PETSTORE_TLS_CERT", "", "PEM certificate chain; with -tls-key, serve HTTPS")
	f.string(&c.tlsKey, "tls-key", "PETSTORE_TLS_KEY", "", "PEM private key for -tls-cert")
	f.duration(&c.readHeaderTimeout, "read-header-timeout", "PETSTORE_READ_HEADER_TIMEOUT", 5*time.Second, "time allowed to send the request headers")
	f.duration(&c.readTimeout, "read-timeout", "PETSTORE_READ_TIMEOUT", 30*time.Second, "time allowed to send the whole request")
	f.duration(&c.writeTimeout, "write-timeout", "PETSTORE_WRITE_TIMEOUT", 30*time.Second, "time allowed from the end of the request headers to the end of the response")
	f.duration(&c.idleTimeout, "idle-timeout", "PETSTORE_IDLE_TIMEOUT", 120*time.Second, "how long an idle keep-alive connection is kept")
	f.int(&c.maxHeaderBytes, "max-header-bytes", "PETSTORE_MAX_HEADER_BYTES", 16<<10, "largest request header block, in bytes")
	f.string(&c.logFormat, "log-format", "PETSTORE_LOG_FORMAT", "text", "log format: text or json")
	var level, origins string
	f.string(&level, "log-level", "PETSTORE_LOG_LEVEL", "info", "log level: debug, info (one line per request), warn or error")
	f.string(&origins, "cors-origins", "PETSTORE_CORS_ORIGINS", "", "browser origins allowed to call the API, comma-separated, exact (https://office.example.com)")
	var maxConns, rate, burst string
	f.string(&maxConns, "max-conns", "PETSTORE_MAX_CONNS", "", fmt.Sprintf(
		"most client connections open at once; more wait at the listener (default: the descriptor limit less room for the database, here %d)", defaultMaxConns()))
	f.string(&rate, "rate-limit", "PETSTORE_RATE_LIMIT", "", "requests per API key, such as 50/s, 3000/m or 100000/h; off when empty")
	f.string(&burst, "rate-burst", "PETSTORE_RATE_BURST", "", "requests a key may send at once before the rate applies (default: the rate's count, 50 for 50/s)")
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	err := fs.Parse(args[1:])
	if err != nil && f.err != nil {
		return c, f.err // a flag or variable refused, with its message
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			// "petstore", not args[0]: under go run that is a path in the
			// build cache.
			fmt.Fprint(stdout, "Usage: petstore [flags]\n       petstore backup [-db FILE] BACKUP-FILE\n"+
				"       petstore backup [-db FILE] -dir DIR [-keep N]\n       petstore keygen\n\n"+
				"API keys come from PETSTORE_API_KEYS (comma-separated) and -api-keys-file.\n"+
				"Each flag can also be set by the environment variable named with it; a flag wins.\n\nFlags:\n")
			fs.PrintDefaults()
		}
		return c, err
	}
	if f.err != nil {
		return c, f.err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (commands: backup, keygen)", fs.Arg(0))
	}
	if (c.tlsCert == "") != (c.tlsKey == "") {
		return c, errors.New("-tls-cert and -tls-key go together: give both or neither")
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		return c, fmt.Errorf("-log-format (PETSTORE_LOG_FORMAT) must be text or json, got %q", c.logFormat)
	}
	if err := c.logLevel.UnmarshalText([]byte(level)); err != nil {
		return c, fmt.Errorf("-log-level (PETSTORE_LOG_LEVEL) must be debug, info, warn or error, got %q", level)
	}
	c.maxConns = defaultMaxConns()
	if maxConns != "" {
		n, err := strconv.Atoi(maxConns)
		if err != nil || n < 1 {
			return c, fmt.Errorf("-max-conns (PETSTORE_MAX_CONNS) must be a positive integer, got %q", maxConns)
		}
		c.maxConns = n
	}
	if c.rateLimit, err = parseRateLimit(rate, burst); err != nil {
		return c, err
	}
	for _, o := range strings.Split(origins, ",") {
		if o = strings.TrimSpace(o); o == "" {
			continue
		}
		// A browser's Origin never ends in "/", but an address copied from
		// its address bar does: the slash is dropped, not held against it.
		origin := strings.TrimSuffix(o, "/")
		if u, err := url.Parse(origin); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return c, fmt.Errorf("-cors-origins (PETSTORE_CORS_ORIGINS): %q is not an origin: write the scheme and host (and port), such as https://office.example.com, with no path", o)
		}
		c.corsOrigins = append(c.corsOrigins, origin)
	}
	return c, nil
}

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

// versionLine describes the build, from what the Go toolchain recorded in
// the binary: the module version and the VCS revision, time and state.
func versionLine() string {
	version, revision, when, modified := "unknown", "unknown", "", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.time":
				when = ", " + s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = ", modified"
				}
			}
		}
	}
	return fmt.Sprintf("petstore %s (revision %s%s%s)", version, revision, when, modified)
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

func (w *logWriter) loop() {
	defer close(w.done)
	for {
		_, open := <-w.wake
		w.drain()
		if !open {
			return
		}
	}
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
		if dropped > 0 && w.noteDropped(dropped) {
			w.mu.Lock()
			w.dropped -= dropped
			w.mu.Unlock()
		}
	}
}

// noteDropped logs how many lines were lost, in the log's own format.
func (w *logWriter) noteDropped(n int) bool {
	var line bytes.Buffer
	newLogger(&line, w.format, slog.LevelWarn).Warn("log lines were dropped: the log output did not take them", "lines", n)
	_, err := w.out.Write(line.Bytes())
	return err == nil
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

// defaultMaxConns is the default cap on client connections: the process's
// descriptor limit less room for the database's connections (two files
// each), the listener and the rest.
func defaultMaxConns() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur > 1<<20 {
		return 1 << 16
	}
	reserve := 32 + 3*(readerConns()+1)
	return max(1, int(lim.Cur)-reserve)
}

// limitListener makes new connections wait in the listen queue while max
// are open, so the process never runs out of descriptors for the ones it
// has accepted or for its database.
type limitListener struct {
	net.Listener
	slots     chan struct{}
	closed    chan struct{}
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, max int) *limitListener {
	return &limitListener{Listener: ln, slots: make(chan struct{}, max), closed: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, release: sync.OnceFunc(func() { <-l.slots })}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// limitedConn gives its slot back when it is closed.
type limitedConn struct {
	net.Conn
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// serve runs the HTTP service until ctx is cancelled.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if cfg.version {
		fmt.Fprintln(stdout, versionLine())
		return nil
	}
	// Logging must never hold up serving: lines go through a bounded
	// queue, and a log reader that stalls or goes away costs lines, not
	// requests. A reader gone makes writes fail with EPIPE, which must not
	// kill the process as SIGPIPE does by default for stderr.
	signal.Ignore(syscall.SIGPIPE)
	logOut := newLogWriter(stderr, cfg.logFormat)
	defer logOut.close(time.Second)
	stderr = logOut
	log := newLogger(logOut, cfg.logFormat, cfg.logLevel)

	keySrc := keySource{list: getenv("PETSTORE_API_KEYS"), file: cfg.apiKeysFile}
	digests, err := keySrc.load()
	if err != nil {
		return err
	}
	if len(digests) == 0 && cfg.apiKeysFile != "" {
		return fmt.Errorf("API keys file %s holds no key", cfg.apiKeysFile)
	}
	if len(digests) == 0 {
		key, err := generateAPIKey()
		if err != nil {
			return fmt.Errorf("generate API key: %w", err)
		}
		fmt.Fprintf(stderr, "WARNING: no API key configured (PETSTORE_API_KEYS); using this generated key, which changes on every start:\n\n    %s\n\n", key)
		digests, _ = parseAPIKeys(key)
	}
	keys := newKeyRing(digests)

	var tlsConfig *tls.Config
	if cfg.tlsCert != "" {
		// Loaded now, so a bad certificate fails the start, not the first
		// handshake.
		cert, err := tls.LoadX509KeyPair(cfg.tlsCert, cfg.tlsKey)
		if err != nil {
			return fmt.Errorf("TLS certificate: %w", err)
		}
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	}

	// Listen before opening anything else, so a busy port fails at once.
	tcpLn, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	ln := newLimitListener(tcpLn, cfg.maxConns)
	defer ln.Close()

	store, err := openStore(cfg.db, storeOptions{log: log})
	if err != nil {
		return err
	}
	defer store.close()

	srv := &http.Server{
		Handler: newHandler(&server{store: store, keys: keys, log: log, corsOrigins: cfg.corsOrigins,
			createWithin: createDeadline(cfg.writeTimeout), limiter: newRateLimiter(cfg.rateLimit)}),
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: cfg.readHeaderTimeout,
		ReadTimeout:       cfg.readTimeout,
		WriteTimeout:      cfg.writeTimeout,
		IdleTimeout:       cfg.idleTimeout,
		MaxHeaderBytes:    cfg.maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go reloadKeysOnHUP(ctx, hup, keySrc, keys, log)

	serveErr := make(chan error, 1)
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
		go func() { serveErr <- srv.ServeTLS(ln, "", "") }()
	} else {
		go func() { serveErr <- srv.Serve(ln) }()
		if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
			log.Warn("serving plain HTTP beyond loopback: API keys cross the network in clear text; use -tls-cert and -tls-key or a TLS proxy")
		}
	}
	log.Info("listening", "addr", scheme+"://"+ln.Addr().String(), "db", cfg.db)

	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "grace", shutdownGrace.String())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		// Requests still running after the grace period are cut off; the
		// database is still closed cleanly below.
		log.Warn("requests still in flight after the grace period were cut off", "err", err)
		srv.Close()
	}
	if err := store.close(); err != nil {
		return fmt.Errorf("close database: %w", err)
	}
	log.Info("stopped")
	return nil
}

// reloadKeysOnHUP re-reads the keys on every SIGHUP, so a key is added or
// revoked without a restart. A file that does not parse changes nothing.
func reloadKeysOnHUP(ctx context.Context, hup <-chan os.Signal, src keySource, keys *keyRing, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if src.file == "" {
			log.Warn("SIGHUP: no API keys file configured (-api-keys-file); nothing to reload")
			continue
		}
		digests, err := src.load()
		if err == nil && len(digests) == 0 {
			// As at start: a file with no key (all comments, or emptied by
			// a > typed for >>) would lock every client out.
			err = fmt.Errorf("API keys file %s holds no key", src.file)
		}
		if err != nil {
			log.Error("SIGHUP: API keys not reloaded; the previous keys stay in force", "err", err)
			continue
		}
		keys.set(digests)
		log.Info("SIGHUP: API keys reloaded", "keys", len(digests))
	}
}

// runBackup is "petstore backup [-db FILE] BACKUP-FILE", or, for
// scheduled snapshots, "petstore backup [-db FILE] -dir DIR [-keep N]".
func runBackup(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	const usage = "petstore backup [-db FILE] BACKUP-FILE | petstore backup [-db FILE] -dir DIR [-keep N]"
	fs := newFlagSet("petstore backup")
	var db, dir string
	var keep int
	(&flagEnv{fs: fs, getenv: getenv}).string(&db, "db", "PETSTORE_DB", "petstore.db", "SQLite database file to back up")
	fs.StringVar(&dir, "dir", "", "write a timestamped snapshot into this directory instead of BACKUP-FILE")
	fs.IntVar(&keep, "keep", 14, "with -dir: how many snapshots to keep, the newest; older ones this command wrote are deleted")
	files, err := parseInterspersed(fs, args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: %s\n\nWrites a consistent copy of the database, also while the service runs.\n\nFlags:\n", usage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil
		}
		return fmt.Errorf("backup: %w", err)
	}
	if dir == "" {
		if len(files) != 1 {
			return fmt.Errorf("backup: name one backup file, or -dir (got %d names): %s", len(files), usage)
		}
		dst := files[0]
		pets, err := backupDatabase(ctx, db, dst)
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		fmt.Fprintf(stdout, "backed up %s to %s: %d pets, integrity ok\n", db, dst, pets)
		return nil
	}
	if len(files) != 0 {
		return errors.New("backup: with -dir, name no backup file: " + usage)
	}
	if keep < 1 {
		return fmt.Errorf("backup: -keep must be at least 1, got %d", keep)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	dst := filepath.Join(dir, snapshotName(time.Now()))
	pets, err := backupDatabase(ctx, db, dst)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	fmt.Fprintf(stdout, "backed up %s to %s: %d pets, integrity ok\n", db, dst, pets)
	removed, err := pruneSnapshots(dir, keep, filepath.Base(dst))
	for _, name := range removed {
		fmt.Fprintf(stdout, "deleted the older snapshot %s\n", filepath.Join(dir, name))
	}
	if err != nil {
		return fmt.Errorf("backup: the snapshot was written, but older ones were not all deleted: %w", err)
	}
	return nil
}

// parseInterspersed parses flags that may come before or after the
// other arguments ("backup FILE -db X" as well as "backup -db X FILE"),
// and returns those arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return rest, nil
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// snapshotPattern matches the names of the snapshots that -dir writes,
// and only those: retention never touches another file.
var snapshotPattern = regexp.MustCompile(`^petstore-\d{8}T\d{6}Z\.db$`)

// snapshotName is a snapshot's file name: its UTC time, so that names
// sort in time order.
func snapshotName(t time.Time) string {
	return "petstore-" + t.UTC().Format("20060102T150405Z") + ".db"
}

// pruneSnapshots deletes the oldest snapshots in dir beyond the newest
// keep, never the one just written and never a file whose name is not a
// snapshot's. It returns the names it deleted.
func pruneSnapshots(dir string, keep int, justWritten string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && snapshotPattern.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	var removed []string
	for len(names) > keep {
		name := names[0]
		names = names[1:]
		if name == justWritten {
			continue
		}
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			return removed, err
		}
		removed = append(removed, name)
	}
	return removed, nil
}

// runKeygen is "petstore keygen": a new key for the client, and the line
// that lets the service accept it without keeping it in plain text.
func runKeygen(args []string, stdout io.Writer) error {
	if len(args) == 2 && (args[1] == "-h" || args[1] == "-help" || args[1] == "--help") {
		fmt.Fprintln(stdout, "Usage: petstore keygen\n\nPrints a new API key for a client, and the sha256: line for the keys file\n(-api-keys-file) that accepts it without storing it in plain text.")
		return nil
	}
	if len(args) > 1 {
		return fmt.Errorf("keygen takes no arguments, got %q (petstore keygen -h)", args[1])
	}
	key, err := generateAPIKey()
	if err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	fmt.Fprintf(stdout, "key: %s\nkeys-file line: %s\n", key, keysFileLine(key))
	return nil
}
