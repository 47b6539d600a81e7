package sqldriver_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/templates"
)

// TestConformance runs the driver conformance suite on every dialect.
func TestConformance(t *testing.T) {
	for _, name := range testdb.Dialects() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, err := dialect.Parse(name)
			if err != nil {
				t.Fatal(err)
			}
			drivertest.Run(t, func(t *testing.T) drivertest.Env {
				db := testdb.Open(t, name)
				testdb.ApplySchema(t, db, name, templates.DefaultTables)
				drv, err := sqldriver.New(db, testdb.Schema(d))
				if err != nil {
					t.Fatal(err)
				}
				return drivertest.Env{Driver: drv, DB: db}
			})
		})
	}
}

// On MySQL/MariaDB, a driver whose sessions are not in UTC refuses to
// claim, saying how to fix the DSN; with time_zone '+00:00' it claims.
func TestMySQLTimeZone(t *testing.T) {
	dsn := testdb.DSN(t, "mysql")
	for _, tc := range []struct {
		zone string
		ok   bool
	}{{"'+02:00'", false}, {"'+00:00'", true}} {
		t.Run(tc.zone, func(t *testing.T) {
			cfg, err := mysql.ParseDSN(dsn)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Params = map[string]string{"time_zone": tc.zone}
			db, err := sql.Open("mysql", cfg.FormatDSN())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			if tc.ok {
				testdb.ApplySchema(t, db, "mysql", templates.DefaultTables)
			}
			drv, err := sqldriver.New(db, testdb.Schema(dialect.MySQL))
			if err != nil {
				t.Fatal(err)
			}
			p := driver.ClaimParams{Owner: "tz", Lease: time.Minute, Limit: 10}
			for range 2 { // the verdict is not cached when it fails
				_, err = drv.Claim(context.Background(), p)
				if tc.ok != (err == nil) {
					t.Fatalf("Claim in time zone %s: %v", tc.zone, err)
				}
				if !tc.ok && (!strings.Contains(err.Error(), "time_zone=%27%2B00%3A00%27") || !strings.Contains(err.Error(), "+02:00")) {
					t.Fatalf("error does not tell the fix: %v", err)
				}
			}
		})
	}
}
