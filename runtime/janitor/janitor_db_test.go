package janitor_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver/drivertest"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/janitor"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/templates"
)

type dbEnv struct {
	db    *sql.DB
	d     dialect.Dialect
	store janitor.Store
}

// eachDatabase runs f on a fresh database with the schema for every
// dialect through database/sql, and on PostgreSQL through pgx.
func eachDatabase(t *testing.T, f func(t *testing.T, env dbEnv)) {
	for _, name := range testdb.Dialects() {
		t.Run(name, func(t *testing.T) {
			d, err := dialect.Parse(name)
			if err != nil {
				t.Fatal(err)
			}
			db := testdb.Open(t, name)
			testdb.ApplySchema(t, db, name, templates.DefaultTables)
			drv, err := sqldriver.New(db, testdb.SchemaWith(d, archiveTables))
			if err != nil {
				t.Fatal(err)
			}
			f(t, dbEnv{db: db, d: d, store: drv})
		})
	}
	t.Run("pgx", func(t *testing.T) {
		pool := testdb.PgxPool(t)
		db := stdlib.OpenDBFromPool(pool)
		t.Cleanup(func() { db.Close() })
		testdb.ApplySchema(t, db, "postgres", templates.DefaultTables)
		drv, err := pgxdriver.New(pool, testdb.SchemaWith(dialect.Postgres, archiveTables))
		if err != nil {
			t.Fatal(err)
		}
		f(t, dbEnv{db: db, d: dialect.Postgres, store: drv})
	})
}

const day = 24 * time.Hour

// archiveTables are the default tables plus the archive table the tests
// create (as sql.archive_table in events.yaml would).
var archiveTables = outbox.Tables{Outbox: testdb.Tables.Outbox, Inbox: testdb.Tables.Inbox, Archive: "outbox_event_archive"}

// seedMixed seeds oldSent removable rows and rows the janitor must keep;
// FAILED and pending rows carry an old sent_at too, to prove the status
// guard. It returns the old sent ids and the ids to keep.
func seedMixed(t *testing.T, env dbEnv, oldSent int) (old, keep []int64) {
	t.Helper()
	tb := testdb.Tables
	ids := drivertest.OpsSeed(t, env.db, env.d, tb.Outbox,
		drivertest.OpsSeedRow{Count: oldSent, Status: 1, CreatedAgo: 9 * day, SentAgo: 8 * day},
		drivertest.OpsSeedRow{Count: 3, Status: 1, CreatedAgo: 2 * day, SentAgo: day},       // young sent
		drivertest.OpsSeedRow{Count: 2, Status: 2, CreatedAgo: 60 * day, SentAgo: 60 * day}, // old failed
		drivertest.OpsSeedRow{Count: 2, Status: 0, CreatedAgo: 60 * day, SentAgo: 60 * day}, // old pending
	)
	drivertest.OpsSeedInbox(t, env.db, env.d, tb.Inbox, 4, 8*day) // old inbox
	drivertest.OpsSeedInbox(t, env.db, env.d, tb.Inbox, 2, day)   // young inbox
	keep = slices.Concat(ids[1], ids[2], ids[3])
	slices.Sort(keep)
	return ids[0], keep
}

func TestJanitorDeletesOnDatabases(t *testing.T) {
	eachDatabase(t, func(t *testing.T, env dbEnv) {
		_, keep := seedMixed(t, env, 2500)
		var batches []janitor.Batch
		j, err := janitor.New(env.store, janitor.Config{Logger: quiet, BatchSize: 1000, BatchPause: time.Millisecond,
			OnBatch: func(b janitor.Batch) { batches = append(batches, b) }})
		if err != nil {
			t.Fatal(err)
		}
		res, err := j.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		want := janitor.Result{Sent: 2500, SentBatches: 3, Inbox: 4, InboxBatches: 1}
		if res != want {
			t.Errorf("result %+v, want %+v", res, want)
		}
		wantBatches := []janitor.Batch{{Target: janitor.Outbox, Rows: 1000}, {Target: janitor.Outbox, Rows: 1000}, {Target: janitor.Outbox, Rows: 500}, {Target: janitor.Inbox, Rows: 4}}
		if !reflect.DeepEqual(batches, wantBatches) {
			t.Errorf("batches %+v, want %+v", batches, wantBatches)
		}
		if got := drivertest.OpsIDs(t, env.db, testdb.Tables.Outbox); !reflect.DeepEqual(got, keep) {
			t.Errorf("outbox ids %v, want %v (young sent, old failed, old pending)", got, keep)
		}
		if n := drivertest.OpsCount(t, env.db, testdb.Tables.Inbox, ""); n != 2 {
			t.Errorf("inbox rows %d, want the 2 young ones", n)
		}
		// Nothing left to do: a second run removes nothing.
		res, err = j.RunOnce(context.Background())
		if err != nil || res != (janitor.Result{}) {
			t.Errorf("second run = %+v, %v; want nothing removed", res, err)
		}
	})
}

func TestJanitorArchivesOnDatabases(t *testing.T) {
	eachDatabase(t, func(t *testing.T, env dbEnv) {
		const archive = "outbox_event_archive"
		drivertest.CreateArchiveTable(t, env.db, env.d, testdb.Tables, archive)
		old, keep := seedMixed(t, env, 25)
		before := drivertest.OpsRows(t, env.db, testdb.Tables.Outbox, old)
		j, err := janitor.New(env.store, janitor.Config{Logger: quiet, BatchSize: 10, BatchPause: -1, ArchiveTable: archive})
		if err != nil {
			t.Fatal(err)
		}
		res, err := j.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		want := janitor.Result{Sent: 25, SentBatches: 3, Archived: true, Inbox: 4, InboxBatches: 1}
		if res != want {
			t.Errorf("result %+v, want %+v", res, want)
		}
		if got := drivertest.OpsIDs(t, env.db, testdb.Tables.Outbox); !reflect.DeepEqual(got, keep) {
			t.Errorf("outbox ids %v, want %v", got, keep)
		}
		after := drivertest.OpsRows(t, env.db, archive, old)
		if len(after) != len(old) || !reflect.DeepEqual(before, after) {
			t.Errorf("archived rows differ from the originals:\n before %v\n after  %v", before, after)
		}
		if n := drivertest.OpsCount(t, env.db, archive, "archived_at IS NULL"); n != 0 {
			t.Errorf("%d archived rows without archived_at", n)
		}
	})
}

// The janitor archives only into the table events.yaml declares.
func TestArchiveTableFromSchema(t *testing.T) {
	db := testdb.Open(t, "sqlite")
	for _, c := range []struct {
		archive, want string
	}{
		{"", `declares no sql.archive_table`},
		{"outbox_event_archive", `sql.archive_table in events.yaml is "outbox_event_archive"`},
	} {
		drv, err := sqldriver.New(db, testdb.SchemaWith(dialect.SQLite, outbox.Tables{Outbox: "outbox_event", Inbox: "outbox_inbox", Archive: c.archive}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := janitor.New(drv, janitor.Config{ArchiveTable: "old_rows"}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("archive %q: New = %v, want %q", c.archive, err, c.want)
		}
	}
}

// seedDuplicates inserts n rows of the inbox's duplicate record last seen
// ago ago.
func seedDuplicates(t *testing.T, env dbEnv, n int, ago time.Duration) {
	t.Helper()
	table := dialect.InboxDuplicateTable(testdb.Tables.Inbox)
	for i := range n {
		q := "INSERT INTO " + table + " (consumer, event_id, count, first_seen_at, last_seen_at) VALUES ('c', " +
			env.d.Placeholder(1) + ", 1, " + drivertest.OpsAgo(env.d, ago) + ", " + drivertest.OpsAgo(env.d, ago) + ")"
		if _, err := env.db.Exec(q, fmt.Sprintf("e-%s-%d", ago, i)); err != nil {
			t.Fatal(err)
		}
	}
}

// The janitor deletes the duplicate record's old rows with the inbox
// retention, in batches; on a database at schema version 1 (no such
// table) it skips them and succeeds.
func TestJanitorDeletesDuplicates(t *testing.T) {
	eachDatabase(t, func(t *testing.T, env dbEnv) {
		table := dialect.InboxDuplicateTable(testdb.Tables.Inbox)
		seedDuplicates(t, env, 3, 8*day)
		seedDuplicates(t, env, 2, day)
		var batches []janitor.Batch
		j, err := janitor.New(env.store, janitor.Config{Logger: quiet, BatchSize: 2,
			OnBatch: func(b janitor.Batch) { batches = append(batches, b) }})
		if err != nil {
			t.Fatal(err)
		}
		res, err := j.RunOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res.Duplicates != 3 || res.DuplicateBatches != 2 {
			t.Errorf("result %+v, want 3 duplicate rows deleted in 2 batches", res)
		}
		wantBatches := []janitor.Batch{{Target: janitor.InboxDuplicates, Rows: 2}, {Target: janitor.InboxDuplicates, Rows: 1}}
		if !reflect.DeepEqual(batches, wantBatches) {
			t.Errorf("batches %+v, want %+v", batches, wantBatches)
		}
		if n := drivertest.OpsCount(t, env.db, table, ""); n != 2 {
			t.Errorf("%d duplicate rows left, want the 2 young ones", n)
		}
		// Schema version 1: no duplicate table.
		if _, err := env.db.Exec("DROP TABLE " + table); err != nil {
			t.Fatal(err)
		}
		res, err = j.RunOnce(context.Background())
		if err != nil || res.Sent+res.Inbox+res.Duplicates != 0 || !strings.Contains(res.DuplicatesSkipped, "missing") {
			t.Errorf("run without the duplicate table = %+v, %v; want nothing removed, the table skipped as missing, no error", res, err)
		}
	})
}

// A janitor whose database user may not use the duplicate table (no
// privilege, or SELECT only) cleans the outbox and the inbox and skips
// the duplicate record, saying why once; it never fails the run.
func TestJanitorDuplicatesDenied(t *testing.T) {
	for _, name := range []string{"postgres", "mysql"} {
		for _, dupGrant := range []string{"", "SELECT"} {
			t.Run(name+"/"+map[string]string{"": "none", "SELECT": "select"}[dupGrant], func(t *testing.T) {
				d, err := dialect.Parse(name)
				if err != nil {
					t.Fatal(err)
				}
				dsn := testdb.DSN(t, name)
				admin, err := sql.Open(testdb.Driver(t, name), dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { admin.Close() })
				testdb.ApplySchema(t, admin, name, templates.DefaultTables)
				env := dbEnv{db: admin, d: d}
				seedDuplicates(t, env, 2, 8*day)
				out, in, dup := testdb.Tables.Outbox, testdb.Tables.Inbox, dialect.InboxDuplicateTable(testdb.Tables.Inbox)
				grants := []string{"GRANT SELECT, DELETE, UPDATE ON " + out + " TO {user}", "GRANT SELECT, DELETE, UPDATE ON " + in + " TO {user}",
					"GRANT SELECT ON " + dialect.VersionTable(out) + " TO {user}"}
				if dupGrant != "" {
					grants = append(grants, "GRANT "+dupGrant+" ON "+dup+" TO {user}")
				}
				limited, err := sql.Open(testdb.Driver(t, name), drivertest.LimitedUser(t, d, admin, dsn, grants...))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { limited.Close() })
				drv, err := sqldriver.New(limited, testdb.SchemaWith(d, archiveTables))
				if err != nil {
					t.Fatal(err)
				}
				var logs strings.Builder
				var mu sync.Mutex
				j, err := janitor.New(drv, janitor.Config{Logger: slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))})
				if err != nil {
					t.Fatal(err)
				}
				for range 2 {
					res, err := j.RunOnce(context.Background())
					if err != nil {
						t.Fatalf("run: %v", err)
					}
					if !strings.Contains(res.DuplicatesSkipped, "may not use the inbox's duplicate table") {
						t.Errorf("DuplicatesSkipped = %q", res.DuplicatesSkipped)
					}
				}
				mu.Lock()
				got := logs.String()
				mu.Unlock()
				if n := strings.Count(got, "duplicate deliveries' record skipped"); n != 1 || !strings.Contains(got, "level=WARN") {
					t.Errorf("the skipped table was logged %d times (want once, at WARN):\n%s", n, got)
				}
				if n := drivertest.OpsCount(t, admin, dup, ""); n != 2 {
					t.Errorf("%d duplicate rows, want the 2 left alone", n)
				}
			})
		}
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
