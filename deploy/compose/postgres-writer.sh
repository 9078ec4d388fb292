#!/usr/bin/env bash
# PostgreSQL compose demo: the application. Appends events the way an
# Eventuous application does (one call of eventuous.append_events per
# append, the store's own function) and, now and then, makes each kind of
# hole gap-healer is there to fill; moves two subscriptions' checkpoints.
# Runs in the postgres image (psql; PGHOST, PGUSER, PGPASSWORD, PGDATABASE
# from the environment). WRITER_ITERATIONS=N stops after N rounds (0: never).
set -euo pipefail

schema=${DEMO_SCHEMA:-eventuous}
interval=${WRITER_INTERVAL:-1}
jump_every=${WRITER_JUMP_EVERY:-120}
slow_seconds=${WRITER_SLOW_SECONDS:-20}
iterations=${WRITER_ITERATIONS:-0}

sql() {
    psql -v ON_ERROR_STOP=1 -qAt --no-psqlrc -c "$1" >/dev/null \
        || echo "writer: statement failed (continuing): $1" >&2
}

# The append's arguments: stream, count, and optionally a fixed message id.
append_call() {
    local id=${3:-gen_random_uuid()}
    printf "SELECT * FROM %s.append_events('%s', -2, now() AT TIME ZONE 'utc', ARRAY(
        SELECT ROW(%s, 'OrderPlaced', jsonb_build_object('line', i), NULL)::%s.stream_message
        FROM generate_series(1, %d) AS i))" "$schema" "$1" "$id" "$schema" "$2"
}

# A subscription reading in position order stops at the first position that
# is not there (an open append or a hole); the slow one reads 20 a round.
advance() { # checkpoint id, most positions per round
    sql "UPDATE $schema.checkpoints AS c SET position = LEAST(c.position + $2, (
           SELECT min(x) FROM (
             SELECT c.position AS x
             WHERE NOT EXISTS (SELECT 1 FROM $schema.messages WHERE global_position = c.position + 1)
             UNION ALL
             SELECT m.global_position FROM $schema.messages AS m
             WHERE m.global_position > c.position
               AND NOT EXISTS (SELECT 1 FROM $schema.messages AS n WHERE n.global_position = m.global_position + 1)
           ) AS ends))
         WHERE c.id = '$1';"
}

trap 'echo "writer: stopping"; exit 0' TERM INT

until psql -qAt --no-psqlrc -c "SELECT 1 FROM $schema.checkpoints LIMIT 1" >/dev/null 2>&1; do
    echo "writer: waiting for the schema $schema"
    sleep 1
done

i=0
while [ "$iterations" -eq 0 ] || [ "$i" -lt "$iterations" ]; do
    i=$((i + 1))
    stream="order-$((RANDOM % 50))"
    count=$((RANDOM % 5 + 1))

    sql "$(append_call "$stream" "$count")"

    if ((i % 7 == 0)); then
        echo "writer: rolled-back append of $count to $stream (a hole of $count)"
        sql "BEGIN; $(append_call "$stream" "$count"); ROLLBACK;"
    fi
    if ((i % 11 == 0)); then
        # The second append's row conflicts on (stream_id, message_id): ON
        # CONFLICT DO NOTHING drops it, and its position is burnt.
        id="'$(cat /proc/sys/kernel/random/uuid)'"
        echo "writer: the same message id appended twice to $stream (a hole of 1)"
        sql "$(append_call "$stream" 1 "$id")"
        sql "$(append_call "$stream" 1 "$id")"
    fi
    if ((i % 29 == 0)); then
        echo "writer: slow append to slow-$stream, commits in $slow_seconds s (must not be filled)"
        sql "BEGIN; $(append_call "slow-$stream" 3); SELECT pg_sleep($slow_seconds); COMMIT;" &
    fi
    if ((i % jump_every == 0)); then
        echo "writer: the position's sequence jumps by 1000"
        sql "SELECT setval(pg_get_serial_sequence('$schema.messages', 'global_position'),
                (SELECT last_value FROM $schema.messages_global_position_seq) + 1000);"
    fi

    advance demo-projection 1000000000
    advance demo-slow-report 20
    sleep "$interval"
done
wait
echo "writer: $i rounds done"
