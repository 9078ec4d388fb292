-- What `check` needs to know about the watermark table $1 ('schema.table'):
-- whether it exists, whether its columns are the ones gap-healer writes,
-- and whether this login may read and write it.
SELECT
    to_regclass($1::text) IS NOT NULL AS table_exists,
    COALESCE((
        SELECT array_agg(a.attname::text || ' ' || format_type(a.atttypid, a.atttypmod) ORDER BY a.attnum)
        FROM pg_attribute a
        WHERE a.attrelid = to_regclass($1::text) AND a.attnum > 0 AND NOT a.attisdropped
    ), ARRAY[]::text[]) AS columns,
    COALESCE((
        SELECT bool_or(i.indisunique AND i.indnatts = 1 AND a.attname = 'store')
        FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
        WHERE i.indrelid = to_regclass($1::text)
    ), false) AS store_is_unique,
    to_regclass($1::text) IS NOT NULL
        AND has_table_privilege(to_regclass($1::text), 'SELECT')
        AND has_table_privilege(to_regclass($1::text), 'INSERT')
        AND has_table_privilege(to_regclass($1::text), 'UPDATE') AS writable,
    current_user::text AS login;
