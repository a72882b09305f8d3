// Command petstore serves a store's catalogue of animals over a small JSON
// HTTP API backed by one SQLite file.
package main

import (
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
	"runtime/debug"
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
	f.fs.DurationVar(p, name, envDefault(f, env, def, "a positive duration such as 5s", func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err == nil && d <= 0 {
			err = errors.New("not positive")
		}
		return d, err
	}), usage+" (env "+env+")")
}

func (f *flagEnv) int(p *int, name, env string, def int, usage string) {
	f.fs.IntVar(p, name, envDefault(f, env, def, "a positive integer", func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err == nil && n <= 0 {
			err = errors.New("not positive")
		}
		return n, err
	}), usage+" (env "+env+")")
}

// envDefault is the default of a flag: the environment variable env parsed,
// or def when it is unset; a variable that does not parse is remembered
// as an error, described as what it should be.
func envDefault[T any](f *flagEnv, env string, def T, want string, parse func(string) (T, error)) T {
	v := f.getenv(env)
	if v == "" {
		return def
	}
	parsed, err := parse(v)
	if err != nil {
		f.err = errors.Join(f.err, fmt.Errorf("%s: %q is not %s", env, v, want))
		return def
	}
	return parsed
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
	fs := newFlagSet(args[0])
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
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprintf(stdout, "Usage: %s [flags]\n       %s backup [-db FILE] BACKUP-FILE\n       %s keygen\n\n"+
				"API keys come from PETSTORE_API_KEYS (comma-separated) and -api-keys-file.\n\nFlags:\n", args[0], args[0], args[0])
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
		return c, fmt.Errorf("-log-format must be text or json, got %q", c.logFormat)
	}
	if err := c.logLevel.UnmarshalText([]byte(level)); err != nil {
		return c, fmt.Errorf("-log-level must be debug, info, warn or error, got %q", level)
	}
	for _, o := range strings.Split(origins, ",") {
		if o = strings.TrimSpace(o); o == "" {
			continue
		}
		if u, err := url.Parse(o); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" {
			return c, fmt.Errorf("-cors-origins: %q is not an origin such as https://office.example.com", o)
		}
		c.corsOrigins = append(c.corsOrigins, o)
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
	log := newLogger(stderr, cfg.logFormat, cfg.logLevel)

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
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	defer ln.Close()

	store, err := openStore(cfg.db, storeOptions{log: log})
	if err != nil {
		return err
	}
	defer store.close()

	srv := &http.Server{
		Handler:           newHandler(&server{store: store, keys: keys, log: log, corsOrigins: cfg.corsOrigins}),
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
		if err != nil {
			log.Error("SIGHUP: API keys not reloaded; the previous keys stay in force", "err", err)
			continue
		}
		keys.set(digests)
		if len(digests) == 0 {
			log.Warn("SIGHUP: API keys reloaded: no key left, every request will be refused")
			continue
		}
		log.Info("SIGHUP: API keys reloaded", "keys", len(digests))
	}
}

// runBackup is "petstore backup [-db FILE] BACKUP-FILE".
func runBackup(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	fs := newFlagSet("petstore backup")
	var db string
	(&flagEnv{fs: fs, getenv: getenv}).string(&db, "db", "PETSTORE_DB", "petstore.db", "SQLite database file to back up")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "Usage: petstore backup [-db FILE] BACKUP-FILE\n\nWrites a consistent copy of the database, also while the service runs.")
			return nil
		}
		return fmt.Errorf("backup: %w", err)
	}
	if fs.NArg() != 1 {
		return errors.New("backup: name one backup file: petstore backup [-db FILE] BACKUP-FILE")
	}
	dst := fs.Arg(0)
	pets, err := backupDatabase(ctx, db, dst)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	fmt.Fprintf(stdout, "backed up %s to %s: %d pets, integrity ok\n", db, dst, pets)
	return nil
}

// runKeygen is "petstore keygen": a new key for the client, and the line
// that lets the service accept it without keeping it in plain text.
func runKeygen(args []string, stdout io.Writer) error {
	if len(args) > 1 {
		return fmt.Errorf("keygen takes no arguments, got %q", args[1])
	}
	key, err := generateAPIKey()
	if err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	fmt.Fprintf(stdout, "key: %s\nkeys-file line: %s\n", key, keysFileLine(key))
	return nil
}
