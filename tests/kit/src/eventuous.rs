//! Appends the way Eventuous writes them. Two forms on PostgreSQL:
//! [`pg::append_events`] calls the fixture's `append_events`, which does
//! what Eventuous's function does statement by statement (no row lock in
//! its version check, one INSERT ... SELECT with a bare ON CONFLICT DO
//! NOTHING, the Version read back); the step-by-step statements below lock
//! the stream row first, a stricter writer than Eventuous's, kept for tests
//! that need an append held open between its statements. The statements
//! live here once; callers string them together and decide how the
//! transaction ends.

/// The message type of the tests' events.
pub const EVENT_TYPE: &str = "TestEvent";
/// gap-healer's default tombstone stream and message type.
pub const TOMBSTONE_STREAM: &str = "__tombstones__";
pub const TOMBSTONE_TYPE: &str = "$tombstone";

/// PostgreSQL: Eventuous's append, statement by statement.
pub mod pg {
    use tokio_postgres::{Client, Error};
    use uuid::Uuid;

    /// What an insert does with a message id already in the stream.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Duplicate {
        /// `ON CONFLICT (stream_id, message_id) DO NOTHING`, as Eventuous's
        /// PostgreSQL store writes: the row is dropped, yet its identity value
        /// is burnt.
        Skip,
        /// A plain insert: the unique violation fails the append (what SQL
        /// Server's store does).
        Fail,
    }

    /// Creates the stream row if it is new and locks it: (stream id, Version).
    pub async fn lock_stream(c: &Client, schema: &str, stream: &str) -> Result<(i32, i32), Error> {
        c.execute(
            &format!("INSERT INTO {schema}.streams (stream_name) VALUES ($1) ON CONFLICT (stream_name) DO NOTHING"),
            &[&stream],
        )
        .await?;
        let row = c
            .query_one(
                &format!(
                    "SELECT stream_id, version FROM {schema}.streams WHERE stream_name = $1 FOR UPDATE"
                ),
                &[&stream],
            )
            .await?;
        Ok((row.get(0), row.get(1)))
    }

    /// Inserts one message at `stream_position` with `data` (JSON text); its
    /// global position, or `None` when [`Duplicate::Skip`] dropped it.
    #[allow(clippy::too_many_arguments)]
    pub async fn insert(
        c: &Client,
        schema: &str,
        stream_id: i32,
        stream_position: i32,
        id: &Uuid,
        message_type: &str,
        data: &str,
        duplicate: Duplicate,
    ) -> Result<Option<i64>, Error> {
        let conflict = match duplicate {
            Duplicate::Skip => "ON CONFLICT (stream_id, message_id) DO NOTHING",
            Duplicate::Fail => "",
        };
        let rows = c
            .query(
                &format!(
                    "INSERT INTO {schema}.messages (message_id, message_type, stream_id, stream_position, json_data, created)
                     VALUES ($1, $2, $3, $4, $5::text::jsonb, now() AT TIME ZONE 'utc')
                     {conflict} RETURNING global_position"
                ),
                &[id, &message_type, &stream_id, &stream_position, &data],
            )
            .await?;
        Ok(rows.first().map(|r| r.get(0)))
    }

    /// Eventuous's own append: the fixture's `append_events` function, one
    /// statement in the caller's transaction (or its own, in autocommit),
    /// one event of `message_type` per message id. What it reports:
    /// (Version, global position) of the stream's last row, also when a
    /// row was dropped by its bare `ON CONFLICT DO NOTHING`.
    pub async fn append_events(
        c: &Client,
        schema: &str,
        stream: &str,
        expected_version: i32,
        message_ids: &[Uuid],
        message_type: &str,
    ) -> Result<(i32, i64), Error> {
        let row = c
            .query_one(
                &format!(
                    "SELECT current_version, current_position FROM {schema}.append_events(
                         $1, $2, (now() AT TIME ZONE 'utc')::timestamp,
                         ARRAY(SELECT ROW(id, $4::varchar, '{{}}'::jsonb, NULL::jsonb)::{schema}.stream_message
                               FROM UNNEST($3::uuid []) WITH ORDINALITY AS m (id, n) ORDER BY n))"
                ),
                &[&stream, &expected_version, &message_ids, &message_type],
            )
            .await?;
        Ok((row.get(0), row.get(1)))
    }

    /// Moves the stream's Version.
    pub async fn set_version(
        c: &Client,
        schema: &str,
        stream_id: i32,
        version: i32,
    ) -> Result<(), Error> {
        c.execute(
            &format!("UPDATE {schema}.streams SET version = $2 WHERE stream_id = $1"),
            &[&stream_id, &version],
        )
        .await?;
        Ok(())
    }
}

/// SQL Server: Eventuous's `append_events`, as one batch.
pub mod mssql {
    /// One call of Eventuous's SQL Server append as an application makes
    /// it (tests/fixtures/eventuous_mssql_procedures.sql): the `count`
    /// events of `message_type` in a StreamMessage table variable (what the
    /// .NET client sends as its table-valued parameter), then
    /// `append_events`, which checks the expected version without a lock,
    /// inserts them in one statement and moves the Version. @P1 is the
    /// stream name, @P2 the expected version, then each event's message id
    /// and JSON data (@P3, @P4, then @P5, @P6, ...). Answers the procedure's
    /// row (current_version, global_position). The caller wraps it in its
    /// transaction.
    pub fn append_events_sql(message_type: &str, count: usize) -> String {
        let values: Vec<String> = (0..count)
            .map(|i| {
                format!(
                    "(@P{}, N'{}', @P{}, NULL)",
                    3 + 2 * i,
                    message_type.replace('\'', "''"),
                    4 + 2 * i
                )
            })
            .collect();
        format!(
            "DECLARE @messages eventuous.StreamMessage;
INSERT INTO @messages (message_id, message_type, json_data, json_metadata) VALUES {};
EXEC eventuous.append_events @stream_name = @P1, @expected_version = @P2, @created = NULL, @messages = @messages;",
            values.join(", ")
        )
    }

    /// One stream's append of `count` events of `message_type`, like
    /// Eventuous's append_events: the stream row (created at Version -1 when
    /// new) locked, the rows inserted in one statement, the Version moved.
    /// @P1 is the stream name, then each event's message id and JSON data
    /// (@P2, @P3, then @P4, @P5, ...). Ends with the positions, message ids
    /// and stream positions it took, in position order. With `stale`, the
    /// rows go at stream positions from the current Version on (a lost
    /// concurrency race): a unique or CHECK violation. The caller wraps it in
    /// its transaction.
    pub fn append_sql(message_type: &str, count: usize, stale: bool) -> String {
        let values: Vec<String> = (0..count)
            .map(|i| format!("(@P{}, {i}, @P{})", 2 + 2 * i, 3 + 2 * i))
            .collect();
        let first = if stale { 0 } else { 1 };
        let message_type = message_type.replace('\'', "''");
        format!(
            "DECLARE @stream_id INT, @version INT;
DECLARE @out TABLE (GlobalPosition BIGINT, MessageId UNIQUEIDENTIFIER, StreamPosition INT);
SELECT @stream_id = StreamId, @version = [Version] FROM eventuous.Streams WITH (UPDLOCK, HOLDLOCK) WHERE StreamName = @P1;
IF @stream_id IS NULL
BEGIN
    INSERT INTO eventuous.Streams (StreamName, [Version]) VALUES (@P1, -1);
    SET @stream_id = CAST(SCOPE_IDENTITY() AS INT);
    SET @version = -1;
END;
INSERT INTO eventuous.Messages (MessageId, MessageType, StreamId, StreamPosition, JsonData, JsonMetadata, Created)
OUTPUT inserted.GlobalPosition, inserted.MessageId, inserted.StreamPosition INTO @out
SELECT v.id, N'{message_type}', @stream_id, @version + {first} + v.ord, v.data, NULL, SYSUTCDATETIME()
FROM (VALUES {}) AS v (id, ord, data);
UPDATE eventuous.Streams SET [Version] = @version + {count} WHERE StreamId = @stream_id;
SELECT o.GlobalPosition, o.MessageId, o.StreamPosition FROM @out AS o ORDER BY o.GlobalPosition;",
            values.join(", ")
        )
    }
}
