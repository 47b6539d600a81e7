package bench

// Durability of the servers during the measured phases.
//
// scripts/testdb.sh runs PostgreSQL with fsync=off, synchronous_commit=off
// and full_page_writes=off, and MariaDB with
// innodb_flush_log_at_trx_commit=0: fast for tests, but a commit then
// costs no disk flush, which flatters whoever commits most often. With
// -durable (the default) every measured phase runs with the production
// defaults instead: PostgreSQL fsync, synchronous_commit and
// full_page_writes on (ALTER SYSTEM + pg_reload_conf()), MariaDB
// innodb_flush_log_at_trx_commit=1 (SET GLOBAL). Fills (not measured) run
// with the servers' own settings, and the settings are restored when the
// benchmark ends: ALTER SYSTEM RESET (or the earlier ALTER SYSTEM value),
// and the earlier global value on MariaDB. Only the settings change; the
// servers are never restarted. innodb_doublewrite (0 on the test server)
// cannot change without a restart: it is printed as it is.

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outboxgen/outboxgen/internal/testdb"
)

var pgDurable = []string{"fsync", "synchronous_commit", "full_page_writes"}

// servers changes and restores the durability settings of the two test
// servers; mode is "durable" or "fast" (the servers' own settings).
type servers struct {
	mu   sync.Mutex
	pg   *sql.DB
	my   *sql.DB
	mode string

	pgAuto  map[string]string // ALTER SYSTEM values found at start
	myFlush int               // innodb_flush_log_at_trx_commit at start
}

func openServers(b *testing.B) *servers {
	b.Helper()
	s := &servers{mode: "fast", pgAuto: map[string]string{}, myFlush: -1}
	if dsn := os.Getenv(testdb.PostgresEnv); dsn != "" {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			b.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		db.SetMaxIdleConns(0) // a new session per statement: see set
		s.pg = db
		rows, err := db.Query(`SELECT name, setting FROM pg_file_settings
			WHERE name = ANY($1) AND sourcefile LIKE '%postgresql.auto.conf' AND error IS NULL`, pgDurable)
		if err != nil {
			b.Fatalf("read PostgreSQL settings (the benchmark needs a superuser): %v", err)
		}
		for rows.Next() {
			var k, v string
			if err := rows.Scan(&k, &v); err != nil {
				b.Fatal(err)
			}
			s.pgAuto[k] = v
		}
		rows.Close()
	}
	if dsn := os.Getenv(testdb.MySQLEnv); dsn != "" {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			b.Fatal(err)
		}
		db.SetMaxOpenConns(1)
		s.my = db
		if err := db.QueryRow("SELECT @@GLOBAL.innodb_flush_log_at_trx_commit").Scan(&s.myFlush); err != nil {
			b.Fatalf("read MariaDB settings: %v", err)
		}
	}
	stop := s.restoreOnSignal()
	b.Cleanup(func() {
		stop()
		s.restore(b)
		if s.pg != nil {
			s.pg.Close()
		}
		if s.my != nil {
			s.my.Close()
		}
	})
	return s
}

// measure switches to the settings of the measured phases (durable unless
// -durable=false); fill switches back to the servers' own for a fill.
func (s *servers) measure(b *testing.B) {
	if *flagDurable {
		s.set(b, "durable")
	}
}

func (s *servers) fill(b *testing.B) { s.set(b, "fast") }

func (s *servers) restore(b *testing.B) {
	s.set(b, "fast")
}

func (s *servers) set(b *testing.B, mode string) {
	b.Helper()
	if err := s.apply(mode); err != nil {
		b.Fatal(err)
	}
}

// apply switches to mode.
func (s *servers) apply(mode string) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode == mode {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if s.pg != nil {
		for _, name := range pgDurable {
			q := "ALTER SYSTEM SET " + name + " = on"
			if mode == "fast" {
				if v, ok := s.pgAuto[name]; ok {
					q = fmt.Sprintf("ALTER SYSTEM SET %s = '%s'", name, strings.ReplaceAll(v, "'", "''"))
				} else {
					q = "ALTER SYSTEM RESET " + name
				}
			}
			if _, err := s.pg.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("PostgreSQL: %s: %w", q, err)
			}
		}
		if _, err := s.pg.ExecContext(ctx, "SELECT pg_reload_conf()"); err != nil {
			return fmt.Errorf("PostgreSQL: pg_reload_conf(): %w", err)
		}
		// The reload is asynchronous: wait until a new session sees it
		// (the pool keeps no idle session; pooled sessions of the scenarios
		// apply it before their next statement).
		for deadline := time.Now().Add(5 * time.Second); mode == "durable" && time.Now().Before(deadline); {
			var v string
			if err := s.pg.QueryRowContext(ctx, "SELECT setting FROM pg_settings WHERE name = 'fsync'").Scan(&v); err != nil {
				return fmt.Errorf("PostgreSQL: %w", err)
			}
			if v == "on" {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if mode == "fast" {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if s.my != nil {
		v := 1
		if mode == "fast" {
			v = s.myFlush
		}
		if _, err := s.my.ExecContext(ctx, fmt.Sprintf("SET GLOBAL innodb_flush_log_at_trx_commit = %d", v)); err != nil {
			return fmt.Errorf("MariaDB: SET GLOBAL innodb_flush_log_at_trx_commit: %w", err)
		}
	}
	s.mode = mode
	return nil
}

// restoreOnSignal restores the servers' settings when the benchmark is
// interrupted (Ctrl-C, kill), where b.Cleanup does not run, then exits.
func (s *servers) restoreOnSignal() (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			if err := s.apply("fast"); err != nil {
				fmt.Fprintf(os.Stderr, "bench: restore the servers' settings: %v\n", err)
			}
			fmt.Fprintf(os.Stderr, "bench: %v: servers' settings restored\n", sig)
			os.Exit(1)
		case <-done:
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}

// describe returns the settings of the measured phases, read from the
// servers, and their versions.
func (s *servers) describe(b *testing.B) (pg, my string) {
	b.Helper()
	s.measure(b)
	if s.pg != nil {
		var ver string
		vals := map[string]string{}
		if err := s.pg.QueryRow("SELECT current_setting('server_version')").Scan(&ver); err != nil {
			b.Fatal(err)
		}
		rows, err := s.pg.Query("SELECT name, setting FROM pg_settings WHERE name = ANY($1)", pgDurable)
		if err != nil {
			b.Fatal(err)
		}
		for rows.Next() {
			var k, v string
			if err := rows.Scan(&k, &v); err != nil {
				b.Fatal(err)
			}
			vals[k] = v
		}
		rows.Close()
		pg = fmt.Sprintf("PostgreSQL %s (fsync=%s, synchronous_commit=%s, full_page_writes=%s)", ver, vals["fsync"], vals["synchronous_commit"], vals["full_page_writes"])
	}
	if s.my != nil {
		var ver string
		var flush, dw int
		if err := s.my.QueryRow("SELECT @@version, @@GLOBAL.innodb_flush_log_at_trx_commit, @@innodb_doublewrite").Scan(&ver, &flush, &dw); err != nil {
			b.Fatal(err)
		}
		my = fmt.Sprintf("MariaDB %s (innodb_flush_log_at_trx_commit=%d, innodb_doublewrite=%d, no binlog)", strings.SplitN(ver, "-", 2)[0], flush, dw)
	}
	return pg, my
}
