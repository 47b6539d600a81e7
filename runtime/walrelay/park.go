package walrelay

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/runtime/dialect"
)

// parkedKeys remembers the keys that may have unsent rows (pending or
// FAILED) in the outbox table. Their events are checked against the table
// before they are streamed. It is loaded when streaming starts and grows
// as events are parked; above MaxParkedKeys it gives up remembering and
// every event is checked (checkAll).
type parkedKeys struct {
	mu       sync.Mutex
	keys     map[string]bool
	max      int
	checkAll bool
}

func (p *parkedKeys) mayHave(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.checkAll || p.keys[key]
}

func (p *parkedKeys) add(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.checkAll {
		return
	}
	p.keys[key] = true
	if len(p.keys) > p.max {
		p.checkAll = true
		p.keys = nil
	}
}

func (p *parkedKeys) remove(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.keys, key)
}

func (p *parkedKeys) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.keys)
}

// loadParked reads the keys with unsent rows (at most MaxParkedKeys).
func (r *Relay) loadParked(ctx context.Context) (*parkedKeys, error) {
	p := &parkedKeys{keys: map[string]bool{}, max: r.cfg.MaxParkedKeys}
	rows, err := r.pool.Query(ctx, r.q.unsentKeys, r.cfg.MaxParkedKeys+1)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		p.keys[k] = true
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(p.keys) > p.max {
		p.checkAll, p.keys = true, nil
	}
	return p, nil
}

// queries are the statements of parking, bound to the outbox table.
type queries struct {
	unsentKeys       string
	parkSQL          string
	parkIfBlockedSQL string
}

// parkColumns are the columns a parked row sets: the event as the writer
// would have inserted it, with the id taken from the same identity
// sequence at write time (so outbox_seq is unchanged and the polling
// relay's per-key id order is the stream's order), the creation time of
// the writing transaction, and the retry state.
const parkColumns = "id, event_id, biz_type, biz_id, topic, payload_version, payload, headers, created_at, retry_count, next_retry_time, last_error"

const parkValues = "$1::bigint, $2::uuid, $3::text, $4::text, $5::text, $6::int, $7::text::json, $8::text::json, $9::timestamptz, $10::int, now() + $11::bigint * interval '1 microsecond', $12::text"

func newQueries(table string) queries {
	return queries{
		// Keys with rows not sent (pending or FAILED), through the partial
		// index (biz_id, id) WHERE status <> 1.
		unsentKeys: "SELECT DISTINCT biz_id FROM " + table + " WHERE status <> 1 LIMIT $1",
		// An event whose publish kept failing. ON CONFLICT: parked already
		// by an earlier stream of the same events (restart).
		parkSQL: "INSERT INTO " + table + " (" + parkColumns + ") VALUES (" + parkValues + ") ON CONFLICT DO NOTHING",
		// An event of a key remembered as parked: parked too while the key
		// has unsent rows, in the same statement that checks it, so the
		// polling relay marking the last row sent cannot slip between the
		// check and the insert: either the check sees the row unsent and the
		// event goes behind it, or it sees it sent (so published) and the
		// event streams after it. It returns whether the key was blocked.
		parkIfBlockedSQL: "WITH blocked AS (SELECT EXISTS (SELECT 1 FROM " + table + " WHERE biz_id = $4::text AND status <> 1) AS b), " +
			"ins AS (INSERT INTO " + table + " (" + parkColumns + ") SELECT " + parkValues + " FROM blocked WHERE b ON CONFLICT DO NOTHING) " +
			"SELECT b FROM blocked",
	}
}

func (q queries) args(ev *event, retry int, lastError string, delay time.Duration) []any {
	var headers any
	if len(ev.Headers) > 0 {
		headers = string(ev.Headers)
	}
	var le any
	if lastError != "" {
		le = dialect.TruncateError(lastError)
	}
	return []any{ev.Seq, ev.ID.String(), ev.Type, ev.Key, ev.Topic, ev.Version, string(ev.Payload), headers, ev.CreatedAt, retry, delay.Microseconds(), le}
}

// park inserts ev as a pending row charged one failed attempt, due after
// delay.
func (q queries) park(ctx context.Context, pool *pgxpool.Pool, ev *event, lastError string, delay time.Duration) error {
	_, err := pool.Exec(ctx, q.parkSQL, q.args(ev, 1, lastError, delay)...)
	return err
}

// parkIfBlocked parks ev, due now, when its key has unsent rows, and
// reports whether it had.
func (q queries) parkIfBlocked(ctx context.Context, pool *pgxpool.Pool, ev *event) (bool, error) {
	var blocked bool
	err := pool.QueryRow(ctx, q.parkIfBlockedSQL, q.args(ev, 0, "", 0)...).Scan(&blocked)
	return blocked, err
}
