// Command petstore serves a store's catalogue of animals over a small JSON
// HTTP API backed by one SQLite file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
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

// config is what the flags and environment say.
type config struct {
	addr string
	db   string
}

// parseFlags reads the command line; each flag's default comes from its
// environment variable, so systemd units and shells can use either.
func parseFlags(args []string, getenv func(string) string, stdout io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	// The FlagSet would print usage on every mistake; main prints the one
	// error line instead, and -h prints usage to stdout.
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.addr, "addr", envOr(getenv, "PETSTORE_ADDR", "127.0.0.1:8080"),
		"listen address, host:port (env PETSTORE_ADDR)")
	fs.StringVar(&c.db, "db", envOr(getenv, "PETSTORE_DB", "petstore.db"),
		"SQLite database file, created if missing (env PETSTORE_DB)")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprintf(stdout, "Usage: %s [flags]\n\nAPI keys come from PETSTORE_API_KEYS (comma-separated).\n\nFlags:\n", args[0])
			fs.PrintDefaults()
		}
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return c, nil
}

// envOr returns the environment variable key, or def when it is unset or
// empty.
func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}

// run is the whole program: it serves until ctx is cancelled, then shuts
// down cleanly. Every failure is returned, never printed and swallowed.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, getenv, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))

	digests, err := parseAPIKeys(getenv("PETSTORE_API_KEYS"))
	if err != nil {
		return fmt.Errorf("PETSTORE_API_KEYS: %w", err)
	}
	if len(digests) == 0 {
		key, err := generateAPIKey()
		if err != nil {
			return fmt.Errorf("generate API key: %w", err)
		}
		fmt.Fprintf(stderr, "WARNING: no API key configured (PETSTORE_API_KEYS); using this generated key, which changes on every start:\n\n    %s\n\n", key)
		digests, _ = parseAPIKeys(key)
	}

	// Listen before opening anything else, so a busy port fails at once.
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	defer ln.Close()

	store, err := openStore(cfg.db)
	if err != nil {
		return err
	}
	defer store.close()

	srv := &http.Server{
		Handler:           newHandler(store, newKeyRing(digests), log),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("listening", "addr", "http://"+ln.Addr().String(), "db", cfg.db)

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
