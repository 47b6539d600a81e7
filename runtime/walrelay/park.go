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
	query, args := r.q.UnsentKeys(r.cfg.MaxParkedKeys + 1)
	rows, err := r.pool.Query(ctx, query, args...)
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

// queries runs the parking statements (dialect.WALQueries: the SQL lives
// with every other statement on the outbox table, in
// runtime/dialect/sql/postgres.sql).
type queries struct{ *dialect.WALQueries }

// row is ev as the row it parks as, charged attempts and due after delay.
func row(ev *event, attempts int, lastError string, delay time.Duration) dialect.ParkedRow {
	return dialect.ParkedRow{ID: ev.Seq, EventID: ev.ID.String(), Type: ev.Type, Key: ev.Key, Topic: ev.Topic, Version: ev.Version,
		Payload: string(ev.Payload), Headers: ev.Headers, CreatedAt: ev.CreatedAt, Attempts: attempts, Delay: delay, LastError: lastError}
}

// park inserts ev as a pending row charged one failed attempt, due after
// delay.
func (q queries) park(ctx context.Context, pool *pgxpool.Pool, ev *event, lastError string, delay time.Duration) error {
	query, args := q.Park(row(ev, 1, lastError, delay))
	_, err := pool.Exec(ctx, query, args...)
	return err
}

// parkIfBlocked parks ev, due now, when its key has unsent rows, and
// reports whether it had.
func (q queries) parkIfBlocked(ctx context.Context, pool *pgxpool.Pool, ev *event) (bool, error) {
	var blocked bool
	query, args := q.ParkIfBlocked(row(ev, 0, "", 0))
	err := pool.QueryRow(ctx, query, args...).Scan(&blocked)
	return blocked, err
}
