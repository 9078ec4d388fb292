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
-- @DbPrincipal = 'public': the default, stated because leader_check.sql and
--   the fence check in fill.sql name the same principal.
--
-- The fence: once the leader lock is taken, the same session takes a second
-- application lock, named with a fresh NEWID() that no other session knows.
-- It lives exactly as long as this session. Every fill of this process
-- passes its name, and fill.sql refuses to write (Busy) once no session holds
-- it: a fill through the pool cannot outlive the leader's session, even
-- before this process notices that it no longer leads. (APPLOCK_MODE only
-- reports the caller's own locks and sys.dm_tran_locks needs VIEW SERVER
-- STATE, so a pooled session cannot ask whether session N holds the leader
-- lock; it can ask whether anybody holds a lock that only session N has.)
--
-- Result: one row. lock_result is sp_getapplock's return code for the leader
-- lock (0 or 1 taken, -1 held by another session, -2 cancelled, -3 deadlock
-- victim, -999 call error); fence and fence_result are the fence lock's name
-- and return code (NULL unless the leader lock was taken); session_id is
-- @@SPID, for logs and tests.

-- The name is copied into an NVARCHAR(255) first: a parameter arrives as
-- NVARCHAR(4000), which Babelfish's sp_getapplock refuses (-999).
DECLARE @resource NVARCHAR(255) = @P1;
DECLARE @lock_result INT;
DECLARE @refused INT = NULL;
DECLARE @fence_result INT = NULL;
DECLARE @fence NVARCHAR(255) = NULL;

-- A lock another session holds is not asked for: APPLOCK_TEST answers
-- without taking it, and a follower keeps its session for its next try.
-- On Babelfish the engine sends this batch with both APPLOCK_TESTs
-- replaced by a look at PostgreSQL's lock manager (`pg_catalog.pg_locks`:
-- is the leader lock's advisory key granted to another session?), because
-- there every APPLOCK_TEST or sp_getapplock that finds the lock held
-- leaves an entry on the session's error stack, and the fifth crashes the
-- whole server ("PANIC: ERRORDATA_STACK_SIZE exceeded", Babelfish 4.2).
IF APPLOCK_TEST(N'public', @resource, N'Exclusive', N'Session') = 0
    BEGIN
        SET @lock_result = -1;
    END
ELSE
    BEGIN
        EXEC @lock_result = sp_getapplock
            @Resource = @resource,
            @LockMode = 'Exclusive',
            @LockOwner = 'Session',
            @LockTimeout = 0,
            @DbPrincipal = 'public';
    END;

-- Taken in between by another session: Babelfish says -999 where SQL
-- Server says -1. @refused says that sp_getapplock itself found the lock
-- held (the race between the test above and the call): the engine drops
-- such a session on Babelfish, whose error stack it has grown.
IF @lock_result = -999
    AND APPLOCK_TEST(N'public', @resource, N'Exclusive', N'Session') = 0
    BEGIN
        SET @refused = @lock_result;
        SET @lock_result = -1;
    END;

IF @lock_result >= 0
    BEGIN
        SET @fence = N'gap-healer fence '
            + CAST(@@SPID AS NVARCHAR(11)) + N' '
            + CAST(NEWID() AS NVARCHAR(36));
        EXEC @fence_result = sp_getapplock
            @Resource = @fence,
            @LockMode = 'Exclusive',
            @LockOwner = 'Session',
            @LockTimeout = 0,
            @DbPrincipal = 'public';
    END;

SELECT
    @lock_result AS lock_result,
    @refused AS refused,
    @fence_result AS fence_result,
    @fence AS fence,
    @@SPID AS session_id;
