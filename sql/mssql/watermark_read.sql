-- The contiguous watermark gap-healer published for store @P1 of the healed
-- table @P2 (schema.Messages): every position at or below it is a committed
-- event or a tombstone. No row: none published yet. A row whose
-- healed_table is another (or none) describes another table: the caller
-- refuses it rather than start its proof there. Refused, as publishing is,
-- under optimized locking (see watermark_publish.sql).
IF @@VERSION NOT LIKE N'%Babelfish%'
    AND CAST(DATABASEPROPERTYEX(DB_NAME(), 'IsOptimizedLockingOn') AS INT) = 1
    THROW 50020, N'gap-healer: the watermark is not published under optimized locking: READPAST is not documented there (docs/sqlserver.md)', 1;

SELECT
    CAST(w.position AS BIGINT) AS position,
    w.healed_table AS owner,
    DB_NAME() + N'.' + @P2 AS mine
FROM __watermark__ AS w
WHERE w.store = @P1;
