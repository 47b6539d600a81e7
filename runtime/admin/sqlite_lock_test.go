package admin_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/admin"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/templates"
)

// On SQLite opened without _txlock=immediate (deferred transactions),
// Requeue, Delete and Replay write first in their transaction, so while
// another connection holds the write lock they wait for it (busy
// timeout) and then act, instead of reading a snapshot first and failing
// with SQLITE_BUSY when the other writer commits.
func TestSQLiteDeferredTxConcurrentWriter(t *testing.T) {
	for _, action := range []string{"requeue", "delete", "replay"} {
		t.Run(action, func(t *testing.T) {
			db, err := sql.Open("sqlite", testdb.SQLiteDSN(filepath.Join(t.TempDir(), "outbox.db"))) // no _txlock
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			testdb.ApplySchema(t, db, "sqlite", templates.DefaultTables)
			e := newEnv(t, db, dialect.SQLite)
			status := 2
			seed := drivertest.OpsSeedRow{Count: 3, Status: 2, CreatedAgo: time.Hour}
			if action == "replay" {
				status = 1
				seed = drivertest.OpsSeedRow{Count: 3, Status: 1, CreatedAgo: time.Hour, SentAgo: time.Hour}
			}
			ids := drivertest.OpsSeed(t, db, e.d, e.outbox(), seed)[0]
			run := map[string]func(context.Context, admin.Selection) (admin.Result, error){
				"requeue": e.a.Requeue, "delete": e.a.Delete, "replay": e.a.Replay}[action]

			// Another writer (a relay) holds the write lock.
			ctx := context.Background()
			other, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			if _, err := other.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
				t.Fatal(err)
			}
			if _, err := other.ExecContext(ctx, "UPDATE "+e.outbox()+" SET last_error = 'relay' WHERE id = "+strconv.FormatInt(ids[2], 10)); err != nil {
				t.Fatal(err)
			}
			type out struct {
				res admin.Result
				err error
			}
			done := make(chan out, 1)
			go func() {
				res, err := run(ctx, admin.Selection{All: true, OneTransaction: true})
				done <- out{res, err}
			}()
			time.Sleep(300 * time.Millisecond) // the action collected its ids and waits for the lock
			if _, err := other.ExecContext(ctx, "COMMIT"); err != nil {
				t.Fatal(err)
			}
			select {
			case o := <-done:
				if o.err != nil || o.res.Changed != 3 {
					t.Fatalf("%s beside another writer = %+v, %v; want 3 changed", action, o.res, o.err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s did not return", action)
			}
			if n := drivertest.OpsCount(t, db, e.outbox(), "status = "+strconv.Itoa(status)); n != 0 {
				t.Errorf("%d rows left in status %d", n, status)
			}
		})
	}
}
