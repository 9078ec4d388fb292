-- `gap-healer check`: the catalog facts about the store in one row. Every
-- expression reads pg_catalog only (never information_schema, which hides
-- what the login has no right on, nor TO_REGCLASS, which needs USAGE on the
-- schema), so it answers whether or not the tables exist and whatever the
-- login may read: a table without rights is a missing right, not a missing
-- table. $1 is the schema.
WITH tables AS (
    SELECT
        c.oid,
        c.relname::text AS table_name
    FROM pg_class AS c
    INNER JOIN pg_namespace AS n ON c.relnamespace = n.oid
    WHERE
        n.nspname = $1::text
        AND c.relname IN ('messages', 'streams', 'checkpoints')
        AND c.relkind IN ('r', 'p')
),

cols AS (
    SELECT
        t.table_name,
        a.attname::text AS column_name,
        FORMAT_TYPE(a.atttypid, NULL) AS data_type,
        a.attidentity <> '' AS is_identity
    FROM tables AS t
    INNER JOIN pg_attribute AS a ON t.oid = a.attrelid
    WHERE a.attnum > 0 AND NOT a.attisdropped
),

pk AS (
    SELECT
        k.conname::text AS name,
        ARRAY(
            SELECT a.attname::text
            FROM UNNEST(k.conkey) AS key (attnum)
            INNER JOIN pg_attribute AS a
                ON k.conrelid = a.attrelid AND key.attnum = a.attnum
        ) AS columns
    FROM pg_constraint AS k
    WHERE
        k.conrelid = (SELECT t.oid FROM tables AS t WHERE t.table_name = 'messages')
        AND k.contype = 'p'
),

-- The sequence the position is drawn from, found through pg_depend (not
-- pg_get_serial_sequence, which needs USAGE on the schema): the
-- transaction-end proof reads how far it has handed out (SELECT on it).
seq AS (
    SELECT d.objid AS oid
    FROM pg_depend AS d
    INNER JOIN pg_class AS c ON d.objid = c.oid
    WHERE
        d.refobjid = (SELECT t.oid FROM tables AS t WHERE t.table_name = 'messages')
        AND d.classid = 'pg_class'::regclass
        AND d.refclassid = 'pg_class'::regclass
        AND d.deptype IN ('a', 'i')
        AND c.relkind = 'S'
    LIMIT 1
),

oids AS (
    SELECT
        (SELECT t.oid FROM tables AS t WHERE t.table_name = 'messages') AS messages,
        (SELECT t.oid FROM tables AS t WHERE t.table_name = 'streams') AS streams,
        (SELECT t.oid FROM tables AS t WHERE t.table_name = 'checkpoints') AS checkpoints
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
    ARRAY(SELECT table_name FROM cols ORDER BY table_name, column_name) AS column_tables,
    ARRAY(SELECT column_name FROM cols ORDER BY table_name, column_name) AS column_names,
    ARRAY(SELECT data_type FROM cols ORDER BY table_name, column_name) AS column_types,
    ARRAY(SELECT is_identity FROM cols ORDER BY table_name, column_name) AS column_identity,
    (SELECT name FROM pk) AS pkey_name,
    COALESCE((SELECT columns FROM pk), '{}'::text []) AS pkey_columns,
    HAS_TABLE_PRIVILEGE(o.messages, 'SELECT') AS messages_select,
    HAS_TABLE_PRIVILEGE(o.messages, 'INSERT') AS messages_insert,
    HAS_TABLE_PRIVILEGE(o.streams, 'SELECT') AS streams_select,
    HAS_ANY_COLUMN_PRIVILEGE(o.streams, 'INSERT') AS streams_insert,
    HAS_ANY_COLUMN_PRIVILEGE(o.streams, 'UPDATE') AS streams_update,
    HAS_TABLE_PRIVILEGE(o.checkpoints, 'SELECT') AS checkpoints_select,
    (SELECT q.oid::regclass::text FROM seq AS q) AS sequence_name,
    (SELECT HAS_SEQUENCE_PRIVILEGE(q.oid, 'SELECT') FROM seq AS q) AS sequence_select
FROM oids AS o;
