# A throwaway PostgreSQL server for the storage tests; sourced by .ci/run (or by hand:
# `source .ci/postgres.sh && start_postgres`, later `stop_postgres`).
# Installs Debian's postgresql when initdb is absent, runs the server as an unprivileged user (`nobody` when
# run as root) in a temporary directory, listening only on 127.0.0.1 on a free port, creates a database
# and exports its URL as VITSWEEP_TEST_POSTGRES_URL.

as_pg() {  # run as the unprivileged user from /, which it can read (the server refuses to run as root)
  if [ "$(id -u)" = 0 ]; then (cd / && runuser -u nobody -- "$@"); else "$@"; fi
}

start_postgres() {
  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  PG_BIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  PG_DIR=$(mktemp -d /tmp/vitsweep-pg.XXXXXX)
  if [ "$(id -u)" = 0 ]; then chown nobody "$PG_DIR"; fi
  PG_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  as_pg "$PG_BIN/initdb" -D "$PG_DIR/data" -U vitsweep --auth=trust -E UTF8 >"$PG_DIR/initdb.log"
  as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 start \
    -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR -c max_connections=200" >/dev/null
  as_pg "$PG_BIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U vitsweep vitsweep_test
  export VITSWEEP_TEST_POSTGRES_URL="postgresql+psycopg://vitsweep@127.0.0.1:$PG_PORT/vitsweep_test"
  echo "PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT ($PG_DIR)"
}

stop_postgres() {
  if [ -n "${PG_DIR:-}" ] && [ -d "$PG_DIR/data" ]; then
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null || true
  fi
  if [ -n "${PG_DIR:-}" ]; then rm -rf "$PG_DIR"; fi
}
