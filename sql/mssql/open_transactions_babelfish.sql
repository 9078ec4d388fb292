-- The transaction-end proof's question on Babelfish for PostgreSQL
-- (src/proof.rs): T-SQL appends run PostgreSQL's executor, which draws the
-- identity value while it forms the row, after the statement has taken
-- RowExclusiveLock on Messages (when it is parsed, or when a cached plan
-- is run, before any row is formed), and keeps that lock until the
-- transaction ends. So a position drawn before this reading belongs to a
-- transaction listed here, or to one that has ended. The lock on the table,
-- not on its sequence: it is taken before the draw whatever the insert
-- does between its draw and its key (triggers, CHECK constraints, DEFAULTs
-- calling functions), and every writer of Messages is in the set, a
-- superset of the appends, so nothing is missed. pg_catalog.pg_locks is
-- readable by every login; OBJECT_ID is the table's PostgreSQL oid there.
--
-- id: the transaction's virtualtransaction, never given to another while it
-- runs; session_id: its backend pid (@@SPID there); application: the
-- session's application_name. The reading's own session is left out.
-- The schema placeholder is replaced by the bracketed, validated schema
-- name.

SELECT
    CAST(l.virtualtransaction AS NVARCHAR(40)) AS id,
    CAST(l.pid AS BIGINT) AS session_id,
    CAST(a.application_name AS NVARCHAR(256)) AS application
FROM pg_catalog.pg_locks AS l
LEFT JOIN pg_catalog.pg_stat_activity AS a ON l.pid = a.pid
WHERE
    l.locktype = 'relation'
    AND l.relation = OBJECT_ID(N'__schema__.[Messages]')
    AND l.mode = 'RowExclusiveLock'
    AND l.granted = 'true'
    AND (l.pid IS NULL OR l.pid <> @@SPID);
