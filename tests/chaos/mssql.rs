//! The chaos run on SQL Server: a database of its own on the server that the
//! test kit's `mssql` module finds (GAP_HEALER_TEST_MSSQL or a
//! testcontainers container), Eventuous-style appends in explicit
//! transactions with XACT_ABORT ON, and a restart that is either
//! GAP_HEALER_CHAOS_MSSQL_RESTART (a shell command restarting the server) or
//! the database taken OFFLINE WITH ROLLBACK IMMEDIATE and brought back.
//!
//! Run here against Babelfish 4.2 (not SQL Server; docs/sqlserver.md has
//! the figures); never against SQL Server on this machine. The reads are plain SELECTs under the database's
//! default isolation, as an Eventuous reader's are: with
//! READ_COMMITTED_SNAPSHOT off they wait on an open append's key instead of
//! seeing a hole, which shows in the subscriber's stalls, not as a failure.

use std::time::{Duration, Instant};

use gap_healer_testkit::eventuous::mssql::{append_events_sql, append_sql};
use gap_healer_testkit::mssql::{self as ms, Client};
use gap_healer_testkit::subscriber::PageRow;
use tiberius::ToSql;
use uuid::Uuid;

use crate::support::*;

/// Unique-key violations (constraint, index) and CHECK/FK violations.
const UNIQUE: [u32; 2] = [2627, 2601];
const CHECK: u32 = 547;
const DEADLOCK: u32 = 1205;
/// The Messages primary key of the Eventuous fixture.
const PKEY: &str = "PK_Events";

pub struct SqlServer {
    /// The test database; taken when the store is removed.
    db: std::sync::Mutex<Option<ms::TestDb>>,
    name: String,
    /// The admin's connection string for the test database.
    cs: String,
    /// Whether the server is Babelfish (its healers take longer to lead).
    babelfish: bool,
}

impl SqlServer {
    /// A fresh database with the Eventuous tables. Panics with the reason
    /// when there is no SQL Server (the test is ignored by default).
    pub async fn create() -> SqlServer {
        let db = ms::TestDb::create().await;
        SqlServer {
            name: db.name.clone(),
            cs: db.connection_string(),
            db: std::sync::Mutex::new(Some(db)),
            babelfish: ms::is_babelfish().await,
        }
    }

    async fn client(&self) -> Client {
        connect_within(&self.cs, Duration::from_secs(60)).await
    }

    async fn query(&self, sql: &str, params: &[&dyn ToSql]) -> Vec<tiberius::Row> {
        let mut c = self.client().await;
        ms::rows(&mut c, sql, params).await
    }
}

/// How long one login (and first query) may take while the server may be
/// coming back.
const ATTEMPT: Duration = Duration::from_secs(10);

/// Connects, retrying every 100 ms (the server or database may be coming
/// back) for up to `limit`, each attempt bounded by [`ATTEMPT`].
async fn connect_within(cs: &str, limit: Duration) -> Client {
    connect_retrying("SQL Server", limit, || async {
        tokio::time::timeout(ATTEMPT, ms::connect(cs))
            .await
            .unwrap_or_else(|_| Err(format!("no login within {ATTEMPT:?}")))
    })
    .await
}

async fn batch(c: &mut Client, sql: &str) -> Result<(), tiberius::error::Error> {
    c.simple_query(sql).await?.into_results().await.map(|_| ())
}

const ROLLBACK: &str = "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;";
/// check_stream's wrong expected version and missing stream.
const WRONG_VERSION: [u32; 2] = [50000, 50001];

impl SqlServer {
    /// The event with message id `id` in `stream`, as the writer reads it back.
    async fn stored(
        c: &mut Client,
        stream: &str,
        id: Uuid,
    ) -> Result<Option<Event>, tiberius::error::Error> {
        let rows = async {
            c.query(
                "SELECT m.GlobalPosition, m.StreamPosition, m.JsonData FROM eventuous.Messages AS m
                 JOIN eventuous.Streams AS s ON s.StreamId = m.StreamId
                 WHERE s.StreamName = @P1 AND m.MessageId = @P2",
                &[&stream, &id],
            )
            .await?
            .into_first_result()
            .await
        }
        .await?;
        Ok(rows.first().map(|r| Event {
            id,
            stream: stream.to_string(),
            global: r.get::<i64, _>(0).unwrap_or(-1),
            stream_pos: r.get::<i32, _>(1).unwrap_or(-1),
            data: serde_json::from_str(r.get::<&str, _>(2).unwrap_or("null")).unwrap_or_default(),
        }))
    }
}

impl Backend for SqlServer {
    type Conn = Client;
    const NAME: &'static str = "SQL Server";
    const FIRST: i64 = 0;
    const DUPLICATES_IGNORED: bool = false;

    const EVENTUOUS_FUNCTION: bool = true;

    /// On Babelfish a new healer took 5-13 s to lead under the writers'
    /// load (each of its sessions compiles every batch it runs the first
    /// time), so kills every 1.5-4 s left one leader in a 30 s run: 11
    /// kills, no hand-over. There a kill falls every 12-20 s, and the run
    /// needs CHAOS_SECONDS of 90 or more to see hand-overs.
    fn kill_every(&self) -> std::ops::Range<u64> {
        if self.babelfish {
            12_000..20_000
        } else {
            1_500..4_000
        }
    }

    async fn connect(&self) -> Result<Client, String> {
        ms::connect(&self.cs).await
    }

    /// Eventuous's append_events procedure (tests/fixtures/
    /// eventuous_mssql_procedures.sql), its Version read just before without
    /// a lock, in the writer's transaction; then the writer's own view.
    async fn append_function(&self, c: &mut Client, call: &Call<'_>) -> Called {
        let (w, n, stream) = (call.w, call.n, call.stream);
        let fail = |e: &tiberius::error::Error, what: &str| -> Called {
            let Some(code) = e.code() else {
                return Called::Lost;
            };
            let text = e.to_string().to_lowercase();
            // A retry of a stored message id meets its own row.
            if call.retry && UNIQUE.contains(&code) && text.contains("uq_streamidandmessageid") {
                return Called::AlreadyThere;
            }
            // A lost race on the stream position or a new stream's name, a
            // wrong expected version, a deadlock: refused, as Eventuous is.
            let expected = WRONG_VERSION.contains(&code)
                || code == DEADLOCK
                || UNIQUE.contains(&code)
                    && ["uq_streamidandstreamposition", "uq_streamname"]
                        .iter()
                        .any(|key| text.contains(key));
            if !expected {
                call.journal.violation(format!(
                    "writer {w} call {n} of append_events on {stream}: unexpected error in {what}: {e}"
                ));
            }
            Called::NotCommitted
        };
        let version = {
            let rows = async {
                c.query(
                    "SELECT [Version] FROM eventuous.Streams WHERE StreamName = @P1",
                    &[&stream],
                )
                .await?
                .into_first_result()
                .await
            }
            .await;
            match rows {
                Ok(rows) => rows.first().and_then(|r| r.get::<i32, _>(0)).unwrap_or(-1),
                Err(e) => return fail(&e, "reading the version"),
            }
        };
        if let Err(e) = batch(c, "SET XACT_ABORT ON; BEGIN TRANSACTION;").await {
            return fail(&e, "BEGIN");
        }
        let data = "{}";
        let sql = append_events_sql(EVENT_TYPE, 1);
        let params: [&dyn ToSql; 4] = [&stream, &version, &call.id, &data];
        let reported = async { c.query(&sql, &params).await?.into_results().await }.await;
        if let Err(e) = reported {
            if e.code().is_some() {
                let _ = batch(c, ROLLBACK).await;
            }
            return fail(&e, "append_events");
        }
        if let Some(hold) = call.hold {
            tokio::time::sleep(hold).await;
        }
        if !call.commit {
            let _ = batch(c, ROLLBACK).await;
            return Called::NotCommitted;
        }
        let committed = match batch(c, "COMMIT TRANSACTION;").await {
            Ok(()) => true,
            Err(e) if e.code().is_none() => false,
            Err(e) => return fail(&e, "COMMIT"),
        };
        let mut other = if committed {
            None
        } else {
            Some(self.client().await)
        };
        let reader = other.as_mut().unwrap_or(c);
        match Self::stored(reader, stream, call.id).await {
            Ok(Some(event)) => Called::Stored(event),
            Ok(None) if !committed => Called::Lost,
            Ok(None) => {
                // SQL Server never drops a row of a statement that succeeded:
                // a committed append without its row lost it to a tombstone.
                call.journal.violation(format!(
                    "writer {w} call {n}: append_events on {stream} at version {version} committed, \
                     but its event {} is missing",
                    call.id
                ));
                Called::NotCommitted
            }
            Err(e) => fail(&e, "reading its event back"),
        }
    }

    async fn append(&self, c: &mut Client, append: &Append<'_>) -> Attempt {
        // An error: was the connection lost, or did the server refuse?
        let refused = |e: &tiberius::error::Error, what: &str| -> Attempt {
            let refusal = match e.code() {
                None => Refusal::Lost,
                Some(code) if UNIQUE.contains(&code) && e.to_string().contains(PKEY) => {
                    Refusal::PrimaryKey
                }
                Some(DEADLOCK) => Refusal::Deadlock,
                Some(code)
                    if UNIQUE.contains(&code)
                        && ["uq_streamidandstreamposition", "uq_streamname"]
                            .iter()
                            .any(|key| e.to_string().to_lowercase().contains(key)) =>
                {
                    Refusal::LostRace
                }
                Some(_) => Refusal::Other,
            };
            append.refused(what, refusal, &e.to_string())
        };
        if let Err(e) = batch(c, "SET XACT_ABORT ON; BEGIN TRANSACTION;").await {
            return refused(&e, "BEGIN");
        }
        let mut events = Vec::new();
        for (pi, part) in append.parts.iter().enumerate() {
            let data: Vec<serde_json::Value> =
                (0..part.ids.len()).map(|i| append.data(pi, i)).collect();
            let texts: Vec<String> = data.iter().map(|d| d.to_string()).collect();
            let mut params: Vec<&dyn ToSql> = vec![&part.stream];
            for (id, text) in part.ids.iter().zip(&texts) {
                params.push(id);
                params.push(text);
            }
            let sql = append_sql(EVENT_TYPE, part.ids.len(), part.fail);
            let result = async { c.query(&sql, &params).await?.into_first_result().await }.await;
            match result {
                Ok(rows) => {
                    append.inserted(part);
                    for r in rows {
                        let (global, id, stream_pos) = (
                            r.get::<i64, _>(0).unwrap_or(-1),
                            r.get::<Uuid, _>(1).unwrap_or_default(),
                            r.get::<i32, _>(2).unwrap_or(-1),
                        );
                        let i = part.ids.iter().position(|x| *x == id).unwrap_or(0);
                        events.push(Event {
                            id,
                            stream: part.stream.clone(),
                            global,
                            stream_pos,
                            data: data[i].clone(),
                        });
                    }
                }
                Err(e) => {
                    let code = e.code();
                    let expected = code.is_some_and(|code| {
                        (part.fail && (UNIQUE.contains(&code) || code == CHECK))
                            || (part.strict && UNIQUE.contains(&code))
                    }) && !e.to_string().contains(PKEY);
                    if code.is_some() {
                        let _ = batch(c, ROLLBACK).await;
                    }
                    if expected {
                        return append.failed_as_meant(part);
                    }
                    return refused(&e, "an insert");
                }
            }
        }
        if let Some(hold) = append.hold {
            tokio::time::sleep(hold).await;
        }
        if !append.kind.commits() {
            if let Err(e) = batch(c, ROLLBACK).await {
                if e.code().is_none() {
                    return Attempt::Lost;
                }
            }
            return append.rolled_back();
        }
        match batch(c, "COMMIT TRANSACTION;").await {
            Ok(()) => Attempt::Committed(events),
            Err(e) if e.code().is_none() => Attempt::Unknown(events),
            Err(e) => refused(&e, "COMMIT"),
        }
    }

    async fn resolve(&self, journal: &Journal, events: &[Event]) -> bool {
        if events.is_empty() {
            return false;
        }
        let mut c = self.client().await;
        let mut found = 0;
        for e in events {
            let rows = ms::rows(
                &mut c,
                "SELECT COUNT_BIG(*) FROM eventuous.Messages WHERE MessageId = @P1 AND GlobalPosition = @P2",
                &[&e.id, &e.global],
            )
            .await;
            found += rows.first().and_then(|r| r.get::<i64, _>(0)).unwrap_or(0);
        }
        journal.read_back(usize::try_from(found).unwrap_or(0), events.len())
    }

    async fn page(&self, c: &mut Client, next: i64) -> Result<Vec<PageRow>, String> {
        ms::page(c, next, 500).await.map_err(|e| e.to_string())
    }

    fn healer_store(&self, slot: usize) -> (Vec<String>, Vec<(String, String)>) {
        let cs = format!("{};Application Name=gh-chaos-healer-{slot}", self.cs);
        let args = ["--engine", "mssql", "--schema", ms::SCHEMA];
        (
            args.iter().map(|s| s.to_string()).collect(),
            vec![("GAP_HEALER_CONNECTION_STRING".into(), cs)],
        )
    }

    async fn restart(&self) -> (Duration, String) {
        let started = Instant::now();
        let what = match std::env::var("GAP_HEALER_CHAOS_MSSQL_RESTART") {
            Ok(command) if !command.trim().is_empty() => {
                run_restart_command(command).await;
                "server restart by GAP_HEALER_CHAOS_MSSQL_RESTART".to_string()
            }
            _ => {
                let admin = ms::server().expect("a SQL Server");
                let mut m = connect_within(admin, Duration::from_secs(30)).await;
                ms::exec(
                    &mut m,
                    &format!(
                        "ALTER DATABASE [{0}] SET OFFLINE WITH ROLLBACK IMMEDIATE; ALTER DATABASE [{0}] SET ONLINE;",
                        self.name
                    ),
                )
                .await;
                "database OFFLINE WITH ROLLBACK IMMEDIATE and ONLINE again, not a server restart"
                    .to_string()
            }
        };
        // Back when the database answers a query again. Each attempt is
        // bounded: a login to a server coming back may hang (Babelfish
        // accepts the TCP connection before it can answer a login), and an
        // attempt that never ends would stop the retries.
        connect_retrying(
            "the database after its restart",
            Duration::from_secs(120),
            || async {
                tokio::time::timeout(ATTEMPT, async {
                    let mut c = ms::connect(&self.cs).await?;
                    batch(&mut c, "SELECT TOP (1) 1 FROM eventuous.Messages;")
                        .await
                        .map_err(|e| e.to_string())
                })
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {ATTEMPT:?}")))
            },
        )
        .await;
        (started.elapsed(), what)
    }

    async fn count_and_head(&self) -> (i64, i64) {
        let rows = self
            .query(
                "SELECT COUNT_BIG(*), COALESCE(MAX(GlobalPosition), -1) FROM eventuous.Messages",
                &[],
            )
            .await;
        let r = &rows[0];
        (
            r.get::<i64, _>(0).unwrap_or(0),
            r.get::<i64, _>(1).unwrap_or(-1),
        )
    }

    async fn rows(&self) -> Vec<StoredRow> {
        self.query(
            "SELECT m.GlobalPosition, m.MessageId, s.StreamName, m.StreamPosition, m.MessageType, m.JsonData \
             FROM eventuous.Messages AS m INNER JOIN eventuous.Streams AS s ON s.StreamId = m.StreamId \
             ORDER BY m.GlobalPosition",
            &[],
        )
        .await
        .iter()
        .map(|r| {
            let data = r.get::<&str, _>(5).unwrap_or_default();
            (
                r.get::<i64, _>(0).unwrap_or(-1),
                r.get::<Uuid, _>(1).unwrap_or_default(),
                r.get::<&str, _>(2).unwrap_or_default().to_string(),
                r.get::<i32, _>(3).unwrap_or(-1),
                r.get::<&str, _>(4).unwrap_or_default().to_string(),
                serde_json::from_str(data).unwrap_or(serde_json::Value::Null),
            )
        })
        .collect()
    }

    async fn streams(&self) -> Vec<StoredStream> {
        self.query(
            "SELECT s.StreamName, s.[Version], COUNT_BIG(m.GlobalPosition), \
             COALESCE(MIN(m.StreamPosition), 0), COALESCE(MAX(m.StreamPosition), -1) \
             FROM eventuous.Streams AS s LEFT JOIN eventuous.Messages AS m ON m.StreamId = s.StreamId \
             GROUP BY s.StreamName, s.[Version] ORDER BY s.StreamName",
            &[],
        )
        .await
        .iter()
        .map(|r| {
            (
                r.get::<&str, _>(0).unwrap_or_default().to_string(),
                r.get::<i32, _>(1).unwrap_or(-2),
                r.get::<i64, _>(2).unwrap_or(0),
                r.get::<i32, _>(3).unwrap_or(0),
                r.get::<i32, _>(4).unwrap_or(-1),
            )
        })
        .collect()
    }

    async fn fill_transactions(&self) -> i64 {
        self.query(
            "SELECT COUNT_BIG(DISTINCT m.Created) FROM eventuous.Messages AS m \
             INNER JOIN eventuous.Streams AS s ON s.StreamId = m.StreamId WHERE s.StreamName = @P1",
            &[&TOMBSTONE_STREAM],
        )
        .await
        .first()
        .and_then(|r| r.get::<i64, _>(0))
        .unwrap_or(0)
    }

    fn describe(&self) -> String {
        format!("database {}", self.name)
    }

    async fn remove(&self) {
        let db = self.db.lock().unwrap().take();
        if let Some(db) = db {
            db.drop().await;
        }
    }
}
