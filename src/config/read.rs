//! What was read (ripgrep's `LowArgs`): each key's value as its parser made
//! it, in a typed field of [`DaemonKeys`] or [`StoreKeys`], with where its
//! text came from.
//!
//! A key's row in [`super::keys::KEYS`] writes its own field (its
//! `update`, ripgrep's `Flag::update`), so a misspelled field or a value of
//! the wrong type does not compile. The settings are built of these structs
//! in one conversion each ([`super::settings`], ripgrep's
//! `HiArgs::from_low_args`), after the rules that span keys
//! ([`super::rules`]) have read them. Also here: the value types of the
//! configuration's own ([`StartFrom`], [`LogFormat`]).

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use crate::engine::profile::{ProfileKind, TombstoneColumn};
use crate::engine::{EngineKind, Ident, QualifiedName};

/// Where the first scan starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartFrom {
    /// The lowest position in the Checkpoints table; `lookback` below the head without one.
    Checkpoints,
    /// The current head: only holes that appear from now on.
    Head,
    /// This position (a backfill from here).
    Position(i64),
}

impl fmt::Display for StartFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartFrom::Checkpoints => f.write_str("checkpoints"),
            StartFrom::Head => f.write_str("head"),
            StartFrom::Position(p) => write!(f, "{p}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// The layer a value came from, in rank order: a value from a later
/// variant wins over one from an earlier (`Ord` is that order). Each
/// layer ([`super::sources`]) is built with its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    /// A key's built-in default.
    Default,
    /// The top level of the config file (figment's own TOML provider).
    File,
    /// A `[[stores]]` or `[[store_sets]]` entry of the config file.
    StoreEntry,
    /// A `GAP_HEALER_*` environment variable.
    Env,
    /// A command-line flag.
    Flag,
}

/// A key's text as the winning layer gave it, and where it came from.
#[derive(Clone, Debug)]
pub struct Given {
    /// The key's name.
    pub key: &'static str,
    /// The text as given (not trimmed: a rule reads the connection string
    /// and its file's path as they are).
    pub text: String,
    /// As problems and `gap-healer config` name it: "flag --gap-timeout".
    pub origin: String,
    pub rank: Origin,
}

/// One key as read: the value its parser made, and where its text came from.
#[derive(Clone, Debug)]
pub struct Read<T> {
    /// `None`: unset, or refused (a problem says why).
    value: Option<T>,
    /// `None`: no layer set the key.
    given: Option<Given>,
}

impl<T> Default for Read<T> {
    fn default() -> Self {
        Read {
            value: None,
            given: None,
        }
    }
}

impl<T> Read<T> {
    /// Reads `given`'s text (trimmed) with `parse`: the key's value, or
    /// none and why the text is refused.
    pub fn read(
        &mut self,
        given: Given,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<(), String> {
        let parsed = parse(given.text.trim());
        self.given = Some(given);
        match parsed {
            Ok(value) => {
                self.value = Some(value);
                Ok(())
            }
            Err(why) => {
                self.value = None;
                Err(why)
            }
        }
    }

    /// The value; `None` when unset or refused.
    pub fn value(&self) -> Option<&T> {
        self.value.as_ref()
    }

    /// Where the key was set, when a layer above the defaults set it.
    pub fn given(&self) -> Option<&Given> {
        self.given.as_ref().filter(|g| g.rank > Origin::Default)
    }

    /// Whether a layer above the defaults set the key (whether or not its
    /// text was valid).
    pub fn is_given(&self) -> bool {
        self.given().is_some()
    }
}

impl<T: Clone> Read<T> {
    /// The value, owned; `None` when unset or refused.
    pub fn get(&self) -> Option<T> {
        self.value.clone()
    }
}

/// A field of what was read, whatever its type: what the reader needs of
/// it besides its row's `update`.
pub trait Slot {
    /// Whether the key has a value (neither unset nor refused).
    fn has_value(&self) -> bool;
}

impl<T> Slot for Read<T> {
    fn has_value(&self) -> bool {
        self.value.is_some()
    }
}

/// The daemon-wide keys as read ([`super::keys::Scope::Daemon`]).
#[derive(Clone, Debug, Default)]
pub struct DaemonKeys {
    pub metrics_addr: Read<SocketAddr>,
    pub discover_interval: Read<Duration>,
    pub log_format: Read<LogFormat>,
    pub log_level: Read<String>,
}

/// One store's keys as read ([`super::keys::Scope::Store`]), in the
/// table's order.
#[derive(Clone, Debug, Default)]
pub struct StoreKeys {
    pub engine: Read<EngineKind>,
    /// Read by a rule, as given ([`super::rules`]).
    pub connection_string: Read<()>,
    /// Read by a rule, as given ([`super::rules`]).
    pub connection_string_file: Read<()>,
    pub schema: Read<Ident>,
    pub gap_timeout: Read<Duration>,
    pub poll_interval: Read<Duration>,
    pub lock_timeout: Read<Duration>,
    pub connect_timeout: Read<Duration>,
    pub start_from: Read<StartFrom>,
    pub lookback: Read<u64>,
    pub scan_page_size: Read<u32>,
    pub dry_run: Read<bool>,
    pub tombstone_stream: Read<String>,
    pub tombstone_type: Read<String>,
    pub profile: Read<ProfileKind>,
    pub table: Read<Ident>,
    pub position_column: Read<Ident>,
    pub columns: Read<Vec<TombstoneColumn>>,
    pub tombstone_stream_id: Read<String>,
    pub leader_election: Read<bool>,
    pub leader_key: Read<String>,
    /// `None`: empty (publish nothing).
    pub watermark_table: Read<Option<QualifiedName>>,
    /// `None`: never.
    pub give_up_after: Read<Option<Duration>>,
}
