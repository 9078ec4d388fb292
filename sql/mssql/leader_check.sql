-- gap-healer, SQL Server: does this session still hold the leader lock?
-- (LeaderLock::still_held, every second on the leader's own session.)
--   @P1 NVARCHAR  the lock's name, as given to leader_lock.sql
--
-- APPLOCK_MODE reports the mode that this session ('Session' owner) holds on
-- the resource in the current database: 'Exclusive' while the lock is held,
-- 'NoLock' once it is not. A killed or dead session does not answer at all,
-- which the engine reports as an error (and the healer stops filling either
-- way).
SELECT APPLOCK_MODE('public', @P1, 'Session') AS lock_mode;
