package pgxdriver_test

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/templates"
)

// openPgx returns a pgx driver on a fresh database with the schema
// applied, its pool, and a database/sql handle on the same database.
func openPgx(t *testing.T) (*pgxdriver.Driver, *pgxpool.Pool, *sql.DB) {
	t.Helper()
	pool := testdb.PgxPool(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	testdb.ApplySchema(t, db, "postgres", templates.DefaultTables)
	drv, err := pgxdriver.New(pool, testdb.Schema(dialect.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	return drv, pool, db
}

// TestConformance runs the driver conformance suite on a pgx pool.
func TestConformance(t *testing.T) {
	drivertest.Run(t, func(t *testing.T) drivertest.Env {
		drv, _, db := openPgx(t)
		return drivertest.Env{Driver: drv, DB: db}
	})
}
