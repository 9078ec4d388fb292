-- The tombstone stream's row, locked for the rest of the fill transaction:
-- fills of every healer queue here, so stream positions never collide.
SELECT
    stream_id,
    version
FROM __schema__.streams
WHERE stream_name = $1::text
FOR UPDATE;
