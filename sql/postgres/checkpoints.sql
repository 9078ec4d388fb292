-- Every checkpoint of the store (Eventuous: one row per subscription;
-- position NULL until it has handled an event).
SELECT
    id::text AS id,
    position::bigint AS position
FROM __schema__.checkpoints
ORDER BY id;
