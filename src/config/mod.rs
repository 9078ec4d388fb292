//! Configuration: defaults < config file < environment < flags, layered with
//! figment and validated once into [`Settings`].
//!
//! One table, [`KEYS`], describes every key; the flags ([`ConfigArgs`]), the
//! environment names, the file's known keys, the validation and the
//! `gap-healer config` output ([`Settings::to_toml`]) are all derived from it.
//! Keys are daemon-wide ([`DaemonSettings`]) or belong to the store healed
//! ([`StoreConfig`]).
//!
//! Every problem is collected before anything connects, each naming the key,
//! the offending value and where it came from; the caller exits 2.
//!
//! Architecture invariant: nothing outside this module reads the environment or
//! the config file, and nothing here ever prints a connection string unredacted.

mod args;
mod keys;
mod parse;
mod problem;
mod read;
mod rules;
mod settings;
mod show;
mod sources;

use figment::value::Value;
use figment::{Figment, Metadata, Profile, Source};

use crate::engine::EngineKind;
use crate::secret::ConnectionString;

pub use args::{not_read, ConfigArgs, Flags};
pub use keys::{commands, Field, Flag, Heading, Key, Scope, Unset, ENV_PREFIX, KEYS};
pub use parse::{parse_duration, parse_identifier, parse_store_name};
use problem::{said_once, Problems};
pub use problem::{ConfigError, Problem};
use read::Given;
pub use read::{LogFormat, StartFrom};
pub use rules::Need;
use rules::Rules;
pub use settings::{
    DaemonSettings, Election, Settings, Store, StoreConfig, StoreSet, DATABASE_PLACEHOLDER,
    DEFAULT_STORE,
};
use sources::Layer;

/// Keys that name one store's database objects: with `[[stores]]` in the
/// file, an environment variable or flag setting one for every store at once
/// is a mistake.
const PER_STORE_ONLY: &[&str] = &[
    "connection_string",
    "connection_string_file",
    "schema",
    "leader_key",
];

/// Loads and validates the configuration from the flags, the file they name,
/// and the given environment (pass `std::env::vars()`).
///
/// Layers, lowest first: the defaults, the file's top level, the store's
/// `[[stores]]` entry, the environment, the flags. Without `[[stores]]` the
/// top level defines one store, [`DEFAULT_STORE`].
pub fn load(
    args: &ConfigArgs,
    env: impl IntoIterator<Item = (String, String)>,
    need: Need,
) -> Result<Settings, ConfigError> {
    let mut problems = Vec::new();
    let mut file = args
        .config
        .as_deref()
        .and_then(|path| match sources::file(path) {
            Ok(mut f) => {
                problems.append(&mut f.problems);
                Some(f)
            }
            Err(p) => {
                problems.push(p);
                None
            }
        });
    let entries = file
        .as_mut()
        .map(|f| std::mem::take(&mut f.stores))
        .unwrap_or_default();
    let set_entries = file
        .as_mut()
        .map(|f| std::mem::take(&mut f.sets))
        .unwrap_or_default();
    let layers = Layers {
        file: file.map(|f| f.top),
        env: Layer::env(env),
        flags: Layer::flags(args),
    };
    let top = layers.figment(None);
    let mut v = Validator::new(&top, None);
    let mut keys = v.read_keys(Key::daemon);
    let daemon = DaemonSettings::from_keys(&keys).ok_or_else(|| unvalued(&mut keys, Key::daemon));
    let daemon = v.built(daemon);
    problems.append(&mut v.problems.list);
    let daemon_origins = v.origins;
    let fleet = !entries.is_empty() || !set_entries.is_empty();
    let (stores, sets) = if fleet {
        problems.extend(per_store_only_set_for_all(&layers.env, &layers.flags));
        let file_name = args.config.as_deref().unwrap_or(std::path::Path::new("?"));
        let entries = Entries {
            stores: &entries,
            sets: &set_entries,
            file: &file_name.display().to_string(),
        };
        entries.read(&layers, need, &mut problems)
    } else {
        let mut read = read_store(DEFAULT_STORE, &top, None, need);
        problems.append(&mut read.problems);
        (read.store.into_iter().collect(), Vec::new())
    };
    let unique = said_once(problems);
    match daemon {
        Some(daemon) if unique.is_empty() => Ok(Settings {
            daemon,
            daemon_origins,
            stores,
            sets,
            selected: Vec::new(),
            fleet,
        }),
        _ => Err(ConfigError { problems: unique }),
    }
}

/// The layers every store shares, lowest first after the defaults: the
/// file's top level, then (between it and these) a store's own entry, then
/// the environment and the flags.
struct Layers {
    file: Option<Figment>,
    env: Layer,
    flags: Layer,
}

impl Layers {
    /// The figment of one store: `entry` is its `[[stores]]` entry.
    fn figment(&self, entry: Option<&Layer>) -> Figment {
        let mut figment = Figment::new();
        if let Some(file) = &self.file {
            figment = figment.merge(file.clone());
        }
        if let Some(entry) = entry {
            figment = figment.merge(entry.clone());
        }
        figment.merge(self.env.clone()).merge(self.flags.clone())
    }
}

/// A fleet file's `[[stores]]` and `[[store_sets]]` entries.
struct Entries<'a> {
    stores: &'a [sources::StoreEntry],
    sets: &'a [sources::StoreEntry],
    /// The file's name, for origins.
    file: &'a str,
}

impl Entries<'_> {
    /// Each entry's store (or store set) over the shared layers; a problem
    /// of one entry goes to `problems` and the entry is left out.
    fn read(
        &self,
        layers: &Layers,
        need: Need,
        problems: &mut Vec<Problem>,
    ) -> (Vec<Store>, Vec<StoreSet>) {
        let mut stores = Vec::new();
        let mut sets = Vec::new();
        let mut claims = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (i, entry) in self.stores.iter().chain(self.sets).enumerate() {
            let is_set = i >= self.stores.len();
            let label = entry.name.clone().unwrap_or_else(|| format!("#{}", i + 1));
            let list = if is_set { "store_sets" } else { "stores" };
            let origin = format!("config file {}, [[{list}]] {label}", self.file);
            let name = match entry_name(entry, label, &origin, &mut seen) {
                Ok(name) => name,
                Err(problem) => {
                    problems.push(problem);
                    continue;
                }
            };
            let figment = layers.figment(Some(&entry.layer));
            let mut read = read_store(&name, &figment, Some(&name), need);
            problems.append(&mut read.problems);
            if !is_set {
                claims.extend(read.claim);
            }
            let Some(store) = read.store else { continue };
            if is_set {
                match store_set(name, entry, store, origin) {
                    Ok(set) => sets.push(set),
                    Err(mut found) => problems.append(&mut found),
                }
            } else {
                stores.push(store);
            }
        }
        problems.extend(shared_leader_locks(&claims));
        (stores, sets)
    }
}

/// With `[[stores]]` in the file, the keys each store sets for itself
/// refused from the environment and the flags, which would set them for all.
fn per_store_only_set_for_all(env: &Layer, flags: &Layer) -> Vec<Problem> {
    let mut problems = Vec::new();
    for name in PER_STORE_ONLY {
        let key = Key::find(name).expect("a key of the table");
        for (layer, origin) in [
            (env, format!("environment variable {}", key.env())),
            (flags, format!("flag --{}", key.long())),
        ] {
            if layer.has(name) {
                problems.push(Problem {
                    key: key.name.into(),
                    value: None,
                    origin,
                    message: "the file lists [[stores]]: set it in each store's entry, not for all of them at once".into(),
                    store: None,
                });
            }
        }
    }
    problems
}

/// A `[[stores]]` or `[[store_sets]]` entry's name: present, valid, and
/// not taken by an entry before it (`seen`).
fn entry_name(
    entry: &sources::StoreEntry,
    label: String,
    origin: &str,
    seen: &mut std::collections::BTreeSet<String>,
) -> Result<String, Problem> {
    let origin = origin.to_string();
    match &entry.name {
        None => Err(Problem {
            key: "name".into(),
            value: None,
            origin,
            message: "required: every [[stores]] entry has a name".into(),
            store: Some(label),
        }),
        Some(name) => match parse_store_name(name) {
            Err(message) => Err(Problem {
                key: "name".into(),
                value: Some(name.clone()),
                origin,
                message,
                store: None,
            }),
            Ok(name) if !seen.insert(name.clone()) => Err(Problem {
                key: "name".into(),
                value: Some(name),
                origin,
                message: "two [[stores]] entries have this name".into(),
                store: None,
            }),
            Ok(name) => Ok(name),
        },
    }
}

/// A `[[store_sets]]` entry: its template store (whose connection string
/// names each database as the placeholder) and its `databases` pattern.
fn store_set(
    name: String,
    entry: &sources::StoreEntry,
    store: Store,
    origin: String,
) -> Result<StoreSet, Vec<Problem>> {
    let mut problems = Vec::new();
    let cs = store.store.connection_string.expose();
    if !cs.is_empty() && !cs.contains(DATABASE_PLACEHOLDER) {
        problems.push(Problem {
                key: "connection_string".into(),
                value: None,
                origin: origin.clone(),
                message: format!(
                    "a [[store_sets]] entry's connection string names each database as {DATABASE_PLACEHOLDER}"
                ),
                store: Some(name.clone()),
            });
    }
    match &entry.databases {
        // A problem above fails the load: no set to keep.
        Some(pattern) if !pattern.is_empty() => match problems.is_empty() {
            true => Ok(StoreSet {
                name,
                databases: pattern.clone(),
                template: store,
            }),
            false => Err(problems),
        },
        _ => {
            problems.push(Problem {
                key: "databases".into(),
                value: None,
                origin,
                message:
                    "required: a LIKE pattern over the server's database names, e.g. \"tenant_%\""
                        .into(),
                store: Some(name),
            });
            Err(problems)
        }
    }
}

/// A store's leader lock, as far as its keys name it: also for a store
/// whose other keys have problems, so that a shared lock is said with them.
struct LockClaim {
    store: String,
    engine: EngineKind,
    connection_string: ConnectionString,
    key: String,
    /// Where `leader_key` came from.
    origin: String,
}

/// Stores of one database each need their own leader lock: with one name
/// for two of them, one store's election would keep the other following.
fn shared_leader_locks(claims: &[LockClaim]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (i, a) in claims.iter().enumerate() {
        if let Some(b) = claims[..i].iter().find(|b| {
            b.engine == a.engine
                && b.key == a.key
                && b.connection_string.expose() == a.connection_string.expose()
        }) {
            problems.push(Problem {
                key: "leader_key".into(),
                value: Some(a.key.clone()),
                origin: a.origin.clone(),
                message: format!(
                    "stores {} and {} are in one database with one leader lock: give each its own leader_key",
                    b.store, a.store
                ),
                store: Some(a.store.clone()),
            });
        }
    }
    problems
}

/// What one store's keys made: the store, unless a key has a problem; its
/// leader lock as far as the keys name it; the problems.
struct StoreOutcome {
    store: Option<Store>,
    claim: Option<LockClaim>,
    problems: Vec<Problem>,
}

/// One store's keys from its layers; `label`: the store named in problems
/// (`None` for the single default store).
fn read_store(name: &str, figment: &Figment, label: Option<&str>, need: Need) -> StoreOutcome {
    let mut v = Validator::new(figment, label);
    let mut keys = v.read_keys(Key::store);
    let resolved = Rules {
        keys: &keys,
        problems: &mut v.problems,
        origins: &mut v.origins,
    }
    .resolve(need);
    let claim = resolved.as_ref().ok().and_then(|r| {
        keys.leader_election.get()?.then_some(())?;
        Some(LockClaim {
            store: name.to_string(),
            engine: keys.engine.get()?,
            connection_string: r.connection_string.clone(),
            key: r.leader_key.clone(),
            origin: v
                .origins
                .iter()
                .find(|(k, _)| *k == "leader_key")
                .map_or("default (gap-healer:<schema>)".into(), |(_, o)| o.clone()),
        })
    });
    let built = resolved.and_then(|r| {
        StoreConfig::from_keys(&keys, r).ok_or_else(|| unvalued(&mut keys, Key::store))
    });
    let config = v.built(built);
    let store = config.map(|config| Store {
        name: name.to_string(),
        config,
        origins: v.origins,
    });
    StoreOutcome {
        store,
        claim,
        problems: v.problems.list,
    }
}

/// The first key of a scope (the keys `field` gives a field of `K`) that
/// has a default or is required, and has no value: what a conversion that
/// found none names.
fn unvalued<K, S>(keys: &mut K, field: impl Fn(&Key) -> Option<&Field<K, S>>) -> &'static str {
    KEYS.iter()
        .filter(|k| matches!(k.unset, Unset::Default | Unset::Required))
        .find(|k| field(k).is_some_and(|f| !(f.slot)(keys).has_value()))
        .map_or("configuration", |k| k.name)
}

/// A key's value in the layers.
enum Raw {
    /// No layer sets it.
    Unset,
    /// The winning layer's value is no text (a table or a list): a problem
    /// says so.
    NoText,
    Text(Given),
}

/// Reads one scope's keys from its layers into what was read, saying every
/// problem.
struct Validator<'a> {
    figment: &'a Figment,
    problems: Problems,
    origins: Vec<(&'static str, String)>,
}

impl<'a> Validator<'a> {
    fn new(figment: &'a Figment, store: Option<&str>) -> Self {
        Validator {
            figment,
            problems: Problems::new(store),
            origins: Vec::new(),
        }
    }

    /// Reads the keys of one scope, those `field` gives a field of `K`,
    /// into `K`: each key a layer sets through its row's `update`, over
    /// the defaults of `K`'s `Default`.
    fn read_keys<K: Default, S>(&mut self, field: impl Fn(&Key) -> Option<&Field<K, S>>) -> K {
        let mut keys = K::default();
        for key in KEYS {
            let Some(field) = field(key) else { continue };
            let given = match self.raw(key.name) {
                Raw::Text(given) => Some(given),
                Raw::Unset => None,
                // Read as set nowhere: neither its default nor a value.
                Raw::NoText => {
                    (field.slot)(&mut keys).clear();
                    None
                }
            };
            let Some(given) = given else {
                if key.unset == Unset::Required {
                    self.problems.say(
                        key.name,
                        "nowhere",
                        format!(
                            "required: set --{}, {} or {} in the config file",
                            key.long(),
                            key.env(),
                            key.name
                        ),
                    );
                }
                continue;
            };
            if let Err(message) = (field.update)(&mut keys, given.clone()) {
                self.problems.refuse_text(&given, message);
            }
        }
        keys
    }

    /// The value of `key` as text, and where it came from.
    fn raw(&mut self, key: &'static str) -> Raw {
        let Ok(value) = self.figment.find_value(key) else {
            return Raw::Unset;
        };
        // A value always has its layer's metadata.
        let rank = self
            .figment
            .find_metadata(key)
            .map_or(read::Origin::File, read::Origin::of);
        let origin = match self.figment.find_metadata(key) {
            Some(Metadata {
                source: Some(Source::File(path)),
                ..
            }) => format!("config file {}", path.display()),
            Some(meta) => meta.interpolate(&Profile::Default, &[key]),
            None => "unknown source".into(),
        };
        self.origins.push((key, origin.clone()));
        let text = match value {
            Value::String(_, s) => s,
            Value::Char(_, c) => c.to_string(),
            Value::Bool(_, b) => b.to_string(),
            Value::Num(_, n) => match (n.to_i128(), n.to_f64()) {
                (Some(i), _) => i.to_string(),
                (None, Some(f)) => f.to_string(),
                _ => format!("{n:?}"),
            },
            Value::Empty(..) => String::new(),
            // `columns` is a table in the file, its TOML text elsewhere.
            Value::Dict(..) if key == "columns" => match toml::Value::try_from(&value) {
                Ok(v) => v.to_string(),
                Err(e) => {
                    self.problems
                        .say(key, &origin, format!("unreadable table: {e}"));
                    return Raw::NoText;
                }
            },
            Value::Dict(..) | Value::Array(..) => {
                self.problems.say(
                    key,
                    &origin,
                    "expected a single value, found a table or list",
                );
                return Raw::NoText;
            }
        };
        Raw::Text(Given {
            key,
            text,
            origin,
            rank,
        })
    }

    /// What was built, or `None` when a key had no valid value. Every such
    /// key has its problem said already; one that has none is a mistake of
    /// this module, said as a problem rather than lost.
    fn built<T>(&mut self, built: Result<T, &'static str>) -> Option<T> {
        match built {
            Ok(value) => Some(value),
            Err(key) => {
                if self.problems.is_empty() {
                    let bug = "no value (a bug of gap-healer: please report it)";
                    self.problems.say(key, "nowhere", bug);
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::profile::{TableShape, Tombstone};
    use proptest::prelude::*;
    use std::time::Duration;

    fn args() -> ConfigArgs {
        ConfigArgs::default()
            .with("engine", "postgres")
            .with("connection_string", "host=db user=u password=pw")
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gh-cfg-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn defaults_apply() {
        let s = load(&args(), env(&[]), Need::Connection).unwrap();
        assert_eq!(s.stores[0].gap_timeout, Duration::from_secs(5));
        assert_eq!(s.stores[0].store.schema.as_str(), "eventuous");
        assert_eq!(s.stores[0].start_from, StartFrom::Checkpoints);
        assert!(s.stores[0].election.is_on());
        assert!(!s.stores[0].dry_run);
        assert_eq!(
            s.stores[0].give_up_after, None,
            "never gives up unless configured"
        );
        assert_eq!(s.stores[0].election.key(), Some("gap-healer:eventuous"));
        assert_eq!(s.daemon.log_level, "info");
    }

    #[test]
    fn give_up_after_is_a_duration_or_never() {
        let with = |v: &str| {
            load(
                &args(),
                env(&[("GAP_HEALER_GIVE_UP_AFTER", v)]),
                Need::Connection,
            )
        };
        assert_eq!(
            with("90s").unwrap().stores[0].give_up_after,
            Some(Duration::from_secs(90))
        );
        assert_eq!(with("NEVER").unwrap().stores[0].give_up_after, None);
        for (bad, why) in [
            ("0s", "at least 1s"),
            ("soon", "or never"),
            ("-1m", "negative"),
        ] {
            let text = with(bad).unwrap_err().to_string();
            assert!(
                text.contains(&format!("give_up_after = \"{bad}\" (from environment variable GAP_HEALER_GIVE_UP_AFTER)"))
                    && text.contains(why),
                "{text}"
            );
        }
    }

    #[test]
    fn precedence_file_env_flags() {
        let dir = temp_dir("prec");
        let file = dir.join("a.toml");
        std::fs::write(
            &file,
            "gap_timeout = \"7s\"\npoll_interval = \"1s\"\nlock_timeout = \"3s\"\n",
        )
        .unwrap();
        let mut a = args();
        a.config = Some(file.clone());
        a.set("lock_timeout", "4s");
        let s = load(
            &a,
            env(&[
                ("GAP_HEALER_POLL_INTERVAL", "2s"),
                ("GAP_HEALER_LOCK_TIMEOUT", "9s"),
            ]),
            Need::Connection,
        )
        .unwrap();
        assert_eq!(s.stores[0].gap_timeout, Duration::from_secs(7));
        assert_eq!(s.stores[0].poll_interval, Duration::from_secs(2));
        assert_eq!(s.stores[0].lock_timeout, Duration::from_secs(4));
        let toml = s.to_toml();
        assert!(
            toml.contains("# environment variable GAP_HEALER_POLL_INTERVAL"),
            "{toml}"
        );
        assert!(toml.contains("# flag --lock-timeout"), "{toml}");
        assert!(
            toml.contains(&format!("# config file {}", file.display())),
            "{toml}"
        );
        assert!(!toml.contains("pw\""), "{toml}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn all_problems_reported_at_once_with_key_value_origin() {
        let dir = temp_dir("bad");
        let file = dir.join("bad.toml");
        std::fs::write(&file, "gap_timout = \"5s\"\nschema = \"x; drop table y\"\n").unwrap();
        let mut a = ConfigArgs::default()
            .with("engine", "oracle")
            .with("poll_interval", "-1s");
        a.config = Some(file.clone());
        let err = load(
            &a,
            env(&[("GAP_HEALER_LOCK_TIMEOUT", "soon")]),
            Need::Connection,
        )
        .unwrap_err();
        let text = err.to_string();
        for needle in [
            "gap_timout",
            "did you mean `gap_timeout`",
            "engine = \"oracle\" (from flag --engine): unknown engine",
            "schema = \"x; drop table y\"",
            "poll_interval = \"-1s\" (from flag --poll-interval): must not be negative",
            "lock_timeout = \"soon\" (from environment variable GAP_HEALER_LOCK_TIMEOUT)",
            "connection_string (from nowhere): required",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert_eq!(err.problems.len(), 6, "{text}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn unknown_env_vars_are_ignored() {
        let s = load(
            &args(),
            env(&[
                ("GAP_HEALER_SERVICE_HOST", "10.0.0.1"),
                ("GAP_HEALER_PORT", "tcp://x"),
            ]),
            Need::Connection,
        );
        assert!(s.is_ok());
    }

    #[test]
    fn bad_connection_string_never_echoes_password() {
        let a = args().with(
            "connection_string",
            "Server=tcp:db,notaport;Password=hunter2secret;User Id=sa",
        );
        if let Err(e) = load(&a.with("engine", "mssql"), env(&[]), Need::Connection) {
            assert!(!e.to_string().contains("hunter2secret"), "{e}");
        }
        let a = args().with(
            "connection_string",
            "host=db port=notaport password=hunter2secret",
        );
        let e = load(&a, env(&[]), Need::Connection).unwrap_err();
        assert!(!e.to_string().contains("hunter2secret"), "{e}");
        assert!(e.to_string().contains("connection_string"), "{e}");
    }

    #[test]
    fn connection_string_from_a_file_and_not_both() {
        let dir = temp_dir("cs");
        let secret = dir.join("cs");
        std::fs::write(&secret, "host=db password=FromFile1\n").unwrap();
        let path = secret.to_str().unwrap();
        let a = ConfigArgs::default()
            .with("engine", "postgres")
            .with("connection_string_file", path);
        let s = load(&a, env(&[]), Need::Connection).unwrap();
        assert_eq!(
            s.stores[0].store.connection_string.expose(),
            "host=db password=FromFile1"
        );
        let toml = s.to_toml();
        assert!(
            toml.contains(&format!(
                "# file {path} named by flag --connection-string-file"
            )),
            "{toml}"
        );
        assert!(!toml.contains("connection_string_file ="), "{toml}");
        assert!(!toml.contains("FromFile1"), "{toml}");
        // The higher layer wins: the flag's file over the environment's string,
        let s = load(
            &a,
            env(&[("GAP_HEALER_CONNECTION_STRING", "host=x")]),
            Need::Connection,
        )
        .unwrap();
        assert_eq!(
            s.stores[0].store.connection_string.expose(),
            "host=db password=FromFile1"
        );
        // the environment's string over the config file's file,
        let file = dir.join("a.toml");
        std::fs::write(
            &file,
            format!("engine = \"postgres\"\nconnection_string_file = {path:?}\n"),
        )
        .unwrap();
        let mut from_file = ConfigArgs::default();
        from_file.config = Some(file.clone());
        let s = load(
            &from_file,
            env(&[("GAP_HEALER_CONNECTION_STRING", "host=x")]),
            Need::Connection,
        )
        .unwrap();
        assert_eq!(s.stores[0].store.connection_string.expose(), "host=x");
        // and both in one layer is a mistake.
        std::fs::write(
            &file,
            format!("engine = \"postgres\"\nconnection_string = \"host=y\"\nconnection_string_file = {path:?}\n"),
        )
        .unwrap();
        let err = load(&from_file, env(&[]), Need::Connection).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err}");
        assert!(err.to_string().contains("not both"), "{err}");
        std::fs::remove_dir_all(dir).ok();
    }

    /// Issue 20 item 5: `config` named the wrong origin. With
    /// GAP_HEALER_CONNECTION_STRING set and --connection-string-file given,
    /// it printed the file's value labelled `# environment variable
    /// GAP_HEALER_CONNECTION_STRING`. Every combination of where the string
    /// and where a file of it is set: the higher layer's value wins, and the
    /// printed origin is that value's.
    #[test]
    fn the_connection_strings_origin_for_every_layer_combination() {
        #[derive(Clone, Copy, PartialEq, Debug)]
        enum L {
            File,
            Env,
            Flag,
        }
        let rank = |l: L| match l {
            L::File => 1,
            L::Env => 3,
            L::Flag => 4,
        };
        let dir = temp_dir("cs-origins");
        let secret = dir.join("secret");
        std::fs::write(&secret, "host=fromsecret\n").unwrap();
        let secret = secret.to_str().unwrap().to_string();
        let config = dir.join("c.toml");
        let layers = [None, Some(L::File), Some(L::Env), Some(L::Flag)];
        for inline in layers {
            for file in layers {
                let mut toml = String::from("engine = \"postgres\"\n");
                let mut vars = Vec::new();
                let mut args = ConfigArgs::default();
                args.config = Some(config.clone());
                match inline {
                    Some(L::File) => toml += "connection_string = \"host=fromtoml\"\n",
                    Some(L::Env) => vars.push(("GAP_HEALER_CONNECTION_STRING", "host=fromenv")),
                    Some(L::Flag) => args = args.with("connection_string", "host=fromflag"),
                    None => {}
                }
                match file {
                    Some(L::File) => toml += &format!("connection_string_file = {secret:?}\n"),
                    Some(L::Env) => {
                        vars.push(("GAP_HEALER_CONNECTION_STRING_FILE", secret.as_str()))
                    }
                    Some(L::Flag) => args = args.with("connection_string_file", secret.clone()),
                    None => {}
                }
                std::fs::write(&config, &toml).unwrap();
                let loaded = load(&args, env(&vars), Need::Connection);
                let case = format!("string {inline:?}, file {file:?}");
                let (value, origin) = match (inline, file) {
                    (None, None) => {
                        let err = loaded.unwrap_err().to_string();
                        assert!(err.contains("required"), "{case}: {err}");
                        continue;
                    }
                    (Some(i), Some(f)) if rank(i) == rank(f) => {
                        let err = loaded.unwrap_err().to_string();
                        assert!(err.contains("not both"), "{case}: {err}");
                        continue;
                    }
                    (Some(i), f) if f.is_none_or(|f| rank(i) > rank(f)) => match i {
                        L::File => ("host=fromtoml", format!("config file {}", config.display())),
                        L::Env => (
                            "host=fromenv",
                            "environment variable GAP_HEALER_CONNECTION_STRING".into(),
                        ),
                        L::Flag => ("host=fromflag", "flag --connection-string".into()),
                    },
                    (_, Some(f)) => {
                        let named = match f {
                            L::File => format!("config file {}", config.display()),
                            L::Env => {
                                "environment variable GAP_HEALER_CONNECTION_STRING_FILE".into()
                            }
                            L::Flag => "flag --connection-string-file".into(),
                        };
                        ("host=fromsecret", format!("file {secret} named by {named}"))
                    }
                    (Some(_), None) => unreachable!(),
                };
                let s = loaded.unwrap_or_else(|e| panic!("{case}: {e}"));
                assert_eq!(
                    s.stores[0].store.connection_string.expose(),
                    value,
                    "{case}"
                );
                let shown = s.to_toml();
                let row = shown
                    .lines()
                    .find(|l| l.starts_with("connection_string ="))
                    .unwrap_or_else(|| panic!("{case}: {shown}"));
                assert!(row.ends_with(&format!("# {origin}")), "{case}: {row}");
            }
        }
        std::fs::remove_dir_all(dir).ok();
    }

    /// Any other key set in several layers is shown with the origin of the
    /// layer whose value wins (flag over environment over file over default).
    #[test]
    fn a_keys_origin_is_the_winning_layers_for_every_combination() {
        let dir = temp_dir("origins");
        let config = dir.join("c.toml");
        for mask in 0..8u8 {
            let (in_file, in_env, in_flag) = (mask & 1 != 0, mask & 2 != 0, mask & 4 != 0);
            let mut toml = String::from("engine = \"postgres\"\nconnection_string = \"host=db\"\n");
            if in_file {
                toml += "gap_timeout = \"7s\"\n";
            }
            std::fs::write(&config, &toml).unwrap();
            let mut args = ConfigArgs::default();
            args.config = Some(config.clone());
            if in_flag {
                args = args.with("gap_timeout", "9s");
            }
            let vars: Vec<(&str, &str)> = if in_env {
                vec![("GAP_HEALER_GAP_TIMEOUT", "8s")]
            } else {
                vec![]
            };
            let s = load(&args, env(&vars), Need::Connection).unwrap();
            let (value, origin) = if in_flag {
                ("9s", "flag --gap-timeout".to_string())
            } else if in_env {
                (
                    "8s",
                    "environment variable GAP_HEALER_GAP_TIMEOUT".to_string(),
                )
            } else if in_file {
                ("7s", format!("config file {}", config.display()))
            } else {
                ("5s", "default".to_string())
            };
            let shown = s.to_toml();
            let row = shown
                .lines()
                .find(|l| l.starts_with("gap_timeout ="))
                .unwrap_or_else(|| panic!("{mask}: {shown}"));
            assert!(row.contains(&format!("\"{value}\"")), "{mask}: {row}");
            assert!(row.ends_with(&format!("# {origin}")), "{mask}: {row}");
        }
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn engine_only_needs_no_connection_string() {
        let a = ConfigArgs::default().with("engine", "mssql");
        assert!(load(&a, env(&[]), Need::EngineOnly).is_ok());
        let err = load(&ConfigArgs::default(), env(&[]), Need::EngineOnly).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err}");
        assert!(
            err.to_string()
                .contains("engine (from nowhere): required: set --engine, GAP_HEALER_ENGINE"),
            "{err}"
        );
    }

    /// Each key, set through each layer, lands in the settings and is shown
    /// by `gap-healer config` with that layer as its origin.
    #[test]
    fn every_key_by_env_file_and_flag() {
        let dir = temp_dir("every");
        let secret = dir.join("secret");
        std::fs::write(&secret, "host=db").unwrap();
        let secret = secret.to_str().unwrap().to_string();
        // A valid value other than the default, for each key.
        let value = |key: &Key| match key.name {
            "engine" => "mssql".to_string(),
            "connection_string" => "Server=tcp:db,1433;User Id=sa;Password=x".into(),
            "connection_string_file" => secret.clone(),
            "schema" | "tombstone_stream" | "tombstone_type" | "leader_key" => "other".into(),
            "metrics_addr" => "127.0.0.1:1".into(),
            "start_from" => "head".into(),
            "lookback" | "scan_page_size" => "123".into(),
            "dry_run" => "true".into(),
            "leader_election" => "false".into(),
            "log_format" => "json".into(),
            "log_level" => "debug".into(),
            "watermark_table" => "gap_healer.watermarks".into(),
            "profile" => "ledger-core".into(),
            "table" | "position_column" => "other".into(),
            "tombstone_stream_id" => "00000000-0000-0000-0000-000000000001".into(),
            "columns" => {
                r#"{ kind = { literal = "$gap" }, v = { next_version = ["kind"] } }"#.into()
            }
            _ => "7s".into(),
        };
        for key in KEYS {
            // The connection string and its file exclude each other, and the
            // engine must match the string.
            let base: Vec<(&str, String)> = match key.name {
                "engine" => vec![(
                    "connection_string",
                    value(Key::find("connection_string").unwrap()),
                )],
                "connection_string" => vec![("engine", "mssql".into())],
                "connection_string_file" => vec![("engine", "postgres".into())],
                "table" | "position_column" | "tombstone_stream_id" => vec![
                    ("engine", "postgres".into()),
                    ("connection_string", "host=db".into()),
                    ("profile", "ledger-core".into()),
                ],
                "columns" => vec![
                    ("engine", "postgres".into()),
                    ("connection_string", "host=db".into()),
                    ("profile", "custom".into()),
                    ("table", "t".into()),
                    ("position_column", "p".into()),
                ],
                _ => vec![
                    ("engine", "postgres".into()),
                    ("connection_string", "host=db".into()),
                ],
            };
            let flag_origin = format!("flag --{}", key.long());
            let env_origin = format!("environment variable {}", key.env());
            let file = dir.join(format!("{}.toml", key.name));
            std::fs::write(
                &file,
                format!("{} = {}\n", key.name, toml::Value::String(value(key))),
            )
            .unwrap();
            let file_origin = format!("config file {}", file.display());
            for layer in 0..3 {
                let mut a = ConfigArgs::default();
                for (k, v) in &base {
                    a.set(k, v.clone());
                }
                let mut e = Vec::new();
                let origin = match layer {
                    0 => {
                        a.set(key.name, value(key));
                        &flag_origin
                    }
                    1 => {
                        e.push((key.env(), value(key)));
                        &env_origin
                    }
                    _ => {
                        a.config = Some(file.clone());
                        &file_origin
                    }
                };
                let s = load(&a, e, Need::Connection)
                    .unwrap_or_else(|err| panic!("{} by {origin}: {err}", key.name));
                let toml = s.to_toml();
                // A file's connection string is shown as connection_string,
                // from the file the key named.
                let (shown, origin) = match key.name {
                    "connection_string_file" => (
                        "connection_string",
                        format!("file {} named by {origin}", value(key)),
                    ),
                    name => (name, origin.to_string()),
                };
                let line = toml
                    .lines()
                    .find(|l| l.starts_with(&format!("{shown} = ")))
                    .unwrap_or_else(|| panic!("{shown} not in\n{toml}"));
                assert!(line.ends_with(&format!("# {origin}")), "{line}");
                if key.show(&s.daemon, Some(&s.stores[0].config)).is_some() {
                    let def = load(&args(), vec![], Need::Connection).unwrap();
                    assert_ne!(
                        key.show(&s.daemon, Some(&s.stores[0].config)),
                        key.show(&def.daemon, Some(&def.stores[0].config)),
                        "{} by {origin} changed nothing",
                        key.name
                    );
                }
            }
        }
        std::fs::remove_dir_all(dir).ok();
    }

    /// The example file names every key and loads as it is.
    #[test]
    fn the_example_file_has_every_key() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/gap-healer.toml");
        let text = std::fs::read_to_string(path).unwrap();
        for key in KEYS {
            assert!(
                text.lines().any(|l| l
                    .trim_start_matches("# ")
                    .starts_with(&format!("{} = ", key.name))),
                "{} missing from {path}",
                key.name
            );
        }
        let mut a = ConfigArgs::default().with("connection_string", "host=db");
        a.config = Some(path.into());
        let s = load(&a, vec![], Need::Connection).unwrap();
        assert!(s.stores[0]
            .origins
            .iter()
            .chain(&s.daemon_origins)
            .any(|(_, o)| o.starts_with("config file")));
    }

    /// The example file sets each key it does not comment out to its
    /// default: the file, `--help` and the defaults (written once, in what
    /// was read's `Default`) say the same.
    #[test]
    fn the_example_file_states_the_defaults() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/gap-healer.toml");
        let mut a = ConfigArgs::default().with("connection_string", "host=db");
        a.config = Some(path.into());
        let example = load(&a, vec![], Need::Connection).unwrap();
        let defaults = load(&args(), vec![], Need::Connection).unwrap();
        let mut from_file = 0;
        for key in KEYS.iter().filter(|k| k.unset == Unset::Default) {
            let shown = |s: &Settings| key.show(&s.daemon, Some(&s.stores[0].config));
            assert_eq!(shown(&example), shown(&defaults), "{} in {path}", key.name);
            let origins = [&example.daemon_origins[..], &example.stores[0].origins[..]].concat();
            from_file += origins.iter().filter(|(k, _)| k == &key.name).count();
        }
        assert!(from_file > 10, "{from_file} defaults set in {path}");
    }

    #[test]
    fn log_level_typos_are_refused() {
        let err = load(&args().with("log_level", "wran"), vec![], Need::Connection).unwrap_err();
        assert!(
            err.to_string().contains(
                "log_level = \"wran\" (from flag --log-level): `wran` is not a level (did you mean `warn`?)"
            ),
            "{err}"
        );
    }

    fn fleet_file(tag: &str, text: &str) -> (std::path::PathBuf, ConfigArgs) {
        let dir = temp_dir(tag);
        let file = dir.join("fleet.toml");
        std::fs::write(&file, text).unwrap();
        let mut a = ConfigArgs::default();
        a.config = Some(file.clone());
        (dir, a)
    }

    const FLEET: &str = r#"
gap_timeout = "5s"
engine = "postgres"
[[stores]]
name = "orders"
connection_string = "host=db1 password=Pw1secret"
schema = "orders"
gap_timeout = "2s"
[[stores]]
name = "billing"
connection_string = "host=db1 password=Pw1secret"
schema = "billing"
dry_run = true
"#;

    #[test]
    fn a_fleet_is_a_list_of_stores_over_top_level_defaults() {
        let (dir, a) = fleet_file("fleet", FLEET);
        let s = load(
            &a,
            env(&[("GAP_HEALER_POLL_INTERVAL", "1s")]),
            Need::Connection,
        )
        .unwrap();
        assert!(s.fleet);
        let names: Vec<&str> = s.stores.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["orders", "billing"]);
        let (orders, billing) = (&s.stores[0], &s.stores[1]);
        assert_eq!(orders.gap_timeout, Duration::from_secs(2), "its own value");
        assert_eq!(
            billing.gap_timeout,
            Duration::from_secs(5),
            "the top-level default"
        );
        assert_eq!(
            billing.poll_interval,
            Duration::from_secs(1),
            "the environment's"
        );
        assert!(billing.dry_run && !orders.dry_run);
        assert_eq!(billing.election.key(), Some("gap-healer:billing"));
        let toml = s.to_toml();
        assert!(toml.contains("[[stores]]\nname = \"orders\"\n"), "{toml}");
        let line = toml
            .lines()
            .find(|l| l.starts_with("gap_timeout = \"2s\""))
            .unwrap();
        assert!(line.ends_with("[[stores]] orders"), "{line}");
        assert!(!toml.contains("Pw1secret"), "{toml}");
        // `config` output is a file that loads to the same stores.
        let (dir2, mut b) = fleet_file(
            "fleet-again",
            &toml.replace("\"host=db1 password=***\"", "\"host=db1\""),
        );
        b.set("log_level", "info");
        let again = load(&b, env(&[]), Need::Connection).unwrap_or_else(|e| panic!("{e}\n{toml}"));
        assert_eq!(again.stores.len(), 2);
        assert!(again.stores[1].dry_run);
        // A flag applies to every store (a dry run is a dry run everywhere).
        let s = load(
            &a.clone().with("dry_run", "true"),
            env(&[]),
            Need::Connection,
        )
        .unwrap();
        assert!(s.stores.iter().all(|s| s.dry_run));
        std::fs::remove_dir_all(dir).ok();
        std::fs::remove_dir_all(dir2).ok();
    }

    #[test]
    fn profiles_take_their_keys_and_refuse_the_others() {
        let (dir, a) = fleet_file(
            "profiles",
            r#"
engine = "postgres"
connection_string = "host=db"
[[stores]]
name = "ledger"
schema = "bank"
profile = "ledger-core"
[[stores]]
name = "journal"
profile = "custom"
table = "Journal"
position_column = "seq"
[stores.columns]
id = "uuid"
kind = { literal = "$gap" }
n = { next_version = ["kind"] }
[[stores]]
name = "plain"
"#,
        );
        let s = load(&a, vec![], Need::Connection).unwrap();
        let ledger = &s.stores[0];
        assert_eq!(ledger.store.tombstone_stream, "$gap");
        assert_eq!(ledger.election.key(), Some("gap-healer:bank.events"));
        let shape = &ledger.store.profile;
        let Tombstone::Columns(_) = shape.tombstone else {
            panic!("ledger-core is a table profile");
        };
        assert_eq!(
            (shape.table.as_str(), shape.position.as_str()),
            ("events", "position")
        );
        let journal = &s.stores[1].store.profile;
        let Tombstone::Columns(_) = journal.tombstone else {
            panic!("custom is a table profile");
        };
        assert_eq!(journal.table.as_str(), "journal");
        assert_eq!(journal.version().unwrap().0.as_str(), "n");
        assert_eq!(s.stores[2].store.profile, TableShape::eventuous());
        assert_eq!(s.stores[2].election.key(), Some("gap-healer:eventuous"));
        // The printed configuration loads back to the same profiles.
        let again = dir.join("again.toml");
        std::fs::write(&again, s.to_toml().replace("(redacted)", "host=db")).unwrap();
        let mut b = ConfigArgs::default();
        b.config = Some(again);
        let back =
            load(&b, vec![], Need::Connection).unwrap_or_else(|e| panic!("{e}\n{}", s.to_toml()));
        for (x, y) in s.stores.iter().zip(&back.stores) {
            assert_eq!(x.store.profile, y.store.profile, "{}", s.to_toml());
        }

        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
        let cases: [Case; 5] = [
            (
                &[("columns", r#"{ a = "uuid" }"#), ("table", "events")],
                &[
                    "columns (from flag --columns)",
                    "table (from flag --table)",
                    "the eventuous profile heals messages",
                ],
            ),
            (
                &[("profile", "custom")],
                &[
                    "table (from nowhere): required by profile = \"custom\"",
                    "position_column",
                    "columns",
                ],
            ),
            (
                &[
                    ("profile", "custom"),
                    ("table", "t"),
                    ("position_column", "p"),
                    ("columns", r#"{ p = "now" }"#),
                    ("tombstone_stream", "x"),
                ],
                &[
                    "p is the position column",
                    "tombstone_stream",
                    "not read by the custom profile",
                ],
            ),
            (
                &[
                    ("profile", "ledger-core"),
                    ("columns", r#"{ a = "uuid" }"#),
                    ("tombstone_stream_id", "nope"),
                ],
                &[
                    "the ledger-core profile's tombstone row is fixed",
                    "expected a UUID",
                ],
            ),
            (
                &[("profile", "ledger"), ("table", "bad name")],
                &[
                    "expected one of eventuous, ledger-core, custom",
                    "expected a plain identifier",
                ],
            ),
        ];
        for (flags, needles) in cases {
            let mut a = args();
            for (k, v) in flags {
                a.set(k, v.to_string());
            }
            let err = load(&a, vec![], Need::Connection).unwrap_err().to_string();
            for needle in needles {
                assert!(err.contains(needle), "{needle} not in {err}");
            }
        }
        let err = load(
            &args()
                .with("engine", "mssql")
                .with("connection_string", "Server=db;User Id=a;Password=b")
                .with("profile", "ledger-core"),
            vec![],
            Need::Connection,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("PostgreSQL only, for now"), "{err}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn fleet_mistakes_are_named_with_their_store() {
        let (dir, a) = fleet_file(
            "fleet-bad",
            r#"
engine = "postgres"
[[stores]]
name = "Orders!"
connection_string = "host=a"
[[stores]]
name = "a"
connection_string = "host=a"
gap_timout = "1s"
metrics_addr = "0.0.0.0:1"
lock_timeout = "soon"
[[stores]]
name = "a"
connection_string = "host=b"
[[stores]]
connection_string = "host=c"
[[stores]]
name = "b"
connection_string = "host=a"
schema = "eventuous"
"#,
        );
        let err = load(&a, env(&[("GAP_HEALER_SCHEMA", "x")]), Need::Connection).unwrap_err();
        let text = err.to_string();
        for needle in [
            "name = \"Orders!\"",
            "1 to 63 of a-z",
            "[store a] gap_timout",
            "did you mean `gap_timeout`",
            "[store a] metrics_addr",
            "daemon-wide key",
            "[store a] lock_timeout = \"soon\"",
            "name = \"a\"",
            "two [[stores]] entries have this name",
            "[store #4] name",
            "required: every [[stores]] entry has a name",
            "schema (from environment variable GAP_HEALER_SCHEMA): the file lists [[stores]]",
            "stores a and b are in one database with one leader lock",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn store_selection() {
        let (dir, a) = fleet_file("fleet-select", FLEET);
        let mut s = load(&a, env(&[]), Need::Connection).unwrap();
        let err = s.select(&["ordrs".into()]).unwrap_err().to_string();
        assert!(
            err.contains("store = \"ordrs\" (from flag --store): no such store (did you mean `orders`?); stores: orders, billing"),
            "{err}"
        );
        s.select(&["billing".into()]).unwrap();
        assert_eq!(s.stores.len(), 1);
        assert_eq!(s.stores[0].name, "billing");
        let mut one = load(&args(), env(&[]), Need::Connection).unwrap();
        assert!(!one.fleet);
        assert_eq!(one.stores[0].name, DEFAULT_STORE);
        one.select(&["default".into()]).unwrap();
        std::fs::remove_dir_all(dir).ok();
    }

    proptest! {
        /// Any text in any key, from any layer: never a panic, and either valid
        /// settings or problems that each name a key.
        #[test]
        fn never_panics(
            key in proptest::sample::select(KEYS.iter().map(|k| k.name).collect::<Vec<_>>()),
            value in "\\PC{0,30}",
            layer in 0..2u8,
        ) {
            let mut a = args();
            let mut e = Vec::new();
            if layer == 0 {
                e.push((format!("GAP_HEALER_{}", key.to_ascii_uppercase()), value.clone()));
            } else {
                a.set(key, value.clone());
            }
            if let Err(err) = load(&a, e, Need::Connection) {
                prop_assert!(!err.problems.is_empty());
                prop_assert!(err.problems.iter().all(|p| !p.key.is_empty()));
            }
        }
    }
}
