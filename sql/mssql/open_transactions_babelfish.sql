-- The transaction-end proof's question on Babelfish for PostgreSQL
-- (src/proof.rs): T-SQL appends run PostgreSQL's executor, which draws the
-- identity value from the identity's sequence while it forms the row. Every
-- transaction that draws takes RowExclusiveLock on that sequence before it
-- draws and keeps it until it ends, whatever the insert does between its
-- draw and its key (a CHECK constraint or DEFAULT calling a function that
-- waits on a lock, a trigger), so a position drawn before this reading
-- belongs to a transaction listed here, or to one that has ended.
-- pg_catalog is readable by every login; OBJECT_ID is the table's
-- PostgreSQL oid there, and the sequence is the one the table depends on.
--
-- One result set (a driver may drop an empty one): first a row of kind
-- 'sequence' with the sequence's oid (NULL: none found, and the engine
-- refuses to read no transactions as "none open"), then a row of kind
-- 'transaction' per transaction: id, the virtualtransaction, never given to
-- another while it runs; session_id, its backend pid (@@SPID there);
-- application, the session's application_name. The reading's own session
-- is left out. The schema placeholder is replaced by the bracketed,
-- validated schema name.

DECLARE @sequence BIGINT = (
    SELECT TOP (1) CAST(c.oid AS BIGINT)
    FROM pg_catalog.pg_depend AS d
    INNER JOIN pg_catalog.pg_class AS c ON d.objid = c.oid
    WHERE
        d.refobjid = OBJECT_ID(N'__schema__.[Messages]')
        AND d.deptype IN ('a', 'i')
        AND c.relkind = 'S'
);

SELECT
    CAST(N'sequence' AS NVARCHAR(20)) AS kind,
    @sequence AS sequence_oid,
    CAST(NULL AS NVARCHAR(40)) AS id,
    CAST(NULL AS BIGINT) AS session_id,
    CAST(NULL AS NVARCHAR(256)) AS application
UNION ALL
SELECT
    CAST(N'transaction' AS NVARCHAR(20)) AS kind,
    @sequence AS sequence_oid,
    CAST(l.virtualtransaction AS NVARCHAR(40)) AS id,
    CAST(l.pid AS BIGINT) AS session_id,
    CAST(a.application_name AS NVARCHAR(256)) AS application
FROM pg_catalog.pg_locks AS l
LEFT JOIN pg_catalog.pg_stat_activity AS a ON l.pid = a.pid
WHERE
    l.locktype = 'relation'
    AND l.[database] = (
        SELECT d.oid FROM pg_catalog.pg_database AS d
        WHERE d.datname = pg_catalog.current_database()
    )
    AND CAST(l.relation AS BIGINT) = @sequence
    AND l.mode = 'RowExclusiveLock'
    AND l.granted = 'true'
    AND (l.pid IS NULL OR l.pid <> @@SPID);
