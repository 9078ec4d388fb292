//! The chaos run on PostgreSQL: a throwaway cluster of the run's own
//! (initdb on a free port of 127.0.0.1, as the postgres user when run as
//! root; removed afterwards), one schema in it, and that cluster restarted
//! once. The machine's PostgreSQL (127.0.0.1:5432, or GAP_HEALER_TEST_PG) is
//! never touched, so the README's test command is safe on a workstation or a
//! shared CI database.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gap_healer_testkit::eventuous::pg::{self as eventuous, Duplicate};
use gap_healer_testkit::pg::{self, Throwaway};
use gap_healer_testkit::subscriber::PageRow;
use tokio::sync::RwLock;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};
use uuid::Uuid;

use crate::run::Spec;
use crate::support::*;

/// A schema of the run's own in its throwaway cluster, as every PostgreSQL
/// store of the chaos runs keeps it whatever tables it holds (Eventuous's
/// here, seed 003's in `ledger.rs`): where it is, sessions to it, the
/// healers' flags and connection strings, the cluster's restart, and its
/// removal after a run that passed (else the cluster's files stay for
/// inspection).
pub struct InCluster {
    pub schema: String,
    /// The run's own server: the only one it restarts (a fleet's stores
    /// share it).
    cluster: Arc<Throwaway>,
    /// The store's database over TCP, as the healers connect.
    url: String,
    /// The run passed and [`InCluster::remove`] dropped the schema.
    removed: AtomicBool,
}

impl InCluster {
    /// A fresh schema name (`gh_<tag>_...`) in database `db` (which exists)
    /// of `cluster`; the caller creates the schema.
    pub fn new(cluster: Arc<Throwaway>, db: &str, tag: &str) -> InCluster {
        InCluster {
            url: cluster.url(db),
            schema: pg::schema_name(tag),
            cluster,
            removed: AtomicBool::new(false),
        }
    }

    /// The store's database over TCP (no application name).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The port of the run's cluster.
    pub fn port(&self) -> u16 {
        self.cluster.port
    }

    /// A session for the run's own reads, retried while the server restarts.
    pub async fn check(&self) -> Client {
        connect_within(&self.url, Duration::from_secs(30)).await
    }

    /// One attempt at a writer's or subscriber's session.
    pub async fn connect(&self) -> Result<Client, String> {
        try_connect(&self.url).await.map_err(|e| e.to_string())
    }

    /// The connection string of the healer in `slot` (its application name).
    pub fn healer_url(&self, slot: usize) -> String {
        pg::named(&self.url, &format!("gh-chaos-healer-{slot}"))
    }

    /// The healer's store flags for `slot` (`--engine postgres --schema S`,
    /// then `more`), its connection string in the environment.
    pub fn healer_store(&self, slot: usize, more: &[&str]) -> Spec {
        let args = ["--engine", "postgres", "--schema", &self.schema];
        (
            args.iter().chain(more).map(|s| s.to_string()).collect(),
            vec![("GAP_HEALER_CONNECTION_STRING".into(), self.healer_url(slot))],
        )
    }

    pub async fn restart(&self) -> (Duration, String) {
        restart_cluster(&self.cluster, &self.url).await
    }

    pub fn describe(&self) -> String {
        format!("schema {}", self.schema)
    }

    /// What `sql` selects with `params`, on a session of its own: the
    /// verdict's reads.
    pub async fn select(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Vec<Row> {
        self.check()
            .await
            .query(sql, params)
            .await
            .unwrap_or_else(|e| panic!("{e}\nin:\n{sql}"))
    }

    /// The rows `sql` selects as the verdict reads them: position, message
    /// id, stream, stream position, type, data as text.
    pub async fn stored_rows(&self, sql: &str) -> Vec<StoredRow> {
        self.select(sql, &[])
            .await
            .iter()
            .map(|r| {
                let data: String = r.get(5);
                (
                    r.get(0),
                    r.get(1),
                    r.get(2),
                    r.get(3),
                    r.get(4),
                    serde_json::from_str(&data).unwrap(),
                )
            })
            .collect()
    }

    /// The streams `sql` selects as the verdict reads them: name, Version,
    /// rows, lowest and highest stream position.
    pub async fn stored_streams(&self, sql: &str) -> Vec<StoredStream> {
        self.select(sql, &[])
            .await
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect()
    }

    /// Drops the schema (after a run that passed).
    pub async fn remove(&self) {
        self.check()
            .await
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await
            .unwrap();
        self.removed.store(true, Ordering::SeqCst);
    }
}

impl Drop for InCluster {
    fn drop(&mut self) {
        if !self.removed.load(Ordering::SeqCst) {
            self.cluster.keep_files();
        }
    }
}

/// Eventuous's tables in a schema of the run's cluster ([`InCluster`],
/// which it derefs to).
pub struct Postgres {
    store: InCluster,
    /// Name of the messages table's primary key constraint.
    pub pkey: String,
    /// Every append, read-back and page holds it to read; breaking the
    /// store (renaming its schema away, `fleet.rs`) holds it to write, so
    /// the store's writers and subscriber wait out the break instead of
    /// meeting a missing table.
    pub gate: Arc<RwLock<()>>,
}

impl std::ops::Deref for Postgres {
    type Target = InCluster;

    fn deref(&self) -> &InCluster {
        &self.store
    }
}

impl Postgres {
    /// A throwaway cluster with a database `chaos` and a fresh schema with
    /// the Eventuous tables in it.
    pub async fn create() -> Postgres {
        let cluster = Throwaway::started("chaos", "trust");
        cluster.create_database("chaos").await;
        Postgres::in_cluster(Arc::new(cluster), "chaos").await
    }

    /// A fresh schema with the Eventuous tables in database `db` (which
    /// exists) of `cluster`.
    pub async fn in_cluster(cluster: Arc<Throwaway>, db: &str) -> Postgres {
        let store = InCluster::new(cluster, db, "chaos");
        let admin = connect_within(store.url(), Duration::from_secs(10)).await;
        pg::create_schema(&admin, &store.schema)
            .await
            .expect("create the chaos schema");
        let pkey: String = admin
            .query_one(
                "SELECT conname::text FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'p'",
                &[&format!("{}.messages", store.schema)],
            )
            .await
            .unwrap()
            .get(0);
        Postgres {
            store,
            pkey,
            gate: Arc::new(RwLock::new(())),
        }
    }
}

/// What an error inside an append means to the journal: the connection
/// lost, the primary key `pkey` met (a fill took a position), the unique
/// key `race` met (a version race lost), a deadlock, or something else.
pub fn refusal(e: &tokio_postgres::Error, pkey: &str, race: Option<&str>) -> Refusal {
    let constraint = e.as_db_error().and_then(|d| d.constraint());
    let unique = e.code() == Some(&SqlState::UNIQUE_VIOLATION);
    if is_connection_error(e) {
        Refusal::Lost
    } else if unique && constraint == Some(pkey) {
        Refusal::PrimaryKey
    } else if unique && race.is_some() && constraint == race {
        Refusal::LostRace
    } else if e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED) {
        Refusal::Deadlock
    } else {
        Refusal::Other
    }
}

impl Backend for Postgres {
    type Conn = Client;
    const NAME: &'static str = "PostgreSQL";
    const FIRST: i64 = 1;
    const DUPLICATES_IGNORED: bool = true;

    const EVENTUOUS_FUNCTION: bool = true;

    async fn connect(&self) -> Result<Client, String> {
        self.store.connect().await
    }

    async fn append_function(&self, c: &mut Client, call: &Call<'_>) -> Called {
        let _gate = self.gate.read().await;
        let c: &Client = c;
        let s = self.schema.as_str();
        let (w, n, stream) = (call.w, call.n, call.stream);
        let lost_or = |e: &tokio_postgres::Error, what: &str| -> Called {
            if is_connection_error(e) {
                return Called::Lost;
            }
            let expected = e.code() == Some(&SqlState::RAISE_EXCEPTION)
                || e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED)
                // Two calls creating one new stream: the loser meets its name.
                || e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                    && e.as_db_error().and_then(|d| d.constraint()).is_some_and(|k| k.contains("stream_name"));
            if !expected {
                call.journal.violation(format!(
                    "writer {w} call {n} of append_events on {stream}: unexpected error in {what}: {e:?}"
                ));
            }
            Called::NotCommitted
        };
        // The Version as an application reads it: without a lock.
        let version: i32 = match c
            .query_opt(
                &format!("SELECT version FROM {s}.streams WHERE stream_name = $1"),
                &[&stream],
            )
            .await
        {
            Ok(row) => row.map_or(-1, |r| r.get(0)),
            Err(e) => return lost_or(&e, "reading the version"),
        };
        if let Err(e) = c.batch_execute("BEGIN").await {
            return lost_or(&e, "BEGIN");
        }
        let reported =
            eventuous::append_events(c, s, stream, version, &[call.id], EVENT_TYPE).await;
        if let Err(e) = reported {
            let _ = c.batch_execute("ROLLBACK").await;
            return lost_or(&e, "append_events");
        }
        if let Some(hold) = call.hold {
            tokio::time::sleep(hold).await;
        }
        if !call.commit {
            let _ = c.batch_execute("ROLLBACK").await;
            return Called::NotCommitted;
        }
        let committed = match c.batch_execute("COMMIT").await {
            Ok(()) => true,
            Err(e) if is_connection_error(&e) => false,
            Err(e) => return lost_or(&e, "COMMIT"),
        };
        // The writer's own view: is the event it was told is stored there?
        let check = if committed {
            None
        } else {
            Some(connect_within(self.url(), Duration::from_secs(60)).await)
        };
        let reader: &Client = check.as_ref().unwrap_or(c);
        let found = reader
            .query_opt(
                &format!(
                    "SELECT m.global_position, m.stream_position, m.json_data::text FROM {s}.messages m
                     JOIN {s}.streams st USING (stream_id) WHERE st.stream_name = $1 AND m.message_id = $2"
                ),
                &[&stream, &call.id],
            )
            .await;
        let found = match found {
            Ok(found) => found,
            Err(e) => return lost_or(&e, "reading its event back"),
        };
        match (found, committed) {
            (Some(row), _) if call.retry => {
                let _ = row;
                Called::AlreadyThere
            }
            (Some(row), _) => {
                let data: String = row.get(2);
                Called::Stored(Event {
                    id: call.id,
                    stream: stream.to_string(),
                    global: row.get(0),
                    stream_pos: row.get(1),
                    data: serde_json::from_str(&data).unwrap(),
                })
            }
            // The COMMIT got no answer, and nothing is there: not committed.
            (None, false) => Called::Lost,
            (None, true) => {
                // It reported success and its row is not there. Eventuous
                // drops it silently when another append holds its stream
                // position; if nothing does, a tombstone took its global
                // position: the event the healer must never cost.
                let taken: i64 = reader
                    .query_one(
                        &format!(
                            "SELECT count(*) FROM {s}.messages m JOIN {s}.streams st USING (stream_id)
                             WHERE st.stream_name = $1 AND m.stream_position = $2"
                        ),
                        &[&stream, &(version + 1)],
                    )
                    .await
                    .map(|r| r.get(0))
                    .unwrap_or(0);
                if taken == 0 {
                    call.journal.violation(format!(
                        "writer {w} call {n}: append_events on {stream} at version {version} reported \
                         success and committed, but its event {} is missing and no row holds its stream \
                         position {}: a tombstone took its place",
                        call.id,
                        version + 1
                    ));
                    Called::NotCommitted
                } else {
                    Called::LostRace
                }
            }
        }
    }

    async fn append(&self, c: &mut Client, append: &Append<'_>) -> Attempt {
        // One append attempt in one transaction.
        let _gate = self.gate.read().await;
        let c: &Client = c;
        let (pkey, s) = (self.pkey.as_str(), self.schema.as_str());
        // An error inside the transaction: was the connection lost, or did the server refuse?
        let refused = |e: &tokio_postgres::Error, what: &str| -> Attempt {
            append.refused(what, refusal(e, pkey, None), &format!("{e:?}"))
        };
        if let Err(e) = c.batch_execute("BEGIN").await {
            return refused(&e, "BEGIN");
        }
        let mut events = Vec::new();
        for (pi, part) in append.parts.iter().enumerate() {
            let (stream_id, version) = match eventuous::lock_stream(c, s, &part.stream).await {
                Ok(r) => r,
                Err(e) => {
                    let _ = c.batch_execute("ROLLBACK").await;
                    return refused(&e, "the stream row");
                }
            };
            let mut written = 0;
            for (i, id) in part.ids.iter().enumerate() {
                let data = append.data(pi, i);
                let position = if part.fail {
                    // A stale expected version: a stream position already taken
                    // (or -1 on a new stream, which the CHECK refuses).
                    version
                } else {
                    version + 1 + written
                };
                let duplicate = if part.strict {
                    Duplicate::Fail
                } else {
                    Duplicate::Skip
                };
                let inserted = eventuous::insert(
                    c,
                    s,
                    stream_id,
                    position,
                    id,
                    EVENT_TYPE,
                    &data.to_string(),
                    duplicate,
                )
                .await;
                match inserted {
                    Ok(global) => {
                        append.inserted(part);
                        if let Some(global) = global {
                            events.push(Event {
                                id: *id,
                                stream: part.stream.clone(),
                                global,
                                stream_pos: position,
                                data,
                            });
                            written += 1;
                        }
                    }
                    Err(e) => {
                        let expected = (part.fail
                            && matches!(
                                e.code(),
                                Some(&SqlState::UNIQUE_VIOLATION)
                                    | Some(&SqlState::CHECK_VIOLATION)
                            ))
                            || (part.strict && e.code() == Some(&SqlState::UNIQUE_VIOLATION));
                        let constraint = e
                            .as_db_error()
                            .and_then(|d| d.constraint())
                            .unwrap_or_default()
                            .to_string();
                        let _ = c.batch_execute("ROLLBACK").await;
                        if expected && constraint != pkey {
                            return append.failed_as_meant(part);
                        }
                        return refused(&e, "an insert");
                    }
                }
            }
            if let Err(e) = eventuous::set_version(c, s, stream_id, version + written).await {
                let _ = c.batch_execute("ROLLBACK").await;
                return refused(&e, "the version update");
            }
        }
        end_append(c, append, events, refused).await
    }

    async fn resolve(&self, journal: &Journal, events: &[Event]) -> bool {
        let _gate = self.gate.read().await;
        resolve(self.url(), &self.schema, journal, events).await
    }

    async fn page(&self, c: &mut Client, next: i64) -> Result<Vec<PageRow>, String> {
        let _gate = self.gate.read().await;
        pg::page(c, &self.schema, next)
            .await
            .map_err(|e| e.to_string())
    }

    fn healer_store(&self, slot: usize) -> Spec {
        self.store.healer_store(slot, &[])
    }

    async fn restart(&self) -> (Duration, String) {
        self.store.restart().await
    }

    async fn count_and_head(&self) -> (i64, i64) {
        let s = &self.schema;
        let sql = format!("SELECT COUNT(*), COALESCE(MAX(global_position), 0) FROM {s}.messages");
        let row = &self.select(&sql, &[]).await[0];
        (row.get(0), row.get(1))
    }

    async fn rows(&self) -> Vec<StoredRow> {
        let s = &self.schema;
        self.stored_rows(&format!(
            "SELECT m.global_position, m.message_id, s.stream_name::text, m.stream_position, m.message_type::text, m.json_data::text
             FROM {s}.messages m JOIN {s}.streams s USING (stream_id) ORDER BY 1"
        ))
        .await
    }

    async fn streams(&self) -> Vec<StoredStream> {
        let s = &self.schema;
        self.stored_streams(&format!(
            "SELECT s.stream_name::text, s.version, COUNT(m.*), COALESCE(MIN(m.stream_position), 0), COALESCE(MAX(m.stream_position), -1)
             FROM {s}.streams s LEFT JOIN {s}.messages m USING (stream_id) GROUP BY 1, 2 ORDER BY 1"
        ))
        .await
    }

    async fn fill_transactions(&self) -> i64 {
        let s = &self.schema;
        let sql = format!(
            "SELECT COUNT(DISTINCT m.created) FROM {s}.messages m JOIN {s}.streams s USING (stream_id) WHERE s.stream_name = $1"
        );
        self.select(&sql, &[&TOMBSTONE_STREAM]).await[0].get(0)
    }

    fn describe(&self) -> String {
        self.store.describe()
    }

    async fn remove(&self) {
        self.store.remove().await;
    }
}

/// Restarts the run's own cluster: a fast shutdown (every session ends, as
/// when a server goes down), then a start, as `pg_ctl restart` does; returns
/// how long until `url` answered again, and what was restarted.
pub async fn restart_cluster(cluster: &Throwaway, url: &str) -> (Duration, String) {
    let started = Instant::now();
    tokio::task::block_in_place(|| {
        cluster.stop();
        cluster.start();
    });
    connect_within(url, Duration::from_secs(60)).await;
    (
        started.elapsed(),
        format!(
            "restart of the run's own PostgreSQL cluster (port {})",
            cluster.port
        ),
    )
}

/// When the machine's PostgreSQL (127.0.0.1:5432 or GAP_HEALER_TEST_PG)
/// started, `None` when it does not answer: a restart changes it.
pub async fn machine_server_started() -> Option<String> {
    let client = try_connect(&pg::pg_url()).await.ok()?;
    let row = client
        .query_one("SELECT pg_postmaster_start_time()::text", &[])
        .await
        .ok()?;
    row.try_get(0).ok()
}

/// One connection attempt to `url`, bounded by 2 s.
pub async fn try_connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let url = pg::with_param(&pg::named(url, "gh-chaos-test"), "connect_timeout", "2");
    pg::try_connect(&url).await
}

/// Connects to `url`, retrying every 100 ms (the server may be restarting)
/// for up to `limit`.
pub async fn connect_within(url: &str, limit: Duration) -> Client {
    connect_retrying(&format!("PostgreSQL at {url}"), limit, || async {
        try_connect(url).await.map_err(|e| e.to_string())
    })
    .await
}

/// The end of an append on PostgreSQL, once its rows are inserted: held
/// open as long as the append says, then rolled back or committed; a
/// COMMIT without an answer leaves its outcome unknown.
pub async fn end_append(
    c: &Client,
    append: &Append<'_>,
    events: Vec<Event>,
    refused: impl Fn(&tokio_postgres::Error, &str) -> Attempt,
) -> Attempt {
    if let Some(hold) = append.hold {
        tokio::time::sleep(hold).await;
    }
    if !append.kind.commits() {
        let _ = c.batch_execute("ROLLBACK").await;
        return append.rolled_back();
    }
    match c.batch_execute("COMMIT").await {
        Ok(()) => Attempt::Committed(events),
        Err(e) if is_connection_error(&e) => Attempt::Unknown(events),
        Err(e) => refused(&e, "COMMIT"),
    }
}

pub fn is_connection_error(e: &tokio_postgres::Error) -> bool {
    e.is_closed()
        || e.code().is_none()
        || e.code().is_some_and(|c| {
            c.code().starts_with("08")
                || c.code().starts_with("57P")
                || c == &SqlState::ADMIN_SHUTDOWN
        })
}

/// Reads back the message ids of an append whose COMMIT got no answer: all
/// there (at the positions the inserts returned) means committed, none means
/// not; anything else is a half-committed append, a violation.
async fn resolve(url: &str, s: &str, journal: &Journal, events: &[Event]) -> bool {
    if events.is_empty() {
        return false;
    }
    let c = connect_within(url, Duration::from_secs(60)).await;
    let ids: Vec<Uuid> = events.iter().map(|e| e.id).collect();
    let positions: Vec<i64> = events.iter().map(|e| e.global).collect();
    let found: Vec<(Uuid, i64)> = c
        .query(
            &format!("SELECT message_id, global_position FROM {s}.messages WHERE message_id = ANY($1) AND global_position = ANY($2)"),
            &[&ids, &positions],
        )
        .await
        .expect("read back an append")
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    journal.read_back(found.len(), events.len())
}
