-- gap-healer, SQL Server: fill up to 1,000 ranges of holes with tombstones,
-- in one transaction (Engine::fill_ranges). This file is the one source of
-- the fill:
--
-- * Direct mode runs it as it is. The login needs ALTER on Messages (for SET
--   IDENTITY_INSERT), SELECT and INSERT on Messages, SELECT, INSERT and
--   UPDATE on Streams.
-- * Procedure mode runs the procedure [gap_healer_fill] that
--   src/engine/mssql/sql.rs builds from this file: its body is the text
--   between the BEGIN FILL BODY and END FILL BODY markers, and it runs WITH
--   EXECUTE AS OWNER, so the login needs only EXECUTE on it (`gap-healer
--   install`, or the script `gap-healer sql --engine mssql` prints). Its
--   parameters are the DECLAREs below (same names, same types) except
--   @stream_name and @message_type: those are constants of the procedure,
--   fixed when it is created, so that a login with EXECUTE cannot make it
--   write into any other stream.
--
-- The schema placeholder is replaced by the bracketed, validated schema name;
-- every other value is a bound parameter:
--   @P1 NVARCHAR(MAX)  the ranges, ascending and disjoint: 42 characters
--                      each, its first and its last position (inclusive) as
--                      signed 21-character numbers (+00000000000000000017).
--                      Text rather than a table-valued parameter: the same
--                      call works for a procedure, on SQL Server 2019 at any
--                      compatibility level and on Babelfish
--   @P2 NVARCHAR(850)  tombstone stream name
--   @P3 NVARCHAR(128)  tombstone message type
--   @P4 INT            lock timeout on message keys, ms
--   @P5 INT            lock timeout on the tombstone stream's row, ms
--   @P6 NVARCHAR(255)  the leader fence: the name of the application lock
--                      that the leader's lock session holds (see
--                      leader_lock.sql); NULL or '' when there is no
--                      leader election (no fence; the engine sends '':
--                      Babelfish refuses an untyped NULL parameter)
--
-- The engine runs this through sp_executesql, so SET options revert when the
-- batch ends (and when the procedure returns); the body still restores each
-- one itself.

DECLARE @ranges NVARCHAR(MAX) = @P1;
DECLARE @stream_name NVARCHAR(850) = @P2;
DECLARE @message_type NVARCHAR(128) = @P3;
DECLARE @lock_timeout_ms INT = @P4;
DECLARE @stream_lock_timeout_ms INT = @P5;
DECLARE @leader_fence NVARCHAR(255) = @P6;

-- The procedure's body is everything between the next line and END FILL BODY.
-- Keep every string literal on one line: the body is indented in the
-- procedure, which must not change a literal.
-- BEGIN FILL BODY

-- NOCOUNT: no "n rows affected" messages; the one result row is the answer.
SET NOCOUNT ON;
-- XACT_ABORT: any runtime error dooms the whole transaction, so no statement
-- of a failed fill can commit on its own (the tombstone rows and the stream's
-- Version move together or not at all). The CATCH block below then only
-- rolls back and reports.
SET XACT_ABORT ON;
-- READPAST (in the checks below) needs READ COMMITTED; the session default,
-- stated so that a changed default cannot break the fill.
SET TRANSACTION ISOLATION LEVEL READ COMMITTED;

DECLARE @width INT;
DECLARE @range_count INT;
DECLARE @range_index INT = 0;
DECLARE @range_start BIGINT;
DECLARE @range_end BIGINT;
DECLARE @end BIGINT;
DECLARE @positions BIGINT;
-- The ranges, parsed: first_row is the number of positions in the ranges
-- before this one (where its rows start in the tombstone stream).
DECLARE @fill TABLE (
    range_start BIGINT NOT NULL PRIMARY KEY,
    range_end BIGINT NOT NULL,
    first_row BIGINT NOT NULL
);
DECLARE @stage NVARCHAR(16) = N'check';
DECLARE @stream_id INT;
DECLARE @version INT;
DECLARE @head BIGINT;
DECLARE @identity_insert BIT = 0;
DECLARE @rows_filled BIGINT = NULL;
-- The tombstones' MessageIds: one random GUID per fill whose first eight
-- hex digits (its first four bytes) are replaced by the row's number.
-- SQL Server orders uniqueidentifier by its last bytes first and those four
-- last, so one fill's ids are adjacent in UQ_StreamIdAndMessageId
-- (StreamId, MessageId): its 4,000 rows take a few dozen leaf pages there,
-- not one page each (a NEWID() per row would lock thousands of pages of a
-- large tombstone stream and push the statement past lock escalation's
-- 5,000 locks). The 90 random bits of the rest keep them unique, and the
-- version and variant digits stay NEWID()'s. Built as text: Babelfish
-- takes binary + binary for arithmetic.
DECLARE @message_id_base NCHAR(36) = CAST(NEWID() AS NCHAR(36));
DECLARE @error_number INT = NULL;
DECLARE @error_message NVARCHAR(4000) = NULL;
-- A position below every identity value (the table stage seeks it).
DECLARE @below_every_position BIGINT = -9223372036854775807 - 1;
DECLARE @table_probe BIGINT;

BEGIN TRY
    IF @@TRANCOUNT <> 0
        THROW 50001, N'gap-healer: the session already has an open transaction', 1;
    SET @range_count = LEN(@ranges) / 42;
    IF @ranges IS NULL OR @range_count = 0 OR @range_count > 1000 OR LEN(@ranges) <> 42 * @range_count
        THROW 50002, N'gap-healer: no fill ranges, more than 1,000, or not 42 characters each', 1;
    -- Each range in turn: in order, apart from the one before it, and
    -- counted (first_row, the positions before it, is where its rows start
    -- in the tombstone stream).
    SET @positions = 0;
    WHILE @range_index < @range_count
        BEGIN
            SET @range_start = CAST(SUBSTRING(@ranges, 42 * @range_index + 1, 21) AS BIGINT);
            SET @range_end = CAST(SUBSTRING(@ranges, 42 * @range_index + 22, 21) AS BIGINT);
            IF @range_end < @range_start OR @range_start <= @end OR @positions > 4000
                THROW 50002, N'gap-healer: the fill ranges are empty, out of order, overlapping or too many positions', 1;
            INSERT INTO @fill (range_start, range_end, first_row)
            VALUES (@range_start, @range_end, @positions);
            SET @positions = @positions + (@range_end - @range_start + 1);
            SET @end = @range_end;
            SET @range_index = @range_index + 1;
        END;

    -- The lock budget: at most 4,000 locks per index. Each position takes a
    -- key lock in every index of Messages, and each range after the first
    -- may take one more page lock in the clustered key (the stream indexes
    -- get the fill's rows in one run whatever the ranges). SQL Server
    -- escalates to a table lock at 5,000 locks on one index, which would
    -- stop every append until the fill commits.
    IF @positions + @range_count - 1 > 4000
        THROW 50002, N'gap-healer: the fill ranges need more than 4,000 locks (positions, plus one per range after the first)', 1;
    SET @width = CAST(@positions AS INT);

    -- The stages from here to END EVENTUOUS STAGES write Eventuous's
    -- Messages and Streams; a described table (profiles custom and
    -- sqlstreamstore) runs fill_table.sql's stages in their place, with
    -- everything before and after as it is here.
    -- BEGIN EVENTUOUS STAGES
    -- The tombstone stream's row. Created once, in its own short autocommit
    -- insert, so that the fill transaction never holds a key-range lock on
    -- UQ_StreamName (which would block appends creating new streams).
    SET @stage = N'stream';
    -- LOCK_TIMEOUT (stream): how long to wait for another healer that holds
    -- the tombstone stream (it holds it for at most its own lock timeout).
    -- Running out here means "busy", not "held".
    SET LOCK_TIMEOUT @stream_lock_timeout_ms;
    IF NOT EXISTS (
        SELECT 1 FROM __schema__.[Streams] AS s
        WHERE s.StreamName = @stream_name
    )
        BEGIN
            -- The leader fence (see below) before this one write outside the
            -- fill transaction, so that a fill refused by the fence has
            -- written nothing at all. (Nested IFs: T-SQL does not promise to
            -- short-circuit AND, and the fence's name must not be NULL.)
            IF NULLIF(@leader_fence, N'') IS NOT NULL
                BEGIN
                    IF APPLOCK_TEST(N'public', @leader_fence, N'Exclusive', N'Session') = 1
                        BEGIN
                            SET @stage = N'leader';
                            THROW 50006, N'gap-healer: the leader lock session has ended (leader fence): not filling', 1;
                        END;
                END;
            BEGIN TRY
                INSERT INTO __schema__.[Streams] (StreamName, [Version])
                VALUES (@stream_name, -1);
            END TRY
            BEGIN CATCH
                -- Another healer created it first: fine.
                IF ERROR_NUMBER() NOT IN (2601, 2627) THROW;
            END CATCH;
        END;

    BEGIN TRANSACTION;

    -- Fillers serialise on the tombstone stream's row: the update lock is held
    -- to COMMIT, so Version and the stream's rows can never drift apart.
    SELECT
        @stream_id = s.StreamId,
        @version = s.[Version]
    FROM __schema__.[Streams] AS s WITH (UPDLOCK, ROWLOCK)
    WHERE s.StreamName = @stream_name;

    IF @stream_id IS NULL
        THROW 50003, N'gap-healer: the tombstone stream row is missing', 1;

    -- The stream's positions must be 0 .. Version with nothing beyond;
    -- otherwise a StreamPosition conflict would pass for a committed event.
    -- Only this stream's keys are read (UQ_StreamIdAndStreamPosition); nobody
    -- else writes them while we hold its row, and READPAST keeps the seek from
    -- waiting on a neighbouring stream's key that an open append holds.
    IF EXISTS (
        SELECT 1 FROM __schema__.[Messages] AS m WITH (READCOMMITTEDLOCK, READPAST)
        WHERE m.StreamId = @stream_id AND m.StreamPosition > @version
    )
        THROW 50004, N'gap-healer: the tombstone stream has rows beyond its Version', 1;

    -- The leader fence. With leader election, this process may fill only
    -- while its leader lock session lives: that session holds, besides the
    -- leader lock, an application lock of its own whose name (@leader_fence)
    -- only it knows. APPLOCK_TEST answers 0 (not grantable) while some
    -- session holds that lock, and 1 once the server has ended the session
    -- and released it, which is also when another healer can take the
    -- leader lock. Checked after the tombstone stream's row is locked: a
    -- filler that took over waits on that row until this transaction ends,
    -- and every later fill of this process is refused here (Busy), however
    -- long this process takes to notice that it no longer leads. Needs no
    -- right beyond membership in public (unlike sys.dm_tran_locks, which
    -- needs VIEW SERVER STATE).
    SET @stage = N'leader';
    IF NULLIF(@leader_fence, N'') IS NOT NULL
        BEGIN
            IF APPLOCK_TEST(N'public', @leader_fence, N'Exclusive', N'Transaction') = 1
                THROW 50006, N'gap-healer: the leader lock session has ended (leader fence): not filling', 1;
        END;

    -- The table lock. Every writer of Messages needs an intent-exclusive
    -- (IX) lock on the table, and a table-level lock that another session
    -- holds or waits for (an offline CREATE INDEX's S, a TABLOCK insert's X,
    -- an index rebuild's Sch-M, an append's lock escalated to the table)
    -- blocks it. The seek below takes IX on Messages (and on one page, no
    -- key: the position is below every identity value) and keeps it to
    -- COMMIT, so that a lock timeout here means a table lock, which backs
    -- the whole store off, and one in the insert below can only be a key
    -- (or page) lock of an append: a held position. Without this stage a
    -- table lock looked like a held key and sent every position to a
    -- probe of its own.
    SET @stage = N'table';
    SET LOCK_TIMEOUT @lock_timeout_ms;
    SELECT @table_probe = m.GlobalPosition
    FROM __schema__.[Messages] AS m WITH (XLOCK, ROWLOCK)
    WHERE m.GlobalPosition = @below_every_position;

    -- Never at or above the highest committed position, whatever the caller
    -- believes: the tail may be an append in flight, and an explicit identity
    -- value above IDENT_CURRENT becomes the new current value (the next append
    -- would jump). READCOMMITTEDLOCK + READPAST: see head.sql.
    SET @stage = N'head';
    SELECT TOP (1) @head = m.GlobalPosition
    FROM __schema__.[Messages] AS m WITH (READCOMMITTEDLOCK, READPAST)
    ORDER BY m.GlobalPosition DESC;

    IF @head IS NULL OR @end >= @head
        THROW 50005, N'gap-healer: refused to fill at or above the highest committed position', 1;

    SET @stage = N'messages';
    -- LOCK_TIMEOUT (keys): how long one insert waits on a key that an open
    -- append holds. Running out is error 1222: the position is "held".
    SET LOCK_TIMEOUT @lock_timeout_ms;
    -- IDENTITY_INSERT: write the hole's own positions into the identity
    -- column. Per session, one table at a time, not undone by ROLLBACK: it is
    -- turned off again on every path below.
    SET IDENTITY_INSERT __schema__.[Messages] ON;
    SET @identity_insert = 1;

    -- A numbers table of 16^3 = 4,096 rows built from constants (no
    -- GENERATE_SERIES: SQL Server 2019 and older compatibility levels).
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
    -- primary key, so a committed event fails it (2627) and a held one makes
    -- it wait (1222); the database decides, not the healer's view.
    INSERT INTO __schema__.[Messages] (
        MessageId,
        MessageType,
        StreamId,
        StreamPosition,
        GlobalPosition,
        JsonData,
        JsonMetadata,
        Created
    )
    SELECT
        CAST(
            N'00000'
            + SUBSTRING(N'0123456789ABCDEF', CAST((r.first_row + nb.n) / 256 % 16 AS INT) + 1, 1)
            + SUBSTRING(N'0123456789ABCDEF', CAST((r.first_row + nb.n) / 16 % 16 AS INT) + 1, 1)
            + SUBSTRING(N'0123456789ABCDEF', CAST((r.first_row + nb.n) % 16 AS INT) + 1, 1)
            + SUBSTRING(@message_id_base, 9, 28)
            AS UNIQUEIDENTIFIER
        ),
        @message_type,
        @stream_id,
        @version + 1 + r.first_row + nb.n,
        r.range_start + nb.n,
        N'{}',
        N'{}',
        SYSUTCDATETIME()
    FROM @fill AS r
    INNER JOIN numbers AS nb ON nb.n <= r.range_end - r.range_start;

    -- Every position took a row, or nothing is written: an index with
    -- IGNORE_DUP_KEY = ON drops a duplicate with a warning instead of
    -- failing, and Version would then count rows that do not exist.
    IF @@ROWCOUNT <> @width
        THROW 50007, N'gap-healer: the insert wrote fewer rows than positions (an index with IGNORE_DUP_KEY?): not filling', 1;

    SET @stage = N'version';
    UPDATE __schema__.[Streams]
    SET [Version] = @version + @width
    WHERE StreamId = @stream_id;

    SET IDENTITY_INSERT __schema__.[Messages] OFF;
    SET @identity_insert = 0;

    SET @stage = N'commit';
    COMMIT TRANSACTION;
    SET @rows_filled = @width;
    -- END EVENTUOUS STAGES
END TRY
BEGIN CATCH
    SET @error_number = ERROR_NUMBER();
    SET @error_message = ERROR_MESSAGE();
    -- The transaction is doomed (XACT_ABORT): roll back first, nothing else
    -- may run in it; then restore the session.
    IF @@TRANCOUNT > 0
        ROLLBACK TRANSACTION;
    IF @identity_insert = 1
        SET IDENTITY_INSERT __schema__.[Messages] OFF;
END CATCH;

-- Back to the connection default (the batch or procedure scope restores it
-- anyway; this keeps the session clean should that ever change).
SET LOCK_TIMEOUT -1;

-- The answer, one row on every path: the engine classifies error_number and
-- error_stage in one place (2627/2601 at 'messages' = committed, 1222 at
-- 'messages' = held, 1222 at 'stream' = busy, 1222 at 'table' = table
-- locked, 50006 at 'leader' = busy, ...),
-- and discards the connection if open_transactions is not 0. stream_name and
-- message_type say which tombstones this fill writes: in procedure mode the
-- procedure's constants, which the engine compares with its configuration (a
-- call with NULL bounds writes nothing and answers only that).
SELECT
    @rows_filled AS rows_filled,
    @error_number AS error_number,
    @stage AS error_stage,
    @error_message AS error_message,
    @@TRANCOUNT AS open_transactions,
    @stream_name AS stream_name,
    @message_type AS message_type;

-- END FILL BODY
