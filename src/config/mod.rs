//! Configuration: defaults < config file < environment < flags, layered with
//! figment and validated once into [`Settings`].
//!
//! One table, [`KEYS`], describes every key; the flags ([`ConfigArgs`]), the
//! environment names, the file's known keys, the validation and the
//! `gap-healer config` output ([`Settings::to_toml`]) are all derived from it.
//! Keys are daemon-wide ([`DaemonSettings`]) or belong to the store healed
//! ([`StoreConfig`]).
//!
//! The steps, as ripgrep's flags: each key's row parses its text into its
//! typed field of what was read (`read.rs`, ripgrep's `LowArgs`), over the
//! defaults of that struct's `Default`; the rules that span keys read those
//! fields (`rules.rs`); the settings are built of them in one conversion
//! each (`settings.rs`, ripgrep's `HiArgs::from_low_args`). The files, each
//! importing only files before it (and none this one): `read.rs`,
//! `parse.rs` (the value parsers), `problem.rs`, `rules.rs`, `settings.rs`,
//! `keys.rs` (the table), `args.rs` (the flags), `sources.rs` (the layers),
//! `show.rs` (`gap-healer config`), `validate.rs` (one scope's keys read
//! from its layers), `entries.rs` (a fleet file's entries), `load.rs`
//! ([`load`]).
//!
//! Every problem is collected before anything connects, each naming the key,
//! the offending value and where it came from; the caller exits 2.
//!
//! Architecture invariant: nothing outside this module reads the environment or
//! the config file, and nothing here ever prints a connection string unredacted.

mod args;
mod entries;
mod keys;
mod load;
mod name;
mod parse;
mod problem;
mod read;
mod rules;
mod settings;
mod show;
mod sources;
mod validate;

pub use args::{not_read, ConfigArgs, Flags};
pub use keys::{commands, Field, Flag, Heading, Key, Scope, Unset, ENV_PREFIX, KEYS};
pub use load::load;
pub use name::{StoreName, DEFAULT_STORE};
pub use parse::{parse_duration, parse_identifier};
pub use problem::{ConfigError, Problem};
pub use read::{LogFormat, StartFrom};
pub use rules::Need;
pub use settings::{
    DaemonSettings, Election, Settings, Store, StoreConfig, StoreSet, DATABASE_PLACEHOLDER,
};

#[cfg(test)]
mod tests;
