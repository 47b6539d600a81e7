package migrate

import (
	"database/sql/driver"
	"fmt"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/outboxgen/outboxgen/runtime/dialect"
)

// TestFailedWording: what failed says of the statements applied, by
// dialect and error: MySQL commits each DDL statement, so it never says
// that nothing is applied, and an error that leaves the statement's
// outcome unknown (a lost connection) says it may be applied.
func TestFailedWording(t *testing.T) {
	const what = "migration 0002_x.up.sql"
	create := "-- a comment\nCREATE TABLE t (\n    id INT NOT NULL\n)"
	alter := "ALTER TABLE t ADD COLUMN c INT NULL"
	version := "CREATE TABLE IF NOT EXISTS v (\n    version INT NOT NULL\n)"
	insert := "INSERT INTO v (version, compatible_from) VALUES (2, 1)"
	lost := fmt.Errorf("read: %w", driver.ErrBadConn)
	for _, c := range []struct {
		name      string
		d         dialect.Dialect
		i         int
		run       []string
		err       error
		want, not []string
	}{
		{"mysql first statement", dialect.MySQL, 0, []string{alter, version, insert}, &mysql.MySQLError{Number: 1064, Message: "syntax"},
			[]string{"failed at its first statement: Error 1064", "This run applied none of it, and the version is not recorded", "if an earlier run of this migration was interrupted, what that run applied is still there"},
			[]string{"nothing of it is applied"}},
		{"mysql first statement, connection lost", dialect.MySQL, 0, []string{create, version, insert}, lost,
			[]string{"statement 1 of 3 did not complete", "the server may have applied it. The version is not recorded.", "Run migrate up again once the database is reachable"},
			[]string{"nothing of it is applied", "Statements 1 to"}},
		{"mysql invalid connection", dialect.MySQL, 1, []string{create, alter, version, insert}, mysql.ErrInvalidConn,
			[]string{"statement 2 of 4 did not complete", "the server may have applied it. Statements 1 to 1 are applied. The version is not recorded."}, nil},
		{"mysql version insert, connection lost", dialect.MySQL, 2, []string{create, version, insert}, lost,
			[]string{"statement 3 of 3 did not complete", "Statements 1 to 2 are applied. The version may be recorded (migrate status tells)."}, nil},
		{"mysql server gone", dialect.MySQL, 1, []string{create, alter, version, insert}, &mysql.MySQLError{Number: 2013, Message: "Lost connection to server during query"},
			[]string{"the server may have applied it"}, nil},
		{"mysql after tables", dialect.MySQL, 1, []string{create, alter, version, insert}, &mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"},
			[]string{"failed at statement 2 of 4: Error 1205", "statements 1 to 1 are applied and the version is not recorded", "They create tables: fix the cause and run migrate up again", "resumes at statement 2"}, nil},
		{"mysql after an alter", dialect.MySQL, 1, []string{alter, create, version, insert}, &mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"},
			[]string{"statements 1 to 1 are applied and the version is not recorded. Undo them, or run the rest by hand (the file's statements 2 to 4"}, nil},
		{"mysql already exists", dialect.MySQL, 0, []string{alter, version, insert}, &mysql.MySQLError{Number: 1060, Message: "Duplicate column name 'c'"},
			[]string{"What this statement creates already exists", "run the file's statements 2 to 3 by hand"}, []string{"nothing of it is applied"}},
		{"postgres connection lost", dialect.Postgres, 1, []string{create, alter, version, insert}, lost,
			[]string{"failed at statement 2 of 4, and was rolled back (nothing of it is applied)"}, nil},
	} {
		err := failed(c.d, what, c.i, c.run, c.err)
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error lacks %q:\n%v", c.name, w, err)
			}
		}
		for _, w := range c.not {
			if strings.Contains(err.Error(), w) {
				t.Errorf("%s: error says %q:\n%v", c.name, w, err)
			}
		}
		if !strings.HasPrefix(err.Error(), what) || !strings.HasSuffix(err.Error(), "statement:\n"+c.run[c.i]) {
			t.Errorf("%s: error does not name the migration and end with the statement:\n%v", c.name, err)
		}
	}
}

// TestCreatedTable: the statements whose table Up looks for, and the
// statement it runs as the temporary table.
func TestCreatedTable(t *testing.T) {
	table, asTemp, ok := createdTable("-- x\n--\nCREATE TABLE shop_x (\n    id INT NOT NULL -- the id\n) ENGINE=InnoDB")
	if !ok || table != "shop_x" || asTemp != "CREATE TEMPORARY TABLE "+checkTable+" (\n    id INT NOT NULL -- the id\n) ENGINE=InnoDB" {
		t.Errorf("createdTable = %q, %q, %v", table, asTemp, ok)
	}
	for _, stmt := range []string{"CREATE TABLE IF NOT EXISTS v (\n id INT\n)", "ALTER TABLE t ADD COLUMN c INT", "-- CREATE TABLE t (\nDROP TABLE t", "CREATE TABLE t AS SELECT 1"} {
		if table, _, ok := createdTable(stmt); ok {
			t.Errorf("createdTable(%q) = %q", stmt, table)
		}
	}
	if !createsTable("CREATE TABLE IF NOT EXISTS v (\n id INT\n)") || createsTable("ALTER TABLE t ADD COLUMN c INT") {
		t.Error("createsTable")
	}
}

// TestNormaliseDefinition: what sameTable leaves out of the definitions it
// compares.
func TestNormaliseDefinition(t *testing.T) {
	for in, want := range map[string]string{
		") ENGINE=InnoDB AUTO_INCREMENT=42 DEFAULT CHARSET=utf8mb4":       ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
		"  CONSTRAINT `outbox_event_chk_1` CHECK ((`status` in (0,1,2)))": "  CHECK ((`status` in (0,1,2)))",
		"  CONSTRAINT `CONSTRAINT_1` CHECK (`status` in (0,1,2))":         "  CHECK (`status` in (0,1,2))",
		"  CONSTRAINT `status_valid` CHECK (`status` in (0,1,2))":         "  CONSTRAINT `status_valid` CHECK (`status` in (0,1,2))",
		"  `id` bigint(20) NOT NULL AUTO_INCREMENT,":                      "  `id` bigint(20) NOT NULL AUTO_INCREMENT,",
	} {
		if got := normaliseDefinition(in); got != want {
			t.Errorf("normaliseDefinition(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestLineDiff: the lines each definition has of its own, whatever their
// trailing commas.
func TestLineDiff(t *testing.T) {
	existing := "CREATE TABLE `t` (\n  `a` int NOT NULL,\n  PRIMARY KEY (`a`)\n) ENGINE=InnoDB"
	want := "CREATE TABLE `t` (\n  `a` int NOT NULL,\n  `b` int DEFAULT NULL,\n  PRIMARY KEY (`a`),\n  KEY `t_b` (`b`)\n) ENGINE=InnoDB"
	got := lineDiff(existing, want)
	if w := "The existing table has (SHOW CREATE TABLE):\n  (none)\nwhere the statement creates:\n  `b` int DEFAULT NULL\n  KEY `t_b` (`b`)"; got != w {
		t.Errorf("lineDiff:\n%s\nwant\n%s", got, w)
	}
	swapped := "CREATE TABLE `t` (\n  PRIMARY KEY (`a`),\n  `a` int NOT NULL\n) ENGINE=InnoDB"
	if got := lineDiff(swapped, existing); !strings.HasPrefix(got, "The existing table has the lines of the statement's, in another order") {
		t.Errorf("lineDiff of reordered lines:\n%s", got)
	}
}
