#!/usr/bin/env bash
# The gap-healer demo: creates an Eventuous schema, makes holes the ways
# production does (a rolled back append, a duplicate message id, an identity
# jump of 10,000), shows them with `scan`, runs the daemon until they are
# filled, and shows the metrics.
#
#   bash deploy/demo/postgres-demo.sh          (KEEP=1 keeps the schema afterwards,
#                                               except in a throwaway cluster)
#
# The server: the one PGHOST/PGPORT/PGUSER/PGDATABASE name when any of them
# is set (libpq's variables; it must trust the user or PGPASSWORD must be
# set). Otherwise the local PostgreSQL at 127.0.0.1:5432 (user postgres,
# database test) when something answers there, else a throwaway cluster of
# the demo's own: initdb on a free port in a temporary directory (as the
# postgres user when run as root), stopped and deleted when the demo ends.
# That needs PostgreSQL's server binaries (initdb, pg_ctl, postgres: the
# newest /usr/lib/postgresql/<version>/bin, else on PATH); psql and curl are
# needed either way.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
answers() { timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null; } # host, port

own=          # the throwaway cluster's directory, when the demo started one
as_pg=()      # how its tools run: as the postgres user when we are root
pid=
schema="gap_healer_demo_$$"
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    if [ -n "$own" ]; then
        "${as_pg[@]}" "$pgbin/pg_ctl" -D "$own/data" -m immediate -w stop >/dev/null 2>&1 || true
        rm -rf "$own"
        echo "stopped and deleted the throwaway cluster $own"
    else
        [ "${KEEP:-0}" = 1 ] || psql -qc "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

if [ -z "${PGHOST:-}${PGPORT:-}${PGUSER:-}${PGDATABASE:-}" ] && ! answers 127.0.0.1 5432; then
    say "nothing answers at 127.0.0.1:5432: starting a throwaway PostgreSQL cluster"
    pgbin='' newest=0
    for d in /usr/lib/postgresql/*/bin; do
        v=${d#/usr/lib/postgresql/}; v=${v%/bin}
        if [[ $v =~ ^[0-9]+$ ]] && [ "$v" -gt "$newest" ]; then newest=$v pgbin=$d; fi
    done
    if [ -z "$pgbin" ] && command -v initdb >/dev/null; then pgbin=$(dirname "$(command -v initdb)"); fi
    if [ -z "$pgbin" ] || [ ! -x "$pgbin/initdb" ]; then
        echo "no PostgreSQL at 127.0.0.1:5432 and no server binaries to start one (initdb, pg_ctl, postgres under /usr/lib/postgresql/<version>/bin or on PATH); or name a server with PGHOST/PGPORT" >&2
        exit 1
    fi
    own=$(mktemp -d "${TMPDIR:-/tmp}/gap-healer-demo-pg.XXXXXX")
    if [ "$(id -u)" = 0 ]; then chown postgres: "$own"; as_pg=(runuser -u postgres --); fi
    "${as_pg[@]}" "$pgbin/initdb" -D "$own/data" -U postgres --auth=trust --no-sync >"$own/initdb.log" 2>&1 ||
        { cat "$own/initdb.log" >&2; exit 1; }
    for _ in 1 2 3 4 5; do
        PGPORT=$((20000 + RANDOM % 20000))
        answers 127.0.0.1 "$PGPORT" && continue
        "${as_pg[@]}" "$pgbin/pg_ctl" -D "$own/data" -l "$own/server.log" -w -t 60 \
            -o "-p $PGPORT -k $own -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null && break
        PGPORT=
    done
    if [ -z "$PGPORT" ]; then cat "$own/server.log" >&2; exit 1; fi
    echo "a throwaway cluster on 127.0.0.1:$PGPORT in $own (removed when the demo ends)"
    psql -h 127.0.0.1 -p "$PGPORT" -U postgres -d postgres -qc "CREATE DATABASE test"
fi
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
port=$((20000 + RANDOM % 20000))
cs="host=$PGHOST port=$PGPORT user=$PGUSER dbname=$PGDATABASE"
bin=${CARGO_TARGET_DIR:-target}/debug/gap-healer

say "building gap-healer (debug, cargo build --locked)"
if [ ! -x "$bin" ]; then
    echo "The first build compiles about 200 crates: a few minutes (5 on a busy 2-core machine)."
    echo "Cargo shows each crate as it goes; later runs build in seconds."
fi
cargo build --locked

say "creating the Eventuous schema $schema"
sed "s/__schema__/$schema/g" tests/fixtures/eventuous_postgres.sql | psql -q -v ON_ERROR_STOP=1

append() { # stream, then COMMIT or ROLLBACK; a fixed message id can be given third
    local mid=${3:-gen_random_uuid()}
    psql -q -v ON_ERROR_STOP=1 >/dev/null <<SQL
BEGIN;
INSERT INTO $schema.streams (stream_name) VALUES ('$1') ON CONFLICT (stream_name) DO NOTHING;
WITH s AS (SELECT stream_id, version FROM $schema.streams WHERE stream_name = '$1' FOR UPDATE),
     ins AS (
       INSERT INTO $schema.messages (message_id, message_type, stream_id, stream_position, json_data, created)
       SELECT $mid, 'OrderPlaced', stream_id, version + 1, '{"total": 42}', now() AT TIME ZONE 'utc' FROM s
       ON CONFLICT (stream_id, message_id) DO NOTHING RETURNING stream_id)
UPDATE $schema.streams SET version = version + (SELECT count(*) FROM ins) WHERE stream_name = '$1';
$2;
SQL
}

say "appending: events, a rolled-back append, a duplicate message id, an identity jump of 10,000"
append order-1 COMMIT
append order-2 ROLLBACK                                                   # hole at 2
append order-1 COMMIT "'6f1c2a8e-0000-4000-8000-000000000001'"
append order-1 COMMIT "'6f1c2a8e-0000-4000-8000-000000000001'"           # duplicate: hole at 4
append order-3 COMMIT
psql -qAt -c "SELECT setval(pg_get_serial_sequence('$schema.messages', 'global_position'), (SELECT last_value FROM $schema.messages_global_position_seq) + 10000)" >/dev/null
append order-4 COMMIT                                                     # hole of 10,000
psql -q -c "INSERT INTO $schema.checkpoints VALUES ('orders-projection', 1)"
psql -c "SELECT global_position, message_type FROM $schema.messages ORDER BY 1"

say "gap-healer scan (read-only; exit 1 means holes)"
"$bin" scan --engine postgres --connection-string "$cs" --schema "$schema" || echo "(exit $?)"

say "gap-healer run --gap-timeout 2s (holes must be 2 s old before they are filled)"
"$bin" run --engine postgres --connection-string "$cs" --schema "$schema" \
    --gap-timeout 2s --poll-interval 250ms --metrics-addr "127.0.0.1:$port" 2> >(sed 's/^/  [healer] /' >&2) &
pid=$!
for _ in $(seq 1 50); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.2; done
echo "/readyz: $(curl -s "http://127.0.0.1:$port/readyz")"
echo "metrics before the holes are 2 s old:"
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^gap_healer_(open_gaps|open_gap_positions|oldest_gap_age_seconds|tombstones_inserted_total|head_position|contiguous_position|leader)[ {]'
sleep 3
echo "metrics after:"
curl -s "http://127.0.0.1:$port/metrics" | grep -E '^gap_healer_(open_gaps|open_gap_positions|tombstones_inserted_total|fill_attempts_total|head_position|contiguous_position|checkpoint_lag_positions|leader)[ {]'
kill -TERM "$pid"
wait "$pid" && echo "gap-healer stopped on SIGTERM (exit 0)"
pid=

say "gap-healer scan again"
"$bin" scan --engine postgres --connection-string "$cs" --schema "$schema" && echo "(exit 0: no holes)"
psql -c "SELECT message_type, count(*), min(global_position), max(global_position) FROM $schema.messages GROUP BY 1 ORDER BY 1"
psql -c "SELECT stream_name, version FROM $schema.streams WHERE stream_name = '__tombstones__'"
