// Package dsn opens a database from one connection string in the forms
// outboxgen's command and example accept, and says which SQL dialect it
// speaks:
//
//	postgres://user:pass@host:5432/db?sslmode=disable   PostgreSQL (pgx)
//	postgresql://...                                    the same
//	mysql://user:pass@tcp(host:3306)/db                 MySQL or MariaDB
//	mariadb://user:pass@tcp(host:3306)/db               the same
//	sqlite:path/to/file.db  or  file:path/to/file.db    SQLite (pure Go)
//	path/to/file.db, path/to/file.sqlite                the same
//
// It imports the three database/sql drivers it opens (jackc/pgx/v5/stdlib,
// go-sql-driver/mysql, modernc.org/sqlite); a service that has its own
// *sql.DB does not need it.
//
// Nothing here ever puts the connection string itself in an error or a
// description: it may hold a password (Parse's Where is the redacted form).
package dsn

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // the "sqlite" database/sql driver (pure Go)

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/redact"
)

// Source is a parsed connection string.
type Source struct {
	// Dialect is the SQL dialect of the database.
	Dialect dialect.Dialect
	// DriverName is the database/sql driver: "pgx", "mysql" or "sqlite".
	DriverName string
	// DSN is what sql.Open takes for DriverName. It may hold a password:
	// never log it.
	DSN string
	// Where describes the database for humans and logs, password removed:
	// "postgres://app:xxxxx@db:5432/shop (PostgreSQL)".
	Where string
	// Path is the SQLite file ("" for the other dialects).
	Path string
	// Secrets are the passwords the connection string holds, for masking
	// by name wherever text might quote them (redact.StringWith).
	Secrets []string
}

// Parse works out the dialect and the database/sql DSN of s (see the
// package documentation for the accepted forms). driverName, when not
// empty, names the dialect and wins over the form of s ("postgres",
// "mysql", "mariadb", "sqlite"), so a bare go-sql-driver DSN
// (user:pass@tcp(host:3306)/db) works with driverName "mysql".
//
// MySQL DSNs get parseTime=true and, unless they set a time_zone, the
// session time zone UTC (time_zone='+00:00'), which the runtime needs.
// SQLite DSNs get WAL, a 10 s busy timeout and BEGIN IMMEDIATE
// transactions (see SQLiteDSN), then the parameters given after "?"
// (e.g. mode=ro).
func Parse(s, driverName string) (Source, error) {
	var d dialect.Dialect
	if driverName != "" {
		p, err := dialect.Parse(driverName)
		if err != nil {
			return Source{}, fmt.Errorf("driver %q: use sqlite, postgres or mysql (mariadb)", driverName)
		}
		d = p
	}
	switch {
	case s == "":
		return Source{}, errors.New("no database given: pass a postgres:// or mysql:// URL, or a SQLite file")
	case strings.HasPrefix(s, "postgres://"), strings.HasPrefix(s, "postgresql://"):
		d = pick(d, dialect.Postgres)
	case strings.HasPrefix(s, "mysql://"), strings.HasPrefix(s, "mariadb://"):
		d = pick(d, dialect.MySQL)
		s = s[strings.Index(s, "://")+3:]
	case strings.HasPrefix(s, "sqlite:"), strings.HasPrefix(s, "file:"):
		d = pick(d, dialect.SQLite)
	case d == "" && (strings.HasSuffix(s, ".db") || strings.HasSuffix(s, ".sqlite") || strings.HasSuffix(s, ".sqlite3")):
		d = dialect.SQLite
	}
	switch d {
	case dialect.Postgres:
		// Never the DSN itself: it may hold a password (also one that
		// net/url cannot parse, or a password=... keyword).
		src := Source{Dialect: d, DriverName: "pgx", DSN: s, Where: redact.URL(s) + " (PostgreSQL)"}
		if u, err := url.Parse(s); err == nil && u.User != nil {
			if pw, ok := u.User.Password(); ok && pw != "" {
				src.Secrets = []string{pw}
			}
		}
		return src, nil
	case dialect.MySQL:
		cfg, err := mysql.ParseDSN(s)
		if err != nil {
			return Source{}, redact.Error(fmt.Errorf("not a MySQL DSN (mysql://user:pass@tcp(host:3306)/dbname): %w", err))
		}
		cfg.ParseTime = true // scan DATETIME into time.Time
		if _, ok := cfg.Params["time_zone"]; !ok {
			if cfg.Params == nil {
				cfg.Params = map[string]string{}
			}
			cfg.Params["time_zone"] = "'+00:00'"
		}
		where := fmt.Sprintf("%s@%s(%s)/%s (MySQL/MariaDB)", cfg.User, cfg.Net, cfg.Addr, cfg.DBName)
		src := Source{Dialect: d, DriverName: "mysql", DSN: cfg.FormatDSN(), Where: where}
		if cfg.Passwd != "" {
			src.Secrets = []string{cfg.Passwd}
		}
		return src, nil
	case dialect.SQLite:
		path, query, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(s, "sqlite:"), "file:"), "?")
		if path == "" {
			return Source{}, errors.New("sqlite: no file named: use sqlite:path/to/file.db")
		}
		dsn := SQLiteDSN(path)
		if query != "" {
			// The caller's parameters come last, so that theirs win
			// (mode=ro for a read-only monitor, another busy_timeout).
			dsn += "&" + query
		}
		return Source{Dialect: d, DriverName: "sqlite", DSN: dsn, Where: path + " (SQLite)", Path: path}, nil
	}
	// The value is not repeated: a DSN that is not recognised is also one
	// whose password redaction might miss.
	return Source{}, errors.New("cannot tell the database from the value given (not shown: it may hold a password); use a postgres:// or mysql:// URL, or a SQLite file (sqlite:path or *.db)")
}

func pick(explicit, fromDSN dialect.Dialect) dialect.Dialect {
	if explicit != "" {
		return explicit
	}
	return fromDSN
}

// SQLiteDSN is modernc.org/sqlite's DSN for path: WAL (readers never wait
// for the writer), a 10 s busy timeout, foreign keys on, and BEGIN
// IMMEDIATE, so a transaction takes the write lock when it starts and never
// fails later trying to upgrade a read lock.
func SQLiteDSN(path string) string {
	return "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_txlock=immediate"
}

// Open parses s (see Parse), opens the database and pings it within
// timeout (10 s when zero). The pool is sized for the dialect: at most 4
// connections on SQLite (one writer at a time in any case), 16 otherwise.
// A SQLite file must exist (sql.Open would create an empty one, and a
// typo would then read as "no events"). Errors name the database by
// Source.Where and never show a password.
func Open(ctx context.Context, s, driverName string, timeout time.Duration) (*sql.DB, Source, error) {
	src, err := Parse(s, driverName)
	if err != nil {
		return nil, Source{}, err
	}
	if src.Dialect == dialect.SQLite {
		if _, err := os.Stat(src.Path); err != nil {
			return nil, src, fmt.Errorf("open %s: %w", src.Where, err)
		}
	}
	db, err := sql.Open(src.DriverName, src.DSN)
	if err != nil {
		return nil, src, redact.ErrorWith(fmt.Errorf("open %s: %w", src.Where, err), src.DSN)
	}
	if src.Dialect == dialect.SQLite {
		db.SetMaxOpenConns(4)
	} else {
		db.SetMaxOpenConns(16)
	}
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, src, redact.ErrorWith(fmt.Errorf("connect to %s: %w", src.Where, err), src.DSN)
	}
	return db, src, nil
}
