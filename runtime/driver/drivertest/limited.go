package drivertest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxgen/outboxgen/runtime/dialect"
)

// LimitedUser creates a database user (a PostgreSQL role, a MariaDB/MySQL
// account) on the server of admin, a connection to the database at dsn
// (a PostgreSQL URL or a go-sql-driver/mysql DSN) with the right to
// create users, runs grants on admin (each with every "{user}" replaced
// by the user: "GRANT SELECT ON t TO {user}"), and returns a DSN for the
// same database as that user. The user is dropped when the test ends.
// SQLite has no users: it fails the test.
func LimitedUser(t testing.TB, d dialect.Dialect, admin *sql.DB, dsn string, grants ...string) string {
	t.Helper()
	ctx := context.Background()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	user, password := "og_limited_"+hex.EncodeToString(b), "pw_"+hex.EncodeToString(b)
	var account, out string
	switch d {
	case dialect.Postgres:
		account = user
		opsExec(t, admin, "CREATE ROLE "+user+" LOGIN PASSWORD '"+password+"'")
		t.Cleanup(func() {
			_, _ = admin.ExecContext(ctx, "DROP OWNED BY "+user)
			_, _ = admin.ExecContext(ctx, "DROP ROLE "+user)
		})
		var db string
		if err := admin.QueryRow("SELECT current_database()").Scan(&db); err != nil {
			t.Fatal(err)
		}
		opsExec(t, admin, "GRANT USAGE ON SCHEMA public TO "+user)
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.User, u.Path = url.UserPassword(user, password), "/"+db
		out = u.String()
	case dialect.MySQL:
		var host string
		if err := admin.QueryRow("SELECT SUBSTRING_INDEX(CURRENT_USER(), '@', -1)").Scan(&host); err != nil {
			t.Fatal(err)
		}
		account = "'" + user + "'@'" + host + "'"
		opsExec(t, admin, "CREATE USER "+account+" IDENTIFIED BY '"+password+"'")
		t.Cleanup(func() { _, _ = admin.ExecContext(ctx, "DROP USER "+account) })
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.User, cfg.Passwd = user, password
		out = cfg.FormatDSN()
	default:
		t.Fatalf("drivertest: LimitedUser: %s has no database users", d)
	}
	for _, g := range grants {
		opsExec(t, admin, strings.ReplaceAll(g, "{user}", account))
	}
	return out
}
