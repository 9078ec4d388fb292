//! Many stores in one daemon: one healer per store, each with its own
//! engine, leader election, backoff, health and metrics, all on one runtime
//! and one metrics endpoint.
//!
//! Stores that connect with the same connection string share one pool
//! ([`Pools`]) and whatever else their engine shares (PostgreSQL: one
//! leader lock session, on which each store keeps its own lock), so 500
//! stores (schemas) in one database need a few sessions, not 500 times as
//! many. Engines and their locks come from [`engine::open()`]; a store set
//! keeps the [`Catalog`] it lists its databases from.
//!
//! Architecture invariants:
//! - A store's failure (down, login refused, wrong shape, gave up) stays in
//!   that store's task, health and series: no store waits for another, and
//!   the daemon ends only when told to stop or when every store gave up.
//! - Every log line of a store's task is inside a `store` span naming it.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn, Instrument};

use crate::config::{Election, Settings, Store, StoreName, StoreSet};
use crate::engine::{self, Catalog, DbResult, Engine, LeaderLock, Opened, Pools, WithEngine};
use crate::healer::{Ended, Healer, Options};
use crate::leader::{self, Leader};
use crate::replicas::{self, Replica};
use crate::telemetry::{self, Board, Health};

/// A store's task: it ends with the store it healed, and how.
type StoreTask = Pin<Box<dyn Future<Output = (Store, Ended)> + Send>>;

/// The stores being healed, by name, and their tasks.
struct Running {
    pools: Pools,
    /// Each store set's catalog, by set name, opened at its first pass.
    catalogs: Catalogs,
    board: Arc<Board>,
    /// This replica, as the roll of each database knows it.
    replica: Replica,
    /// Each store's own stop, to stop a store whose database vanished.
    stops: HashMap<StoreName, CancellationToken>,
    tasks: JoinSet<(Store, Ended)>,
}

impl Running {
    /// Starts healing `store` (once).
    fn start(&mut self, store: &Store, stop: &CancellationToken) {
        if self.stops.contains_key(&store.name) {
            return;
        }
        let health = Health::for_store(&store.name, store.poll_interval, store.lock_timeout);
        health.dry_run(store.dry_run);
        self.board.add(health.clone());
        let own = stop.child_token();
        let task = HealTask {
            store: store.clone(),
            replica: self.replica,
            health: health.clone(),
            stop: own.clone(),
        };
        match engine::open(store.engine, &store.store, &self.pools, task) {
            Ok(task) => {
                let span = tracing::info_span!("store", store = %store.name);
                self.tasks.spawn(task.instrument(span));
                self.stops.insert(store.name.clone(), own);
            }
            Err(e) => {
                error!(store = %store.name, error = %e, "cannot heal this store");
                health.scan_failed(&e.message);
            }
        }
    }

    /// Stops healing `name` and forgets its health; its series leave the
    /// scrape once idle ([`telemetry::retire_after`]).
    fn stop(&mut self, name: &StoreName) {
        if let Some(own) = self.stops.remove(name) {
            own.cancel();
        }
        self.board.remove(name);
    }

    /// Lists `set`'s databases and starts or stops its stores to match.
    async fn discover(&mut self, settings: &Settings, set: &StoreSet, stop: &CancellationToken) {
        let wanted = match set_stores(settings, set, &mut self.catalogs, &self.pools).await {
            Ok(wanted) => wanted,
            Err(e) => {
                telemetry::discovery_errors(set.name.as_str()).increment(1);
                warn!(set = %set.name, error = %e, "cannot list the databases of this store set; keeping its stores as they are");
                return;
            }
        };
        debug!(set = %set.name, databases = wanted.len(), pools = self.pools.len(), "listed the databases of this store set");
        let gone: Vec<StoreName> = self
            .stops
            .keys()
            .filter(|n| n.is_in(&set.name) && !wanted.iter().any(|w| &w.name == *n))
            .cloned()
            .collect();
        for name in gone {
            info!(store = %name, "its database is gone: no longer healed");
            self.stop(&name);
        }
        for store in &wanted {
            if !self.stops.contains_key(&store.name) {
                info!(store = %store.name, "database found: healing it");
                self.start(store, stop);
            }
        }
    }
}

/// Heals every store and every store set's databases until `stop`,
/// reporting each into `board`; store sets are listed again every
/// `discover_interval`. Ends otherwise only when every store has ended and
/// there is no store set to find more: then with the first store that
/// refused its start ([`Outcome::StartAboveHead`], the store itself), else
/// [`Outcome::GaveUp`].
pub async fn run(settings: &Settings, board: Arc<Board>, stop: CancellationToken) -> Outcome {
    let name = settings
        .daemon
        .replica
        .clone()
        .unwrap_or_else(Replica::default_name);
    let roll = replicas::roll_of(
        settings
            .stores
            .iter()
            .map(|s| format!("store\n{}\n{:?}", s.name, s.election))
            .chain(
                settings
                    .sets
                    .iter()
                    .map(|s| format!("set\n{}\n{}", s.name, s.databases)),
            ),
    );
    let replica = Replica::named(&name).on_roll(roll);
    info!(replica = %replica, name = %name, "this daemon is replica {replica} ({name}) of the stores' healers");
    let mut running = Running::new(board, replica);
    let opened = running.begin(settings, &stop);
    let ends = running.heal_until_done(settings, &stop, opened).await;
    let stopped = stop.is_cancelled();
    while running.tasks.join_next().await.is_some() {}
    if stopped || !settings.sets.is_empty() {
        return Outcome::Stopped;
    }
    ends.daemon_ended()
}

/// How the daemon's stores ended: what [`run`] ends with.
#[derive(Debug)]
pub enum Outcome {
    /// Told to stop (with store sets, the only end).
    Stopped,
    /// Every store gave up, the longest after failing this long.
    GaveUp { failing_for: Duration },
    /// Every store ended, the first of them to end by refusing its start
    /// ([`Ended::StartAboveHead`]) this one.
    StartAboveHead(Box<Refused>),
}

/// A store that refused its start: its `start_from` lies above the head of
/// a table with events. The store is the one whose task ended so, as
/// configured (its values and their origins), never looked up by name.
#[derive(Debug)]
pub struct Refused {
    pub store: Store,
    /// Where the scan would have started.
    pub from: i64,
    /// The head of the store's table.
    pub head: i64,
}

impl Running {
    /// No store healed yet, reporting into `board`, as `replica`.
    fn new(board: Arc<Board>, replica: Replica) -> Self {
        Running {
            pools: Pools::default(),
            catalogs: HashMap::new(),
            board,
            replica,
            stops: HashMap::new(),
            tasks: JoinSet::new(),
        }
    }

    /// Starts the static stores and counts the sets' discovery errors from
    /// zero; true when the board is open already (no set to list first).
    fn begin(&mut self, settings: &Settings, stop: &CancellationToken) -> bool {
        // A set's discovery errors are counted from zero, and kept in the
        // scrape like the stores' series.
        for set in &settings.sets {
            let c = telemetry::discovery_errors(set.name.as_str());
            c.absolute(0);
            self.board.keep(c);
        }
        // Every static store's engine is made before any task runs, so a shared
        // pool knows how many stores share it before it first connects.
        for store in &settings.stores {
            self.start(store, stop);
        }
        // Readiness is the stores' once they are on the board (the static
        // ones now, a set's at its first listing): before, an empty board is
        // a daemon starting up, and /readyz says so (it said ready).
        let opened = settings.sets.is_empty();
        if opened {
            self.board.open();
        }
        info!(
            stores = settings.stores.len(),
            store_sets = settings.sets.len(),
            pools = self.pools.len(),
            "healing {} store(s) and {} store set(s)",
            settings.stores.len(),
            settings.sets.len()
        );
        opened
    }

    /// Discovers the store sets every `discover_interval` (opening the
    /// board after the first pass unless `opened`) and notes each store
    /// that ends on its own, until `stop` or until no store and no set is
    /// left.
    async fn heal_until_done(
        &mut self,
        settings: &Settings,
        stop: &CancellationToken,
        mut opened: bool,
    ) -> Ends {
        let mut ends = Ends::default();
        let mut next_discovery = tokio::time::Instant::now();
        loop {
            if self.tasks.is_empty() && settings.sets.is_empty() {
                break;
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep_until(next_discovery), if !settings.sets.is_empty() => {
                    for set in &settings.sets {
                        self.discover(settings, set, stop).await;
                    }
                    if !opened {
                        self.board.open();
                        opened = true;
                    }
                    next_discovery = tokio::time::Instant::now() + settings.daemon.discover_interval;
                }
                Some(done) = self.tasks.join_next() => self.ended(done, settings.sets.len(), &mut ends),
            }
        }
        ends
    }

    /// A store's task ended on its own (`done`), with `sets` store sets
    /// still discovered: noted in `ends`, or forgotten when it was stopped.
    fn ended(
        &mut self,
        done: Result<(Store, Ended), tokio::task::JoinError>,
        sets: usize,
        ends: &mut Ends,
    ) {
        match done {
            // Either stays on the board, failing, and is not restarted.
            Ok((store, Ended::GaveUp { failing_for })) => {
                let next = what_goes_on(self.tasks.len(), sets);
                error!(store = %store.name, "this store gave up; {next}");
                ends.gave_up.push(failing_for);
            }
            Ok((store, Ended::StartAboveHead { from, head })) => {
                let next = what_goes_on(self.tasks.len(), sets);
                error!(store = %store.name, "this store refused its start_from; {next}");
                ends.refused.get_or_insert(Refused { store, from, head });
            }
            Ok((store, Ended::Stopped)) => {
                self.stops.remove(&store.name);
            }
            Err(e) => error!(error = %e, "a store's task failed"),
        }
    }
}

/// How the stores that ended on their own ended: what the daemon ends
/// with once none is left.
#[derive(Default)]
struct Ends {
    /// How long each store that gave up had been failing.
    gave_up: Vec<Duration>,
    /// The first store that refused its start.
    refused: Option<Refused>,
}

impl Ends {
    /// The daemon's end once every store has ended: the first refused
    /// start, else the longest give-up, else stopped.
    fn daemon_ended(self) -> Outcome {
        match (self.refused, self.gave_up.iter().max()) {
            (Some(refused), _) => Outcome::StartAboveHead(Box::new(refused)),
            (None, Some(longest)) => Outcome::GaveUp {
                failing_for: *longest,
            },
            (None, None) => Outcome::Stopped,
        }
    }
}

/// What happens once a store has ended on its own, with `running` stores
/// still healed and `sets` store sets still discovered: the daemon ends
/// only when none of either is left.
fn what_goes_on(running: usize, sets: usize) -> String {
    match (running, sets) {
        (0, 0) => "no store is left to heal: the daemon exits".into(),
        (0, _) => "no store is left, but the store sets go on: their databases are listed again every discover_interval".into(),
        (1, _) => "the other store goes on".into(),
        (n, _) => format!("the {n} other stores go on"),
    }
}

/// The stores a one-shot command works on: the static ones and, listed
/// once, every store set's databases (as `--store` selects them), through
/// `pools`.
pub async fn expand(settings: &Settings, pools: &Pools) -> DbResult<Vec<Store>> {
    let mut stores = settings.stores.clone();
    let mut catalogs = Catalogs::new();
    for set in &settings.sets {
        stores.extend(set_stores(settings, set, &mut catalogs, pools).await?);
    }
    Ok(stores)
}

/// The store sets' catalogs, by set name: each opened once and kept, so
/// every discovery pass of a set lists on the same engine and pool.
type Catalogs = HashMap<StoreName, Catalog>;

/// `set`'s stores now: its databases listed (on its catalog in
/// `catalogs`, opened through `pools` at its first listing), those
/// `--store` selects.
async fn set_stores(
    settings: &Settings,
    set: &StoreSet,
    catalogs: &mut Catalogs,
    pools: &Pools,
) -> DbResult<Vec<Store>> {
    let catalog = match catalogs.entry(set.name.clone()) {
        Entry::Occupied(kept) => kept.into_mut(),
        Entry::Vacant(first) => {
            let kind = set.template.engine;
            let on = set.on_database(engine::catalog_database(kind));
            first.insert(Catalog::open(kind, &on.store, pools)?)
        }
    };
    let found = catalog.list(&set.databases).await?;
    let mut stores = Vec::new();
    for database in found {
        let Some(store) = set.store(&database) else {
            warn!(set = %set.name, database = %database, "skipping a database whose name is not [A-Za-z0-9_.-]{{1,63}}");
            continue;
        };
        if settings.selects(&store.name) {
            stores.push(store);
        }
    }
    Ok(stores)
}

/// The task that heals a store, on whichever engine [`engine::open()`]
/// opens for it.
struct HealTask {
    store: Store,
    replica: Replica,
    health: Arc<Health>,
    stop: CancellationToken,
}

impl WithEngine for HealTask {
    type Output = StoreTask;

    fn with<E: Engine, L: LeaderLock>(self, opened: Opened<E, L>) -> StoreTask {
        let Opened { engine, lock } = opened;
        Box::pin(heal(
            engine,
            lock,
            self.store,
            self.replica,
            self.health,
            self.stop,
        ))
    }
}

/// One store's healer and, unless turned off, its leader election; ends
/// with the store, and how its healer ended.
async fn heal<E: Engine, L: LeaderLock>(
    engine: Arc<E>,
    lock: Arc<L>,
    store: Store,
    replica: Replica,
    health: Arc<Health>,
    stop: CancellationToken,
) -> (Store, Ended) {
    info!(
        engine = %store.engine,
        schema = store.store.schema.as_str(),
        gap_timeout = %humantime::format_duration(store.gap_timeout),
        poll_interval = %humantime::format_duration(store.poll_interval),
        dry_run = store.dry_run,
        "healing store {}",
        store.name
    );
    // The election ends with the healer, whether stopped or given up.
    let (leader, election) = if store.dry_run {
        info!("dry run: not taking part in the leader election, so a healer that fills can lead");
        (Leader::never(), None)
    } else if let Election::On { key } = &store.election {
        let (tx, leader) = Leader::channel();
        let election =
            leader::Election::start(lock, key.clone(), replica, health.clone(), tx, &stop);
        (leader, Some(election))
    } else {
        info!("leader election off: this process fills as the only healer of the store");
        (Leader::always(), None)
    };
    let ended = Healer::new(engine, Options::from(&store), leader, health)
        .run(stop)
        .await;
    if let Some(election) = election {
        election.stop().await;
    }
    (store, ended)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_that_ends_says_what_goes_on() {
        assert_eq!(
            what_goes_on(0, 0),
            "no store is left to heal: the daemon exits"
        );
        assert_eq!(what_goes_on(1, 0), "the other store goes on");
        assert_eq!(what_goes_on(3, 1), "the 3 other stores go on");
        assert!(what_goes_on(0, 1).contains("store sets"));
    }
}
