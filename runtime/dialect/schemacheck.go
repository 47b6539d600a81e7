package dialect

// This file holds the statements of the start-up check (driver.Driver's
// Check): which database the server is, and whether a table has the
// columns the runtime uses. They change nothing and need only SELECT.

import "strings"

// InboxColumns are the columns of the inbox table the consumers and the
// janitor use.
var InboxColumns = []string{"consumer", "event_id", "biz_type", "biz_id", "processed_at"}

// ServerVersion asks the server which dialect it is. PostgreSQL and
// MySQL/MariaDB answer it; SQLite does not know version() and fails.
const ServerVersion = "SELECT version()"

// SQLiteVersion succeeds on SQLite only.
const SQLiteVersion = "SELECT sqlite_version()"

// VersionDialect tells the dialect from the text ServerVersion returned:
// PostgreSQL's starts with "PostgreSQL", MySQL's and MariaDB's with a
// version number.
func VersionDialect(version string) Dialect {
	if strings.Contains(version, "PostgreSQL") {
		return Postgres
	}
	return MySQL
}

// SelectColumns returns a statement that reads columns of table and
// matches no row: it fails when the table or any column is missing, or
// the user may not read them, and costs nothing otherwise.
func SelectColumns(table string, columns []string) string {
	return "SELECT " + strings.Join(columns, ", ") + " FROM " + table + " WHERE 1 = 0"
}
