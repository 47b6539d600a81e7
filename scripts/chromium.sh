#!/usr/bin/env bash
# chromium.sh: make sure Debian's chromium is installed for the console's
# browser tests (internal/consoletest, driven by chromedp).
#
#   scripts/chromium.sh          install chromium with apt-get when
#                                /usr/bin/chromium is missing; print its path
#
# `make test` runs it first. It needs root only when it has to install
# (CI: a fresh Debian 12 machine running as root). Elsewhere, without root
# and without chromium, it says how to install it and exits 1; the tests
# then skip outside CI (and fail under CI=true).
#
# OUTBOXGEN_CHROMIUM names another browser binary to use instead (the tests
# read it too); set it to skip the installation.
set -euo pipefail

CHROMIUM=${OUTBOXGEN_CHROMIUM:-/usr/bin/chromium}
LOG_DIR=${OUTBOXGEN_TESTDB_DIR:-/tmp/outboxgen-testdb}

log() { printf 'chromium: %s\n' "$*" >&2; }
die() { printf 'chromium: error: %s\n' "$*" >&2; exit 1; }

if [ -x "$CHROMIUM" ]; then
	echo "$CHROMIUM"
	exit 0
fi
[ -z "${OUTBOXGEN_CHROMIUM:-}" ] || die "OUTBOXGEN_CHROMIUM=$OUTBOXGEN_CHROMIUM is not an executable file"
[ "$(id -u)" = 0 ] || die "$CHROMIUM is missing and installing it needs root: run sudo apt-get install chromium (or set OUTBOXGEN_CHROMIUM to a Chromium binary)"
command -v apt-get >/dev/null 2>&1 || die "$CHROMIUM is missing and there is no apt-get: install Chromium and set OUTBOXGEN_CHROMIUM to its binary"

# The same apt log and "updated once" marker as scripts/testdb.sh, which
# installs the database servers; the directory must be ours (see
# testdb.sh's secure_dir: it lives in the world-writable /tmp).
if [ ! -e "$LOG_DIR" ] && [ ! -L "$LOG_DIR" ]; then
	mkdir -p -m 755 "$LOG_DIR" || die "cannot create $LOG_DIR"
fi
[ ! -L "$LOG_DIR" ] && [ -d "$LOG_DIR" ] && [ "$(stat -c %u "$LOG_DIR")" = "$(id -u)" ] ||
	die "$LOG_DIR is not a directory of this user: refusing to use it (remove it, or set OUTBOXGEN_TESTDB_DIR)"
APT_LOG=$LOG_DIR/apt.log

log "installing chromium (apt-get; log: $APT_LOG)"
export DEBIAN_FRONTEND=noninteractive
if [ ! -f "$LOG_DIR/.apt-updated" ]; then
	apt-get update -qq >>"$APT_LOG" 2>&1 || { tail -n 30 "$APT_LOG" >&2; die "apt-get update failed"; }
	touch "$LOG_DIR/.apt-updated"
fi
apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends chromium >>"$APT_LOG" 2>&1 ||
	{ tail -n 30 "$APT_LOG" >&2; die "apt-get install chromium failed (log: $APT_LOG)"; }
[ -x "$CHROMIUM" ] || die "apt-get installed chromium but $CHROMIUM is still missing"
log "installed $("$CHROMIUM" --version 2>/dev/null || echo chromium)"
echo "$CHROMIUM"
