package bench

// BenchmarkLeaseAside: what the lease itself costs PostgreSQL, beside
// the ceilings a1 and a2 (row 1). a2's lease is an UPDATE of the row; at
// the DDL's fillfactor (100) it is never HOT, so it writes a new row
// version and an entry in each of the five indexes, while a1 writes one
// version, entered in two. a3 keeps the lease aside, in an UNLOGGED table
// (id, owner, expires_at, updated_at): each batch locks its rows (FOR NO
// KEY UPDATE SKIP LOCKED, no new version), inserts their leases there and
// commits; then marks them sent and deletes the leases (a second commit,
// as a2). An unlogged table is emptied by crash recovery and is empty on
// a promoted standby, which would end every lease at once: at worst
// duplicates, never a loss. The relay does not use it: a first port of
// the relay's claim and recording to such a table (not kept) cost the
// database more CPU per row than the index entries saved, since every
// candidate, head and recorded row then reads the lease table too. This
// measures the ceiling alone: what any relay could win by keeping its
// leases aside, against a1's single write per row.
//
//	go test ./bench -run '^$' -bench BenchmarkLeaseAside -benchtime 1x -args -rounds 3

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/outboxgen/outboxgen/internal/testdb"
)

// a3 is the ceiling of a lease kept aside (BenchmarkLeaseAside).
const a3 ceiling = "a3"

// leaseAsideTable creates a3's lease table.
func leaseAsideTable(b *testing.B, db *sql.DB) {
	b.Helper()
	if _, err := db.Exec(`CREATE UNLOGGED TABLE outbox_lease (id bigint PRIMARY KEY, owner varchar(64) NOT NULL,
		expires_at timestamptz NOT NULL, updated_at timestamptz NOT NULL)`); err != nil {
		b.Fatalf("create the lease table: %v", err)
	}
}

// leaseAsideBatch drains one batch with a3 and returns how many rows it
// took. A lease that lapsed is taken over; a live one is left alone.
func leaseAsideBatch(ctx context.Context, db *sql.DB, owner string) (int, error) {
	ids, err := readRows(ctx, db, `WITH c AS (
			SELECT o.id FROM outbox_event o
			WHERE o.status = 0 AND NOT EXISTS (SELECT 1 FROM outbox_lease l WHERE l.id = o.id AND l.expires_at >= now())
			ORDER BY o.id LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED),
		leased AS (
			INSERT INTO outbox_lease (id, owner, expires_at, updated_at)
			SELECT id, $1, now() + interval '30 seconds', now() FROM c
			ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at, updated_at = excluded.updated_at
			WHERE outbox_lease.expires_at < now()
			RETURNING id)
		SELECT `+rowCols+` FROM outbox_event WHERE id IN (SELECT id FROM leased)`, owner, ceilingBatch)
	if err != nil || len(ids) == 0 {
		return 0, err
	}
	_, err = db.ExecContext(ctx, `WITH sent AS (
			UPDATE outbox_event SET status = 1, sent_at = now(), updated_at = now()
			WHERE id = ANY(ARRAY(SELECT l.id FROM outbox_lease l WHERE l.id = ANY($1) AND l.owner = $2)) AND status = 0
			RETURNING id)
		DELETE FROM outbox_lease WHERE id = ANY(ARRAY(SELECT id FROM sent)) AND owner = $2`, ids, owner)
	return len(ids), err
}

func BenchmarkLeaseAside(b *testing.B) {
	srv := openServers(b)
	if srv.pg == nil {
		b.Skipf("%s is not set", testdb.PostgresEnv)
	}
	defer srv.restore(b)
	order := []ceiling{a1, a2, a3}
	var rs results
	for b.Loop() {
		for r := range *flagRounds {
			round := map[string]float64{}
			for i := range order {
				c := order[i]
				if r%2 == 1 {
					c = order[len(order)-1-i]
				}
				rate, cpu := runCeiling(b, srv, "postgres", c, *flagRows, 0)
				round[string(c)] = rate
				cpu.values(string(c), round)
			}
			rs = append(rs, round)
		}
	}
	pgDesc, _ := srv.describe(b)
	fmt.Printf("\nPostgreSQL %s backlog, %d rounds interleaved (%s):\n\n", count(*flagRows), len(rs), pgDesc)
	fmt.Printf("| ceiling | rows/s | CPU µs/row, process + rest of machine | a3 against it (ratios within a round) |\n|---|---|---|---|\n")
	for _, c := range order {
		own, _ := rs.med(string(c) + ".cpu_own_us")
		rest, _ := rs.med(string(c) + ".cpu_rest_us")
		against := "—"
		if c != a3 {
			against = rs.x(string(a3), string(c))
		}
		fmt.Printf("| %s | %s | %.0f + %.0f | %s |\n", c, rs.rate(string(c)), own, rest, against)
	}
}
