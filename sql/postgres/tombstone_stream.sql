-- `gap-healer check`: the tombstone stream's Version beside its rows (no
-- row: the stream does not exist yet). Consistent means positions 0..n-1
-- and Version n-1.
SELECT
    s.version::bigint AS version,
    COUNT(m.*)::bigint AS rows,
    COALESCE(MIN(m.stream_position), 0)::bigint AS min_position,
    COALESCE(MAX(m.stream_position), -1)::bigint AS max_position
FROM __schema__.streams AS s
LEFT JOIN __schema__.messages AS m ON s.stream_id = m.stream_id
WHERE s.stream_name = $1::text
GROUP BY s.version;
