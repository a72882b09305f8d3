// Configuration: the serving flags, each with an environment variable as
// its default, parsed and refused the same way from either source, and
// hints for the names people reach for.

package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

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
	version           bool
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
	define(f, p, name, env, def, def.String(), "a positive duration such as 5s or 1m30s", usage+", a `duration`", func(v string) (time.Duration, error) {
		d, err := time.ParseDuration(v)
		if err == nil && d <= 0 {
			err = errors.New("not positive")
		}
		return d, err
	})
}

func (f *flagEnv) int(p *int, name, env string, def int, defText, usage string) {
	define(f, p, name, env, def, defText, "a positive integer", usage, func(v string) (int, error) {
		n, err := strconv.Atoi(v)
		if err == nil && n <= 0 {
			err = errors.New("not positive")
		}
		return n, err
	})
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
		"most client connections open at once, an `int` (default: 4096, or the descriptor limit less room for the database if lower; here %d)", defaultMaxConns()))
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	c.variables = f.vars
	err := fs.Parse(args[1:])
	switch {
	case err != nil && f.err != nil:
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
	case f.err != nil:
		return c, f.err
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
