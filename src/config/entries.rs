//! A fleet file's `[[stores]]` and `[[store_sets]]` entries: each entry's
//! store over the layers every store shares, the entries' names, a set's
//! `databases` and placeholder, the keys each store must set for itself,
//! and the leader locks two stores of one database would share.

use std::collections::BTreeSet;

use super::keys::Key;
use super::name::StoreName;
use super::problem::Problem;
use super::rules::Need;
use super::settings::{Store, StoreSet, DATABASE_PLACEHOLDER};
use super::sources::{Layer, Layers, StoreEntry};
use super::validate::{read_store, LockClaim};

/// Keys that name one store's database objects: with `[[stores]]` in the
/// file, an environment variable or flag setting one for every store at once
/// is a mistake.
const PER_STORE_ONLY: &[&str] = &[
    "connection_string",
    "connection_string_file",
    "schema",
    "leader_key",
];

/// A fleet file's `[[stores]]` and `[[store_sets]]` entries.
pub(super) struct Entries<'a> {
    pub(super) stores: &'a [StoreEntry],
    pub(super) sets: &'a [StoreEntry],
    /// The file's name, for origins.
    pub(super) file: &'a str,
}

impl Entries<'_> {
    /// Each entry's store (or store set) over the shared layers; a problem
    /// of one entry goes to `problems` and the entry is left out.
    pub(super) fn read(
        &self,
        layers: &Layers,
        need: Need,
        problems: &mut Vec<Problem>,
    ) -> (Vec<Store>, Vec<StoreSet>) {
        let mut stores = Vec::new();
        let mut sets = Vec::new();
        let mut claims = Vec::new();
        let mut seen = BTreeSet::new();
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
            let mut read = read_store(&name, &figment, Some(name.as_str()), need);
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
pub(super) fn per_store_only_set_for_all(env: &Layer, flags: &Layer) -> Vec<Problem> {
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
    entry: &StoreEntry,
    label: String,
    origin: &str,
    seen: &mut BTreeSet<StoreName>,
) -> Result<StoreName, Problem> {
    let origin = origin.to_string();
    match &entry.name {
        None => Err(Problem {
            key: "name".into(),
            value: None,
            origin,
            message: "required: every [[stores]] entry has a name".into(),
            store: Some(label),
        }),
        Some(name) => match StoreName::parse(name) {
            Err(message) => Err(Problem {
                key: "name".into(),
                value: Some(name.clone()),
                origin,
                message,
                store: None,
            }),
            Ok(name) if !seen.insert(name.clone()) => Err(Problem {
                key: "name".into(),
                value: Some(name.to_string()),
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
    name: StoreName,
    entry: &StoreEntry,
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
                store: Some(name.to_string()),
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
                store: Some(name.to_string()),
            });
            Err(problems)
        }
    }
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
                store: Some(a.store.to_string()),
            });
        }
    }
    problems
}
