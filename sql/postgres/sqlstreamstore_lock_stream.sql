-- sqlstreamstore: the tombstone stream's row in SQLStreamStore's streams,
-- locked for the rest of the fill transaction: the fills of every healer
-- queue here, so two never give out the same stream_version. $1 is the
-- row's id, the key SQLStreamStore finds a stream by (the SHA-1 of its name).
SELECT
    id_internal,
    version
FROM __schema__.streams
WHERE id = $1::bpchar
FOR UPDATE;
