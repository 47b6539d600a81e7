package spec

import (
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/outboxgen/outboxgen/templates"
)

// sqlDatabase is a set of databases, in sqlReserved.
type sqlDatabase uint8

// The databases whose reserved words a table name must avoid: the DDL and
// the runtime's queries splice table names unquoted, and sql.dialects may
// grow later, so a name is refused when any of them reserves it.
const (
	inPostgres sqlDatabase = 1 << iota
	inMySQL
	inMariaDB
	inSQLite
)

// String names the databases of d, e.g. "PostgreSQL, MySQL and SQLite".
func (d sqlDatabase) String() string {
	var names []string
	for _, db := range []struct {
		d    sqlDatabase
		name string
	}{{inPostgres, "PostgreSQL"}, {inMySQL, "MySQL"}, {inMariaDB, "MariaDB"}, {inSQLite, "SQLite"}} {
		if d&db.d != 0 {
			names = append(names, db.name)
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// The reserved words of each database, lower-case. Tests check them
// against the live servers (TestReservedWords*), so that a server release
// reserving a new word fails CI instead of generating DDL that does not
// run.
const (
	// postgresReservedWords are PostgreSQL's key words classified
	// "reserved" and "reserved (can be function or type)" in the appendix
	// "SQL Key Words": pg_get_keywords() with catcode 'R' or 'T'
	// (PostgreSQL 15 to 17; system_user since 16).
	postgresReservedWords = `
	all analyse analyze and any array as asc asymmetric authorization
	binary both case cast check collate collation column concurrently
	constraint create cross current_catalog current_date current_role
	current_schema current_time current_timestamp current_user default
	deferrable desc distinct do else end except false fetch for foreign
	freeze from full grant group having ilike in initially inner intersect
	into is isnull join lateral leading left like limit localtime
	localtimestamp natural not notnull null offset on only or order outer
	overlaps placing primary references returning right select session_user
	similar some symmetric system_user table tablesample then to trailing
	true union unique user using variadic verbose when where window with`

	// mysqlReservedWords are MySQL's reserved words ("(R)" in "Keywords
	// and Reserved Words", information_schema.KEYWORDS with RESERVED = 1):
	// those of MySQL 8.0 (including array, member, persist and
	// persist_only, reserved in some 8.0 releases) and the ones 8.4 added
	// (manual, parallel, qualify, tablesample).
	mysqlReservedWords = `
	accessible add all alter analyze and array as asc asensitive before
	between bigint binary blob both by call cascade case change char
	character check collate column condition constraint continue convert
	create cross cube cume_dist current_date current_time current_timestamp
	current_user cursor database databases day_hour day_microsecond
	day_minute day_second dec decimal declare default delayed delete
	dense_rank desc describe deterministic distinct distinctrow div double
	drop dual each else elseif empty enclosed escaped except exists exit
	explain false fetch first_value float float4 float8 for force foreign
	from fulltext function generated get grant group grouping groups having
	high_priority hour_microsecond hour_minute hour_second if ignore in
	index infile inner inout insensitive insert int int1 int2 int3 int4
	int8 integer intersect interval into io_after_gtids io_before_gtids is
	iterate join json_table key keys kill lag last_value lateral lead
	leading leave left like limit linear lines load localtime
	localtimestamp lock long longblob longtext loop low_priority manual
	master_bind master_ssl_verify_server_cert match maxvalue mediumblob
	mediumint mediumtext member middleint minute_microsecond minute_second
	mod modifies natural no_write_to_binlog not nth_value ntile null
	numeric of on optimize optimizer_costs option optionally or order out
	outer outfile over parallel partition percent_rank persist persist_only
	precision primary procedure purge qualify range rank read read_write
	reads real recursive references regexp release rename repeat replace
	require resignal restrict return revoke right rlike row row_number rows
	schema schemas second_microsecond select sensitive separator set show
	signal smallint spatial specific sql sql_big_result sql_calc_found_rows
	sql_small_result sqlexception sqlstate sqlwarning ssl starting stored
	straight_join system table tablesample terminated then tinyblob tinyint
	tinytext to trailing trigger true undo union unique unlock unsigned
	update usage use using utc_date utc_time utc_timestamp values varbinary
	varchar varcharacter varying virtual when where while window with write
	xor year_month zerofill`

	// mariadbReservedWords are MariaDB's reserved words: the keywords of
	// MariaDB 10.11 that its parser refuses as a table name, and general,
	// ignore_server_ids, master_heartbeat_period and slow, which the
	// "Reserved Words" page lists for earlier releases.
	mariadbReservedWords = `
	accessible add all alter analyze and as asc asensitive before between
	bigint binary blob both by call cascade case change char character
	check collate column condition constraint continue convert create cross
	current_date current_role current_time current_timestamp current_user
	cursor databases day_hour day_microsecond day_minute day_second dec
	decimal declare default delayed delete delete_domain_id desc describe
	deterministic distinct distinctrow div do_domain_ids double drop dual
	each else elseif enclosed escaped except exists exit explain false
	fetch float float4 float8 for force foreign from fulltext general grant
	group having high_priority hour_microsecond hour_minute hour_second if
	ignore ignore_domain_ids ignore_server_ids in index infile inner inout
	insensitive insert int int1 int2 int3 int4 int8 integer intersect
	interval into is iterate join key keys kill leading leave left like
	limit linear lines load localtime localtimestamp lock long longblob
	longtext loop low_priority master_demote_to_replica
	master_demote_to_slave master_heartbeat_period
	master_ssl_verify_server_cert match maxvalue mediumblob mediumint
	mediumtext middleint minute_microsecond minute_second mod modifies
	natural no_write_to_binlog not null numeric offset on optimize
	optionally or order out outer outfile over page_checksum
	parse_vcol_expr partition portion precision primary procedure purge
	range read read_write reads real recursive ref_system_id references
	regexp release rename repeat replace require resignal restrict return
	returning revoke right rlike row_number rows schemas second_microsecond
	select sensitive separator set show signal slow smallint spatial
	specific sql sql_big_result sql_calc_found_rows sql_small_result
	sqlexception sqlstate sqlwarning ssl starting stats_auto_recalc
	stats_persistent stats_sample_pages straight_join table terminated then
	tinyblob tinyint tinytext to trailing trigger true undo union unique
	unlock unsigned update usage use using utc_date utc_time utc_timestamp
	values varbinary varchar varcharacter varying when where while with
	write xor year_month zerofill`

	// sqliteReservedWords are the keywords of SQLite 3.54 (see
	// sqlite3_keyword_name) that cannot name a table unquoted: CREATE
	// TABLE refuses them, while it accepts the other keywords.
	sqliteReservedWords = `
	add all alter and as autoincrement between case check collate commit
	constraint create default deferrable delete distinct drop else escape
	except exists foreign from group having if in index insert intersect
	into is isnull join limit not nothing notnull null on or order primary
	references returning select set table then to transaction union unique
	update using values when where`
)

// sqlReserved maps each reserved word to the databases reserving it.
var sqlReserved = func() map[string]sqlDatabase {
	m := map[string]sqlDatabase{}
	for d, words := range map[sqlDatabase]string{
		inPostgres: postgresReservedWords,
		inMySQL:    mysqlReservedWords,
		inMariaDB:  mariadbReservedWords,
		inSQLite:   sqliteReservedWords,
	} {
		for _, w := range strings.Fields(words) {
			m[w] |= d
		}
	}
	return m
}()

// checkDerivedNames reports the identifiers the DDL derives from the table
// names t (<outbox>_version, <inbox>_key, <inbox>_duplicate, index and
// constraint names: see templates.Tables.Identifiers) that are reserved
// words, at the table name each comes from: at[subject], or def when the
// name is the default. The table names themselves are checked by sqlIdent.
// (No reserved word ends with one of the suffixes today; this keeps it
// so when a database reserves more words.)
func (p *parser) checkDerivedNames(t templates.Tables, at map[string]*yaml.Node, def *yaml.Node) {
	tables := []struct{ subject, name string }{
		{"sql.outbox_table", t.Outbox}, {"sql.inbox_table", t.Inbox}, {"sql.archive_table", t.Archive},
	}
	for _, id := range t.Identifiers() {
		in := sqlReserved[id]
		if in == 0 {
			continue
		}
		// The table whose name is the longest prefix of id derives it.
		from := -1
		for i, tb := range tables {
			if tb.name != "" && strings.HasPrefix(id, tb.name+"_") && (from < 0 || len(tb.name) > len(tables[from].name)) {
				from = i
			}
		}
		if from < 0 {
			continue
		}
		tb := tables[from]
		node := at[tb.subject]
		if node == nil {
			node = def
		}
		p.errorf(node, "%s %q makes the DDL name %s, a reserved SQL word (in %s), which the DDL cannot use unquoted; choose another name", tb.subject, tb.name, id, in)
	}
}
