//! Many stores in one daemon: one healer per store, each with its own
//! engine, leader election, backoff, health and metrics, all on one runtime
//! and one metrics endpoint.
//!
//! Stores that connect with the same connection string share one pool
//! ([`Pools`]) and, on PostgreSQL, one leader lock session
//! ([`SharedLock`]: each store keeps its own lock on it), so 500 stores
//! (schemas) in one database need a few sessions, not 500 times as many.
//!
//! Architecture invariants:
//! - A store's failure (down, login refused, wrong shape, gave up) stays in
//!   that store's task, health and series: no store waits for another, and
//!   the daemon ends only when told to stop or when every store gave up.
//! - Every log line of a store's task is inside a `store` span naming it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, Instrument};

use crate::config::Store;
use crate::engine::mssql::MssqlEngine;
use crate::engine::postgres::PostgresEngine;
use crate::engine::{DbResult, Engine, EngineKind, LeaderLock, Pools};
use crate::healer::{Ended, Healer, Options};
use crate::leader::{self, Leader, SharedLock};
use crate::telemetry::{self, Board, Health};

type StoreTask = Pin<Box<dyn Future<Output = Ended> + Send>>;

/// Heals every store until `stop`, reporting each into `board`. Returns
/// [`Ended::GaveUp`] only when every store gave up (`give_up_after`).
pub async fn run(stores: &[Store], board: Arc<Board>, stop: CancellationToken) -> Ended {
    let pools = Pools::default();
    let mut locks = HashMap::new();
    let mut tasks = JoinSet::new();
    // Every engine is made before any task runs, so a shared pool knows how
    // many stores share it before it first connects.
    let mut ready = Vec::new();
    for store in stores {
        let health = Health::for_store(&store.name, store.poll_interval, store.lock_timeout);
        telemetry::register_store(&store.name);
        board.add(health.clone());
        match start(store, &pools, &mut locks, health.clone(), stop.clone()) {
            Ok(task) => ready.push((store.name.clone(), task)),
            Err(e) => {
                error!(store = %store.name, error = %e, "cannot heal this store");
                health.scan_failed(&e.message);
            }
        }
    }
    info!(
        stores = stores.len(),
        pools = pools.postgres.len() + pools.mssql.len(),
        "healing {} store(s)",
        stores.len()
    );
    for (name, task) in ready {
        tasks.spawn(task.instrument(tracing::info_span!("store", store = %name)));
    }
    let mut gave_up = Vec::new();
    let mut stopped = 0;
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(Ended::GaveUp { failing_for }) => gave_up.push(failing_for),
            Ok(Ended::Stopped) => stopped += 1,
            Err(e) => {
                error!(error = %e, "a store's task failed");
                stopped += 1;
            }
        }
    }
    match gave_up.iter().max() {
        Some(longest) if stopped == 0 => Ended::GaveUp {
            failing_for: *longest,
        },
        _ => Ended::Stopped,
    }
}

/// The task that heals `store`, on an engine of its kind.
/// The PostgreSQL leader lock sessions, by connection string.
type PgLocks = HashMap<String, Arc<SharedLock<PostgresEngine>>>;

/// The task that heals `store`, on an engine of its kind.
fn start(
    store: &Store,
    pools: &Pools,
    locks: &mut PgLocks,
    health: Arc<Health>,
    stop: CancellationToken,
) -> DbResult<StoreTask> {
    let store = store.clone();
    Ok(match store.engine {
        EngineKind::Postgres => {
            let engine = Arc::new(PostgresEngine::sharing(&store.store, &pools.postgres)?);
            let key = format!(
                "{:?}\n{}",
                store.store.connect_timeout,
                store.store.connection_string.expose()
            );
            let lock = locks
                .entry(key)
                .or_insert_with(|| SharedLock::new(engine.clone()))
                .clone();
            Box::pin(heal(engine, lock, store, health, stop))
        }
        EngineKind::Mssql => {
            // SQL Server keeps a session per store: its fence is a lock of
            // the session's own, and Babelfish refuses reuse after a refusal.
            let engine = Arc::new(MssqlEngine::sharing(&store.store, &pools.mssql)?);
            Box::pin(heal(engine.clone(), engine, store, health, stop))
        }
    })
}

/// One store's healer and, unless turned off, its leader election.
async fn heal<E: Engine, L: LeaderLock>(
    engine: Arc<E>,
    lock: Arc<L>,
    store: Store,
    health: Arc<Health>,
    stop: CancellationToken,
) -> Ended {
    info!(
        engine = %store.engine,
        schema = %store.store.schema,
        gap_timeout = %humantime::format_duration(store.gap_timeout),
        poll_interval = %humantime::format_duration(store.poll_interval),
        dry_run = store.dry_run,
        "healing store {}",
        store.name
    );
    // The election ends with the healer, whether stopped or given up.
    let own = stop.child_token();
    let (leader, election) = if store.leader_election {
        let (tx, leader) = Leader::channel();
        let election = tokio::spawn(
            leader::elect(
                lock,
                store.leader_key.clone(),
                store.name.clone(),
                tx,
                own.clone(),
            )
            .in_current_span(),
        );
        (leader, Some(election))
    } else {
        info!("leader election off: this process fills as the only healer of the store");
        (Leader::always(), None)
    };
    let ended = Healer::new(engine, Options::from(&store), leader, health)
        .run(stop)
        .await;
    own.cancel();
    if let Some(election) = election {
        let _ = tokio::time::timeout(Duration::from_millis(200), election).await;
    }
    ended
}
