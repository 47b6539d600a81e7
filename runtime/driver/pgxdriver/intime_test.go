package pgxdriver_test

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/internal/lagproxy"
	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/driver"
	"github.com/outboxgen/outboxgen/runtime/driver/pgxdriver"
)

// A claim with RecordInTime whose bytes reach the server after its
// context ended does not commit its recording (review helper-106). The
// relay records a failure beside another claim only by such a call, cut
// off before the failure's lease could lapse, since a claim beside it may
// lease the row again after that. pgxdriver sends the recording, the
// claim and their commit as one batch; a batch held up on the network
// past the deadline still ran and committed (pgx's cancel request found
// the server idle), and ended the row's new lease: "lease_owner <nil>,
// retry_count 1". Now the call's own transaction is committed only after
// its results came back.
func TestClaimRecordInTimeNotCommittedLate(t *testing.T) {
	ctx := context.Background()
	drv, base, db := openPgx(t)
	cc := base.Config().ConnConfig
	px := lagproxy.New(t, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	cfg := base.Config()
	host, port, _ := net.SplitHostPort(px.Addr())
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
	slow, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slow.Close)
	late, err := pgxdriver.New(slow, testdb.Schema(dialect.Postgres))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO outbox_event (event_id, biz_type, biz_id, topic, payload) VALUES (gen_random_uuid(), 'ORDER_PAID', 'x', 'orders', '{}'), (gen_random_uuid(), 'ORDER_PAID', 'y', 'orders', '{}')`); err != nil {
		t.Fatal(err)
	}
	rows, err := drv.Claim(ctx, driver.ClaimParams{Owner: "r1", Lease: 10 * time.Second, Limit: 10})
	if err != nil || len(rows) != 2 {
		t.Fatalf("claim: %d rows, %v", len(rows), err)
	}
	x, y := rows[0], rows[1]
	// The same call for y first, before the network slows: the slow
	// pool's connection then has the statements prepared, and sends the
	// next such batch in one write.
	for _, inTime := range []bool{false, true} {
		if _, err := late.Claim(ctx, driver.ClaimParams{Owner: "r1", Lease: 10 * time.Second, Limit: 10, RecordInTime: inTime,
			Record: &driver.Results{Failures: []driver.Failure{{Row: y, Error: "e", Delay: time.Minute}}, MaxAttempts: 10}}); err != nil {
			t.Fatal(err)
		}
	}
	px.SetLag(1500 * time.Millisecond)
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	_, err = late.Claim(cctx, driver.ClaimParams{Owner: "r1", Lease: 10 * time.Second, Limit: 10, RecordInTime: true,
		Record: &driver.Results{Failures: []driver.Failure{{Row: x, Error: "e", Delay: time.Minute}}, MaxAttempts: 10}})
	if err == nil {
		t.Fatal("the claim was not cut off")
	}
	// x's old lease lapsed meanwhile, and a claim beside leased it again.
	if _, err := db.ExecContext(ctx, `UPDATE outbox_event SET lease_owner = 'r1', lease_expires_at = now() + interval '10 seconds' WHERE id = $1`, x.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // the held bytes reach the server
	var owner *string
	var retries int
	if err := db.QueryRowContext(ctx, `SELECT lease_owner, retry_count FROM outbox_event WHERE id = $1`, x.ID).Scan(&owner, &retries); err != nil {
		t.Fatal(err)
	}
	if owner == nil || retries != 0 {
		t.Fatalf("the cut-off claim's recording committed after its deadline and ended the new lease: lease_owner %v, retry_count %d", owner, retries)
	}
}
