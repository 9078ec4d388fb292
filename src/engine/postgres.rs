//! The PostgreSQL engine, for the Eventuous PostgreSQL schema
//! (`<schema>.messages`, `streams`, `checkpoints`).
//!
//! PostgreSQL shows no uncommitted rows, so an open append's position looks
//! exactly like a hole. That is fine: the fill's insert must check the primary
//! key, waits on that append's key lock (bounded by `SET LOCAL lock_timeout`)
//! and then fails with 55P03 (still open), fails with 23505 (it committed), or
//! succeeds (it rolled back).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bb8::{Pool, PooledConnection, RunError};
use bb8_postgres::PostgresConnectionManager;
use tokio_postgres::error::SqlState;
use tokio_postgres::Config;
use tokio_postgres_rustls::MakeRustlsConnect;

pub mod tls;

use super::{
    Checkpoint, DbError, DbErrorKind, DbResult, Engine, EngineKind, FillOutcome, Finding, Probe,
    ScanPage, StoreSettings,
};
use crate::gaps::PosRange;
use crate::secret::ConnectionString;

const SCAN_SQL: &str = include_str!("../../sql/postgres/scan.sql");
const PROBE_SQL: &str = include_str!("../../sql/postgres/probe.sql");
const FILL_SQL: &str = include_str!("../../sql/postgres/fill.sql");
const GRANTS_SQL: &str = include_str!("../../sql/postgres/grants.sql");

/// Rows per fill transaction. PostgreSQL has no lock escalation; the bound
/// keeps each transaction (and the tombstone stream's row lock) short.
const MAX_FILL_ROWS: u64 = 20_000;
/// Ranges per probe query.
const PROBE_BATCH: usize = 1_000;
/// Ranges per fill transaction: scattered narrow holes go in together.
const MAX_FILL_RANGES: usize = 1_000;
/// Wait for the tombstone stream's row (another healer filling) before `Busy`.
const STREAM_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// bb8-postgres's manager, plus a way to retire a session whose state went
/// stale: a session opened while the database was read-only keeps that
/// default after the database is made writable, so a session that met 25006
/// is closed rather than reused.
struct Manager(PostgresConnectionManager<MakeRustlsConnect>);

struct PgConn {
    client: tokio_postgres::Client,
    retire: bool,
}

impl std::ops::Deref for PgConn {
    type Target = tokio_postgres::Client;
    fn deref(&self) -> &Self::Target {
        &self.client
    }
}

impl bb8::ManageConnection for Manager {
    type Connection = PgConn;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<PgConn, tokio_postgres::Error> {
        Ok(PgConn {
            client: self.0.connect().await?,
            retire: false,
        })
    }

    async fn is_valid(&self, conn: &mut PgConn) -> Result<(), tokio_postgres::Error> {
        self.0.is_valid(&mut conn.client).await
    }

    fn has_broken(&self, conn: &mut PgConn) -> bool {
        conn.retire || conn.client.is_closed()
    }
}

pub struct PostgresEngine {
    pool: Pool<Manager>,
    /// For the leader lock's dedicated session, outside the pool.
    config: Config,
    tls: MakeRustlsConnect,
    tls_mode: tls::TlsMode,
    last_connect_error: LastConnectError,
    /// The leader lock's session (backend pid) and key, once this process has
    /// led: every fill checks, inside its transaction, that this session still
    /// holds the lock, so a leader whose lock session died cannot fill after
    /// another healer took over. `None` without election: no fence.
    fence: Mutex<Option<(i32, i64)>>,
    cs: ConnectionString,
    sql: Queries,
    schema: String,
    tombstone_stream: String,
    tombstone_type: String,
    /// Name of the primary key of messages: a 23505 on it means "committed";
    /// on any other constraint it means the tombstone stream is inconsistent.
    messages_pkey: OnceLock<String>,
}

struct Queries {
    scan: String,
    probe: String,
    fill: String,
    head: String,
    floor: String,
    lock_stream: String,
    create_stream: String,
    bump_stream: String,
    fence: String,
}

impl Queries {
    fn new(schema: &str) -> Self {
        let s = |sql: &str| sql.replace("__schema__", schema);
        Queries {
            scan: s(SCAN_SQL),
            probe: s(PROBE_SQL),
            fill: s(FILL_SQL),
            head: s("SELECT MAX(global_position)::bigint FROM __schema__.messages"),
            floor: format!(
                "SELECT s.seqstart FROM pg_sequence s \
                 WHERE s.seqrelid = pg_get_serial_sequence('{schema}.messages', 'global_position')::regclass"
            ),
            lock_stream: s("SELECT stream_id, version FROM __schema__.streams WHERE stream_name = $1 FOR UPDATE"),
            create_stream: s(
                "INSERT INTO __schema__.streams (stream_name, version) VALUES ($1, -1) ON CONFLICT (stream_name) DO NOTHING",
            ),
            bump_stream: s("UPDATE __schema__.streams SET version = version + $2 WHERE stream_id = $1"),
            fence: HELD_BY.to_string(),
        }
    }
}

/// What `gap-healer sql --engine postgres` prints.
pub fn setup_sql(schema: &str) -> String {
    GRANTS_SQL.replace("__schema__", schema)
}

impl PostgresEngine {
    /// Parses the connection string and prepares a pool. Connects lazily, so a
    /// daemon started while the database is down comes up and retries.
    pub fn new(settings: &StoreSettings) -> DbResult<Self> {
        let cs = settings.connection_string.clone();
        let tls::Target {
            mut config,
            tls,
            mode,
        } = tls::parse(cs.expose()).map_err(|e| DbError::permanent(cs.scrub(&e)))?;
        if config.get_application_name().is_none() {
            config.application_name("gap-healer");
        }
        // The probe's cost estimate grows with the table times the tracked
        // ranges; past jit_above_cost every probe was JIT-compiled (13.6 ms
        // instead of under 2 at 10M rows, docs/benchmarks.md). The healer's
        // queries are short: no JIT for its sessions. And a fill transaction
        // is never idle between its statements for longer than a round trip:
        // one idle for seconds belongs to a process that stopped (paused,
        // cut off) while holding the tombstone stream's row, which would keep
        // every other healer from filling; the server ends it.
        let ours = format!(
            "-c jit=off -c idle_in_transaction_session_timeout={}",
            STALLED_SESSION_TIMEOUT.as_millis()
        );
        let options = match config.get_options() {
            Some(given) if !given.trim().is_empty() => format!("{given} {ours}"),
            _ => ours,
        };
        config.options(&options);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(settings.connect_timeout);
        }
        let last_connect_error = LastConnectError::default();
        let pool = Pool::builder()
            .max_size(4)
            .min_idle(Some(0))
            .connection_timeout(settings.connect_timeout)
            .retry_connection(false)
            .error_sink(Box::new(last_connect_error.clone()))
            .build_unchecked(Manager(PostgresConnectionManager::new(
                config.clone(),
                tls.clone(),
            )));
        let schema = settings.schema.to_ascii_lowercase();
        Ok(PostgresEngine {
            pool,
            config,
            tls,
            tls_mode: mode,
            last_connect_error,
            fence: Mutex::new(None),
            cs,
            sql: Queries::new(&schema),
            schema,
            tombstone_stream: settings.tombstone_stream.clone(),
            tombstone_type: settings.tombstone_type.clone(),
            messages_pkey: OnceLock::new(),
        })
    }

    async fn conn(&self) -> DbResult<PooledConnection<'_, Manager>> {
        // Listening before asking, so a connection refused at once is heard.
        let failed = self.last_connect_error.failed.notified();
        tokio::pin!(failed);
        failed.as_mut().enable();
        let result = tokio::select! {
            got = self.pool.get() => got,
            _ = &mut failed => Err(RunError::TimedOut),
        };
        result.map_err(|e| match e {
            RunError::User(e) => self.error(&e, "connect"),
            RunError::TimedOut => {
                let last = self
                    .last_connect_error
                    .last
                    .lock()
                    .ok()
                    .and_then(|mut l| l.take());
                match last {
                    Some(e) => DbError {
                        kind: classify(&e),
                        ..self.error(&e, "database unreachable")
                    },
                    None => DbError::transient(
                        "database unreachable: no connection within connect_timeout",
                    ),
                }
            }
        })
    }

    /// Classifies a driver error and scrubs its text.
    fn error(&self, e: &tokio_postgres::Error, during: &str) -> DbError {
        let code = e.code().map(|c| c.code().to_string());
        let kind = classify(e);
        let detail = describe(e);
        DbError {
            kind,
            code,
            message: self.cs.scrub(&format!("{during}: {detail}")),
        }
    }

    async fn pkey_name(&self, client: &tokio_postgres::Client) -> DbResult<String> {
        if let Some(name) = self.messages_pkey.get() {
            return Ok(name.clone());
        }
        let row = client
            .query_opt(
                "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass($1) AND contype = 'p'",
                &[&format!("{}.messages", self.schema)],
            )
            .await
            .map_err(|e| self.error(&e, "primary key lookup"))?;
        let name: String = row.map(|r| r.get(0)).unwrap_or_default();
        Ok(self.messages_pkey.get_or_init(|| name).clone())
    }

    async fn try_fill(
        &self,
        client: &mut tokio_postgres::Client,
        ranges: &[PosRange],
        lock_timeout: Duration,
    ) -> Result<FillOutcome, (tokio_postgres::Error, Step)> {
        let tx = client.transaction().await.map_err(|e| (e, Step::Begin))?;
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = '{}ms'",
            STREAM_LOCK_TIMEOUT.as_millis()
        ))
        .await
        .map_err(|e| (e, Step::Begin))?;
        let stream = &self.tombstone_stream;
        let mut row = tx
            .query_opt(&self.sql.lock_stream, &[stream])
            .await
            .map_err(|e| (e, Step::Stream))?;
        if row.is_none() {
            tx.execute(&self.sql.create_stream, &[stream])
                .await
                .map_err(|e| (e, Step::Stream))?;
            row = tx
                .query_opt(&self.sql.lock_stream, &[stream])
                .await
                .map_err(|e| (e, Step::Stream))?;
        }
        let Some(row) = row else {
            // Created and deleted between two statements: let the next cycle retry.
            return Ok(FillOutcome::Busy);
        };
        let fence = self.fence.lock().ok().and_then(|f| *f);
        if let Some((pid, key)) = fence {
            let still_leader: bool = tx
                .query_one(&self.sql.fence, &[&pid, &key])
                .await
                .map_err(|e| (e, Step::Stream))?
                .get(0);
            if !still_leader {
                // Another healer may lead now: write nothing (the transaction
                // rolls back when dropped) and let the leader flag catch up.
                return Ok(FillOutcome::Busy);
            }
        }
        let stream_id: i32 = row.get(0);
        let version: i32 = row.get(1);
        let starts: Vec<i64> = ranges.iter().map(|r| r.start).collect();
        let ends: Vec<i64> = ranges.iter().map(|r| r.end).collect();
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = '{}ms'",
            lock_timeout.as_millis().max(1)
        ))
        .await
        .map_err(|e| (e, Step::Insert))?;
        let inserted = tx
            .execute(
                &self.sql.fill,
                &[&starts, &ends, &stream_id, &version, &self.tombstone_type],
            )
            .await
            .map_err(|e| (e, Step::Insert))?;
        tx.execute(&self.sql.bump_stream, &[&stream_id, &(inserted as i32)])
            .await
            .map_err(|e| (e, Step::Stream))?;
        tx.commit().await.map_err(|e| (e, Step::Commit))?;
        Ok(FillOutcome::Filled { rows: inserted })
    }
}

/// A driver error as one line: SQLSTATE and message, or the I/O cause.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => {
            let mut text = e.to_string();
            if let Some(source) = std::error::Error::source(e) {
                text = format!("{text}: {source}");
            }
            text
        }
    }
}

/// Keeps the last connection error of the pool, which bb8 otherwise reports
/// only as a timeout: "unreachable" should say why (refused, TLS, login).
/// And wakes whoever waits for a connection: bb8 keeps a caller waiting for
/// the whole connection timeout even when the connection was refused at once.
#[derive(Clone, Debug, Default)]
struct LastConnectError {
    last: Arc<Mutex<Option<tokio_postgres::Error>>>,
    failed: Arc<tokio::sync::Notify>,
}

impl bb8::ErrorSink<tokio_postgres::Error> for LastConnectError {
    fn sink(&self, error: tokio_postgres::Error) {
        if let Ok(mut last) = self.last.lock() {
            *last = Some(error);
        }
        self.failed.notify_waiters();
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<tokio_postgres::Error>> {
        Box::new(self.clone())
    }
}

/// Where in the fill transaction an error happened: a lock timeout on the
/// tombstone stream's row means another filler, on a message key an append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Begin,
    Stream,
    Insert,
    Commit,
}

/// Transient: worth retrying as is. Everything else needs a person.
pub fn classify_code(code: &SqlState) -> DbErrorKind {
    let c = code.code();
    let transient_class = ["08", "40", "53", "57", "58", "55"];
    if transient_class.iter().any(|p| c.starts_with(p)) || c == "25006" || c == "25P04" {
        // 08 connection, 40 rollback (deadlock, serialization), 53 resources
        // (disk full, out of memory, too many connections), 57 operator
        // intervention (shutdown, query canceled, cannot connect now), 58 I/O,
        // 55 lock not available; 25006 read-only transaction (a failover in
        // progress), 25P04 idle session timeout.
        DbErrorKind::Transient
    } else {
        DbErrorKind::Permanent
    }
}

fn classify(e: &tokio_postgres::Error) -> DbErrorKind {
    match e.code() {
        Some(code) => classify_code(code),
        // No SQLSTATE: the connection broke, or an I/O error.
        None => DbErrorKind::Transient,
    }
}

impl Engine for PostgresEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Postgres
    }

    fn max_fill_rows(&self) -> u64 {
        MAX_FILL_ROWS
    }

    fn max_fill_ranges(&self) -> usize {
        MAX_FILL_RANGES
    }

    async fn identity_floor(&self) -> DbResult<i64> {
        let conn = self.conn().await?;
        let row = conn
            .query_opt(&self.sql.floor, &[])
            .await
            .map_err(|e| self.error(&e, "identity seed"))?;
        Ok(row.map(|r| r.get::<_, i64>(0)).unwrap_or(1))
    }

    async fn head(&self) -> DbResult<Option<i64>> {
        let conn = self.conn().await?;
        let row = conn
            .query_one(&self.sql.head, &[])
            .await
            .map_err(|e| self.error(&e, "head"))?;
        Ok(row.get(0))
    }

    async fn checkpoints(&self) -> DbResult<Vec<Checkpoint>> {
        let conn = self.conn().await?;
        let table = format!("{}.checkpoints", self.schema);
        let exists: Option<String> = conn
            .query_one("SELECT to_regclass($1)::text", &[&table])
            .await
            .map_err(|e| self.error(&e, "checkpoints"))?
            .get(0);
        if exists.is_none() {
            return Ok(Vec::new());
        }
        let rows = conn
            .query(
                &format!("SELECT id::text, position FROM {table} ORDER BY id"),
                &[],
            )
            .await
            .map_err(|e| self.error(&e, "checkpoints"))?;
        Ok(rows
            .iter()
            .map(|r| Checkpoint {
                id: r.get(0),
                position: r.get(1),
            })
            .collect())
    }

    async fn scan(&self, after: i64, limit: u32) -> DbResult<ScanPage> {
        let conn = self.conn().await?;
        let rows = conn
            .query(&self.sql.scan, &[&after, &i64::from(limit)])
            .await
            .map_err(|e| self.error(&e, "scan"))?;
        let mut page = ScanPage {
            holes: Vec::new(),
            high: after,
            rows: 0,
        };
        for row in rows {
            page.high = row.get(0);
            page.rows = row.get::<_, i64>(1) as u64;
            let start: Option<i64> = row.get(2);
            let end: Option<i64> = row.get(3);
            if let Some(hole) = start.zip(end).and_then(|(s, e)| PosRange::new(s, e)) {
                page.holes.push(hole);
            }
        }
        Ok(page)
    }

    async fn probe(&self, ranges: &[PosRange]) -> DbResult<Probe> {
        let mut committed = Vec::new();
        if ranges.is_empty() {
            return Ok(Probe::default());
        }
        let conn = self.conn().await?;
        for batch in ranges.chunks(PROBE_BATCH) {
            let starts: Vec<i64> = batch.iter().map(|r| r.start).collect();
            let ends: Vec<i64> = batch.iter().map(|r| r.end).collect();
            let rows = conn
                .query(&self.sql.probe, &[&starts, &ends])
                .await
                .map_err(|e| self.error(&e, "probe"))?;
            committed.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
        }
        Ok(Probe {
            committed,
            in_flight: Vec::new(),
        })
    }

    async fn fill_ranges(
        &self,
        ranges: &[PosRange],
        lock_timeout: Duration,
    ) -> DbResult<FillOutcome> {
        let Some(range) = ranges.first().map(|first| PosRange {
            start: first.start,
            end: ranges[ranges.len() - 1].end,
        }) else {
            return Ok(FillOutcome::Filled { rows: 0 });
        };
        let mut conn = self.conn().await?;
        let result = self.try_fill(&mut conn.client, ranges, lock_timeout).await;
        if let Err((e, _)) = &result {
            conn.retire = e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION);
        }
        match result {
            Ok(outcome) => Ok(outcome),
            Err((e, step)) => match (e.code(), step) {
                (Some(&SqlState::LOCK_NOT_AVAILABLE), Step::Insert) => Ok(FillOutcome::Held),
                (Some(&SqlState::LOCK_NOT_AVAILABLE), Step::Stream) => Ok(FillOutcome::Busy),
                (Some(&SqlState::UNIQUE_VIOLATION), Step::Insert) => {
                    let constraint = e
                        .as_db_error()
                        .and_then(|d| d.constraint())
                        .unwrap_or_default()
                        .to_string();
                    let pkey = self.pkey_name(&conn).await?;
                    if constraint == pkey {
                        Ok(FillOutcome::Committed)
                    } else {
                        Err(DbError {
                            kind: DbErrorKind::Permanent,
                            code: Some("23505".into()),
                            message: format!(
                                "fill {range}: duplicate key on {constraint}, not on the primary key {pkey}: \
                                 the tombstone stream's version no longer matches its rows; \
                                 run `gap-healer check` and repair it before healing"
                            ),
                        })
                    }
                }
                _ => Err(self.error(&e, &format!("fill {range}"))),
            },
        }
    }

    async fn verify_shape(&self) -> DbResult<()> {
        const SHAPE: [&str; 6] = [
            "schema",
            "table messages",
            "table streams",
            "messages.global_position",
            "messages columns",
            "streams columns",
        ];
        let differs: Vec<String> = self
            .preflight()
            .await?
            .into_iter()
            .filter(|f| !f.ok && SHAPE.contains(&f.what.as_str()))
            .map(|f| format!("{}: {}", f.what, f.detail))
            .collect();
        if differs.is_empty() {
            Ok(())
        } else {
            Err(DbError::permanent(format!(
                "the store in schema {} does not have the Eventuous shape gap-healer needs: {}",
                self.schema,
                differs.join("; ")
            )))
        }
    }

    async fn preflight(&self) -> DbResult<Vec<Finding>> {
        let conn = self.conn().await?;
        let mut out = Vec::new();
        let version: String = conn
            .query_one("SELECT current_setting('server_version')", &[])
            .await
            .map_err(|e| self.error(&e, "server version"))?
            .get(0);
        let num: i32 = conn
            .query_one("SELECT current_setting('server_version_num')::int", &[])
            .await
            .map_err(|e| self.error(&e, "server version"))?
            .get(0);
        out.push(if num >= 130_000 {
            Finding::pass("connect", format!("PostgreSQL {version}"))
        } else {
            Finding::fail(
                "connect",
                format!("PostgreSQL {version}: 13 or later is needed (gen_random_uuid)"),
            )
        });
        let encrypted: Option<bool> = conn
            .query_opt(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .map_err(|e| self.error(&e, "tls"))?
            .map(|r| r.get(0));
        out.push(match (&self.tls_mode, encrypted) {
            (tls::TlsMode::Off, _) => Finding::pass(
                "tls",
                "off: not encrypted (sslmode=require or verify-full, with sslrootcert=FILE for a private CA, turns it on)",
            ),
            (tls::TlsMode::Verified { roots }, Some(true)) => {
                Finding::pass("tls", format!("on, server certificate verified against {roots}"))
            }
            (tls::TlsMode::Verified { .. }, _) => {
                Finding::fail("tls", "TLS was asked for but this session is not encrypted")
            }
        });
        let schema = &self.schema;
        let q = |sql: &'static str| sql;
        let schema_exists: bool = conn
            .query_one(
                q("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)"),
                &[schema],
            )
            .await
            .map_err(|e| self.error(&e, "schema"))?
            .get(0);
        if !schema_exists {
            out.push(Finding::fail(
                "schema",
                format!("schema {schema} does not exist"),
            ));
            return Ok(out);
        }
        out.push(Finding::pass("schema", format!("schema {schema} exists")));

        // messages: global_position bigint identity primary key, and the columns a tombstone fills.
        let cols = conn
            .query(
                "SELECT c.table_name::text, c.column_name::text, c.data_type::text, c.is_identity::text
                 FROM information_schema.columns c WHERE c.table_schema = $1 AND c.table_name IN ('messages', 'streams', 'checkpoints')",
                &[schema],
            )
            .await
            .map_err(|e| self.error(&e, "columns"))?;
        let col = |t: &str, c: &str| {
            cols.iter()
                .find(|r| r.get::<_, String>(0) == t && r.get::<_, String>(1) == c)
                .map(|r| (r.get::<_, String>(2), r.get::<_, String>(3)))
        };
        let has_table = |t: &str| cols.iter().any(|r| r.get::<_, String>(0) == t);
        for table in ["messages", "streams"] {
            if !has_table(table) {
                out.push(Finding::fail(
                    format!("table {table}"),
                    format!("{schema}.{table} does not exist"),
                ));
            }
        }
        if has_table("messages") {
            match col("messages", "global_position") {
                Some((ty, ident)) if ty == "bigint" && ident == "YES" => {
                    let pk = self.pkey_name(&conn).await?;
                    let pk_cols: Vec<String> = conn
                        .query(
                            "SELECT a.attname::text FROM pg_constraint k JOIN pg_attribute a
                               ON a.attrelid = k.conrelid AND a.attnum = ANY (k.conkey)
                             WHERE k.conrelid = to_regclass($1) AND k.contype = 'p'",
                            &[&format!("{schema}.messages")],
                        )
                        .await
                        .map_err(|e| self.error(&e, "primary key"))?
                        .iter()
                        .map(|r| r.get(0))
                        .collect();
                    if pk_cols == ["global_position"] {
                        out.push(Finding::pass(
                            "messages.global_position",
                            format!("bigint identity, primary key {pk}"),
                        ));
                    } else {
                        out.push(Finding::fail(
                            "messages.global_position",
                            format!("the primary key is on ({}), not (global_position): holes cannot be filled safely", pk_cols.join(", ")),
                        ));
                    }
                }
                Some((ty, ident)) => out.push(Finding::fail(
                    "messages.global_position",
                    format!(
                        "expected bigint identity, found {ty}{}",
                        if ident == "YES" {
                            " identity"
                        } else {
                            " without identity"
                        }
                    ),
                )),
                None => out.push(Finding::fail("messages.global_position", "column missing")),
            }
            let missing: Vec<&str> = [
                "message_id",
                "message_type",
                "stream_id",
                "stream_position",
                "json_data",
                "json_metadata",
                "created",
            ]
            .into_iter()
            .filter(|c| col("messages", c).is_none())
            .collect();
            if missing.is_empty() {
                out.push(Finding::pass(
                    "messages columns",
                    "all Eventuous columns present",
                ));
            } else {
                out.push(Finding::fail(
                    "messages columns",
                    format!("missing: {}", missing.join(", ")),
                ));
            }
        }
        if has_table("streams") {
            let missing: Vec<&str> = ["stream_id", "stream_name", "version"]
                .into_iter()
                .filter(|c| col("streams", c).is_none())
                .collect();
            if missing.is_empty() {
                out.push(Finding::pass(
                    "streams columns",
                    "stream_id, stream_name, version present",
                ));
            } else {
                out.push(Finding::fail(
                    "streams columns",
                    format!("missing: {}", missing.join(", ")),
                ));
            }
        }
        out.push(if has_table("checkpoints") {
            Finding::pass(
                "checkpoints",
                "table present: start_from = checkpoints and lag metrics use it",
            )
        } else {
            Finding::pass(
                "checkpoints",
                "table absent: start_from = checkpoints falls back to lookback below the head",
            )
        });

        // Rights the fill needs.
        let rights: Vec<(&str, &str, &str)> = vec![
            ("messages", "SELECT", "table"),
            ("messages", "INSERT", "table"),
            ("streams", "SELECT", "table"),
            ("streams", "INSERT", "column"),
            ("streams", "UPDATE", "column"),
        ];
        let mut missing = Vec::new();
        for (table, right, level) in rights {
            if !has_table(table) {
                continue;
            }
            let sql = if level == "table" {
                "SELECT has_table_privilege(to_regclass($1), $2)"
            } else {
                "SELECT has_any_column_privilege(to_regclass($1), $2)"
            };
            let ok: bool = conn
                .query_one(sql, &[&format!("{schema}.{table}"), &right])
                .await
                .map_err(|e| self.error(&e, "rights"))?
                .get(0);
            if !ok {
                missing.push(format!("{right} on {schema}.{table}"));
            }
        }
        out.push(if missing.is_empty() {
            Finding::pass(
                "rights",
                "SELECT, INSERT on messages; SELECT, INSERT, UPDATE on streams",
            )
        } else {
            Finding::fail(
                "rights",
                format!(
                    "missing {} (see `gap-healer sql --engine postgres`)",
                    missing.join(", ")
                ),
            )
        });

        // The tombstone stream, if it exists, must be consistent: positions 0..n-1, version n-1.
        if has_table("messages") && has_table("streams") {
            let row = conn
                .query_opt(
                    &format!(
                        "SELECT s.version, COUNT(m.*), COALESCE(MAX(m.stream_position), -1), COALESCE(MIN(m.stream_position), 0)
                         FROM {schema}.streams s LEFT JOIN {schema}.messages m ON m.stream_id = s.stream_id
                         WHERE s.stream_name = $1 GROUP BY s.version"
                    ),
                    &[&self.tombstone_stream],
                )
                .await
                .map_err(|e| self.error(&e, "tombstone stream"))?;
            out.push(match row {
                None => Finding::pass("tombstone stream", format!("{} not created yet (made on the first fill)", self.tombstone_stream)),
                Some(r) => {
                    let (version, count, max, min): (i32, i64, i32, i32) = (r.get(0), r.get(1), r.get(2), r.get(3));
                    if i64::from(version) == count - 1 && i64::from(max) == count - 1 && min == 0 {
                        Finding::pass("tombstone stream", format!("{count} tombstones, version {version}"))
                    } else {
                        Finding::fail(
                            "tombstone stream",
                            format!("inconsistent: {count} rows, positions {min}..{max}, version {version}"),
                        )
                    }
                }
            });
        }
        Ok(out)
    }
}

/// Whether backend `$1` holds the session advisory lock with bigint key `$2`.
const HELD_BY: &str =
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = $1 \
     AND granted AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = $2)";

/// The advisory lock key for a leader lock name: FNV-1a, stable across
/// versions and processes, so every healer of a store computes the same one.
pub fn advisory_key(name: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

/// A dedicated session holding `pg_try_advisory_lock`.
pub struct PgLeaderSession {
    client: tokio_postgres::Client,
    /// The session's backend pid: what the fill fence checks.
    pid: i32,
    connection: tokio::task::JoinHandle<()>,
}

/// A lock session idle this long (`idle_session_timeout`), or a pooled
/// session idle this long inside a transaction
/// (`idle_in_transaction_session_timeout`), is ended by the server: the bound
/// on how long a paused or cut-off leader keeps the leader lock or the
/// tombstone stream's row (see [`PostgresEngine::open_leader_session`]).
pub const STALLED_SESSION_TIMEOUT: Duration = Duration::from_secs(5);

impl PgLeaderSession {
    /// The server process of the session (`pg_backend_pid()`), for logs and tests.
    pub fn backend_pid(&self) -> i32 {
        self.pid
    }
}

impl Drop for PgLeaderSession {
    fn drop(&mut self) {
        // Closing the session releases the lock on the server.
        self.connection.abort();
    }
}

impl PostgresEngine {
    /// A session of its own for the leader lock, outside the pool, with TCP
    /// keepalive so a dead peer is noticed within about 20 s without traffic.
    async fn open_leader_session(&self) -> DbResult<PgLeaderSession> {
        let mut config = self.config.clone();
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(10));
        let (client, connection) = config
            .connect(self.tls.clone())
            .await
            .map_err(|e| self.error(&e, "leader session"))?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        let session = PgLeaderSession {
            client,
            pid: 0,
            connection,
        };
        // The server, not only this process, must end the session when this
        // process stops answering: paused (a VM pause, CPU throttled to
        // nothing) or cut off with its socket still open, it would otherwise
        // keep the lock for as long as the server's TCP keepalive takes
        // (two hours by default) and no follower could lead. The leader
        // checks, and a follower tries, every second, so a session idle for
        // STALLED_SESSION_TIMEOUT belongs to a process that stopped; the server
        // ends it and frees the lock. idle_session_timeout is PostgreSQL
        // 14+; on 13 the server-side keepalive below is the only bound (it
        // sees a cut network, not a paused process).
        session
            .client
            .batch_execute(&format!(
                "SET tcp_keepalives_idle = {0}; SET tcp_keepalives_interval = 1; SET tcp_keepalives_count = {0}",
                STALLED_SESSION_TIMEOUT.as_secs()
            ))
            .await
            .map_err(|e| self.error(&e, "leader session"))?;
        if let Err(e) = session
            .client
            .batch_execute(&format!(
                "SET idle_session_timeout = '{}ms'",
                STALLED_SESSION_TIMEOUT.as_millis()
            ))
            .await
        {
            if e.code() != Some(&SqlState::UNDEFINED_OBJECT) {
                return Err(self.error(&e, "leader session"));
            }
        }
        Ok(session)
    }
}

impl super::LeaderLock for PostgresEngine {
    type Session = PgLeaderSession;

    async fn open_session(&self, _key: &str) -> DbResult<PgLeaderSession> {
        self.open_leader_session().await
    }

    fn reusable(&self, session: &PgLeaderSession) -> bool {
        !session.client.is_closed()
    }

    /// `pg_try_advisory_lock` on `session`; when taken, this session's pid
    /// becomes the fill fence.
    async fn try_lock(
        &self,
        mut session: PgLeaderSession,
        key: &str,
    ) -> DbResult<(bool, PgLeaderSession)> {
        let row = session
            .client
            .query_one(
                "SELECT pg_try_advisory_lock($1), pg_backend_pid()",
                &[&advisory_key(key)],
            )
            .await
            .map_err(|e| self.error(&e, "leader lock"))?;
        session.pid = row.get(1);
        let taken: bool = row.get(0);
        if taken {
            if let Ok(mut fence) = self.fence.lock() {
                *fence = Some((session.pid, advisory_key(key)));
            }
        }
        Ok((taken, session))
    }

    async fn still_held(&self, session: &mut PgLeaderSession, key: &str) -> DbResult<bool> {
        // The same question the fill fence asks, from the session itself.
        let held: bool = session
            .client
            .query_one(&self.sql.fence, &[&session.pid, &advisory_key(key)])
            .await
            .map_err(|e| self.error(&e, "leader heartbeat"))?
            .get(0);
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advisory_key_is_stable() {
        assert_eq!(
            advisory_key("gap-healer:eventuous"),
            advisory_key("gap-healer:eventuous")
        );
        assert_ne!(
            advisory_key("gap-healer:eventuous"),
            advisory_key("gap-healer:other")
        );
        // Pinned: healers of different versions must agree on the key.
        assert_eq!(advisory_key(""), 0xcbf2_9ce4_8422_2325_u64 as i64);
    }

    #[test]
    fn classification() {
        for (code, kind) in [
            (SqlState::T_R_DEADLOCK_DETECTED, DbErrorKind::Transient),
            (SqlState::T_R_SERIALIZATION_FAILURE, DbErrorKind::Transient),
            (SqlState::ADMIN_SHUTDOWN, DbErrorKind::Transient),
            (SqlState::CANNOT_CONNECT_NOW, DbErrorKind::Transient),
            (SqlState::QUERY_CANCELED, DbErrorKind::Transient),
            (SqlState::DISK_FULL, DbErrorKind::Transient),
            (SqlState::TOO_MANY_CONNECTIONS, DbErrorKind::Transient),
            (SqlState::READ_ONLY_SQL_TRANSACTION, DbErrorKind::Transient),
            (SqlState::CONNECTION_FAILURE, DbErrorKind::Transient),
            (SqlState::LOCK_NOT_AVAILABLE, DbErrorKind::Transient),
            (SqlState::INSUFFICIENT_PRIVILEGE, DbErrorKind::Permanent),
            (SqlState::UNDEFINED_TABLE, DbErrorKind::Permanent),
            (SqlState::UNDEFINED_COLUMN, DbErrorKind::Permanent),
            (SqlState::UNIQUE_VIOLATION, DbErrorKind::Permanent),
            (SqlState::SYNTAX_ERROR, DbErrorKind::Permanent),
        ] {
            assert_eq!(classify_code(&code), kind, "{}", code.code());
        }
    }

    #[test]
    fn sql_uses_the_schema_and_no_placeholder_survives() {
        let q = Queries::new("store_1");
        for sql in [
            &q.scan,
            &q.probe,
            &q.fill,
            &q.head,
            &q.floor,
            &q.lock_stream,
            &q.create_stream,
            &q.bump_stream,
        ] {
            assert!(!sql.contains("__schema__"), "{sql}");
            assert!(sql.contains("store_1."), "{sql}");
        }
        assert!(setup_sql("store_1")
            .contains("GRANT SELECT, INSERT ON store_1.messages TO gap_healer;"));
    }

    #[test]
    fn bad_connection_string_is_permanent_and_secret_free() {
        let settings = StoreSettings {
            connection_string: ConnectionString::new("host=db port=x password=topsecret"),
            schema: "eventuous".into(),
            tombstone_stream: "__tombstones__".into(),
            tombstone_type: "$tombstone".into(),
            connect_timeout: Duration::from_secs(1),
        };
        let err = PostgresEngine::new(&settings)
            .err()
            .expect("port=x must be refused");
        assert_eq!(err.kind, DbErrorKind::Permanent);
        assert!(!err.message.contains("topsecret"), "{}", err.message);
    }
}
