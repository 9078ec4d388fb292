//! SQLStreamStore's PostgreSQL store: its `streams` and `messages` in a
//! schema of the test's own (`tests/fixtures/sqlstreamstore_postgres.sql`),
//! and appends made as its `append_to_stream` makes them, one statement at a
//! time in one transaction (its .NET client opens the transaction, calls the
//! function and commits):
//!
//! 1. for an expected version below 0 (`Any`, `NoStream`, `Empty`), the
//!    stream's row, made when missing (`INSERT ... ON CONFLICT DO NOTHING`,
//!    keyed by the SHA-1 of its name): this waits on another open append's
//!    update of the row, before any position is drawn;
//! 2. the row read, unlocked: its `id_internal` and `version` (the
//!    expected version instead, when one is given);
//! 3. the messages inserted after that version, their positions drawn by
//!    the column's default, `ON CONFLICT DO NOTHING` with no target: an
//!    append racing another to the same versions waits on the other's
//!    keys *after* drawing its position, and inserts nothing if the other
//!    commits;
//! 4. fewer rows than messages: the append fails (the function raises
//!    `WrongExpectedVersion`) and the client rolls back;
//! 5. the stream's last message read, and the row's `version` and
//!    `position` set to it.
//!
//! The tests' appends use the `ExpectedVersion.Any` path (the version the
//! row holds), or an expected version of their own (a racing append that
//! reaches its insert). The tombstones are read back as the profile writes
//! them.

use tokio_postgres::Client;

use gap_healer::engine::profile::{
    sqlstreamstore_stream_id, SQLSTREAMSTORE_TOMBSTONE_STREAM, SQLSTREAMSTORE_TOMBSTONE_TYPE,
};

use crate::pg::{connect_to, pg_url, schema_name, Ending, Guard};

const FIXTURE: &str = include_str!("../../fixtures/sqlstreamstore_postgres.sql");

/// The tombstone stream the sqlstreamstore profile writes by default.
pub const TOMBSTONE_STREAM: &str = SQLSTREAMSTORE_TOMBSTONE_STREAM;
/// Its messages' type.
pub const TOMBSTONE_TYPE: &str = SQLSTREAMSTORE_TOMBSTONE_TYPE;

/// One test's store: a schema with SQLStreamStore's tables and a session;
/// its guard drops the schema (and the logins added to it) when it goes.
pub struct SqlStreamStore {
    pub schema: String,
    pub client: Client,
    url: String,
    /// Last, so the store's own session is dropped before the cleanup runs.
    pub guard: Guard,
}

/// An append whose transaction is open after its last statement (the
/// client has not committed yet): its positions are drawn and its keys held.
pub struct OpenSssAppend {
    client: Client,
    pub positions: Vec<i64>,
}

impl OpenSssAppend {
    pub async fn commit(self) -> Result<(), tokio_postgres::Error> {
        self.client.batch_execute("COMMIT").await
    }

    pub async fn rollback(self) {
        self.client
            .batch_execute("ROLLBACK")
            .await
            .expect("rollback");
    }
}

/// Why an append ended without its messages.
#[derive(Debug, PartialEq, Eq)]
pub enum AppendFailed {
    /// Fewer rows inserted than messages: another append took the versions
    /// (SQLStreamStore's `WrongExpectedVersion`); rolled back.
    WrongExpectedVersion,
}

impl SqlStreamStore {
    /// A fresh schema `gh_<tag>_<random>` with SQLStreamStore's tables.
    pub async fn new(tag: &str) -> SqlStreamStore {
        let (url, schema) = (pg_url(), schema_name(tag));
        let guard = Guard::schema(&url, &schema);
        let client = connect_to(&url).await;
        client
            .batch_execute(&FIXTURE.replace("__schema__", &schema))
            .await
            .expect("create SQLStreamStore's tables");
        SqlStreamStore {
            schema,
            client,
            url,
            guard,
        }
    }

    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// `--engine postgres --connection-string URL --schema SCHEMA --profile sqlstreamstore`.
    pub fn args(&self) -> Vec<String> {
        self.args_at(&self.url)
    }

    /// [`SqlStreamStore::args`] connecting with `url` (another login).
    pub fn args_at(&self, url: &str) -> Vec<String> {
        [
            "--engine",
            "postgres",
            "--connection-string",
            url,
            "--schema",
            &self.schema,
            "--profile",
            "sqlstreamstore",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// `args`, then this store's flags.
    pub fn argv(&self, args: &[&str]) -> Vec<String> {
        args.iter()
            .map(|s| s.to_string())
            .chain(self.args())
            .collect()
    }

    /// Appends `count` messages to `stream` on a session of its own and
    /// ends as `ending` says; the positions drawn.
    pub async fn append(&self, stream: &str, count: i32, ending: Ending) -> Vec<i64> {
        let open = self.append_open(stream, count).await;
        let positions = open.positions.clone();
        match ending {
            Ending::Commit => open.commit().await.expect("commit"),
            Ending::RollbackAfterInsert => open.rollback().await,
        }
        positions
    }

    /// Runs every statement of an append of `count` messages to `stream` on
    /// a session of its own and leaves its transaction open.
    pub async fn append_open(&self, stream: &str, count: i32) -> OpenSssAppend {
        let client = connect_to(&self.url).await;
        match self.statements(&client, stream, count).await {
            Ok(positions) => OpenSssAppend { client, positions },
            Err(e) => panic!("append to {stream}: {e:?}"),
        }
    }

    /// An append of `count` messages to `stream`, expecting the stream at
    /// version `expected`, in a task of its own, on a session whose backend
    /// pid comes back at once: the task ends with the positions committed,
    /// or why it rolled back. Racing another append to the same versions,
    /// it waits in its insert for the other's keys, its position drawn.
    pub async fn append_in_background(
        &self,
        stream: &str,
        count: i32,
        expected: i32,
    ) -> (i32, tokio::task::JoinHandle<Result<Vec<i64>, AppendFailed>>) {
        let client = connect_to(&self.url).await;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("backend pid")
            .get(0);
        let (schema, stream) = (self.schema.clone(), stream.to_string());
        let task = tokio::spawn(async move {
            let positions =
                append_statements(&client, &schema, &stream, count, Some(expected)).await?;
            client.batch_execute("COMMIT").await.expect("commit");
            Ok(positions)
        });
        (pid, task)
    }

    /// Whether the session `pid` waits on a lock now.
    pub async fn waits_on_a_lock(&self, pid: i32) -> bool {
        self.client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')",
                &[&pid],
            )
            .await
            .expect("pg_stat_activity")
            .get(0)
    }

    async fn statements(
        &self,
        client: &Client,
        stream: &str,
        count: i32,
    ) -> Result<Vec<i64>, AppendFailed> {
        append_statements(client, &self.schema, stream, count, None).await
    }

    /// Every message as (position, stream name, stream_version, type).
    pub async fn rows(&self) -> Vec<(i64, String, i32, String)> {
        self.client
            .query(
                &format!(
                    "SELECT m.position, s.id_original::text, m.stream_version, m.type::text \
                     FROM {s}.messages AS m JOIN {s}.streams AS s ON s.id_internal = m.stream_id_internal \
                     ORDER BY m.position",
                    s = self.schema
                ),
                &[],
            )
            .await
            .expect("read messages")
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    }

    /// The tombstone stream's messages as (position, stream_version), in
    /// position order; each checked to be typed and shaped as the profile
    /// writes them (type, `{}` data, no metadata, a fresh message id).
    pub async fn tombstones(&self) -> Vec<(i64, i32)> {
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT m.position, m.stream_version, m.type::text, m.json_data::text, \
                            m.json_metadata IS NULL, m.message_id::text \
                     FROM {s}.messages AS m JOIN {s}.streams AS s ON s.id_internal = m.stream_id_internal \
                     WHERE s.id = $1 ORDER BY m.position",
                    s = self.schema
                ),
                &[&sqlstreamstore_stream_id(TOMBSTONE_STREAM)],
            )
            .await
            .expect("read tombstones");
        let mut ids = std::collections::HashSet::new();
        rows.iter()
            .map(|r| {
                let (kind, data, no_metadata, id): (String, String, bool, String) =
                    (r.get(2), r.get(3), r.get(4), r.get(5));
                assert_eq!(
                    (kind.as_str(), data.as_str(), no_metadata),
                    (TOMBSTONE_TYPE, "{}", true)
                );
                assert!(ids.insert(id), "a message id twice");
                (r.get(0), r.get(1))
            })
            .collect()
    }

    /// The tombstone stream's row: (id_original, version, position), if made.
    pub async fn tombstone_stream(&self) -> Option<(String, i32, i64)> {
        self.client
            .query_opt(
                &format!(
                    "SELECT id_original::text, version, position FROM {}.streams WHERE id = $1",
                    self.schema
                ),
                &[&sqlstreamstore_stream_id(TOMBSTONE_STREAM)],
            )
            .await
            .expect("read the tombstone stream's row")
            .map(|r| (r.get(0), r.get(1), r.get(2)))
    }

    /// The highest position (-1: no message).
    pub async fn head(&self) -> i64 {
        self.client
            .query_one(
                &format!(
                    "SELECT COALESCE(MAX(position), -1) FROM {}.messages",
                    self.schema
                ),
                &[],
            )
            .await
            .expect("head")
            .get(0)
    }

    /// Positions from the sequence's start (0) to the highest that hold
    /// nothing.
    pub async fn missing(&self) -> Vec<i64> {
        self.client
            .query(
                &format!(
                    "SELECT g.p FROM generate_series(0, (SELECT MAX(position) FROM {s}.messages)) AS g (p) \
                     WHERE NOT EXISTS (SELECT 1 FROM {s}.messages AS m WHERE m.position = g.p) ORDER BY g.p",
                    s = self.schema
                ),
                &[],
            )
            .await
            .expect("missing positions")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }
}

/// The statements of one append, in an open transaction on `client`,
/// expecting `expected` (`None`: `ExpectedVersion.Any`): the positions
/// inserted, or the failure after its rollback.
async fn append_statements(
    client: &Client,
    schema: &str,
    stream: &str,
    count: i32,
    expected: Option<i32>,
) -> Result<Vec<i64>, AppendFailed> {
    let id = sqlstreamstore_stream_id(stream);
    client.batch_execute("BEGIN").await.expect("begin");
    if expected.is_none() {
        client
            .execute(
                &format!(
                    "INSERT INTO {schema}.streams (id, id_original) VALUES ($1, $2) ON CONFLICT DO NOTHING"
                ),
                &[&id, &stream],
            )
            .await
            .expect("the stream's row");
    }
    let row = client
        .query_one(
            &format!("SELECT id_internal, version FROM {schema}.streams WHERE id = $1"),
            &[&id],
        )
        .await
        .expect("read the stream's row");
    let (internal, version): (i32, i32) = (row.get(0), expected.unwrap_or(row.get(1)));
    let inserted = client
        .query(
            &format!(
                "INSERT INTO {schema}.messages \
                   (message_id, stream_id_internal, stream_version, created_utc, type, json_data, json_metadata) \
                 SELECT gen_random_uuid(), $1, $2 + n, now() AT TIME ZONE 'utc', 'Deposited', \
                        jsonb_build_object('n', n), NULL \
                 FROM generate_series(1, $3::int) AS n \
                 ON CONFLICT DO NOTHING RETURNING position"
            ),
            &[&internal, &version, &count],
        )
        .await
        .expect("insert the messages");
    if inserted.len() != count as usize {
        client.batch_execute("ROLLBACK").await.expect("rollback");
        return Err(AppendFailed::WrongExpectedVersion);
    }
    let last = client
        .query_one(
            &format!(
                "SELECT position, stream_version FROM {schema}.messages \
                 WHERE stream_id_internal = $1 ORDER BY position DESC LIMIT 1"
            ),
            &[&internal],
        )
        .await
        .expect("the stream's last message");
    let (position, version): (i64, i32) = (last.get(0), last.get(1));
    client
        .execute(
            &format!(
                "UPDATE {schema}.streams SET version = $2, position = $3 WHERE id_internal = $1"
            ),
            &[&internal, &version, &position],
        )
        .await
        .expect("the stream's row after the append");
    Ok(inserted.iter().map(|r| r.get(0)).collect())
}
