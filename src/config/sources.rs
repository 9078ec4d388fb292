//! The layers, lowest first: the config file, the environment, the flags;
//! under them all, each key's default ([`super::read`]). Each is a figment
//! provider that can name where a value came from.

use std::path::Path;

use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use std::sync::Arc;

use super::args::ConfigArgs;
use super::keys::{suggest, Key, ENV_PREFIX};
use super::problem::Problem;
use super::read::Origin;

/// What the config file holds: its top-level keys (defaults for every
/// store), its `[[stores]]` entries, and a problem for each key it does not know.
pub(super) struct FileLayers {
    pub(super) top: Figment,
    pub(super) stores: Vec<StoreEntry>,
    pub(super) sets: Vec<StoreEntry>,
    pub(super) problems: Vec<Problem>,
}

/// One `[[stores]]` entry: its name (unvalidated) and its keys as a layer.
pub(super) struct StoreEntry {
    pub(super) name: Option<String>,
    /// A `[[store_sets]]` entry's `LIKE` pattern.
    pub(super) databases: Option<String>,
    pub(super) layer: Layer,
}

/// The lists a file may hold besides the table's keys.
const STORES: &str = "stores";
const STORE_SETS: &str = "store_sets";

/// The config file, its `[[stores]]`, and a problem for each key in it the
/// table does not know.
pub(super) fn file(path: &Path) -> Result<FileLayers, Problem> {
    let problem = |message: String| Problem {
        key: "config".into(),
        value: Some(path.display().to_string()),
        origin: "flag --config".into(),
        message,
        store: None,
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| problem(format!("cannot read the file: {e}")))?;
    // The parser's own message quotes the offending line, which may hold the
    // connection string: report only its message and the position.
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| {
        let at = e.span().map(|span| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!(" at line {line}, column {column}")
        });
        problem(format!(
            "not valid TOML{}: {}",
            at.unwrap_or_default(),
            e.message()
        ))
    })?;
    let origin = format!("config file {}", path.display());
    let mut problems: Vec<Problem> = table
        .keys()
        .filter(|k| Key::find(k).is_none() && ![STORES, STORE_SETS].contains(&k.as_str()))
        .map(|key| unknown(key, &origin, None))
        .collect();
    let mut lists = [Vec::new(), Vec::new()];
    for (list, found) in [STORES, STORE_SETS].into_iter().zip(&mut lists) {
        let wrong = |key: String| Problem {
            key,
            value: None,
            origin: origin.clone(),
            message: format!("expected a table: write each entry as a [[{list}]] section"),
            store: None,
        };
        match table.remove(list) {
            None => {}
            Some(toml::Value::Array(entries)) => {
                for (i, entry) in entries.into_iter().enumerate() {
                    match entry {
                        toml::Value::Table(entry) => {
                            let (entry, more) = store_entry(entry, path, list, i);
                            problems.extend(more);
                            found.push(entry);
                        }
                        _ => problems.push(wrong(format!("{list}[{i}]"))),
                    }
                }
            }
            Some(_) => problems.push(wrong(list.to_string())),
        }
    }
    let [stores, sets] = lists;
    // The top level without its lists, read once: a figment of the whole
    // file (figment's own Toml provider) was cloned into every store's
    // layers and read whole for each key, so loading grew with the square
    // of the stores (1,000 stores: 8 s in a release build, 33 s in a debug
    // one).
    let mut values = Dict::new();
    for (key, value) in table {
        match Value::serialize(value) {
            Ok(v) => {
                values.insert(key, v);
            }
            Err(e) => problems.push(Problem {
                key,
                value: None,
                origin: origin.clone(),
                message: format!("unreadable value: {e}"),
                store: None,
            }),
        }
    }
    let shown = origin.clone();
    let top = Figment::from(Layer {
        layer: Origin::File,
        values,
        origin: Arc::new(move |_: &str| shown.clone()),
    });
    Ok(FileLayers {
        top,
        stores,
        sets,
        problems,
    })
}

fn unknown(key: &str, origin: &str, store: Option<&str>) -> Problem {
    Problem {
        key: key.into(),
        value: None,
        origin: origin.into(),
        message: match suggest(key) {
            Some(s) => format!("unknown key (did you mean `{s}`?)"),
            None => "unknown key".into(),
        },
        store: store.map(String::from),
    }
}

/// One `[[stores]]` entry as a layer, and its problems: keys the table does
/// not know, and daemon-wide keys (they belong at the top level).
fn store_entry(
    mut entry: toml::Table,
    path: &Path,
    list: &str,
    index: usize,
) -> (StoreEntry, Vec<Problem>) {
    let text = |v: toml::Value| match v {
        toml::Value::String(s) => s,
        other => other.to_string(),
    };
    let name = entry.remove("name").map(text);
    let databases = match list {
        STORE_SETS => entry.remove("databases").map(text),
        _ => None,
    };
    let label = name.clone().unwrap_or_else(|| format!("#{}", index + 1));
    let origin = format!("config file {}, [[{list}]] {label}", path.display());
    let mut problems = Vec::new();
    let mut values = Dict::new();
    for (key, value) in entry {
        match Key::find(&key) {
            None => problems.push(unknown(&key, &origin, Some(&label))),
            Some(k) if !k.is_store() => problems.push(Problem {
                key,
                value: None,
                origin: origin.clone(),
                message: "a daemon-wide key: set it at the top level of the file, not per store"
                    .into(),
                store: Some(label.clone()),
            }),
            Some(k) => match Value::serialize(value) {
                Ok(v) => {
                    values.insert(k.name.to_string(), v);
                }
                Err(e) => problems.push(Problem {
                    key,
                    value: None,
                    origin: origin.clone(),
                    message: format!("unreadable value: {e}"),
                    store: Some(label.clone()),
                }),
            },
        }
    }
    let layer = Layer {
        layer: Origin::StoreEntry,
        values,
        origin: Arc::new(move |_: &str| origin.clone()),
    };
    (
        StoreEntry {
            name,
            databases,
            layer,
        },
        problems,
    )
}

/// The layers every store shares, lowest first: the
/// file's top level, then (between it and these) a store's own entry, then
/// the environment and the flags.
pub(super) struct Layers {
    pub(super) file: Option<Figment>,
    pub(super) env: Layer,
    pub(super) flags: Layer,
}

impl Layers {
    /// The figment of one store: `entry` is its `[[stores]]` entry.
    pub(super) fn figment(&self, entry: Option<&Layer>) -> Figment {
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

/// A figment provider of raw string values that can name the exact
/// variable or flag a value came from.
#[derive(Clone)]
pub(super) struct Layer {
    layer: Origin,
    values: Dict,
    origin: Arc<dyn Fn(&str) -> String + Send + Sync>,
}

/// How figment's metadata names each [`Origin`]: a [`Layer`] is built with
/// its own, carried only as [`Origin::name`], and [`Origin::of`] is that
/// mapping's one inverse.
impl Origin {
    /// The metadata name of a layer of this origin; the file's is figment's own.
    const fn name(self) -> &'static str {
        match self {
            Origin::File => "TOML file",
            Origin::StoreEntry => "store entry",
            Origin::Env => "environment",
            Origin::Flag => "flags",
        }
    }

    /// The origin of a value whose metadata is `meta`: a layer built here
    /// by its name, anything else (figment's TOML file) is the file.
    pub(super) fn of(meta: &Metadata) -> Self {
        [Origin::StoreEntry, Origin::Env, Origin::Flag]
            .into_iter()
            .find(|o| meta.name == o.name())
            .unwrap_or(Origin::File)
    }
}

impl Layer {
    /// Whether this layer sets `key`.
    pub(super) fn has(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    /// `GAP_HEALER_<KEY>` for known keys only: unknown `GAP_HEALER_*` variables
    /// are ignored, because Kubernetes injects `GAP_HEALER_SERVICE_HOST` and
    /// friends for a Service named gap-healer.
    pub(super) fn env(env: impl IntoIterator<Item = (String, String)>) -> Self {
        let values = env
            .into_iter()
            .filter_map(|(k, v)| {
                let key = Key::find(&k.strip_prefix(ENV_PREFIX)?.to_ascii_lowercase())?;
                Some((key.name.to_string(), Value::from(v)))
            })
            .collect();
        Layer {
            layer: Origin::Env,
            values,
            origin: Arc::new(|k: &str| {
                format!(
                    "environment variable {ENV_PREFIX}{}",
                    k.to_ascii_uppercase()
                )
            }),
        }
    }

    pub(super) fn flags(args: &ConfigArgs) -> Self {
        let values = args
            .values()
            .map(|(k, v)| (k.to_string(), Value::from(v)))
            .collect();
        Layer {
            layer: Origin::Flag,
            values,
            origin: Arc::new(|k: &str| format!("flag --{}", k.replace('_', "-"))),
        }
    }
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        let origin = self.origin.clone();
        Metadata::named(self.layer.name())
            .interpolater(move |_: &Profile, keys: &[&str]| origin(&keys.join(".")))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.values.clone()))
    }
}
