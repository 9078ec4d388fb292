-- `gap-healer check`, sqlstreamstore: the tombstone stream's row beside its
-- messages (no row: the stream does not exist yet). Consistent means
-- stream_versions 0..n-1, the row's version n-1, and the row's position the
-- highest of its messages' (-1 while it has none). $1 is the row's id.
SELECT
    s.version::bigint AS version,
    s."position"::bigint AS "position",
    COUNT(m.*)::bigint AS rows,
    COALESCE(MIN(m.stream_version), 0)::bigint AS min_version,
    COALESCE(MAX(m.stream_version), -1)::bigint AS max_version,
    COALESCE(MAX(m."position"), -1)::bigint AS max_position
FROM __schema__.streams AS s
LEFT JOIN __schema__.messages AS m ON s.id_internal = m.stream_id_internal
WHERE s.id = $1::bpchar
GROUP BY s.version, s."position";
