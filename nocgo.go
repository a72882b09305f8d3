//go:build !cgo

// A build without cgo cannot run, because SQLite is C: it says so. The
// rest stands in for sqlite.go, so that the code type-checks.

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
