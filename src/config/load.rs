//! [`load`]: the configuration from the flags, the file they name and the
//! environment, validated once into [`Settings`] or every problem found.

use std::path::Path;

use super::args::ConfigArgs;
use super::entries::{per_store_only_set_for_all, Entries};
use super::name::StoreName;
use super::problem::{said_once, ConfigError};
use super::rules::Need;
use super::settings::Settings;
use super::sources::{self, Layer, Layers};
use super::validate::{read_daemon, read_store};

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
    let mut daemon = read_daemon(&top);
    problems.append(&mut daemon.problems);
    let fleet = !entries.is_empty() || !set_entries.is_empty();
    let (stores, sets) = if fleet {
        problems.extend(per_store_only_set_for_all(&layers.env, &layers.flags));
        let file_name = args.config.as_deref().unwrap_or(Path::new("?"));
        let entries = Entries {
            stores: &entries,
            sets: &set_entries,
            file: &file_name.display().to_string(),
        };
        entries.read(&layers, need, &mut problems)
    } else {
        let mut read = read_store(&StoreName::default(), &top, None, need);
        problems.append(&mut read.problems);
        (read.store.into_iter().collect(), Vec::new())
    };
    let unique = said_once(problems);
    match daemon.daemon {
        Some(settings) if unique.is_empty() => Ok(Settings {
            daemon: settings,
            daemon_origins: daemon.origins,
            stores,
            sets,
            selected: Vec::new(),
            fleet,
        }),
        _ => Err(ConfigError { problems: unique }),
    }
}
