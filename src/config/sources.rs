//! The layers, lowest first: the table's defaults, the config file, the
//! environment, the flags. Each is a figment provider that can name where a
//! value came from.

use std::path::Path;

use figment::providers::{Format, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};

use super::keys::{suggest, Key, Unset, KEYS};
use super::{ConfigArgs, Problem, ENV_PREFIX};

/// The config file, and a problem for each key in it the table does not know.
pub(super) fn file(path: &Path) -> Result<(Figment, Vec<Problem>), Problem> {
    let problem = |message: String| Problem {
        key: "config".into(),
        value: Some(path.display().to_string()),
        origin: "flag --config".into(),
        message,
    };
    let text =
        std::fs::read_to_string(path).map_err(|e| problem(format!("cannot read the file: {e}")))?;
    // The parser's own message quotes the offending line, which may hold the
    // connection string: report only its message and the position.
    let table: toml::Table = toml::from_str(&text).map_err(|e| {
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
    let unknown = table
        .keys()
        .filter(|k| Key::find(k).is_none())
        .map(|key| Problem {
            key: key.clone(),
            value: None,
            origin: format!("config file {}", path.display()),
            message: match suggest(key) {
                Some(s) => format!("unknown key (did you mean `{s}`?)"),
                None => "unknown key".into(),
            },
        })
        .collect();
    Ok((Figment::from(Toml::file(path)), unknown))
}

/// A figment provider of raw string values that can name the exact
/// variable or flag a value came from.
pub(super) struct Layer {
    name: &'static str,
    values: Dict,
    origin: fn(&str) -> String,
}

impl Layer {
    /// Each key's [`Unset::Default`].
    pub(super) fn defaults() -> Self {
        let values = KEYS
            .iter()
            .filter_map(|k| match k.unset {
                Unset::Default(text) => Some((k.name.to_string(), Value::from(text))),
                _ => None,
            })
            .collect();
        Layer {
            name: "defaults",
            values,
            origin: |_| "default".into(),
        }
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
            name: "environment",
            values,
            origin: |k| {
                format!(
                    "environment variable {ENV_PREFIX}{}",
                    k.to_ascii_uppercase()
                )
            },
        }
    }

    pub(super) fn flags(args: &ConfigArgs) -> Self {
        let values = args
            .values()
            .map(|(k, v)| (k.to_string(), Value::from(v)))
            .collect();
        Layer {
            name: "flags",
            values,
            origin: |k| format!("flag --{}", k.replace('_', "-")),
        }
    }
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        let origin = self.origin;
        Metadata::named(self.name)
            .interpolater(move |_: &Profile, keys: &[&str]| origin(&keys.join(".")))
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.values.clone()))
    }
}
