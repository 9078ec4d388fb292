-- gap-healer, SQL Server: everything `gap-healer check` looks at, in one
-- round trip. Two result sets:
--   1. one row: server, database, objects, options and the login's rights;
--   2. the columns of Messages, Streams and Checkpoints.
-- Parameter: @P1 NVARCHAR  the schema name, unquoted (for SCHEMA_ID). The
-- object names below are the bracketed, validated schema spliced in by the
-- engine. HAS_PERMS_BY_NAME answers NULL for an object the login cannot see.

-- Session option: bounded waits on metadata locks (for example a running
-- ALTER TABLE); reverts when the batch returns.
SET LOCK_TIMEOUT 5000;

-- IDENTITY_CACHE: SQL Server 2017 and later, Azure SQL. Read through
-- dynamic SQL only where the view exists (Babelfish has none): NULL where
-- the option is unknown.
DECLARE @identity_cache INT = NULL;
IF OBJECT_ID(N'sys.database_scoped_configurations') IS NOT NULL
    BEGIN
        EXEC sp_executesql
            N'SELECT @v = CAST(sc.value AS INT)
              FROM sys.database_scoped_configurations AS sc
              WHERE sc.name = N''IDENTITY_CACHE'';',
            N'@v INT OUTPUT',
            @v = @identity_cache OUTPUT;
    END;

-- Options that exist only on some servers, read where they exist and left
-- NULL elsewhere (and on Babelfish, which has none of them as SQL Server
-- means them, and where a failing statement must not be risked):
-- * updateability: READ_WRITE, or READ_ONLY on a readable secondary or a
--   database set READ_ONLY (fills fail there with 3906);
-- * optimized locking (SQL Server 2025, Azure SQL): DATABASEPROPERTYEX
--   answers NULL for a property a server does not know;
-- * accelerated database recovery (SQL Server 2019 and later, Azure SQL):
--   a column of sys.databases that older servers lack, so it is read by
--   dynamic SQL, compiled only where the column exists.
DECLARE @updateability NVARCHAR(128) = NULL;
DECLARE @optimized_locking INT = NULL;
DECLARE @accelerated_recovery BIT = NULL;
IF @@VERSION NOT LIKE N'%Babelfish%'
    BEGIN
        SET @updateability = CAST(
            DATABASEPROPERTYEX(DB_NAME(), 'Updateability') AS NVARCHAR(128)
        );
        SET @optimized_locking = CAST(
            DATABASEPROPERTYEX(DB_NAME(), 'IsOptimizedLockingOn') AS INT
        );
        IF COL_LENGTH(N'sys.databases', N'is_accelerated_database_recovery_on') IS NOT NULL
            BEGIN
                EXEC sp_executesql
                    N'SELECT @v = d.is_accelerated_database_recovery_on
                      FROM sys.databases AS d
                      WHERE d.database_id = DB_ID();',
                    N'@v BIT OUTPUT',
                    @v = @accelerated_recovery OUTPUT;
            END;
    END;

SELECT
    CAST(SERVERPROPERTY('ProductVersion') AS NVARCHAR(128)) AS product_version,
    CAST(SERVERPROPERTY('Edition') AS NVARCHAR(128)) AS edition,
    CAST(SERVERPROPERTY('EngineEdition') AS INT) AS engine_edition,
    DB_NAME() AS database_name,
    SUSER_SNAME() AS login_name,
    USER_NAME() AS user_name,
    CAST(CASE WHEN SCHEMA_ID(@P1) IS NULL THEN 0 ELSE 1 END AS BIT) AS schema_exists,
    CAST(
        CASE WHEN OBJECT_ID(N'__schema__.[Messages]', N'U') IS NULL THEN 0 ELSE 1 END AS BIT
    ) AS messages_exists,
    CAST(
        CASE WHEN OBJECT_ID(N'__schema__.[Streams]', N'U') IS NULL THEN 0 ELSE 1 END AS BIT
    ) AS streams_exists,
    CAST(
        CASE WHEN OBJECT_ID(N'__schema__.[Checkpoints]', N'U') IS NULL THEN 0 ELSE 1 END AS BIT
    ) AS checkpoints_exists,
    -- 1: the installed procedure has this version's interface; 0: another
    -- version; NULL: absent, or the login may not read its definition. (The
    -- fill procedure itself, its parameters and its tombstone stream and
    -- type, are checked by fill_mode.sql and a describing call, which a
    -- login with only EXECUTE can make.)
    CAST(
        CASE
            WHEN OBJECT_DEFINITION(OBJECT_ID(N'__schema__.[gap_healer_fill]', N'P')) IS NULL THEN NULL
            WHEN
                OBJECT_DEFINITION(OBJECT_ID(N'__schema__.[gap_healer_fill]', N'P'))
                LIKE N'%gap-healer fill procedure, interface version 3%'
                THEN 1
            ELSE 0
        END AS BIT
    ) AS procedure_current,
    -- The indexes keyed exactly on (GlobalPosition): the clustered primary
    -- key (scans are range reads), and a unique one without IGNORE_DUP_KEY
    -- (what makes a fill wait on an open append's key and fail on a committed
    -- one; without it a fill can take a slow append's position).
    CAST(COALESCE(position_keys.clustered_pk, 0) AS BIT) AS global_position_clustered_pk,
    CAST(COALESCE(position_keys.unique_key, 0) AS BIT) AS global_position_unique,
    CAST(IDENT_SEED(N'__schema__.[Messages]') AS BIGINT) AS identity_seed,
    CAST(IDENT_INCR(N'__schema__.[Messages]') AS BIGINT) AS identity_increment,
    CAST(IDENT_CURRENT(N'__schema__.[Messages]') AS BIGINT) AS identity_current,
    (
        SELECT d.is_read_committed_snapshot_on
        FROM sys.databases AS d
        WHERE d.database_id = DB_ID()
    ) AS read_committed_snapshot,
    @identity_cache AS identity_cache,
    @updateability AS updateability,
    @optimized_locking AS optimized_locking,
    @accelerated_recovery AS accelerated_recovery,
    HAS_PERMS_BY_NAME(N'__schema__.[Messages]', N'OBJECT', N'SELECT') AS messages_select,
    HAS_PERMS_BY_NAME(N'__schema__.[Messages]', N'OBJECT', N'INSERT') AS messages_insert,
    HAS_PERMS_BY_NAME(N'__schema__.[Messages]', N'OBJECT', N'ALTER') AS messages_alter,
    HAS_PERMS_BY_NAME(N'__schema__.[Streams]', N'OBJECT', N'SELECT') AS streams_select,
    HAS_PERMS_BY_NAME(N'__schema__.[Streams]', N'OBJECT', N'INSERT') AS streams_insert,
    HAS_PERMS_BY_NAME(N'__schema__.[Streams]', N'OBJECT', N'UPDATE') AS streams_update,
    HAS_PERMS_BY_NAME(N'__schema__.[Checkpoints]', N'OBJECT', N'SELECT') AS checkpoints_select
FROM (
    SELECT
        MAX(
            CASE WHEN i.is_primary_key = 1 AND i.type = 1 THEN 1 ELSE 0 END
        ) AS clustered_pk,
        MAX(
            CASE WHEN i.is_unique = 1 AND i.ignore_dup_key = 0 THEN 1 ELSE 0 END
        ) AS unique_key
    FROM sys.indexes AS i
    INNER JOIN sys.index_columns AS ic
        ON i.object_id = ic.object_id AND i.index_id = ic.index_id
    INNER JOIN sys.columns AS c
        ON ic.object_id = c.object_id AND ic.column_id = c.column_id
    WHERE
        i.object_id = OBJECT_ID(N'__schema__.[Messages]', N'U')
        AND ic.key_ordinal = 1
        AND c.name = N'GlobalPosition'
        AND NOT EXISTS (
            SELECT 1
            FROM sys.index_columns AS other
            WHERE
                other.object_id = i.object_id
                AND other.index_id = i.index_id
                AND other.key_ordinal > 1
        )
) AS position_keys;

SELECT
    t.name AS table_name,
    c.name AS column_name,
    ty.name AS type_name,
    c.is_nullable,
    c.is_identity,
    c.is_computed,
    CAST(CASE WHEN c.default_object_id <> 0 THEN 1 ELSE 0 END AS BIT) AS has_default
FROM sys.tables AS t
INNER JOIN sys.columns AS c ON t.object_id = c.object_id
INNER JOIN sys.types AS ty ON c.user_type_id = ty.user_type_id
WHERE
    t.schema_id = SCHEMA_ID(@P1)
    AND t.name IN (N'Messages', N'Streams', N'Checkpoints')
ORDER BY t.name, c.column_id;
