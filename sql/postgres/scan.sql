-- One page of the forward scan: the next $2 committed positions above $1,
-- read from the primary key index only, and the holes between them.
-- Holes are computed here (LAG over the page) so only hole ranges travel;
-- the first row's predecessor is $1 itself, so a hole right above the last
-- examined position is found too. Always returns at least one row: hi and n
-- describe the page, gap_start/gap_end are NULL when it has no hole.
WITH page AS (
    SELECT __position__ AS p
    FROM __table__
    WHERE __position__ > $1::bigint
    ORDER BY __position__
    LIMIT $2::bigint
),

d AS (
    SELECT
        p,
        LAG(p, 1, $1::bigint) OVER (ORDER BY p) AS prev
    FROM page
)

SELECT
    m.hi,
    m.n,
    d.prev + 1 AS gap_start,
    d.p - 1 AS gap_end
FROM (SELECT COALESCE(MAX(p), $1::bigint) AS hi, COUNT(*) AS n FROM page) AS m
LEFT JOIN d ON d.p > d.prev + 1
ORDER BY gap_start;
