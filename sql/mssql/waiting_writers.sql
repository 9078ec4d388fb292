-- gap-healer on Babelfish only (PostgreSQL's executor behind SQL Server's
-- protocol): the abandonment proof's question, asked right before every
-- fill batch. Babelfish inserts a row's index entries one index after the
-- other (in PostgreSQL's index order), and waits inside the unique check of
-- an index for any in-progress conflicting row: with a unique index created
-- before the position's key, an insert can wait there with its position
-- drawn and no key for the tombstone to wait on. This lists the other
-- sessions that hold a write lock (RowExclusiveLock) on Messages and wait
-- for a lock now the way such an insert waits (the same rule as the
-- PostgreSQL engine's sql/postgres/waiting_writers.sql, argued in
-- ARCHITECTURE.md); while any does, the fill writes nothing. Eventuous's own
-- table creates its primary key first, so its appends key the position
-- before they wait; the check is for every other shape, and costs one
-- query. pg_catalog.pg_locks is readable by every login; OBJECT_ID is the
-- table's PostgreSQL oid there. Not run on SQL Server, which writes the
-- clustered index, with its key lock, before any other index.
--
-- table_locks counts the other sessions that hold or wait for a lock on
-- Messages that blocks writers (ShareLock and above: a CREATE INDEX, an
-- ALTER TABLE, a LOCK TABLE): the fill's table stage cannot wait for those
-- itself on Babelfish, which ignores its XLOCK hint, so they are read here
-- and the store backs off instead of taking the table lock for held keys.
--
-- The schema placeholder is replaced by the bracketed, validated schema name.

SELECT
    (
        SELECT COUNT(DISTINCT w.pid)
        FROM pg_catalog.pg_locks AS w
        WHERE
            w.granted = 'false'
            AND w.pid <> @@SPID
            AND (
                -- User code in the window between the draw and the key (a
                -- T-SQL trigger on Messages, which Babelfish runs as
                -- PostgreSQL trigger code): every waiting writer counts.
                EXISTS (
                    SELECT 1
                    FROM pg_catalog.pg_trigger AS g
                    WHERE
                        g.tgrelid = OBJECT_ID(N'__schema__.[Messages]')
                        AND g.tgisinternal = 'false'
                )
                -- Otherwise only a wait the way an insert between its
                -- position and its key waits: for another transaction's id
                -- (or speculative token) in a unique check, holding no
                -- tuple lock (a row-lock wait, an UPDATE of a Streams row
                -- another append holds, holds the row's tuple lock while it
                -- waits), and only when a unique index comes before the
                -- position's in the order an insert writes them (index
                -- oid). When the position's unique index is the first, an
                -- insert has keyed its position before any unique check can
                -- make it wait, and the next row of the statement is not
                -- drawn until this one is in every index; T-SQL has no
                -- pre-check that waits before the row (Babelfish supports
                -- neither MERGE nor IGNORE_DUP_KEY). Eventuous's own table
                -- creates its primary key first.
                OR (
                    w.locktype IN ('transactionid', 'speculative token')
                    AND NOT EXISTS (
                        SELECT 1
                        FROM pg_catalog.pg_locks AS t
                        WHERE t.pid = w.pid AND t.locktype = 'tuple' AND t.granted = 'true'
                    )
                    AND NOT EXISTS (
                        SELECT 1
                        FROM pg_catalog.pg_index AS f
                        WHERE
                            f.indrelid = OBJECT_ID(N'__schema__.[Messages]')
                            AND f.indisunique = 'true'
                            AND f.indnatts = 1
                            AND CAST(f.indkey AS NVARCHAR(20)) = (
                                SELECT CAST(a.attnum AS NVARCHAR(20))
                                FROM pg_catalog.pg_attribute AS a
                                WHERE
                                    a.attrelid = f.indrelid
                                    AND LOWER(CAST(a.attname AS NVARCHAR(128))) = N'globalposition'
                            )
                            AND NOT EXISTS (
                                SELECT 1
                                FROM pg_catalog.pg_index AS e
                                WHERE
                                    e.indrelid = f.indrelid
                                    AND e.indisunique = 'true'
                                    AND CAST(e.indexrelid AS BIGINT) < CAST(f.indexrelid AS BIGINT)
                            )
                    )
                )
            )
            AND EXISTS (
                SELECT 1
                FROM pg_catalog.pg_locks AS r
                WHERE
                    r.pid = w.pid
                    AND r.granted = 'true'
                    AND r.locktype = 'relation'
                    AND r.mode = 'RowExclusiveLock'
                    AND r.relation = OBJECT_ID(N'__schema__.[Messages]')
            )
    ) AS sessions,
    (
        SELECT COUNT(DISTINCT t.pid)
        FROM pg_catalog.pg_locks AS t
        WHERE
            t.pid <> @@SPID
            AND t.locktype = 'relation'
            AND t.relation = OBJECT_ID(N'__schema__.[Messages]')
            AND t.mode IN (
                'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'
            )
    ) AS table_locks;
