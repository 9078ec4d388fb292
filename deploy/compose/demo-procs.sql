-- Demo-only helpers for the compose load generator (deploy/compose/loadgen.sh).
-- They live in their own schema `demo`; gap-healer neither needs nor sees them.
-- Requires the Eventuous schema (tests/fixtures/eventuous_mssql.sql) first.

IF SCHEMA_ID(N'demo') IS NULL
    EXEC (N'CREATE SCHEMA demo AUTHORIZATION dbo;');
GO

-- An Eventuous-like append of @count events to @stream, ending as @outcome:
--   commit     a normal append
--   rollback   the transaction rolls back after its insert: a hole of @count positions
--   duplicate  every row gets the same MessageId: error 2627 on
--              UQ_StreamIdAndMessageId, the append fails, its identity values are lost
--   slow       commits after WAITFOR DELAY @delay: positions look open meanwhile
--              and must NOT be filled by gap-healer
CREATE OR ALTER PROCEDURE demo.append
    @stream NVARCHAR(850),
    @count INT = 1,
    @outcome VARCHAR(16) = 'commit',
    @delay CHAR(8) = '00:00:20'
AS
BEGIN
    SET NOCOUNT ON;
    SET XACT_ABORT ON;

    DECLARE @stream_id INT;
    DECLARE @version INT;
    DECLARE @message_id UNIQUEIDENTIFIER = NEWID();

    BEGIN TRY
        BEGIN TRANSACTION;

        SELECT
            @stream_id = StreamId,
            @version = [Version]
        FROM eventuous.Streams WITH (UPDLOCK, HOLDLOCK)
        WHERE StreamName = @stream;

        IF @stream_id IS NULL
        BEGIN
            INSERT INTO eventuous.Streams (StreamName) VALUES (@stream);
            SET @stream_id = CONVERT(INT, SCOPE_IDENTITY());
            SET @version = -1;
        END;

        INSERT INTO eventuous.Messages
        (MessageId, MessageType, StreamId, StreamPosition, JsonData, JsonMetadata, Created)
        SELECT
            CASE WHEN @outcome = 'duplicate' THEN @message_id ELSE NEWID() END,
            N'DemoEventHappened',
            @stream_id,
            @version + numbers.n,
            N'{"demo":true}',
            NULL,
            SYSUTCDATETIME()
        FROM (
            SELECT TOP (@count) ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS n
            FROM sys.all_objects
        ) AS numbers;

        IF @outcome = 'slow'
            WAITFOR DELAY @delay;

        UPDATE eventuous.Streams
        SET [Version] = @version + @count
        WHERE StreamId = @stream_id;

        IF @outcome = 'rollback'
            ROLLBACK TRANSACTION;
        ELSE
            COMMIT TRANSACTION;
    END TRY
    BEGIN CATCH
        IF @@TRANCOUNT > 0
            ROLLBACK TRANSACTION;
        IF @outcome <> 'duplicate'
            THROW;
        PRINT CONCAT(N'append failed as intended: ', ERROR_MESSAGE());
    END CATCH;
END;
GO

-- What SQL Server does to an IDENTITY after an unclean shutdown or a failover
-- (the identity cache is lost): the next value jumps ahead by @by.
CREATE OR ALTER PROCEDURE demo.jump_identity
    @by BIGINT = 1000
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @next BIGINT = CONVERT(BIGINT, IDENT_CURRENT(N'eventuous.Messages')) + @by;
    DECLARE @sql NVARCHAR(300) = CONCAT(
        N'DBCC CHECKIDENT (N''eventuous.Messages'', RESEED, ', @next, N') WITH NO_INFOMSGS;'
    );
    EXEC sys.sp_executesql @sql;
END;
GO

-- Moves checkpoint @id like an all-stream subscription would: read forward at
-- most @page rows from the checkpoint, stop before the first hole (rows that
-- are still locked count as a hole: READPAST).
CREATE OR ALTER PROCEDURE demo.advance_checkpoint
    @id NVARCHAR(128),
    @page INT = 5000
AS
BEGIN
    SET NOCOUNT ON;
    DECLARE @from BIGINT = ISNULL((SELECT Position FROM eventuous.Checkpoints WHERE Id = @id), -1);
    DECLARE @to BIGINT;

    WITH page AS (
        SELECT TOP (@page)
            GlobalPosition,
            ROW_NUMBER() OVER (ORDER BY GlobalPosition) AS n
        FROM eventuous.Messages WITH (READPAST)
        WHERE GlobalPosition > @from
        ORDER BY GlobalPosition
    )

    SELECT @to = MAX(GlobalPosition)
    FROM page
    WHERE GlobalPosition = @from + n;

    IF @to IS NULL
        RETURN;

    UPDATE eventuous.Checkpoints SET Position = @to WHERE Id = @id;
    IF @@ROWCOUNT = 0
        INSERT INTO eventuous.Checkpoints (Id, Position) VALUES (@id, @to);
END;
GO
