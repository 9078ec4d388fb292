-- gap-healer, SQL Server: the highest and the lowest COMMITTED positions
-- (Engine::head, Engine::first_position). NULLs for an empty table.
--
-- The schema placeholder is replaced by the bracketed, validated schema name
-- before this text is sent; nothing else is ever spliced in.

-- Session option: a read never waits long on a page or table lock (READPAST
-- skips row and key locks, not page or table locks, for example those of an
-- append that escalated). It applies to this batch only: tiberius runs every
-- query through sp_executesql, and SET options set there revert when the
-- batch returns, so the pooled session keeps its defaults.
SET LOCK_TIMEOUT 5000;

-- READCOMMITTEDLOCK: read committed BY LOCKING, also when the database has
-- READ_COMMITTED_SNAPSHOT on (READPAST is refused under row versioning
-- unless READCOMMITTEDLOCK is given).
-- READPAST: skip rows whose key an open transaction holds, instead of waiting
-- for it. The newest row of an append still in flight is therefore not the
-- head; the fill refuses to go at or above the head, so it never fills the
-- tail of an append that may still commit.
-- Only the clustered key is read: TOP 1 from each end of PK_Events. The
-- first position is where a store reseeded before its first append begins
-- (DBCC CHECKIDENT ... RESEED changes the current identity value, not
-- IDENT_SEED): the healer does not start below it unless told to. It is
-- read dirty (NOLOCK), so that an append still open below the first
-- committed row counts: its position is examined, and filled if it rolls
-- back. (Babelfish has no dirty reads: there a first committed row above
-- an open first append is taken for a reseed; see docs/sqlserver.md.)
SELECT
    (
        SELECT TOP (1) m.GlobalPosition
        FROM __schema__.[Messages] AS m WITH (READCOMMITTEDLOCK, READPAST)
        ORDER BY m.GlobalPosition DESC
    ) AS position,
    (
        SELECT TOP (1) f.GlobalPosition
        FROM __schema__.[Messages] AS f WITH (NOLOCK)
        ORDER BY f.GlobalPosition ASC
    ) AS first_position;
