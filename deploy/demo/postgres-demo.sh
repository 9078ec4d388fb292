#!/usr/bin/env bash
# The gap-healer demo against the local PostgreSQL (127.0.0.1:5432, trust auth):
# creates an Eventuous schema, makes holes the ways production does (a rolled
# back append, a duplicate message id, an identity jump of 10,000), shows them
# with `scan`, runs the daemon until they are filled, and shows the metrics.
#
#   bash deploy/demo/postgres-demo.sh          (KEEP=1 keeps the schema afterwards)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
schema="gap_healer_demo_$$"
port=$((20000 + RANDOM % 20000))
cs="host=$PGHOST port=$PGPORT user=$PGUSER dbname=$PGDATABASE"
bin=target/debug/gap-healer
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "building gap-healer (debug)"
cargo build --quiet
pid=
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi
    [ "${KEEP:-0}" = 1 ] || psql -qc "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
}
trap cleanup EXIT

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
