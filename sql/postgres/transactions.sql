-- The transaction-end proof's question (src/proof.rs), for every store of a
-- database at once: which transactions hold RowExclusiveLock on the
-- sequences the stores' positions are drawn from ($1: their oids). Every
-- transaction that draws a position takes that lock before it draws and
-- keeps it until it ends (through ROLLBACK TO SAVEPOINT and exception
-- blocks too), so a position handed out before handed_out.sql answered
-- belongs to a transaction listed here, or to one that has ended. Sent only
-- after handed_out.sql has answered. pg_locks is readable by every login;
-- one call (materialized) takes every lock partition once.
--
-- id: the transaction's virtualtransaction, never given to another while it
-- runs; xid: its top-level transaction id where one is assigned (the oldest
-- transactionid it holds in ExclusiveLock), which survives PREPARE
-- TRANSACTION (the prepared transaction's virtualtransaction is a new one,
-- and its pid NULL); application: its session's application_name, which
-- pg_stat_activity shows to every login. The reading's own session is left
-- out.
WITH l AS MATERIALIZED (
    SELECT
        locktype,
        database,
        relation,
        transactionid,
        virtualtransaction,
        pid,
        mode,
        granted
    FROM pg_catalog.pg_locks
)

SELECT
    s.relation AS sequence,
    s.virtualtransaction AS id,
    s.pid,
    (
        SELECT x.transactionid::text
        FROM l AS x
        WHERE
            x.virtualtransaction = s.virtualtransaction
            AND x.locktype = 'transactionid'
            AND x.mode = 'ExclusiveLock'
            AND x.granted
        ORDER BY AGE(x.transactionid) DESC
        LIMIT 1
    ) AS xid,
    (
        SELECT a.application_name::text
        FROM pg_catalog.pg_stat_activity AS a
        WHERE a.pid = s.pid
    ) AS application
FROM l AS s
WHERE
    s.locktype = 'relation'
    AND s.database = (
        SELECT d.oid FROM pg_catalog.pg_database AS d
        WHERE d.datname = CURRENT_DATABASE()
    )
    AND s.relation = ANY($1::oid [])
    AND s.mode = 'RowExclusiveLock'
    AND s.granted
    AND s.pid IS DISTINCT FROM PG_BACKEND_PID();
