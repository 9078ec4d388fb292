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
//! # How it fills
//! One transaction per range (`sql/mssql/fill.sql`, or the `gap_healer_fill`
//! procedure that `sql::fill_procedure` builds from that file's body and
//! DECLAREs, so both modes run one text): lock the tombstone stream's row,
//! check the leader fence, refuse anything at or above the highest committed
//! position, `SET IDENTITY_INSERT ON`, insert the range's tombstones in one
//! statement from a numbers CTE, move the stream's Version, `IDENTITY_INSERT
//! OFF` on every path, commit. The batch always ends with one result row, and
//! [`errors::classify`] turns its error number and stage into an outcome or an
//! error.
//!
//! The procedure writes only the tombstone stream and type it was created
//! for (`gap-healer install` with this configuration): they are constants in
//! its body, not parameters, so a login with EXECUTE on it cannot make it
//! write into another stream. The engine uses it only when its parameters are
//! this version's and it says (in its result row) that it writes this
//! configuration's tombstones ([`preflight::ProcedureState`]).
//!
//! # Sessions
//! See [`conn`]: a session goes back to the pool only when the work on it
//! ended in a known state (no open transaction, IDENTITY_INSERT off).
//!
//! # Leader lock
//! [`LeaderLock`] for SQL Server: `sp_getapplock` (Exclusive, owner Session,
//! no wait) on a session opened for it alone, outside the pool
//! (`sql/mssql/leader_lock.sql`); the leader checks every second with
//! `APPLOCK_MODE` on that session (`sql/mssql/leader_check.sql`). Dropping
//! the [`MssqlLeaderSession`] closes its connection, and the server releases
//! a session's application locks when the session ends. An application lock
//! is no write: it touches no table.
//!
//! # The leader fence
//! A healer whose lock session alone died (KILL, a dropped connection) keeps
//! filling through its pool until its next check notices, while another
//! healer may already have taken the lock. So the lock session also takes a
//! second application lock with a fresh, random name (the fence), and every
//! fill passes that name: inside the fill transaction, after the tombstone
//! stream's row is locked, `APPLOCK_TEST` must find the fence lock held, or
//! the fill rolls back and reports [`FillOutcome::Busy`]. A pooled session
//! cannot ask whether session N holds the leader lock without VIEW SERVER
//! STATE (sys.dm_tran_locks; `APPLOCK_MODE` answers for the caller's own
//! session only), but any session may ask whether a lock that only session
//! N holds is held. Running fills on the lock session itself was the other
//! way; it would put every fill's lock waits in front of the once-a-second
//! check and lose leadership with every abandoned fill. No election
//! (`--no-leader-election`: `try_lead` never called) means no fence.
//!
//! Architecture invariant: this module writes only inside [`MssqlEngine::fill`]
//! (tombstone rows and the tombstone stream's row) and [`MssqlEngine::install`]
//! (the fill procedure), and splices nothing into SQL but the validated schema
//! and, in the procedure only, the tombstone stream and type as escaped
//! literals.

mod conn;
mod errors;
mod preflight;
mod sql;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use bb8::{Pool, PooledConnection, RunError};
use tiberius::{Row, ToSql};

use self::conn::{Client, LastError, Manager};
use self::errors::{
    applock_result, classify, driver_error, server_error, Class, Stage, LEADER_FENCE, LOCK_TIMEOUT,
};
use self::preflight::{ProcedureState, Tombstones};
use self::sql::{Sql, PROBE_CHUNK};
use crate::engine::{
    Checkpoint, DbError, DbErrorKind, DbResult, Engine, EngineKind, FillOutcome, Finding,
    LeaderLock, Probe, ScanPage, StoreSettings,
};
use crate::gaps::PosRange;

/// Rows per fill statement: each row takes a key lock in each of the four
/// indexes of Messages, and SQL Server escalates to a table lock at about
/// 5,000 locks on one index. 4,000 stays clear of it.
pub const MAX_FILL_ROWS: u64 = 4000;

/// Connections in the pool: one for the healer's loop, one for a concurrent
/// `/readyz` or leadership check, some slack.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4;

/// The lock timeout on the tombstone stream's row is longer than the one on
/// message keys, so that a second healer waits out the first one's fill (which
/// holds the row for at most about its own key timeout) and reports
/// [`FillOutcome::Busy`] only when the row stays held well beyond that.
fn stream_lock_timeout_ms(key_ms: i32) -> i32 {
    key_ms.saturating_mul(2).saturating_add(1000)
}

fn millis_i32(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

/// How this engine's login fills.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FillMode {
    /// The fill batch runs as the login, which needs ALTER on Messages.
    Direct,
    /// `<schema>.gap_healer_fill` runs the same batch as its owner; the login
    /// needs only EXECUTE on it.
    Procedure,
}

impl FillMode {
    pub fn as_str(&self) -> &'static str {
        match self {
            FillMode::Direct => "direct",
            FillMode::Procedure => "procedure",
        }
    }
}

const MODE_UNKNOWN: u8 = 0;
const MODE_DIRECT: u8 = 1;
const MODE_PROCEDURE: u8 = 2;

/// Whether and how fills are fenced by the leader lock (see the module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Fence {
    /// `try_lead` was never called (no leader election): fills are not fenced.
    #[default]
    Unelected,
    /// `try_lead` was called but has never taken the lock: fills are refused
    /// ([`FillOutcome::Busy`]) without a query.
    NotLeading,
    /// The fence lock of the latest session that took the leader lock, and
    /// that session's id. Kept after the session is dropped: the server has
    /// released the lock then, so fills fail closed until a new session
    /// takes the leader lock.
    Lock { name: String, session_id: i32 },
}

/// What a pooled session looks like, for tests and diagnostics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionState {
    /// `@@SPID`. Together with `login_time` it names one connection: the same
    /// pair on two checkouts means the connection was reused (a session id
    /// alone can be handed to a new connection once the old one is gone).
    pub session_id: i32,
    /// When the session logged in (ISO 8601, from sys.dm_exec_sessions).
    pub login_time: String,
    /// `@@TRANCOUNT`: must be 0.
    pub open_transactions: i32,
    /// `@@LOCK_TIMEOUT`: -1 (the connection default) unless a SET leaked.
    pub lock_timeout_ms: i32,
    /// No table of the session has IDENTITY_INSERT on.
    pub identity_insert_free: bool,
}

/// The SQL Server engine.
pub struct MssqlEngine {
    settings: StoreSettings,
    config: tiberius::Config,
    sql: Sql,
    max_connections: u32,
    pool: OnceLock<Pool<Manager>>,
    last_connect_error: LastError,
    mode: AtomicU8,
    fence: Mutex<Fence>,
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
        let secret = &settings.connection_string;
        let config = conn::config_from_ado(secret.expose()).map_err(|e| {
            DbError::permanent(
                secret.scrub(&format!("invalid SQL Server connection string: {}", e.0)),
            )
        })?;
        let sql = Sql::new(
            &settings.schema,
            &settings.tombstone_stream,
            &settings.tombstone_type,
        )?;
        Ok(MssqlEngine {
            settings: settings.clone(),
            config,
            sql,
            max_connections: max_connections.max(1),
            pool: OnceLock::new(),
            last_connect_error: LastError::default(),
            mode: AtomicU8::new(MODE_UNKNOWN),
            fence: Mutex::new(Fence::Unelected),
        })
    }

    /// The pool, built on first use (bb8 spawns its reaper on the runtime, so
    /// this must run inside one; every caller is an async method).
    fn pool(&self) -> &Pool<Manager> {
        self.pool.get_or_init(|| {
            let manager = Manager::new(
                self.config.clone(),
                self.settings.connection_string.clone(),
                self.last_connect_error.clone(),
            );
            Pool::builder()
                .max_size(self.max_connections)
                .connection_timeout(self.settings.connect_timeout)
                .error_sink(Box::new(self.last_connect_error.clone()))
                .build_unchecked(manager)
        })
    }

    /// A session, marked unclean: it goes back to the pool only if the caller
    /// marks it clean once its work ended in a known state.
    async fn checkout(&self) -> DbResult<PooledConnection<'_, Manager>> {
        // Listening before asking, so a login refused at once is heard.
        let failed = self.last_connect_error.failed().notified();
        tokio::pin!(failed);
        failed.as_mut().enable();
        let got = tokio::select! {
            got = self.pool().get() => got,
            _ = &mut failed => return Err(self.connect_failed()),
        };
        match got {
            Ok(mut session) => {
                session.clean = false;
                Ok(session)
            }
            Err(RunError::User(e)) => Err(e),
            Err(RunError::TimedOut) => Err(self.connect_timed_out()),
        }
    }

    /// A connection attempt failed (refused, login failed) before the
    /// timeout: its error, as the pool's error sink recorded it.
    fn connect_failed(&self) -> DbError {
        match self.last_connect_error.get() {
            Some(last) => DbError {
                kind: last.kind,
                code: last.code.clone(),
                message: format!("SQL Server connection failed: {}", last.message),
            },
            None => DbError::transient("SQL Server connection failed"),
        }
    }

    fn connect_timed_out(&self) -> DbError {
        let waited = humantime::format_duration(self.settings.connect_timeout);
        match self.last_connect_error.get() {
            Some(last) => DbError {
                kind: last.kind,
                code: last.code.clone(),
                message: format!("no SQL Server connection within {waited}: {}", last.message),
            },
            None => DbError::transient(format!("no SQL Server connection within {waited}")),
        }
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

    /// How fills run for this login: the procedure when it exists, the login
    /// may execute it, it is this version's and it writes this
    /// configuration's tombstones ([`MssqlEngine::procedure_state`]); direct
    /// otherwise (and a warning says why an installed procedure is not used).
    /// Asked once, then cached; a permanent fill error forgets the answer so
    /// the next fill asks again.
    pub async fn fill_mode(&self) -> DbResult<FillMode> {
        match self.mode.load(Ordering::Acquire) {
            MODE_DIRECT => return Ok(FillMode::Direct),
            MODE_PROCEDURE => return Ok(FillMode::Procedure),
            _ => {}
        }
        let state = self.procedure_state().await?;
        let use_procedure = state.usable();
        let mode = if use_procedure {
            FillMode::Procedure
        } else {
            FillMode::Direct
        };
        let code = if use_procedure {
            MODE_PROCEDURE
        } else {
            MODE_DIRECT
        };
        if self.mode.swap(code, Ordering::AcqRel) != code {
            if let Some(problem) = state.problem(
                &format!("[{}].[gap_healer_fill]", self.settings.schema),
                &self.settings.tombstone_stream,
                &self.settings.tombstone_type,
            ) {
                tracing::warn!(schema = %self.settings.schema, "{problem}");
            }
            tracing::info!(
                mode = mode.as_str(),
                schema = %self.settings.schema,
                "SQL Server fills run in {} mode",
                mode.as_str()
            );
        }
        Ok(mode)
    }

    /// The installed fill procedure as this login sees it: whether it exists
    /// and may be executed, whether its parameters are this version's
    /// (`sql/mssql/fill_mode.sql`), and, if so, which tombstones it writes: a
    /// call with NULL bounds, which writes nothing and answers with the
    /// procedure's constants. Needs no right beyond EXECUTE on it (a login
    /// with only EXECUTE cannot read the procedure's definition).
    pub(crate) async fn procedure_state(&self) -> DbResult<ProcedureState> {
        let sets = self.read(&self.sql.fill_mode, &[]).await?;
        let mut sets = sets.into_iter();
        let facts = sets.next().unwrap_or_default();
        let (exists, execute) = match facts.first() {
            Some(row) => (
                get::<bool>(row, "procedure_exists")?.unwrap_or(false),
                get::<bool>(row, "procedure_execute")?.unwrap_or(false),
            ),
            None => (false, false),
        };
        let parameters = sets
            .next()
            .unwrap_or_default()
            .iter()
            .map(|row| {
                Ok(get::<&str>(row, "parameter_name")?
                    .unwrap_or_default()
                    .to_string())
            })
            .collect::<DbResult<Vec<String>>>()?;
        if let Some(state) = ProcedureState::from_catalog(
            exists,
            execute,
            &parameters,
            &self.sql.procedure_parameters,
        ) {
            return Ok(state);
        }
        let none = Option::<i64>::None;
        let no_fence = Option::<&str>::None;
        let zero = 0_i32;
        let params: [&dyn ToSql; 5] = [&none, &none, &zero, &zero, &no_fence];
        let answer = match self.fill_batch(&self.sql.fill_call, &params).await {
            Ok(answer) => answer,
            Err(e) if e.is_transient() => return Err(e),
            Err(e) => return Ok(ProcedureState::Unanswered(e.message)),
        };
        // A fill of no range: refused by the range check, nothing written.
        if answer.error_number != Some(50002) || answer.rows_filled.is_some() {
            return Ok(ProcedureState::Unanswered(format!(
                "a call with no range answered error {:?} at {:?}",
                answer.error_number, answer.error_stage
            )));
        }
        match (&answer.stream_name, &answer.message_type) {
            (Some(stream), Some(kind)) => Ok(ProcedureState::from_description(
                stream,
                kind,
                &self.settings.tombstone_stream,
                &self.settings.tombstone_type,
            )),
            _ => Ok(ProcedureState::Unanswered(
                "its result row names no tombstone stream or type".into(),
            )),
        }
    }

    fn forget_fill_mode(&self) {
        self.mode.store(MODE_UNKNOWN, Ordering::Release);
    }

    /// `CREATE OR ALTER PROCEDURE <schema>.gap_healer_fill` for this
    /// configuration's tombstone stream and type, which become constants of
    /// the procedure: what `gap-healer install` runs. The login needs CREATE
    /// PROCEDURE in the database and ALTER on the schema.
    pub async fn install(&self) -> DbResult<()> {
        let mut session = self.checkout().await?;
        let result = session
            .client
            .execute(self.sql.fill_procedure.as_str(), &[])
            .await;
        if matches!(result, Ok(_) | Err(tiberius::error::Error::Server(_))) {
            session.clean = true;
        }
        drop(session);
        result.map_err(|e| self.driver_error(&e))?;
        self.forget_fill_mode();
        tracing::info!(
            schema = %self.settings.schema,
            tombstone_stream = %self.settings.tombstone_stream,
            tombstone_type = %self.settings.tombstone_type,
            "installed the gap_healer_fill procedure"
        );
        Ok(())
    }

    /// The state of a pooled session (transaction count, lock timeout,
    /// IDENTITY_INSERT), read on a connection checked out like any other.
    pub async fn session_state(&self) -> DbResult<SessionState> {
        let rows = self.read_first(&self.sql.session_state, &[]).await?;
        let row = rows
            .first()
            .ok_or_else(|| DbError::permanent("session state query returned no row"))?;
        Ok(SessionState {
            session_id: i32::from(get::<i16>(row, "session_id")?.unwrap_or(0)),
            login_time: get::<&str>(row, "login_time")?
                .unwrap_or_default()
                .to_string(),
            open_transactions: get::<i32>(row, "open_transactions")?.unwrap_or(0),
            lock_timeout_ms: get::<i32>(row, "lock_timeout_ms")?.unwrap_or(0),
            identity_insert_free: get::<bool>(row, "identity_insert_free")?.unwrap_or(false),
        })
    }

    /// The identity's current value (IDENT_CURRENT), which no fill may move.
    pub async fn identity_current(&self) -> DbResult<Option<i64>> {
        let rows = self.read_first(&self.sql.identity, &[]).await?;
        match rows.first() {
            Some(row) => get::<i64>(row, "current_value"),
            None => Ok(None),
        }
    }

    /// Runs the fill batch or the procedure call and reads its one result
    /// row. The session goes back to the pool only when that row came back
    /// and says no transaction is open: any failure of the batch itself (it
    /// did not reach its result row) leaves the session in an unknown state,
    /// so it stays unclean and bb8 closes it, and the server rolls back
    /// whatever it had open.
    async fn fill_batch(&self, text: &str, params: &[&dyn ToSql]) -> DbResult<FillRow> {
        let mut session = self.checkout().await?;
        let sets = run(&mut session.client, text, params)
            .await
            .map_err(|e| self.driver_error(&e))?;
        let answer = match sets
            .first()
            .and_then(|rows| rows.first())
            .map(FillRow::from_row)
        {
            Some(Ok(answer)) => answer,
            Some(Err(e)) => return Err(self.driver_error(&e)),
            None => {
                return Err(DbError::transient(
                    "the fill batch returned no result row; connection discarded",
                ))
            }
        };
        if answer.open_transactions != 0 {
            return Err(DbError::transient(format!(
                "the fill batch left {} transaction(s) open; connection discarded",
                answer.open_transactions
            )));
        }
        session.clean = true;
        Ok(answer)
    }

    async fn fill_once(&self, range: PosRange, lock_timeout: Duration) -> DbResult<FillOutcome> {
        let width = range.width();
        if width > MAX_FILL_ROWS {
            return Err(DbError::permanent(format!(
                "refused to fill {range}: {width} positions, more than {MAX_FILL_ROWS} per transaction"
            )));
        }
        let fence = match self.fence.lock().map(|f| f.clone()) {
            Ok(fence) => fence,
            // A poisoned lock: a thread panicked while setting it. Fail closed.
            Err(_) => Fence::NotLeading,
        };
        let fence_name = match &fence {
            Fence::Unelected => None,
            Fence::NotLeading => {
                tracing::debug!(range = %range, "not filling: this engine has not taken the leader lock");
                return Ok(FillOutcome::Busy);
            }
            Fence::Lock { name, .. } => Some(name.as_str()),
        };
        let mode = self.fill_mode().await?;
        let key_ms = millis_i32(lock_timeout);
        let stream_ms = stream_lock_timeout_ms(key_ms);
        let stream = self.settings.tombstone_stream.as_str();
        let kind = self.settings.tombstone_type.as_str();

        let started = Instant::now();
        let answer = match mode {
            // The procedure's tombstone stream and type are its own constants.
            FillMode::Procedure => {
                let params: [&dyn ToSql; 5] =
                    [&range.start, &range.end, &key_ms, &stream_ms, &fence_name];
                self.fill_batch(&self.sql.fill_call, &params).await
            }
            FillMode::Direct => {
                let params: [&dyn ToSql; 7] = [
                    &range.start,
                    &range.end,
                    &stream,
                    &kind,
                    &key_ms,
                    &stream_ms,
                    &fence_name,
                ];
                self.fill_batch(&self.sql.fill, &params).await
            }
        };
        let answer = match answer {
            Ok(answer) => answer,
            Err(err) => {
                if err.kind == DbErrorKind::Permanent {
                    self.forget_fill_mode();
                }
                return Err(err);
            }
        };
        if (
            answer.stream_name.as_deref(),
            answer.message_type.as_deref(),
        ) != (Some(stream), Some(kind))
        {
            // The procedure was created again, for other tombstones, since
            // the mode was chosen. What happened stands; the next fill asks again.
            tracing::warn!(
                range = %range,
                stream = ?answer.stream_name,
                message_type = ?answer.message_type,
                "the fill procedure wrote or would have written other tombstones than configured; \
                 choosing the fill mode again"
            );
            self.forget_fill_mode();
        }
        if answer.error_number == Some(i32::try_from(LEADER_FENCE).unwrap_or(i32::MAX))
            && Stage::from_fill(&answer.error_stage) == Stage::Leader
        {
            if let Fence::Lock { session_id, .. } = &fence {
                tracing::warn!(
                    range = %range,
                    leader_session_id = session_id,
                    "not filling: the leader lock session has ended (leader fence); another healer may lead"
                );
            }
        }

        let outcome = self.outcome(range, mode, &answer);
        tracing::debug!(
            range = %range,
            mode = mode.as_str(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            outcome = ?outcome,
            "fill"
        );
        outcome
    }

    fn outcome(&self, range: PosRange, mode: FillMode, answer: &FillRow) -> DbResult<FillOutcome> {
        let width = range.width();
        let Some(code) = answer.error_number else {
            return match answer.rows_filled {
                Some(rows) if u64::try_from(rows).ok() == Some(width) => Ok(FillOutcome::Filled { rows: width }),
                other => Err(DbError::permanent(format!(
                    "the fill of {range} committed but reported {other:?} rows for {width} positions"
                ))),
            };
        };
        let code = u32::try_from(code).unwrap_or(0);
        let stage = Stage::from_fill(&answer.error_stage);
        match classify(code, stage) {
            Class::Outcome(outcome) => Ok(outcome),
            class => {
                let mut err = server_error(
                    code,
                    stage,
                    &answer.error_message,
                    &self.settings.connection_string,
                );
                err.message = format!(
                    "fill of {range} ({} mode) failed at {}: {}",
                    mode.as_str(),
                    stage.as_str(),
                    err.message
                );
                if class == Class::Permanent {
                    self.forget_fill_mode();
                }
                Err(err)
            }
        }
    }
}

/// The one result row of the fill batch and procedure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct FillRow {
    rows_filled: Option<i64>,
    error_number: Option<i32>,
    error_stage: String,
    error_message: String,
    open_transactions: i32,
    /// The tombstones this fill writes (procedure mode: the procedure's constants).
    stream_name: Option<String>,
    message_type: Option<String>,
}

impl FillRow {
    fn from_row(row: &Row) -> tiberius::Result<FillRow> {
        Ok(FillRow {
            rows_filled: row.try_get::<i64, _>("rows_filled")?,
            error_number: row.try_get::<i32, _>("error_number")?,
            error_stage: row
                .try_get::<&str, _>("error_stage")?
                .unwrap_or_default()
                .to_string(),
            error_message: row
                .try_get::<&str, _>("error_message")?
                .unwrap_or_default()
                .to_string(),
            open_transactions: row.try_get::<i32, _>("open_transactions")?.unwrap_or(-1),
            stream_name: row.try_get::<&str, _>("stream_name")?.map(str::to_string),
            message_type: row.try_get::<&str, _>("message_type")?.map(str::to_string),
        })
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
        .flat_map(|r| [r.start, r.end])
        .collect()
}

impl Engine for MssqlEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Mssql
    }

    fn max_fill_rows(&self) -> u64 {
        MAX_FILL_ROWS
    }

    async fn identity_floor(&self) -> DbResult<i64> {
        let rows = self.read_first(&self.sql.identity, &[]).await?;
        let seed = match rows.first() {
            Some(row) => get::<i64>(row, "seed")?,
            None => None,
        };
        seed.ok_or_else(|| {
            DbError::permanent(format!(
                "cannot read the identity seed of [{}].[Messages]: the table is missing, has no identity, \
                 or the login may not see it",
                self.settings.schema
            ))
        })
    }

    async fn head(&self) -> DbResult<Option<i64>> {
        let rows = self.read_first(&self.sql.head, &[]).await?;
        match rows.first() {
            Some(row) => get::<i64>(row, "position"),
            None => Ok(None),
        }
    }

    async fn checkpoints(&self) -> DbResult<Vec<Checkpoint>> {
        let rows = self.read_first(&self.sql.checkpoints, &[]).await?;
        rows.iter()
            .map(|row| {
                Ok(Checkpoint {
                    id: get::<&str>(row, "id")?.unwrap_or_default().to_string(),
                    position: get::<i64>(row, "position")?,
                })
            })
            .collect()
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
        let rows = self.read_first(&self.sql.scan, &[&after, &limit]).await?;
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
    ) -> DbResult<FillOutcome> {
        // One range per transaction (max_fill_ranges is 1): the T-SQL takes @start and @end.
        match ranges {
            [range] => self.fill_once(*range, lock_timeout).await,
            _ => Err(DbError::permanent(format!(
                "the SQL Server engine fills one range per transaction, was given {}",
                ranges.len()
            ))),
        }
    }

    async fn install(&self) -> DbResult<String> {
        MssqlEngine::install(self).await?;
        Ok(format!(
            "created {}.gap_healer_fill (WITH EXECUTE AS OWNER), which writes tombstones of type {:?} into stream {:?} and no other: \
             grant EXECUTE on it and SELECT on the tables to the healer's login (see `gap-healer sql --engine mssql`)",
            self.settings.schema, self.settings.tombstone_type, self.settings.tombstone_stream
        ))
    }

    async fn preflight(&self) -> DbResult<Vec<Finding>> {
        let schema: &str = self.settings.schema.as_str();
        // No connection means nothing could be checked: that is the Err.
        let mut session = self.checkout().await?;
        let result = run(&mut session.client, &self.sql.preflight, &[&schema]).await;
        if matches!(result, Ok(_) | Err(tiberius::error::Error::Server(_))) {
            session.clean = true;
        }
        drop(session);
        let sets = match result {
            Ok(sets) => sets,
            Err(e) => {
                return Ok(vec![
                    Finding::pass("connection", "connected"),
                    Finding::fail("preflight", self.driver_error(&e).message),
                ])
            }
        };
        let mut sets = sets.into_iter();
        let facts_rows = sets.next().unwrap_or_default();
        let column_rows = sets.next().unwrap_or_default();
        let Some(first) = facts_rows.first() else {
            return Ok(vec![Finding::fail(
                "preflight",
                "the preflight query returned no row",
            )]);
        };
        let facts = preflight::Facts::from_row(first).map_err(|e| self.driver_error(&e))?;
        let columns = column_rows
            .iter()
            .map(preflight::Column::from_row)
            .collect::<tiberius::Result<Vec<_>>>()
            .map_err(|e| self.driver_error(&e))?;
        let procedure = self
            .procedure_state()
            .await
            .unwrap_or_else(|e| ProcedureState::Unanswered(e.message));
        Ok(preflight::findings(
            schema,
            &facts,
            &columns,
            &procedure,
            Tombstones {
                stream: &self.settings.tombstone_stream,
                kind: &self.settings.tombstone_type,
            },
        ))
    }
}

/// The longest leader key `sp_getapplock` takes whole: its `@Resource` is
/// NVARCHAR(255), counted in UTF-16 code units, and it silently truncates
/// longer names (two keys that share their first 255 units would then be one
/// lock). Longer keys are refused instead.
pub const MAX_LEADER_KEY_UNITS: usize = 255;

fn check_leader_key(key: &str) -> DbResult<()> {
    let units = key.encode_utf16().count();
    if units == 0 || units > MAX_LEADER_KEY_UNITS {
        return Err(DbError::permanent(format!(
            "the leader key must be 1 to {MAX_LEADER_KEY_UNITS} UTF-16 code units for sp_getapplock; it has {units}"
        )));
    }
    Ok(())
}

/// `APPLOCK_MODE`'s answer on the leader's session: only `Exclusive` means
/// the lock is held (`NoLock` or anything else: it is not).
fn lock_mode_is_held(mode: Option<&str>) -> bool {
    mode == Some("Exclusive")
}

/// The dedicated session that holds the SQL Server leader lock.
///
/// Its own connection, never a pooled one. Dropping it closes the connection;
/// SQL Server then ends the session and releases its application locks.
pub struct MssqlLeaderSession {
    client: Client,
    session_id: i32,
    /// The name of the fence lock this session holds besides the leader lock.
    fence: String,
    /// A query on this session started and did not complete (its future was
    /// dropped by a timeout, or it failed): the session is not trusted again,
    /// and every later check is an error.
    in_doubt: bool,
}

impl MssqlLeaderSession {
    /// `@@SPID` of the session, as the lock batch reported it (for logs, and
    /// for tests that KILL it).
    pub fn session_id(&self) -> i32 {
        self.session_id
    }

    /// The name of the fence lock this session holds (see the module doc).
    pub fn fence(&self) -> &str {
        &self.fence
    }
}

impl fmt::Debug for MssqlLeaderSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MssqlLeaderSession")
            .field("session_id", &self.session_id)
            .field("fence", &self.fence)
            .field("in_doubt", &self.in_doubt)
            .finish_non_exhaustive()
    }
}

impl MssqlEngine {
    /// A session of its own for the leader lock, outside the pool.
    async fn connect_leader_session(&self) -> DbResult<MssqlLeaderSession> {
        let client =
            conn::connect_dedicated(&self.config, &self.settings.connection_string).await?;
        Ok(MssqlLeaderSession {
            client,
            session_id: 0,
            fence: String::new(),
            in_doubt: false,
        })
    }

    /// Runs the lock batch on `session`: whether it took the leader lock
    /// (and with it the fence lock), and the session back.
    async fn lock_on(
        &self,
        mut session: MssqlLeaderSession,
        key: &str,
    ) -> DbResult<(bool, MssqlLeaderSession)> {
        session.in_doubt = true;
        let sets = match run(&mut session.client, sql::LEADER_LOCK, &[&key]).await {
            Ok(sets) => sets,
            // @LockTimeout = 0 reports a held lock as -1, not as an error;
            // should a server raise 1222 instead, it means the same.
            Err(tiberius::error::Error::Server(token)) if token.code() == LOCK_TIMEOUT => {
                session.in_doubt = false;
                return Ok((false, session));
            }
            Err(e) => return Err(self.driver_error(&e)),
        };
        let row = sets
            .first()
            .and_then(|rows| rows.first())
            .ok_or_else(|| DbError::permanent("the leader lock batch returned no row"))?;
        let code = get::<i32>(row, "lock_result")?
            .ok_or_else(|| DbError::permanent("sp_getapplock returned no code"))?;
        session.session_id = get::<i16>(row, "session_id")?.map_or(0, i32::from);
        session.in_doubt = false;
        if !applock_result(code)? {
            return Ok((false, session));
        }
        // The fence lock, taken in the same batch: without it this session
        // must not lead (dropped with the error, it releases the leader lock).
        let fence_code = get::<i32>(row, "fence_result")?
            .ok_or_else(|| DbError::permanent("the leader lock batch took no fence lock"))?;
        if !applock_result(fence_code)? {
            return Err(DbError::transient(
                "the leader fence lock was held by another session; not leading",
            ));
        }
        session.fence = get::<&str>(row, "fence")?
            .filter(|name| !name.is_empty())
            .ok_or_else(|| DbError::permanent("the leader lock batch named no fence lock"))?
            .to_string();
        tracing::debug!(
            session_id = session.session_id,
            key,
            fence = %session.fence,
            "took the SQL Server leader lock"
        );
        Ok((true, session))
    }

    /// Runs `work` within the connect timeout: a silent server must not hold
    /// the election up.
    async fn within_connect_timeout<T>(
        &self,
        work: impl std::future::Future<Output = DbResult<T>>,
    ) -> DbResult<T> {
        let limit = self.settings.connect_timeout;
        tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
            Err(DbError::transient(format!(
                "no SQL Server leader session within {}",
                humantime::format_duration(limit)
            )))
        })
    }

    /// From the first election call on, fills are fenced: by the latest
    /// session's fence lock, or refused while no session has taken the lock.
    fn election_started(&self) {
        if let Ok(mut fence) = self.fence.lock() {
            if *fence == Fence::Unelected {
                *fence = Fence::NotLeading;
            }
        }
    }
}

impl LeaderLock for MssqlEngine {
    type Session = MssqlLeaderSession;

    /// A dedicated session, within the connect timeout. A key that
    /// `sp_getapplock` would cut short is refused before connecting. From the
    /// first call on, this engine's fills are fenced ([`FillOutcome::Busy`]
    /// until a session takes the lock).
    async fn open_session(&self, key: &str) -> DbResult<MssqlLeaderSession> {
        self.election_started();
        check_leader_key(key)?;
        self.within_connect_timeout(self.connect_leader_session())
            .await
    }

    fn reusable(&self, session: &MssqlLeaderSession) -> bool {
        !session.in_doubt
    }

    /// The lock batch on `session`, within the connect timeout: the leader
    /// lock and with it the fence lock, which then fences this engine's fills.
    async fn try_lock(
        &self,
        session: MssqlLeaderSession,
        key: &str,
    ) -> DbResult<(bool, MssqlLeaderSession)> {
        self.election_started();
        check_leader_key(key)?;
        let (taken, session) = self
            .within_connect_timeout(self.lock_on(session, key))
            .await?;
        if taken {
            if let Ok(mut fence) = self.fence.lock() {
                *fence = Fence::Lock {
                    name: session.fence.clone(),
                    session_id: session.session_id,
                };
            }
        }
        Ok((taken, session))
    }

    /// `APPLOCK_MODE` on the lock's own session. Any failure, including a
    /// session already in doubt, is an error: the caller steps down.
    async fn still_held(&self, session: &mut MssqlLeaderSession, key: &str) -> DbResult<bool> {
        if session.in_doubt {
            return Err(DbError::transient(
                "the leader session failed or was interrupted before; it is not used again",
            ));
        }
        session.in_doubt = true;
        let sets = run(&mut session.client, sql::LEADER_CHECK, &[&key])
            .await
            .map_err(|e| self.driver_error(&e))?;
        let mode = match sets.first().and_then(|rows| rows.first()) {
            Some(row) => get::<&str>(row, "lock_mode")?.map(str::to_string),
            None => return Err(DbError::permanent("the leader check returned no row")),
        };
        session.in_doubt = false;
        Ok(lock_mode_is_held(mode.as_deref()))
    }
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
/// and no other (both are constants of the procedure), and the grants a
/// placeholder user `[gap_healer]` needs, with comments. `schema` must be the
/// validated plain identifier; the stream and type may be any text (they are
/// escaped), but SQL Server's columns hold at most 850 and 128 UTF-16 code
/// units of them, which the config layer and [`MssqlEngine::new`] enforce.
pub fn setup_sql_for(schema: &str, tombstone_stream: &str, tombstone_type: &str) -> String {
    sql::setup_script(schema, tombstone_stream, tombstone_type)
}

/// [`setup_sql_for`] with the default tombstone stream and type
/// (`__tombstones__`, `$tombstone`).
pub fn setup_sql(schema: &str) -> String {
    setup_sql_for(
        schema,
        crate::config::DEFAULT_TOMBSTONE_STREAM,
        crate::config::DEFAULT_TOMBSTONE_TYPE,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::ConnectionString;

    fn settings(cs: &str) -> StoreSettings {
        StoreSettings {
            connection_string: ConnectionString::new(cs),
            schema: "eventuous".into(),
            tombstone_stream: "__tombstones__".into(),
            tombstone_type: "$tombstone".into(),
            connect_timeout: Duration::from_millis(300),
        }
    }

    fn r(a: i64, b: i64) -> PosRange {
        PosRange::new(a, b).unwrap()
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
    fn lock_timeouts() {
        assert_eq!(millis_i32(Duration::from_secs(2)), 2000);
        assert_eq!(millis_i32(Duration::from_secs(u64::MAX)), i32::MAX);
        assert_eq!(stream_lock_timeout_ms(2000), 5000);
        assert_eq!(stream_lock_timeout_ms(i32::MAX), i32::MAX);
        assert!(stream_lock_timeout_ms(0) > 0);
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
        assert_eq!(engine.max_fill_rows(), 4000);
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
        let mut s = settings("Server=db;User Id=app;Password=x");
        s.schema = "x]; DROP TABLE y; --".into();
        assert!(MssqlEngine::new(&s).is_err());
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
        assert!(
            err.message.starts_with("SQL Server connection failed: "),
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

    #[test]
    fn fill_outcomes_from_result_rows() {
        let engine = MssqlEngine::new(&settings("Server=db;User Id=app;Password=x")).unwrap();
        let range = r(10, 12);
        let row = |code: Option<i32>, stage: &str| FillRow {
            rows_filled: if code.is_none() { Some(3) } else { None },
            error_number: code,
            error_stage: stage.into(),
            error_message: "message".into(),
            open_transactions: 0,
            stream_name: Some("__tombstones__".into()),
            message_type: Some("$tombstone".into()),
        };
        let m = FillMode::Direct;
        assert_eq!(
            engine.outcome(range, m, &row(None, "commit")),
            Ok(FillOutcome::Filled { rows: 3 })
        );
        assert_eq!(
            engine.outcome(range, m, &row(Some(2627), "messages")),
            Ok(FillOutcome::Committed)
        );
        assert_eq!(
            engine.outcome(range, m, &row(Some(2601), "messages")),
            Ok(FillOutcome::Committed)
        );
        assert_eq!(
            engine.outcome(range, m, &row(Some(1222), "messages")),
            Ok(FillOutcome::Held)
        );
        assert_eq!(
            engine.outcome(range, m, &row(Some(1222), "stream")),
            Ok(FillOutcome::Busy)
        );
        // The leader fence: this process no longer leads.
        assert_eq!(
            engine.outcome(range, m, &row(Some(50006), "leader")),
            Ok(FillOutcome::Busy)
        );
        assert_eq!(
            engine.outcome(range, FillMode::Procedure, &row(Some(50006), "leader")),
            Ok(FillOutcome::Busy)
        );
        let deadlock = engine
            .outcome(range, m, &row(Some(1205), "messages"))
            .unwrap_err();
        assert!(deadlock.is_transient());
        assert_eq!(deadlock.code.as_deref(), Some("1205"));
        let above = engine
            .outcome(range, m, &row(Some(50005), "head"))
            .unwrap_err();
        assert_eq!(above.kind, DbErrorKind::Permanent);
        assert!(
            above.message.contains("failed at head"),
            "{}",
            above.message
        );
        let wrong_count = FillRow {
            rows_filled: Some(2),
            ..row(None, "commit")
        };
        assert!(engine.outcome(range, m, &wrong_count).is_err());
    }

    #[test]
    fn leader_keys_fit_sp_getapplock() {
        assert!(check_leader_key("gap-healer:eventuous").is_ok());
        assert!(check_leader_key(&"k".repeat(255)).is_ok());
        // Counted in UTF-16 units, as NVARCHAR counts: the emoji is two.
        let astral = format!("{}😀", "k".repeat(253));
        assert_eq!(
            (astral.chars().count(), astral.encode_utf16().count()),
            (254, 255)
        );
        assert!(check_leader_key(&astral).is_ok());
        // 255 characters, 256 units: too long.
        let too_long = format!("{}😀", "k".repeat(254));
        let err = check_leader_key(&too_long).unwrap_err();
        assert_eq!(err.kind, DbErrorKind::Permanent);
        assert!(check_leader_key(&"k".repeat(256)).is_err());
        assert!(check_leader_key("").is_err());
    }

    #[test]
    fn only_exclusive_means_held() {
        assert!(lock_mode_is_held(Some("Exclusive")));
        for other in [
            None,
            Some("NoLock"),
            Some("Shared"),
            Some("exclusive"),
            Some(""),
        ] {
            assert!(!lock_mode_is_held(other), "{other:?}");
        }
    }

    #[tokio::test]
    async fn try_lead_without_a_server_is_a_transient_secret_free_error() {
        let engine = MssqlEngine::new(&settings(
            "Server=tcp:127.0.0.1,1;User Id=app;Password=Hunter2;TrustServerCertificate=true",
        ))
        .unwrap();
        let started = Instant::now();
        let err = engine
            .try_lead("gap-healer:eventuous")
            .await
            .expect_err("nothing listens on port 1");
        assert!(err.is_transient(), "{err:?}");
        assert!(!err.message.contains("Hunter2"), "{}", err.message);
        assert!(started.elapsed() < Duration::from_secs(5));
        // A key sp_getapplock would truncate is refused before connecting.
        let err = engine.try_lead(&"k".repeat(256)).await.unwrap_err();
        assert_eq!(err.kind, DbErrorKind::Permanent);
    }

    #[tokio::test]
    async fn try_lead_gives_up_at_the_connect_timeout() {
        // A listener that accepts and never answers the TDS prelogin.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let engine = MssqlEngine::new(&settings(&format!(
            "Server=tcp:127.0.0.1,{port};User Id=app;Password=Hunter2;TrustServerCertificate=true"
        )))
        .unwrap();
        let started = Instant::now();
        let err = engine.try_lead("gap-healer:eventuous").await.unwrap_err();
        let waited = started.elapsed();
        assert!(err.is_transient(), "{err:?}");
        assert!(
            err.message.contains("no SQL Server leader session within"),
            "{}",
            err.message
        );
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        silent.abort();
    }

    #[test]
    fn setup_sql_is_the_procedure_then_the_grants() {
        let script = setup_sql("eventuous");
        let procedure = script
            .find("CREATE OR ALTER PROCEDURE [eventuous].[gap_healer_fill]")
            .unwrap();
        let go = script.find("\nGO\n").unwrap();
        let grant = script
            .find("GRANT EXECUTE ON OBJECT::[eventuous].[gap_healer_fill] TO [gap_healer]")
            .unwrap();
        assert!(procedure < go && go < grant);
        assert!(script.contains("WITH EXECUTE AS OWNER"));
        // The defaults, baked in.
        assert_eq!(
            script,
            setup_sql_for("eventuous", "__tombstones__", "$tombstone")
        );
        assert!(script.contains("DECLARE @stream_name NVARCHAR(850) = N'__tombstones__';"));
        assert!(script.contains("DECLARE @message_type NVARCHAR(128) = N'$tombstone';"));
    }

    #[test]
    fn setup_sql_for_escapes_a_quote_in_the_stream_name() {
        let script = setup_sql_for("eventuous", "O'Brien's \"tombstones\"", "gap'filler");
        assert!(
            script.contains("DECLARE @stream_name NVARCHAR(850) = N'O''Brien''s \"tombstones\"';"),
            "{script}"
        );
        assert!(script.contains("DECLARE @message_type NVARCHAR(128) = N'gap''filler';"));
        // A name that tries to end the literal stays inside it.
        let hostile = setup_sql_for("eventuous", "x'; DROP TABLE eventuous.Messages; --", "t");
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

    #[tokio::test]
    async fn fills_are_fenced_once_leader_election_is_used() {
        // Nothing listens on port 1: every query fails to connect.
        let engine = MssqlEngine::new(&settings(
            "Server=tcp:127.0.0.1,1;User Id=app;Password=Hunter2;TrustServerCertificate=true",
        ))
        .unwrap();
        let range = r(10, 12);
        // No election: no fence, the fill goes to the database (and fails).
        assert_eq!(*engine.fence.lock().unwrap(), Fence::Unelected);
        let err = engine
            .fill(range, Duration::from_secs(1))
            .await
            .expect_err("no server");
        assert!(err.is_transient(), "{err:?}");

        // An election that never took the lock: refused without a query.
        assert!(engine.try_lead("gap-healer:eventuous").await.is_err());
        assert_eq!(*engine.fence.lock().unwrap(), Fence::NotLeading);
        let started = Instant::now();
        assert_eq!(
            engine.fill(range, Duration::from_secs(1)).await,
            Ok(FillOutcome::Busy)
        );
        assert!(started.elapsed() < Duration::from_millis(200));

        // A session that took the lock: its fence is passed (and a later
        // failed try does not drop it: the database decides).
        *engine.fence.lock().unwrap() = Fence::Lock {
            name: "gap-healer fence 57 x".into(),
            session_id: 57,
        };
        assert!(engine.try_lead("gap-healer:eventuous").await.is_err());
        assert_eq!(
            *engine.fence.lock().unwrap(),
            Fence::Lock {
                name: "gap-healer fence 57 x".into(),
                session_id: 57,
            }
        );
        assert!(engine
            .fill(range, Duration::from_secs(1))
            .await
            .unwrap_err()
            .is_transient());
    }
}
