-- gap-healer, SQL Server: which positions of the tracked ranges exist now
-- (Engine::probe).
--
-- Parameters (bound, never spliced): pairs (@P1, @P2), (@P3, @P4), ... of
-- BIGINT range bounds, inclusive. The engine repeats the single VALUES row
-- below for as many ranges as it sends (padded to a power of two so the
-- server caches a handful of plans, at most 1,024 ranges per query); only
-- parameter markers it numbers itself are added, never values.
--
-- Returns (position, is_committed): every committed position in the ranges
-- with is_committed = 1, and every position an open transaction has inserted
-- with is_committed = 0 (committed ones appear in both; the engine keeps
-- in_flight = dirty minus committed).

-- Session option: see head.sql. Bounded waits on page/table locks only.
SET LOCK_TIMEOUT 5000;

WITH ranges (range_start, range_end) AS (
    SELECT
        v.range_start,
        v.range_end
    FROM (VALUES (@P1, @P2)) AS v (range_start, range_end)
)

-- Committed rows: locking read committed that skips held keys (see scan.sql),
-- correct with READ_COMMITTED_SNAPSHOT on or off. Key only. FORCESEEK: one
-- range seek of the clustered key per tracked range, never a scan of the
-- table (a join on BETWEEN has no other efficient plan).
SELECT
    m.GlobalPosition AS position,
    CAST(1 AS BIT) AS is_committed
FROM ranges AS r
INNER JOIN __schema__.[Messages] AS m WITH (READCOMMITTEDLOCK, READPAST, FORCESEEK)
    ON m.GlobalPosition BETWEEN r.range_start AND r.range_end

UNION ALL

-- Every row, committed or not: NOLOCK never waits and shows the rows of
-- appends in flight. A dirty read may miss or repeat a row during a page
-- split; harmless, because the fill's key check decides, not this read.
SELECT
    m.GlobalPosition AS position,
    CAST(0 AS BIT) AS is_committed
FROM ranges AS r
INNER JOIN __schema__.[Messages] AS m WITH (NOLOCK, FORCESEEK)
    ON m.GlobalPosition BETWEEN r.range_start AND r.range_end;
