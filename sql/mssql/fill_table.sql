-- gap-healer, SQL Server: the stages of a described table's fill (profiles
-- custom and sqlstreamstore), which run in place of fill.sql's Eventuous
-- stages (between its BEGIN and END EVENTUOUS STAGES lines): fill.sql's
-- parameters, range checks, lock budget, CATCH block and result row stay
-- as they are, so the engine reads the answer of both fills alike.
-- Direct mode only (there is no procedure for a described table): the
-- login needs SELECT, INSERT and ALTER on the table (SET IDENTITY_INSERT),
-- and for a stream row SELECT, INSERT and UPDATE on Streams.
--
-- src/engine/mssql/table.rs renders it:
-- * __schema__, __table__, __position__: the bracketed, validated names;
--   __tombstone_lock__: the application lock's name, made of those names;
-- * __columns__ and __values__: the tombstone row's other columns and what
--   each gets (a bound literal @P8, @P9, ..., NEWID, the time, the next
--   version); __version__ and "__stream_match__ = 1": the next_version
--   column and the literals that name its stream;
-- * the lines between "-- BEGIN <SECTION>" and "-- END <SECTION>" are kept
--   or dropped whole: NEXT VERSION when a column is next_version, STREAM
--   ROW for a stream of its own in Streams (SQLStreamStore's).
--
-- One more parameter than fill.sql: @P7 NVARCHAR(42), the tombstone
-- stream's Streams.Id (SQLStreamStore's SHA-1 of its name), '' without a
-- stream row.

    DECLARE @stream_key NVARCHAR(42) = @P7;
    DECLARE @next_version BIGINT = 0;
    DECLARE @lock_result INT;

    SET @stage = N'stream';
    -- LOCK_TIMEOUT (stream): how long to wait for another healer of this
    -- table; running out here means "busy", not "held".
    SET LOCK_TIMEOUT @stream_lock_timeout_ms;
    -- BEGIN STREAM ROW
    -- The tombstone stream's row, made once in its own short autocommit
    -- insert (as SQLStreamStore makes a stream's row before its append),
    -- after the leader fence, so that a refused fill writes nothing.
    IF NOT EXISTS (
        SELECT 1 FROM __schema__.[Streams] AS s
        WHERE s.Id = @stream_key
    )
        BEGIN
            IF NULLIF(@leader_fence, N'') IS NOT NULL
                BEGIN
                    IF APPLOCK_TEST(N'public', @leader_fence, N'Exclusive', N'Session') = 1
                        BEGIN
                            SET @stage = N'leader';
                            THROW 50006, N'gap-healer: the leader lock session has ended (leader fence): not filling', 1;
                        END;
                END;
            BEGIN TRY
                INSERT INTO __schema__.[Streams] (Id, IdOriginal)
                VALUES (@stream_key, @stream_name);
            END TRY
            BEGIN CATCH
                -- Another healer made it first: fine.
                IF ERROR_NUMBER() NOT IN (2601, 2627) THROW;
            END CATCH;
        END;
    -- END STREAM ROW

    BEGIN TRANSACTION;

    -- BEGIN NEXT VERSION
    -- Every healer of this table serialises on one application lock, held
    -- to COMMIT, so that two fills never take the same versions of the
    -- tombstone stream (the stream's unique key is the backstop).
    EXEC @lock_result = sp_getapplock
        @Resource = __tombstone_lock__,
        @LockMode = N'Exclusive',
        @LockOwner = N'Transaction',
        @LockTimeout = @stream_lock_timeout_ms;
    IF @lock_result < 0
        THROW 50008, N'gap-healer: another healer of this table holds its tombstone lock', 1;
    -- END NEXT VERSION

    -- BEGIN STREAM ROW
    -- Fillers serialise on the tombstone stream's row, held to COMMIT, as
    -- SQLStreamStore's appends do (UPDLOCK, ROWLOCK on their stream's row).
    SELECT
        @stream_id = s.IdInternal,
        @version = s.[Version]
    FROM __schema__.[Streams] AS s WITH (UPDLOCK, ROWLOCK)
    WHERE s.Id = @stream_key;

    IF @stream_id IS NULL
        THROW 50003, N'gap-healer: the tombstone stream row is missing', 1;

    -- The stream's messages must be 0 .. Version with nothing beyond;
    -- otherwise a StreamVersion conflict would pass for a committed event.
    IF EXISTS (
        SELECT 1 FROM __schema__.__table__ AS m WITH (READCOMMITTEDLOCK, READPAST)
        WHERE m.StreamIdInternal = @stream_id AND m.StreamVersion > @version
    )
        THROW 50004, N'gap-healer: the tombstone stream has rows beyond its Version', 1;

    -- SQLStreamStore's versions start at 0 (Version is -1 before the first).
    SET @next_version = @version + 1;
    -- END STREAM ROW

    -- The leader fence: see fill.sql.
    SET @stage = N'leader';
    IF NULLIF(@leader_fence, N'') IS NOT NULL
        BEGIN
            IF APPLOCK_TEST(N'public', @leader_fence, N'Exclusive', N'Transaction') = 1
                THROW 50006, N'gap-healer: the leader lock session has ended (leader fence): not filling', 1;
        END;

    -- The table lock: see fill.sql. The seek takes IX on the table and
    -- keeps it to COMMIT, so that a lock timeout here is a table lock.
    SET @stage = N'table';
    SET LOCK_TIMEOUT @lock_timeout_ms;
    SELECT @table_probe = m.__position__
    FROM __schema__.__table__ AS m WITH (XLOCK, ROWLOCK)
    WHERE m.__position__ = @below_every_position;

    -- Never at or above the highest committed position: see fill.sql.
    SET @stage = N'head';
    SELECT TOP (1) @head = m.__position__
    FROM __schema__.__table__ AS m WITH (READCOMMITTEDLOCK, READPAST)
    ORDER BY m.__position__ DESC;

    IF @head IS NULL OR @end >= @head
        THROW 50005, N'gap-healer: refused to fill at or above the highest committed position', 1;

    -- BEGIN NEXT VERSION
    -- The tombstone stream's highest version, under the tombstone lock:
    -- only healers write that stream, so READPAST skips nothing of it.
    SET @stage = N'stream';
    SET LOCK_TIMEOUT @stream_lock_timeout_ms;
    SELECT @next_version = ISNULL(MAX(m.__version__), 0) + 1
    FROM __schema__.__table__ AS m WITH (READCOMMITTEDLOCK, READPAST)
    WHERE __stream_match__ = 1;
    -- END NEXT VERSION

    SET @stage = N'messages';
    -- LOCK_TIMEOUT (keys): how long one insert waits on a key that an open
    -- append holds. Running out is error 1222: the position is "held".
    SET LOCK_TIMEOUT @lock_timeout_ms;
    SET IDENTITY_INSERT __schema__.__table__ ON;
    SET @identity_insert = 1;

    -- The numbers table of fill.sql: 4,096 rows from constants.
    WITH
    digits (d) AS (
        SELECT v.d
        FROM (
            VALUES (0), (0), (0), (0), (0), (0), (0), (0),
            (0), (0), (0), (0), (0), (0), (0), (0)
        ) AS v (d)
    ),

    numbers (n) AS (
        SELECT
            CAST(
                ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) - 1 AS INT
            ) AS n
        FROM digits AS a
        CROSS JOIN digits AS b
        CROSS JOIN digits AS c
    )

    -- One set-based insert: every key of the ranges is checked against the
    -- position's unique key, so a committed row fails it (2627 or 2601) and
    -- a held one makes it wait (1222); the database decides.
    INSERT INTO __schema__.__table__ (
        __position__,
        __columns__
    )
    SELECT
        r.range_start + nb.n,
        __values__
    FROM @fill AS r
    INNER JOIN numbers AS nb ON nb.n <= r.range_end - r.range_start;

    -- Every position took a row, or nothing is written: see fill.sql.
    IF @@ROWCOUNT <> @width
        THROW 50007, N'gap-healer: the insert wrote fewer rows than positions (an index with IGNORE_DUP_KEY?): not filling', 1;

    -- BEGIN STREAM ROW
    -- The stream's row follows its messages in the same transaction, as
    -- SQLStreamStore's appends keep it: Version the last message's version,
    -- Position the highest of its messages' positions.
    SET @stage = N'version';
    UPDATE __schema__.[Streams]
    SET
        [Version] = @version + @width,
        Position = CASE WHEN Position > @end THEN Position ELSE @end END
    WHERE IdInternal = @stream_id;
    -- END STREAM ROW

    SET IDENTITY_INSERT __schema__.__table__ OFF;
    SET @identity_insert = 0;

    SET @stage = N'commit';
    COMMIT TRANSACTION;
    SET @rows_filled = @width;
