package dsn_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/dsn"
)

const secret = "s3cret"

func TestParseAccepted(t *testing.T) {
	for _, tc := range []struct {
		in, driverName string
		d              dialect.Dialect
		driver         string
		path           string
		dsnHas         []string
	}{
		{in: "postgres://app:s3cret@db:5432/shop?sslmode=disable", d: dialect.Postgres, driver: "pgx", dsnHas: []string{"postgres://app:s3cret@db:5432/shop"}},
		{in: "postgresql://app:s3cret@db/shop", d: dialect.Postgres, driver: "pgx"},
		{in: "host=db user=app password=s3cret dbname=shop", driverName: "postgres", d: dialect.Postgres, driver: "pgx"},
		{in: "mysql://app:s3cret@tcp(db:3306)/shop", d: dialect.MySQL, driver: "mysql", dsnHas: []string{"parseTime=true", "time_zone=", "tcp(db:3306)/shop"}},
		{in: "mariadb://app:s3cret@tcp(db:3306)/shop", d: dialect.MySQL, driver: "mysql", dsnHas: []string{"parseTime=true"}},
		{in: "app:s3cret@tcp(db:3306)/shop", driverName: "mysql", d: dialect.MySQL, driver: "mysql", dsnHas: []string{"parseTime=true"}},
		{in: "app:s3cret@tcp(db:3306)/shop", driverName: "mariadb", d: dialect.MySQL, driver: "mysql"},
		{in: "mysql://app:s3cret@tcp(db:3306)/shop?time_zone=%27%2B02%3A00%27", d: dialect.MySQL, driver: "mysql", dsnHas: []string{"time_zone=%27%2B02%3A00%27"}},
		{in: "sqlite:data/outbox.db", d: dialect.SQLite, driver: "sqlite", path: "data/outbox.db", dsnHas: []string{"file:data/outbox.db?", "busy_timeout", "journal_mode(WAL)", "_txlock=immediate"}},
		{in: "sqlite:data/outbox.db?mode=ro", d: dialect.SQLite, driver: "sqlite", path: "data/outbox.db"},
		{in: "file:/tmp/x.db", d: dialect.SQLite, driver: "sqlite", path: "/tmp/x.db"},
		{in: "outbox.db", d: dialect.SQLite, driver: "sqlite", path: "outbox.db"},
		{in: "dir/outbox.sqlite", d: dialect.SQLite, driver: "sqlite", path: "dir/outbox.sqlite"},
		{in: "outbox.sqlite3", d: dialect.SQLite, driver: "sqlite", path: "outbox.sqlite3"},
		{in: "outbox.data", driverName: "sqlite", d: dialect.SQLite, driver: "sqlite", path: "outbox.data"},
	} {
		t.Run(tc.in+"/"+tc.driverName, func(t *testing.T) {
			src, err := dsn.Parse(tc.in, tc.driverName)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if src.Dialect != tc.d || src.DriverName != tc.driver || src.Path != tc.path {
				t.Errorf("Parse = %+v, want dialect %s, driver %s, path %q", src, tc.d, tc.driver, tc.path)
			}
			for _, s := range tc.dsnHas {
				if !strings.Contains(src.DSN, s) {
					t.Errorf("DSN %q lacks %q", src.DSN, s)
				}
			}
			if src.Where == "" {
				t.Error("Where is empty")
			}
			if strings.Contains(src.Where, secret) {
				t.Errorf("Where %q shows the password", src.Where)
			}
			if tc.d == dialect.MySQL && strings.Count(src.DSN, "time_zone=") != 1 {
				t.Errorf("DSN %q: want exactly one time_zone", src.DSN)
			}
		})
	}
}

func TestParseWhere(t *testing.T) {
	src, err := dsn.Parse("postgres://app:s3cret@db:5432/shop", "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(src.Where, "db:5432/shop") || !strings.Contains(src.Where, "PostgreSQL") || !strings.Contains(src.Where, "app") {
		t.Errorf("Where = %q, want user, host and database", src.Where)
	}
	src, err = dsn.Parse("mysql://app:s3cret@tcp(db:3306)/shop", "")
	if err != nil {
		t.Fatal(err)
	}
	if src.Where != "app@tcp(db:3306)/shop (MySQL/MariaDB)" {
		t.Errorf("Where = %q", src.Where)
	}
}

func TestParseRefused(t *testing.T) {
	for _, tc := range []struct{ in, driverName string }{
		{"", ""},
		{"", "postgres"},
		{"app:s3cret@tcp(db:3306)/shop", ""},       // bare go-sql-driver DSN without a driver name
		{"host=db password=s3cret dbname=x", ""},   // keyword DSN without a driver name
		{"mongodb://app:s3cret@db/shop", ""},       // unknown scheme
		{"postgres://app:s3cret@db/shop", "mongo"}, // unknown driver name
		{"mysql://app:s3cret@db:3306/shop", ""},    // not a go-sql-driver DSN (no tcp(...))
		{"mysql://app:s3cret@tcp(db:3306", ""},     // broken
		{"sqlite:", ""},
		{"file:", ""},
		{"sqlite:?mode=ro", ""},
	} {
		t.Run(tc.in+"/"+tc.driverName, func(t *testing.T) {
			src, err := dsn.Parse(tc.in, tc.driverName)
			if err == nil {
				t.Fatalf("Parse succeeded: %+v", src)
			}
			if strings.Contains(err.Error(), secret) {
				t.Errorf("error shows the password: %v", err)
			}
		})
	}
}

func TestOpen(t *testing.T) {
	ctx := context.Background()
	// A missing SQLite file is an error, not a new empty database.
	missing := filepath.Join(t.TempDir(), "missing.db")
	if _, _, err := dsn.Open(ctx, missing, "", 0); err == nil {
		t.Error("Open of a missing SQLite file succeeded")
	}
	if _, err := os.Stat(missing); err == nil {
		t.Error("Open created the missing file")
	}
	// An existing one opens.
	path := filepath.Join(t.TempDir(), "ok.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	db, src, err := dsn.Open(ctx, "sqlite:"+path, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if src.Dialect != dialect.SQLite {
		t.Errorf("dialect %s", src.Dialect)
	}
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Errorf("journal_mode = %q, %v; want wal", mode, err)
	}
	// Unreachable servers: the error never shows the password.
	for _, s := range []string{
		"postgres://app:s3cret@127.0.0.1:1/shop?connect_timeout=1",
		"mysql://app:s3cret@tcp(127.0.0.1:1)/shop?timeout=1s",
	} {
		_, _, err := dsn.Open(ctx, s, "", 0)
		if err == nil {
			t.Errorf("Open(%s) succeeded", strings.ReplaceAll(s, secret, "xxx"))
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Open error shows the password: %v", err)
		}
	}
}

// TestSQLiteParametersKept: parameters after "?" reach the driver, after
// the defaults, so mode=ro opens the file read-only (the README's advice
// for the monitor).
func TestSQLiteParametersKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ro.db")
	ctx := context.Background()
	if _, _, err := dsn.Open(ctx, "sqlite:"+path, "", 0); err == nil {
		t.Fatal("Open opened (and created) a missing SQLite file")
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	db, _, err := dsn.Open(ctx, "sqlite:"+path, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE t (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	ro, src, err := dsn.Open(ctx, "file:"+path+"?mode=ro", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if !strings.HasSuffix(src.DSN, "&mode=ro") || src.Path != path {
		t.Errorf("DSN %q, path %q", src.DSN, src.Path)
	}
	if _, err := ro.Exec("INSERT INTO t VALUES (1)"); err == nil || !strings.Contains(err.Error(), "readonly") {
		t.Errorf("insert through mode=ro: %v, want a read-only error", err)
	}
}

// TestSecrets: the passwords Parse finds, for masking by name.
func TestSecrets(t *testing.T) {
	for _, s := range []string{"postgres://app:s3cret@db:5432/shop", "mysql://app:s3cret@tcp(db:3306)/shop", "mariadb://app:s3cret@tcp(db:3306)/shop"} {
		src, err := dsn.Parse(s, "")
		if err != nil || len(src.Secrets) != 1 || src.Secrets[0] != "s3cret" {
			t.Errorf("Parse(%q).Secrets = %q, %v; want [s3cret]", s, src.Secrets, err)
		}
	}
	if src, _ := dsn.Parse("sqlite:app.db", ""); len(src.Secrets) != 0 {
		t.Errorf("a SQLite file has secrets: %q", src.Secrets)
	}
}
