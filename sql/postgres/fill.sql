-- The tombstones for every position of the ranges ($1[i]..$2[i]), in one
-- statement. OVERRIDING SYSTEM VALUE writes the explicit position without
-- touching the identity's counter. Each row must check the primary key, so
-- it waits on the key lock of an open append at that position (bounded by
-- lock_timeout) and fails with 23505 if an append committed there: the
-- database, not the healer, decides. Stream positions continue the tombstone
-- stream ($4 = its Version) in global position order.
INSERT INTO __schema__.messages (
    message_id, message_type, stream_id, stream_position,
    global_position, json_data, json_metadata, created
)
OVERRIDING SYSTEM VALUE
SELECT
    GEN_RANDOM_UUID(),
    $5::varchar,
    $3::int,
    $4::int + (ROW_NUMBER() OVER (ORDER BY g.p))::int,
    g.p,
    '{}'::jsonb,
    NULL,
    (NOW() AT TIME ZONE 'utc')
FROM UNNEST($1::bigint [], $2::bigint []) AS r (a, b)
CROSS JOIN LATERAL GENERATE_SERIES(r.a, r.b) AS g (p);
