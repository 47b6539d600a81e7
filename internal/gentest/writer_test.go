package gentest

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgen/outboxgen/internal/gentest/pgxevents"
	"github.com/outboxgen/outboxgen/internal/gentest/sqlevents"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

var tables = templates.Tables{Outbox: sqlevents.OutboxTable, Inbox: sqlevents.InboxTable}

// env is one database prepared for a writer test: the outbox schema, a
// business table, and a writer for its dialect.
type env struct {
	dialect outbox.Dialect
	db      *sql.DB
	writer  sqlevents.Writer
}

func setup(t testing.TB, d string) env {
	t.Helper()
	db := testdb.Open(t, d)
	testdb.ApplySchema(t, db, d, tables)
	if _, err := db.Exec(`CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	w, err := sqlevents.NewWriter(db)
	if err != nil {
		t.Fatal(err)
	}
	return env{dialect: outbox.Dialect(d), db: db, writer: w}
}

// q rewrites ?-placeholders for the dialect.
func (e env) q(query string) string {
	if e.dialect != outbox.Postgres {
		return query
	}
	n := 0
	out := make([]byte, 0, len(query)+8)
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			out = append(out, fmt.Sprintf("$%d", n)...)
			continue
		}
		out = append(out, query[i])
	}
	return string(out)
}

type row struct {
	EventID        string
	BizType, BizID string
	Topic          string
	PayloadVersion int
	Payload        string
	Headers        sql.NullString
	Status         int
	RetryCount     int
	LeaseOwner     sql.NullString
}

func (e env) rows(t testing.TB) []row {
	t.Helper()
	rs, err := e.db.Query(`SELECT event_id, biz_type, biz_id, topic, payload_version, payload, headers, status, retry_count, lease_owner FROM outbox_event ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	var out []row
	for rs.Next() {
		var r row
		if err := rs.Scan(&r.EventID, &r.BizType, &r.BizID, &r.Topic, &r.PayloadVersion, &r.Payload, &r.Headers, &r.Status, &r.RetryCount, &r.LeaseOwner); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func paid(orderID string) sqlevents.OrderPaid {
	return sqlevents.OrderPaid{
		OrderID:     orderID,
		CustomerID:  "c-42",
		AmountCents: 1299,
		Currency:    "EUR",
		Method:      sqlevents.PaymentMethodCard,
		PaidAt:      time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC),
	}
}

// payOrder is the business transaction of the seed design: update the
// order, then write the event, in one local transaction.
func (e env) payOrder(ctx context.Context, orderID string, fail error, opts ...outbox.InsertOption) (outbox.EventID, error) {
	tx, err := e.db.BeginTx(ctx, nil)
	if err != nil {
		return outbox.EventID{}, err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, e.q(`INSERT INTO orders (id, status) VALUES (?, 'paid')`), orderID); err != nil {
		return outbox.EventID{}, err
	}
	id, err := e.writer.InsertOrderPaid(ctx, tx, paid(orderID), opts...)
	if err != nil {
		return outbox.EventID{}, err
	}
	if fail != nil {
		return outbox.EventID{}, fail // the deferred Rollback undoes both writes
	}
	return id, tx.Commit()
}

func forEachDialect(t *testing.T, f func(t *testing.T, e env)) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			e := setup(t, d)
			f(t, e)
		})
	}
}

func TestInsertCommitsWithBusinessChange(t *testing.T) {
	forEachDialect(t, func(t *testing.T, e env) {
		id, err := e.payOrder(t.Context(), "o-1", nil)
		if err != nil {
			t.Fatal(err)
		}
		if id.IsZero() || uuid.UUID(id).Version() != 7 {
			t.Fatalf("event id %s is not a UUIDv7", id)
		}
		rows := e.rows(t)
		if len(rows) != 1 {
			t.Fatalf("got %d outbox rows, want 1", len(rows))
		}
		r := rows[0]
		want := row{EventID: id.String(), BizType: "ORDER_PAID", BizID: "o-1", Topic: "orders.paid", PayloadVersion: 1, Status: 0}
		if r.EventID != want.EventID || r.BizType != want.BizType || r.BizID != want.BizID || r.Topic != want.Topic ||
			r.PayloadVersion != want.PayloadVersion || r.Status != 0 || r.RetryCount != 0 || r.Headers.Valid || r.LeaseOwner.Valid {
			t.Fatalf("row = %+v, want %+v with retry 0, no headers, no lease", r, want)
		}
		got, err := sqlevents.DecodeOrderPaid([]byte(r.Payload), r.PayloadVersion)
		if err != nil {
			t.Fatal(err)
		}
		if got != paid("o-1") {
			t.Fatalf("payload round trip: got %+v, want %+v", got, paid("o-1"))
		}
	})
}

// TestSeedCheck1Rollback is the seed's acceptance check 1: an error after
// the business update rolls the outbox row back with it.
func TestSeedCheck1Rollback(t *testing.T) {
	forEachDialect(t, func(t *testing.T, e env) {
		boom := errors.New("payment provider said no")
		if _, err := e.payOrder(t.Context(), "o-1", boom); !errors.Is(err, boom) {
			t.Fatalf("payOrder = %v, want %v", err, boom)
		}
		if rows := e.rows(t); len(rows) != 0 {
			t.Fatalf("rolled-back transaction left %d outbox rows: %+v", len(rows), rows)
		}
		var orders int
		if err := e.db.QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&orders); err != nil {
			t.Fatal(err)
		}
		if orders != 0 {
			t.Fatalf("rolled-back transaction left %d orders", orders)
		}
		// The next payment goes through: the failure left nothing behind.
		if _, err := e.payOrder(t.Context(), "o-2", nil); err != nil {
			t.Fatal(err)
		}
		if rows := e.rows(t); len(rows) != 1 || rows[0].BizID != "o-2" {
			t.Fatalf("rows after a committed payment = %+v", rows)
		}
	})
}

// An invalid payload is refused before any SQL runs, so the transaction
// stays usable (on PostgreSQL a failed statement would abort it).
func TestInvalidPayloadLeavesTxUsable(t *testing.T) {
	forEachDialect(t, func(t *testing.T, e env) {
		ctx := t.Context()
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		bad := []struct {
			name  string
			event sqlevents.OrderPaid
			field string
		}{
			{"empty key", paid(""), "order_id"},
			{"unknown enum", func() sqlevents.OrderPaid { p := paid("o-1"); p.Method = "cash"; return p }(), "method"},
			// Longer than biz_id's 128 characters: the writer refuses it,
			// where the INSERT would fail (and abort the tx on PostgreSQL).
			{"key too long", paid(strings.Repeat("ø", outbox.MaxKeyLen+1)), ""},
		}
		for _, c := range bad {
			_, err := e.writer.InsertOrderPaid(ctx, tx, c.event)
			var ie *outbox.InvalidEventError
			if !errors.Is(err, outbox.ErrInvalidEvent) || !errors.As(err, &ie) || ie.Field != c.field || ie.Type != "ORDER_PAID" {
				t.Fatalf("%s: err = %v, want an invalid-event error on field %s", c.name, err, c.field)
			}
		}
		if _, err := e.writer.InsertOrderPaid(ctx, tx, paid("o-1")); err != nil {
			t.Fatalf("valid insert after refused ones: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		if rows := e.rows(t); len(rows) != 1 {
			t.Fatalf("got %d rows, want 1", len(rows))
		}
	})
}

// A caller-chosen event id makes re-emission idempotent; headers are stored.
func TestCallerChosenIDAndHeaders(t *testing.T) {
	forEachDialect(t, func(t *testing.T, e env) {
		ctx := t.Context()
		id := outbox.EventID(uuid.NewSHA1(uuid.NameSpaceURL, []byte("orders/o-1/paid")))
		for i := range 3 {
			tx, err := e.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.writer.InsertOrderPaid(ctx, tx, paid("o-1"), outbox.WithEventID(id),
				outbox.WithHeader("traceparent", "00-abc-def-01"), outbox.WithHeaders(map[string]string{"tenant": "acme"}))
			if err != nil {
				t.Fatalf("emission %d: %v", i, err)
			}
			if got != id {
				t.Fatalf("emission %d returned %s, want %s", i, got, id)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		rows := e.rows(t)
		if len(rows) != 1 || rows[0].EventID != id.String() {
			t.Fatalf("rows = %+v, want exactly one with event id %s", rows, id)
		}
		var h map[string]string
		if err := json.Unmarshal([]byte(rows[0].Headers.String), &h); err != nil {
			t.Fatalf("headers %q: %v", rows[0].Headers.String, err)
		}
		if h["traceparent"] != "00-abc-def-01" || h["tenant"] != "acme" || len(h) != 2 {
			t.Fatalf("headers = %v", h)
		}

		// The same id for another event is refused, not silently
		// dropped, and the transaction stays usable: the check is a SELECT,
		// not a failing statement (which would abort it on PostgreSQL).
		// On MySQL this relies on clientFoundRows staying off (the test
		// DSN's default).
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, e.q(`INSERT INTO orders (id, status) VALUES (?, 'paid')`), "o-2"); err != nil {
			t.Fatal(err)
		}
		clashes := []struct {
			name   string
			insert func() (outbox.EventID, error)
		}{
			{"another type", func() (outbox.EventID, error) {
				return e.writer.InsertStockReserved(ctx, tx, sqlevents.StockReserved{SkuID: 7, Quantity: 1}, outbox.WithEventID(id))
			}},
			{"another key", func() (outbox.EventID, error) {
				return e.writer.InsertOrderPaid(ctx, tx, paid("o-2"), outbox.WithEventID(id))
			}},
		}
		for _, c := range clashes {
			got, err := c.insert()
			var de *outbox.DuplicateEventIDError
			if !errors.Is(err, outbox.ErrDuplicateEventID) || !errors.As(err, &de) || de.HasType != "ORDER_PAID" || de.HasKey != "o-1" {
				t.Fatalf("%s under id %s: id %s, err = %v, want ErrDuplicateEventID naming ORDER_PAID o-1", c.name, id, got, err)
			}
		}
		// A repeat is still fine in the same transaction.
		if _, err := e.writer.InsertOrderPaid(ctx, tx, paid("o-1"), outbox.WithEventID(id)); err != nil {
			t.Fatalf("repeat after a clash: %v", err)
		}
		fresh, err := e.writer.InsertOrderPaid(ctx, tx, paid("o-2"))
		if err != nil {
			t.Fatalf("insert after a clash: %v", err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatalf("commit after a clash: %v", err)
		}
		rows = e.rows(t)
		if len(rows) != 2 || rows[0].EventID != id.String() || rows[0].BizType != "ORDER_PAID" || rows[1].EventID != fresh.String() {
			t.Fatalf("rows = %+v, want o-1's event %s and o-2's %s", rows, id, fresh)
		}
		var orders int
		if err := e.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders`).Scan(&orders); err != nil || orders != 1 {
			t.Fatalf("orders = %d, %v; want the business change committed", orders, err)
		}
	})
}

// Concurrent writers each get their own time-ordered id and row; a
// non-string key (int64) is stored as its decimal text.
func TestConcurrentWriters(t *testing.T) {
	forEachDialect(t, func(t *testing.T, e env) {
		ctx := t.Context()
		const writers, each = 8, 25
		var mu sync.Mutex
		var ids []string
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Go(func() {
				for i := range each {
					tx, err := e.db.BeginTx(ctx, nil)
					if err != nil {
						errs <- err
						return
					}
					id, err := e.writer.InsertStockReserved(ctx, tx, sqlevents.StockReserved{SkuID: int64(w*1000 + i), Quantity: 1})
					if err == nil {
						err = tx.Commit()
					} else {
						tx.Rollback()
					}
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					ids = append(ids, id.String())
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		rows := e.rows(t)
		if len(rows) != writers*each {
			t.Fatalf("got %d rows, want %d", len(rows), writers*each)
		}
		seen := map[string]bool{}
		for _, r := range rows {
			if seen[r.EventID] {
				t.Fatalf("duplicate event id %s", r.EventID)
			}
			seen[r.EventID] = true
			if r.BizType != "STOCK_RESERVED" || r.PayloadVersion != 2 {
				t.Fatalf("row %+v", r)
			}
		}
		if !slices.Contains(func() []string {
			var keys []string
			for _, r := range rows {
				keys = append(keys, r.BizID)
			}
			return keys
		}(), "7024") {
			t.Fatalf("int64 key 7024 not stored as decimal text")
		}
		if len(seen) != len(ids) {
			t.Fatalf("%d distinct ids in the table, %d returned", len(seen), len(ids))
		}
	})
}

// The pgx/v5 writers take pgx.Tx, the type sqlc's WithTx takes.
func TestPgxWriter(t *testing.T) {
	pool := testdb.PgxPool(t)
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { sqlDB.Close() })
	testdb.ApplySchema(t, sqlDB, "postgres", tables)
	ctx := t.Context()
	e := env{dialect: outbox.Postgres, db: sqlDB}

	var id outbox.EventID
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		id, err = pgxevents.InsertOrderPaid(ctx, tx, pgxevents.OrderPaid{OrderID: "o-1", Method: pgxevents.PaymentMethodWallet}, outbox.WithHeader("k", "v"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := pgxevents.InsertOrderPaid(ctx, tx, pgxevents.OrderPaid{OrderID: "o-2", Method: pgxevents.PaymentMethodCard}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("BeginFunc = %v, want boom", err)
	}
	rows := e.rows(t)
	if len(rows) != 1 || rows[0].EventID != id.String() || rows[0].BizID != "o-1" || rows[0].Headers.String == "" {
		t.Fatalf("rows = %+v, want only o-1's event %s with headers", rows, id)
	}

	// A caller-chosen id: a repeat succeeds, another event under the same
	// id fails with ErrDuplicateEventID, and neither a clash nor an
	// over-long key aborts the transaction.
	chosen := outbox.EventID(uuid.NewSHA1(uuid.NameSpaceURL, []byte("orders/o-3/paid")))
	var fresh outbox.EventID
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		for i := range 2 {
			if _, err := pgxevents.InsertOrderPaid(ctx, tx, pgxevents.OrderPaid{OrderID: "o-3", Method: pgxevents.PaymentMethodCard}, outbox.WithEventID(chosen)); err != nil {
				return fmt.Errorf("emission %d: %w", i, err)
			}
		}
		_, err := pgxevents.InsertStockReserved(ctx, tx, pgxevents.StockReserved{SkuID: 7, Quantity: 1}, outbox.WithEventID(chosen))
		if !errors.Is(err, outbox.ErrDuplicateEventID) {
			return fmt.Errorf("STOCK_RESERVED under ORDER_PAID's id: err = %v, want ErrDuplicateEventID", err)
		}
		_, err = pgxevents.InsertOrderPaid(ctx, tx, pgxevents.OrderPaid{OrderID: strings.Repeat("x", outbox.MaxKeyLen+1), Method: pgxevents.PaymentMethodCard})
		if !errors.Is(err, outbox.ErrInvalidEvent) {
			return fmt.Errorf("over-long key: err = %v, want ErrInvalidEvent", err)
		}
		fresh, err = pgxevents.InsertOrderPaid(ctx, tx, pgxevents.OrderPaid{OrderID: "o-4", Method: pgxevents.PaymentMethodCard})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	rows = e.rows(t)
	if len(rows) != 3 || rows[1].EventID != chosen.String() || rows[1].BizType != "ORDER_PAID" || rows[2].EventID != fresh.String() {
		t.Fatalf("rows = %+v, want o-1's, o-3's (%s) and o-4's (%s) events", rows, chosen, fresh)
	}
}
