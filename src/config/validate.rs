//! Reading one scope's keys, the daemon's or one store's, from its layers
//! into what was read ([`super::read`]): each key's text, from the layer
//! that wins, through its row's `update`; for a store, then the rules that
//! span keys ([`super::rules`]); then the settings' one conversion
//! ([`super::settings`]). Every problem is said, each with its key, value,
//! origin and store; a scope with one builds nothing.

use figment::value::Value;
use figment::{Figment, Metadata, Profile, Source};

use crate::engine::EngineKind;
use crate::secret::ConnectionString;

use super::keys::{Field, Key, Unset, KEYS};
use super::name::StoreName;
use super::problem::{Problem, Problems};
use super::read::{Given, Origin};
use super::rules::{Need, Rules};
use super::settings::{DaemonSettings, Store, StoreConfig};

/// What the daemon's keys made: its settings, unless a key has a problem;
/// where each key's value came from; the problems.
pub(super) struct DaemonOutcome {
    pub(super) daemon: Option<DaemonSettings>,
    pub(super) origins: Vec<(&'static str, String)>,
    pub(super) problems: Vec<Problem>,
}

/// The daemon's keys from the layers (those of the file's top level).
pub(super) fn read_daemon(figment: &Figment) -> DaemonOutcome {
    let mut v = Validator::new(figment, None);
    let mut keys = v.read_keys(Key::daemon);
    let daemon = DaemonSettings::from_keys(&keys).ok_or_else(|| unvalued(&mut keys, Key::daemon));
    DaemonOutcome {
        daemon: v.built(daemon),
        origins: v.origins,
        problems: v.problems.list,
    }
}

/// What one store's keys made: the store, unless a key has a problem; its
/// leader lock as far as the keys name it; the problems.
pub(super) struct StoreOutcome {
    pub(super) store: Option<Store>,
    pub(super) claim: Option<LockClaim>,
    pub(super) problems: Vec<Problem>,
}

/// One store's keys from its layers; `label`: the store named in problems
/// (`None` for the single default store).
pub(super) fn read_store(
    name: &StoreName,
    figment: &Figment,
    label: Option<&str>,
    need: Need,
) -> StoreOutcome {
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
            store: name.clone(),
            engine: keys.engine.get()?,
            connection_string: r.connection_string.clone(),
            key: r.leader_key.clone(),
            // From the origins, which keep where the key was set also when
            // its value was no text (the field cleared, the key derived).
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
        name: name.clone(),
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
            .map_or(Origin::File, Origin::of);
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

/// A store's leader lock, as far as its keys name it: also for a store
/// whose other keys have problems, so that a shared lock is said with them.
pub(super) struct LockClaim {
    pub(super) store: StoreName,
    pub(super) engine: EngineKind,
    pub(super) connection_string: ConnectionString,
    pub(super) key: String,
    /// Where `leader_key` came from.
    pub(super) origin: String,
}
