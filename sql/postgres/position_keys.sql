-- The names of the unique indexes (and the constraints they back) on exactly
-- the position column, with no predicate: a duplicate key on one of them
-- means an append committed at the position; on any other, something else
-- writes the tombstone stream. immediate: checked as each row goes in (a
-- DEFERRABLE key is checked at commit, where a fill's wait on an open
-- append's key would come too late to decide). $1 is the table's qualified
-- name, $2 its position column.
SELECT
    c.relname::text AS name,
    i.indimmediate AS immediate
FROM pg_index AS i
INNER JOIN pg_class AS c ON i.indexrelid = c.oid
INNER JOIN pg_attribute AS a
    ON i.indrelid = a.attrelid AND i.indkey[0] = a.attnum
WHERE
    i.indrelid = TO_REGCLASS($1::text)
    AND i.indisunique
    AND i.indnkeyatts = 1
    AND i.indpred IS NULL
    AND a.attname = $2::text
ORDER BY c.relname;
