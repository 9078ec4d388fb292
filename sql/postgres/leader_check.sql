-- Whether backend $1 holds the session advisory lock with bigint key $2: the
-- leader's heartbeat (on its own session) and the fill fence (inside every
-- fill transaction, on a pooled session) ask the same question.
SELECT EXISTS (
    SELECT 1
    FROM pg_locks
    WHERE
        locktype = 'advisory'
        AND pid = $1::int
        AND granted
        AND objsubid = 1
        AND ((classid::bigint << 32) | objid::bigint) = $2::bigint
) AS held;
