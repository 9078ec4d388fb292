#!/usr/bin/env bash
# Compose demo load generator: appends events through demo.append and, now
# and then, produces each kind of hole gap-healer is there to fill.
# Runs in the SQL Server image; sqlcmd reads the password from SQLCMDPASSWORD.
set -euo pipefail

SQLCMD=/opt/mssql-tools18/bin/sqlcmd
[ -x "$SQLCMD" ] || SQLCMD=/opt/mssql-tools/bin/sqlcmd
interval=${LOADGEN_INTERVAL:-1}
jump_every=${LOADGEN_JUMP_EVERY:-120}

sql() {
    "$SQLCMD" -C -b -S "${DB_HOST:-mssql}" -U sa -d "${DB_NAME:-EventStore}" -Q "$1" \
        || echo "loadgen: statement failed (continuing): $1" >&2
}

trap 'echo "loadgen: stopping"; exit 0' TERM INT

i=0
while :; do
    i=$((i + 1))
    stream="order-$((RANDOM % 50))"
    count=$((RANDOM % 5 + 1))

    sql "EXEC demo.append @stream = N'$stream', @count = $count;"

    if ((i % 7 == 0)); then
        echo "loadgen: rolled-back append of $count to $stream (a hole of $count)"
        sql "EXEC demo.append @stream = N'$stream', @count = $count, @outcome = 'rollback';"
    fi
    if ((i % 11 == 0)); then
        echo "loadgen: failing append (duplicate MessageId) to $stream"
        sql "EXEC demo.append @stream = N'$stream', @count = 2, @outcome = 'duplicate';"
    fi
    if ((i % 29 == 0)); then
        echo "loadgen: slow append to $stream, commits in 20 s (must not be filled)"
        sql "EXEC demo.append @stream = N'slow-$stream', @count = 3, @outcome = 'slow';" &
    fi
    if ((i % jump_every == 0)); then
        echo "loadgen: identity jump of 1000"
        sql "EXEC demo.jump_identity @by = 1000;"
    fi

    # Two emulated subscriptions: one keeps up (and stalls at holes), one lags.
    sql "EXEC demo.advance_checkpoint @id = N'demo-projection'; EXEC demo.advance_checkpoint @id = N'demo-slow-report', @page = 2;"
    sleep "$interval"
done
