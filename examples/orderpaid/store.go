package main

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // the "sqlite" database/sql driver (pure Go)

	"github.com/outboxgen/outboxgen/examples/orderpaid/db/mysqldb"
	"github.com/outboxgen/outboxgen/examples/orderpaid/db/pgdb"
	"github.com/outboxgen/outboxgen/examples/orderpaid/db/sqlitedb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/dsn"
	"github.com/outboxgen/outboxgen/runtime/redact"
	"github.com/outboxgen/outboxgen/templates"
)

// schemaFS holds the DDL the demo applies at start-up: per dialect, the
// service's tables (app.sql) and the outbox tables outboxgen generated
// (outbox.sql). A real service applies the same files with its migration
// tool.
//
//go:embed schema/*/*.sql
var schemaFS embed.FS

// The demo's tables, in an order that can be dropped.
var demoTables = []string{"sms_messages", "points_ledger", "orders", "customers", "outbox_inbox_duplicate", "outbox_inbox_key", "outbox_inbox", "outbox_event_version", "outbox_event"}

// Queries is the query API the three sqlc packages share (sqlc.yaml compiles
// queries/*.sql once per engine). sqlitedb's emitted interface is the
// reference; pgQueries and mysqlQueries adapt the other two to it. The
// adapters convert parameter and row structs with plain Go conversions,
// which compile only while the three generated structs have identical
// fields: if one engine's generated API drifts, this file stops compiling.
type Queries = sqlitedb.Querier

// store is an open database with its dialect and query constructor.
type store struct {
	db      *sql.DB
	dialect dialect.Dialect
	where   string                      // for humans: a file path or a DSN without password
	queries func(sqlitedb.DBTX) Queries // binds the engine's generated queries to a *sql.DB or *sql.Tx
}

// openStore resolves dsn and driverName (either may be empty) and opens the
// database. An empty dsn is a SQLite file in the temp directory, recreated
// on every run.
func openStore(ctx context.Context, dsn, driverName string) (*store, error) {
	d, dsn, where, err := resolveDSN(dsn, driverName)
	if err != nil {
		return nil, err
	}
	var sqlDriver string
	s := &store{dialect: d, where: where}
	switch d {
	case dialect.SQLite:
		sqlDriver = "sqlite"
		s.queries = func(x sqlitedb.DBTX) Queries { return sqlitedb.New(x) }
	case dialect.Postgres:
		sqlDriver = "pgx"
		s.queries = func(x sqlitedb.DBTX) Queries { return pgQueries{pgdb.New(x)} }
	case dialect.MySQL:
		sqlDriver = "mysql"
		s.queries = func(x sqlitedb.DBTX) Queries { return mysqlQueries{mysqldb.New(x)} }
	}
	s.db, err = sql.Open(sqlDriver, dsn)
	if err != nil {
		return nil, redact.Error(err)
	}
	if d == dialect.SQLite {
		// One writer at a time in any case; a small pool keeps the
		// waiting short (busy_timeout covers the rest).
		s.db.SetMaxOpenConns(4)
	} else {
		s.db.SetMaxOpenConns(16)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.db.PingContext(pctx); err != nil {
		s.db.Close()
		return nil, redact.Error(fmt.Errorf("connect to %s (%s): %w", d, where, err))
	}
	return s, nil
}

// resolveDSN works out the dialect and the database/sql DSN (see package
// runtime/dsn for the forms accepted). An empty dsn is a SQLite file in
// the temp dir, recreated on each run.
func resolveDSN(s, driverName string) (dialect.Dialect, string, string, error) {
	if s == "" {
		if driverName != "" {
			if d, err := dialect.Parse(driverName); err == nil && d != dialect.SQLite {
				return "", "", "", fmt.Errorf("-driver %s needs a DSN in -db", d)
			}
		}
		path := filepath.Join(os.TempDir(), "orderpaid-demo.db")
		for _, suffix := range []string{"", "-wal", "-shm"} {
			os.Remove(path + suffix)
		}
		s = "sqlite:" + path
		driverName = ""
		src, err := dsn.Parse(s, "")
		return src.Dialect, src.DSN, path + " (SQLite, recreated on each run)", err
	}
	src, err := dsn.Parse(s, driverName)
	if err != nil {
		if driverName != "" && strings.HasPrefix(err.Error(), "driver ") {
			return "", "", "", fmt.Errorf("-%w", err)
		}
		return "", "", "", fmt.Errorf("-db: %w", err)
	}
	return src.Dialect, src.DSN, src.Where, nil
}

// applySchema creates the demo's tables. When any of them exists already it
// refuses, unless reset is set: then it drops them first.
func (s *store) applySchema(ctx context.Context, reset bool) error {
	var existing []string
	for _, t := range demoTables {
		var n int64
		if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+t).Scan(&n); err == nil {
			existing = append(existing, t)
		}
	}
	if len(existing) > 0 {
		if !reset {
			return fmt.Errorf("the database already has the demo's tables (%s): point -db at an empty database, or pass -reset to drop them", strings.Join(existing, ", "))
		}
		for _, t := range demoTables {
			if _, err := s.db.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
				return fmt.Errorf("reset: %w", err)
			}
		}
	}
	dir := "schema/" + string(s.dialect)
	for _, name := range []string{"outbox.sql", "app.sql"} {
		ddl, err := schemaFS.ReadFile(dir + "/" + name)
		if err != nil {
			return err
		}
		for _, stmt := range templates.Statements(ddl) {
			if _, err := s.db.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("apply %s/%s: %w\n%s", dir, name, err, stmt)
			}
		}
	}
	return nil
}

// inTx runs fn in a transaction, retrying it (up to 5 attempts) when the
// database reports a transient conflict: a deadlock or serialization
// failure (PostgreSQL 40001/40P01, MySQL 1213/1205) or SQLITE_BUSY.
func (s *store) inTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	var err error
	for attempt := 1; attempt <= 5; attempt++ {
		err = s.tryTx(ctx, fn)
		if err == nil || !transient(err) {
			return err
		}
		time.Sleep(time.Duration(attempt*attempt) * 5 * time.Millisecond)
	}
	return err
}

func (s *store) tryTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

func transient(err error) bool {
	var my *mysql.MySQLError
	if errors.As(err, &my) {
		return my.Number == 1213 || my.Number == 1205
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code == "40001" || pg.Code == "40P01" // serialization failure, deadlock
	}
	msg := err.Error()
	return strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked")
}

// pgQueries adapts pgdb (sqlc, engine postgresql) to Queries.
type pgQueries struct{ q *pgdb.Queries }

func (a pgQueries) CreateCustomer(ctx context.Context, arg sqlitedb.CreateCustomerParams) error {
	return a.q.CreateCustomer(ctx, pgdb.CreateCustomerParams(arg))
}
func (a pgQueries) CreateOrder(ctx context.Context, arg sqlitedb.CreateOrderParams) error {
	return a.q.CreateOrder(ctx, pgdb.CreateOrderParams(arg))
}
func (a pgQueries) MarkOrderPaid(ctx context.Context, arg sqlitedb.MarkOrderPaidParams) (int64, error) {
	return a.q.MarkOrderPaid(ctx, pgdb.MarkOrderPaidParams(arg))
}
func (a pgQueries) MarkOrderRefunded(ctx context.Context, arg sqlitedb.MarkOrderRefundedParams) (int64, error) {
	return a.q.MarkOrderRefunded(ctx, pgdb.MarkOrderRefundedParams(arg))
}
func (a pgQueries) GetOrder(ctx context.Context, id string) (sqlitedb.GetOrderRow, error) {
	r, err := a.q.GetOrder(ctx, id)
	return sqlitedb.GetOrderRow(r), err
}
func (a pgQueries) CountOrders(ctx context.Context, status string) (int64, error) {
	return a.q.CountOrders(ctx, status)
}
func (a pgQueries) AddLedgerEntry(ctx context.Context, arg sqlitedb.AddLedgerEntryParams) error {
	return a.q.AddLedgerEntry(ctx, pgdb.AddLedgerEntryParams(arg))
}
func (a pgQueries) AddPoints(ctx context.Context, arg sqlitedb.AddPointsParams) (int64, error) {
	return a.q.AddPoints(ctx, pgdb.AddPointsParams(arg))
}
func (a pgQueries) GetCustomerPhone(ctx context.Context, id string) (string, error) {
	return a.q.GetCustomerPhone(ctx, id)
}
func (a pgQueries) RecordSMS(ctx context.Context, arg sqlitedb.RecordSMSParams) error {
	return a.q.RecordSMS(ctx, pgdb.RecordSMSParams(arg))
}
func (a pgQueries) CountLedger(ctx context.Context, kind string) (int64, error) {
	return a.q.CountLedger(ctx, kind)
}
func (a pgQueries) CountSMS(ctx context.Context, kind string) (int64, error) {
	return a.q.CountSMS(ctx, kind)
}
func (a pgQueries) CountBalanceMismatches(ctx context.Context) (int64, error) {
	return a.q.CountBalanceMismatches(ctx)
}
func (a pgQueries) CountOutboxSent(ctx context.Context, bizType string) (int64, error) {
	return a.q.CountOutboxSent(ctx, bizType)
}

// mysqlQueries adapts mysqldb (sqlc, engine mysql) to Queries.
type mysqlQueries struct{ q *mysqldb.Queries }

func (a mysqlQueries) CreateCustomer(ctx context.Context, arg sqlitedb.CreateCustomerParams) error {
	return a.q.CreateCustomer(ctx, mysqldb.CreateCustomerParams(arg))
}
func (a mysqlQueries) CreateOrder(ctx context.Context, arg sqlitedb.CreateOrderParams) error {
	return a.q.CreateOrder(ctx, mysqldb.CreateOrderParams(arg))
}
func (a mysqlQueries) MarkOrderPaid(ctx context.Context, arg sqlitedb.MarkOrderPaidParams) (int64, error) {
	return a.q.MarkOrderPaid(ctx, mysqldb.MarkOrderPaidParams(arg))
}
func (a mysqlQueries) MarkOrderRefunded(ctx context.Context, arg sqlitedb.MarkOrderRefundedParams) (int64, error) {
	return a.q.MarkOrderRefunded(ctx, mysqldb.MarkOrderRefundedParams(arg))
}
func (a mysqlQueries) GetOrder(ctx context.Context, id string) (sqlitedb.GetOrderRow, error) {
	r, err := a.q.GetOrder(ctx, id)
	return sqlitedb.GetOrderRow(r), err
}
func (a mysqlQueries) CountOrders(ctx context.Context, status string) (int64, error) {
	return a.q.CountOrders(ctx, status)
}
func (a mysqlQueries) AddLedgerEntry(ctx context.Context, arg sqlitedb.AddLedgerEntryParams) error {
	return a.q.AddLedgerEntry(ctx, mysqldb.AddLedgerEntryParams(arg))
}
func (a mysqlQueries) AddPoints(ctx context.Context, arg sqlitedb.AddPointsParams) (int64, error) {
	return a.q.AddPoints(ctx, mysqldb.AddPointsParams(arg))
}
func (a mysqlQueries) GetCustomerPhone(ctx context.Context, id string) (string, error) {
	return a.q.GetCustomerPhone(ctx, id)
}
func (a mysqlQueries) RecordSMS(ctx context.Context, arg sqlitedb.RecordSMSParams) error {
	return a.q.RecordSMS(ctx, mysqldb.RecordSMSParams(arg))
}
func (a mysqlQueries) CountLedger(ctx context.Context, kind string) (int64, error) {
	return a.q.CountLedger(ctx, kind)
}
func (a mysqlQueries) CountSMS(ctx context.Context, kind string) (int64, error) {
	return a.q.CountSMS(ctx, kind)
}
func (a mysqlQueries) CountBalanceMismatches(ctx context.Context) (int64, error) {
	return a.q.CountBalanceMismatches(ctx)
}
func (a mysqlQueries) CountOutboxSent(ctx context.Context, bizType string) (int64, error) {
	return a.q.CountOutboxSent(ctx, bizType)
}
