//! The validated configuration (ripgrep's `HiArgs`): the daemon's settings
//! and the stores it heals, each built in one conversion (`from_keys`) from
//! its keys as read ([`super::read`]) and, for a store, what the rules that
//! span keys made of them ([`super::rules`]); and `--store` selection.

use std::net::SocketAddr;
use std::ops::Deref;
use std::time::Duration;

use crate::engine::profile::ProfileKind;
use crate::engine::{EngineKind, StoreSettings};
use crate::secret::ConnectionString;

use super::name::StoreName;
use super::parse::closest;
use super::problem::{ConfigError, Problem};
use super::read::{DaemonKeys, LogFormat, StartFrom, StoreKeys};
use super::rules::Resolved;

/// The daemon-wide keys ([`super::keys::Scope::Daemon`]).
#[derive(Clone, Debug)]
pub struct DaemonSettings {
    pub metrics_addr: SocketAddr,
    /// How often [`StoreSet`]s are listed again.
    pub discover_interval: Duration,
    /// This replica's name; `None`: [`crate::replicas::Replica::default_name`].
    pub replica: Option<String>,
    pub log_format: LogFormat,
    pub log_level: String,
}

/// The keys of one store ([`super::keys::Scope::Store`]): what one healer of one store
/// needs. A `[[stores]]` list would hold one of these per store, each
/// starting from the top-level values.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub engine: EngineKind,
    /// What the engine needs: connection string, schema, tombstone names,
    /// connect timeout.
    pub store: StoreSettings,
    pub gap_timeout: Duration,
    pub poll_interval: Duration,
    pub lock_timeout: Duration,
    pub start_from: StartFrom,
    pub lookback: u64,
    pub scan_page_size: u32,
    pub dry_run: bool,
    /// Whether a healer of this store takes its leader lock before filling,
    /// and the lock's name.
    pub election: Election,
    /// `run` gives up (exit 3) once its scans have failed this long in a row;
    /// `None`: never.
    pub give_up_after: Option<Duration>,
    /// The leader lock's name, as given or derived from the table
    /// (`gap-healer:<schema>`, or `gap-healer:<schema>.<table>` for a table
    /// profile): what `election` takes when on, and what `config` shows
    /// also when it is off.
    pub leader_key: String,
}

/// Whether a healer takes the store's leader lock before it fills.
///
/// Invariant: a lock name exists exactly when there is an election, so no
/// code can take a lock that is switched off or run one without a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Election {
    /// `leader_election = false`: this process is the store's only healer
    /// and fills without a lock.
    Off,
    /// Healers sharing `key` elect one filler.
    On {
        /// The leader lock's name (an advisory lock key on PostgreSQL, an
        /// application lock resource on SQL Server; both are per database).
        key: String,
    },
}

impl Election {
    pub fn is_on(&self) -> bool {
        matches!(self, Election::On { .. })
    }

    /// The leader lock's name; `None` when the election is off.
    pub fn key(&self) -> Option<&str> {
        match self {
            Election::Off => None,
            Election::On { key } => Some(key),
        }
    }
}

impl DaemonSettings {
    /// The daemon's settings from its keys as read (ripgrep's
    /// `HiArgs::from_low_args`); `None`: a key has no valid value (its
    /// problem is said already).
    pub(super) fn from_keys(k: &DaemonKeys) -> Option<DaemonSettings> {
        Some(DaemonSettings {
            metrics_addr: k.metrics_addr.get()?,
            discover_interval: k.discover_interval.get()?,
            replica: k.replica.get()?,
            log_format: k.log_format.get()?,
            log_level: k.log_level.get()?,
        })
    }
}

impl StoreConfig {
    /// A store's settings from its keys as read and what the rules that
    /// span keys made of them (ripgrep's `HiArgs::from_low_args`); `None`:
    /// a key has no valid value (its problem is said already).
    pub(super) fn from_keys(k: &StoreKeys, r: Resolved) -> Option<StoreConfig> {
        let election = match k.leader_election.get()? {
            false => Election::Off,
            true => Election::On {
                key: r.leader_key.clone(),
            },
        };
        Some(StoreConfig {
            engine: k.engine.get()?,
            store: StoreSettings {
                connection_string: r.connection_string,
                schema: k.schema.get()?,
                tombstone_stream: r.tombstone_stream,
                tombstone_type: r.tombstone_type,
                connect_timeout: k.connect_timeout.get()?,
                watermark_table: k.watermark_table.get()?,
                profile: r.profile,
            },
            gap_timeout: k.gap_timeout.get()?,
            poll_interval: k.poll_interval.get()?,
            lock_timeout: k.lock_timeout.get()?,
            start_from: k.start_from.get()?,
            lookback: k.lookback.get()?,
            scan_page_size: k.scan_page_size.get()?,
            dry_run: k.dry_run.get()?,
            election,
            give_up_after: k.give_up_after.get()?,
            leader_key: r.leader_key,
        })
    }

    /// `value` quoted, or nothing for the custom profile (which does not
    /// read the tombstone names: its `columns` say it all).
    pub(crate) fn unless_custom(&self, value: &str) -> String {
        match self.store.profile.kind {
            ProfileKind::Custom => String::new(),
            _ => toml::Value::String(value.to_string()).to_string(),
        }
    }
}

/// One store to heal: its name, its keys, and where each came from.
#[derive(Clone, Debug)]
pub struct Store {
    /// `default`, the name of its `[[stores]]` entry, or `<set>/<database>`.
    pub name: StoreName,
    pub config: StoreConfig,
    /// Where each of its keys' values came from, for `gap-healer config`.
    pub origins: Vec<(&'static str, String)>,
}

/// A store's keys read as `store.gap_timeout`.
impl Deref for Store {
    type Target = StoreConfig;

    fn deref(&self) -> &StoreConfig {
        &self.config
    }
}

/// A `[[store_sets]]` entry: every database of one server whose name is
/// `LIKE` the pattern is a store `<set>/<database>`, configured as the
/// template with `{database}` in its connection string replaced.
#[derive(Clone, Debug)]
pub struct StoreSet {
    pub name: StoreName,
    /// A `LIKE` pattern over `pg_database` / `sys.databases`.
    pub databases: String,
    /// The stores' keys; its connection string holds `{database}`.
    pub template: Store,
}

/// The placeholder of a [`StoreSet`]'s connection string.
pub const DATABASE_PLACEHOLDER: &str = "{database}";

impl StoreSet {
    /// The store `<set>/<database>`, or `None` when the database's name
    /// cannot go into a connection string and a store name as it is
    /// ([`StoreName::in_set`]).
    pub fn store(&self, database: &str) -> Option<Store> {
        let name = StoreName::in_set(&self.name, database)?;
        Some(Store {
            name,
            config: self.on_database(database),
            ..self.template.clone()
        })
    }

    /// The template's keys with `database` in its connection string (the
    /// catalog database's, to list the others).
    pub fn on_database(&self, database: &str) -> StoreConfig {
        let mut config = self.template.config.clone();
        let cs = config
            .store
            .connection_string
            .expose()
            .replace(DATABASE_PLACEHOLDER, database);
        config.store.connection_string = ConnectionString::new(cs);
        config
    }
}

/// The validated configuration: the daemon's keys and the stores it heals.
#[derive(Clone, Debug)]
pub struct Settings {
    pub daemon: DaemonSettings,
    /// Where each daemon key's value came from.
    pub daemon_origins: Vec<(&'static str, String)>,
    /// In the file's order; at least one unless there are store sets.
    pub stores: Vec<Store>,
    /// The `[[store_sets]]` entries, each discovered at run time.
    pub sets: Vec<StoreSet>,
    /// The `--store` names ([`Settings::select`]); empty: every store.
    pub selected: Vec<String>,
    /// The stores came from `[[stores]]` or `[[store_sets]]` entries (else
    /// one [`super::DEFAULT_STORE`]).
    pub fleet: bool,
}

impl Settings {
    /// Keeps only the stores named (`--store`): a store, a store set (all of
    /// its databases) or one database of a set (`<set>/<database>`, kept
    /// for [`Settings::selects`] once discovered).
    pub fn select(&mut self, names: &[String]) -> Result<(), ConfigError> {
        if names.is_empty() {
            return Ok(());
        }
        let known: Vec<&str> = self
            .stores
            .iter()
            .map(|s| s.name.as_str())
            .chain(self.sets.iter().map(|s| s.name.as_str()))
            .collect();
        let is_known = |n: &str| {
            known.contains(&n)
                || n.split_once('/')
                    .is_some_and(|(set, _)| self.sets.iter().any(|s| s.name == set))
        };
        let problems: Vec<Problem> = names
            .iter()
            .filter(|n| !is_known(n))
            .map(|n| Problem {
                key: "store".into(),
                value: Some(n.clone()),
                origin: "flag --store".into(),
                message: match closest(n, known.iter().copied(), 3) {
                    Some(s) => format!(
                        "no such store (did you mean `{s}`?); stores: {}",
                        known.join(", ")
                    ),
                    None => format!("no such store; stores: {}", known.join(", ")),
                },
                store: None,
            })
            .collect();
        if !problems.is_empty() {
            return Err(ConfigError { problems });
        }
        self.stores
            .retain(|s| names.iter().any(|n| s.name == n.as_str()));
        self.sets.retain(|set| {
            names.iter().any(|n| {
                set.name == n.as_str() || n.split_once('/').is_some_and(|(s, _)| set.name == s)
            })
        });
        self.selected = names.to_vec();
        Ok(())
    }

    /// Whether a discovered store `<set>/<database>` is selected.
    pub fn selects(&self, store: &StoreName) -> bool {
        let store = store.as_str();
        self.selected.is_empty()
            || self
                .selected
                .iter()
                .any(|n| n == store || store.split_once('/').is_some_and(|(set, _)| set == n))
    }
}
