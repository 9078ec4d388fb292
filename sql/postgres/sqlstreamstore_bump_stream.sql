-- sqlstreamstore: the tombstone stream's row after a fill, in the fill's
-- transaction. Its version moves by exactly the rows inserted (their
-- stream_versions continue it), and its position, the stream's highest
-- position, rises to the highest one filled. $1 is its id_internal, $2 the
-- rows inserted, $3 the highest position inserted.
UPDATE __schema__.streams
SET
    version = version + $2::int,
    "position" = GREATEST("position", $3::bigint)
WHERE id_internal = $1::int;
