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
	"os"
	"os/signal"
	"runtime/debug"
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
	svc, err := newService(cfg, getenv, log, logOut)
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
func newService(cfg config, getenv func(string) string, log *slog.Logger, stderr io.Writer) (*service, error) {
	s := &service{cfg: cfg, log: log, keySrc: keySource{list: getenv("PETSTORE_API_KEYS"), file: cfg.apiKeysFile}}
	digests, err := s.keySrc.load()
	if err != nil {
		return nil, err
	}
	if len(digests) == 0 {
		key, err := generateAPIKey()
		if err != nil {
			return nil, fmt.Errorf("generate API key: %w", err)
		}
		fmt.Fprintf(stderr, "WARNING: no API key configured (PETSTORE_API_KEYS); using this generated key, which changes on every start:\n\n    %s\n\n", key)
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
	s.ln = newLimitListener(tcpLn, cfg.maxConns, log)
	if s.store, err = openStore(cfg.db, log); err != nil {
		s.ln.Close()
		return nil, err
	}
	s.api = &server{store: s.store, keys: s.keys, log: log, corsOrigins: cfg.corsOrigins,
		createWithin: createDeadline(cfg.writeTimeout), guard: newAuthGuard(log)}
	s.srv = &http.Server{
		Handler:           s.ln.serving(newHandler(s.api)),
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: cfg.readHeaderTimeout,
		ReadTimeout:       cfg.readTimeout,
		WriteTimeout:      cfg.writeTimeout,
		IdleTimeout:       cfg.idleTimeout,
		MaxHeaderBytes:    cfg.maxHeaderBytes,
		ErrorLog:          newServerErrors(log),
		ConnState:         s.ln.connState,
		ConnContext:       connContext,
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
