-- gap-healer, SQL Server: the checkpoints of many stores of one instance in
-- one reading (src/engine/mssql/checkpoints.rs), each store's table named by
-- its three-part name, so a database-per-tenant fleet reads every tenant's
-- checkpoints on one session in one round trip every checkpoint_refresh. The
-- SELECT of `__checkpoints__` below is repeated once per store, joined by
-- UNION ALL, at most MAX_PER_STATEMENT of them: 0 becomes the store's place
-- in the reading (n), `__checkpoints__` its `[db].[schema].[Checkpoints]`.
--
-- Each table is read as checkpoints.sql reads it: no READPAST (a skipped row
-- could hide the lowest checkpoint), so a checkpoint row being written is
-- waited for, but only briefly: a row or table lock held longer (DDL, a
-- dropped table, a database gone) fails the reading after the lock timeout,
-- every store of it then reads its own once, instead of holding every store
-- of the instance behind one. The SET reverts when the batch returns
-- (sp_executesql).
SET LOCK_TIMEOUT 200;

SELECT 0 AS n, c.Id AS id, c.Position AS position FROM __checkpoints__ AS c;
