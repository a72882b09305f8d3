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
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr, os.Environ()...); err != nil {
		fmt.Fprintf(os.Stderr, "petstore: %v\n", err)
		stop()
		os.Exit(1)
	}
}

// shutdownGrace bounds how long requests in flight may take to finish
// after SIGINT or SIGTERM.
const shutdownGrace = 10 * time.Second

// run is the whole program. With no subcommand it serves until ctx is
// cancelled; "backup", "restore" and "keygen" are one-shot commands. Every failure is
// returned, never printed and swallowed.
// environ is the whole environment, only to warn of PETSTORE_ variables
// that nothing reads (a typo, a name from another program); the values
// come from getenv.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, environ ...string) error {
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
	return serve(ctx, args, getenv, stdout, stderr, environ)
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
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer, environ []string) error {
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
	for _, v := range unknownVariables(environ) {
		msg := "environment variable not read by petstore: it has no effect"
		if v.meant != "" {
			msg += "; did you mean " + v.meant + "?"
		}
		log.Warn(msg, "name", v.name)
	}

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
	var cert *certificate // nil: plain HTTP
	if cfg.tlsCert != "" {
		// Loaded now, so a bad certificate fails the start, not the first
		// handshake.
		if cert, err = loadCertificate(cfg.tlsCert, cfg.tlsKey); err != nil {
			return err
		}
		tlsConfig = cert.tlsConfig()
	}

	// Listen before opening anything else, so a busy port fails at once.
	tcpLn, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	ln := newLimitListener(tcpLn, cfg.maxConns, cfg.maxConnsPerClient, tlsConfig == nil, log)
	defer ln.Close()

	store, err := openStore(cfg.db, storeOptions{log: log})
	if err != nil {
		return err
	}
	defer store.close()

	guard := newAuthGuard(log)
	go guard.watch(ctx)
	srv := &http.Server{
		Handler: newHandler(&server{store: store, keys: keys, log: log, corsOrigins: cfg.corsOrigins,
			createWithin: createDeadline(cfg.writeTimeout), limiter: newRateLimiter(cfg.rateLimit), guard: guard}),
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: cfg.readHeaderTimeout,
		ReadTimeout:       cfg.readTimeout,
		WriteTimeout:      cfg.writeTimeout,
		IdleTimeout:       cfg.idleTimeout,
		MaxHeaderBytes:    cfg.maxHeaderBytes,
		ErrorLog:          newServerErrors(log),
		ConnState:         ln.connState,
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go reloadOnHUP(ctx, hup, keySrc, keys, cert, log)

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

// reloadOnHUP re-reads the keys, and the TLS certificate when there is
// one, on every SIGHUP, so a key is added or revoked and a renewed
// certificate served without a restart. A file that does not parse changes
// nothing: what was in force stays.
func reloadOnHUP(ctx context.Context, hup <-chan os.Signal, src keySource, keys *keyRing, cert *certificate, log *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		if cert != nil {
			if err := cert.reload(); err != nil {
				log.Error("SIGHUP: TLS certificate not reloaded; the previous one stays in force", "err", err)
			} else {
				log.Info("SIGHUP: TLS certificate reloaded", "cert", cert.certFile)
			}
		}
		reloadKeys(src, keys, log, cert != nil)
	}
}

// reloadKeys is SIGHUP's reload of the keys.
func reloadKeys(src keySource, keys *keyRing, log *slog.Logger, certToo bool) {
	if src.file == "" {
		if !certToo {
			log.Warn("SIGHUP: no API keys file configured (-api-keys-file); nothing to reload")
		}
		return
	}
	digests, err := src.load()
	if err == nil && len(digests) == 0 {
		// As at start: a file with no key (all comments, or emptied by
		// a > typed for >>) would lock every client out.
		err = fmt.Errorf("API keys file %s holds no key", src.file)
	}
	if err != nil {
		log.Error("SIGHUP: API keys not reloaded; the previous keys stay in force", "err", err)
		return
	}
	keys.set(digests)
	log.Info("SIGHUP: API keys reloaded", "keys", len(digests))
}
