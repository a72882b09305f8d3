// Command petstore serves a store's catalogue of animals over a small JSON
// HTTP API backed by one SQLite file.
package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
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

// needsCgo is all that a binary built without cgo prints (nocgo.go):
// SQLite is C, so petstore needs a C compiler to build.
const needsCgo = `petstore needs cgo and a C compiler: it keeps its pets in SQLite, which is C (github.com/mattn/go-sqlite3), and this binary was built with cgo off (CGO_ENABLED=0, or no C compiler was found). Install a C compiler and build again with CGO_ENABLED=1:
  Debian, Ubuntu: apt-get install gcc
  Alpine:         apk add gcc musl-dev
  macOS:          xcode-select --install`

// shutdownGrace bounds how long requests in flight may take to finish
// after SIGINT or SIGTERM.
const shutdownGrace = 10 * time.Second

// run is the whole program. With no subcommand it serves until ctx is
// cancelled; "backup", "restore" and "keygen" are one-shot commands. Every
// failure is returned, never printed and swallowed.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) > 1 {
		switch args[1] {
		case "backup":
			return runBackup(ctx, args[1:], getenv, stdout)
		case "restore":
			return runRestore(ctx, args[1:], getenv, stdout)
		case "keygen":
			return runKeygen(args[1:], stdout)
		}
	}
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
	log := newLogger(logOut, cfg.logFormat, cfg.logLevel)
	for _, name := range cfg.unknownVariables {
		log.Warn("environment variable not read by petstore: it has no effect"+meantVariable(name, cfg.variables), "name", name)
	}
	var terminal io.Writer // nil: the log is not read by a person at a terminal
	if f, ok := stderr.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			terminal = logOut // in line with the log's own lines
		}
	}
	svc, err := newService(cfg, getenv, log, terminal)
	if err != nil {
		return err
	}
	return svc.serve(ctx)
}

// versionLine describes the build, from what the Go toolchain recorded in
// the binary: the module version and the VCS revision, time and state.
func versionLine() string {
	settings := map[string]string{}
	version := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		version = bi.Main.Version
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
	}
	line := "petstore " + version + " (revision " + cmp.Or(settings["vcs.revision"], "unknown")
	if t := settings["vcs.time"]; t != "" {
		line += ", " + t
	}
	if settings["vcs.modified"] == "true" {
		line += ", modified"
	}
	return line + ")"
}

// service is the running program: its listener, store, keys and server.
type service struct {
	cfg    config
	log    *slog.Logger
	ln     *limitListener
	store  *petStore
	keys   *keyRing
	keySrc keySource
	cert   *certificate // nil: plain HTTP
	api    *server
	srv    *http.Server
}

// newService loads the keys and the certificate, listens and opens the
// store, in an order that makes the common mistakes fail at once: a bad
// key or certificate before anything else, a busy port before the
// database is opened.
func newService(cfg config, getenv func(string) string, log *slog.Logger, terminal io.Writer) (*service, error) {
	s := &service{cfg: cfg, log: log, keySrc: keySource{list: getenv("PETSTORE_API_KEYS"), file: cfg.apiKeysFile}}
	digests, err := s.keySrc.load()
	if err != nil {
		return nil, err
	}
	if len(digests) == 0 {
		// A key made up for this run, shown only to a person at a
		// terminal: a log kept by journald or in a file would keep it.
		key := generateAPIKey()
		if terminal != nil {
			fmt.Fprintf(terminal, "WARNING: no API key configured (PETSTORE_API_KEYS); using this generated key, which changes on every start:\n\n    %s\n\n", key)
		} else {
			log.Warn("no API key configured (PETSTORE_API_KEYS, -api-keys-file): every request under /v1 is refused until one is; a key generated for this run is shown only at a terminal (petstore keygen makes one to configure)")
		}
		digests = []keyDigest{digestOf(key)}
	}
	s.keys = newKeyRing(digests)
	var tlsConfig *tls.Config
	if cfg.tlsCert != "" {
		s.cert = &certificate{certFile: cfg.tlsCert, keyFile: cfg.tlsKey}
		if err := s.cert.reload(); err != nil {
			return nil, err
		}
		// Every new handshake gets the certificate in force.
		tlsConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cert.current.Load(), nil
		}}
	}
	tcpLn, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	s.ln = newLimitListener(tcpLn, cfg.maxConns, cfg.readHeaderTimeout, log)
	if s.store, err = openStore(cfg.db, log); err != nil {
		s.ln.Close()
		return nil, err
	}
	s.api = &server{store: s.store, keys: s.keys, log: log, corsOrigins: cfg.corsOrigins,
		createWithin: createDeadline(cfg.writeTimeout), readTimeout: cfg.readTimeout, guard: newAuthGuard(log)}
	s.srv = &http.Server{
		Handler:           newHandler(s.api),
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: cfg.readHeaderTimeout,
		ReadTimeout:       cfg.readTimeout,
		WriteTimeout:      cfg.writeTimeout,
		IdleTimeout:       cfg.idleTimeout,
		MaxHeaderBytes:    cfg.maxHeaderBytes,
		ErrorLog:          newServerErrors(log),
		ConnState:         s.ln.connState,
		HTTP2:             http2Config,
	}
	return s, nil
}

// url is where the service answers.
func (s *service) url() string {
	if s.cert != nil {
		return "https://" + s.ln.Addr().String()
	}
	return "http://" + s.ln.Addr().String()
}

// serve answers requests until ctx is cancelled, then shuts down within
// shutdownGrace and closes the store. SIGHUP reloads the keys and the
// certificate.
func (s *service) serve(ctx context.Context) error {
	defer s.ln.Close()
	defer s.store.close()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go s.reloadOnHUP(ctx, hup)
	serveErr := make(chan error, 1)
	go func() {
		if s.cert != nil {
			serveErr <- s.srv.ServeTLS(s.ln, "", "")
		} else {
			serveErr <- s.srv.Serve(s.ln)
		}
	}()
	if tcp, ok := s.ln.Addr().(*net.TCPAddr); ok && s.cert == nil && !tcp.IP.IsLoopback() {
		s.log.Warn("serving plain HTTP beyond loopback: API keys cross the network in clear text; use -tls-cert and -tls-key or a TLS proxy")
	}
	s.log.Info("listening", "addr", s.url(), "db", s.cfg.db)
	select {
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("shutting down", "grace", shutdownGrace.String())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := s.srv.Shutdown(shutdownCtx); err != nil {
		// Requests still running after the grace period are cut off; the
		// database is still closed cleanly below.
		s.log.Warn("requests still in flight after the grace period were cut off", "err", err)
		s.srv.Close()
	}
	if err := s.store.close(); err != nil {
		return fmt.Errorf("close database: %w", err)
	}
	s.log.Info("stopped")
	return nil
}

// reloadOnHUP re-reads the keys, and the TLS certificate when there is
// one, on every SIGHUP, so a key is added or revoked and a renewed
// certificate served without a restart. What does not load changes
// nothing: what was in force stays, as a keys file with no key in it (all
// comments, or emptied by a > typed for >>) would lock every client out.
func (s *service) reloadOnHUP(ctx context.Context, hup <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if s.cert != nil {
			if err := s.cert.reload(); err != nil {
				s.log.Error("SIGHUP: TLS certificate not reloaded; the previous one stays in force", "err", err)
			} else {
				s.log.Info("SIGHUP: TLS certificate reloaded", "cert", s.cert.certFile)
			}
		}
		if s.keySrc.file == "" {
			if s.cert == nil {
				s.log.Warn("SIGHUP: no API keys file configured (-api-keys-file); nothing to reload")
			}
			continue
		}
		digests, err := s.keySrc.load()
		if err != nil {
			s.log.Error("SIGHUP: API keys not reloaded; the previous keys stay in force", "err", err)
			continue
		}
		s.keys.set(digests)
		s.log.Info("SIGHUP: API keys reloaded", "keys", len(digests))
	}
}

// Configuration: the serving flags, each with an environment variable as
// its default, parsed and refused the same way from either source, and
// hints for the names people reach for.

// config is what the flags and environment say.
type config struct {
	addr, db, apiKeysFile string
	tlsCert, tlsKey       string

	// The http.Server's timeouts.
	readHeaderTimeout, readTimeout, writeTimeout, idleTimeout time.Duration

	maxHeaderBytes int
	logFormat      string
	logLevel       slog.Level
	corsOrigins    []string
	maxConns       int
	version        bool
	// variables maps each flag to its environment variable; the
	// PETSTORE_ variables set that none reads are in unknownVariables.
	variables        map[string]string
	unknownVariables []string
}

// flagEnv defines flags whose defaults come from environment variables,
// so systemd units and shells can use either. A flag and its variable go
// through the same parse, so both accept the same values and are refused
// with the same message, naming both; a refused variable is reported
// after parsing, like a refused flag.
type flagEnv struct {
	fs     *flag.FlagSet
	getenv func(string) string
	vars   map[string]string
	err    error
}

// define defines the flag name with its variable env; parse turns a
// value into *p.
func define[T any](f *flagEnv, p *T, name, env string, def T, defText, want, usage string, parse func(string) (T, error)) {
	*p = def
	f.vars[name] = env
	v := &flagValue[T]{p: p, text: defText, parse: parse,
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

func (f *flagEnv) string(p *string, name, env, def, usage string) {
	define(f, p, name, env, def, def, "", usage, func(v string) (string, error) { return v, nil })
}

func (f *flagEnv) duration(p *time.Duration, name, env string, def time.Duration, usage string) {
	define(f, p, name, env, def, def.String(), "a positive duration such as 5s or 1m30s", usage+", a `duration`", positive(time.ParseDuration))
}

func (f *flagEnv) int(p *int, name, env string, def int, defText, usage string) {
	define(f, p, name, env, def, defText, "a positive integer", usage, positive(strconv.Atoi))
}

// positive is parse refusing a value that is zero or negative.
func positive[T int | time.Duration](parse func(string) (T, error)) func(string) (T, error) {
	return func(v string) (T, error) {
		x, err := parse(v)
		if err == nil && x <= 0 {
			err = errors.New("not positive")
		}
		return x, err
	}
}

// flagValue is the flag.Value of define.
type flagValue[T any] struct {
	p      *T
	text   string
	parse  func(string) (T, error)
	refuse func(string) error
}

func (v *flagValue[T]) String() string { return v.text }

func (v *flagValue[T]) Set(s string) error {
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
	f := &flagEnv{fs: fs, getenv: getenv, vars: map[string]string{}}
	f.string(&c.addr, "addr", "PETSTORE_ADDR", "127.0.0.1:8080", "listen address, `host:port` (:8080 for every interface)")
	f.string(&c.db, "db", "PETSTORE_DB", "petstore.db", "SQLite database `file`, created if missing")
	f.string(&c.apiKeysFile, "api-keys-file", "PETSTORE_API_KEYS_FILE", "", "`file` of API keys, one a line, plain or sha256:<hex>; SIGHUP re-reads it")
	f.string(&c.tlsCert, "tls-cert", "PETSTORE_TLS_CERT", "", "PEM certificate chain `file`; with -tls-key, serve HTTPS")
	f.string(&c.tlsKey, "tls-key", "PETSTORE_TLS_KEY", "", "PEM private key `file` for -tls-cert")
	f.duration(&c.readHeaderTimeout, "read-header-timeout", "PETSTORE_READ_HEADER_TIMEOUT", 5*time.Second, "time allowed to send the request headers")
	f.duration(&c.readTimeout, "read-timeout", "PETSTORE_READ_TIMEOUT", 10*time.Second, "time allowed to send the whole request (a create's body is at most 16 KiB)")
	f.duration(&c.writeTimeout, "write-timeout", "PETSTORE_WRITE_TIMEOUT", 30*time.Second, "time allowed from the end of the request headers to the end of the response")
	f.duration(&c.idleTimeout, "idle-timeout", "PETSTORE_IDLE_TIMEOUT", 120*time.Second, "how long an idle keep-alive connection is kept")
	f.int(&c.maxHeaderBytes, "max-header-bytes", "PETSTORE_MAX_HEADER_BYTES", 16<<10, "16384", "largest request header block, in bytes, an `int`")
	f.string(&c.logFormat, "log-format", "PETSTORE_LOG_FORMAT", "text", "log `format`: text or json")
	var level, origins string
	f.string(&level, "log-level", "PETSTORE_LOG_LEVEL", "info", "log `level`: debug, info (one line per request), warn or error")
	f.string(&origins, "cors-origins", "PETSTORE_CORS_ORIGINS", "", "browser `origins` allowed to call the API, comma-separated, exact (https://office.example.com)")
	f.int(&c.maxConns, "max-conns", "PETSTORE_MAX_CONNS", defaultMaxConns(), "", fmt.Sprintf(
		"most client connections served at once, an `int` (default: 2048, or the descriptor limit less room for the database if lower; here %d)", defaultMaxConns()))
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	c.variables = f.vars
	err := fs.Parse(args[1:])
	switch {
	case f.err != nil:
		return c, f.err // a flag or variable refused, with its message
	case errors.Is(err, flag.ErrHelp):
		// "petstore", not args[0]: under go run that is a path in the
		// build cache.
		fmt.Fprint(stdout, "Usage: petstore [flags]\n       petstore backup [-db FILE] BACKUP-FILE\n"+
			"       petstore backup [-db FILE] -dir DIR [-keep N]\n       petstore restore -from BACKUP [-db FILE]\n       petstore keygen\n\n"+
			"API keys come from PETSTORE_API_KEYS (comma-separated) and -api-keys-file.\n"+
			"Each flag can also be set by the environment variable named with it; a flag wins.\n\nFlags:\n")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return c, err
	case err != nil:
		return c, explainFlagError(fs, "petstore", flagHints, err)
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q (commands: backup, restore, keygen)", fs.Arg(0))
	}
	if _, port, err := net.SplitHostPort(c.addr); err != nil {
		hint := "such as 127.0.0.1:8080, or :8080 for every interface"
		if _, numErr := strconv.Atoi(c.addr); numErr == nil {
			hint = fmt.Sprintf("use :%s or 127.0.0.1:%s", c.addr, c.addr)
		}
		return c, fmt.Errorf("-addr (PETSTORE_ADDR) must be host:port, got %q: %s", c.addr, hint)
	} else if n, err := strconv.Atoi(port); err == nil && (n < 0 || n > 65535) {
		// A port is a number up to 65535 or a service name (http); net.Listen
		// would refuse anything else, but only after other start-up lines.
		return c, fmt.Errorf("-addr (PETSTORE_ADDR) has port %s, beyond 65535", port)
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
	// The names come from the process's environment, the values from
	// getenv: a test's getenv sees only its own variables.
	known := append(slices.Collect(maps.Values(f.vars)), "PETSTORE_API_KEYS")
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "PETSTORE_") && getenv(name) != "" && !slices.Contains(known, name) {
			c.unknownVariables = append(c.unknownVariables, name)
		}
	}
	slices.Sort(c.unknownVariables)
	return c, nil
}

// flagAliases are names people reach for, and the flag that does it.
var flagAliases = map[string]string{
	"port": "addr", "listen": "addr", "host": "addr", "bind": "addr", "address": "addr",
	"database": "db", "db-path": "db", "db-file": "db", "dbfile": "db", "file": "db",
	"keys-file": "api-keys-file", "key-file": "tls-key", "tls-key-file": "tls-key",
	"cert": "tls-cert", "tls": "tls-cert", "certificate": "tls-cert", "tls-certificate": "tls-cert", "cert-file": "tls-cert",
	"cors": "cors-origins", "origins": "cors-origins", "verbose": "log-level", "debug": "log-level",
	"max-connections": "max-conns", "connections": "max-conns", "conns": "max-conns",
	"v": "version",
}

// flagHints answer flags people reach for that have no one flag to name.
var flagHints = map[string]string{
	"key": keysHint, "keys": keysHint, "api-key": keysHint, "api-keys": keysHint,
	"timeout": "; the timeouts are -read-header-timeout, -read-timeout, -write-timeout and -idle-timeout",
}

const keysHint = "; API keys go in the environment variable PETSTORE_API_KEYS (comma-separated), or in a file named by -api-keys-file"

// explainFlagError turns the flag package's "flag provided but not
// defined" into a message that names the flag meant, or gives a hint, and
// points to command's -h; other errors are returned as they are.
func explainFlagError(fs *flag.FlagSet, command string, hints map[string]string, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !ok {
		return err
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	hint := hints[strings.ToLower(bareFlag(name))]
	if meant := meantFlag(name, names); hint == "" && meant != "" {
		hint = "; did you mean -" + meant + "?"
	}
	return fmt.Errorf("unknown flag -%s%s (%s -h lists them)", name, hint, command)
}

// meantVariable names the variable an unknown PETSTORE_ variable most
// likely meant ("; did you mean PETSTORE_ADDR?"), or "".
func meantVariable(name string, vars map[string]string) string {
	asFlag := strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, "PETSTORE_")), "_", "-")
	if strings.HasPrefix(asFlag, "api-key") && !strings.Contains(asFlag, "file") {
		return "; did you mean PETSTORE_API_KEYS?"
	}
	if f := meantFlag(asFlag, slices.Collect(maps.Keys(vars))); f != "" {
		return "; did you mean " + vars[f] + "?"
	}
	return ""
}

// bareFlag is a flag's name without its dashes and any =value.
func bareFlag(name string) string { return strings.TrimLeft(strings.SplitN(name, "=", 2)[0], "-") }

// meantFlag is the flag of flags an unknown name most likely meant: an
// alias, or the name fewest edits away (a swap of two letters is one; at
// most a third of its length, or 1); "" when none is near.
func meantFlag(name string, flags []string) string {
	name = bareFlag(name)
	if alias, ok := flagAliases[strings.ToLower(name)]; ok && slices.Contains(flags, alias) {
		return alias
	}
	slices.Sort(flags) // of two as near, the same one every time
	best, bestDistance := "", max(2, len(name)/3+1)
	for _, f := range flags {
		if d := editDistance(name, f); d < bestDistance {
			best, bestDistance = f, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, with two
// letters swapped counted as one edit.
func editDistance(a, b string) int {
	// Rows i-2, i-1 and i of the table.
	older, prev := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				cur[j] = min(cur[j], older[j-2]+1)
			}
		}
		older, prev = prev, cur
	}
	return prev[len(b)]
}
