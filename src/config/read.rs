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

use crate::engine::profile::{render_columns, ProfileKind, TombstoneColumn, NIL_UUID};
use crate::engine::{
    EngineKind, Ident, QualifiedName, DEFAULT_TOMBSTONE_STREAM, DEFAULT_TOMBSTONE_TYPE,
};

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
/// layer ([`super::sources`]) is built with its own. A key no layer sets
/// has its default ([`StoreKeys`]' and [`DaemonKeys`]' `Default`), which
/// `gap-healer config` shows as from "default".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
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
    /// `None`: unset without a default, or refused (a problem says why).
    value: Option<T>,
    /// `None`: no layer set the key.
    given: Option<Given>,
}

impl<T> Read<T> {
    /// A key without a default: unset until a layer sets it.
    pub const fn unset() -> Self {
        Read {
            value: None,
            given: None,
        }
    }

    /// A key whose value is `value` until a layer sets it.
    pub const fn defaults_to(value: T) -> Self {
        Read {
            value: Some(value),
            given: None,
        }
    }

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

    /// The value (the default, if no layer set the key); `None` when
    /// unset without a default, or refused.
    pub fn value(&self) -> Option<&T> {
        self.value.as_ref()
    }

    /// Where the key was set, when a layer set it.
    pub fn given(&self) -> Option<&Given> {
        self.given.as_ref()
    }

    /// Whether a layer set the key (whether or not its text was valid).
    pub fn is_given(&self) -> bool {
        self.given().is_some()
    }
}

impl<T: Clone> Read<T> {
    /// The value, owned; `None` when unset without a default, or refused.
    pub fn get(&self) -> Option<T> {
        self.value.clone()
    }
}

/// A field of what was read, whatever its type: what the reader and
/// `--help` need of it besides its row's `update`.
pub trait Slot {
    /// Whether the key has a value (neither unset nor refused).
    fn has_value(&self) -> bool;
    /// Forgets the value and the default: the layer that wins gave no
    /// text (a table or a list, a problem says so), so the key is read as
    /// set nowhere and without a value.
    fn clear(&mut self);
    /// The value as its key's text; `None` without one. Of a default, what
    /// `--help` shows.
    fn text(&self) -> Option<String>;
}

impl<T: KeyText> Slot for Read<T> {
    fn has_value(&self) -> bool {
        self.value.is_some()
    }

    fn clear(&mut self) {
        *self = Read::unset();
    }

    fn text(&self) -> Option<String> {
        self.value.as_ref().map(KeyText::text)
    }
}

/// A value written as its key's text: the text its key's parser reads back
/// as the same value (a test holds every default to it).
pub trait KeyText {
    fn text(&self) -> String;
}

impl KeyText for Duration {
    fn text(&self) -> String {
        humantime::format_duration(*self).to_string()
    }
}

/// `give_up_after`: `None` is never.
impl KeyText for Option<Duration> {
    fn text(&self) -> String {
        self.as_ref().map_or("never".into(), KeyText::text)
    }
}

/// `replica`: `None` is empty.
impl KeyText for Option<String> {
    fn text(&self) -> String {
        self.clone().unwrap_or_default()
    }
}

/// `watermark_table`: `None` is empty.
impl KeyText for Option<QualifiedName> {
    fn text(&self) -> String {
        self.as_ref().map(QualifiedName::name).unwrap_or_default()
    }
}

impl KeyText for LogFormat {
    fn text(&self) -> String {
        match self {
            LogFormat::Text => "text".into(),
            LogFormat::Json => "json".into(),
        }
    }
}

impl KeyText for EngineKind {
    fn text(&self) -> String {
        self.as_str().into()
    }
}

impl KeyText for Ident {
    fn text(&self) -> String {
        self.as_str().into()
    }
}

impl KeyText for ProfileKind {
    fn text(&self) -> String {
        self.name().into()
    }
}

impl KeyText for Vec<TombstoneColumn> {
    fn text(&self) -> String {
        render_columns(self)
    }
}

/// The keys a rule reads as given (the connection string and its file)
/// keep no value of their own.
impl KeyText for () {
    fn text(&self) -> String {
        String::new()
    }
}

macro_rules! key_text_by_display {
    ($($ty:ty),*) => {
        $(impl KeyText for $ty {
            fn text(&self) -> String {
                self.to_string()
            }
        })*
    };
}

key_text_by_display!(String, SocketAddr, StartFrom, u64, u32, bool);

/// The daemon-wide keys as read ([`super::keys::Scope::Daemon`]).
#[derive(Clone, Debug)]
pub struct DaemonKeys {
    pub metrics_addr: Read<SocketAddr>,
    pub discover_interval: Read<Duration>,
    /// `None`: [`crate::replicas::Replica::default_name`].
    pub replica: Read<Option<String>>,
    pub log_format: Read<LogFormat>,
    pub log_level: Read<String>,
}

/// One store's keys as read ([`super::keys::Scope::Store`]), in the
/// table's order.
#[derive(Clone, Debug)]
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

/// The defaults of the daemon's keys: the one place they are written
/// (`--help` shows them, `gap-healer config` says "default").
impl Default for DaemonKeys {
    fn default() -> Self {
        DaemonKeys {
            metrics_addr: Read::defaults_to(SocketAddr::from(([0, 0, 0, 0], 9477))),
            discover_interval: Read::defaults_to(Duration::from_secs(5 * 60)),
            replica: Read::defaults_to(None),
            log_format: Read::defaults_to(LogFormat::Text),
            log_level: Read::defaults_to("info".into()),
        }
    }
}

/// The defaults of a store's keys: the one place they are written
/// (`--help` shows them, `gap-healer config` says "default"). A key
/// without one is required, or left to a rule ([`super::keys::Unset`]).
impl Default for StoreKeys {
    fn default() -> Self {
        StoreKeys {
            engine: Read::unset(),
            connection_string: Read::unset(),
            connection_string_file: Read::unset(),
            schema: Read::defaults_to(Ident::parse("eventuous").expect("a plain identifier")),
            gap_timeout: Read::defaults_to(Duration::from_secs(5)),
            poll_interval: Read::defaults_to(Duration::from_millis(250)),
            lock_timeout: Read::defaults_to(Duration::from_secs(2)),
            connect_timeout: Read::defaults_to(Duration::from_secs(5)),
            start_from: Read::defaults_to(StartFrom::Checkpoints),
            lookback: Read::defaults_to(1_000_000),
            scan_page_size: Read::defaults_to(10_000),
            dry_run: Read::defaults_to(false),
            // The engines' (and Eventuous's) convention.
            tombstone_stream: Read::defaults_to(DEFAULT_TOMBSTONE_STREAM.into()),
            tombstone_type: Read::defaults_to(DEFAULT_TOMBSTONE_TYPE.into()),
            profile: Read::defaults_to(ProfileKind::Eventuous),
            table: Read::unset(),
            position_column: Read::unset(),
            columns: Read::unset(),
            tombstone_stream_id: Read::defaults_to(NIL_UUID.into()),
            leader_election: Read::defaults_to(true),
            leader_key: Read::unset(),
            watermark_table: Read::defaults_to(None),
            give_up_after: Read::defaults_to(None),
        }
    }
}
