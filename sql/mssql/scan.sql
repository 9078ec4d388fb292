-- gap-healer, SQL Server: one page of the forward scan (Engine::scan).
--
-- Parameters (bound, never spliced):
--   @P1 BIGINT  after: the last position already examined
--   @P2 INT     the page size
--
-- Returns only the rows that end a hole (position > previous + 1) and the last
-- row of the page, so a page of 10,000 contiguous rows sends one row back.
-- For every returned row, previous_position + 1 .. position - 1 is a hole when
-- position > previous_position + 1; the last row (is_last = 1) carries the
-- page's highest position and its row count.

-- Session option: see head.sql. Bounded waits on page/table locks only.
SET LOCK_TIMEOUT 5000;

WITH page AS (
    -- The committed keys above @P1, in key order, read from the clustered
    -- primary key only (never the NVARCHAR(MAX) columns).
    -- READCOMMITTEDLOCK + READPAST: rows of appends still in flight are
    -- skipped, not waited on, with READ_COMMITTED_SNAPSHOT on or off. An
    -- in-flight position therefore shows up INSIDE a hole, which is what we
    -- want: if that append rolls back the hole is real, and if it commits the
    -- fill's key check finds it (duplicate key) and the probe drops it. A
    -- NOLOCK scan would show it as present and lose the hole for good if the
    -- append rolled back.
    SELECT TOP (@P2) m.GlobalPosition AS position
    FROM __schema__.[Messages] AS m WITH (READCOMMITTEDLOCK, READPAST)
    WHERE m.GlobalPosition > @P1
    ORDER BY m.GlobalPosition
),

marked AS (
    -- One ordered pass: every window shares ORDER BY position, which the
    -- clustered index already provides, so there is no sort and no spool.
    SELECT
        p.position,
        LAG(p.position, 1, @P1) OVER (ORDER BY p.position) AS previous_position,
        LEAD(p.position) OVER (ORDER BY p.position) AS next_position,
        ROW_NUMBER() OVER (ORDER BY p.position) AS rows_read
    FROM page AS p
)

SELECT
    mk.previous_position,
    mk.position,
    mk.rows_read,
    CAST(CASE WHEN mk.next_position IS NULL THEN 1 ELSE 0 END AS BIT) AS is_last
FROM marked AS mk
WHERE mk.position > mk.previous_position + 1 OR mk.next_position IS NULL
ORDER BY mk.position;
