-- `gap-healer check`, sqlstreamstore: what the catalog says of the schema's
-- streams table, which holds the tombstone stream's row: its columns, the
-- unique key the row is made under (ON CONFLICT (id)), the default that
-- draws id_internal and the rights the fill uses on both. From pg_catalog
-- only, as preflight_table.sql. $1 is the schema.
WITH t AS (
    SELECT c.oid
    FROM pg_class AS c
    INNER JOIN pg_namespace AS n ON c.relnamespace = n.oid
    WHERE
        n.nspname = $1::text
        AND c.relname = 'streams'
        AND c.relkind IN ('r', 'p')
),

cols AS (
    SELECT
        a.attnum,
        a.attname::text AS name,
        a.attnotnull AS not_null,
        a.atthasdef OR a.attidentity <> '' AS has_default
    FROM t
    INNER JOIN pg_attribute AS a ON t.oid = a.attrelid
    WHERE a.attnum > 0 AND NOT a.attisdropped
),

seq AS (
    SELECT
        PG_GET_SERIAL_SEQUENCE(
            QUOTE_IDENT($1::text) || '.streams', 'id_internal'
        )::regclass AS oid
    FROM t
    WHERE
        EXISTS (SELECT 1 FROM cols WHERE name = 'id_internal')
        AND HAS_SCHEMA_PRIVILEGE($1::text, 'USAGE')
)

SELECT
    EXISTS (SELECT 1 FROM t) AS streams_exists,
    ARRAY(SELECT name FROM cols ORDER BY attnum) AS column_names,
    ARRAY(
        SELECT name FROM cols
        WHERE not_null AND NOT has_default
        ORDER BY attnum
    ) AS required,
    EXISTS (
        SELECT 1
        FROM t
        INNER JOIN pg_index AS i ON t.oid = i.indrelid
        INNER JOIN cols ON cols.name = 'id'
        WHERE
            i.indisunique
            AND i.indpred IS NULL
            AND i.indnkeyatts = 1
            AND i.indkey[0] = cols.attnum
    ) AS id_unique,
    (SELECT oid::text FROM seq) AS id_sequence,
    (SELECT HAS_SEQUENCE_PRIVILEGE(oid, 'USAGE') FROM seq) AS sequence_usage,
    (SELECT HAS_TABLE_PRIVILEGE(t.oid, 'SELECT') FROM t) AS streams_select,
    (
        SELECT BOOL_AND(HAS_COLUMN_PRIVILEGE(t.oid, c.attnum, 'INSERT'))
        FROM t CROSS JOIN cols AS c
        WHERE c.name IN ('id', 'id_original')
    ) AS streams_insert,
    (
        SELECT BOOL_AND(HAS_COLUMN_PRIVILEGE(t.oid, c.attnum, 'UPDATE'))
        FROM t CROSS JOIN cols AS c
        WHERE c.name IN ('version', 'position')
    ) AS streams_update;
