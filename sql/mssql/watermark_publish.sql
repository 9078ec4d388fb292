-- Publishes store @P1's contiguous watermark @P2 for the healed table @P3
-- (schema.Messages; the row names it with the database in front). It never
-- decreases: a lower value (an older replica, a restart) leaves the row as
-- it is; and it never touches a row that describes another table (two
-- daemons whose stores share a name and a watermark table): the answer
-- then names that table and the caller refuses. The key-range lock
-- (HOLDLOCK) makes two first publications of one store wait for each other
-- instead of both inserting; XACT_ABORT ends the transaction on any error,
-- so the session goes back to the pool clean.
--
-- Refused under optimized locking (SQL Server 2025, Azure SQL) until a test
-- on such a server shows how READPAST behaves there: the watermark's proof
-- rests on the scans' READPAST skipping only rows of open transactions, and
-- Microsoft does not document READPAST under optimized locking.
SET XACT_ABORT ON;
IF @@VERSION NOT LIKE N'%Babelfish%'
    AND CAST(DATABASEPROPERTYEX(DB_NAME(), 'IsOptimizedLockingOn') AS INT) = 1
    THROW 50020, N'gap-healer: the watermark is not published under optimized locking: READPAST is not documented there (docs/sqlserver.md)', 1;

DECLARE @mine NVARCHAR(400) = DB_NAME() + N'.' + @P3;
DECLARE @owner NVARCHAR(400) = NULL;
DECLARE @existed BIT = 0;

BEGIN TRANSACTION;

SELECT
    @existed = 1,
    @owner = w.healed_table
FROM __watermark__ AS w WITH (UPDLOCK, HOLDLOCK)
WHERE w.store = @P1;

IF @existed = 0
    INSERT INTO __watermark__ (store, position, updated_at, healed_table)
    VALUES (@P1, @P2, SYSUTCDATETIME(), @mine);
ELSE IF @owner = @mine
    UPDATE __watermark__
    SET position = @P2, updated_at = SYSUTCDATETIME()
    WHERE store = @P1 AND position < @P2;

COMMIT TRANSACTION;

SELECT
    @existed AS existed,
    @owner AS owner,
    @mine AS mine;
