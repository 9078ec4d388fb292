-- The sequence a store's positions are drawn from, resolved once per store
-- for the readings of open transactions (transactions.sql): its oid, its
-- name as the catalog quotes it (spliced into handed_out.sql), and whether
-- this login may read it (SELECT on the sequence; without it the reading
-- learns how far positions were handed out from the scan instead). $1 is the
-- table's qualified name, $2 its position column.
SELECT
    q.seq::oid AS oid,
    q.seq::text AS name,
    HAS_SEQUENCE_PRIVILEGE(q.seq, 'SELECT') AS readable
FROM (SELECT PG_GET_SERIAL_SEQUENCE($1::text, $2::text)::regclass AS seq) AS q
WHERE q.seq IS NOT NULL;
