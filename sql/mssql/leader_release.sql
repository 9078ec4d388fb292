-- gap-healer, SQL Server: give up one store's leader lock and its fence,
-- keeping the session (LeaderLock::unlock, on a lock session that the
-- stores of one instance share; the other stores' locks on it stay).
--   @P1 NVARCHAR  the leader lock's name, as given to leader_lock.sql
--   @P2 NVARCHAR  the name of the fence lock taken with it
--
-- The fence goes first: once it is released, every fill fenced by it is
-- refused (fill.sql tests the fence inside its transaction), so no fill of
-- this process can still write when another session takes the leader lock
-- a moment later.
--
-- Each lock is released only while this session holds it (APPLOCK_MODE),
-- so a lock already gone is no error. A session-owned application lock is
-- counted: it is released as often as it was taken, to be gone.
--
-- Result: one row, the number of releases of each lock.

DECLARE @resource NVARCHAR(255) = @P1;
DECLARE @fence NVARCHAR(255) = @P2;
DECLARE @fence_releases INT = 0;
DECLARE @leader_releases INT = 0;

WHILE APPLOCK_MODE(N'public', @fence, N'Session') = N'Exclusive'
    AND @fence_releases < 100
    BEGIN
        EXEC sp_releaseapplock
            @Resource = @fence,
            @LockOwner = 'Session',
            @DbPrincipal = 'public';
        SET @fence_releases = @fence_releases + 1;
    END;

WHILE APPLOCK_MODE(N'public', @resource, N'Session') = N'Exclusive'
    AND @leader_releases < 100
    BEGIN
        EXEC sp_releaseapplock
            @Resource = @resource,
            @LockOwner = 'Session',
            @DbPrincipal = 'public';
        SET @leader_releases = @leader_releases + 1;
    END;

SELECT
    @fence_releases AS fence_releases,
    @leader_releases AS leader_releases,
    APPLOCK_MODE(N'public', @resource, N'Session') AS lock_mode;
