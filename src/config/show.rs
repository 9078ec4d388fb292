//! `gap-healer config`: the effective configuration as TOML, each row
//! commented with where its value came from.

use super::keys::{Key, KEYS};
use super::settings::{Settings, StoreConfig};

impl Settings {
    /// The effective configuration as TOML, connection strings redacted,
    /// each line commented with where its value came from. The one default
    /// store's keys are top-level keys; a fleet's are `[[stores]]` entries.
    pub fn to_toml(&self) -> String {
        let daemon = KEYS.iter().filter(|k| !k.is_store());
        let mut out = String::new();
        match (self.fleet, self.stores.as_slice()) {
            (false, [store]) => {
                let origins = [&self.daemon_origins[..], &store.origins[..]].concat();
                out += &self.rows(KEYS.iter(), Some(store), &origins);
            }
            (_, stores) => {
                out += &self.rows(daemon, None, &self.daemon_origins);
                for store in stores {
                    let name = toml::Value::String(store.name.to_string());
                    out += &format!("\n[[stores]]\nname = {name}\n");
                    let keys = KEYS.iter().filter(|k| k.is_store());
                    out += &self.rows(keys, Some(store), &store.origins);
                }
                for set in &self.sets {
                    let name = toml::Value::String(set.name.to_string());
                    let databases = toml::Value::String(set.databases.clone());
                    out += &format!("\n[[store_sets]]\nname = {name}\ndatabases = {databases}\n");
                    let keys = KEYS.iter().filter(|k| k.is_store());
                    out += &self.rows(keys, Some(&set.template), &set.template.origins);
                }
            }
        }
        out
    }

    /// `key = value  # origin` for each key, aligned; `store`: `None` for
    /// the daemon's keys alone.
    fn rows<'k>(
        &self,
        keys: impl Iterator<Item = &'k Key>,
        store: Option<&StoreConfig>,
        origins: &[(&'static str, String)],
    ) -> String {
        let origin = |key: &str| {
            origins
                .iter()
                .find(|(k, _)| *k == key)
                .map_or("default", |(_, o)| o.as_str())
        };
        let rows: Vec<(&str, String, &str)> = keys
            .filter_map(|k| {
                let value = k.show(&self.daemon, store)?;
                Some((k.name, value, origin(k.name)))
            })
            .collect();
        let width = rows
            .iter()
            .map(|(k, v, _)| k.len() + v.len())
            .max()
            .unwrap_or(0)
            + 3;
        rows.into_iter()
            .map(|(k, v, o)| {
                let line = format!("{k} = {v}");
                format!("{line:<width$}  # {o}\n")
            })
            .collect()
    }
}
