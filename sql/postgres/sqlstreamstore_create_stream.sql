-- sqlstreamstore: the tombstone stream's row, made on the first fill with
-- the columns' own defaults (version -1 and position -1: a stream without
-- messages; id_internal drawn from its sequence). $1 is its id, $2 its name.
INSERT INTO __schema__.streams (id, id_original)
VALUES ($1::bpchar, $2::text)
ON CONFLICT (id) DO NOTHING;
