-- The tombstones for positions $1..$2, in one statement.
-- OVERRIDING SYSTEM VALUE writes the explicit position without touching the
-- identity's counter. Each row must check the primary key, so it waits on the
-- key lock of an open append at that position (bounded by lock_timeout) and
-- fails with 23505 if an append committed there: the database, not the healer,
-- decides. Stream positions continue the tombstone stream ($4 = its Version),
-- in global position order.
INSERT INTO __schema__.messages (
    message_id, message_type, stream_id, stream_position,
    global_position, json_data, json_metadata, created
)
OVERRIDING SYSTEM VALUE
SELECT
    GEN_RANDOM_UUID(),
    $5::varchar,
    $3::int,
    $4::int + 1 + (g - $1::bigint)::int,
    g,
    '{}'::jsonb,
    NULL,
    (NOW() AT TIME ZONE 'utc')
FROM GENERATE_SERIES($1::bigint, $2::bigint) AS g;
