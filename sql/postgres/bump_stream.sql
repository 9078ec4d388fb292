-- The tombstone stream's Version moves by exactly the rows the fill inserted.
UPDATE __schema__.streams SET version = version + $2::int
WHERE stream_id = $1::int;
