//! The seam between the engine-neutral healer and a database.
//!
//! An [`Engine`] knows one store's SQL dialect. It answers narrow questions
//! (where is the head, which positions are missing after X, which of these
//! positions exist) and performs one kind of write: a fill of one range of
//! positions with tombstones, in one transaction. Everything about time,
//! tracking and retrying lives in the core ([`crate::healer`]).
//!
//! What only some engines can do is a capability with a trait of its own
//! ([`SharedHeads`], [`WatermarkTable`]): an engine names the type that has
//! it (itself, so far) or [`Unsupported`], which has no value, so "not
//! supported" is a type the compiler sees, never an error found at run
//! time. Engines are opened in one place, [`open()`] (module `open`), which
//! also holds the only match on [`EngineKind`].
//!
//! Architecture invariant: an engine writes nothing but tombstone rows and the
//! tombstone stream's Streams row, and only inside [`Engine::fill_ranges`].

pub mod ado_connection_string;
pub mod check;
pub mod ident;
pub mod mssql;
pub mod open;
pub mod pool;
pub mod postgres;
pub mod profile;
pub mod shared_lock;
pub(crate) mod shared_reading;

use std::fmt;
use std::future::Future;
use std::time::Duration;

pub use self::check::{Check, Finding};
pub use self::ident::{Ident, QualifiedName};
pub use self::open::{
    catalog_database, check_connection_string, heals_table_profiles, open, setup_sql, Catalog,
    Openable, Opened, Pools, WithEngine,
};
pub use crate::gaps::FillLimits;
use crate::gaps::PosRange;
use crate::replicas::{Replica, Roll, Standing};
use crate::secret::ConnectionString;

/// The tombstone stream's default name (Eventuous's own gap tombstones use it too).
pub const DEFAULT_TOMBSTONE_STREAM: &str = "__tombstones__";
/// The tombstone events' default type.
pub const DEFAULT_TOMBSTONE_TYPE: &str = "$tombstone";

/// Proof that a session won the leader lock: the session's server-side id
/// and the name of a lock only that session holds. A fill fenced by it
/// checks inside its transaction that the lock is still held, so a process
/// whose lock session died cannot fill after another healer took over.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FenceToken {
    /// The lock session's id on the server (PostgreSQL backend pid, SQL
    /// Server `@@SPID`; any integer width).
    pub session_id: i64,
    /// The lock the fill checks: the leader key on PostgreSQL, the session's
    /// own fence lock on SQL Server.
    pub lock: String,
}

/// What a fill is fenced by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Fence {
    /// No leader election (one healer per store by configuration): nothing to check.
    Unfenced,
    /// The leader lock, as won by the session the token names.
    Leader(FenceToken),
}

/// What an engine needs to know about the store it serves.
#[derive(Clone, Debug)]
pub struct StoreSettings {
    pub connection_string: ConnectionString,
    /// The store's schema: spliced into SQL by the statement renderers.
    pub schema: Ident,
    /// Bound as a parameter, never spliced.
    pub tombstone_stream: String,
    /// Bound as a parameter, never spliced.
    pub tombstone_type: String,
    /// How long to wait for a new connection before calling the database unreachable.
    pub connect_timeout: Duration,
    /// The table where the contiguous watermark is published; `None`: not
    /// published.
    pub watermark_table: Option<QualifiedName>,
    /// Which table is healed and what a tombstone row holds.
    pub profile: profile::TableShape,
}

impl StoreSettings {
    /// What stores must have in common to share a pool or a lock session:
    /// the same connection string and connect timeout.
    pub fn sharing_key(&self) -> String {
        format!(
            "{:?}\n{}",
            self.connect_timeout,
            self.connection_string.expose()
        )
    }
}

/// One page of a forward scan of committed positions above `after`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanPage {
    /// Missing ranges inside `(after, high)`, ascending, never touching `high`.
    pub holes: Vec<PosRange>,
    /// Highest committed position read in this page; `after` when the page is empty.
    pub high: i64,
    /// Rows read. A page with `rows < limit` reached the head.
    pub rows: u64,
}

/// What a probe of tracked ranges found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Probe {
    /// Positions inside the ranges whose rows are committed (events or tombstones).
    pub committed: Vec<i64>,
    /// Positions inside the ranges that an open transaction has inserted but not
    /// committed. Only engines that can see uncommitted rows without waiting
    /// (SQL Server, `NOLOCK`) fill this; PostgreSQL leaves it empty and lets the
    /// fill's lock timeout find such positions.
    pub in_flight: Vec<i64>,
}

/// The result of one fill transaction over one range. Every variant but
/// `Filled` means the transaction rolled back and wrote nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FillOutcome {
    /// Every position of the range now holds a committed tombstone.
    Filled { rows: u64 },
    /// A position of the range is committed (duplicate key: 23505, 2627, 2601).
    Committed,
    /// A position of the range is locked by an open transaction past the lock
    /// timeout (55P03, 1222).
    Held,
    /// Another filler held the tombstone stream past the lock timeout, or this
    /// process's leader lock session no longer holds the lock (the fence).
    Busy,
    /// The table itself was locked past the lock timeout (DDL, a
    /// non-concurrent `CREATE INDEX`, `LOCK TABLE`, `TABLOCK`): no key
    /// was tried. Every fill of the store would meet the same lock, so the
    /// store backs off as a whole; no position is taken for held.
    TableLocked,
}

/// One open transaction that holds the store's identity: it may have drawn
/// a position that has no key yet (see [`Engine::open_transactions`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenTransaction {
    /// The server's name for the transaction while it runs, never given to
    /// another while it does (PostgreSQL's `virtualtransaction`, SQL
    /// Server's transaction id).
    pub id: String,
    /// Its transaction id where one is assigned and differs from `id`
    /// (PostgreSQL: it survives `PREPARE TRANSACTION`, which gives the
    /// transaction a new `virtualtransaction`).
    pub xid: Option<String>,
    /// The session running it (PostgreSQL backend pid, SQL Server session
    /// id), for the log; `None` for a prepared transaction.
    pub session: Option<i64>,
    /// The session's `application_name` (program name), where the login may
    /// read it, for the log.
    pub application: Option<String>,
}

impl OpenTransaction {
    /// Whether `other`, read later, is this transaction still running:
    /// the same name, or the same transaction id.
    pub fn same_as(&self, other: &OpenTransaction) -> bool {
        self.id == other.id || (self.xid.is_some() && self.xid == other.xid)
    }
}

/// What [`Engine::open_transactions`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpenTransactions {
    /// The transactions, other than the healer's own, that held a lock
    /// every transaction drawing a position takes before it draws and keeps
    /// until it ends.
    Read(TransactionReading),
    /// No such reading here (SQL Server without `VIEW SERVER STATE`): the
    /// engine's own order of writing stands, a position keyed before any
    /// wait (the clustered primary key is written first).
    KeyOrderOnly,
}

/// One reading of the transactions that may hold a drawn position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransactionReading {
    /// When the reading began: before the identity was read, and before
    /// the locks were.
    pub began: tokio::time::Instant,
    /// How far the identity had handed positions out before the locks were
    /// read (PostgreSQL: the sequence's last value, where the login may read
    /// it); `None`: the engine cannot say, and the healer takes the
    /// position it had examined before `began`.
    pub handed_out: Option<i64>,
    /// The open transactions.
    pub open: Vec<OpenTransaction>,
}

/// A row of the store's Checkpoints table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub id: String,
    /// `None`: the subscription has handled nothing yet.
    pub position: Option<i64>,
}

/// Whether retrying can help.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DbErrorKind {
    /// Connection lost or refused, deadlock victim, serialization failure,
    /// server shutting down, pool timeout: retry with backoff.
    Transient,
    /// Missing table, missing rights, wrong shape: retrying will not help until
    /// someone changes the database. The daemon still retries (slowly) rather than
    /// crash-looping; one-shot commands exit 3.
    Permanent,
}

/// A database failure, already classified and already free of secrets.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DbError {
    pub kind: DbErrorKind,
    /// Server error code when there was one (SQLSTATE or SQL Server error number).
    pub code: Option<String>,
    /// Human-readable; must never contain a password.
    pub message: String,
    /// What was being done, where `message` already begins with it (the
    /// PostgreSQL engine's "probe: 57014: ..."); `None`: the message names
    /// no operation, and whoever reports it says which.
    pub during: Option<String>,
}

impl DbError {
    pub fn transient(message: impl Into<String>) -> Self {
        DbError {
            kind: DbErrorKind::Transient,
            code: None,
            message: message.into(),
            during: None,
        }
    }
    pub fn permanent(message: impl Into<String>) -> Self {
        DbError {
            kind: DbErrorKind::Permanent,
            code: None,
            message: message.into(),
            during: None,
        }
    }
    pub fn is_transient(&self) -> bool {
        self.kind == DbErrorKind::Transient
    }

    /// This error, its message already naming what was being done.
    pub fn during(self, what: impl Into<String>) -> Self {
        DbError {
            during: Some(what.into()),
            ..self
        }
    }

    /// The error as a report of `operation` says it: `operation: message`,
    /// unless the message names what was being done already ([`DbError::during`]).
    pub fn in_words(&self, operation: &str) -> String {
        match self.during {
            Some(_) => self.message.clone(),
            None => format!("{operation}: {}", self.message),
        }
    }
}

pub type DbResult<T> = Result<T, DbError>;

/// A database engine gap-healer can heal: the core every engine has.
///
/// Methods return `Send` futures so the healer can run on a multi-threaded
/// runtime. What only some engines have is reached through
/// [`Engine::shared_heads`] and [`Engine::watermark_table`], typed
/// [`Unsupported`] where the engine lacks it.
pub trait Engine: Send + Sync + 'static {
    /// How this engine reads the store's head together with the other
    /// stores of its database ([`Unsupported`]: it has no such reading).
    type Heads: SharedHeads;

    /// The table this engine publishes the contiguous watermark in
    /// ([`Unsupported`]: it publishes none).
    type Watermark: WatermarkTable;

    /// `"postgres"` or `"mssql"`, for logs.
    fn kind(&self) -> EngineKind;

    /// How much one fill statement may take.
    fn fill_limits(&self) -> FillLimits;

    /// Lowest position the identity column can produce (its seed): positions
    /// below it are never holes.
    fn identity_floor(&self) -> impl Future<Output = DbResult<i64>> + Send;

    /// Highest committed position, `None` for an empty table.
    fn head(&self) -> impl Future<Output = DbResult<Option<i64>>> + Send;

    /// The lowest position the store has handed out that the engine can
    /// vouch for, counting an append still open (SQL Server sees it with a
    /// dirty read): above the identity's seed when the store was reseeded
    /// (`DBCC CHECKIDENT ... RESEED`) before its first append, which the
    /// seed does not show, and the healer then starts there. `None` for an
    /// empty table, and where an open append below the first committed row
    /// would be invisible (PostgreSQL, Babelfish: no dirty reads): a first
    /// row above the seed is then no evidence of a reseed, and the healer
    /// starts at the seed, so that no position below it goes unexamined.
    fn first_position(&self) -> impl Future<Output = DbResult<Option<i64>>> + Send;

    /// Rows of the Checkpoints table; empty when the table does not exist.
    fn checkpoints(&self) -> impl Future<Output = DbResult<Vec<Checkpoint>>> + Send;

    /// Reads at most `limit` committed positions above `after`, in order, and
    /// returns the missing ranges among them. Must use an index on the position
    /// so the cost is proportional to the rows read, not the table size, and must
    /// never wait on an open append.
    fn scan(&self, after: i64, limit: u32) -> impl Future<Output = DbResult<ScanPage>> + Send;

    /// The store's shared head readings; `None` where the engine has none
    /// (always, when [`Engine::Heads`] is [`Unsupported`]).
    fn shared_heads(&self) -> Option<&Self::Heads>;

    /// Which positions inside `ranges` exist now. Never waits on an open append.
    fn probe(&self, ranges: &[PosRange]) -> impl Future<Output = DbResult<Probe>> + Send;

    /// The transactions that may still hold a position drawn from the
    /// store's identity, from a reading that began no earlier than
    /// `not_before` (the stores of one database share one). The
    /// transaction-end proof rests on it: every transaction that draws a
    /// position takes a lock (PostgreSQL: RowExclusiveLock on the
    /// identity's sequence) before it draws and keeps it until it ends, so
    /// a position handed out before the reading began either belongs to a
    /// transaction the reading lists, or to one that has ended. The engine
    /// reads how far the identity had handed out first, then the locks,
    /// and leaves out the reading's own session; it never takes that lock
    /// itself.
    fn open_transactions(
        &self,
        not_before: tokio::time::Instant,
    ) -> impl Future<Output = DbResult<OpenTransactions>> + Send;

    /// Why positions up to `position`, above the `handed_out` a reading of
    /// open transactions gave, are not filled: rows were written above the
    /// identity, so those numbers will still be handed out. A permanent
    /// error, in words that say how to repair it.
    fn above_identity(&self, position: i64, handed_out: i64) -> DbError {
        DbError::permanent(format!(
            "refusing to fill up to {position}: the identity has handed out positions only up to \
             {handed_out}; rows were written above it, so these numbers will still be handed out; \
             run `gap-healer check`"
        ))
    }

    /// Fills every position of every range with a tombstone, in one
    /// transaction, or nothing. Tombstone stream positions follow global
    /// position order. `lock_timeout` bounds the wait on each key held by an
    /// open append. The ranges must lie below the head, ascending, at most
    /// [`FillLimits::ranges`] of them (the caller guarantees it).
    /// `fence`: with [`Fence::Leader`], the fill checks inside its
    /// transaction, after the tombstone stream's row is locked, that the
    /// token's lock is still held, and writes nothing ([`FillOutcome::Busy`])
    /// when it is not.
    fn fill_ranges(
        &self,
        ranges: &[PosRange],
        lock_timeout: Duration,
        fence: &Fence,
    ) -> impl Future<Output = DbResult<FillOutcome>> + Send;

    /// Preflight for `gap-healer check`: connectivity, shape, rights.
    /// Database errors become failed findings; `Err` only when nothing could be checked.
    fn preflight(&self) -> impl Future<Output = DbResult<Vec<Finding>>> + Send;

    /// The store's schema name, for messages.
    fn schema(&self) -> &str;

    /// Learns, before the first fill, what every fill needs to know (SQL
    /// Server: the fill mode, one metadata query; Babelfish: the fill batch
    /// compiled on the session fills will use, once for each of
    /// `lock_timeouts`, the waits its fills will send), so the first hole
    /// that comes due does not wait for it. Runs once, after
    /// `verify_shape`, when the healer may fill. Never fails: the first
    /// fill asks again.
    fn prepare_fills(&self, lock_timeouts: &[Duration]) -> impl Future<Output = ()> + Send {
        let _ = lock_timeouts;
        async {}
    }

    /// Refuses a store whose tables do not have the shape the healer relies
    /// on (an identity position with a unique key on exactly it, the
    /// Eventuous columns), saying what differs: the failed shape checks of
    /// [`Engine::preflight`]. Runs before the first scan.
    fn verify_shape(&self) -> impl Future<Output = DbResult<()>> + Send {
        async {
            let findings = self.preflight().await?;
            check::shape_verdict(&findings).map_err(|differs| {
                DbError::permanent(format!(
                    "the store in schema {} does not have the Eventuous shape gap-healer needs: {differs}",
                    self.schema()
                ))
            })
        }
    }

    /// The table the store's contiguous watermark is published in; `None`
    /// when the store names none (and always, when [`Engine::Watermark`]
    /// is [`Unsupported`]).
    fn watermark_table(&self) -> Option<&Self::Watermark>;

    /// `gap-healer install`: creates what this engine's least-privilege mode
    /// needs and says what it did.
    fn install(&self) -> impl Future<Output = DbResult<String>> + Send {
        async {
            Ok(format!(
                "nothing to install for {}: grant the rights `gap-healer sql --engine {}` prints",
                self.kind(),
                self.kind()
            ))
        }
    }
}

/// What a shared head reading says of one store.
///
/// Invariant: `Empty` and `At` come only from a reading that began no
/// earlier than the poll it answers was due, so they show every row
/// committed before then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeadReading {
    /// The store is not in the readings now (its own scan has not
    /// succeeded yet, or failed last): it scans on its own.
    NotShared,
    /// The reading failed; every store of it scans on its own this poll.
    Failed(DbError),
    /// The store's table has no row.
    Empty,
    /// The store's highest committed position.
    At(i64),
}

impl HeadReading {
    /// A store's answer from a shared reading ([`shared_reading`]): `None`
    /// when the store is not in it.
    pub(crate) fn from_shared(found: Option<Result<Option<i64>, DbError>>) -> HeadReading {
        match found {
            None => HeadReading::NotShared,
            Some(Ok(None)) => HeadReading::Empty,
            Some(Ok(Some(head))) => HeadReading::At(head),
            Some(Err(e)) => HeadReading::Failed(e),
        }
    }

    /// Whether the reading shows no committed row above `examined`: then
    /// a store with no hole tracked has nothing new to scan.
    pub fn shows_nothing_above(&self, examined: i64) -> bool {
        match self {
            HeadReading::Empty => true,
            HeadReading::At(head) => *head <= examined,
            HeadReading::NotShared | HeadReading::Failed(_) => false,
        }
    }
}

/// Capability: the store's head read together with the other stores of
/// its database, in one statement for all of them.
pub trait SharedHeads: Send + Sync {
    /// The store's head from a reading that began no earlier than
    /// `not_before`, taking one when there is none.
    fn shared_head(
        &self,
        not_before: tokio::time::Instant,
    ) -> impl Future<Output = HeadReading> + Send;
}

/// Capability: the table a store's contiguous watermark is published in,
/// one row per store.
///
/// Invariant: a row's position never decreases, and a row names the
/// table it describes; reads and raises of another table's row are refused.
pub trait WatermarkTable: Send + Sync {
    /// The contiguous watermark published for `store` (`None`: no row yet).
    fn read_watermark(&self, store: &str) -> impl Future<Output = DbResult<Option<i64>>> + Send;

    /// Publishes `position` as `store`'s contiguous watermark: every position
    /// at or below it is a committed event or a tombstone. Never lowers it.
    fn publish_watermark(
        &self,
        store: &str,
        position: i64,
    ) -> impl Future<Output = DbResult<()>> + Send;
}

/// A capability an engine does not have. It has no value, so an engine
/// that names it can only answer `None` for it, and code holding one is
/// unreachable.
#[derive(Debug)]
pub enum Unsupported {}

impl SharedHeads for Unsupported {
    async fn shared_head(&self, _not_before: tokio::time::Instant) -> HeadReading {
        match *self {}
    }
}

impl WatermarkTable for Unsupported {
    async fn read_watermark(&self, _store: &str) -> DbResult<Option<i64>> {
        match *self {}
    }

    async fn publish_watermark(&self, _store: &str, _position: i64) -> DbResult<()> {
        match *self {}
    }
}

/// Leader election through the database itself: a session-level lock held on
/// a dedicated connection, released by the server when that session ends.
///
/// Architecture invariant: the lock's session is never a pooled connection,
/// and trying the lock never waits for it.
pub trait LeaderLock: Send + Sync + 'static {
    /// The dedicated session that holds the lock; dropping it releases it.
    type Session: LeaderSession;

    /// Opens a dedicated session for the lock named `key` (not taken yet).
    fn open_session(&self, key: &str) -> impl Future<Output = DbResult<Self::Session>> + Send;

    /// Whether a session kept from an earlier try may be tried again.
    fn reusable(&self, session: &Self::Session) -> bool;

    /// Tries to take the lock named `key` on `session` without waiting:
    /// whether it did, and the session back.
    fn try_lock(
        &self,
        session: Self::Session,
        key: &str,
    ) -> impl Future<Output = DbResult<(bool, Self::Session)>> + Send;

    /// Whether `session` is alive and still holds the lock named `key`.
    fn still_held(
        &self,
        session: &mut Self::Session,
        key: &str,
    ) -> impl Future<Output = DbResult<bool>> + Send;

    /// Gives the lock named `key` up, keeping `session` open (for a session
    /// whose other locks other stores hold). Engines that cannot release one
    /// lock of a session say so with an error; the caller then closes it.
    fn unlock(
        &self,
        session: &mut Self::Session,
        key: &str,
    ) -> impl Future<Output = DbResult<()>> + Send {
        let _ = (session, key);
        async {
            Err(DbError::permanent(
                "this lock is released only with its session",
            ))
        }
    }

    /// What the database's roll of replicas shows `me` of the lock named
    /// `key` ([`crate::replicas`]): whether it is held and which replica
    /// prefers it. `None` when this lock reads no roll: then every replica
    /// tries every lock, as without one.
    fn standing(
        &self,
        key: &str,
        me: Replica,
    ) -> impl Future<Output = DbResult<Option<Standing>>> + Send {
        let _ = (key, me);
        async { Ok(None) }
    }

    /// One more store of this lock waits for its first scan to end (its
    /// election began). A lock shared by a database's stores puts its
    /// replica on the roll only while none waits, so the other replicas
    /// leave it no store before it can lead them. Others: nothing to do.
    fn first_scan_pending(&self) {}

    /// A store's first scan ended (or its election did), after
    /// [`LeaderLock::first_scan_pending`].
    fn first_scan_ended(&self) {}

    /// Puts `session` on its database's roll as `me`: whether it took
    /// (another live session with that number keeps it off). Engines that
    /// read no roll: nothing to do.
    fn join_roll(
        &self,
        session: &mut Self::Session,
        me: Replica,
    ) -> impl Future<Output = DbResult<bool>> + Send {
        let _ = (session, me);
        async { Ok(false) }
    }

    /// Reads `me`'s roll in `session`'s database; `None` for engines that
    /// keep none.
    fn read_roll(
        &self,
        session: &mut Self::Session,
        me: Replica,
    ) -> impl Future<Output = DbResult<Option<Roll>>> + Send {
        let _ = (session, me);
        async { Ok(None) }
    }

    /// The id under which the roll lists the lock named `key` as held.
    fn roll_id(&self, key: &str) -> i64 {
        let _ = key;
        0
    }

    /// Gives up the lock named `key` that `session` won. By default the
    /// session is closed, which releases it.
    fn release(&self, session: Self::Session, key: &str) -> impl Future<Output = ()> + Send {
        let _ = key;
        async move { drop(session) }
    }

    /// Tries to take the lock named `key` without waiting, on the session in
    /// `idle` (a follower's, kept from its last try) or else on a new
    /// dedicated session. `Ok(None)`: another session holds it, and the
    /// session is left in `idle` for the next try, so a follower does not log
    /// in anew every second. A kept session that fails is dropped and the try
    /// made once more on a new one; on an error `idle` is empty.
    fn try_lead_reusing(
        &self,
        key: &str,
        idle: &mut Option<Self::Session>,
    ) -> impl Future<Output = DbResult<Option<Self::Session>>> + Send {
        async move {
            let kept = idle.take().filter(|s| self.reusable(s));
            let (session, reused) = match kept {
                Some(session) => (session, true),
                None => (self.open_session(key).await?, false),
            };
            let (taken, session) = match self.try_lock(session, key).await {
                Err(_) if reused => self.try_lock(self.open_session(key).await?, key).await?,
                other => other?,
            };
            if taken {
                Ok(Some(session))
            } else {
                *idle = Some(session);
                Ok(None)
            }
        }
    }

    /// Opens a dedicated session and tries to take the lock named `key` without
    /// waiting. `Ok(None)`: another session holds it (the session is closed).
    fn try_lead(&self, key: &str) -> impl Future<Output = DbResult<Option<Self::Session>>> + Send {
        async move { self.try_lead_reusing(key, &mut None).await }
    }
}

/// A session opened for the leader lock.
pub trait LeaderSession: Send + 'static {
    /// The fence of this session's leadership; meaningful once
    /// [`LeaderLock::try_lock`] has taken the lock on it.
    fn fence_token(&self) -> FenceToken;
}

/// Where the setup scripts name the role (PostgreSQL) or database user
/// (SQL Server) they grant to; [`setup_sql`] puts the quoted name there.
pub(crate) const HEALER_ROLE: &str = "__healer_role__";

/// Which engine a configuration names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Mssql,
    Postgres,
}

impl EngineKind {
    pub const NAMES: [&'static str; 2] = ["mssql", "postgres"];

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "mssql" | "sqlserver" => Some(EngineKind::Mssql),
            "postgres" | "postgresql" => Some(EngineKind::Postgres),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            EngineKind::Mssql => "mssql",
            EngineKind::Postgres => "postgres",
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
pub(crate) mod tests_support {
    use std::time::Duration;

    use super::StoreSettings;
    use crate::secret::ConnectionString;

    /// Settings of an Eventuous store on SQL Server, for unit tests.
    pub(crate) fn mssql_settings(cs: &str) -> StoreSettings {
        StoreSettings {
            connection_string: ConnectionString::new(cs),
            schema: super::Ident::parse("eventuous").unwrap(),
            tombstone_stream: "__tombstones__".into(),
            tombstone_type: "$tombstone".into(),
            connect_timeout: Duration::from_millis(300),
            watermark_table: None,
            profile: super::profile::TableShape::eventuous(),
        }
    }

    /// A local server that is no database: it answers whatever it is sent
    /// with an HTTP 400. Its port, and the task to abort.
    pub(crate) async fn http_listener() -> (u16, tokio::task::JoinHandle<()>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut buf = [0u8; 512];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    .await;
            }
        });
        (port, task)
    }

    /// A local server that accepts connections and never says anything.
    /// Its port, and the task to abort.
    pub(crate) async fn silent_listener() -> (u16, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        (port, task)
    }
}
