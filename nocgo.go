//go:build !cgo

// A build without cgo (CGO_ENABLED=0, or no C compiler found) cannot run,
// because SQLite is C. The binary says so, and how to get a C compiler.
// The rest stands in for sqlite.go, so that the code builds and
// type-checks for other systems.

package main

import (
	"fmt"
	"os"
)

func init() {
	fmt.Fprintln(os.Stderr, needsCgo)
	os.Exit(2)
}

const sqliteDriver = "sqlite3"

func sqliteFault(error) (faultKind, bool) { return "", false }

func isConstraint(error) bool { return false }
