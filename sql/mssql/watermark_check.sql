-- What `check` needs to know about the watermark table @P1 ('schema.table'):
-- whether it exists, whether a unique key is on [store] alone, whether this
-- login may read and write it (first result set), and its columns with
-- their types (second result set).
SELECT
    CAST(CASE WHEN OBJECT_ID(@P1, N'U') IS NULL THEN 0 ELSE 1 END AS BIT) AS table_exists,
    CAST(CASE WHEN EXISTS (
        SELECT 1
        FROM sys.indexes AS i
        INNER JOIN sys.index_columns AS ic
            ON i.object_id = ic.object_id AND i.index_id = ic.index_id
        INNER JOIN sys.columns AS c
            ON ic.object_id = c.object_id AND ic.column_id = c.column_id
        WHERE
            i.object_id = OBJECT_ID(@P1, N'U')
            AND i.is_unique = 1
            AND ic.is_included_column = 0
            AND LOWER(c.name) = N'store'
            AND (
                SELECT COUNT(*) FROM sys.index_columns AS k
                WHERE
                    k.object_id = i.object_id
                    AND k.index_id = i.index_id
                    AND k.is_included_column = 0
            ) = 1
    ) THEN 1 ELSE 0 END AS BIT) AS store_is_unique,
    CAST(CASE WHEN
        OBJECT_ID(@P1, N'U') IS NOT NULL
        AND HAS_PERMS_BY_NAME(@P1, N'OBJECT', N'SELECT') = 1
        AND HAS_PERMS_BY_NAME(@P1, N'OBJECT', N'INSERT') = 1
        AND HAS_PERMS_BY_NAME(@P1, N'OBJECT', N'UPDATE') = 1
        THEN 1 ELSE 0 END AS BIT) AS writable,
    USER_NAME() AS login;

SELECT LOWER(c.name) + N' ' + LOWER(TYPE_NAME(c.user_type_id)) AS column_type
FROM sys.columns AS c
WHERE c.object_id = OBJECT_ID(@P1, N'U')
ORDER BY c.column_id;
