package sqldriver_test

import (
	"testing"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/templates"
)

// TestOps runs the monitor and janitor conformance suite on every dialect.
func TestOps(t *testing.T) {
	for _, name := range testdb.Dialects() {
		t.Run(name, func(t *testing.T) {
			d, err := dialect.Parse(name)
			if err != nil {
				t.Fatal(err)
			}
			drivertest.RunOps(t, func(t *testing.T) drivertest.OpsEnv {
				db := testdb.Open(t, name)
				testdb.ApplySchema(t, db, name, templates.DefaultTables)
				drv, err := sqldriver.New(db, d, driver.DefaultTables)
				if err != nil {
					t.Fatal(err)
				}
				return drivertest.OpsEnv{Driver: drv, DB: db}
			})
		})
	}
}
