-- The tombstone stream's row, created empty (Version -1) on the first fill.
INSERT INTO __schema__.streams (stream_name, version)
VALUES ($1::text, -1)
ON CONFLICT (stream_name) DO NOTHING;
