// Command petstore serves a store's catalogue of animals over a small JSON
// HTTP API kept in one SQLite file.
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
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "petstore: %v\n", err)
		os.Exit(1)
	}
}

// needsCgo is what a binary built without cgo says (nocgo.go).
const needsCgo = `petstore needs cgo and a C compiler: it keeps its pets in SQLite, which is C, and this binary was built with cgo off (CGO_ENABLED=0, or no C compiler was found). Install a C compiler and build again with CGO_ENABLED=1:
  Debian, Ubuntu: apt-get install gcc
  Alpine:         apk add gcc musl-dev
  macOS:          xcode-select --install`

// run is the whole program: with no command it serves until ctx is done;
// backup, restore and keygen are commands that run once. Every failure
// is returned.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var err error
	switch append(args, "")[1] {
	case "backup", "restore":
		err = runBackupCommand(ctx, args[1:], getenv, stdout)
	case "keygen":
		err = runKeygen(args[1:], stdout)
	default:
		var cfg config
		if cfg, err = parseFlags(args, getenv, stdout); err == nil && cfg.version {
			fmt.Fprintln(stdout, versionLine())
		} else if err == nil {
			// A log reader gone makes writes fail with EPIPE; that must
			// not kill the process, as SIGPIPE on stderr does by default.
			signal.Ignore(syscall.SIGPIPE)
			out := newLogWriter(stderr, cfg.logFormat)
			defer out.close(time.Second)
			err = serve(ctx, cfg, getenv, newLogger(out, cfg.logFormat, cfg.logLevel))
		}
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// serve loads the keys and the certificate, listens, opens the store and
// answers until ctx is done, in an order that makes the common mistakes
// fail at once: a bad key or certificate first, a busy port before the
// database is opened. SIGHUP reloads the keys and the certificate.
func serve(ctx context.Context, cfg config, getenv func(string) string, log *slog.Logger) error {
	// SIGHUP is taken from the start: untaken, it kills the process, and
	// systemd may send a reload as soon as it has started it.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	keys, err := newKeyRing(getenv("PETSTORE_API_KEYS"), cfg.apiKeysFile)
	if err != nil {
		return err
	}
	var cert atomic.Pointer[tls.Certificate]
	loadCert := func() error {
		c, err := tls.LoadX509KeyPair(cfg.tlsCert, cfg.tlsKey)
		if err != nil {
			return fmt.Errorf("TLS certificate: %w", err)
		}
		cert.Store(&c)
		return nil
	}
	if cfg.tlsCert != "" {
		if err := loadCert(); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	if cfg.tlsCert != "" {
		// Each new handshake gets the certificate in force.
		ln = tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"},
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Load(), nil }})
	}
	defer ln.Close()
	st, err := openStore(cfg.db, log)
	if errors.Is(err, errNotPetstore) {
		return fmt.Errorf("%w; use another -db file", err)
	} else if err != nil {
		return err
	}
	defer st.close()
	if err := keys.useKeyFile(cfg.db, log); err != nil {
		return err
	}
	// net/http's own limits are the front door; floods beyond them are a
	// proxy's to turn away (docs/operations.md). A create may wait for its
	// commit the write timeout less a margin (a quarter, from 0.25 to 2 s,
	// at most half), so that one not stored is answered 503 in time.
	createWithin := cfg.writeTimeout - min(2*time.Second, max(250*time.Millisecond, cfg.writeTimeout/4), cfg.writeTimeout/2)
	srv := &http.Server{
		Handler:           newHandler(&server{store: st, keys: keys, log: log, createWithin: createWithin}, cfg.corsOrigins),
		ReadHeaderTimeout: cfg.readHeaderTimeout,
		ReadTimeout:       cfg.readTimeout,
		WriteTimeout:      cfg.writeTimeout,
		IdleTimeout:       cfg.idleTimeout,
		MaxHeaderBytes:    16 << 10, // a request's headers, the key's among them, are well under 1 KiB
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: 100},
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String(), "tls", cfg.tlsCert != "", "db", cfg.db)
	for ctx.Err() == nil {
		select {
		case err := <-serveErr:
			return fmt.Errorf("serve: %w", err)
		case <-ctx.Done():
		case <-hup:
			// What does not load changes nothing: what is in force stays.
			if err := keys.reload(); err != nil {
				log.Error("SIGHUP: API keys not reloaded; the previous keys stay in force", "err", err)
			} else {
				log.Info("SIGHUP: API keys reloaded", "keys", len(*keys.digests.Load()))
			}
			if cfg.tlsCert == "" {
				continue
			} else if err := loadCert(); err != nil {
				log.Error("SIGHUP: TLS certificate not reloaded; the previous one stays in force", "err", err)
			} else {
				log.Info("SIGHUP: TLS certificate reloaded", "cert", cfg.tlsCert)
			}
		}
	}
	log.Info("shutting down", "grace", "10s")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		log.Warn("requests still in flight after the grace period were cut off", "err", err)
		srv.Close()
	}
	if err := st.close(); err != nil {
		return fmt.Errorf("close database: %w", err)
	}
	log.Info("stopped")
	return nil
}

// versionLine is the build's version and revision, as Go recorded them.
func versionLine() string {
	bi, _ := debug.ReadBuildInfo() // a module build has it
	revision := "unknown"
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			revision = s.Value
		}
	}
	return "petstore " + bi.Main.Version + " (revision " + revision + ")"
}

// config is what the serving flags and environment say.
type config struct {
	addr, db, apiKeysFile, tlsCert, tlsKey, logFormat         string
	readHeaderTimeout, readTimeout, writeTimeout, idleTimeout time.Duration
	logLevel                                                  slog.Level
	corsOrigins                                               []string
	version                                                   bool
}

// parseFlags reads the serving flags. A value is refused the same way
// from the flag or its variable, and the message names both.
func parseFlags(args []string, getenv func(string) string, stdout io.Writer) (config, error) {
	var c config
	fs := newFlagSet()
	var durations [4]string
	var level, origins string
	for _, f := range []struct {
		p                *string
		name, def, usage string
	}{
		{&c.addr, "addr", "127.0.0.1:8080", "listen address, `host:port` (:8080 for every interface)"},
		{&c.db, "db", "petstore.db", "SQLite database `file`, created if missing"},
		{&c.apiKeysFile, "api-keys-file", "", "`file` of API keys, one a line, plain or sha256:<hex>; SIGHUP re-reads it"},
		{&c.tlsCert, "tls-cert", "", "PEM certificate chain `file`; with -tls-key, serve HTTPS"},
		{&c.tlsKey, "tls-key", "", "PEM private key `file` for -tls-cert"},
		{&durations[0], "read-header-timeout", "5s", "time allowed to send the request headers, a `duration`"},
		{&durations[1], "read-timeout", "10s", "time allowed to send the whole request, a `duration`"},
		{&durations[2], "write-timeout", "30s", "time allowed from the end of the request headers to the end of the answer, a `duration`"},
		{&durations[3], "idle-timeout", "2m0s", "how long an idle keep-alive connection is kept, a `duration`"},
		{&c.logFormat, "log-format", "text", "log `format`: text or json"},
		{&level, "log-level", "info", "log `level`: debug, info (one line per request), warn or error"},
		{&origins, "cors-origins", "", "browser `origins` allowed to call the API, comma-separated, exact (https://office.example.com)"},
	} {
		envFlag(fs, getenv, f.p, f.name, f.def, f.usage)
	}
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	const usage = "petstore [flags]\n       petstore backup [-db FILE] BACKUP-FILE\n       petstore restore -from BACKUP [-db FILE]\n       petstore keygen\n\n" +
		"Serves the API. Keys come from PETSTORE_API_KEYS (comma-separated) and -api-keys-file;\nwith neither, from the file DB.key, which the first start writes."
	if err := parseArgs(fs, args[1:], stdout, usage); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (commands: backup, restore, keygen)", fs.Arg(0))
	}
	for i, d := range []*time.Duration{&c.readHeaderTimeout, &c.readTimeout, &c.writeTimeout, &c.idleTimeout} {
		name := [...]string{"read-header-timeout", "read-timeout", "write-timeout", "idle-timeout"}[i]
		v, err := time.ParseDuration(durations[i])
		if err != nil || v <= 0 {
			return c, fmt.Errorf("-%s (%s) must be a positive duration such as 5s or 1m30s, got %q", name, envName(name), durations[i])
		}
		*d = v
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
	for _, o := range strings.FieldsFunc(origins, func(r rune) bool { return r == ',' || r == ' ' }) {
		// An address copied from a browser's bar ends in "/"; an Origin
		// never does.
		c.corsOrigins = append(c.corsOrigins, strings.TrimSuffix(o, "/"))
	}
	return c, nil
}

// Flags, shared by the commands: each flag's default can come from its
// environment variable, PETSTORE_ and the name in capitals; a flag wins.

// newFlagSet returns a FlagSet that prints nothing itself: run returns
// its error, and parseArgs prints -h's usage.
func newFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("petstore", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// envName is the environment variable of the flag name.
func envName(name string) string {
	return "PETSTORE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// envFlag defines the string flag name into p, its default from its
// variable.
func envFlag(fs *flag.FlagSet, getenv func(string) string, p *string, name, def, usage string) {
	fs.StringVar(p, name, cmp.Or(getenv(envName(name)), def), usage+" (env "+envName(name)+")")
}

// parseArgs parses args into fs: -h prints usage and the flags to
// stdout, and an error points to -h.
func parseArgs(fs *flag.FlagSet, args []string, stdout io.Writer, usage string) error {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(stdout, "Usage: %s\n\nFlags:\n", usage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
	} else if err != nil {
		return fmt.Errorf("%w (-h lists the flags)", err)
	}
	return err
}
