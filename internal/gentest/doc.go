// Package gentest holds code generated from the specs in this folder and the
// tests that run it against real databases: the generated writers insert
// inside a transaction on PostgreSQL, MariaDB and SQLite (database/sql) and
// PostgreSQL (pgx/v5), roll back with it, and cost no more than a
// hand-written INSERT of the same row.
package gentest
