#!/usr/bin/env bash
# testdb.sh: throwaway PostgreSQL, MariaDB, Redis and RabbitMQ servers for
# outboxgen's tests.
#
#   scripts/testdb.sh start [postgres|mariadb|redis|rabbitmq]...
#                  start every server, or only the ones named (installing
#                  their packages if missing); print their DSN/URL exports
#                  on stdout
#   scripts/testdb.sh stop [postgres|mariadb|redis|rabbitmq]...
#                  stop every server, or only the ones named
#   scripts/testdb.sh env
#                  print the DSN exports of the servers started (and not
#                  stopped since)
#
# Typical use:  eval "$(scripts/testdb.sh start)" && go test ./...
#               eval "$(scripts/testdb.sh start postgres)"   # PostgreSQL only
# (postgresql, mysql and amqp are accepted as aliases.)
#
# Meant for a disposable machine or container where it runs as root (Debian
# 12: postgresql-15, mariadb-server 10.11, redis-server 7.0, rabbitmq-server
# 3.10). Data lives under
# ${OUTBOXGEN_TESTDB_DIR:-/tmp/outboxgen-testdb} and is tuned for speed, not
# durability (fsync off; Redis without persistence). `start` is idempotent:
# a fast no-op when the servers answer, and it recovers after the servers
# were killed (kill -9). A start that starts PostgreSQL or MariaDB drops
# the test databases (og_...) and slots that killed test runs left there.
#
# If OUTBOXGEN_TEST_POSTGRES_DSN / OUTBOXGEN_TEST_MYSQL_DSN /
# OUTBOXGEN_TEST_REDIS_URL / OUTBOXGEN_TEST_AMQP_URL are already set and
# reachable, they are used instead of starting that server.
set -euo pipefail

DIR=${OUTBOXGEN_TESTDB_DIR:-/tmp/outboxgen-testdb}
PG_PORT=${OUTBOXGEN_TESTDB_PG_PORT:-54329}
MY_PORT=${OUTBOXGEN_TESTDB_MYSQL_PORT:-33069}
RD_PORT=${OUTBOXGEN_TESTDB_REDIS_PORT:-63799}
MQ_PORT=${OUTBOXGEN_TESTDB_AMQP_PORT:-56729}
TIMEOUT=60

PG_DIR=$DIR/postgres
PG_DATA=$PG_DIR/data
PG_LOG=$PG_DIR/postgres.log
MY_DIR=$DIR/mariadb
MY_DATA=$MY_DIR/data
MY_SOCK=$MY_DIR/mariadb.sock
MY_PID=$MY_DIR/mariadb.pid
MY_LOG=$MY_DIR/mariadb.log
RD_DIR=$DIR/redis
RD_PID=$RD_DIR/redis.pid
RD_LOG=$RD_DIR/redis.log
MQ_DIR=$DIR/rabbitmq
MQ_PID=$MQ_DIR/rabbitmq.pid
MQ_CONF=$DIR/rabbitmq-testdb # .conf: written as root, so outside $MQ_DIR
MQ_PLUGINS=$DIR/rabbitmq-plugins
# One node per port, so that servers of several data directories coexist;
# the Erlang distribution port is the AMQP port minus 30000 (or plus 10000).
MQ_NODE=outboxgen$MQ_PORT@localhost
MQ_DIST_PORT=$(( MQ_PORT > 30000 ? MQ_PORT - 30000 : MQ_PORT + 10000 ))
ENV_FILE=$DIR/env

DEFAULT_PG_DSN="postgres://outboxgen:outboxgen@127.0.0.1:$PG_PORT/postgres?sslmode=disable"
DEFAULT_MY_DSN="outboxgen:outboxgen@tcp(127.0.0.1:$MY_PORT)/?parseTime=true&interpolateParams=true&multiStatements=true"
DEFAULT_RD_URL="redis://127.0.0.1:$RD_PORT/0"
DEFAULT_MQ_URL="amqp://outboxgen:outboxgen@127.0.0.1:$MQ_PORT/"

log() { printf 'testdb: %s\n' "$*" >&2; }
die() { printf 'testdb: error: %s\n' "$*" >&2; exit 1; }
now_ms() { date +%s%3N; }

need_root() {
	[ "$(id -u)" = 0 ] || die "must run as root (it installs packages and runs the servers as the postgres, mysql, redis and rabbitmq users)"
}

apt_install() {
	log "installing $* (apt-get)"
	export DEBIAN_FRONTEND=noninteractive
	mkdir -p "$DIR"
	if [ ! -f "$DIR/.apt-updated" ]; then
		apt-get update -qq >>"$DIR/apt.log" 2>&1 || { tail_log "$DIR/apt.log"; die "apt-get update failed"; }
		touch "$DIR/.apt-updated"
	fi
	apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends "$@" >>"$DIR/apt.log" 2>&1 ||
		{ tail_log "$DIR/apt.log"; die "apt-get install $* failed (log: $DIR/apt.log)"; }
}

# alive PID: the process exists and is not a zombie.
alive() {
	local pid=$1 state
	[ -n "$pid" ] && [ -r "/proc/$pid/status" ] || return 1
	state=$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null) || return 1
	[ -n "$state" ] && [ "$state" != Z ]
}

tail_log() {
	[ -f "$1" ] && { printf -- '--- last lines of %s ---\n' "$1" >&2; tail -n 30 "$1" >&2; }
	return 0
}

# secure_dir: create $DIR, or accept an existing one only when it is a real
# directory (not a symlink) owned by this user and writable by nobody else.
# The default lives in the world-writable /tmp: a directory someone else
# created there first could hold symlinks planted at the paths this script
# writes as root (.lock, env, apt.log, postgres/...), so it is refused
# rather than used. What this script writes as root (logs included) lives
# in $DIR itself, never in postgres/ or mariadb/, which the servers' users
# can write (and so plant symlinks in).
secure_dir() {
	local uid owner mode
	uid=$(id -u)
	if [ ! -e "$DIR" ] && [ ! -L "$DIR" ]; then
		mkdir -p -m 755 "$DIR" || die "cannot create $DIR"
	fi
	[ ! -L "$DIR" ] || die "$DIR is a symlink: refusing to use it (remove it, or set OUTBOXGEN_TESTDB_DIR)"
	[ -d "$DIR" ] || die "$DIR is not a directory (remove it, or set OUTBOXGEN_TESTDB_DIR)"
	owner=$(stat -c %u "$DIR")
	[ "$owner" = "$uid" ] || die "$DIR belongs to uid $owner, not to this user ($uid): refusing to use it (remove it, or set OUTBOXGEN_TESTDB_DIR)"
	# Nobody else may write here; the postgres and mysql users must be able
	# to reach their subdirectories.
	chmod 755 "$DIR" || die "cannot chmod 755 $DIR"
}

# lock: one start/stop at a time (parallel make targets, several shells).
# $DIR/.lock is never followed when it is a symlink (a plain redirection
# would truncate whatever it points to) and is opened for appending, so an
# existing file is never truncated. The servers are started with fd 9
# closed: a daemon that inherited it would hold the lock for as long as it
# runs.
lock() {
	local f=$DIR/.lock
	if [ -L "$f" ] || { [ -e "$f" ] && [ ! -f "$f" ]; }; then
		die "$f is a symlink or not a regular file: refusing to follow it (remove it)"
	fi
	exec 9>>"$f"
	flock -w 120 9 || die "another testdb.sh holds $f"
}

# ---------------------------------------------------------------- PostgreSQL

pg_bindir() {
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
	if [ -z "$d" ] || [ ! -x "$d/postgres" ]; then
		apt_install postgresql
		d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
		[ -n "$d" ] && [ -x "$d/postgres" ] || die "PostgreSQL binaries not found under /usr/lib/postgresql after install"
	fi
	echo "$d"
}

pg_ready() { "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -t 2 >/dev/null 2>&1; }

pg_psql() {
	"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres "$@"
}

pg_external_ok() {
	[ -n "${OUTBOXGEN_TEST_POSTGRES_DSN:-}" ] || return 1
	[ "$OUTBOXGEN_TEST_POSTGRES_DSN" != "$DEFAULT_PG_DSN" ] || return 1
	command -v psql >/dev/null 2>&1 || PATH=$PATH:$(pg_bindir)
	psql -X -q -d "$OUTBOXGEN_TEST_POSTGRES_DSN" -c 'SELECT 1' >/dev/null 2>&1
}

pg_start() {
	local t0 pid deadline started=0
	t0=$(now_ms)
	PGBIN=$(pg_bindir)
	if pg_ready && pg_psql -c 'SELECT 1' >/dev/null 2>&1; then
		pg_role
		log "postgres: already running on 127.0.0.1:$PG_PORT ($(( $(now_ms) - t0 )) ms)"
		return
	fi
	mkdir -p "$PG_DIR"
	chown postgres: "$PG_DIR"
	chmod 700 "$PG_DIR"
	# The postgres user must be able to reach $PG_DIR.
	runuser -u postgres -- test -w "$PG_DIR" || die "user postgres cannot write $PG_DIR (choose an OUTBOXGEN_TESTDB_DIR outside a private home directory)"
	if [ ! -f "$PG_DATA/PG_VERSION" ]; then
		log "postgres: initdb $PG_DATA"
		rm -rf "$PG_DATA"
		runuser -u postgres -- "$PGBIN/initdb" -D "$PG_DATA" -U postgres --auth=trust \
			--no-locale -E UTF8 --no-sync >"$DIR/pg-initdb.log" 2>&1 || { tail_log "$DIR/pg-initdb.log"; die "initdb failed"; }
		cat >>"$PG_DATA/postgresql.conf" <<CONF

# outboxgen test server: speed over durability.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_DIR'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 128MB
max_wal_size = 1GB
log_min_messages = warning
CONF
		# initdb --auth=trust already trusts local and 127.0.0.1 connections.
	fi
	# Logical decoding, for the WAL relay (runtime/walrelay) and its tests.
	# Added here, just before a start, also to data directories initialised
	# before this setting existed: a server already running is left alone
	# (the early return above) and picks it up at its next start.
	if ! grep -q '^wal_level = logical' "$PG_DATA/postgresql.conf"; then
		cat >>"$PG_DATA/postgresql.conf" <<CONF

# outboxgen test server: logical decoding for the WAL relay.
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
CONF
	fi
	# A replication slot left behind by a killed test run (its cleanup
	# never ran) keeps every WAL segment written after it: one such slot
	# kept 67 GB here and filled the disk. Bounded, an abandoned slot is
	# marked lost instead; no live test's slot falls that far behind.
	if ! grep -q '^max_slot_wal_keep_size' "$PG_DATA/postgresql.conf"; then
		cat >>"$PG_DATA/postgresql.conf" <<CONF

# outboxgen test server: an abandoned slot cannot fill the disk.
max_slot_wal_keep_size = 4GB
CONF
	fi
	# A stale postmaster.pid (after kill -9 or a reboot) blocks the start
	# when its pid is gone or a zombie.
	if [ -f "$PG_DATA/postmaster.pid" ]; then
		pid=$(head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)
		if ! alive "$pid"; then
			log "postgres: removing stale postmaster.pid (pid $pid not alive)"
			rm -f "$PG_DATA/postmaster.pid"
		fi
	fi
	deadline=$(( $(date +%s) + TIMEOUT ))
	while :; do
		if pg_ready; then break; fi
		if [ "$(date +%s)" -ge "$deadline" ]; then
			tail_log "$PG_LOG"
			die "postgres did not become ready on 127.0.0.1:$PG_PORT within ${TIMEOUT}s (log: $PG_LOG)"
		fi
		# (Re)start when no live postmaster owns the data directory. After
		# a kill -9, orphaned backends may hold the old shared memory for a
		# moment: the first start then fails and is retried here.
		pid=$(head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)
		if ! alive "$pid"; then
			rm -f "$PG_DATA/postmaster.pid"
			[ "$started" = 0 ] && log "postgres: starting on 127.0.0.1:$PG_PORT"
			started=$((started + 1))
			runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -W start >/dev/null 2>&1 9>&- || true
		fi
		sleep 0.2
	done
	pg_role
	[ "$started" = 0 ] || pg_drop_leftovers
	log "postgres: ready on 127.0.0.1:$PG_PORT ($(( $(now_ms) - t0 )) ms)"
}

# pg_drop_leftovers drops the test databases (internal/testdb's: og_ and
# 16 lower-case hex digits, exactly) and their replication slots that
# killed test runs left behind. Only run right after this script started
# the server: no test can be using one then (unless a test run outlived
# the server it used, and creates one in the moment between).
pg_drop_leftovers() {
	local n
	n=$(pg_psql -At -c "SELECT count(*) FROM pg_database WHERE datname ~ '^og_[0-9a-f]{16}\$'") || return 0
	[ "$n" -gt 0 ] || return 0
	pg_psql >/dev/null <<'SQL' || { log "postgres: could not drop the leftover test databases (og_...)"; return 0; }
SET lock_timeout = '10s';
SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database ~ '^og_[0-9a-f]{16}$' AND NOT active;
SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE)', datname) FROM pg_database WHERE datname ~ '^og_[0-9a-f]{16}$' \gexec
SQL
	log "postgres: dropped $n test database(s) (og_...) left behind by killed test runs"
}

pg_role() {
	pg_psql >/dev/null <<'SQL' || { tail_log "$PG_LOG"; die "could not create the outboxgen role"; }
DO $$
BEGIN
	IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'outboxgen') THEN
		CREATE ROLE outboxgen LOGIN SUPERUSER PASSWORD 'outboxgen';
	END IF;
END $$;
SQL
}

pg_stop() {
	PGBIN=$(pg_bindir)
	local pid
	if [ -f "$PG_DATA/postmaster.pid" ]; then
		pid=$(head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)
		if alive "$pid"; then
			runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PG_DATA" -m fast -w -t "$TIMEOUT" stop >/dev/null 2>&1 ||
				{ log "postgres: pg_ctl stop failed; killing pid $pid"; kill -9 "$pid" 2>/dev/null || true; }
			log "postgres: stopped"
			return
		fi
		rm -f "$PG_DATA/postmaster.pid"
	fi
	log "postgres: not running"
}

# ------------------------------------------------------------------- MariaDB

my_bins() {
	if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
		apt_install mariadb-server mariadb-client
	fi
	MARIADBD=$(command -v mariadbd || echo /usr/sbin/mariadbd)
	[ -x "$MARIADBD" ] || die "mariadbd not found after installing mariadb-server"
	command -v mariadb-admin >/dev/null 2>&1 || apt_install mariadb-client
	id mysql >/dev/null 2>&1 || die "user mysql missing (it comes with mariadb-server)"
}

my_admin() { mariadb-admin --no-defaults --connect-timeout=2 "$@"; }
my_root() { mariadb --no-defaults --socket="$MY_SOCK" -uroot "$@"; }
my_ready_app() { my_admin -h127.0.0.1 -P"$MY_PORT" -uoutboxgen -poutboxgen ping >/dev/null 2>&1; }
my_ready_root() { my_admin --socket="$MY_SOCK" -uroot ping >/dev/null 2>&1; }

# my_external_ok: OUTBOXGEN_TEST_MYSQL_DSN is set to something other than
# ours and answers (user:pass@tcp(host:port)/...).
my_external_ok() {
	local dsn=${OUTBOXGEN_TEST_MYSQL_DSN:-}
	[ -n "$dsn" ] && [ "$dsn" != "$DEFAULT_MY_DSN" ] || return 1
	if [[ $dsn =~ ^([^:@]*)(:([^@]*))?@tcp\(([^:\)]+)(:([0-9]+))?\)/ ]]; then
		command -v mariadb-admin >/dev/null 2>&1 || return 0 # cannot check; trust it
		my_admin -h"${BASH_REMATCH[4]}" -P"${BASH_REMATCH[6]:-3306}" -u"${BASH_REMATCH[1]}" \
			${BASH_REMATCH[3]:+-p"${BASH_REMATCH[3]}"} ping >/dev/null 2>&1
		return
	fi
	return 1
}

my_start() {
	local t0 pid deadline started=0
	t0=$(now_ms)
	my_bins
	if my_ready_app; then
		log "mariadb: already running on 127.0.0.1:$MY_PORT ($(( $(now_ms) - t0 )) ms)"
		return
	fi
	mkdir -p "$MY_DIR"
	chown mysql: "$MY_DIR"
	chmod 750 "$MY_DIR"
	if [ ! -d "$MY_DATA/mysql" ]; then
		log "mariadb: mariadb-install-db $MY_DATA"
		rm -rf "$MY_DATA"
		mariadb-install-db --no-defaults --user=mysql --datadir="$MY_DATA" \
			--auth-root-authentication-method=socket --skip-test-db \
			>"$DIR/mariadb-install-db.log" 2>&1 || { tail_log "$DIR/mariadb-install-db.log"; die "mariadb-install-db failed"; }
	fi
	pid=$(cat "$MY_PID" 2>/dev/null || true)
	if ! alive "$pid"; then
		rm -f "$MY_PID"
		log "mariadb: starting on 127.0.0.1:$MY_PORT"
		started=1
		# setsid + nohup: the server outlives this script and its terminal.
		setsid nohup "$MARIADBD" --no-defaults --user=mysql \
			--datadir="$MY_DATA" --socket="$MY_SOCK" --pid-file="$MY_PID" \
			--log-error="$MY_LOG" --bind-address=127.0.0.1 --port="$MY_PORT" \
			--skip-name-resolve --skip-log-bin --default-time-zone=+00:00 \
			--character-set-server=utf8mb4 --collation-server=utf8mb4_bin \
			--innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 \
			--innodb-buffer-pool-size=256M --innodb-log-file-size=256M \
			--max-connections=300 \
			</dev/null >>"$DIR/mariadbd.out" 2>&1 9>&- &
	fi
	deadline=$(( $(date +%s) + TIMEOUT ))
	until my_ready_root; do
		if [ "$(date +%s)" -ge "$deadline" ]; then
			tail_log "$MY_LOG"
			die "mariadb did not become ready within ${TIMEOUT}s (log: $MY_LOG)"
		fi
		sleep 0.2
	done
	my_root <<'SQL' || { tail_log "$MY_LOG"; die "could not create the outboxgen user"; }
CREATE USER IF NOT EXISTS 'outboxgen'@'%' IDENTIFIED BY 'outboxgen';
CREATE USER IF NOT EXISTS 'outboxgen'@'127.0.0.1' IDENTIFIED BY 'outboxgen';
CREATE USER IF NOT EXISTS 'outboxgen'@'localhost' IDENTIFIED BY 'outboxgen';
GRANT ALL PRIVILEGES ON *.* TO 'outboxgen'@'%' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'outboxgen'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'outboxgen'@'localhost' WITH GRANT OPTION;
SQL
	my_ready_app || die "mariadb: user outboxgen cannot log in on 127.0.0.1:$MY_PORT"
	[ "$started" = 0 ] || my_drop_leftovers
	log "mariadb: ready on 127.0.0.1:$MY_PORT ($(( $(now_ms) - t0 )) ms)"
}

# my_drop_leftovers drops the test databases that killed test runs left
# behind, as pg_drop_leftovers. (REGEXP BINARY: schema names compare
# without regard to case, and OG_x is not a test database.)
my_drop_leftovers() {
	local drops n
	drops=$(my_root -N -B -e "SELECT CONCAT('DROP DATABASE IF EXISTS \`', schema_name, '\`;') FROM information_schema.schemata WHERE schema_name REGEXP BINARY '^og_[0-9a-f]{16}\$'") || return 0
	[ -n "$drops" ] || return 0
	n=$(printf '%s\n' "$drops" | wc -l)
	{ echo "SET SESSION lock_wait_timeout = 10;"; printf '%s\n' "$drops"; } | my_root || { log "mariadb: could not drop the leftover test databases (og_...)"; return 0; }
	log "mariadb: dropped $n test database(s) (og_...) left behind by killed test runs"
}

my_stop() {
	local pid i
	pid=$(cat "$MY_PID" 2>/dev/null || true)
	if alive "$pid"; then
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq 1 $((TIMEOUT * 5))); do
			alive "$pid" || break
			sleep 0.2
		done
		if alive "$pid"; then
			log "mariadb: pid $pid ignored SIGTERM; killing"
			kill -9 "$pid" 2>/dev/null || true
		fi
		rm -f "$MY_PID"
		log "mariadb: stopped"
		return
	fi
	rm -f "$MY_PID"
	log "mariadb: not running"
}

# --------------------------------------------------------------------- Redis

rd_bins() {
	command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || apt_install redis-server
	command -v redis-server >/dev/null 2>&1 || die "redis-server not found after installing redis-server"
	command -v redis-cli >/dev/null 2>&1 || apt_install redis-tools
	id redis >/dev/null 2>&1 || die "user redis missing (it comes with redis-server)"
}

rd_ready() { [ "$(timeout 3 redis-cli -h 127.0.0.1 -p "$RD_PORT" ping 2>/dev/null)" = PONG ]; }

# rd_external_ok: OUTBOXGEN_TEST_REDIS_URL is set to something other than
# ours and answers.
rd_external_ok() {
	local u=${OUTBOXGEN_TEST_REDIS_URL:-}
	[ -n "$u" ] && [ "$u" != "$DEFAULT_RD_URL" ] || return 1
	command -v redis-cli >/dev/null 2>&1 || return 0 # cannot check; trust it
	[ "$(timeout 3 redis-cli -u "$u" ping 2>/dev/null)" = PONG ]
}

rd_start() {
	local t0 pid deadline
	t0=$(now_ms)
	rd_bins
	if rd_ready; then
		log "redis: already running on 127.0.0.1:$RD_PORT ($(( $(now_ms) - t0 )) ms)"
		return
	fi
	mkdir -p "$RD_DIR"
	chown redis: "$RD_DIR"
	chmod 750 "$RD_DIR"
	pid=$(cat "$RD_PID" 2>/dev/null || true)
	if ! alive "$pid"; then
		rm -f "$RD_PID"
		log "redis: starting on 127.0.0.1:$RD_PORT"
		# No persistence (no RDB snapshots, no AOF): a test server.
		runuser -u redis -- redis-server --bind 127.0.0.1 --port "$RD_PORT" \
			--save "" --appendonly no --dir "$RD_DIR" --daemonize yes \
			--pidfile "$RD_PID" --logfile "$RD_LOG" --protected-mode no \
			</dev/null >>"$DIR/redis.out" 2>&1 9>&- || { tail_log "$DIR/redis.out"; die "redis-server failed to start"; }
	fi
	deadline=$(( $(date +%s) + TIMEOUT ))
	until rd_ready; do
		if [ "$(date +%s)" -ge "$deadline" ]; then
			tail_log "$RD_LOG"
			die "redis did not become ready on 127.0.0.1:$RD_PORT within ${TIMEOUT}s (log: $RD_LOG)"
		fi
		sleep 0.1
	done
	log "redis: ready on 127.0.0.1:$RD_PORT ($(( $(now_ms) - t0 )) ms)"
}

# stop_pid NAME PIDFILE: stop the server whose pid PIDFILE holds (only
# that one: never a server found by its port, which may be another data
# directory's), SIGTERM then SIGKILL.
stop_pid() {
	local name=$1 pidfile=$2 pid i
	pid=$(cat "$pidfile" 2>/dev/null || true)
	if alive "$pid"; then
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq 1 $((TIMEOUT * 5))); do
			alive "$pid" || break
			sleep 0.2
		done
		if alive "$pid"; then
			log "$name: pid $pid ignored SIGTERM; killing"
			kill -9 "$pid" 2>/dev/null || true
		fi
		rm -f "$pidfile"
		log "$name: stopped"
		return
	fi
	rm -f "$pidfile"
	log "$name: not running"
}

rd_stop() { stop_pid redis "$RD_PID"; }

# ------------------------------------------------------------------ RabbitMQ

mq_bins() {
	[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || apt_install rabbitmq-server
	[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ] || die "/usr/lib/rabbitmq/bin/rabbitmq-server not found after installing rabbitmq-server"
	id rabbitmq >/dev/null 2>&1 || die "user rabbitmq missing (it comes with rabbitmq-server)"
}

# amqp_answers HOST PORT: an AMQP 0-9-1 server answers the protocol header
# with a frame (connection.start, frame type 1).
amqp_answers() {
	timeout 3 bash -c '
		exec 3<>"/dev/tcp/$1/$2" || exit 1
		printf "AMQP\0\0\11\1" >&3
		[ "$(head -c 1 <&3 | od -An -tu1 | tr -d " ")" = 1 ]' _ "$1" "$2" 2>/dev/null
}

mq_ready() { amqp_answers 127.0.0.1 "$MQ_PORT"; }

# mq_external_ok: OUTBOXGEN_TEST_AMQP_URL is set to something other than
# ours and an AMQP server answers at its host and port.
mq_external_ok() {
	local u=${OUTBOXGEN_TEST_AMQP_URL:-} hostport host port
	[ -n "$u" ] && [ "$u" != "$DEFAULT_MQ_URL" ] || return 1
	[[ $u =~ ^amqps?://([^/?#]*@)?([^/?#@]+) ]] || return 1
	hostport=${BASH_REMATCH[2]}
	host=${hostport%:*}
	port=${hostport##*:}
	[ "$host" != "$hostport" ] || port=5672
	amqp_answers "$host" "$port"
}

mq_start() {
	local t0 pid deadline
	t0=$(now_ms)
	mq_bins
	if mq_ready; then
		log "rabbitmq: already running on 127.0.0.1:$MQ_PORT ($(( $(now_ms) - t0 )) ms)"
		return
	fi
	mkdir -p "$MQ_DIR"
	chown rabbitmq: "$MQ_DIR"
	chmod 750 "$MQ_DIR"
	# The user is created on the node's first start (empty database).
	cat >"$MQ_CONF.conf.tmp" <<CONF
listeners.tcp.1 = 127.0.0.1:$MQ_PORT
default_user = outboxgen
default_pass = outboxgen
default_vhost = /
loopback_users = none
log.file.level = warning
CONF
	mv "$MQ_CONF.conf.tmp" "$MQ_CONF.conf"
	echo '[].' >"$MQ_PLUGINS.tmp" && mv "$MQ_PLUGINS.tmp" "$MQ_PLUGINS"
	chmod 644 "$MQ_CONF.conf" "$MQ_PLUGINS"
	pid=$(cat "$MQ_PID" 2>/dev/null || true)
	if ! alive "$pid"; then
		rm -f "$MQ_PID"
		log "rabbitmq: starting on 127.0.0.1:$MQ_PORT (node $MQ_NODE)"
		# setsid + nohup: the server outlives this script and its
		# terminal. HOME holds the node's Erlang cookie.
		setsid nohup runuser -u rabbitmq -- env HOME="$MQ_DIR" \
			RABBITMQ_NODENAME="$MQ_NODE" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
			RABBITMQ_NODE_PORT="$MQ_PORT" RABBITMQ_DIST_PORT="$MQ_DIST_PORT" \
			RABBITMQ_MNESIA_BASE="$MQ_DIR/mnesia" RABBITMQ_LOG_BASE="$MQ_DIR/log" \
			RABBITMQ_CONFIG_FILE="$MQ_CONF" RABBITMQ_ENABLED_PLUGINS_FILE="$MQ_PLUGINS" \
			RABBITMQ_ADVANCED_CONFIG_FILE="$MQ_DIR/advanced.config" \
			RABBITMQ_PID_FILE="$MQ_PID" \
			/usr/lib/rabbitmq/bin/rabbitmq-server \
			</dev/null >>"$DIR/rabbitmq.out" 2>&1 9>&- &
	fi
	deadline=$(( $(date +%s) + TIMEOUT ))
	until mq_ready; do
		if [ "$(date +%s)" -ge "$deadline" ]; then
			tail_log "$DIR/rabbitmq.out"
			die "rabbitmq did not become ready on 127.0.0.1:$MQ_PORT within ${TIMEOUT}s (logs: $DIR/rabbitmq.out, $MQ_DIR/log)"
		fi
		sleep 0.2
	done
	log "rabbitmq: ready on 127.0.0.1:$MQ_PORT ($(( $(now_ms) - t0 )) ms)"
}

mq_stop() { stop_pid rabbitmq "$MQ_PID"; }

# ----------------------------------------------------------------------- env

# squote VALUE: VALUE in single quotes, safe for eval.
squote() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

# export_line VAR VALUE: the line that exports VAR=VALUE, safe for eval.
export_line() { printf 'export %s=%s\n' "$1" "$(squote "$2")"; }

# update_env VAR [VALUE]: record VAR=VALUE in $ENV_FILE, or drop VAR when
# no VALUE is given, keeping the other servers' lines. The file lists only
# the servers started (in the order PostgreSQL, MariaDB, Redis, RabbitMQ)
# and is removed when it would be
# empty. $DIR is this user's and writable by nobody else (secure_dir), and
# the lock is held.
update_env() {
	local var=$1 v line lines=""
	for v in OUTBOXGEN_TEST_POSTGRES_DSN OUTBOXGEN_TEST_MYSQL_DSN OUTBOXGEN_TEST_REDIS_URL OUTBOXGEN_TEST_AMQP_URL; do
		if [ "$v" = "$var" ]; then
			[ $# -lt 2 ] || lines+=$(export_line "$v" "$2")$'\n'
		elif [ -f "$ENV_FILE" ] && line=$(grep -m 1 "^export $v=" "$ENV_FILE"); then
			lines+=$line$'\n'
		fi
	done
	if [ -z "$lines" ]; then
		rm -f "$ENV_FILE"
		return
	fi
	printf '%s' "$lines" >"$ENV_FILE.tmp"
	mv "$ENV_FILE.tmp" "$ENV_FILE"
}

# SERVERS: the servers a start or stop acts on, from its arguments
# (default: all), in a fixed order.
SERVERS=()
parse_servers() {
	local a pg=0 my=0 rd=0 mq=0
	[ $# -gt 0 ] || set -- postgres mariadb redis rabbitmq
	for a in "$@"; do
		case $a in
		postgres | postgresql) pg=1 ;;
		mariadb | mysql) my=1 ;;
		redis) rd=1 ;;
		rabbitmq | amqp) mq=1 ;;
		*) usage "unknown server \"$a\": name postgres, mariadb, redis or rabbitmq (or none for all)" ;;
		esac
	done
	[ "$pg" = 0 ] || SERVERS+=(postgres)
	[ "$my" = 0 ] || SERVERS+=(mariadb)
	[ "$rd" = 0 ] || SERVERS+=(redis)
	[ "$mq" = 0 ] || SERVERS+=(rabbitmq)
}

wants() {
	local s
	for s in "${SERVERS[@]}"; do
		[ "$s" != "$1" ] || return 0
	done
	return 1
}

# start_one NAME VAR DEFAULT_DSN EXTERNAL_OK START: use the server at $VAR
# when it answers, else start the local one; record and print its DSN. It
# runs in a command substitution: only the export line reaches stdout.
start_one() {
	local name=$1 var=$2 default=$3 external_ok=$4 start=$5 dsn=$3
	if "$external_ok"; then
		dsn=${!var}
		log "$name: using the reachable $var"
	else
		[ -z "${!var:-}" ] || [ "${!var}" = "$default" ] ||
			log "$name: $var is not reachable; starting a local server instead"
		"$start"
	fi
	update_env "$var" "$dsn"
	export_line "$var" "$dsn"
}

cmd_start() {
	local t0 out=""
	t0=$(now_ms)
	need_root
	secure_dir
	lock
	if wants postgres; then
		out+=$(start_one postgres OUTBOXGEN_TEST_POSTGRES_DSN "$DEFAULT_PG_DSN" pg_external_ok pg_start)$'\n'
	fi
	if wants mariadb; then
		out+=$(start_one mariadb OUTBOXGEN_TEST_MYSQL_DSN "$DEFAULT_MY_DSN" my_external_ok my_start)$'\n'
	fi
	if wants redis; then
		out+=$(start_one redis OUTBOXGEN_TEST_REDIS_URL "$DEFAULT_RD_URL" rd_external_ok rd_start)$'\n'
	fi
	if wants rabbitmq; then
		out+=$(start_one rabbitmq OUTBOXGEN_TEST_AMQP_URL "$DEFAULT_MQ_URL" mq_external_ok mq_start)$'\n'
	fi
	log "ready in $(( $(now_ms) - t0 )) ms; env file: $ENV_FILE"
	printf '%s' "$out"
}

cmd_stop() {
	need_root
	secure_dir
	lock
	if wants postgres; then
		pg_stop
		update_env OUTBOXGEN_TEST_POSTGRES_DSN
	fi
	if wants mariadb; then
		my_stop
		update_env OUTBOXGEN_TEST_MYSQL_DSN
	fi
	if wants redis; then
		rd_stop
		update_env OUTBOXGEN_TEST_REDIS_URL
	fi
	if wants rabbitmq; then
		mq_stop
		update_env OUTBOXGEN_TEST_AMQP_URL
	fi
}

cmd_env() {
	[ -f "$ENV_FILE" ] || die "no server started (no $ENV_FILE): run scripts/testdb.sh start"
	cat "$ENV_FILE"
}

usage() {
	[ $# -eq 0 ] || printf 'testdb: %s\n' "$1" >&2
	echo "usage: $0 start [postgres|mariadb|redis|rabbitmq]... | stop [postgres|mariadb|redis|rabbitmq]... | env" >&2
	exit 2
}

cmd=${1:-}
[ $# -eq 0 ] || shift
case $cmd in
start)
	parse_servers "$@"
	cmd_start
	;;
stop)
	parse_servers "$@"
	cmd_stop
	;;
env)
	[ $# -eq 0 ] || usage "env takes no arguments"
	cmd_env
	;;
*) usage ;;
esac
