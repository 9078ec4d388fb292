-- `gap-healer check` for a table profile (ledger-core, sqlstreamstore,
-- custom): the catalog facts about the healed table in one row, from
-- pg_catalog only (as preflight.sql, so it answers whatever the login may
-- read). $1 is the schema, $2 the table, $3 the position column.
WITH t AS (
    SELECT c.oid
    FROM pg_class AS c
    INNER JOIN pg_namespace AS n ON c.relnamespace = n.oid
    WHERE
        n.nspname = $1::text
        AND c.relname = $2::text
        AND c.relkind IN ('r', 'p')
),

cols AS (
    SELECT
        a.attnum,
        a.attname::text AS name,
        FORMAT_TYPE(a.atttypid, a.atttypmod) AS data_type,
        a.attnotnull AS not_null,
        a.atthasdef OR a.attidentity <> '' AS has_default,
        a.attidentity <> '' AS is_identity,
        a.attgenerated <> '' AS is_generated
    FROM t
    INNER JOIN pg_attribute AS a ON t.oid = a.attrelid
    WHERE a.attnum > 0 AND NOT a.attisdropped
),

uniq AS (
    SELECT
        c.relname::text AS name,
        ARRAY_TO_STRING(ARRAY(
            SELECT a.attname::text
            FROM UNNEST(i.indkey::int2 []) WITH ORDINALITY AS k (attnum, ord)
            INNER JOIN pg_attribute AS a
                ON i.indrelid = a.attrelid AND k.attnum = a.attnum
            WHERE k.ord <= i.indnkeyatts
            ORDER BY k.ord
        ), ',') AS columns
    FROM t
    INNER JOIN pg_index AS i ON t.oid = i.indrelid
    INNER JOIN pg_class AS c ON i.indexrelid = c.oid
    WHERE i.indisunique AND i.indpred IS NULL
)

SELECT
    CURRENT_SETTING('server_version') AS server_version,
    CURRENT_SETTING('server_version_num')::int AS server_version_num,
    (SELECT s.ssl FROM pg_stat_ssl AS s WHERE s.pid = PG_BACKEND_PID()) AS encrypted,
    CURRENT_USER::text AS login,
    EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1::text) AS schema_exists,
    (
        SELECT HAS_SCHEMA_PRIVILEGE(n.oid, 'USAGE')
        FROM pg_namespace AS n WHERE n.nspname = $1::text
    ) AS schema_usage,
    EXISTS (SELECT 1 FROM t) AS table_exists,
    ARRAY(SELECT name FROM cols ORDER BY attnum) AS column_names,
    ARRAY(SELECT data_type FROM cols ORDER BY attnum) AS column_types,
    ARRAY(SELECT not_null FROM cols ORDER BY attnum) AS column_not_null,
    ARRAY(SELECT has_default FROM cols ORDER BY attnum) AS column_default,
    ARRAY(SELECT is_identity FROM cols ORDER BY attnum) AS column_identity,
    ARRAY(SELECT is_generated FROM cols ORDER BY attnum) AS column_generated,
    (
        SELECT PG_GET_SERIAL_SEQUENCE(QUOTE_IDENT($1::text) || '.' || QUOTE_IDENT($2::text), $3::text)
        FROM t
        WHERE
            EXISTS (SELECT 1 FROM cols WHERE name = $3::text)
            AND HAS_SCHEMA_PRIVILEGE($1::text, 'USAGE')
    ) AS position_sequence,
    ARRAY(SELECT name FROM uniq ORDER BY name) AS unique_names,
    ARRAY(SELECT columns FROM uniq ORDER BY name) AS unique_columns,
    (SELECT HAS_TABLE_PRIVILEGE(t.oid, 'SELECT') FROM t) AS table_select,
    (SELECT HAS_TABLE_PRIVILEGE(t.oid, 'INSERT') FROM t) AS table_insert;
