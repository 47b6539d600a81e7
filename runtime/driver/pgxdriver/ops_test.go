package pgxdriver_test

import (
	"testing"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/templates"
)

// TestOps runs the monitor and janitor conformance suite on a pgx pool.
func TestOps(t *testing.T) {
	drivertest.RunOps(t, func(t *testing.T) drivertest.OpsEnv {
		pool := testdb.PgxPool(t)
		db := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { db.Close() })
		testdb.ApplySchema(t, db, "postgres", templates.DefaultTables)
		drv, err := pgxdriver.New(pool, driver.DefaultTables)
		if err != nil {
			t.Fatal(err)
		}
		return drivertest.OpsEnv{Driver: drv, DB: db}
	})
}
