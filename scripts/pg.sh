#!/usr/bin/env bash
# A private PostgreSQL server under one directory, for the tests and the dev cluster.
#
#   pg.sh start DIR PORT   start it (initdb the first time); idempotent: a running server
#                          is left alone, a stopped one starts again on its data
#   pg.sh stop DIR         stop it (fast shutdown), data kept; nothing if not running
#   pg.sh status DIR       "running (port N)" (exit 0) or "stopped" (exit 3)
#   pg.sh destroy DIR      stop it and remove DIR
#   pg.sh url DIR          the writers' URL (role gpueff, password in DIR/pgpass, TCP)
#   pg.sh read-url DIR     the admins' read-only URL (role gpueff_read, the Unix socket:
#                          peer authentication, root and $GPUEFF_PG_READ_GROUP's members)
#
# Layout: DIR (root, 0755) holds port, pgpass (root, 0600), server.log, socket/
# (postgres, 0755: unix_socket_directories) and data/ (postgres, 0700). The server runs
# as the Unix user postgres (it refuses root), listens on 127.0.0.1 only, and shares
# nothing with the system's own PostgreSQL clusters (no /etc/postgresql, no
# /var/run/postgresql, no pg_ctlcluster): everything is under DIR.
#
# Database gpueff, owned by role gpueff (LOGIN, random password, scram-sha-256): the
# store engine's migrations create the tables as gpueff. Role gpueff_read (LOGIN, no
# password) may connect and SELECT every table gpueff creates (default privileges):
# admins' reads. Users never read the store (docs/security.md): only root and the members
# of $GPUEFF_PG_READ_GROUP (listed at every start) log in as it, by peer authentication on
# the socket (pg_ident.conf). A passfile for a group would not do: libpq refuses it.
set -euo pipefail

# runuser and the like live in sbin, which a non-login root shell may not have on PATH.
export PATH=/usr/sbin:/sbin:$PATH

MARKER_NAME=.gpueff-pg # destroy removes only a directory that start made
START_TIMEOUT=${GPUEFF_PG_START_TIMEOUT:-60}

say() { printf 'pg: %s\n' "$*"; }
die() {
  printf 'pg: error: %s\n' "$*" >&2
  exit 1
}

usage() {
  echo "usage: $0 start DIR PORT | stop DIR | status DIR | destroy DIR | url DIR | read-url DIR" >&2
  exit 2
}

require_root() { [ "$(id -u)" -eq 0 ] || die "must run as root (the server runs as user postgres)"; }

# The newest installed PostgreSQL's bin directory (Debian: /usr/lib/postgresql/N/bin).
pg_bin() {
  local bin
  bin=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)
  [ -n "$bin" ] && [ -x "$bin/initdb" ] && [ -x "$bin/pg_ctl" ] ||
    die "no PostgreSQL server under /usr/lib/postgresql (scripts/install-deps.sh installs it)"
  echo "$bin"
}

as_postgres() { runuser -u postgres -- "$@"; }

# Paths under DIR; DIR itself is made absolute.
set_dir() {
  [ -n "${1:-}" ] || usage
  DIR=$(realpath -m "$1")
  DATA=$DIR/data
  SOCKET=$DIR/socket
  LOGFILE=$DIR/server.log
  PGPASS=$DIR/pgpass
  READPASS=$DIR/read-pgpass
  PORTFILE=$DIR/port
  MARKER=$DIR/$MARKER_NAME
}

port_of() {
  [ -s "$PORTFILE" ] || die "$DIR holds no server (no $PORTFILE): run '$0 start $DIR PORT' first"
  cat "$PORTFILE"
}

# Refuse a directory that start did not make, or one another user could have put
# things in: root reads pgpass from it and hands its data dir to postgres.
check_dir() {
  if [ -d "$DIR" ] && [ ! -e "$MARKER" ] && [ -n "$(ls -A "$DIR")" ]; then
    die "$DIR exists, is not empty and was not made by pg.sh"
  fi
  local path
  for path in "$DIR" "$MARKER"; do
    [ -e "$path" ] || continue
    [ "$(stat -c %u "$path")" = 0 ] && [ -z "$(find "$path" -maxdepth 0 -perm /022)" ] ||
      die "$path is not root's alone (owner $(stat -c %U "$path"), mode $(stat -c %a "$path"))"
  done
  # The server (user postgres) must reach DIR: pytest's /tmp/pytest-of-root is 0700.
  local parent
  parent=$(dirname "$DIR")
  runuser -u postgres -- test -x "$parent" 2>/dev/null ||
    die "user postgres cannot reach $parent (a directory on the way is closed to others, as pytest's tmp dirs are); use one under /var/tmp"
}

running() { [ -d "$DATA" ] && as_postgres "$BIN/pg_ctl" status -D "$DATA" >/dev/null 2>&1; }

die_with_log() {
  if [ -s "$LOGFILE" ]; then
    printf -- '--- last lines of %s ---\n' "$LOGFILE" >&2
    tail -n 25 "$LOGFILE" >&2
  fi
  die "$*"
}

random_password() { od -An -tx1 -N24 /dev/urandom | tr -d ' \n'; }

# The first time only (again if an earlier initdb did not finish).
init_data() {
  [ -e "$DIR/initialized" ] && [ -s "$DATA/PG_VERSION" ] && return 0
  rm -rf "$DATA"
  install -d -o postgres -g postgres -m 0700 "$DATA"
  as_postgres "$BIN/initdb" -D "$DATA" -U postgres --encoding=UTF8 --locale=C \
    --auth-local=peer --auth-host=scram-sha-256 >>"$LOGFILE" 2>&1 ||
    die_with_log "initdb failed"
  echo "include_if_exists = 'gpueff.conf'" >>"$DATA/postgresql.conf"
  touch "$DIR/initialized"
}

# Our settings and access rules, written at every start (a new PORT takes effect).
write_settings() {
  local port=$1
  cat >"$DATA/gpueff.conf" <<EOF
# Written by scripts/pg.sh at every start.
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$SOCKET'
password_encryption = 'scram-sha-256'
# Every deliverer of the 500-epilog stress test may hold a connection at once.
max_connections = 200
shared_buffers = 32MB
logging_collector = off
log_min_messages = warning
log_connections = off
EOF
  cat >"$DATA/pg_hba.conf" <<EOF
# Written by scripts/pg.sh at every start.
# TYPE  DATABASE  USER         ADDRESS        METHOD
# pg.sh itself, as the Unix user postgres
local   all       postgres                    peer
# the writers (the hooks' deliverers, root: the password is in $PGPASS, root's alone)
local   gpueff    gpueff                      scram-sha-256
host    gpueff    gpueff       127.0.0.1/32   scram-sha-256
# the admins' reads: root and the admin group's members, as themselves on the socket
local   gpueff    gpueff_read                 peer map=admins
EOF
  local member group
  # The group is remembered: a later start without it (a test taking the server down and
  # up again) keeps the admins' access.
  group=${GPUEFF_PG_READ_GROUP:-$(cat "$DIR/read-group" 2>/dev/null || echo root)}
  echo "$group" >"$DIR/read-group"
  {
    echo "# Written by scripts/pg.sh at every start: who may read as gpueff_read."
    echo "admins  root  gpueff_read"
    for member in $(getent group "$group" | cut -d: -f4 | tr , ' '); do
      echo "admins  $member  gpueff_read"
    done
  } >"$DATA/pg_ident.conf"
  chown postgres:postgres "$DATA/gpueff.conf" "$DATA/pg_hba.conf" "$DATA/pg_ident.conf"
  chmod 0600 "$DATA/gpueff.conf" "$DATA/pg_hba.conf" "$DATA/pg_ident.conf"
}

psql_postgres() {
  local db=$1
  shift
  as_postgres "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$SOCKET" -p "$(port_of)" -d "$db" "$@"
}

# Roles, database and grants; idempotent, so they run at every start. The password
# goes on stdin (never on a command line, where ps shows it).
setup_roles() {
  local password port
  port=$(port_of)
  if [ -s "$PGPASS" ]; then
    password=$(head -n 1 "$PGPASS" | cut -d: -f5)
  else
    password=$(random_password)
  fi

  psql_postgres postgres >>"$LOGFILE" 2>&1 <<EOF || die_with_log "could not create the roles and the database"
SELECT 'CREATE ROLE gpueff' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpueff') \gexec
SELECT 'CREATE ROLE gpueff_read' WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'gpueff_read') \gexec
ALTER ROLE gpueff WITH LOGIN PASSWORD '$password';
ALTER ROLE gpueff_read WITH LOGIN PASSWORD NULL;
SELECT 'CREATE DATABASE gpueff OWNER gpueff' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'gpueff') \gexec
REVOKE ALL ON DATABASE gpueff FROM PUBLIC;
GRANT CONNECT ON DATABASE gpueff TO gpueff_read;
EOF
  psql_postgres gpueff >>"$LOGFILE" 2>&1 <<EOF || die_with_log "could not grant gpueff_read its reads"
GRANT USAGE ON SCHEMA public TO gpueff_read;
ALTER DEFAULT PRIVILEGES FOR ROLE gpueff IN SCHEMA public GRANT SELECT ON TABLES TO gpueff_read;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO gpueff_read;
EOF
  local tmp
  tmp=$(mktemp "$PGPASS.XXXXXX")
  chmod 0600 "$tmp"
  printf '127.0.0.1:%s:gpueff:gpueff:%s\n%s:%s:gpueff:gpueff:%s\n' \
    "$port" "$password" "$SOCKET" "$port" "$password" >"$tmp"
  mv -f "$tmp" "$PGPASS"
  rm -f "$READPASS"  # an older version's: admins now read by peer authentication
}

accepting() { "$BIN/pg_isready" -q -h "$SOCKET" -p "$(port_of)" -d postgres -U postgres; }

cmd_start() {
  local port=${1:-} deadline grace
  [[ $port =~ ^[1-9][0-9]{2,4}$ ]] && ((port < 65536)) || die "PORT must be 100..65535, not '$port'"
  require_root
  BIN=$(pg_bin)
  id postgres >/dev/null 2>&1 || die "no Unix user postgres (Debian's postgresql package makes it)"
  check_dir
  if running; then
    [ "$(cat "$PORTFILE" 2>/dev/null)" = "$port" ] ||
      die "the server under $DIR runs on port $(cat "$PORTFILE" 2>/dev/null), not $port: stop it first"
    say "already running under $DIR (port $port)"
    return 0
  fi
  install -d -m 0755 "$DIR"
  touch "$MARKER"
  install -d -o postgres -g postgres -m 0755 "$SOCKET"
  touch "$LOGFILE"
  chown postgres:postgres "$LOGFILE"
  chmod 0640 "$LOGFILE"
  init_data
  write_settings "$port"
  echo "$port" >"$PORTFILE"
  chmod 0644 "$PORTFILE"
  # -W: do not wait here, but below, bounded, with the log shown on failure.
  as_postgres "$BIN/pg_ctl" start -W -D "$DATA" -l "$LOGFILE" -s >/dev/null ||
    die_with_log "pg_ctl could not start the server"
  deadline=$((SECONDS + START_TIMEOUT)) grace=$((SECONDS + 2))
  until accepting; do
    ((SECONDS < deadline)) ||
      die_with_log "the server under $DIR did not accept connections within ${START_TIMEOUT}s"
    # Gone (a port taken, say): say so at once rather than at the deadline.
    ((SECONDS < grace)) || running || die_with_log "the server under $DIR exited while starting"
    sleep 0.1
  done
  setup_roles
  say "running under $DIR (port $port)"
}

cmd_stop() {
  require_root
  BIN=$(pg_bin)
  if ! running; then
    say "not running under $DIR"
    return 0
  fi
  as_postgres "$BIN/pg_ctl" stop -D "$DATA" -m fast -w -t 60 -s >/dev/null ||
    die_with_log "could not stop the server under $DIR"
  say "stopped under $DIR"
}

cmd_status() {
  BIN=$(pg_bin)
  if [ "$(id -u)" -eq 0 ] && running; then
    echo "running (port $(cat "$PORTFILE"))"
  elif [ "$(id -u)" -ne 0 ] && [ -s "$PORTFILE" ] && accepting; then
    echo "running (port $(cat "$PORTFILE"))"
  else
    echo "stopped"
    return 3
  fi
}

cmd_destroy() {
  require_root
  [ -e "$DIR" ] || return 0
  [ -e "$MARKER" ] || die "$DIR was not made by pg.sh: left alone"
  cmd_stop
  rm -rf "$DIR"
  say "removed $DIR"
}

main() {
  local command=${1:-}
  [ $# -ge 2 ] || usage
  set_dir "$2"
  case $command in
  start)
    [ $# -eq 3 ] || usage
    cmd_start "$3"
    ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  destroy) cmd_destroy ;;
  url) echo "postgresql://gpueff@127.0.0.1:$(port_of)/gpueff?passfile=$PGPASS" ;;
  read-url) echo "postgresql://gpueff_read@/gpueff?host=$SOCKET&port=$(port_of)" ;;
  *) usage ;;
  esac
}

main "$@"
