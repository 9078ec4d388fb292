//! The PostgreSQL engine, for the Eventuous PostgreSQL schema
//! (`<schema>.messages`, `streams`, `checkpoints`) and for the tables the
//! table profiles describe (`ledger-core`, `sqlstreamstore`, `custom`: see
//! [`crate::engine::profile`]).
//!
//! PostgreSQL shows no uncommitted rows, so an open append's position looks
//! exactly like a hole. That is fine: the fill's insert must check the primary
//! key, waits on that append's key lock (bounded by `SET LOCAL lock_timeout`)
//! and then fails with 55P03 (still open), fails with 23505 (it committed), or
//! succeeds (it rolled back).
//!
//! What lives where (the same files as every engine):
//! - `conn`: the parsed connection string, the pool's manager, the leader's
//!   dedicated session;
//! - `errors`: SQLSTATE classification, messages, typed column reads;
//! - `fill`: the fill transaction and what its errors mean;
//! - `leader`: the advisory leader lock and its fence token;
//! - `preflight`: the facts `check` gathers and the pure verdicts on them;
//! - `sql`: the statements, from `sql/postgres/*.sql`;
//! - `table`: the table profiles' fill and `check`;
//! - `tls`: TLS from libpq's options;
//! - `npgsql`: Npgsql connection strings, turned into libpq's form.
//!
//! Architecture invariant: this module writes only inside
//! [`Engine::fill_ranges`] (tombstone rows and the tombstone stream's row)
//! and splices nothing into SQL but the validated schema.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio_postgres::types::Type;

mod checkpoints;
mod conn;
mod errors;
mod fill;
mod heads;
mod leader;
pub mod npgsql;
mod preflight;
mod sql;
mod table;
pub mod tls;
mod transactions;
mod watermark;

pub use self::conn::STALLED_SESSION_TIMEOUT;
pub use self::errors::classify_code;
pub use self::leader::{advisory_key, PgLeaderSession};
pub(crate) use self::preflight::quote_role;
pub use self::sql::{render as render_sql, setup_sql};
pub use self::watermark::watermark_sql;

use self::checkpoints::Checkpoints;
pub(crate) use self::conn::Manager;
use self::conn::Target;
use self::errors::{db_error, get};
use self::heads::Heads;
use self::transactions::Transactions;
use super::pool::{self, Pool, MAX_POOLED_SESSIONS};
use super::profile::{TableShape, Tombstone};
use super::shared_lock::SharedLock;
use super::{
    Checkpoint, DbError, DbResult, Engine, EngineKind, Fence, FillLimits, FillOutcome, Finding,
    HeadReading, OpenTransactions, Probe, ScanPage, SharedHeads, StoreSettings, WatermarkTable,
};
use super::{Ident, QualifiedName};
use crate::gaps::PosRange;

/// Ranges per probe query.
const PROBE_BATCH: usize = 1_000;

/// What the PostgreSQL stores of one database (one connection string and
/// connect timeout) share: the pool, the head readings, the readings of
/// open transactions, the leader lock session. Held weakly: each goes with
/// its last store.
#[derive(Default)]
pub struct Sharing {
    pools: pool::Shared<Pool<Manager>>,
    heads: pool::Shared<Heads>,
    checkpoints: pool::Shared<Checkpoints>,
    transactions: pool::Shared<Transactions>,
    locks: pool::Shared<SharedLock<PostgresEngine>>,
}

impl Sharing {
    /// Distinct pools alive now.
    pub fn pools(&self) -> usize {
        self.pools.len()
    }

    /// The lock session the elections of `store`'s database share, on
    /// `engine` (the first of its stores to ask).
    pub fn leader_lock(
        &self,
        engine: &Arc<PostgresEngine>,
        store: &StoreSettings,
    ) -> Arc<SharedLock<PostgresEngine>> {
        self.locks.get(
            &store.sharing_key(),
            || SharedLock::new(engine.clone()),
            |_| {},
        )
    }
}

pub struct PostgresEngine {
    pool: Arc<Pool<Manager>>,
    /// The parsed connection string, for the leader lock's dedicated session.
    target: Target,
    sql: sql::Queries,
    /// Lower case, as the catalog names it.
    schema: Ident,
    tombstone_stream: String,
    tombstone_type: String,
    /// The published watermark's table, when configured.
    watermark_table: Option<QualifiedName>,
    /// Which table, and what a tombstone row holds.
    profile: TableShape,
    /// Names of the unique keys on exactly the position: a 23505 on one
    /// means "committed"; on any other constraint, something else writes
    /// the tombstone stream.
    position_keys: OnceLock<Vec<String>>,
    /// Its place in the head readings shared by the stores of its pool.
    heads: heads::Membership,
    /// Its place in the readings of open transactions shared likewise.
    transactions: transactions::Membership,
    /// Its place in the checkpoint readings shared likewise.
    checkpoint_share: checkpoints::Membership,
}

impl PostgresEngine {
    /// The store's own checkpoints, read alone: `None` when it has no
    /// checkpoints table.
    async fn own_checkpoints(&self) -> DbResult<Option<Vec<Checkpoint>>> {
        let conn = self.pool.checkout().await?;
        let table = format!("{}.checkpoints", self.schema.as_str());
        let found = conn
            .query_one(sql::TABLE_EXISTS, &[&table])
            .await
            .map_err(|e| self.error(&e, "checkpoints"))?;
        if get::<Option<String>>(&found, "found")?.is_none() {
            return Ok(None);
        }
        let rows = conn
            .query(&self.sql.checkpoints, &[])
            .await
            .map_err(|e| self.error(&e, "checkpoints"))?;
        rows.iter()
            .map(|r| {
                Ok(Checkpoint {
                    id: get(r, "id")?,
                    position: get(r, "position")?,
                })
            })
            .collect::<DbResult<Vec<_>>>()
            .map(Some)
    }

    /// Checkpoint readings the stores of its pool have sent together
    /// ([`Engine::checkpoints`]), for tests and diagnostics.
    pub fn checkpoint_readings(&self) -> u64 {
        self.checkpoint_share.readings()
    }

    /// The highest committed position (`head.sql`).
    async fn highest(&self) -> DbResult<Option<i64>> {
        let conn = self.pool.checkout().await?;
        let row = conn
            .query_one(&self.sql.head, &[])
            .await
            .map_err(|e| self.error(&e, "head"))?;
        get(&row, "head")
    }

    /// Parses the connection string and prepares a pool. Connects lazily, so a
    /// daemon started while the database is down comes up and retries.
    pub fn new(settings: &StoreSettings) -> DbResult<Self> {
        Self::sharing(settings, &Sharing::default())
    }

    /// [`PostgresEngine::new`], sharing its pool and head readings with the
    /// other stores of `shared` that connect with the same connection string.
    pub fn sharing(settings: &StoreSettings, shared: &Sharing) -> DbResult<Self> {
        let target = Target::new(&settings.connection_string, settings.connect_timeout)?;
        let key = settings.sharing_key();
        let pool = Pool::shared(&shared.pools, &key, || {
            Pool::new(
                format!("PostgreSQL at {}", target.servers()),
                Manager(target.clone()),
                MAX_POOLED_SESSIONS,
                settings.connect_timeout,
            )
        });
        let schema = settings.schema.to_lowercase();
        let heads = shared
            .heads
            .get(
                &key,
                || Heads::new(pool.clone(), settings.connection_string.clone()),
                |_| {},
            )
            .join(sql::statement(sql::SHARED_HEAD, &schema, &settings.profile));
        let checkpoint_share = shared
            .checkpoints
            .get(
                &key,
                || Checkpoints::new(pool.clone(), settings.connection_string.clone()),
                |_| {},
            )
            .join(format!("{}.checkpoints", schema.as_str()));
        let transactions = shared
            .transactions
            .get(
                &key,
                || Transactions::new(pool.clone(), settings.connection_string.clone()),
                |_| {},
            )
            .join(
                settings.profile.qualified(&schema).name(),
                settings.profile.position.as_str().to_string(),
            );
        Ok(PostgresEngine {
            pool,
            target,
            sql: sql::Queries::new(&schema, &settings.profile),
            schema,
            tombstone_stream: settings.tombstone_stream.clone(),
            tombstone_type: settings.tombstone_type.clone(),
            watermark_table: settings.watermark_table.clone(),
            profile: settings.profile.clone(),
            position_keys: OnceLock::new(),
            heads,
            transactions,
            checkpoint_share,
        })
    }

    /// Head readings the stores of its pool have sent together
    /// ([`SharedHeads::shared_head`]), for tests and diagnostics.
    pub fn shared_readings(&self) -> u64 {
        self.heads.readings()
    }

    /// Readings of open transactions the stores of its pool have sent
    /// together ([`Engine::open_transactions`]), for tests and diagnostics.
    pub fn transaction_readings(&self) -> u64 {
        self.transactions.readings()
    }

    /// Classifies a driver error and scrubs its text.
    fn error(&self, e: &tokio_postgres::Error, during: &str) -> DbError {
        db_error(&self.target.cs, e, during)
    }

    /// The names of the server's databases `LIKE` `pattern` that accept
    /// connections.
    pub async fn list_databases(&self, pattern: &str) -> DbResult<Vec<String>> {
        let conn = self.pool.checkout().await?;
        let rows = conn
            .query(sql::DATABASES, &[&pattern])
            .await
            .map_err(|e| self.error(&e, "list databases"))?;
        rows.iter().map(|r| get(r, "name")).collect()
    }

    /// The healed table's qualified name, as the catalog functions take it.
    fn table_name(&self) -> String {
        self.profile.qualified(&self.schema).name()
    }

    fn position_column(&self) -> String {
        self.profile.position.as_str().to_string()
    }
}

impl Engine for PostgresEngine {
    type Heads = Self;
    type Watermark = Self;

    fn kind(&self) -> EngineKind {
        EngineKind::Postgres
    }

    fn schema(&self) -> &str {
        self.schema.as_str()
    }

    fn fill_limits(&self) -> FillLimits {
        FillLimits {
            rows: fill::MAX_FILL_ROWS,
            ranges: fill::MAX_FILL_RANGES,
            // Nothing escalates: a range costs only its rows.
            range_cost: 0,
        }
    }

    async fn identity_floor(&self) -> DbResult<i64> {
        let conn = self.pool.checkout().await?;
        let row = conn
            .query_opt(
                sql::IDENTITY,
                &[&self.table_name(), &self.position_column()],
            )
            .await
            .map_err(|e| self.error(&e, "identity seed"))?;
        match row {
            Some(row) => get(&row, "seed"),
            None => Ok(1),
        }
    }

    async fn head(&self) -> DbResult<Option<i64>> {
        self.highest().await
    }

    async fn first_position(&self) -> DbResult<Option<i64>> {
        // PostgreSQL shows no uncommitted row: a first committed row above
        // the seed may sit above an open first append, so it proves no
        // reseed. The sequence's START (the seed) is where the scan begins.
        Ok(None)
    }

    async fn checkpoints(&self) -> DbResult<Vec<Checkpoint>> {
        if !self.profile.has_checkpoints() {
            // The table profiles' readers keep their positions elsewhere.
            return Ok(Vec::new());
        }
        if let Some(rows) = self.checkpoint_share.checkpoints().await {
            return Ok(rows);
        }
        let rows = self.own_checkpoints().await;
        // Read with the other stores of the pool from now on only when the
        // table is there and was read.
        self.checkpoint_share
            .share(rows.as_ref().is_ok_and(Option::is_some));
        Ok(rows?.unwrap_or_default())
    }

    async fn scan(&self, after: i64, limit: u32) -> DbResult<ScanPage> {
        // Out of the shared readings while its own scan runs: a scan held by
        // a lock on this table keeps only this store waiting.
        self.heads.scanned(false);
        let conn = self.pool.checkout().await?;
        // Typed parameters: one round trip (Parse, Bind, Execute together)
        // instead of a prepare before every poll.
        let limit = i64::from(limit);
        let rows = conn
            .query_typed(
                &self.sql.scan,
                &[(&after, Type::INT8), (&limit, Type::INT8)],
            )
            .await
            .map_err(|e| self.error(&e, "scan"));
        self.heads.scanned(rows.is_ok());
        let rows = rows?;
        let mut page = ScanPage {
            holes: Vec::new(),
            high: after,
            rows: 0,
        };
        for row in rows {
            page.high = get(&row, "hi")?;
            page.rows = get::<i64>(&row, "n")?.max(0) as u64;
            let start: Option<i64> = get(&row, "gap_start")?;
            let end: Option<i64> = get(&row, "gap_end")?;
            if let Some(hole) = start.zip(end).and_then(|(s, e)| PosRange::new(s, e)) {
                page.holes.push(hole);
            }
        }
        Ok(page)
    }

    fn shared_heads(&self) -> Option<&Self> {
        Some(self)
    }

    async fn open_transactions(
        &self,
        not_before: tokio::time::Instant,
    ) -> DbResult<OpenTransactions> {
        self.transactions.reading(not_before).await
    }

    fn above_identity(&self, position: i64, handed_out: i64) -> DbError {
        DbError::permanent(format!(
            "refusing to fill up to {position}: the identity has handed out positions only up to {handed_out}; \
             rows were written above its sequence (OVERRIDING SYSTEM VALUE without setval), so these \
             numbers will still be handed out; run SELECT setval(pg_get_serial_sequence('{table}', '{column}'), \
             (SELECT MAX({column}) FROM {table}))",
            table = self.table_name(),
            column = self.position_column(),
        ))
    }

    async fn probe(&self, ranges: &[PosRange]) -> DbResult<Probe> {
        if ranges.is_empty() {
            return Ok(Probe::default());
        }
        let mut committed = Vec::new();
        let conn = self.pool.checkout().await?;
        for batch in ranges.chunks(PROBE_BATCH) {
            let starts: Vec<i64> = batch.iter().map(|r| r.start()).collect();
            let ends: Vec<i64> = batch.iter().map(|r| r.end()).collect();
            let rows = conn
                .query_typed(
                    &self.sql.probe,
                    &[(&starts, Type::INT8_ARRAY), (&ends, Type::INT8_ARRAY)],
                )
                .await
                .map_err(|e| self.error(&e, "probe"))?;
            for row in &rows {
                committed.push(get(row, "position")?);
            }
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
        fence: &Fence,
    ) -> DbResult<FillOutcome> {
        self.fill_batch(ranges, lock_timeout, fence).await
    }

    async fn preflight(&self) -> DbResult<Vec<Finding>> {
        let mut findings = match &self.profile.tombstone {
            Tombstone::Columns(_) | Tombstone::StreamRow { .. } => {
                self.table_findings(&self.profile).await?
            }
            Tombstone::EventuousStream => preflight::findings(
                &self.preflight_facts().await?,
                &preflight::Expected {
                    schema: &self.schema,
                    tombstone_stream: &self.tombstone_stream,
                    tls: &self.target.mode,
                },
            ),
        };
        preflight::plaintext_warning(
            &mut findings,
            &self.target.mode,
            self.target.remote_host().as_deref(),
        );
        // The sequence and the keys are read only where the table and its
        // position are.
        if findings.iter().all(|f| f.ok || !f.check.is_shape()) {
            findings.extend(self.position_key_finding().await);
            findings.extend(self.sequence_finding().await);
            findings.extend(self.proof_finding().await);
        }
        findings.extend(self.watermark_finding().await);
        Ok(findings)
    }

    fn watermark_table(&self) -> Option<&Self> {
        self.watermark_table.is_some().then_some(self)
    }
}

/// Every store of a pool reads its head in one statement (`heads.rs`).
impl SharedHeads for PostgresEngine {
    async fn shared_head(&self, not_before: tokio::time::Instant) -> HeadReading {
        self.heads.head(not_before).await
    }
}

/// One row per store in `watermark_table` (`watermark.rs`).
impl WatermarkTable for PostgresEngine {
    async fn read_watermark(&self, store: &str) -> DbResult<Option<i64>> {
        self.read_watermark_row(store).await
    }

    async fn publish_watermark(&self, store: &str, position: i64) -> DbResult<()> {
        self.publish_watermark_row(store, position).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DbErrorKind;
    use crate::secret::ConnectionString;

    #[test]
    fn bad_connection_string_is_permanent_and_secret_free() {
        let settings = StoreSettings {
            connection_string: ConnectionString::new("host=db port=x password=topsecret"),
            schema: Ident::parse("eventuous").unwrap(),
            tombstone_stream: "__tombstones__".into(),
            tombstone_type: "$tombstone".into(),
            connect_timeout: Duration::from_secs(1),
            watermark_table: None,
            profile: TableShape::eventuous(),
        };
        let err = PostgresEngine::new(&settings)
            .err()
            .expect("port=x must be refused");
        assert_eq!(err.kind, DbErrorKind::Permanent);
        assert!(!err.message.contains("topsecret"), "{}", err.message);
        assert!(
            err.message
                .starts_with("not a PostgreSQL connection string: the value of \"port\""),
            "{}",
            err.message
        );
    }

    fn settings_at(port: u16) -> StoreSettings {
        StoreSettings {
            connection_string: ConnectionString::new(format!(
                "host=127.0.0.1 port={port} user=app password=Zq7Secret dbname=es"
            )),
            schema: Ident::parse("eventuous").unwrap(),
            tombstone_stream: "__tombstones__".into(),
            tombstone_type: "$tombstone".into(),
            connect_timeout: Duration::from_secs(2),
            watermark_table: None,
            profile: TableShape::eventuous(),
        }
    }

    /// Issue 20: connect errors named no host or port, and read
    /// "PostgreSQL connection failed: connect: error connecting to server".
    #[tokio::test]
    async fn a_refused_connection_names_the_server_once() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let engine = PostgresEngine::new(&settings_at(port)).unwrap();
        let err = engine.head().await.expect_err("nothing listens there");
        assert!(err.is_transient(), "{err:?}");
        assert!(
            err.message.starts_with(&format!(
                "cannot connect to PostgreSQL at 127.0.0.1:{port}: "
            )),
            "{}",
            err.message
        );
        assert!(
            !err.message.contains("connection failed"),
            "{}",
            err.message
        );
        assert!(!err.message.contains("Zq7Secret"), "{}", err.message);
    }

    /// Issue 20: a server that is not PostgreSQL read "error communicating
    /// with the server: bytes remaining on stream".
    #[tokio::test]
    async fn a_server_that_is_not_postgresql_is_named_as_such() {
        let (port, http) = crate::engine::tests_support::http_listener().await;
        let engine = PostgresEngine::new(&settings_at(port)).unwrap();
        let err = engine
            .head()
            .await
            .expect_err("an HTTP server is no database");
        assert!(
            err.message.starts_with(&format!(
                "the server at 127.0.0.1:{port} does not speak the PostgreSQL protocol"
            )),
            "{}",
            err.message
        );
        assert!(
            err.message.contains("check the host and port"),
            "{}",
            err.message
        );
        assert!(!err.message.contains("Zq7Secret"), "{}", err.message);
        http.abort();
    }

    /// A server that accepts the connection and says nothing leaves no
    /// error of its own: the timeout names where it waited.
    #[tokio::test]
    async fn a_server_that_never_answers_is_named_in_the_timeout() {
        let (port, silent) = crate::engine::tests_support::silent_listener().await;
        let mut settings = settings_at(port);
        settings.connect_timeout = Duration::from_millis(500);
        let engine = PostgresEngine::new(&settings).unwrap();
        let err = engine.head().await.expect_err("nothing answers");
        assert_eq!(
            err.message,
            format!("no connection to PostgreSQL at 127.0.0.1:{port} within 500ms")
        );
        // The leader session is opened outside the pool: bounded the same
        // (before, tokio-postgres bounded only the TCP connect, and the
        // election waited for ever).
        use crate::engine::LeaderLock;
        let started = std::time::Instant::now();
        let err = match tokio::time::timeout(Duration::from_secs(5), engine.open_session("k")).await
        {
            Ok(Err(e)) => e,
            Ok(Ok(_)) => panic!("a leader session from a server that says nothing"),
            Err(_) => panic!("opening the leader session waited past 5 s"),
        };
        assert_eq!(
            err.message,
            format!("no leader session with PostgreSQL at 127.0.0.1:{port} within 500ms")
        );
        assert!(err.is_transient());
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        silent.abort();
    }
}
