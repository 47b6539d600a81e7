package dialect

// This file binds the statements the WAL relay (runtime/walrelay) sends on
// the outbox table: finding the keys with unsent rows when streaming
// starts, and parking an event the stream could not publish. Their text is
// in sql/postgres.sql (the WAL* names): WAL mode is PostgreSQL's.

import (
	"fmt"
	"time"
)

// The WAL relay's statements (see sql/postgres.sql).
var (
	sWALUnsentKeys    = define(needWAL, "WALUnsentKeys", "max_rows")
	sWALPark          = define(needWAL, "WALPark", walParkArgs...)
	sWALParkIfBlocked = define(needWAL, "WALParkIfBlocked", walParkArgs...)
)

var walParkArgs = []string{"id", "event_id", "biz_type", "biz_id", "topic", "payload_version", "payload", "headers",
	"created_at", "retry_count", "delay", "last_error"}

// WALQueries holds the WAL relay's statements for one outbox table. Build
// it once with NewWALQueries; it is immutable and safe for concurrent use.
type WALQueries struct {
	set *stmtSet
}

// NewWALQueries returns the WAL relay's statements for outbox table outbox
// on dialect d, which must be PostgreSQL.
func NewWALQueries(d Dialect, outbox string) (*WALQueries, error) {
	s := specOf(d)
	if s == nil {
		return nil, errUnknown(d)
	}
	if !s.wal {
		return nil, fmt.Errorf("WAL mode needs PostgreSQL (logical decoding), not %s", d)
	}
	if err := CheckIdentifier("outbox table name", outbox); err != nil {
		return nil, err
	}
	return &WALQueries{set: s.statements(tables{outbox: outbox})}, nil
}

// UnsentKeys returns at most limit keys with rows not sent (pending or
// FAILED), through the per-key index on the unsent rows.
func (q *WALQueries) UnsentKeys(limit int) (string, []any) {
	return q.set.get(sWALUnsentKeys).render(limit)
}

// ParkedRow is an event the stream parks into the outbox table: the row
// the writer would have inserted, with the id its outbox_seq (taken from
// the table's sequence at write time) and the retry state.
type ParkedRow struct {
	ID        int64
	EventID   string
	Type, Key string
	Topic     string
	Version   int
	Payload   string
	Headers   []byte // nil: none
	CreatedAt time.Time
	// Attempts is retry_count; Delay when it is due; LastError, when
	// set, is truncated to the column's bound.
	Attempts  int
	Delay     time.Duration
	LastError string
}

func (r ParkedRow) args() []any {
	var headers, lastError any
	if len(r.Headers) > 0 {
		headers = string(r.Headers)
	}
	if r.LastError != "" {
		lastError = TruncateError(r.LastError)
	}
	return []any{r.ID, r.EventID, r.Type, r.Key, r.Topic, r.Version, r.Payload, headers, r.CreatedAt, r.Attempts, r.Delay, lastError}
}

// Park inserts r as a pending row. ON CONFLICT DO NOTHING: an event parked
// already by an earlier stream of the same events (a restart) stays as it
// is.
func (q *WALQueries) Park(r ParkedRow) (string, []any) {
	return q.set.get(sWALPark).render(r.args()...)
}

// ParkIfBlocked parks r when its key has unsent rows, in the statement
// that checks it, and returns one row: whether the key had. One statement,
// so that the polling relay marking the key's last row sent cannot slip
// between the check and the insert: either the check sees the row unsent
// and the event goes behind it, or it sees it sent (so published) and the
// event streams after it.
func (q *WALQueries) ParkIfBlocked(r ParkedRow) (string, []any) {
	return q.set.get(sWALParkIfBlocked).render(r.args()...)
}
