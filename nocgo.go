//go:build !cgo

// Built without cgo (CGO_ENABLED=0, or no C compiler found), petstore
// cannot run: SQLite is C. The binary says so and how to get a C
// compiler, before anything else, instead of failing at its first query.
// The rest stands in for sqlite.go so that the code still builds, and
// type-checks for other systems (CI vets GOOS=darwin and freebsd so).

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

func sqliteFault(error) (faultKind, bool) { return faultNone, false }

func constraintRefusal(error) error { return nil }

func inTransaction(any) bool { return false }
