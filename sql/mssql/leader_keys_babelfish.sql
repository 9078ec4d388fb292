-- gap-healer on Babelfish only, on the leader's lock session right after it
-- took the leader lock and its fence lock (leader_lock.sql): does
-- PostgreSQL's lock manager show both where the engine looks for them?
--
-- Babelfish keeps an application lock as a PostgreSQL advisory lock of the
-- database: pg_locks lists it with locktype 'advisory', the 64-bit key the
-- name hashes to split into classid (high 32 bits) and objid (low 32
-- bits), objsubid 2. The engine computes those keys from the names
-- (src/engine/mssql/leader.rs, `AppLockKey`); followers test the leader
-- lock's key there instead of asking for the lock, and every fill fenced
-- by this session tests that this session (its pid is @@SPID) still holds
-- the fence lock's key. This reading proves the computed keys against the
-- server once per leadership.
--   @P1 BIGINT  the leader lock's classid   @P2 BIGINT  its objid
--   @P3 BIGINT  the fence lock's classid    @P4 BIGINT  its objid
--
-- Result: one row. leader_held and fence_held: 1 when this session holds
-- a lock with that key, else 0.

SELECT
    CASE WHEN EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks AS l
        WHERE
            l.locktype = 'advisory'
            AND l.pid = @@SPID
            AND CAST(l.classid AS BIGINT) = @P1
            AND CAST(l.objid AS BIGINT) = @P2
            AND l.objsubid = 2
            AND l.granted = 'true'
    ) THEN 1 ELSE 0 END AS leader_held,
    CASE WHEN EXISTS (
        SELECT 1 FROM pg_catalog.pg_locks AS l
        WHERE
            l.locktype = 'advisory'
            AND l.pid = @@SPID
            AND CAST(l.classid AS BIGINT) = @P3
            AND CAST(l.objid AS BIGINT) = @P4
            AND l.objsubid = 2
            AND l.granted = 'true'
    ) THEN 1 ELSE 0 END AS fence_held;
