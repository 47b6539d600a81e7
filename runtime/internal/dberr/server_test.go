package dberr_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/testdb"
	"github.com/outboxgen/outboxgen/runtime/internal/dberr"
)

// The errors PostgreSQL and MySQL/MariaDB really return when a statement
// outlives the server's timeouts, a lock wait times out, transactions
// deadlock or cannot be serialized, as the drivers return them: server
// timeouts are InfraTimeout, deadlocks and serialization failures
// InfraConflict (and Conflict), none of them the message's fault.
func TestInfrastructureServerErrors(t *testing.T) {
	for _, name := range []string{"postgres", "mysql"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := testdb.Open(t, name)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			exec(t, db, "CREATE TABLE t (id INT PRIMARY KEY, n INT NOT NULL)")
			exec(t, db, "INSERT INTO t (id, n) VALUES (1, 0), (2, 0)")
			cases := map[string]dberr.Infra{}
			errs := map[string]error{}
			add := func(what string, want dberr.Infra, err error) {
				cases[what], errs[what] = want, err
			}
			mariadb := false
			if name == "postgres" {
				add("statement_timeout", dberr.InfraTimeout, onConn(t, db, func(c *sql.Conn) error {
					exec(t, c, "SET statement_timeout = 50")
					_, err := c.ExecContext(ctx, "SELECT pg_sleep(5)")
					return err
				}))
				add("lock_timeout", dberr.InfraTimeout, holding(t, db, "UPDATE t SET n = n + 1 WHERE id = 1", func(c *sql.Conn) error {
					exec(t, c, "SET lock_timeout = 50")
					_, err := c.ExecContext(ctx, "UPDATE t SET n = n + 1 WHERE id = 1")
					return err
				}))
				add("serialization failure", dberr.InfraConflict, onConn(t, db, func(c *sql.Conn) error {
					exec(t, c, "BEGIN ISOLATION LEVEL REPEATABLE READ")
					defer exec(t, c, "ROLLBACK")
					exec(t, c, "SELECT n FROM t WHERE id = 1")
					exec(t, db, "UPDATE t SET n = n + 1 WHERE id = 1") // another transaction, committed
					_, err := c.ExecContext(ctx, "UPDATE t SET n = n + 1 WHERE id = 1")
					return err
				}))
			} else {
				var version string
				if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
					t.Fatal(err)
				}
				mariadb = strings.Contains(version, "MariaDB")
				if mariadb {
					add("max_statement_time", dberr.InfraTimeout, onConn(t, db, func(c *sql.Conn) error {
						_, err := c.ExecContext(ctx, "SET STATEMENT max_statement_time = 0.05 FOR SELECT SLEEP(5)")
						return err
					}))
				} else {
					add("max_execution_time", dberr.InfraTimeout, onConn(t, db, func(c *sql.Conn) error {
						rows, err := c.QueryContext(ctx, "SELECT /*+ MAX_EXECUTION_TIME(50) */ SLEEP(5) FROM t")
						if err == nil {
							for rows.Next() {
							}
							err = rows.Err()
							rows.Close()
						}
						return err
					}))
				}
				add("innodb_lock_wait_timeout", dberr.InfraTimeout, holding(t, db, "UPDATE t SET n = n + 1 WHERE id = 1", func(c *sql.Conn) error {
					exec(t, c, "SET SESSION innodb_lock_wait_timeout = 1")
					_, err := c.ExecContext(ctx, "UPDATE t SET n = n + 1 WHERE id = 1")
					return err
				}))
				if mariadb {
					add("record changed (innodb_snapshot_isolation)", dberr.InfraConflict, onConn(t, db, func(c *sql.Conn) error {
						if _, err := c.ExecContext(ctx, "SET SESSION innodb_snapshot_isolation = ON"); err != nil {
							t.Skipf("MariaDB %s has no innodb_snapshot_isolation: %v", version, err)
						}
						exec(t, c, "START TRANSACTION WITH CONSISTENT SNAPSHOT")
						defer exec(t, c, "ROLLBACK")
						exec(t, c, "SELECT n FROM t WHERE id = 1")
						exec(t, db, "UPDATE t SET n = n + 1 WHERE id = 1")
						_, err := c.ExecContext(ctx, "UPDATE t SET n = n + 1 WHERE id = 1")
						return err
					}))
				}
			}
			add("deadlock", dberr.InfraConflict, deadlock(t, db))
			for what, want := range cases {
				err := errs[what]
				if err == nil {
					t.Errorf("%s: no error", what)
					continue
				}
				t.Logf("%s: %v", what, err)
				if got := dberr.Infrastructure(err); got != want {
					t.Errorf("%s: Infrastructure(%T %v) = %v, want %v", what, err, err, got, want)
				}
				if got := dberr.Conflict(err); got != (want == dberr.InfraConflict) {
					t.Errorf("%s: Conflict(%v) = %v", what, err, got)
				}
			}
		})
	}
}

type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

func exec(t *testing.T, db execer, query string) {
	t.Helper()
	if _, err := db.ExecContext(context.Background(), query); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// onConn runs f on a connection of its own, closed afterwards (the
// session settings f made die with it), and returns f's error.
func onConn(t *testing.T, db *sql.DB, f func(c *sql.Conn) error) error {
	t.Helper()
	c, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = c.Raw(func(any) error { return driver.ErrBadConn }) // not back to the pool
		c.Close()
	}()
	return f(c)
}

// holding runs f on a connection while another one holds the row locks
// of stmt in an open transaction, and returns f's error.
func holding(t *testing.T, db *sql.DB, stmt string, f func(c *sql.Conn) error) error {
	t.Helper()
	return onConn(t, db, func(holder *sql.Conn) error {
		exec(t, holder, "BEGIN")
		defer exec(t, holder, "ROLLBACK")
		exec(t, holder, stmt)
		return onConn(t, db, f)
	})
}

// deadlock runs two transactions that lock rows 1 and 2 in opposite
// orders and returns the error of the one the database rolled back.
func deadlock(t *testing.T, db *sql.DB) error {
	t.Helper()
	var (
		done, first sync.WaitGroup
		mu          sync.Mutex
		errs        []error
	)
	first.Add(2)
	for _, order := range [][2]string{{"1", "2"}, {"2", "1"}} {
		done.Add(1)
		go func() {
			defer done.Done()
			err := func() error {
				tx, err := db.BeginTx(context.Background(), nil)
				if err != nil {
					first.Done()
					return err
				}
				defer tx.Rollback() //nolint:errcheck // after the deadlock or the commit
				_, err = tx.Exec("UPDATE t SET n = n + 1 WHERE id = " + order[0])
				first.Done()
				if err != nil {
					return err
				}
				first.Wait() // both hold their first row
				if _, err := tx.Exec("UPDATE t SET n = n + 1 WHERE id = " + order[1]); err != nil {
					return err
				}
				return tx.Commit()
			}()
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}()
	}
	done.Wait()
	return errors.Join(errs...)
}
