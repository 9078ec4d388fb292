-- `gap-healer check`: the catalog facts about the store in one row. Every
-- expression reads catalogs only, so it answers whether or not the tables
-- exist and whatever the login may read. $1 is the schema.
WITH cols AS (
    SELECT
        c.table_name::text AS table_name,
        c.column_name::text AS column_name,
        c.data_type::text AS data_type,
        c.is_identity = 'YES' AS is_identity
    FROM information_schema.columns AS c
    WHERE
        c.table_schema = $1::text
        AND c.table_name IN ('messages', 'streams', 'checkpoints')
),

pk AS (
    SELECT
        k.conname::text AS name,
        ARRAY(
            SELECT a.attname::text
            FROM UNNEST(k.conkey) AS key (attnum)
            INNER JOIN pg_attribute AS a
                ON a.attrelid = k.conrelid AND a.attnum = key.attnum
        ) AS columns
    FROM pg_constraint AS k
    WHERE
        k.conrelid = TO_REGCLASS($1::text || '.messages')
        AND k.contype = 'p'
)

SELECT
    CURRENT_SETTING('server_version') AS server_version,
    CURRENT_SETTING('server_version_num')::int AS server_version_num,
    (SELECT s.ssl FROM pg_stat_ssl AS s WHERE s.pid = PG_BACKEND_PID()) AS encrypted,
    EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1::text) AS schema_exists,
    ARRAY(SELECT table_name FROM cols ORDER BY table_name, column_name) AS column_tables,
    ARRAY(SELECT column_name FROM cols ORDER BY table_name, column_name) AS column_names,
    ARRAY(SELECT data_type FROM cols ORDER BY table_name, column_name) AS column_types,
    ARRAY(SELECT is_identity FROM cols ORDER BY table_name, column_name) AS column_identity,
    (SELECT name FROM pk) AS pkey_name,
    COALESCE((SELECT columns FROM pk), '{}'::text []) AS pkey_columns,
    HAS_TABLE_PRIVILEGE(TO_REGCLASS($1::text || '.messages'), 'SELECT') AS messages_select,
    HAS_TABLE_PRIVILEGE(TO_REGCLASS($1::text || '.messages'), 'INSERT') AS messages_insert,
    HAS_TABLE_PRIVILEGE(TO_REGCLASS($1::text || '.streams'), 'SELECT') AS streams_select,
    HAS_ANY_COLUMN_PRIVILEGE(TO_REGCLASS($1::text || '.streams'), 'INSERT') AS streams_insert,
    HAS_ANY_COLUMN_PRIVILEGE(TO_REGCLASS($1::text || '.streams'), 'UPDATE') AS streams_update,
    HAS_TABLE_PRIVILEGE(TO_REGCLASS($1::text || '.checkpoints'), 'SELECT') AS checkpoints_select;
