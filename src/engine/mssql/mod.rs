//! SQL Server engine: the Eventuous SQL Server store (`<schema>.Messages`,
//! `Streams`, `Checkpoints`) on tiberius with a bb8 pool.
//!
//! # How it reads
//! Every read of Messages touches only the clustered key (GlobalPosition) and
//! uses `WITH (READCOMMITTEDLOCK, READPAST)`: read committed by locking, with
//! READ_COMMITTED_SNAPSHOT on or off, skipping the keys that open appends hold
//! instead of waiting for them. So a position of an append in flight looks
//! missing to the scan (it lands inside a hole, and stays tracked if the
//! append rolls back), and the probe sees it only through a second, `NOLOCK`
//! read, which is how it reports positions in flight.
//!
//! # What lives where (the same files as every engine)
//! - `conn`: the ADO.NET connection string, the pool's manager (a session
//!   goes back to the pool only when its work ended in a known state: no
//!   open transaction, IDENTITY_INSERT off), the leader's dedicated session;
//! - `errors`: error numbers into outcomes, transient or permanent errors;
//! - `fill`: the fill batch, direct or procedure mode, and what its result
//!   row means;
//! - `leader`: `sp_getapplock` leadership and its fence token;
//! - `preflight`: the facts `check` gathers and the pure verdicts on them;
//! - `sql`: the statements, from `sql/mssql/*.sql`.
//!
//! The procedure writes only the tombstone stream and type it was created
//! for (`gap-healer install` with this configuration): they are constants in
//! its body, not parameters, so a login with EXECUTE on it cannot make it
//! write into another stream.
//!
//! Architecture invariant: this module writes only inside
//! [`Engine::fill_ranges`] (tombstone rows and the tombstone stream's row)
//! and [`MssqlEngine::install`] (the fill procedure), and splices nothing
//! into SQL but the validated schema and, in the procedure only, the
//! tombstone stream and type as escaped literals.

mod checkpoints;
mod conn;
mod errors;
mod fill;
mod heads;
mod instance_lock;
mod leader;
mod preflight;
mod sql;
mod table;
mod transactions;
mod watermark;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::AtomicU8;
use std::time::Duration;

use bb8::PooledConnection;
use tiberius::{Row, ToSql};

pub use self::fill::{FillMode, MAX_FILL_RANGES, MAX_FILL_ROWS};
pub use self::instance_lock::MssqlStoreLock;
pub use self::leader::{MssqlLeaderSession, MAX_LEADER_KEY_UNITS};
pub(crate) use self::sql::quote_ident;
pub use self::watermark::watermark_sql;

use self::conn::Client;
pub(crate) use self::conn::Manager;
use self::errors::driver_error;
use self::preflight::ProcedureState;
use self::sql::{Sql, PROBE_CHUNK};
use crate::engine::pool::{self, Pool};
use crate::engine::profile;
use crate::engine::shared_lock::SharedLock;
use crate::engine::{
    Checkpoint, DbError, DbResult, Engine, EngineKind, Fence, FillLimits, FillOutcome, Finding,
    HeadReading, Ident, OpenTransactions, Probe, ScanPage, SharedHeads, StoreSettings,
    WatermarkTable,
};
use crate::gaps::PosRange;

/// Connections in the pool: one for the healer's loop, one for a concurrent
/// `/readyz` or leadership check, some slack.
pub const DEFAULT_MAX_CONNECTIONS: u32 = crate::engine::pool::MAX_POOLED_SESSIONS;

/// What a pooled session looks like, for tests and diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionState {
    /// `@@SPID`. Together with `login_time` it names one connection: the same
    /// pair on two checkouts means the connection was reused (a session id
    /// alone can be handed to a new connection once the old one is gone).
    pub session_id: i64,
    /// When the session logged in (ISO 8601, from sys.dm_exec_sessions).
    pub login_time: String,
    /// `@@TRANCOUNT`: must be 0.
    pub open_transactions: i32,
    /// `@@LOCK_TIMEOUT`: -1 (the connection default) unless a SET leaked.
    pub lock_timeout_ms: i32,
    /// No table of the session has IDENTITY_INSERT on.
    pub identity_insert_free: bool,
}

/// Which server the engine talks to, learnt from its first session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// `@@VERSION`, first line.
    pub version: String,
    /// `Some("Babelfish 4.2.0")` on Babelfish for PostgreSQL: TDS and T-SQL,
    /// but not SQL Server (no `EXECUTE AS OWNER`, no dirty reads).
    pub babelfish: Option<String>,
    /// `DB_NAME()` of the engine's sessions.
    pub database: String,
}

impl Server {
    /// The application lock name for a leader key. SQL Server scopes
    /// application locks to the database; Babelfish keeps every T-SQL
    /// database in one PostgreSQL database, so its locks are server-wide and
    /// the database's name goes into the lock's.
    pub fn leader_lock_name(&self, key: &str) -> String {
        match self.babelfish {
            Some(_) => format!("{}/{key}", self.database),
            None => key.to_string(),
        }
    }

    fn from_version(version: &str, babelfish: bool) -> Server {
        let first = version
            .lines()
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        let babelfish = babelfish.then(|| {
            version
                .rfind("(Babelfish ")
                .and_then(|at| {
                    let rest = &version[at + 1..];
                    rest.find(')').map(|end| rest[..end].to_string())
                })
                .unwrap_or_else(|| "Babelfish".to_string())
        });
        Server {
            version: first,
            babelfish,
            database: String::new(),
        }
    }
}

/// What the SQL Server stores of one database (one connection string,
/// connect timeout and pool size) share: the pool. Held weakly: it goes
/// with its last store. (Each store keeps a leader lock session of its own.)
#[derive(Default)]
pub struct Sharing {
    pools: pool::Shared<Pool<Manager>>,
    /// The head readings of each instance (server, login, options).
    heads: pool::Shared<heads::Heads>,
    /// The checkpoint readings of each instance, likewise.
    checkpoints: pool::Shared<checkpoints::Checkpoints>,
    /// The leader lock session of each instance, likewise.
    locks: pool::Shared<SharedLock<instance_lock::InstanceLock>>,
}

impl Sharing {
    /// Distinct pools alive now.
    pub fn pools(&self) -> usize {
        self.pools.len()
    }

    /// Distinct shared leader lock sessions alive now (one an instance).
    pub fn lock_sessions(&self) -> usize {
        self.locks.len()
    }

    /// The leader lock of `engine`'s store (`store`): its part of the lock
    /// session its instance's stores share, on `engine` (the first of them
    /// to ask); a session of its own when the connection string does not
    /// parse into an instance.
    pub fn leader_lock(
        &self,
        engine: &std::sync::Arc<MssqlEngine>,
        store: &StoreSettings,
    ) -> std::sync::Arc<MssqlStoreLock> {
        let shared = conn::instance(store.connection_string.expose()).map(|instance| {
            self.locks.get(
                &format!("{:?}\n{instance}", store.connect_timeout),
                || {
                    SharedLock::new(std::sync::Arc::new(instance_lock::InstanceLock::new(
                        engine.clone(),
                    )))
                },
                |_| {},
            )
        });
        std::sync::Arc::new(MssqlStoreLock::new(engine.clone(), shared))
    }
}

/// The SQL Server engine.
pub struct MssqlEngine {
    settings: StoreSettings,
    config: tiberius::Config,
    sql: Sql,
    max_connections: u32,
    pool: std::sync::Arc<Pool<Manager>>,
    /// The fill mode, once chosen (`fill::MODE_*`).
    mode: AtomicU8,
    /// The server, once asked.
    server: std::sync::OnceLock<Server>,
    /// Its place in its instance's shared head readings; `None` when its
    /// connection string names no database.
    heads: Option<heads::Membership>,
    /// Its place in its instance's shared checkpoint readings; `None` when
    /// its connection string names no database or its profile keeps no
    /// checkpoints.
    checkpoint_share: Option<checkpoints::Membership>,
    /// The direct fill's text for each pair of waits, rendered once.
    rendered_fills: fill::RenderedFills,
}

impl fmt::Debug for MssqlEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MssqlEngine")
            .field("connection_string", &self.settings.connection_string)
            .field("schema", &self.settings.schema)
            .field("max_connections", &self.max_connections)
            .finish_non_exhaustive()
    }
}

impl MssqlEngine {
    /// Parses the connection string and prepares a pool that connects lazily:
    /// nothing is sent to the server until the first query, so the daemon
    /// starts (and reports unready) while SQL Server is down.
    pub fn new(settings: &StoreSettings) -> DbResult<MssqlEngine> {
        Self::with_max_connections(settings, DEFAULT_MAX_CONNECTIONS)
    }

    /// [`MssqlEngine::new`] with a pool of at most `max_connections` (at least 1).
    pub fn with_max_connections(
        settings: &StoreSettings,
        max_connections: u32,
    ) -> DbResult<MssqlEngine> {
        Self::build(settings, max_connections, &Sharing::default())
    }

    /// [`MssqlEngine::new`], sharing its pool with the other stores of
    /// `shared` that connect with the same connection string.
    pub fn sharing(settings: &StoreSettings, shared: &Sharing) -> DbResult<MssqlEngine> {
        Self::build(settings, DEFAULT_MAX_CONNECTIONS, shared)
    }

    fn build(
        settings: &StoreSettings,
        max_connections: u32,
        shared: &Sharing,
    ) -> DbResult<MssqlEngine> {
        let secret = &settings.connection_string;
        let config = conn::config_from_ado(secret.expose()).map_err(|e| {
            DbError::permanent(
                secret.scrub(&format!("invalid SQL Server connection string: {}", e.0)),
            )
        })?;
        let sql = table::for_table(
            Sql::new(
                &settings.schema,
                &settings.tombstone_stream,
                &settings.tombstone_type,
            )?,
            &settings.schema,
            &settings.profile,
        );
        let key = format!("{max_connections}\n{}", settings.sharing_key());
        let pool = Pool::shared(&shared.pools, &key, || {
            Pool::new(
                format!("SQL Server at {}", conn::shown_addr(&config.get_addr())),
                Manager::new(config.clone(), settings.connection_string.clone()),
                max_connections.max(1),
                settings.connect_timeout,
            )
        });
        let instance = conn::instance_and_database(secret.expose())
            .map(|(instance, db)| (format!("{:?}\n{instance}", settings.connect_timeout), db));
        let heads = instance.as_ref().map(|(key, db)| {
            let instance = shared.heads.get(key, heads::Heads::default, |_| {});
            heads::join(&instance, db, &settings.schema, &settings.profile)
        });
        let checkpoint_share =
            instance
                .filter(|_| settings.profile.has_checkpoints())
                .map(|(key, db)| {
                    let instance =
                        shared
                            .checkpoints
                            .get(&key, checkpoints::Checkpoints::default, |_| {});
                    checkpoints::join(&instance, &db, &settings.schema)
                });
        Ok(MssqlEngine {
            settings: settings.clone(),
            config,
            sql,
            max_connections: max_connections.max(1),
            pool,
            mode: AtomicU8::new(fill::MODE_UNKNOWN),
            server: std::sync::OnceLock::new(),
            heads,
            checkpoint_share,
            rendered_fills: fill::RenderedFills::default(),
        })
    }

    /// The names of the server's user databases `LIKE` `pattern`.
    pub async fn list_databases(&self, pattern: &str) -> DbResult<Vec<String>> {
        let rows = self.read_first(sql::DATABASES, &[&pattern]).await?;
        rows.iter()
            .map(|row| Ok(get::<&str>(row, "name")?.unwrap_or_default().to_string()))
            .collect()
    }

    /// Which server this is (asked once: `sql/mssql/server.sql`).
    pub async fn server(&self) -> DbResult<Server> {
        if let Some(server) = self.server.get() {
            return Ok(server.clone());
        }
        let rows = self.read_first(sql::SERVER, &[]).await?;
        let row = rows
            .first()
            .ok_or_else(|| DbError::permanent("the server query returned no row"))?;
        let server = Server {
            database: get::<&str>(row, "database_name")?
                .unwrap_or_default()
                .to_string(),
            ..Server::from_version(
                get::<&str>(row, "server_version")?.unwrap_or_default(),
                get::<bool>(row, "babelfish")?.unwrap_or(false),
            )
        };
        if let Some(b) = &server.babelfish {
            tracing::info!(server = %b, "the server is Babelfish for PostgreSQL, not SQL Server: fills run in direct mode");
        }
        Ok(self.server.get_or_init(|| server).clone())
    }

    /// A session, marked unclean: it goes back to the pool only if the caller
    /// marks it clean once its work ended in a known state.
    async fn checkout(&self) -> DbResult<PooledConnection<'_, Manager>> {
        let mut session = self.pool.checkout().await?;
        session.clean = false;
        Ok(session)
    }

    fn driver_error(&self, e: &tiberius::error::Error) -> DbError {
        driver_error(e, &self.settings.connection_string)
    }

    /// Runs a read and returns its result sets. The session goes back to the
    /// pool when the response was read to its end (success or a server error:
    /// tiberius reads the whole response before it reports one).
    async fn read(&self, sql: &str, params: &[&dyn ToSql]) -> DbResult<Vec<Vec<Row>>> {
        let mut session = self.checkout().await?;
        let result = run(&mut session.client, sql, params).await;
        if matches!(result, Ok(_) | Err(tiberius::error::Error::Server(_))) {
            session.clean = true;
        }
        result.map_err(|e| self.driver_error(&e))
    }

    async fn read_first(&self, sql: &str, params: &[&dyn ToSql]) -> DbResult<Vec<Row>> {
        Ok(self
            .read(sql, params)
            .await?
            .into_iter()
            .next()
            .unwrap_or_default())
    }

    /// The store's own checkpoints, read alone (`checkpoints.sql`): `None`
    /// when it has no Checkpoints table (the statement then returns no
    /// result set at all; an empty table returns an empty one).
    async fn own_checkpoints(&self) -> DbResult<Option<Vec<Checkpoint>>> {
        let sets = self.read(&self.sql.checkpoints, &[]).await?;
        let Some(rows) = sets.into_iter().next() else {
            return Ok(None);
        };
        let mut found = rows
            .iter()
            .map(|row| {
                Ok(Checkpoint {
                    id: get::<&str>(row, "id")?.unwrap_or_default().to_string(),
                    position: get::<i64>(row, "position")?,
                })
            })
            .collect::<DbResult<Vec<_>>>()?;
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Some(found))
    }

    /// The state of a pooled session (transaction count, lock timeout,
    /// IDENTITY_INSERT), read on a connection checked out like any other.
    pub async fn session_state(&self) -> DbResult<SessionState> {
        let rows = self.read_first(&self.sql.session_state, &[]).await?;
        let row = rows
            .first()
            .ok_or_else(|| DbError::permanent("session state query returned no row"))?;
        Ok(SessionState {
            session_id: get_integer(row, "session_id")?.unwrap_or(0),
            login_time: get::<&str>(row, "login_time")?
                .unwrap_or_default()
                .to_string(),
            open_transactions: get::<i32>(row, "open_transactions")?.unwrap_or(0),
            lock_timeout_ms: get::<i32>(row, "lock_timeout_ms")?.unwrap_or(0),
            identity_insert_free: get::<bool>(row, "identity_insert_free")?.unwrap_or(false),
        })
    }

    /// One column of `head.sql`: the highest (`position`) or lowest
    /// (`first_position`) committed position.
    async fn end_of_messages(&self, column: &str) -> DbResult<Option<i64>> {
        let rows = self.read_first(&self.sql.head, &[]).await?;
        match rows.first() {
            Some(row) => get::<i64>(row, column),
            None => Ok(None),
        }
    }

    /// The identity's current value (IDENT_CURRENT), which no fill may move.
    pub async fn identity_current(&self) -> DbResult<Option<i64>> {
        let rows = self.read_first(&self.sql.identity, &[]).await?;
        match rows.first() {
            Some(row) => get::<i64>(row, "current_value"),
            None => Ok(None),
        }
    }
}

/// Sends a parameterized batch (tiberius runs it through sp_executesql, so
/// SET options in it revert when it returns) and reads every result set.
async fn run(
    client: &mut Client,
    sql: &str,
    params: &[&dyn ToSql],
) -> tiberius::Result<Vec<Vec<Row>>> {
    client.query(sql, params).await?.into_results().await
}

/// An integer column of any width (SQL Server's `@@SPID` is smallint,
/// Babelfish's int, counts are bigint).
fn get_integer(row: &Row, column: &str) -> DbResult<Option<i64>> {
    if let Ok(v) = row.try_get::<i64, _>(column) {
        return Ok(v);
    }
    if let Ok(v) = row.try_get::<i32, _>(column) {
        return Ok(v.map(i64::from));
    }
    if let Ok(v) = row.try_get::<i16, _>(column) {
        return Ok(v.map(i64::from));
    }
    get::<u8>(row, column).map(|v| v.map(i64::from))
}

fn get<'a, T: tiberius::FromSql<'a>>(row: &'a Row, column: &str) -> DbResult<Option<T>> {
    row.try_get::<T, _>(column)
        .map_err(|e| DbError::permanent(format!("unexpected value in column {column}: {e}")))
}

/// (previous_position, position, rows_read, is_last) rows of `scan.sql`.
type ScanRow = (i64, i64, i64, bool);

/// The page a scan's rows describe.
fn page_from_rows(after: i64, rows: &[ScanRow]) -> ScanPage {
    let mut page = ScanPage {
        holes: Vec::new(),
        high: after,
        rows: 0,
    };
    for &(previous, position, rows_read, is_last) in rows {
        if let Some(hole) = PosRange::new(previous + 1, position - 1) {
            page.holes.push(hole);
        }
        if is_last {
            page.high = position;
            page.rows = u64::try_from(rows_read).unwrap_or(0);
        }
    }
    page
}

/// `in_flight` = dirty minus committed, both sorted and deduplicated.
fn probe_from(committed: BTreeSet<i64>, dirty: BTreeSet<i64>) -> Probe {
    Probe {
        in_flight: dirty.difference(&committed).copied().collect(),
        committed: committed.into_iter().collect(),
    }
}

/// Parameters for one probe query: the chunk's bounds, padded with its last
/// range to `padded` ranges.
fn probe_params(chunk: &[PosRange], padded: usize) -> Vec<i64> {
    let last = chunk.last().copied().unwrap_or(PosRange::single(0));
    chunk
        .iter()
        .copied()
        .chain(std::iter::repeat(last))
        .take(padded.max(chunk.len()))
        .flat_map(|r| [r.start(), r.end()])
        .collect()
}

impl Engine for MssqlEngine {
    /// The stores of one instance read their heads together, by
    /// three-part names (`heads.rs`).
    type Heads = Self;
    type Watermark = Self;

    fn kind(&self) -> EngineKind {
        EngineKind::Mssql
    }

    fn schema(&self) -> &str {
        self.settings.schema.as_str()
    }

    fn fill_limits(&self) -> FillLimits {
        FillLimits {
            rows: MAX_FILL_ROWS,
            ranges: MAX_FILL_RANGES,
            // Each further range may lock one more leaf page of the key.
            range_cost: 1,
        }
    }

    async fn identity_floor(&self) -> DbResult<i64> {
        let rows = self.read_first(&self.sql.identity, &[]).await?;
        let seed = match rows.first() {
            Some(row) => get::<i64>(row, "seed")?,
            None => None,
        };
        seed.ok_or_else(|| {
            DbError::permanent(format!(
                "cannot read the identity seed of [{}].[{}]: the table is missing, has no identity, \
                 or the login may not see it",
                self.settings.schema.as_str(),
                self.settings.profile.table.as_str()
            ))
        })
    }

    async fn head(&self) -> DbResult<Option<i64>> {
        self.end_of_messages("position").await
    }

    async fn first_position(&self) -> DbResult<Option<i64>> {
        self.end_of_messages("first_position").await
    }

    async fn checkpoints(&self) -> DbResult<Vec<Checkpoint>> {
        // A described table's readers keep their positions elsewhere.
        if !self.settings.profile.has_checkpoints() {
            return Ok(Vec::new());
        }
        if let Some(share) = &self.checkpoint_share {
            if let Some(rows) = share.checkpoints(self).await {
                return Ok(rows);
            }
        }
        let rows = self.own_checkpoints().await;
        // Read with the other stores of the instance from now on only when
        // the table is there and was read.
        if let Some(share) = &self.checkpoint_share {
            share.share(rows.as_ref().is_ok_and(Option::is_some));
        }
        Ok(rows?.unwrap_or_default())
    }

    async fn scan(&self, after: i64, limit: u32) -> DbResult<ScanPage> {
        if limit == 0 {
            return Ok(ScanPage {
                holes: Vec::new(),
                high: after,
                rows: 0,
            });
        }
        let limit = i32::try_from(limit).unwrap_or(i32::MAX);
        // Out of the shared readings while its own scan runs: a scan held by
        // a lock on this table keeps only this store waiting.
        if let Some(heads) = &self.heads {
            heads.scanned(false);
        }
        let rows = self.read_first(&self.sql.scan, &[&after, &limit]).await;
        if let Some(heads) = &self.heads {
            heads.scanned(rows.is_ok());
        }
        let rows = rows?;
        let rows = rows
            .iter()
            .map(|row| {
                Ok((
                    get::<i64>(row, "previous_position")?.unwrap_or(after),
                    get::<i64>(row, "position")?.unwrap_or(after),
                    get::<i64>(row, "rows_read")?.unwrap_or(0),
                    get::<bool>(row, "is_last")?.unwrap_or(false),
                ))
            })
            .collect::<DbResult<Vec<ScanRow>>>()?;
        Ok(page_from_rows(after, &rows))
    }

    async fn probe(&self, ranges: &[PosRange]) -> DbResult<Probe> {
        let mut committed = BTreeSet::new();
        let mut dirty = BTreeSet::new();
        for chunk in ranges.chunks(PROBE_CHUNK) {
            let padded = chunk.len().next_power_of_two().min(PROBE_CHUNK);
            let values = probe_params(chunk, padded);
            let params: Vec<&dyn ToSql> = values.iter().map(|v| v as &dyn ToSql).collect();
            let text = self.sql.probe(padded);
            for row in self.read_first(&text, &params).await? {
                let Some(position) = get::<i64>(&row, "position")? else {
                    continue;
                };
                if get::<bool>(&row, "is_committed")?.unwrap_or(false) {
                    committed.insert(position);
                } else {
                    dirty.insert(position);
                }
            }
        }
        Ok(probe_from(committed, dirty))
    }

    async fn fill_ranges(
        &self,
        ranges: &[PosRange],
        lock_timeout: Duration,
        fence: &Fence,
    ) -> DbResult<FillOutcome> {
        self.fill_batch_of(ranges, lock_timeout, fence).await
    }

    async fn install(&self) -> DbResult<String> {
        MssqlEngine::install(self).await?;
        Ok(format!(
            "created {}.gap_healer_fill (WITH EXECUTE AS OWNER), which writes tombstones of type {:?} into stream {:?} and no other: \
             grant EXECUTE on it and SELECT on the tables to the healer's login (see `gap-healer sql --engine mssql`)",
            self.settings.schema.as_str(),
            self.settings.tombstone_type,
            self.settings.tombstone_stream
        ))
    }

    async fn preflight(&self) -> DbResult<Vec<Finding>> {
        let mut findings = if self.sql.table.is_some() {
            self.table_findings().await?
        } else {
            self.preflight_findings().await?
        };
        findings.push(self.proof_finding().await);
        findings.extend(plaintext_warning(&self.config));
        findings.extend(self.watermark_finding().await);
        Ok(findings)
    }

    async fn prepare_fills(&self, lock_timeouts: &[Duration]) {
        if let Err(e) = self.fill_mode().await {
            tracing::debug!(error = %e.message, "the fill mode is asked again at the first fill");
        }
        self.compile_fills(lock_timeouts).await;
    }

    fn shared_heads(&self) -> Option<&Self> {
        self.heads.as_ref().map(|_| self)
    }

    async fn open_transactions(
        &self,
        _not_before: tokio::time::Instant,
    ) -> DbResult<OpenTransactions> {
        self.read_open_transactions().await
    }

    fn watermark_table(&self) -> Option<&Self> {
        self.settings.watermark_table.is_some().then_some(self)
    }
}

/// One row per store in `watermark_table` (`watermark.rs`).
impl WatermarkTable for MssqlEngine {
    async fn read_watermark(&self, store: &str) -> DbResult<Option<i64>> {
        self.read_watermark_row(store).await
    }

    async fn publish_watermark(&self, store: &str, position: i64) -> DbResult<()> {
        self.publish_watermark_row(store, position).await
    }
}

/// `Encrypt=false` to a server on another machine: a warning (`tls`),
/// never a failure. Such a session encrypts at most the login; queries and
/// results cross the network in the clear.
fn plaintext_warning(config: &tiberius::Config) -> Option<Finding> {
    if !conn::wants_login_encryption_only(config) {
        return None;
    }
    let addr = config.get_addr();
    let host = addr
        .rsplit_once(':')
        .map_or(addr.as_str(), |(host, _)| host);
    (!crate::engine::check::is_local_host(host)).then(|| {
        crate::engine::check::plaintext_to(
            host,
            "Encrypt=true (the default) encrypts and verifies the server, against TrustServerCertificateCA=FILE for a private CA",
        )
    })
}

/// A session of its own, opened as the engine opens every session (the
/// same ADO.NET parsing, `Encrypt` semantics and redirect handling), for
/// tools and tests that talk to the store beside the engine.
pub async fn open_session(
    connection_string: &crate::secret::ConnectionString,
) -> DbResult<tiberius::Client<tokio_util::compat::Compat<tokio::net::TcpStream>>> {
    let config = conn::config_from_ado(connection_string.expose()).map_err(|e| {
        DbError::permanent(
            connection_string.scrub(&format!("invalid SQL Server connection string: {}", e.0)),
        )
    })?;
    conn::connect(&config, connection_string).await
}

/// Checks an ADO.NET connection string the way [`MssqlEngine::new`] parses it,
/// without connecting. The message names keys and positions, never values,
/// and is scrubbed of the password besides. Use this rather than tiberius's
/// `Config::from_ado_string` directly: that parser rejects non-ASCII
/// passwords, keeps a doubled quote doubled, and names the offending
/// character in its error.
pub fn check_connection_string(
    connection_string: &crate::secret::ConnectionString,
) -> Result<(), String> {
    conn::config_from_ado(connection_string.expose())
        .map(|_| ())
        .map_err(|e| {
            connection_string.scrub(&format!(
                "not a usable SQL Server connection string: {}",
                e.0
            ))
        })
}

/// What `gap-healer sql --engine mssql` prints: the fill procedure for
/// `schema`, writing tombstones of `tombstone_type` into `tombstone_stream`
/// and no other (both are constants of the procedure), and the grants the
/// healer's user ([`crate::engine::HEALER_ROLE`]) needs, with comments. `schema` must be the
/// validated plain identifier; the stream and type may be any text (they are
/// escaped), but SQL Server's columns hold at most 850 and 128 UTF-16 code
/// units of them, which the config layer and [`MssqlEngine::new`] enforce.
pub fn setup_sql_for(schema: &Ident, tombstone_stream: &str, tombstone_type: &str) -> String {
    sql::setup_script(schema, tombstone_stream, tombstone_type)
}

/// What `gap-healer sql --engine mssql` prints for a described table
/// (profiles custom and sqlstreamstore): the grants of direct mode, the
/// only mode such a table fills in.
pub fn table_setup_sql(schema: &Ident, shape: &profile::TableShape) -> String {
    table::setup_script(schema, shape)
}

/// [`setup_sql_for`] with the default tombstone stream and type
/// (`__tombstones__`, `$tombstone`).
pub fn setup_sql(schema: &Ident) -> String {
    setup_sql_for(
        schema,
        crate::engine::DEFAULT_TOMBSTONE_STREAM,
        crate::engine::DEFAULT_TOMBSTONE_TYPE,
    )
}

/// The stores of an instance read their heads in one statement
/// (`heads.rs`).
impl SharedHeads for MssqlEngine {
    async fn shared_head(&self, not_before: tokio::time::Instant) -> HeadReading {
        match &self.heads {
            Some(heads) => heads.head(self, not_before).await,
            None => HeadReading::NotShared,
        }
    }
}

impl MssqlEngine {
    /// Statements of head readings the stores of its instance have sent
    /// together, for tests and diagnostics (0 without a database in the
    /// connection string).
    pub fn shared_readings(&self) -> u64 {
        self.heads.as_ref().map_or(0, heads::Membership::readings)
    }

    /// Statements of checkpoint readings the stores of its instance have
    /// sent together ([`Engine::checkpoints`]), for tests and diagnostics
    /// (0 when it is in none).
    pub fn checkpoint_readings(&self) -> u64 {
        self.checkpoint_share
            .as_ref()
            .map_or(0, checkpoints::Membership::readings)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::engine::tests_support::mssql_settings as settings;
    use crate::engine::DbErrorKind;
    use crate::secret::ConnectionString;

    fn r(a: i64, b: i64) -> PosRange {
        PosRange::new(a, b).unwrap()
    }

    #[test]
    fn encrypt_false_to_another_machine_is_a_warning() {
        use crate::engine::Check;
        let warning = |cs: &str| plaintext_warning(&conn::config_from_ado(cs).unwrap());
        let w = warning("Server=tcp:db.example.com,1433;User Id=a;Password=b;Encrypt=false")
            .expect("a warning");
        assert!(w.ok && w.warning && w.check == Check::Tls, "{w:?}");
        assert!(w.detail.contains("to db.example.com, which"), "{w:?}");
        assert!(!w.detail.contains("Password"), "{w:?}");
        for quiet in [
            "Server=tcp:127.0.0.1,1433;User Id=a;Password=b;Encrypt=false",
            "Server=tcp:localhost,1433;User Id=a;Password=b;Encrypt=false",
            "Server=tcp:db.example.com,1433;User Id=a;Password=b;Encrypt=true",
            "Server=tcp:db.example.com,1433;User Id=a;Password=b",
        ] {
            assert_eq!(warning(quiet), None, "{quiet}");
        }
    }

    #[test]
    fn page_from_scan_rows() {
        // Rows 5, 6, 9, 10, 14 after 4: holes 7..=8 and 11..=13.
        let rows = [(6, 9, 3, false), (10, 14, 5, true)];
        assert_eq!(
            page_from_rows(4, &rows),
            ScanPage {
                holes: vec![r(7, 8), r(11, 13)],
                high: 14,
                rows: 5
            }
        );
        // A hole right after `after`.
        assert_eq!(
            page_from_rows(4, &[(4, 8, 1, true)]),
            ScanPage {
                holes: vec![r(5, 7)],
                high: 8,
                rows: 1
            }
        );
        // No hole: only the last row comes back.
        assert_eq!(
            page_from_rows(4, &[(99, 100, 96, true)]),
            ScanPage {
                holes: vec![],
                high: 100,
                rows: 96
            }
        );
        // Empty page.
        assert_eq!(
            page_from_rows(4, &[]),
            ScanPage {
                holes: vec![],
                high: 4,
                rows: 0
            }
        );
        // A 10,000-wide identity jump is one range.
        assert_eq!(
            page_from_rows(-1, &[(10, 10_011, 12, true)]).holes,
            vec![r(11, 10_010)]
        );
    }

    #[test]
    fn probe_subtracts_committed_from_dirty() {
        let p = probe_from([3, 5].into(), [3, 4, 5, 7].into());
        assert_eq!(
            p,
            Probe {
                committed: vec![3, 5],
                in_flight: vec![4, 7]
            }
        );
    }

    #[test]
    fn probe_params_pad_with_the_last_range() {
        assert_eq!(
            probe_params(&[r(1, 2), r(5, 9), r(11, 11)], 4),
            vec![1, 2, 5, 9, 11, 11, 11, 11]
        );
        assert_eq!(probe_params(&[r(1, 2)], 1), vec![1, 2]);
    }

    #[test]
    fn babelfish_is_named_from_its_version() {
        let v = "Babelfish for PostgreSQL with SQL Server Compatibility - 12.0.2000.8\nNov 30 2026\n\
                 Copyright (c) Amazon Web Services\nPostgreSQL 16.3 on x86_64-pc-linux-gnu (Babelfish 4.2.0)";
        let s = Server::from_version(v, true);
        assert_eq!(s.babelfish.as_deref(), Some("Babelfish 4.2.0"));
        assert_eq!(
            s.version,
            "Babelfish for PostgreSQL with SQL Server Compatibility - 12.0.2000.8"
        );
        let s = Server {
            database: "orders".into(),
            ..s
        };
        assert_eq!(
            s.leader_lock_name("gap-healer:eventuous"),
            "orders/gap-healer:eventuous"
        );
        let s = Server::from_version("Microsoft SQL Server 2022 (RTM) - 16.0.1000.6", false);
        assert_eq!(s.babelfish, None);
        assert_eq!(
            s.leader_lock_name("gap-healer:eventuous"),
            "gap-healer:eventuous"
        );
    }

    #[test]
    fn new_never_connects_and_never_shows_the_password() {
        let secret = "Hunter2;'quoted'=ü";
        let cs = format!(
            "Server=tcp:127.0.0.1,1;Database=es;User Id=app;Password='{}'",
            secret.replace('\'', "''")
        );
        // No runtime needed: nothing is spawned or sent until the first query.
        let engine = MssqlEngine::new(&settings(&cs)).unwrap();
        let shown = format!("{engine:?}");
        assert!(!shown.contains("Hunter2"), "{shown}");
        assert_eq!(engine.kind(), EngineKind::Mssql);
        assert_eq!(engine.fill_limits().rows, 4000);
    }

    #[test]
    fn check_connection_string_accepts_what_new_accepts() {
        let good = ConnectionString::new("Server=db;User Id=app;Password='pä;ss''w=rd'");
        assert_eq!(check_connection_string(&good), Ok(()));
        let bad = ConnectionString::new("Server=db;User Id=app;Password='Hunter2");
        let err = check_connection_string(&bad).unwrap_err();
        assert!(!err.contains("Hunter2"), "{err}");
    }

    #[test]
    fn bad_connection_strings_are_permanent_and_secret_free() {
        for cs in [
            "Server=db;User Id=app;Password='Hunter2;Database=es",
            "Server=db;User Id=app;Password=Hunter2;Hunter2",
            "Server=db;Password=Hunter2",
            "Server=db;User Id=app;Password=Hunter2;Encrypt=sometimes",
        ] {
            let err = MssqlEngine::new(&settings(cs)).expect_err(cs);
            assert_eq!(err.kind, DbErrorKind::Permanent);
            assert!(!err.message.contains("Hunter2"), "{cs} -> {}", err.message);
            assert!(!format!("{err:?}").contains("Hunter2"));
        }
        // A schema that would end the brackets is not even a name the
        // settings can hold.
        assert!(Ident::parse("x]; DROP TABLE y; --").is_err());
    }

    #[tokio::test]
    async fn refused_connection_is_a_transient_error_at_once() {
        // Port 1 on localhost refuses at once; the caller hears of it from the
        // pool's error sink instead of waiting out the connect timeout.
        let mut s = settings(
            "Server=tcp:127.0.0.1,1;User Id=app;Password=Hunter2;TrustServerCertificate=true",
        );
        s.connect_timeout = Duration::from_secs(5);
        let engine = MssqlEngine::new(&s).unwrap();
        let started = Instant::now();
        let err = engine.head().await.expect_err("nothing listens on port 1");
        assert!(err.is_transient(), "{err:?}");
        assert!(!err.message.contains("Hunter2"), "{}", err.message);
        // Issue 20: "SQL Server connection failed: cannot reach SQL Server:",
        // naming no server; one prefix now, and where.
        assert!(
            err.message
                .starts_with("cannot connect to SQL Server at 127.0.0.1:1: "),
            "{}",
            err.message
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        let err = engine
            .preflight()
            .await
            .expect_err("preflight without a server is an Err");
        assert!(err.is_transient());
    }

    /// Issue 20: a server that is not SQL Server read "SQL Server connection
    /// failed: SQL Server connection failed: Protocol error: header: invalid
    /// packet type: 72".
    #[tokio::test]
    async fn a_server_that_does_not_speak_tds_is_named_as_such() {
        let (port, http) = crate::engine::tests_support::http_listener().await;
        for encrypt in ["true", "false"] {
            let mut s = settings(&format!(
                "Server=tcp:127.0.0.1,{port};User Id=app;Password=Hunter2;Encrypt={encrypt};TrustServerCertificate=true"
            ));
            s.connect_timeout = Duration::from_secs(5);
            let engine = MssqlEngine::new(&s).unwrap();
            let err = engine
                .head()
                .await
                .expect_err("an HTTP server is no database");
            assert!(
                err.message.starts_with(&format!(
                    "the server at 127.0.0.1:{port} does not speak TDS, SQL Server's protocol"
                )),
                "Encrypt={encrypt}: {}",
                err.message
            );
            assert!(
                !err.message.contains("connection failed"),
                "{}",
                err.message
            );
            assert!(!err.message.contains("Hunter2"), "{}", err.message);
        }
        http.abort();
    }

    fn eventuous() -> Ident {
        Ident::parse("eventuous").unwrap()
    }

    #[test]
    fn setup_sql_is_the_procedure_then_the_grants() {
        let script = setup_sql(&eventuous());
        let procedure = script
            .find("CREATE OR ALTER PROCEDURE [eventuous].[gap_healer_fill]")
            .unwrap();
        let go = script.find("\nGO\n").unwrap();
        let grant = script
            .find("GRANT EXECUTE ON OBJECT::[eventuous].[gap_healer_fill] TO __healer_role__")
            .unwrap();
        assert!(procedure < go && go < grant);
        assert!(script.contains("WITH EXECUTE AS OWNER"));
        // The defaults, baked in.
        assert_eq!(
            script,
            setup_sql_for(&eventuous(), "__tombstones__", "$tombstone")
        );
        assert!(script.contains("DECLARE @stream_name NVARCHAR(850) = N'__tombstones__';"));
        assert!(script.contains("DECLARE @message_type NVARCHAR(128) = N'$tombstone';"));
    }

    #[test]
    fn setup_sql_for_escapes_a_quote_in_the_stream_name() {
        let script = setup_sql_for(&eventuous(), "O'Brien's \"tombstones\"", "gap'filler");
        assert!(
            script.contains("DECLARE @stream_name NVARCHAR(850) = N'O''Brien''s \"tombstones\"';"),
            "{script}"
        );
        assert!(script.contains("DECLARE @message_type NVARCHAR(128) = N'gap''filler';"));
        // A name that tries to end the literal stays inside it.
        let hostile = setup_sql_for(&eventuous(), "x'; DROP TABLE eventuous.Messages; --", "t");
        assert!(hostile.contains(
            "DECLARE @stream_name NVARCHAR(850) = N'x''; DROP TABLE eventuous.Messages; --';"
        ));
        let engine = MssqlEngine::new(&StoreSettings {
            tombstone_stream: "O'Brien's".into(),
            ..settings("Server=db;User Id=app;Password=x")
        })
        .unwrap();
        assert!(engine
            .sql
            .fill_procedure
            .contains("DECLARE @stream_name NVARCHAR(850) = N'O''Brien''s';"));
    }

    #[test]
    fn tombstone_names_too_long_for_sql_server_are_refused() {
        let mut s = settings("Server=db;User Id=app;Password=x");
        s.tombstone_stream = format!("{}😀", "s".repeat(849)); // 851 UTF-16 units
        let err = MssqlEngine::new(&s).unwrap_err();
        assert_eq!(err.kind, DbErrorKind::Permanent);
        let mut s = settings("Server=db;User Id=app;Password=x");
        s.tombstone_type = "t".repeat(129);
        assert!(MssqlEngine::new(&s).is_err());
    }
}
