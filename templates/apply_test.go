package templates_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/templates"
)

// TestApply applies the DDL to a fresh database of every dialect and checks
// that the runtime's INSERT works with every other column defaulted, that
// the unique keys hold, and that the claim query uses the claim index.
func TestApply(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, d)
			tables := templates.DefaultTables
			testdb.ApplySchema(t, db, d, tables)
			dia := dialect.Dialect(d)
			ph := dia.Placeholder

			eventID := uuid.Must(uuid.NewV7()).String()
			payload := `{"order_id": "o-1",  "amount_cents": 1250}` // odd spacing: exact bytes come back
			insert := dia.InsertEvent(tables.Outbox, false)
			args := []any{eventID, "ORDER_PAID", "o-1", "orders.paid", 1, payload, nil}
			if _, err := db.ExecContext(ctx, insert, args...); err != nil {
				t.Fatalf("InsertEvent: %v\n%s", err, insert)
			}

			var (
				id                                  int64
				gotEventID, gotPayload              string
				status, retryCount, payloadVersion  int
				headers, leaseOwner, lastError      sql.NullString
				createdAt, nextRetryTime, updatedAt time.Time
				leaseExpiresAt, sentAt              sql.NullTime
			)
			row := db.QueryRowContext(ctx, `SELECT id, event_id, payload, payload_version, headers, status, retry_count,
				created_at, next_retry_time, updated_at, lease_owner, lease_expires_at, last_error, sent_at
				FROM `+tables.Outbox+` WHERE event_id = `+ph(1), eventID)
			if err := row.Scan(&id, &gotEventID, &gotPayload, &payloadVersion, &headers, &status, &retryCount,
				&createdAt, &nextRetryTime, &updatedAt, &leaseOwner, &leaseExpiresAt, &lastError, &sentAt); err != nil {
				t.Fatalf("read back: %v", err)
			}
			if id <= 0 || gotEventID != eventID || payloadVersion != 1 || headers.Valid {
				t.Errorf("row: id %d, event_id %q (want %q), payload_version %d, headers %v", id, gotEventID, eventID, payloadVersion, headers)
			}
			if d != "mysql" && gotPayload != payload { // MySQL 8 normalises JSON; MariaDB keeps text
				t.Errorf("payload = %q, want the exact bytes %q", gotPayload, payload)
			}
			var a, b any
			if err := json.Unmarshal([]byte(gotPayload), &a); err != nil {
				t.Errorf("payload %q: %v", gotPayload, err)
			}
			_ = json.Unmarshal([]byte(payload), &b)
			if !reflect.DeepEqual(a, b) {
				t.Errorf("payload = %s, want %s", gotPayload, payload)
			}
			if status != 0 || retryCount != 0 {
				t.Errorf("defaults: status %d, retry_count %d, want 0, 0", status, retryCount)
			}
			if leaseOwner.Valid || leaseExpiresAt.Valid || lastError.Valid || sentAt.Valid {
				t.Errorf("want NULL lease_owner, lease_expires_at, last_error, sent_at: %v %v %v %v", leaseOwner, leaseExpiresAt, lastError, sentAt)
			}
			for name, ts := range map[string]time.Time{"created_at": createdAt, "next_retry_time": nextRetryTime, "updated_at": updatedAt} {
				if diff := time.Since(ts); diff < -time.Minute || diff > time.Minute {
					t.Errorf("%s = %v, %v away from now (a database not running in UTC?)", name, ts, diff)
				}
			}

			// A duplicate event_id fails; with ifAbsent it is a no-op.
			if _, err := db.ExecContext(ctx, insert, args...); err == nil {
				t.Error("duplicate event_id inserted")
			}
			other := []any{eventID, "ORDER_PAID", "o-2", "orders.other", 2, `{}`, `{"k":"v"}`}
			if _, err := db.ExecContext(ctx, dia.InsertEvent(tables.Outbox, true), other...); err != nil {
				t.Errorf("InsertEvent(ifAbsent) of a duplicate: %v", err)
			}
			var n int
			var topic string
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*), MIN(topic) FROM "+tables.Outbox).Scan(&n, &topic); err != nil {
				t.Fatal(err)
			}
			if n != 1 || topic != "orders.paid" {
				t.Errorf("after duplicate inserts: %d rows, topic %q, want 1 row, orders.paid", n, topic)
			}
			// Ids order events.
			second := uuid.Must(uuid.NewV7()).String()
			if _, err := db.ExecContext(ctx, dia.InsertEvent(tables.Outbox, true), second, "ORDER_PAID", "o-1", "orders.paid", 1, `{}`, `{"trace":"x"}`); err != nil {
				t.Fatal(err)
			}
			var id2 int64
			if err := db.QueryRowContext(ctx, "SELECT id FROM "+tables.Outbox+" WHERE event_id = "+ph(1), second).Scan(&id2); err != nil {
				t.Fatal(err)
			}
			if id2 <= id {
				t.Errorf("second event id %d <= first %d", id2, id)
			}

			// Inbox: (consumer, event_id) is the primary key.
			inboxInsert := "INSERT INTO " + tables.Inbox + " (consumer, event_id, biz_type, biz_id) VALUES (" + ph(1) + ", " + ph(2) + ", " + ph(3) + ", " + ph(4) + ")"
			if _, err := db.ExecContext(ctx, inboxInsert, "points", eventID, "ORDER_PAID", "o-1"); err != nil {
				t.Fatalf("inbox insert: %v", err)
			}
			if _, err := db.ExecContext(ctx, inboxInsert, "points", eventID, nil, nil); err == nil {
				t.Error("inbox accepted a duplicate (consumer, event_id)")
			}
			if _, err := db.ExecContext(ctx, inboxInsert, "sms", eventID, nil, nil); err != nil {
				t.Errorf("inbox: same event for another consumer: %v", err)
			}
			if _, err := db.ExecContext(ctx, inboxInsert, "points", "foreign:123", nil, nil); err != nil {
				t.Errorf("inbox: non-UUID event id: %v", err)
			}
			var processedAt time.Time
			if err := db.QueryRowContext(ctx, "SELECT processed_at FROM "+tables.Inbox+" WHERE consumer = "+ph(1)+" AND event_id = "+ph(2), "points", eventID).Scan(&processedAt); err != nil {
				t.Fatal(err)
			}
			if diff := time.Since(processedAt); diff < -time.Minute || diff > time.Minute {
				t.Errorf("processed_at = %v, %v away from now", processedAt, diff)
			}

			checkClaimPlan(t, db, d, tables)
		})
	}
}

// checkClaimPlan asserts that the claim query uses the claim index.
func checkClaimPlan(t *testing.T, db *sql.DB, d string, tables templates.Tables) {
	t.Helper()
	ctx := context.Background()
	claim := "SELECT id FROM " + tables.Outbox + " WHERE status = 0 ORDER BY id LIMIT 100"
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var explain string
	switch d {
	case "postgres":
		// The table is tiny: without this the planner rightly picks a
		// sequential scan and the test would prove nothing.
		if _, err := conn.ExecContext(ctx, "SET enable_seqscan = off"); err != nil {
			t.Fatal(err)
		}
		explain = "EXPLAIN " + claim
	case "sqlite":
		explain = "EXPLAIN QUERY PLAN " + claim
	case "mysql":
		explain = "EXPLAIN " + claim
	}
	rows, err := conn.QueryContext(ctx, explain)
	if err != nil {
		t.Fatalf("%s: %v", explain, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var plan strings.Builder
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			plan.WriteString(v.String)
			plan.WriteByte(' ')
		}
		plan.WriteByte('\n')
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	idx := templates.ClaimIndex(tables.Outbox)
	t.Logf("%s plan:\n%s", d, plan.String())
	if d == "mysql" {
		// MySQL has no partial index to prove, and on a two-row table it
		// may pick any plan: informational only.
		return
	}
	if !strings.Contains(plan.String(), idx) {
		t.Errorf("claim query does not use %s:\n%s", idx, plan.String())
	}
}
