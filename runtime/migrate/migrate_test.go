package migrate_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/sqldriver"
	"github.com/outboxgen/outboxgen/runtime/migrate"
	"github.com/outboxgen/outboxgen/runtime/outbox"
	"github.com/outboxgen/outboxgen/runtime/relay"
	"github.com/outboxgen/outboxgen/templates"
)

var tables = outbox.Tables{Outbox: "shop_outbox", Inbox: "shop_inbox"}

// latest is the version of outboxgen's latest migration: the test
// migrations in testdata follow it.
var latest = templates.Builtin().Latest().Version

// withTest returns outboxgen's migrations (1 to 3) plus the test
// migrations in testdata: version 4 (additive, CompatibleFrom 1) and, with
// breaking, version 5 (CompatibleFrom 5).
func withTest(t *testing.T, breaking bool) *templates.MigrationSet {
	t.Helper()
	infos := []templates.MigrationInfo{{Version: 4, Name: "test_trace_id", CompatibleFrom: 1}}
	files := []string{"test_migration.sql.tmpl"}
	if breaking {
		infos = append(infos, templates.MigrationInfo{Version: 5, Name: "test_tenant", CompatibleFrom: 5})
		files = append(files, "breaking_migration.sql.tmpl")
	}
	set, err := templates.Builtin().Extend(infos, os.DirFS("testdata"), files...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// version1 returns outboxgen's first migration only: what an outboxgen
// before migration 2 (the inbox's duplicate table) migrated with.
func version1(t *testing.T) *templates.MigrationSet {
	t.Helper()
	set, err := templates.Builtin().Until(1)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// hasDuplicateTable reports whether migration 2's table exists.
func hasDuplicateTable(db *sql.DB) bool {
	_, err := db.Exec(dialect.SelectColumns(dialect.InboxDuplicateTable(tables.Inbox), dialect.InboxDuplicateColumns))
	return err == nil
}

// applyLegacy creates the tables as outboxgen's DDL did before versioned
// migrations: migration 1 without its version record.
func applyLegacy(t *testing.T, db *sql.DB, d string) {
	t.Helper()
	ms, err := templates.RenderMigrations(d, templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox}, templates.Header{})
	if err != nil {
		t.Fatal(err)
	}
	all, record := ms[0].Statements(), templates.Statements(ms[0].Record)
	if !slices.Equal(all[len(all)-len(record):], record) {
		t.Fatal("migration 1 does not end with its version record")
	}
	for _, stmt := range all[:len(all)-len(record)] {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("%v\n%s", err, stmt)
		}
	}
}

// broker is a GoChannel with a subscriber per topic counting deliveries.
type broker struct {
	pub  *gochannel.GoChannel
	mu   sync.Mutex
	seen map[string]int // event id -> deliveries
}

func newBroker(t *testing.T, topics ...string) *broker {
	b := &broker{pub: gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 1000}, watermill.NopLogger{}), seen: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); b.pub.Close() })
	for _, topic := range topics {
		ch, err := b.pub.Subscribe(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		go func(ch <-chan *message.Message) {
			for m := range ch {
				b.mu.Lock()
				b.seen[m.UUID]++
				b.mu.Unlock()
				m.Ack()
			}
		}(ch)
	}
	return b
}

func (b *broker) deliveries() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]int{}
	for k, v := range b.seen {
		out[k] = v
	}
	return out
}

// writeEvents inserts n events and returns their ids.
func writeEvents(t *testing.T, db *sql.DB, d dialect.Dialect, prefix string, n int) []string {
	t.Helper()
	w, err := outbox.NewWriter(outbox.Dialect(d), tables.Outbox)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range n {
		id, err := w.Insert(context.Background(), db, outbox.Event{
			Type: "ORDER_PAID", Topic: "orders", Key: fmt.Sprintf("%s-%d", prefix, i%3), Version: 1,
			Payload: map[string]any{"n": i, "batch": prefix},
		})
		if err != nil {
			t.Fatalf("insert: %v", err)
		}
		ids = append(ids, id.String())
	}
	return ids
}

// relayAll runs a relay on db until no row is pending; its start-up check
// must pass.
func relayAll(t *testing.T, db *sql.DB, d dialect.Dialect, b *broker) {
	t.Helper()
	drv, err := sqldriver.New(db, testdb.SchemaWith(d, tables))
	if err != nil {
		t.Fatal(err)
	}
	if err := drv.Check(context.Background(), driver.Outbox); err != nil {
		t.Fatalf("start-up check: %v", err)
	}
	r, err := relay.New(drv, relay.Config{Publisher: b.pub, InstanceID: "migrate-test", LeaseDuration: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for pending(t, db) > 0 {
		if _, err := r.RunOnce(context.Background()); err != nil {
			t.Fatalf("relay: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d rows still pending", pending(t, db))
		}
	}
}

func pending(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + tables.Outbox + " WHERE status <> 1").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestUpKeepsEverything: tables at version 1 (created by migrate, or by
// the DDL of before versioned migrations), rows written and relayed, rows
// written and not yet relayed; then migrate up through outboxgen's
// migrations 2 (the inbox's duplicate table) and 3 (MySQL's claim index)
// to the test migration: nothing is lost, the relay sends the rest, and
// new rows go through.
func TestUpKeepsEverything(t *testing.T) {
	for _, d := range testdb.Dialects() {
		for _, start := range []string{"migrated", "legacy"} {
			t.Run(d+"/"+start, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := testdb.Open(t, d)
				dia := dialect.Dialect(d)
				if start == "migrated" {
					r, err := migrate.Up(ctx, db, dia, tables, migrate.WithMigrations(version1(t)))
					if err != nil {
						t.Fatal(err)
					}
					if r.From != 0 || r.To != 1 || len(r.Applied) != 1 || r.Applied[0].File != "0001_outbox_tables.up.sql" {
						t.Fatalf("first Up: %+v", r)
					}
				} else {
					applyLegacy(t, db, d)
					s, err := migrate.Status(ctx, db, dia, tables)
					if err != nil {
						t.Fatal(err)
					}
					if s.Current != 1 || !s.Unrecorded || s.Runtime != "ok" {
						t.Fatalf("legacy status: %+v", s)
					}
				}
				b := newBroker(t, "orders")
				sent := writeEvents(t, db, dia, "before", 12)
				relayAll(t, db, dia, b) // the start-up check accepts version 1
				waiting := writeEvents(t, db, dia, "waiting", 9)
				if hasDuplicateTable(db) {
					t.Fatal("the duplicate table exists at version 1")
				}

				r, err := migrate.Up(ctx, db, dia, tables, migrate.WithMigrations(withTest(t, false)))
				if err != nil {
					t.Fatalf("Up: %v\n%s", err, r)
				}
				if r.From != 1 || r.To != 4 || len(r.Applied) != 3 || r.Applied[0].File != "0002_inbox_duplicates.up.sql" ||
					r.Applied[1].File != "0003_claim_index_keys.up.sql" || r.Applied[2].Version != 4 || r.Baselined != (start == "legacy") {
					t.Fatalf("Up report: %+v", r)
				}
				t.Logf("Up:\n%s", r)
				if !hasDuplicateTable(db) {
					t.Fatal("migration 2 did not create the inbox's duplicate table")
				}
				if _, err := db.Exec("SELECT trace_id FROM " + tables.Outbox + " WHERE 1 = 0"); err != nil {
					t.Fatalf("migration 4 not applied: %v", err)
				}
				// Up again: nothing to do.
				again, err := migrate.Up(ctx, db, dia, tables, migrate.WithMigrations(withTest(t, false)))
				if err != nil || again.Changed() || again.To != 4 {
					t.Fatalf("second Up: %+v, %v", again, err)
				}

				after := writeEvents(t, db, dia, "after", 7)
				relayAll(t, db, dia, b) // versions 2 to 4 are compatible from 1: accepted

				var rows int
				if err := db.QueryRow("SELECT COUNT(*) FROM " + tables.Outbox + " WHERE status = 1").Scan(&rows); err != nil {
					t.Fatal(err)
				}
				all := slices.Concat(sent, waiting, after)
				if rows != len(all) {
					t.Errorf("%d sent rows, want %d", rows, len(all))
				}
				waitDeliveries(t, b, all)

				s, err := migrate.Status(ctx, db, dia, tables, migrate.WithMigrations(withTest(t, false)))
				if err != nil {
					t.Fatal(err)
				}
				if s.Current != 4 || s.Unrecorded || len(s.Pending) != 0 || len(s.Recorded) != 4 || s.Runtime != "ok" {
					t.Errorf("status after Up: %+v", s)
				}
			})
		}
	}
}

func waitDeliveries(t *testing.T, b *broker, ids []string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := b.deliveries()
		missing, twice := 0, 0
		for _, id := range ids {
			switch got[id] {
			case 0:
				missing++
			case 1:
			default:
				twice++
			}
		}
		if missing == 0 {
			if twice > 0 {
				t.Errorf("%d events delivered more than once", twice)
			}
			if len(got) != len(ids) {
				t.Errorf("%d events delivered, want %d", len(got), len(ids))
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d events never delivered", missing, len(ids))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCheckRefusesNewerSchema: a database migrated by a newer outboxgen
// to a version this runtime cannot use is refused at start-up, with the
// advice; an additive newer version is accepted.
func TestCheckRefusesNewerSchema(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, d)
			dia := dialect.Dialect(d)
			if _, err := migrate.Up(ctx, db, dia, tables, migrate.WithMigrations(withTest(t, true))); err != nil {
				t.Fatal(err)
			}
			drv, err := sqldriver.New(db, testdb.SchemaWith(dia, tables))
			if err != nil {
				t.Fatal(err)
			}
			err = drv.Check(ctx, driver.Outbox)
			if err == nil {
				t.Fatal("Check accepted schema version 5 (compatible from 5)")
			}
			t.Logf("Check: %v", err)
			for _, want := range []string{"schema version 5", "knows version 5 or later", "upgrade github.com/outboxgen/outboxgen"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Check error lacks %q: %v", want, err)
				}
			}
			s, err := migrate.Status(ctx, db, dia, tables)
			if err != nil {
				t.Fatal(err)
			}
			if s.Current != 5 || s.Runtime != "upgrade" || len(s.Pending) != 0 {
				t.Errorf("status: %+v", s)
			}
			t.Logf("status of a newer database:\n%s", s)
			// migrate up from this outboxgen changes nothing.
			r, err := migrate.Up(ctx, db, dia, tables)
			if err != nil || r.Changed() || !strings.Contains(r.String(), fmt.Sprintf("newer than the %d this outboxgen knows", dialect.SchemaVersion)) {
				t.Errorf("Up on a newer database: %v, %v", r, err)
			}
		})
	}
}

// TestStatus: the text for people, before and after Up.
func TestStatus(t *testing.T) {
	ctx := context.Background()
	db := testdb.Open(t, "sqlite")
	s, err := migrate.Status(ctx, db, dialect.SQLite, tables)
	if err != nil {
		t.Fatal(err)
	}
	text := s.String()
	for _, want := range []string{"version:    none", "0001_outbox_tables.up.sql        pending", "0002_inbox_duplicates.up.sql     pending", "0003_claim_index_keys.up.sql     pending",
		fmt.Sprintf("pending:    %d (run: outboxgen migrate -db DSN up)", latest)} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}
	r, err := migrate.Up(ctx, db, dialect.SQLite, tables)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.String(), "applied 0001_outbox_tables.up.sql (version 1, ") || !strings.Contains(r.String(), "applied 0002_inbox_duplicates.up.sql (version 2, ") ||
		!strings.Contains(r.String(), "applied 0003_claim_index_keys.up.sql (version 3, ") {
		t.Errorf("report:\n%s", r)
	}
	s, err = migrate.Status(ctx, db, dialect.SQLite, tables)
	if err != nil {
		t.Fatal(err)
	}
	text = s.String()
	for _, want := range []string{fmt.Sprintf("version:    %d, recorded in shop_outbox_version (usable by runtimes that know version 1 or later)", latest),
		fmt.Sprintf("this outboxgen runs on versions 1 to %d: compatible", dialect.SchemaVersion),
		"0001_outbox_tables.up.sql        applied 20", "0002_inbox_duplicates.up.sql     applied 20", "0003_claim_index_keys.up.sql     applied 20", "pending:    none"} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}
	if s.Recorded[0].AppliedAt.IsZero() || time.Since(s.Recorded[0].AppliedAt) > time.Hour {
		t.Errorf("applied_at = %v", s.Recorded[0].AppliedAt)
	}
}

// TestConcurrentUp: several processes migrating one database at once
// apply each migration exactly once, and all succeed.
func TestConcurrentUp(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			dsn := testdb.DSN(t, d)
			dia := dialect.Dialect(d)
			set := withTest(t, false)
			const n = 4
			reports := make([]migrate.Report, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				db, err := sql.Open(testdb.Driver(t, d), dsn)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { db.Close() })
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					reports[i], errs[i] = migrate.Up(context.Background(), db, dia, tables, migrate.WithMigrations(set))
				}()
			}
			close(start)
			wg.Wait()
			applied := map[int]int{}
			for i := range n {
				if errs[i] != nil {
					t.Errorf("Up %d: %v", i, errs[i])
				}
				for _, a := range reports[i].Applied {
					applied[a.Version]++
				}
			}
			if applied[1] != 1 || applied[2] != 1 || applied[3] != 1 || applied[4] != 1 || len(applied) != 4 {
				t.Errorf("migrations applied (version: times) %v, want each once", applied)
			}
			db, err := sql.Open(testdb.Driver(t, d), dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var rows, maxVersion int
			if err := db.QueryRow("SELECT COUNT(*), MAX(version) FROM "+dialect.VersionTable(tables.Outbox)).Scan(&rows, &maxVersion); err != nil {
				t.Fatal(err)
			}
			if rows != 4 || maxVersion != 4 {
				t.Errorf("version table: %d rows, max %d", rows, maxVersion)
			}
		})
	}
}

// TestFailedMigration: a migration failing at its second statement is
// rolled back entirely on PostgreSQL and SQLite; on MySQL, whose DDL
// commits itself, the first statement stays and the error says so. Either
// way the version stays outboxgen's latest (its migrations before it
// applied).
func TestFailedMigration(t *testing.T) {
	for _, d := range testdb.Dialects() {
		t.Run(d, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testdb.Open(t, d)
			dia := dialect.Dialect(d)
			set, err := templates.Builtin().Extend([]templates.MigrationInfo{{Version: 4, Name: "test_fails", CompatibleFrom: 1}}, os.DirFS("testdata"), "failing_migration.sql.tmpl")
			if err != nil {
				t.Fatal(err)
			}
			r, err := migrate.Up(ctx, db, dia, tables, migrate.WithMigrations(set))
			if err == nil {
				t.Fatal("Up succeeded")
			}
			t.Logf("Up: %v", err)
			if r.To != latest || len(r.Applied) != latest {
				t.Errorf("report: %+v", r)
			}
			want := "failed at statement 2 of 4, and was rolled back (nothing of it is applied)"
			if d == "mysql" {
				want = "MySQL commits each DDL statement: statements 1 to 1 are applied and the version is not recorded"
			}
			if !strings.Contains(err.Error(), "migration 0004_test_fails.up.sql") || !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q: %v", want, err)
			}
			_, colErr := db.Exec("SELECT half_done FROM " + tables.Outbox + " WHERE 1 = 0")
			if (colErr == nil) != (d == "mysql") {
				t.Errorf("first statement applied: %v", colErr == nil)
			}
			s, err := migrate.Status(ctx, db, dia, tables, migrate.WithMigrations(set))
			if err != nil || s.Current != latest || len(s.Pending) != 1 {
				t.Errorf("status: %+v, %v", s, err)
			}
		})
	}
}

// TestUpCreatesArchive: an archive table declared after the tables were
// created is created by up, and said so.
func TestUpCreatesArchive(t *testing.T) {
	for _, d := range []string{"sqlite", "postgres"} {
		t.Run(d, func(t *testing.T) {
			ctx := context.Background()
			db := testdb.Open(t, d)
			dia := dialect.Dialect(d)
			if _, err := migrate.Up(ctx, db, dia, tables); err != nil {
				t.Fatal(err)
			}
			withArchive := tables
			withArchive.Archive = "shop_archive"
			r, err := migrate.Up(ctx, db, dia, withArchive)
			if err != nil || r.ArchiveCreated != "shop_archive" || len(r.Applied) != 0 || !strings.Contains(r.String(), "created the archive table shop_archive (sql.archive_table)") {
				t.Fatalf("Up: %+v, %v", r, err)
			}
			if _, err := db.Exec("SELECT " + strings.Join(dialect.OutboxColumns, ", ") + ", archived_at FROM shop_archive WHERE 1 = 0"); err != nil {
				t.Fatal(err)
			}
			if r, err := migrate.Up(ctx, db, dia, withArchive); err != nil || r.Changed() {
				t.Errorf("second Up: %+v, %v", r, err)
			}
		})
	}
}

// TestPartialTables: some of the version-1 tables without a version table
// is neither a new nor a version-1 database: Up refuses and changes
// nothing.
func TestPartialTables(t *testing.T) {
	ctx := context.Background()
	db := testdb.Open(t, "sqlite")
	ms, err := templates.RenderMigrations("sqlite", templates.Tables{Outbox: tables.Outbox, Inbox: tables.Inbox}, templates.Header{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ms[0].Statements()[0]); err != nil { // the outbox table only
		t.Fatal(err)
	}
	r, err := migrate.Up(ctx, db, dialect.SQLite, tables)
	if err == nil || !strings.Contains(err.Error(), "the database has shop_outbox but not shop_inbox, shop_inbox_key") || r.Changed() {
		t.Fatalf("Up: %+v, %v", r, err)
	}
	if _, err := migrate.Status(ctx, db, dialect.SQLite, tables); err == nil {
		t.Error("Status accepted partial tables")
	}
}
