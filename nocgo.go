//go:build !cgo

// Without cgo there is no SQLite, so the binary prints needsCgo and
// exits. The rest stands in for sqlite.go.

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
