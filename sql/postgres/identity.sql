-- The identity's seed (its first value): positions below it are never
-- holes. $1 is the table's qualified name, $2 its position column.
SELECT s.seqstart AS seed
FROM pg_sequence AS s
WHERE s.seqrelid = PG_GET_SERIAL_SEQUENCE($1::text, $2::text)::regclass;
