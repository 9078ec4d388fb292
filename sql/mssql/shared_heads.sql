-- gap-healer, SQL Server: the heads of many stores of one instance in one
-- reading (src/engine/mssql/heads.rs), each store's table named by its
-- three-part name, so a database-per-tenant fleet needs neither a session
-- nor a round trip per database. The row `(0, __heads__)` is replaced by one
-- `(n, (SELECT TOP (1) ...))` row per store, at most MAX_PER_STATEMENT of
-- them; n is the store's place in the reading.
--
-- Each head is read as head.sql reads it: READCOMMITTEDLOCK, READPAST, the
-- top of the clustered key, so an append in flight is skipped, not waited
-- for. A table lock (DDL) fails the reading after the lock timeout (every
-- store then scans on its own) instead of holding every store behind it; the
-- SET reverts when the batch returns (sp_executesql).
SET LOCK_TIMEOUT 200;

SELECT
    t.n,
    t.h
FROM (VALUES (0, __heads__)) AS t (n, h);
