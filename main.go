// Command petstore serves a store's catalogue of animals over a small JSON
// HTTP API, and keeps it in one SQLite file.
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
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, errStorageFailed) {
		os.Exit(1) // serve logged it
	} else if err != nil {
		fmt.Fprintf(os.Stderr, "petstore: %v\n", err)
		os.Exit(1)
	}
}

// errStorageFailed is serve's error when the storage lost what it had.
var errStorageFailed = errors.New("stopped because the storage failed")

// needsCgo is what a binary built without cgo says.
const needsCgo = "petstore needs cgo and a C compiler: it keeps its pets in SQLite, which is C, and this binary was built with cgo off (CGO_ENABLED=0, or no C compiler was found). Install a C compiler and build again with CGO_ENABLED=1:\n  Debian, Ubuntu: apt-get install gcc\n  Alpine:         apk add gcc musl-dev\n  macOS:          xcode-select --install"

// restoreAdvice is what to do when the storage failed.
const restoreAdvice = "check the disk (dmesg) and start again: SQLite recovers what reached the -wal. If the file is damaged, put back a backup with petstore restore (docs/operations.md, When the storage fails)"

// run runs a command, or serves until ctx is done. It returns every
// failure.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var err error
	switch append(args, "")[1] {
	case "backup", "restore":
		err = runBackupCommand(ctx, args[1:], getenv, stdout)
	case "keygen":
		err = runKeygen(args[1:], stdout)
	default:
		var cfg config
		if cfg, err = parseFlags(args, getenv, stdout); err == nil {
			// A log reader that went away must not kill the process.
			signal.Ignore(syscall.SIGPIPE)
			err = serve(ctx, cfg, getenv, newLogger(stderr, cfg.logFormat, cfg.logLevel))
		}
	}
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	return err
}

// serve answers until ctx is done or the storage fails. A bad key or
// certificate fails first, and a busy port before the database opens.
func serve(ctx context.Context, cfg config, getenv func(string) string, log *slog.Logger) error {
	// SIGHUP is caught from the start, because by default it kills the
	// process, and systemd may send a reload at once.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	keys := &keyRing{list: getenv("PETSTORE_API_KEYS"), file: cfg.apiKeysFile}
	if keys.list != "" || keys.file != "" {
		if err := keys.reload(); err != nil {
			return err
		}
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
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.addr, err)
	}
	defer ln.Close()
	if cfg.tlsCert != "" {
		if err := loadCert(); err != nil {
			return err
		}
		// Each new handshake gets the certificate in force.
		ln = tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"},
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Load(), nil }})
	}
	st, err := openStore(cfg.db)
	switch {
	case errors.Is(err, errNotPetstore):
		return fmt.Errorf("%w; use another -db file (or, for petstore's own file damaged, petstore restore -last-id)", err)
	case isFatal(err):
		return fmt.Errorf("%w; %s", err, restoreAdvice)
	case err != nil:
		return err
	}
	defer st.close()
	if err := keys.useKeyFile(cfg.db, log); err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           newHandler(&server{store: st, keys: keys, log: log, createWithin: cfg.writeTimeout}, cfg.corsOrigins),
		ReadHeaderTimeout: cfg.readHeaderTimeout,
		ReadTimeout:       cfg.readTimeout,
		WriteTimeout:      cfg.writeTimeout,
		IdleTimeout:       cfg.idleTimeout,
		MaxHeaderBytes:    16 << 10,
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
		case <-st.failed:
			// A create whose commit met the failure may be in the -wal, so
			// it gets no answer.
			srv.Close()
			log.Error("storage failed: the service stops without writing more", "db", cfg.db, "err", st.failure, "next", restoreAdvice)
			return errStorageFailed
		case <-ctx.Done():
		case <-hup:
			// If the new keys or certificate do not load, the old stay.
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

// newLogger is the service's logger on w, in text or JSON.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// config is what the serving flags and their variables say.
type config struct {
	addr, db, apiKeysFile, tlsCert, tlsKey, logFormat         string
	readHeaderTimeout, readTimeout, writeTimeout, idleTimeout time.Duration
	logLevel                                                  slog.Level
	corsOrigins                                               []string
}

// parseFlags reads the serving flags.
func parseFlags(args []string, getenv func(string) string, stdout io.Writer) (config, error) {
	var c config
	var origins string
	fs := flag.NewFlagSet("petstore", flag.ContinueOnError)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "listen `address`, host:port (:8080 for every interface)")
	fs.StringVar(&c.db, "db", "petstore.db", "SQLite database `file`, created if missing")
	fs.StringVar(&c.apiKeysFile, "api-keys-file", "", "`file` of API keys, one per line, plain or sha256:<hex>; SIGHUP reads it again")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "PEM certificate chain `file`; with -tls-key, serve HTTPS")
	fs.StringVar(&c.tlsKey, "tls-key", "", "PEM private key `file` for -tls-cert")
	fs.DurationVar(&c.readHeaderTimeout, "read-header-timeout", 5*time.Second, "time to send the request headers")
	fs.DurationVar(&c.readTimeout, "read-timeout", 10*time.Second, "time to send the whole request")
	fs.DurationVar(&c.writeTimeout, "write-timeout", 30*time.Second, "time from the end of the request headers to the end of the answer")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", 2*time.Minute, "how long an idle keep-alive connection is kept")
	fs.StringVar(&c.logFormat, "log-format", "text", "log `format`: text or json")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "log `level`: debug, info (one line per request), warn or error")
	fs.StringVar(&origins, "cors-origins", "", "browser `origins` allowed to call the API, comma-separated, exact (https://office.example.com)")
	const usage = "petstore [flags]\n       petstore backup [-db FILE] BACKUP-FILE\n       petstore restore -from BACKUP [-db FILE] [-last-id N]\n       petstore keygen\n\nServes the API. Keys come from PETSTORE_API_KEYS (comma-separated) and -api-keys-file.\nWith neither, the key is in the file DB.key, which the first start writes."
	err := parseArgs(fs, args[1:], getenv, stdout, usage)
	switch {
	case err != nil:
		return c, err
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q (commands: backup, restore, keygen)", fs.Arg(0))
	case (c.tlsCert == "") != (c.tlsKey == ""):
		return c, errors.New("-tls-cert and -tls-key go together: give both or neither")
	case c.logFormat != "text" && c.logFormat != "json":
		return c, fmt.Errorf("-log-format (PETSTORE_LOG_FORMAT) must be text or json, got %q", c.logFormat)
	}
	for _, o := range strings.FieldsFunc(origins, func(r rune) bool { return r == ',' || r == ' ' }) {
		// An address copied from a browser ends in "/"; an Origin does not.
		c.corsOrigins = append(c.corsOrigins, strings.TrimSuffix(o, "/"))
	}
	return c, nil
}

// envName is the environment variable of a flag.
func envName(name string) string {
	return "PETSTORE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// parseArgs sets each flag of fs from its variable, then from args. -h
// prints usage to stdout. A duration must be positive.
func parseArgs(fs *flag.FlagSet, args []string, getenv func(string) string, stdout io.Writer, usage string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name == "from" || f.Name == "last-id" {
			return // a restore's own arguments, never a lingering variable
		}
		f.Usage += " (env " + envName(f.Name) + ")"
		if v := getenv(envName(f.Name)); v != "" && err == nil {
			if setErr := f.Value.Set(v); setErr != nil {
				err = fmt.Errorf("invalid value %q for %s (-%s): %v", v, envName(f.Name), f.Name, setErr)
			}
		}
	})
	if err != nil {
		return err
	}
	fs.SetOutput(io.Discard)
	if err = fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(stdout, "Usage: %s\n\nFlags:\n", usage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return err
	} else if err != nil {
		return fmt.Errorf("%w (-h lists the flags)", err)
	}
	fs.VisitAll(func(f *flag.Flag) {
		if d, ok := f.Value.(flag.Getter).Get().(time.Duration); ok && d <= 0 && err == nil {
			err = fmt.Errorf("-%s (%s) must be a positive duration such as 5s or 1m30s, got %s", f.Name, envName(f.Name), d)
		}
	})
	return err
}
