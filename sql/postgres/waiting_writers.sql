-- The fill's guards, asked inside every fill transaction right before its
-- insert. First the abandonment proof's question: which other sessions hold a write lock
-- (RowExclusiveLock) on the healed table, or on a partition of it, and are
-- waiting for a lock the way an insert between its position and its key
-- can (below). Such a session may be an insert that has drawn
-- its position and waits BEFORE the position's key exists (ON CONFLICT's
-- arbiter check, or the unique check of an index inserted before the
-- position's key): a tombstone at that position would not wait for it, and
-- would take its place. While any is waiting the fill writes nothing.
-- pg_locks is readable by every login. $1 is the table's qualified name,
-- $2 its position column.
--
-- Beside it, the second guard: how far the identity has handed positions
-- out (its sequence's last value, where the login may read it). A fill
-- above it would take a number the identity will still hand out, and the
-- application's append would then fail on it.
WITH healed AS (
    SELECT TO_REGCLASS($1::text) AS oid
),

tables AS (
    SELECT h.oid FROM healed AS h
    UNION
    SELECT t.relid FROM healed AS h
    CROSS JOIN LATERAL PG_PARTITION_TREE(h.oid) AS t
),

-- Between drawing its position and inserting its key, an insert waits for
-- a lock only in a unique check (ON CONFLICT's arbiters, or an index
-- inserted before the position's key): it then waits for the other
-- transaction's id (or its speculative insertion token) and holds no
-- tuple lock. A row-lock wait (UPDATE, FOR UPDATE: another stream's row)
-- holds the row's tuple lock while it waits, or waits for that tuple lock,
-- and is no such writer. Unless user code runs in the window: a BEFORE
-- INSERT row trigger or a rule on the table may wait for anything, and
-- then every waiting writer counts.
code_in_the_window AS (
    SELECT
        EXISTS (
            SELECT 1
            FROM pg_trigger AS g
            WHERE
                g.tgrelid IN (SELECT t.oid FROM tables AS t)
                AND NOT g.tgisinternal
                AND (g.tgtype::int & 7) = 7
        )
        OR EXISTS (
            SELECT 1
            FROM pg_class AS c
            WHERE c.oid IN (SELECT t.oid FROM tables AS t) AND c.relhasrules
        ) AS any_wait
)

SELECT
    COALESCE(ARRAY_AGG(DISTINCT w.pid ORDER BY w.pid), '{}') AS pids,
    (
        SELECT HAS_SEQUENCE_PRIVILEGE(q.seq, 'SELECT,USAGE')
        FROM (SELECT PG_GET_SERIAL_SEQUENCE($1::text, $2::text)::regclass AS seq) AS q
    ) AS sequence_readable,
    (
        SELECT
            CASE
                WHEN HAS_SEQUENCE_PRIVILEGE(q.seq, 'SELECT,USAGE')
                    THEN PG_SEQUENCE_LAST_VALUE(q.seq)
            END
        FROM (SELECT PG_GET_SERIAL_SEQUENCE($1::text, $2::text)::regclass AS seq) AS q
    ) AS handed_out
FROM pg_locks AS w
CROSS JOIN code_in_the_window AS k
WHERE
    NOT w.granted
    AND w.pid <> PG_BACKEND_PID()
    AND (
        k.any_wait
        OR (
            w.locktype IN ('transactionid', 'speculative token')
            AND NOT EXISTS (
                SELECT 1
                FROM pg_locks AS t
                WHERE t.pid = w.pid AND t.locktype = 'tuple' AND t.granted
            )
        )
    )
    AND EXISTS (
        SELECT 1
        FROM pg_locks AS r
        WHERE
            r.pid = w.pid
            AND r.granted
            AND r.locktype = 'relation'
            AND r.mode = 'RowExclusiveLock'
            AND r.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = CURRENT_DATABASE())
            AND r.relation IN (SELECT t.oid FROM tables AS t)
    );
