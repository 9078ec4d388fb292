//! The table of configuration keys.
//!
//! Each row of [`KEYS`] says everything about one key: its name (from which
//! the flag `--<name-with-dashes>` and the environment variable
//! `GAP_HEALER_<NAME>` derive), its help line and heading, the commands
//! that read it, its default, how its text becomes its typed field of what
//! was read ([`DaemonKeys`] or [`StoreKeys`]; the row's `update`, as
//! ripgrep's `Flag::update`) and how the field of [`DaemonSettings`] or
//! [`StoreConfig`] built of it is shown by `gap-healer config`. Adding a
//! key is one row here, its field in [`super::read`] and that field in its
//! settings' one conversion ([`super::settings`]); a row that names a field
//! that does not exist, or parses a value of another type, does not compile.
//!
//! Three rules span several keys and live in [`super::rules`]: `engine` is
//! required, the connection string comes from exactly one of
//! `connection_string` and `connection_string_file`, and `leader_key` defaults
//! to `gap-healer:<schema>`.

use std::time::Duration;

use crate::engine::profile::{parse_columns, render_columns, ProfileKind};
use crate::engine::{EngineKind, QualifiedName};

use super::parse::{
    closest, parse_bool, parse_duration, parse_identifier, parse_log_level, parse_name,
    parse_start_from, parse_uuid,
};
use super::read::{DaemonKeys, Given, LogFormat, Slot, StartFrom, StoreKeys};
use super::settings::{DaemonSettings, StoreConfig};

/// The prefix of every key's environment variable, `GAP_HEALER_<NAME>`.
pub const ENV_PREFIX: &str = "GAP_HEALER_";

/// One configuration key.
#[derive(Debug)]
pub struct Key {
    /// The TOML key. The flag is `--<name-with-dashes>`, the environment
    /// variable `GAP_HEALER_<NAME>`.
    pub name: &'static str,
    /// The `--help` line; the default is appended to it.
    pub help: &'static str,
    pub flag: Flag,
    pub unset: Unset,
    /// Which settings the key belongs to, and how it reads and shows its value.
    pub scope: Scope,
    /// Where `--help` lists its flag.
    pub heading: Heading,
    /// The commands that read the key, and so take its flag: bits of
    /// [`commands`] (`config`, which shows every key, takes them all).
    pub commands: u16,
}

/// The commands that take configuration flags, as bits of [`Key::commands`].
/// A command takes the flags of the keys it reads, and no others: a flag
/// another command reads is refused (`scan --metrics-addr`), not ignored.
pub mod commands {
    pub const RUN: u16 = 1 << 0;
    pub const SCAN: u16 = 1 << 1;
    pub const HEAL: u16 = 1 << 2;
    pub const CHECK: u16 = 1 << 3;
    pub const SQL: u16 = 1 << 4;
    pub const INSTALL: u16 = 1 << 5;
    /// `config` shows every key, so it takes every flag.
    pub const CONFIG: u16 = 1 << 6;
    /// Every command with a store.
    pub const ALL: u16 = RUN | SCAN | HEAL | CHECK | SQL | INSTALL | CONFIG;
    /// The commands that name a store (`sql` too: it prints the store's set-up).
    pub const STORE_COMMANDS: u16 = RUN | SCAN | HEAL | CHECK | SQL | INSTALL;
    /// The commands that connect to the store (and log).
    pub const CONNECTING: u16 = RUN | SCAN | HEAL | CHECK | INSTALL;
    /// The commands that scan.
    pub const SCANNING: u16 = RUN | SCAN | HEAL;
    /// Each command's bit and name.
    pub const NAMES: [(u16, &str); 7] = [
        (RUN, "run"),
        (SCAN, "scan"),
        (HEAL, "heal"),
        (CHECK, "check"),
        (SQL, "sql"),
        (INSTALL, "install"),
        (CONFIG, "config"),
    ];

    /// The names of the commands among `bits`.
    pub fn names(bits: u16) -> Vec<&'static str> {
        NAMES
            .iter()
            .filter(|(bit, _)| bits & bit != 0)
            .map(|(_, name)| *name)
            .collect()
    }
}

use commands::{CHECK, CONNECTING, HEAL, RUN, SCAN, SCANNING, SQL, STORE_COMMANDS};

/// The `--help` sections the key flags are listed in, in this order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Heading {
    /// Which store, and how to reach it.
    Store,
    /// What the store's table is, and its tombstones and watermark.
    Table,
    /// Where a scan starts and how it reads.
    Scan,
    /// When and how holes are filled.
    Fill,
    /// The daemon's own: polling, leadership, HTTP, giving up.
    Daemon,
    Logging,
}

impl Heading {
    pub fn title(self) -> &'static str {
        match self {
            Heading::Store => "Store",
            Heading::Table => "Table",
            Heading::Scan => "Scan",
            Heading::Fill => "Fill",
            Heading::Daemon => "Daemon",
            Heading::Logging => "Logging",
        }
    }
}

/// How a key is written on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flag {
    /// `--key VALUE`; the text is the value's placeholder in `--help`.
    Value(&'static str),
    /// A boolean: `--key` (true), `--key=BOOL`, or `--no-key` (false).
    Switch,
}

/// What an unset key means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unset {
    /// The value its field of what was read has by default (`StoreKeys`'
    /// or `DaemonKeys`' `Default` in `read.rs`, origin "default"), shown
    /// in `--help` as its text ([`Key::default_text`]).
    Default,
    /// A problem: the key must be set.
    Required,
    /// Computed from other keys after the table is read; the text describes
    /// it in `--help`.
    Derived(&'static str),
    /// Left unset; a rule after the table decides (the connection string).
    Optional,
}

/// Which settings a key fills: one for the daemon, or one per store (the
/// store keys are what a later `[[stores]]` entry can override).
#[derive(Debug)]
pub enum Scope {
    Daemon(Field<DaemonKeys, DaemonSettings>),
    Store(Field<StoreKeys, StoreConfig>),
}

/// How a key reads its text into its field of `K`, what was read
/// (`read.rs`), and shows the field of `S`, the settings built of it, back
/// as a TOML value. Written with `field!`, which names the field once.
#[derive(Debug)]
pub struct Field<K, S> {
    /// ripgrep's `Flag::update`: parses the text a layer gave into the
    /// key's field of `K`, noting where it came from; `Err`: why the text
    /// is refused.
    pub update: fn(&mut K, Given) -> Result<(), String>,
    /// The key's field of `K`.
    pub slot: fn(&mut K) -> &mut dyn Slot,
    /// `None`: not shown by `gap-healer config`.
    pub render: Option<fn(&S) -> String>,
}

/// A key's [`Field`]: `field!(name, parse, render)` reads the text, trimmed,
/// with `parse` into the field `name` of what was read, and shows the
/// settings with `render` (`field!(name, parse)`: not shown).
macro_rules! field {
    ($name:ident, $parse:expr $(,)?) => {
        Field {
            update: |keys, given| keys.$name.read(given, $parse),
            slot: |keys| &mut keys.$name,
            render: None,
        }
    };
    ($name:ident, $parse:expr, $render:expr $(,)?) => {
        Field {
            update: |keys, given| keys.$name.read(given, $parse),
            slot: |keys| &mut keys.$name,
            render: Some($render),
        }
    };
}

/// Every key the configuration knows, in the order of `--help` and
/// `gap-healer config`.
pub const KEYS: &[Key] = &[
    Key {
        name: "engine",
        heading: Heading::Store,
        commands: STORE_COMMANDS,
        help: "Database engine: mssql or postgres",
        flag: Flag::Value("ENGINE"),
        unset: Unset::Required,
        scope: Scope::Store(field!(
            engine,
            |v| {
                EngineKind::parse(v).ok_or_else(|| {
                    let names = EngineKind::NAMES.join(", ");
                    format!("unknown engine; expected one of {names}")
                })
            },
            |s| quote(s.engine.as_str()),
        )),
    },
    Key {
        name: "connection_string",
        heading: Heading::Store,
        commands: STORE_COMMANDS,
        help: "ADO.NET string (mssql) or libpq string/URL (postgres). Prefer the environment variable GAP_HEALER_CONNECTION_STRING: flags show in `ps`",
        flag: Flag::Value("STRING"),
        unset: Unset::Optional,
        scope: Scope::Store(field!(connection_string, by_rule, |s| {
            quote(&s.store.connection_string.redacted())
        })),
    },
    Key {
        name: "connection_string_file",
        heading: Heading::Store,
        commands: STORE_COMMANDS,
        help: "File holding the connection string (a mounted Secret, a systemd credential)",
        flag: Flag::Value("FILE"),
        unset: Unset::Optional,
        // Shown as the origin of connection_string.
        scope: Scope::Store(field!(connection_string_file, by_rule)),
    },
    Key {
        name: "schema",
        heading: Heading::Store,
        commands: STORE_COMMANDS,
        help: "Schema of the event store's tables",
        flag: Flag::Value("NAME"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            schema,
            parse_identifier,
            |s| quote(s.store.schema.as_str()),
        )),
    },
    Key {
        name: "gap_timeout",
        heading: Heading::Fill,
        commands: RUN | HEAL | CHECK,
        help: "How long gap-healer waits, from when it first sees a hole, before filling it",
        flag: Flag::Value("DURATION"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            gap_timeout,
            |v| parse_duration(v, Duration::ZERO),
            |s| duration(s.gap_timeout),
        )),
    },
    Key {
        name: "poll_interval",
        heading: Heading::Daemon,
        commands: RUN,
        help: "Time between scans for new rows",
        flag: Flag::Value("DURATION"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            poll_interval,
            |v| parse_duration(v, Duration::from_millis(10)),
            |s| duration(s.poll_interval),
        )),
    },
    Key {
        name: "lock_timeout",
        heading: Heading::Fill,
        commands: RUN | HEAL | CHECK,
        help: "Longest wait of a fill on a position an open append holds",
        flag: Flag::Value("DURATION"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            lock_timeout,
            |v| parse_duration(v, Duration::from_millis(1)),
            |s| duration(s.lock_timeout),
        )),
    },
    Key {
        name: "connect_timeout",
        heading: Heading::Store,
        commands: CONNECTING,
        help: "Longest wait for a new database connection",
        flag: Flag::Value("DURATION"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            connect_timeout,
            |v| parse_duration(v, Duration::from_millis(100)),
            |s| duration(s.store.connect_timeout),
        )),
    },
    Key {
        name: "metrics_addr",
        heading: Heading::Daemon,
        commands: RUN,
        help: "Address of the HTTP endpoints: /metrics, /healthz, /readyz, /status (and / listing them)",
        flag: Flag::Value("HOST:PORT"),
        unset: Unset::Default,
        scope: Scope::Daemon(field!(
            metrics_addr,
            |v| {
                v.parse().map_err(|_| {
                    "expected HOST:PORT with an IP address, e.g. 0.0.0.0:9477 or [::1]:9477".into()
                })
            },
            |d| quote(&d.metrics_addr.to_string()),
        )),
    },
    Key {
        name: "discover_interval",
        heading: Heading::Daemon,
        commands: RUN,
        help: "How often each [[store_sets]] entry's databases are listed again (stores appear and vanish without a restart)",
        flag: Flag::Value("DURATION"),
        unset: Unset::Default,
        scope: Scope::Daemon(field!(
            discover_interval,
            |v| parse_duration(v, Duration::from_secs(1)),
            |d| quote(&plain_duration(d.discover_interval)),
        )),
    },
    Key {
        name: "replica",
        heading: Heading::Daemon,
        commands: RUN,
        help: "This daemon's name among the replicas that heal the same stores: they divide the stores by it (empty: the host's name, which Kubernetes sets to the pod's, and the process id)",
        flag: Flag::Value("NAME"),
        unset: Unset::Default,
        scope: Scope::Daemon(field!(
            replica,
            |v| Ok(Some(v.trim().to_string()).filter(|v| !v.is_empty())),
            |d| quote(&d.replica.clone().unwrap_or_default()),
        )),
    },
    Key {
        name: "start_from",
        heading: Heading::Scan,
        commands: SCANNING,
        help: "Where the first scan starts: checkpoints, head, or a position",
        flag: Flag::Value("FROM"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            start_from,
            parse_start_from,
            |s| match s.start_from {
                StartFrom::Position(p) => p.to_string(),
                other => quote(&other.to_string()),
            },
        )),
    },
    Key {
        name: "lookback",
        heading: Heading::Scan,
        commands: SCANNING,
        help: "Positions below the head to start from when there are no checkpoints",
        flag: Flag::Value("POSITIONS"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            lookback,
            |v| {
                let n = v.parse::<u64>().ok().filter(|n| *n <= i64::MAX as u64);
                n.ok_or_else(|| "expected a whole number of positions, 0 or more".into())
            },
            |s| s.lookback.to_string(),
        )),
    },
    Key {
        name: "scan_page_size",
        heading: Heading::Scan,
        commands: SCANNING,
        help: "Rows read per scan query",
        flag: Flag::Value("ROWS"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            scan_page_size,
            |v| {
                let n = v.parse::<u32>().ok().filter(|n| (100..=1_000_000).contains(n));
                n.ok_or_else(|| "expected a number of rows from 100 to 1000000".into())
            },
            |s| s.scan_page_size.to_string(),
        )),
    },
    Key {
        name: "dry_run",
        heading: Heading::Fill,
        commands: RUN | HEAL,
        help: "Find and report holes, never write",
        flag: Flag::Switch,
        unset: Unset::Default,
        scope: Scope::Store(field!(
            dry_run,
            parse_bool,
            |s| s.dry_run.to_string(),
        )),
    },
    Key {
        name: "log_format",
        heading: Heading::Logging,
        commands: CONNECTING,
        help: "Log format: text or json",
        flag: Flag::Value("FORMAT"),
        unset: Unset::Default,
        scope: Scope::Daemon(field!(
            log_format,
            |v| match v.to_ascii_lowercase().as_str() {
                "text" => Ok(LogFormat::Text),
                "json" => Ok(LogFormat::Json),
                _ => Err("expected text or json".into()),
            },
            |d| {
                quote(match d.log_format {
                    LogFormat::Text => "text",
                    LogFormat::Json => "json",
                })
            },
        )),
    },
    Key {
        name: "log_level",
        heading: Heading::Logging,
        commands: CONNECTING,
        help: "Log level or tracing filter; RUST_LOG overrides it",
        flag: Flag::Value("LEVEL"),
        unset: Unset::Default,
        scope: Scope::Daemon(field!(
            log_level,
            parse_log_level,
            |d| quote(&d.log_level),
        )),
    },
    Key {
        name: "tombstone_stream",
        heading: Heading::Table,
        commands: STORE_COMMANDS,
        help: "Stream that owns the tombstones (unset: $gap for ledger-core, $gap-healer-tombstones for sqlstreamstore)",
        flag: Flag::Value("NAME"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            tombstone_stream,
            |v| parse_name(v, 850),
            |s| s.unless_custom(&s.store.tombstone_stream),
        )),
    },
    Key {
        name: "tombstone_type",
        heading: Heading::Table,
        commands: STORE_COMMANDS,
        help: "Message type of the tombstones (unset: $gap-healer-tombstone for sqlstreamstore)",
        flag: Flag::Value("TYPE"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            tombstone_type,
            |v| parse_name(v, 128),
            |s| s.unless_custom(&s.store.tombstone_type),
        )),
    },
    Key {
        name: "profile",
        heading: Heading::Table,
        commands: STORE_COMMANDS,
        help: "What the healed table is: eventuous (Eventuous's messages), ledger-core (seed 003's events table; PostgreSQL), sqlstreamstore (SQLStreamStore's messages) or custom (the table, position_column and columns keys describe it)",
        flag: Flag::Value("eventuous|ledger-core|sqlstreamstore|custom"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            profile,
            ProfileKind::parse,
            |s| quote(s.store.profile.kind.name()),
        )),
    },
    Key {
        name: "table",
        heading: Heading::Table,
        commands: STORE_COMMANDS,
        help: "The healed table in `schema` (ledger-core and custom)",
        flag: Flag::Value("NAME"),
        unset: Unset::Derived("messages for eventuous and sqlstreamstore, events for ledger-core"),
        scope: Scope::Store(field!(
            table,
            |v| parse_identifier(v).map(|n| n.to_lowercase()),
            |s| quote(s.store.profile.table.as_str()),
        )),
    },
    Key {
        name: "position_column",
        heading: Heading::Table,
        commands: STORE_COMMANDS,
        help: "The table's identity position column (ledger-core and custom)",
        flag: Flag::Value("NAME"),
        unset: Unset::Derived(
            "global_position for eventuous, position for ledger-core and sqlstreamstore",
        ),
        scope: Scope::Store(field!(
            position_column,
            |v| parse_identifier(v).map(|n| n.to_lowercase()),
            |s| quote(s.store.profile.position.as_str()),
        )),
    },
    Key {
        name: "columns",
        heading: Heading::Table,
        commands: STORE_COMMANDS,
        help: "custom: the tombstone row, a TOML table of column = \"uuid\" | \"now\" | \"now_utc\" | { literal = VALUE } | { next_version = [\"stream key column\", ...] }",
        flag: Flag::Value("TOML"),
        unset: Unset::Optional,
        scope: Scope::Store(field!(
            columns,
            |v| parse_columns(v, parse_identifier),
            |s| match &s.store.profile {
                t if t.kind == ProfileKind::Custom => render_columns(t.columns()),
                _ => String::new(),
            },
        )),
    },
    Key {
        name: "tombstone_stream_id",
        heading: Heading::Table,
        commands: STORE_COMMANDS,
        help: "ledger-core: the tombstone stream's stream_id (its stream_category is tombstone_stream, default $gap for this profile)",
        flag: Flag::Value("UUID"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            tombstone_stream_id,
            parse_uuid,
            // The ledger-core tombstone's own stream_id literal.
            |s| match &s.store.profile {
                t if t.kind == ProfileKind::LedgerCore => {
                    let id = t.literals().get("stream_id").cloned();
                    id.as_ref().and_then(|v| v.as_str()).map(quote).unwrap_or_default()
                }
                _ => String::new(),
            },
        )),
    },
    Key {
        name: "leader_election",
        heading: Heading::Daemon,
        commands: RUN,
        help: "Take the store's leader lock before filling; false only for a single instance",
        flag: Flag::Switch,
        unset: Unset::Default,
        scope: Scope::Store(field!(
            leader_election,
            parse_bool,
            |s| s.election.is_on().to_string(),
        )),
    },
    Key {
        name: "leader_key",
        heading: Heading::Daemon,
        commands: RUN,
        help: "Name of the leader lock; healers sharing it elect one filler",
        flag: Flag::Value("NAME"),
        unset: Unset::Derived("gap-healer:<schema>"),
        scope: Scope::Store(field!(
            leader_key,
            |v| parse_name(v, 255),
            |s| quote(&s.leader_key),
        )),
    },
    Key {
        name: "watermark_table",
        heading: Heading::Table,
        commands: RUN | SCAN | HEAL | CHECK | SQL,
        help: "Publish the contiguous watermark in this table (schema.table); empty: do not",
        flag: Flag::Value("SCHEMA.TABLE"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            watermark_table,
            |v| match v {
                "" => Ok(None),
                v => Ok(Some(QualifiedName::parse(v)?.to_lowercase())),
            },
            |s| quote(&s.store.watermark_table.as_ref().map(QualifiedName::name).unwrap_or_default()),
        )),
    },
    Key {
        name: "give_up_after",
        heading: Heading::Daemon,
        commands: RUN,
        help: "`run` exits 3 once its scans have failed for this long without a success (database unreachable, tables missing); `never` keeps retrying",
        flag: Flag::Value("DURATION|never"),
        unset: Unset::Default,
        scope: Scope::Store(field!(
            give_up_after,
            |v| match v {
                v if v.eq_ignore_ascii_case("never") => Ok(None),
                v => parse_duration(v, Duration::from_secs(1))
                    .map(Some)
                    .map_err(|e| format!("{e}; or never")),
            },
            |s| quote(&s.give_up_after.map_or("never".into(), plain_duration)),
        )),
    },
];

impl Key {
    /// The row named `name`.
    pub fn find(name: &str) -> Option<&'static Key> {
        KEYS.iter().find(|k| k.name == name)
    }

    /// `GAP_HEALER_<NAME>`.
    pub fn env(&self) -> String {
        format!("{ENV_PREFIX}{}", self.name.to_ascii_uppercase())
    }

    /// `<name-with-dashes>`, the flag without its `--`.
    pub fn long(&self) -> String {
        self.name.replace('_', "-")
    }

    /// The help line with the default, as `--help` shows it.
    pub fn help_line(&self) -> String {
        match (self.unset, self.default_text()) {
            (Unset::Default, Some(d)) => format!("{} [default: {d}]", self.help),
            (Unset::Derived(d), _) => format!("{} [default: {d}]", self.help),
            _ => self.help.to_string(),
        }
    }

    /// The default as text, as `--help` shows it: the value its field of
    /// what was read has by default, written as the key's text. `None`:
    /// no default.
    pub fn default_text(&self) -> Option<String> {
        match &self.scope {
            Scope::Daemon(f) => (f.slot)(&mut DaemonKeys::default()).text(),
            Scope::Store(f) => (f.slot)(&mut StoreKeys::default()).text(),
        }
    }

    pub fn is_store(&self) -> bool {
        matches!(self.scope, Scope::Store(_))
    }

    /// Whether `command` (a bit of [`commands`]) takes this key's flag.
    pub fn taken_by(&self, command: u16) -> bool {
        command == commands::CONFIG || self.commands & command != 0
    }

    /// The key's field of the daemon's keys; `None` for a store key.
    pub fn daemon(&self) -> Option<&Field<DaemonKeys, DaemonSettings>> {
        match &self.scope {
            Scope::Daemon(f) => Some(f),
            Scope::Store(_) => None,
        }
    }

    /// The key's field of a store's keys; `None` for a daemon key.
    pub fn store(&self) -> Option<&Field<StoreKeys, StoreConfig>> {
        match &self.scope {
            Scope::Store(f) => Some(f),
            Scope::Daemon(_) => None,
        }
    }

    /// The field this key fills, as a TOML value; `None` when not shown
    /// (never, not for this store: a render that gives nothing, or a store
    /// key where only the daemon's settings are shown).
    pub fn show(&self, daemon: &DaemonSettings, store: Option<&StoreConfig>) -> Option<String> {
        match &self.scope {
            Scope::Daemon(f) => f.render.map(|r| r(daemon)),
            Scope::Store(f) => f.render.zip(store).map(|(r, s)| r(s)),
        }
        .filter(|v| !v.is_empty())
    }
}

/// The parser of the keys a rule reads after the table, as given
/// ([`super::rules`]): it keeps nothing.
fn by_rule(_: &str) -> Result<(), String> {
    Ok(())
}

fn quote(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn plain_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn duration(d: Duration) -> String {
    quote(&plain_duration(d))
}

/// The closest known key to a typo, when it is close.
pub fn suggest(key: &str) -> Option<&'static str> {
    let normal = key.to_ascii_lowercase().replace('-', "_");
    closest(&normal, KEYS.iter().map(|k| k.name), 3)
}

#[cfg(test)]
mod tests {
    use super::super::parse::LEVELS;
    use super::super::read::Origin;
    use super::*;

    #[test]
    fn names_are_unique_lowercase_snake_case() {
        for (i, k) in KEYS.iter().enumerate() {
            assert!(
                k.name.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{}",
                k.name
            );
            assert!(
                KEYS[..i].iter().all(|o| o.name != k.name),
                "{} twice",
                k.name
            );
            assert!(!k.help.is_empty(), "{} has no help", k.name);
        }
    }

    /// The defaults are written once, in what was read's `Default`: a key
    /// has one exactly when its row says so, and its text, as `--help`
    /// shows it, reads back through the key's own parser as the same value.
    #[test]
    fn every_default_is_its_rows_and_reads_back_as_itself() {
        fn reads_back<K: Default, S>(key: &Key, f: &Field<K, S>) -> Option<String> {
            let text = (f.slot)(&mut K::default()).text()?;
            let given = Given {
                key: key.name,
                text: text.clone(),
                origin: "--help".into(),
                rank: Origin::Flag,
            };
            let mut read = K::default();
            let parsed = (f.update)(&mut read, given);
            assert!(
                parsed.is_ok(),
                "the default of {}: {text:?}: {parsed:?}",
                key.name
            );
            let again = (f.slot)(&mut read).text();
            assert_eq!(again.as_ref(), Some(&text), "the default of {}", key.name);
            Some(text)
        }
        for k in KEYS {
            let default = match &k.scope {
                Scope::Daemon(f) => reads_back(k, f),
                Scope::Store(f) => reads_back(k, f),
            };
            assert_eq!(
                default.is_some(),
                k.unset == Unset::Default,
                "{}: {default:?}, {:?}",
                k.name,
                k.unset
            );
            assert_eq!(default, k.default_text(), "{}", k.name);
        }
    }

    #[test]
    fn the_scopes_split_daemon_and_store() {
        let daemon: Vec<_> = KEYS
            .iter()
            .filter(|k| !k.is_store())
            .map(|k| k.name)
            .collect();
        assert_eq!(
            daemon,
            [
                "metrics_addr",
                "discover_interval",
                "replica",
                "log_format",
                "log_level"
            ]
        );
    }

    #[test]
    fn suggestions() {
        assert_eq!(suggest("gap_timout"), Some("gap_timeout"));
        assert_eq!(suggest("Poll-Interval"), Some("poll_interval"));
        assert_eq!(suggest("leader_keys"), Some("leader_key"));
        assert_eq!(suggest("password"), None);
        assert_eq!(closest("wran", LEVELS, 2), Some("warn"));
        assert_eq!(closest("verbose", LEVELS, 2), None);
    }
}
