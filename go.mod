module petstore

go 1.24

require (
	github.com/google/go-cmp v0.7.0
	github.com/mattn/go-sqlite3 v1.14.53
)
