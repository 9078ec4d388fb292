//! Engines opened in one place: from an [`EngineKind`], a store's
//! settings and what the stores of a daemon share ([`Pools`]) to the
//! engine and its leader lock, and every other answer that depends on the
//! kind (the setup script, the connection string check, the catalog
//! database, the database listing).
//!
//! # Why a visitor, not an enum of engines
//! The healer, the election and the one-shot commands are generic over
//! `E: Engine` and `L: LeaderLock`, whose futures are `impl Future`
//! (not dyn-compatible). An `AnyEngine` enum would put a `match` into
//! every call of the loop, and an enum of sessions beside it; instead the
//! caller says what to do with whichever engine is opened, as a value
//! with a generic method ([`WithEngine`]), and the factory calls it with
//! the concrete pair. So each engine's code is compiled for it alone, as
//! before, and the only `match` on the kind is [`EngineKind::for_engine`]
//! (a job generic over the engine's type, [`ForEngine`]), here.
//!
//! What an engine must say to be opened is [`Openable`]: how it shares a
//! pool ([`Openable::engine_for`]), which leader lock its stores get (PostgreSQL: one lock session
//! for every store of a database, [`SharedLock`]; SQL Server: the engine's
//! own, since its fence is a lock of the session's own), and its answers
//! that need no store.
//!
//! Invariant: outside this module nothing names an engine's type to build
//! it or matches on the kind; a store's engine and lock come from [`open`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::mssql::{self, MssqlEngine};
use super::postgres::{self, PostgresEngine};
use super::shared_lock::SharedLock;
use super::{profile, DbResult, Engine, EngineKind, LeaderLock, StoreSettings, HEALER_ROLE};
use crate::secret::ConnectionString;

/// What the stores of a daemon share, by engine: stores of one database
/// (the same connection string and connect timeout) share one pool and
/// whatever else their engine shares (PostgreSQL: the head readings and
/// the leader lock session). Each part is held weakly: it goes when its
/// last store does.
#[derive(Default)]
pub struct Pools {
    postgres: postgres::Sharing,
    mssql: mssql::Sharing,
}

impl Pools {
    /// Distinct pools alive now.
    pub fn len(&self) -> usize {
        self.postgres.pools() + self.mssql.pools()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A store's engine and the leader lock its election tries, as the
/// factory opened them.
pub struct Opened<E, L> {
    pub engine: Arc<E>,
    /// The engine itself, or a lock session it shares with the other
    /// stores of its database.
    pub lock: Arc<L>,
}

/// What to do with a store's engine once it is opened, whichever it is:
/// the one generic step after the factory's dispatch.
pub trait WithEngine {
    type Output;

    fn with<E: Engine, L: LeaderLock>(self, opened: Opened<E, L>) -> Self::Output;
}

/// An engine the factory can open, and its answers that need no store.
pub trait Openable: Engine + Sized {
    /// The lock its stores' elections try.
    type Lock: LeaderLock;

    /// The database every server of the engine has, to list the others from.
    const CATALOG_DATABASE: &'static str;

    /// Whether it heals the table profiles (`ledger-core`, `sqlstreamstore`,
    /// `custom`), not only Eventuous's tables.
    const TABLE_PROFILES: bool;

    /// The engine for `store`, sharing `pools` with the other stores of
    /// its database. Connects lazily.
    fn engine_for(store: &StoreSettings, pools: &Pools) -> DbResult<Self>;

    /// The leader lock of `engine`'s store.
    fn leader_lock(engine: &Arc<Self>, store: &StoreSettings, pools: &Pools) -> Arc<Self::Lock>;

    /// What `gap-healer sql` prints for `store`, granting to
    /// `HEALER_ROLE`.
    fn setup_script(store: &StoreSettings) -> String;

    /// `role` quoted for the engine; without one, a placeholder no server
    /// runs as it stands.
    fn grantee(role: Option<&str>) -> String;

    /// The engine's own parser's verdict on `cs`: its words, key names of
    /// its tables and positions, never text of the string.
    fn check_connection_string(cs: &ConnectionString) -> Result<(), String>;

    /// The server's databases whose names are `LIKE` `pattern`.
    fn list_databases(&self, pattern: &str) -> impl Future<Output = DbResult<Vec<String>>> + Send;
}

/// A job generic over the engine's type, run for the type a kind names
/// ([`EngineKind::for_engine`]).
pub trait ForEngine {
    type Output;

    fn run<E: Openable>(self) -> Self::Output;
}

impl EngineKind {
    /// Runs `job` for this kind's engine: the crate's one match on the kind.
    pub fn for_engine<J: ForEngine>(self, job: J) -> J::Output {
        match self {
            EngineKind::Postgres => job.run::<PostgresEngine>(),
            EngineKind::Mssql => job.run::<MssqlEngine>(),
        }
    }
}

/// Opens `store`'s engine of `kind` and its leader lock, sharing `pools`,
/// and hands both to `then`. Connects lazily: nothing is sent to the
/// server until the first query.
pub fn open<W: WithEngine>(
    kind: EngineKind,
    store: &StoreSettings,
    pools: &Pools,
    then: W,
) -> DbResult<W::Output> {
    struct Open<'a, W> {
        store: &'a StoreSettings,
        pools: &'a Pools,
        then: W,
    }
    impl<W: WithEngine> ForEngine for Open<'_, W> {
        type Output = DbResult<W::Output>;
        fn run<E: Openable>(self) -> Self::Output {
            let engine = Arc::new(E::engine_for(self.store, self.pools)?);
            let lock = E::leader_lock(&engine, self.store, self.pools);
            Ok(self.then.with(Opened { engine, lock }))
        }
    }
    kind.for_engine(Open { store, pools, then })
}

/// What `gap-healer sql` prints for a store of `kind`, granting to `role`
/// (quoted for the engine; without one, the placeholder `<healer_role>`,
/// which no server runs as it stands and which cannot be mistaken for a
/// schema or table name when replaced).
/// SQL Server's fill procedure is fixed to the configured tombstone stream
/// and type, so an EXECUTE-only login cannot write into other streams.
pub fn setup_sql(kind: EngineKind, store: &StoreSettings, role: Option<&str>) -> String {
    struct Setup<'a> {
        store: &'a StoreSettings,
        role: Option<&'a str>,
    }
    impl ForEngine for Setup<'_> {
        type Output = String;
        fn run<E: Openable>(self) -> String {
            E::setup_script(self.store).replace(HEALER_ROLE, &E::grantee(self.role))
        }
    }
    kind.for_engine(Setup { store, role })
}

/// Checks a connection string with the engine's own parser, before anything
/// connects. The message is the parser's own words (key names of its tables,
/// positions), never text of the string, so nothing needs masking in it.
pub fn check_connection_string(kind: EngineKind, cs: &ConnectionString) -> Result<(), String> {
    struct Parse<'a>(&'a ConnectionString);
    impl ForEngine for Parse<'_> {
        type Output = Result<(), String>;
        fn run<E: Openable>(self) -> Self::Output {
            E::check_connection_string(self.0)
        }
    }
    kind.for_engine(Parse(cs))
}

/// The database a server of `kind` always has, to list the others from.
pub fn catalog_database(kind: EngineKind) -> &'static str {
    struct Name;
    impl ForEngine for Name {
        type Output = &'static str;
        fn run<E: Openable>(self) -> &'static str {
            E::CATALOG_DATABASE
        }
    }
    kind.for_engine(Name)
}

/// Whether the engine of `kind` heals the table profiles.
pub fn heals_table_profiles(kind: EngineKind) -> bool {
    struct Tables;
    impl ForEngine for Tables {
        type Output = bool;
        fn run<E: Openable>(self) -> bool {
            E::TABLE_PROFILES
        }
    }
    kind.for_engine(Tables)
}

/// A server's list of databases, asked on its catalog database through an
/// engine opened once: a store set keeps one for all its discovery
/// passes, so each pass reuses its engine and pool.
pub struct Catalog {
    lister: Box<dyn ListDatabases>,
}

impl Catalog {
    /// The catalog reached with `store` (the settings of a store on the
    /// [`catalog_database`]), sharing `pools`. Connects lazily.
    pub fn open(kind: EngineKind, store: &StoreSettings, pools: &Pools) -> DbResult<Catalog> {
        struct Lister<'a> {
            store: &'a StoreSettings,
            pools: &'a Pools,
        }
        impl ForEngine for Lister<'_> {
            type Output = DbResult<Box<dyn ListDatabases>>;
            fn run<E: Openable>(self) -> Self::Output {
                Ok(Box::new(E::engine_for(self.store, self.pools)?))
            }
        }
        Ok(Catalog {
            lister: kind.for_engine(Lister { store, pools })?,
        })
    }

    /// The databases whose names are `LIKE` `pattern`.
    pub async fn list(&self, pattern: &str) -> DbResult<Vec<String>> {
        self.lister.list(pattern).await
    }
}

/// [`Openable::list_databases`] behind a pointer, for [`Catalog`]: one
/// listing per discovery pass is worth a boxed future.
trait ListDatabases: Send + Sync {
    fn list<'a>(
        &'a self,
        pattern: &'a str,
    ) -> Pin<Box<dyn Future<Output = DbResult<Vec<String>>> + Send + 'a>>;
}

impl<E: Openable> ListDatabases for E {
    fn list<'a>(
        &'a self,
        pattern: &'a str,
    ) -> Pin<Box<dyn Future<Output = DbResult<Vec<String>>> + Send + 'a>> {
        Box::pin(self.list_databases(pattern))
    }
}

impl Openable for PostgresEngine {
    /// Advisory locks are per session and re-entrant: the stores of one
    /// database share one lock session, each with its own lock on it.
    type Lock = SharedLock<PostgresEngine>;
    const CATALOG_DATABASE: &'static str = "postgres";
    const TABLE_PROFILES: bool = true;

    fn engine_for(store: &StoreSettings, pools: &Pools) -> DbResult<Self> {
        PostgresEngine::sharing(store, &pools.postgres)
    }

    fn leader_lock(engine: &Arc<Self>, store: &StoreSettings, pools: &Pools) -> Arc<Self::Lock> {
        pools.postgres.leader_lock(engine, store)
    }

    fn setup_script(store: &StoreSettings) -> String {
        let mut sql = postgres::setup_sql(&store.schema, &store.profile);
        if let Some(table) = &store.watermark_table {
            sql += &postgres::watermark_sql(table);
        }
        sql
    }

    fn grantee(role: Option<&str>) -> String {
        role.map_or_else(|| "<healer_role>".to_string(), postgres::quote_role)
    }

    fn check_connection_string(cs: &ConnectionString) -> Result<(), String> {
        postgres::tls::parse(cs.expose())
            .map(|_| ())
            .map_err(|e| postgres::tls::refusal(&e))
    }

    async fn list_databases(&self, pattern: &str) -> DbResult<Vec<String>> {
        PostgresEngine::list_databases(self, pattern).await
    }
}

impl Openable for MssqlEngine {
    /// The stores of one instance (any database) share one lock session,
    /// each with its own lock (and fence) in its database on it.
    type Lock = mssql::MssqlStoreLock;
    const CATALOG_DATABASE: &'static str = "master";
    /// `custom` and `sqlstreamstore` (ledger-core's table is PostgreSQL's).
    const TABLE_PROFILES: bool = true;

    fn engine_for(store: &StoreSettings, pools: &Pools) -> DbResult<Self> {
        MssqlEngine::sharing(store, &pools.mssql)
    }

    fn leader_lock(engine: &Arc<Self>, store: &StoreSettings, pools: &Pools) -> Arc<Self::Lock> {
        pools.mssql.leader_lock(engine, store)
    }

    fn setup_script(store: &StoreSettings) -> String {
        let mut sql = match store.profile.tombstone {
            profile::Tombstone::EventuousStream => mssql::setup_sql_for(
                &store.schema,
                &store.tombstone_stream,
                &store.tombstone_type,
            ),
            _ => mssql::table_setup_sql(&store.schema, &store.profile),
        };
        if let Some(table) = &store.watermark_table {
            sql += &mssql::watermark_sql(table);
        }
        sql
    }

    fn grantee(role: Option<&str>) -> String {
        role.map_or_else(|| "[<healer_role>]".to_string(), mssql::quote_ident)
    }

    fn check_connection_string(cs: &ConnectionString) -> Result<(), String> {
        mssql::check_connection_string(cs)
    }

    async fn list_databases(&self, pattern: &str) -> DbResult<Vec<String>> {
        MssqlEngine::list_databases(self, pattern).await
    }
}

#[cfg(test)]
mod secrecy;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::tests_support::mssql_settings;

    fn postgres_settings(cs: &str) -> StoreSettings {
        StoreSettings {
            connection_string: ConnectionString::new(cs),
            ..mssql_settings("")
        }
    }

    /// Counts the stores the factory hands over, and which locks they got.
    struct Locks<'a>(&'a mut Vec<usize>);

    impl WithEngine for Locks<'_> {
        type Output = Arc<dyn std::any::Any + Send + Sync>;
        fn with<E: Engine, L: LeaderLock>(self, opened: Opened<E, L>) -> Self::Output {
            self.0.push(Arc::as_ptr(&opened.lock) as *const () as usize);
            opened.lock
        }
    }

    /// PostgreSQL stores of one database share their pool and their lock
    /// session; SQL Server stores of one database share the pool, and the
    /// stores of one instance (any database) one lock session, each store
    /// with its own part of it.
    #[tokio::test]
    async fn stores_of_one_database_share_what_their_engine_shares() {
        let pools = Pools::default();
        let mut seen = Vec::new();
        let pg = postgres_settings("host=127.0.0.1 port=1 user=app dbname=es");
        let a = open(EngineKind::Postgres, &pg, &pools, Locks(&mut seen)).unwrap();
        let b = open(EngineKind::Postgres, &pg, &pools, Locks(&mut seen)).unwrap();
        assert_eq!(pools.len(), 1);
        assert_eq!(seen[0], seen[1], "one lock session for both");
        let ms = mssql_settings("Server=tcp:127.0.0.1,1;User Id=app;Password=x");
        let c = open(EngineKind::Mssql, &ms, &pools, Locks(&mut seen)).unwrap();
        let d = open(EngineKind::Mssql, &ms, &pools, Locks(&mut seen)).unwrap();
        assert_eq!(pools.len(), 2);
        assert_ne!(seen[2], seen[3], "a part each");
        let other_database =
            mssql_settings("Server=tcp:127.0.0.1,1;User Id=app;Password=x;Database=t2");
        let e = open(EngineKind::Mssql, &other_database, &pools, Locks(&mut seen)).unwrap();
        assert_eq!(pools.len(), 3, "a pool for the other database");
        assert_eq!(
            pools.mssql.lock_sessions(),
            1,
            "one lock session for the instance"
        );
        let other_server = mssql_settings("Server=tcp:127.0.0.2,1;User Id=app;Password=x");
        let f = open(EngineKind::Mssql, &other_server, &pools, Locks(&mut seen)).unwrap();
        assert_eq!(pools.mssql.lock_sessions(), 2, "another for another server");
        drop((a, b, c, d, e, f));
        assert!(pools.is_empty(), "a pool goes with its last store");
        assert_eq!(
            pools.mssql.lock_sessions(),
            0,
            "and a lock session with its last store"
        );
    }

    #[test]
    fn the_kind_answers_come_from_its_engine() {
        assert_eq!(catalog_database(EngineKind::Postgres), "postgres");
        assert_eq!(catalog_database(EngineKind::Mssql), "master");
        assert!(heals_table_profiles(EngineKind::Postgres));
        assert!(heals_table_profiles(EngineKind::Mssql));
        let bad = ConnectionString::new("Server=db;User Id=app;Password='Hunter2");
        let err = check_connection_string(EngineKind::Mssql, &bad).unwrap_err();
        assert!(!err.contains("Hunter2"), "{err}");
        let store = mssql_settings("Server=db;User Id=app;Password=x");
        let sql = setup_sql(EngineKind::Mssql, &store, Some("healer"));
        assert!(sql.contains("TO [healer]"), "{sql}");
        let sql = setup_sql(EngineKind::Postgres, &store, None);
        assert!(sql.contains("<healer_role>") && !sql.contains(HEALER_ROLE));
    }
}
