-- gap-healer, SQL Server: take the leader lock (LeaderLock::try_lead).
--
-- Runs on a session of its own, never a pooled one. The lock is an
-- application lock: no table is read or written, and every database user may
-- take one (sp_getapplock needs only membership in public).
--   @P1 NVARCHAR  the lock's name, the leader key (at most 255 characters;
--                 compared binary, so case-sensitive); scoped to the current
--                 database
--
-- @LockOwner = 'Session': held until released or until the session ends (the
--   connection closes, the process dies, KILL, a failover), not tied to a
--   transaction or to this batch (the engine runs it through sp_executesql).
-- @LockTimeout = 0: never wait; return -1 at once when another session holds
--   the lock.
-- @DbPrincipal = 'public': the default, stated because leader_check.sql names
--   the same principal.
--
-- Result: one row. lock_result is sp_getapplock's return code (0 or 1 taken,
-- -1 held by another session, -2 cancelled, -3 deadlock victim, -999 call
-- error); session_id is @@SPID, for logs and tests.

DECLARE @lock_result INT;

EXEC @lock_result = sp_getapplock
    @Resource = @P1,
    @LockMode = 'Exclusive',
    @LockOwner = 'Session',
    @LockTimeout = 0,
    @DbPrincipal = 'public';

SELECT
    @lock_result AS lock_result,
    @@SPID AS session_id;
