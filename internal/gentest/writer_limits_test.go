package gentest

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgen/outboxgen/internal/gentest/pgxevents"
	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// Keys no database or consumer can take (invalid UTF-8, a NUL byte) and
// headers no broker can carry are refused by the generated writer before
// any SQL, on every database: nothing is stored (SQLite and MariaDB would
// store them, and the consumer would poison the event on every delivery),
// and the business transaction stays usable (on PostgreSQL the INSERT
// would fail with SQLSTATE 22021 and abort it).
func TestUnstorableEventLeavesTxUsable(t *testing.T) {
	forEachDialect(t, func(t *testing.T, e env) {
		ctx := t.Context()
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, e.q(`INSERT INTO orders (id, status) VALUES (?, 'paid')`), "o-1"); err != nil {
			t.Fatal(err)
		}
		bad := []struct {
			name  string
			event sqlevents.OrderPaid
			opts  []outbox.InsertOption
			want  string
		}{
			{"invalid UTF-8 key", paid("k\xff"), nil, "the key (biz_id) is not valid UTF-8"},
			{"NUL in key", paid("k\x00z"), nil, "the key (biz_id) holds '\\x00'"},
			{"LF in key", paid("k\nz"), nil, "the key (biz_id) holds '\\n'"},
			{"space in header name", paid("o-1"), []outbox.InsertOption{outbox.WithHeader("trace id", "x")}, `header name "trace id"`},
			{"colon in header name", paid("o-1"), []outbox.InsertOption{outbox.WithHeader("a:b", "x")}, `header name "a:b"`},
			{"CRLF in header value", paid("o-1"), []outbox.InsertOption{outbox.WithHeader("tenant", "a\r\nb")}, `header "tenant": the value holds "\r"`},
			{"NUL in header value", paid("o-1"), []outbox.InsertOption{outbox.WithHeader("tenant", "a\x00b")}, `header "tenant": the value holds "\x00"`},
			{"invalid UTF-8 header value", paid("o-1"), []outbox.InsertOption{outbox.WithHeader("tenant", "\xff")}, `header "tenant": the value is not valid UTF-8`},
			{"1 MB header value", paid("o-1"), []outbox.InsertOption{outbox.WithHeader("blob", strings.Repeat("x", 1<<20))}, "MaxHeadersSize"},
		}
		for _, c := range bad {
			_, err := e.writer.InsertOrderPaid(ctx, tx, c.event, c.opts...)
			if !errors.Is(err, outbox.ErrInvalidEvent) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: err = %v, want ErrInvalidEvent saying %q", c.name, err, c.want)
			}
		}
		if _, err := e.writer.InsertOrderPaid(ctx, tx, paid("o-1"), outbox.WithHeader("tenant", "acme")); err != nil {
			t.Fatalf("valid insert after refused ones: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("commit after refused inserts: %v", err)
		}
		if rows := e.rows(t); len(rows) != 1 || rows[0].BizID != "o-1" {
			keys := make([]string, len(rows))
			for i, r := range rows {
				keys[i] = fmt.Sprintf("%.20q", r.BizID)
			}
			t.Fatalf("%d rows with keys %v, want only o-1's event", len(rows), keys)
		}
	})
}

// The same through the pgx/v5 writer: the invalid key is refused before
// any SQL, so the pgx transaction is not aborted.
func TestUnstorableEventLeavesPgxTxUsable(t *testing.T) {
	pool := testdb.PgxPool(t)
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { sqlDB.Close() })
	testdb.ApplySchema(t, sqlDB, "postgres", tables)
	ctx := t.Context()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for _, key := range []string{"k\xff", "k\x00z"} {
			_, err := pgxevents.InsertOrderPaid(ctx, tx, pgxevents.OrderPaid{OrderID: key, Method: pgxevents.PaymentMethodCard})
			if !errors.Is(err, outbox.ErrInvalidEvent) {
				return fmt.Errorf("key %q: err = %v, want ErrInvalidEvent", key, err)
			}
		}
		_, err := pgxevents.InsertOrderPaid(ctx, tx, pgxevents.OrderPaid{OrderID: "o-1", Method: pgxevents.PaymentMethodCard},
			outbox.WithHeader("bad name", "x"))
		if !errors.Is(err, outbox.ErrInvalidEvent) {
			return fmt.Errorf("bad header name: err = %v, want ErrInvalidEvent", err)
		}
		_, err = pgxevents.InsertOrderPaid(ctx, tx, pgxevents.OrderPaid{OrderID: "o-1", Method: pgxevents.PaymentMethodCard})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	e := env{dialect: outbox.Postgres, db: sqlDB}
	if rows := e.rows(t); len(rows) != 1 || rows[0].BizID != "o-1" {
		t.Fatalf("%d rows, want only o-1's event", len(rows))
	}
}
