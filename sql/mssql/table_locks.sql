-- gap-healer on Babelfish only (PostgreSQL's executor behind SQL Server's
-- protocol), right before every fill batch: how many other sessions hold
-- or wait for a lock on Messages that blocks writers (ShareLock and above:
-- a CREATE INDEX, an ALTER TABLE, a LOCK TABLE). The fill's table stage
-- cannot wait for those itself on Babelfish, which ignores its XLOCK hint,
-- so they are read here and the store backs off (TableLocked) instead of
-- taking the table lock for held keys. pg_catalog.pg_locks is readable by
-- every login; OBJECT_ID is the table's PostgreSQL oid there. Not run on
-- SQL Server, whose table stage waits for such a lock itself.
--
-- The schema placeholder is replaced by the bracketed, validated schema name.

SELECT COUNT(DISTINCT t.pid) AS table_locks
FROM pg_catalog.pg_locks AS t
WHERE
    t.pid <> @@SPID
    AND t.locktype = 'relation'
    AND t.relation = OBJECT_ID(N'__schema__.[Messages]')
    AND t.mode IN (
        'ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock'
    );
