package pgxdriver

// LISTEN/NOTIFY: Driver implements driver.Notifier, so a relay on it polls
// as soon as a writer in any process commits events with Notify, instead
// of at its next PollInterval.

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxgen/outboxgen/runtime/dialect"
	"github.com/outboxgen/outboxgen/runtime/outbox"
)

// listener owns the dedicated LISTEN connection. One waiter at a time reads
// the connection; concurrent waiters wait for that reader's result.
type listener struct {
	pool  *pgxpool.Pool
	table string

	mu      sync.Mutex
	conn    *pgx.Conn     // nil until the first wait, and after an error
	reading bool          // a waiter is reading conn
	done    chan struct{} // closed when the current reader returns
}

func (l *listener) init(pool *pgxpool.Pool, table string) {
	l.pool, l.table = pool, table
	l.done = make(chan struct{})
}

// WaitForNotification blocks until a writer notifies the outbox table's
// channel (see Notify), ctx is done, or the connection fails. It also
// returns nil right after (re)connecting, because rows may have been
// committed while nobody listened; spurious wake-ups are harmless (the
// relay just polls).
//
// The first call opens a dedicated connection with the pool's
// configuration (outside the pool, so it takes no pool slot) and runs
// LISTEN; the connection is kept between calls, so notifications that
// arrive between them are not lost, and is closed when a call returns
// because its ctx is done or on an error (the next call reconnects).
// Concurrent callers are safe: one reads the connection, the others wake
// when it returns.
func (x *Driver) WaitForNotification(ctx context.Context) error {
	return x.listen.wait(ctx)
}

func (l *listener) wait(ctx context.Context) error {
	l.mu.Lock()
	if err := ctx.Err(); err != nil {
		if !l.reading && l.conn != nil { // done: drop the idle connection too
			l.conn.Close(context.Background())
			l.conn = nil
		}
		l.mu.Unlock()
		return err
	}
	if l.reading {
		done := l.done
		l.mu.Unlock()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	l.reading = true
	conn := l.conn
	l.mu.Unlock()

	err := l.read(ctx, &conn)

	l.mu.Lock()
	l.conn = conn
	l.reading = false
	close(l.done)
	l.done = make(chan struct{})
	l.mu.Unlock()
	return err
}

// read waits for one notification on *conn, connecting first when it is
// nil; on return *conn is the connection to keep (nil when closed).
func (l *listener) read(ctx context.Context, conn **pgx.Conn) error {
	if *conn == nil {
		c, err := pgx.ConnectConfig(ctx, l.pool.Config().ConnConfig.Copy())
		if err != nil {
			return fmt.Errorf("pgxdriver: listen: connect: %w", err)
		}
		if _, err := c.Exec(ctx, dialect.Listen(l.table)); err != nil {
			c.Close(context.Background())
			return fmt.Errorf("pgxdriver: listen: %w", err)
		}
		*conn = c
		return nil // rows may have arrived while nobody listened
	}
	_, err := (*conn).WaitForNotification(ctx)
	if err == nil {
		return nil
	}
	// Cancelled or broken: close the connection either way (the next
	// call starts afresh); a cancelled wait leaves nothing to keep.
	(*conn).Close(context.Background())
	*conn = nil
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return fmt.Errorf("pgxdriver: wait for notification: %w", err)
}

// Notify wakes the relays listening on the outbox table of schema (the
// generated package's Schema) (any
// process, any driver.Notifier relay on this database). Call it inside the
// writer's transaction after its inserts: PostgreSQL delivers the
// notification at commit and drops it on rollback, and coalesces the
// notifications of one transaction.
//
// It is opt-in because NOTIFY is not free for writers: PostgreSQL
// serialises the commits of all notifying transactions (a database-wide
// lock taken at commit while the notification is queued), which caps their
// commit rate under load. Without it a relay still finds the rows at its
// next poll; in-process writers can call the relay's Notify instead.
func Notify(ctx context.Context, tx pgx.Tx, schema outbox.Schema) error {
	tables := schema.Tables
	if tx == nil {
		return errors.New("pgxdriver: notify: tx is nil: call Notify inside the transaction that inserted the events")
	}
	if err := dialect.CheckIdentifier("pgxdriver: notify: outbox table name", tables.Outbox); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, dialect.NotifyInsert(tables.Outbox)); err != nil {
		return fmt.Errorf("pgxdriver: notify: %w", err)
	}
	return nil
}
