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
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.As(err, new(loggedError)) {
			fmt.Fprintf(os.Stderr, "petstore: %v\n", err)
		}
		stop()
		os.Exit(1)
	}
}

// needsCgo is all that a binary built without cgo prints (nocgo.go):
// SQLite is C, so petstore needs a C compiler to build.
const needsCgo = `petstore needs cgo and a C compiler: it keeps its pets in SQLite, which is C, and this binary was built with cgo off (CGO_ENABLED=0, or no C compiler was found). Install a C compiler and build again with CGO_ENABLED=1:
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
	if err != nil && cfg.logFormat == "json" {
		// Every line is JSON, a refused flag's too, once the format is known.
		newLogger(stderr, "json", slog.LevelInfo).Error("petstore could not start", "err", err.Error())
		return loggedError{err}
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
		log.Warn("environment variable not read by petstore: it has no effect", "name", name)
	}
	var terminal io.Writer // nil: the log is not read by a person at a terminal
	if f, ok := stderr.(*os.File); ok && isTerminal(f) {
		terminal = logOut // in line with the log's own lines
	}
	svc, err := newService(cfg, getenv, log, terminal)
	if err == nil {
		err = svc.serve(ctx)
	}
	if err != nil && cfg.logFormat == "json" {
		// Every line is JSON: the error is logged here, not printed.
		log.Error("petstore stopped on an error", "err", err.Error())
		return loggedError{err}
	}
	return err
}

// runBackup is "petstore backup [-db FILE] BACKUP-FILE", or, for
// scheduled snapshots, "petstore backup [-db FILE] -dir DIR [-keep N]".
func runBackup(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	const usage = "petstore backup [-db FILE] BACKUP-FILE | petstore backup [-db FILE] -dir DIR [-keep N]"
	fs := newFlagSet("petstore backup")
	var dir string
	var keep int
	db := envFlag(fs, getenv, "db", "petstore.db", "SQLite database `file` to back up")
	fs.StringVar(&dir, "dir", "", "write a timestamped snapshot into this `directory` instead of BACKUP-FILE")
	fs.IntVar(&keep, "keep", 14, "with -dir: how many snapshots to keep (a `count`), the newest; older ones this command wrote are deleted")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: %s\n\nWrites a consistent copy of the database, also while the service runs.\n\nFlags:\n", usage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil
		}
		return fmt.Errorf("backup: %w", explainFlagError("petstore backup", err))
	}
	files := fs.Args()
	dst := ""
	switch {
	case len(files) > 1 && slices.ContainsFunc(files[1:], func(arg string) bool { return strings.HasPrefix(arg, "-") }):
		return errors.New("backup: flags go before the backup file: " + usage)
	case dir == "" && len(files) != 1:
		return fmt.Errorf("backup: name one backup file, or -dir (got %d names): %s", len(files), usage)
	case dir == "":
		dst = files[0]
	case len(files) != 0:
		return errors.New("backup: with -dir, name no backup file: " + usage)
	case keep < 1:
		return fmt.Errorf("backup: -keep must be at least 1, got %d", keep)
	default:
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		// Named by its UTC time, so that names sort in time order.
		dst = filepath.Join(dir, "petstore-"+time.Now().UTC().Format("20060102T150405Z")+".db")
	}
	pets, err := backupDatabase(ctx, *db, dst)
	if errors.Is(err, errNotPetstore) {
		return fmt.Errorf("backup: %w; use another -db file", err)
	}
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	fmt.Fprintf(stdout, "backed up %s to %s: %d pets, integrity ok\n", *db, dst, pets)
	if dir == "" {
		return nil
	}
	removed, ahead, err := pruneSnapshots(dir, keep, filepath.Base(dst))
	for _, name := range removed {
		fmt.Fprintf(stdout, "deleted the older snapshot %s\n", filepath.Join(dir, name))
	}
	for _, name := range ahead {
		fmt.Fprintf(stdout, "kept %s, named after this one (by a clock that ran ahead?): it neither counts nor is deleted; delete it by hand if it is stale\n", filepath.Join(dir, name))
	}
	if err != nil {
		return fmt.Errorf("backup: the snapshot was written, but older ones were not all deleted: %w", err)
	}
	return nil
}

// runRestore is "petstore restore -from BACKUP [-db FILE]".
func runRestore(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	const usage = "petstore restore -from BACKUP [-db FILE]"
	fs := newFlagSet("petstore restore")
	var from string
	db := envFlag(fs, getenv, "db", "petstore.db", "SQLite database `file` to replace")
	fs.StringVar(&from, "from", "", "the backup `file` to put back, as petstore backup wrote it")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: %s\n\nReplaces the database with a checked backup, while no service holds it.\n\nFlags:\n", usage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil
		}
		return fmt.Errorf("restore: %w", explainFlagError("petstore restore", err))
	}
	if from == "" || fs.NArg() != 0 {
		return errors.New("restore: name the backup with -from, and nothing else: " + usage)
	}
	pets, err := restoreDatabase(ctx, from, *db)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	fmt.Fprintf(stdout, "restored %s to %s: %d pets, integrity ok\n", from, *db, pets)
	return nil
}

// loggedError is an error run has already written to the log.
type loggedError struct{ error }

// isTerminal reports whether f is a terminal: a person reads it, and no
// log keeps it (a character device need not be one: /dev/null, the
// kernel's log). Only a terminal has a window size.
func isTerminal(f *os.File) bool {
	raw, err := f.SyscallConn() // not f.Fd(), which makes the file blocking
	if err != nil {
		return false
	}
	var errno syscall.Errno = syscall.ENOTTY
	raw.Control(func(fd uintptr) {
		var size [4]uint16
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&size)))
	})
	return errno == 0
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
		switch {
		case terminal != nil && cfg.logFormat == "json":
			log.Warn("no API key configured (PETSTORE_API_KEYS); using the generated key, which changes on every start", "generated_key", key)
		case terminal != nil:
			fmt.Fprintf(terminal, "WARNING: no API key configured (PETSTORE_API_KEYS); using this generated key, which changes on every start:\n\n    %s\n\n", key)
		default:
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
		if errors.Is(err, errNotPetstore) {
			err = fmt.Errorf("%w; use another -db file", err)
		}
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
	// Requests are answered from here on; the line that says where waits
	// for the store's start-up (/healthz answers 503 "starting" until
	// then), so a script or a test that waits for it finds the service
	// ready. A stop meanwhile waits for the start-up to end.
	select {
	case <-s.store.ready:
		s.log.Info("listening", "addr", s.url(), "db", s.cfg.db)
	case <-ctx.Done():
	}
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

// Configuration: the serving flags, each with an environment variable
// as its default, PETSTORE_ and the flag's name in capitals, so systemd
// units and shells can use either; a flag wins. A value is refused the
// same way from either source, naming both.

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
	// unknownVariables are the PETSTORE_ variables set that no flag reads.
	unknownVariables []string
}

// envName is the environment variable of the flag name.
func envName(flag string) string {
	return "PETSTORE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// newFlagSet returns a FlagSet that does not print: main prints the one
// error line instead, and -h prints usage to stdout.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// envFlag defines the string flag name, its default taken from its
// environment variable when that is set.
func envFlag(fs *flag.FlagSet, getenv func(string) string, name, def, usage string) *string {
	return fs.String(name, cmp.Or(getenv(envName(name)), def), usage+" (env "+envName(name)+")")
}

// explainFlagError turns the flag package's "flag provided but not
// defined" into a message that points to command's -h; other errors are
// returned as they are.
func explainFlagError(command string, err error) error {
	if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
		return fmt.Errorf("unknown flag -%s (%s -h lists them)", name, command)
	}
	return err
}

// parseFlags reads the serving command line.
func parseFlags(args []string, getenv func(string) string, stdout io.Writer) (config, error) {
	var c config
	fs := newFlagSet("petstore")
	str := func(name, def, usage string) *string { return envFlag(fs, getenv, name, def, usage) }
	addr := str("addr", "127.0.0.1:8080", "listen address, `host:port` (:8080 for every interface)")
	db := str("db", "petstore.db", "SQLite database `file`, created if missing")
	keysFile := str("api-keys-file", "", "`file` of API keys, one a line, plain or sha256:<hex>; SIGHUP re-reads it")
	tlsCert := str("tls-cert", "", "PEM certificate chain `file`; with -tls-key, serve HTTPS")
	tlsKey := str("tls-key", "", "PEM private key `file` for -tls-cert")
	durations := []struct {
		p               *time.Duration
		name, def, what string
	}{
		{&c.readHeaderTimeout, "read-header-timeout", "5s", "time allowed to send the request headers"},
		{&c.readTimeout, "read-timeout", "10s", "time allowed to send the whole request (a create's body is at most 16 KiB)"},
		{&c.writeTimeout, "write-timeout", "30s", "time allowed from the end of the request headers to the end of the response"},
		{&c.idleTimeout, "idle-timeout", "2m0s", "how long an idle keep-alive connection is kept"},
	}
	durationText := make([]*string, len(durations))
	for i, d := range durations {
		durationText[i] = str(d.name, d.def, d.what+", a `duration`")
	}
	maxHeaderBytes := str("max-header-bytes", "16384", "largest request header block, in bytes, an `int`")
	logFormat := str("log-format", "text", "log `format`: text or json")
	level := str("log-level", "info", "log `level`: debug, info (one line per request), warn or error")
	origins := str("cors-origins", "", "browser `origins` allowed to call the API, comma-separated, exact (https://office.example.com)")
	maxConns := str("max-conns", strconv.Itoa(defaultMaxConns()),
		"most client connections served at once, an `int` (default: 2048, or half the descriptor limit less room for the database if lower)")
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	err := fs.Parse(args[1:])
	switch {
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
		c.logFormat = *logFormat // as far as it was read: the error's format
		return c, explainFlagError("petstore", err)
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q (commands: backup, restore, keygen)", fs.Arg(0))
	}
	c.addr, c.db, c.apiKeysFile, c.tlsCert, c.tlsKey, c.logFormat = *addr, *db, *keysFile, *tlsCert, *tlsKey, *logFormat
	// Every refused number is named, with its flag and variable.
	var refused error
	for i, d := range durations {
		v, err := time.ParseDuration(*durationText[i])
		if err != nil || v <= 0 {
			refused = errors.Join(refused, fmt.Errorf("-%s (%s) must be a positive duration such as 5s or 1m30s, got %q", d.name, envName(d.name), *durationText[i]))
		}
		*d.p = v
	}
	for _, n := range []struct {
		p     *int
		name  string
		value string
	}{{&c.maxHeaderBytes, "max-header-bytes", *maxHeaderBytes}, {&c.maxConns, "max-conns", *maxConns}} {
		v, err := strconv.Atoi(n.value)
		if err != nil || v <= 0 {
			refused = errors.Join(refused, fmt.Errorf("-%s (%s) must be a positive integer, got %q", n.name, envName(n.name), n.value))
		}
		*n.p = v
	}
	if refused != nil {
		return c, refused
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
	if err := c.logLevel.UnmarshalText([]byte(*level)); err != nil {
		return c, fmt.Errorf("-log-level (PETSTORE_LOG_LEVEL) must be debug, info, warn or error, got %q", *level)
	}
	for _, o := range strings.Split(*origins, ",") {
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
	known := []string{"PETSTORE_API_KEYS"}
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "version" {
			known = append(known, envName(f.Name))
		}
	})
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "PETSTORE_") && getenv(name) != "" && !slices.Contains(known, name) {
			c.unknownVariables = append(c.unknownVariables, name)
		}
	}
	slices.Sort(c.unknownVariables)
	return c, nil
}
