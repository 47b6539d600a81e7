package driverutil

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/runtime/dialect"
)

func TestTime(t *testing.T) {
	want := time.Date(2024, 5, 6, 7, 8, 9, 123000000, time.UTC)
	for _, src := range []any{want, want.In(time.FixedZone("x", 3600)), "2024-05-06 07:08:09.123", []byte("2024-05-06 07:08:09.123000"), "2024-05-06T07:08:09.123Z"} {
		var v Time
		if err := v.Scan(src); err != nil || !v.T.Equal(want) || v.T.Location() != time.UTC {
			t.Errorf("Scan(%v) = %v, %v", src, v.T, err)
		}
	}
	var v Time
	if err := v.Scan(nil); err != nil || !v.T.IsZero() {
		t.Errorf("Scan(nil) = %v, %v", v.T, err)
	}
	if err := v.Scan(42); err == nil {
		t.Error("Scan(int) succeeded")
	}
}

func TestChunks(t *testing.T) {
	ids := make([]int64, 2*dialect.MaxInList+1)
	var sizes []int
	_ = Chunks(ids, func(p []int64) error { sizes = append(sizes, len(p)); return nil })
	if len(sizes) != 3 || sizes[0] != dialect.MaxInList || sizes[2] != 1 {
		t.Fatalf("chunk sizes %v", sizes)
	}
}

func TestRelayQueriesMemo(t *testing.T) {
	m, err := NewRelayQueries(dialect.Postgres, "outbox_event", false)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := m.Get([]string{"B", "A", "A"})
	b, _ := m.Get([]string{"A", "B"})
	c, _ := m.Get(nil)
	if a != b || a == c {
		t.Fatal("memo must key on the sorted set")
	}
	if _, err := NewRelayQueries(dialect.Postgres, "bad name", false); err == nil {
		t.Fatal("bad table accepted")
	}
}

// fakeRows counts rows read and Close calls; closeErr selects the
// database/sql shape (Close() error) over pgx's (Close()).
type fakeRows struct {
	left, closed int
	err          error
}

func (r *fakeRows) Next() bool { r.left--; return r.left >= 0 }
func (r *fakeRows) Err() error { return r.err }

type sqlRows struct{ *fakeRows }

func (r sqlRows) Close() error { r.closed++; return nil }

type pgxRows struct{ *fakeRows }

func (r pgxRows) Close() { r.closed++ }

// ProbeQuery reads every row, closes the rows of either driver shape and
// returns their error.
func TestProbeQuery(t *testing.T) {
	errRows := errors.New("rows failed")
	f := &fakeRows{left: 3, err: errRows}
	probe := ProbeQuery(func(context.Context, string, ...any) (sqlRows, error) { return sqlRows{f}, nil })
	if err := probe(context.Background(), "q"); err != errRows || f.left >= 0 || f.closed != 1 {
		t.Errorf("database/sql shape: %v, %d left, closed %d times", err, f.left, f.closed)
	}
	g := &fakeRows{left: 2}
	probe = ProbeQuery(func(context.Context, string, ...any) (pgxRows, error) { return pgxRows{g}, nil })
	if err := probe(context.Background(), "q"); err != nil || g.left >= 0 || g.closed != 1 {
		t.Errorf("pgx shape: %v, %d left, closed %d times", err, g.left, g.closed)
	}
	errQuery := errors.New("query failed")
	probe = ProbeQuery(func(context.Context, string, ...any) (pgxRows, error) { return pgxRows{}, errQuery })
	if err := probe(context.Background(), "q"); err != errQuery {
		t.Errorf("failed query: %v", err)
	}
}

// deadlockOnce is a Querier whose first transaction fails as the database
// fails one side of a deadlock, after running f; later ones run f and
// commit. It counts the statements of the committed transaction.
type deadlockOnce struct {
	txs, stmts int
	kinds      []string // of the last transaction's statements: "exec" or "query"
}

type deadlockErr struct{}

func (deadlockErr) Error() string    { return "ERROR: deadlock detected (SQLSTATE 40P01)" }
func (deadlockErr) SQLState() string { return "40P01" }

type noRows struct{}

func (noRows) Next() bool        { return false }
func (noRows) Scan(...any) error { return nil }
func (noRows) Err() error        { return nil }
func (noRows) Close()            {}

func (q *deadlockOnce) Query(context.Context, string, ...any) (Rows, error) {
	q.stmts++
	q.kinds = append(q.kinds, "query")
	return noRows{}, nil
}

func (q *deadlockOnce) Exec(context.Context, string, ...any) (int64, error) {
	q.stmts++
	q.kinds = append(q.kinds, "exec")
	return 1, nil
}

func (q *deadlockOnce) InTx(ctx context.Context, f func(tx Querier) error) error {
	q.txs++
	q.stmts, q.kinds = 0, nil
	if err := f(q); err != nil {
		return err
	}
	if q.txs == 1 {
		return deadlockErr{}
	}
	return nil
}

// TestRequeueRetriesDeadlock: a requeue the database rolled back for a
// deadlock (two requeues of one key lock its rows in turn) is run again.
func TestRequeueRetriesDeadlock(t *testing.T) {
	rq, err := NewRelayQueries(dialect.Postgres, "outbox_event", false)
	if err != nil {
		t.Fatal(err)
	}
	q := &deadlockOnce{}
	a := &Admin{What: "test", Q: q, Relay: rq}
	n, released, err := a.RequeueAndRelease(context.Background(), []int64{7})
	if err != nil || n != 1 || released != 1 {
		t.Fatalf("RequeueAndRelease = %d, %d, %v; want 1, 1, nil after one retry", n, released, err)
	}
	if got := strings.Join(q.kinds, ", "); q.txs != 2 || got != "exec, query, exec" {
		t.Fatalf("%d transactions, the last of %s; want 2 (one retry), the last of exec, query, exec (requeue, lock the keys' rows, release)", q.txs, got)
	}
}
