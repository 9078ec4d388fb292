//! Configuration: defaults < config file < environment < flags, layered with
//! figment and validated once into [`Settings`].
//!
//! Every problem is collected before anything connects, each naming the key,
//! the offending value and where it came from; the caller exits 2.
//!
//! Architecture invariant: nothing outside this module reads the environment or
//! the config file, and nothing here ever prints a connection string unredacted.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Format, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider, Source};

use crate::engine::{EngineKind, StoreSettings};
use crate::secret::ConnectionString;

pub const DEFAULT_SCHEMA: &str = "eventuous";
pub const DEFAULT_GAP_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(250);
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_METRICS_ADDR: &str = "0.0.0.0:9477";
pub const DEFAULT_LOOKBACK: u64 = 1_000_000;
pub const DEFAULT_SCAN_PAGE_SIZE: u32 = 10_000;
pub const DEFAULT_TOMBSTONE_STREAM: &str = "__tombstones__";
pub const DEFAULT_TOMBSTONE_TYPE: &str = "$tombstone";
pub const DEFAULT_LOG_LEVEL: &str = "info";
pub const ENV_PREFIX: &str = "GAP_HEALER_";

/// Every key the configuration knows: TOML key, environment variable
/// `GAP_HEALER_<KEY>`, and flag `--<key-with-dashes>`.
pub const KEYS: &[&str] = &[
    "engine",
    "connection_string",
    "connection_string_file",
    "schema",
    "gap_timeout",
    "poll_interval",
    "lock_timeout",
    "connect_timeout",
    "metrics_addr",
    "start_from",
    "lookback",
    "scan_page_size",
    "dry_run",
    "log_format",
    "log_level",
    "tombstone_stream",
    "tombstone_type",
    "leader_election",
    "leader_key",
    "give_up_after",
];

/// The flags every subcommand accepts. Values stay raw strings here so that
/// one validator reports every problem, whatever layer it came from.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConfigArgs {
    /// TOML configuration file (keys as in config/gap-healer.toml).
    #[arg(long, global = true, value_name = "FILE", allow_hyphen_values = true)]
    pub config: Option<PathBuf>,
    /// Database engine: mssql or postgres.
    #[arg(long, global = true, value_name = "ENGINE", allow_hyphen_values = true)]
    pub engine: Option<String>,
    /// ADO.NET string (mssql) or libpq string/URL (postgres). Prefer the
    /// environment variable GAP_HEALER_CONNECTION_STRING: flags show in `ps`.
    #[arg(long, global = true, value_name = "STRING", allow_hyphen_values = true)]
    pub connection_string: Option<String>,
    /// File holding the connection string (a mounted Secret, a systemd credential).
    #[arg(long, global = true, value_name = "FILE", allow_hyphen_values = true)]
    pub connection_string_file: Option<String>,
    /// Schema of the event store's tables [default: eventuous].
    #[arg(long, global = true, value_name = "NAME", allow_hyphen_values = true)]
    pub schema: Option<String>,
    /// Age a hole must reach before it is filled (Eventuous' GapHandlingTimeoutMs) [default: 5s].
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub gap_timeout: Option<String>,
    /// Time between scans for new rows [default: 250ms].
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub poll_interval: Option<String>,
    /// Longest wait of a fill on a position an open append holds [default: 2s].
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub lock_timeout: Option<String>,
    /// Longest wait for a new database connection [default: 5s].
    #[arg(
        long,
        global = true,
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub connect_timeout: Option<String>,
    /// Address of /metrics, /healthz, /readyz [default: 0.0.0.0:9477].
    #[arg(
        long,
        global = true,
        value_name = "HOST:PORT",
        allow_hyphen_values = true
    )]
    pub metrics_addr: Option<String>,
    /// Where the first scan starts: checkpoints, head, or a position [default: checkpoints].
    #[arg(long, global = true, value_name = "FROM", allow_hyphen_values = true)]
    pub start_from: Option<String>,
    /// Positions below the head to start from when there are no checkpoints [default: 1000000].
    #[arg(
        long,
        global = true,
        value_name = "POSITIONS",
        allow_hyphen_values = true
    )]
    pub lookback: Option<String>,
    /// Rows read per scan query [default: 10000].
    #[arg(long, global = true, value_name = "ROWS", allow_hyphen_values = true)]
    pub scan_page_size: Option<String>,
    /// Find and report holes, never write.
    #[arg(long, global = true)]
    pub dry_run: bool,
    /// Log format: text or json [default: text].
    #[arg(long, global = true, value_name = "FORMAT", allow_hyphen_values = true)]
    pub log_format: Option<String>,
    /// Log level or tracing filter; RUST_LOG overrides it [default: info].
    #[arg(long, global = true, value_name = "LEVEL", allow_hyphen_values = true)]
    pub log_level: Option<String>,
    /// Stream that owns the tombstones [default: __tombstones__].
    #[arg(long, global = true, value_name = "NAME", allow_hyphen_values = true)]
    pub tombstone_stream: Option<String>,
    /// Message type of the tombstones [default: $tombstone].
    #[arg(long, global = true, value_name = "TYPE", allow_hyphen_values = true)]
    pub tombstone_type: Option<String>,
    /// Fill without taking the leader lock (single-instance deployments only).
    #[arg(long, global = true)]
    pub no_leader_election: bool,
    /// Name of the leader lock; healers sharing it elect one filler [default: gap-healer:<schema>].
    #[arg(long, global = true, value_name = "NAME", allow_hyphen_values = true)]
    pub leader_key: Option<String>,
    /// `run` exits 3 once its scans have failed for this long without a
    /// success (database unreachable, tables missing); `never` keeps retrying
    /// [default: never].
    #[arg(
        long,
        global = true,
        value_name = "DURATION|never",
        allow_hyphen_values = true
    )]
    pub give_up_after: Option<String>,
}

impl ConfigArgs {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let mut put = |k: &'static str, v: &Option<String>| {
            if let Some(v) = v {
                out.push((k, v.clone()));
            }
        };
        put("engine", &self.engine);
        put("connection_string", &self.connection_string);
        put("connection_string_file", &self.connection_string_file);
        put("schema", &self.schema);
        put("gap_timeout", &self.gap_timeout);
        put("poll_interval", &self.poll_interval);
        put("lock_timeout", &self.lock_timeout);
        put("connect_timeout", &self.connect_timeout);
        put("metrics_addr", &self.metrics_addr);
        put("start_from", &self.start_from);
        put("lookback", &self.lookback);
        put("scan_page_size", &self.scan_page_size);
        put("log_format", &self.log_format);
        put("log_level", &self.log_level);
        put("tombstone_stream", &self.tombstone_stream);
        put("tombstone_type", &self.tombstone_type);
        put("leader_key", &self.leader_key);
        put("give_up_after", &self.give_up_after);
        if self.dry_run {
            out.push(("dry_run", "true".into()));
        }
        if self.no_leader_election {
            out.push(("leader_election", "false".into()));
        }
        out
    }
}

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

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub engine: EngineKind,
    pub store: StoreSettings,
    pub gap_timeout: Duration,
    pub poll_interval: Duration,
    pub lock_timeout: Duration,
    pub metrics_addr: SocketAddr,
    pub start_from: StartFrom,
    pub lookback: u64,
    pub scan_page_size: u32,
    pub dry_run: bool,
    pub log_format: LogFormat,
    pub log_level: String,
    pub leader_election: bool,
    /// The leader lock's name (an advisory lock key on PostgreSQL, an
    /// application lock resource on SQL Server; both are per database).
    pub leader_key: String,
    /// `run` gives up (exit 3) once its scans have failed this long in a row;
    /// `None`: never.
    pub give_up_after: Option<Duration>,
    /// Where each key's value came from, for `gap-healer config`.
    pub origins: Vec<(&'static str, String)>,
}

/// One configuration problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    /// The offending value as shown to the user (`None` when missing or secret).
    pub value: Option<String>,
    /// "config file x.toml", "environment variable GAP_HEALER_X", "flag --x", "default".
    pub origin: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(
                f,
                "{} = {:?} (from {}): {}",
                self.key, v, self.origin, self.message
            ),
            None => write!(f, "{} (from {}): {}", self.key, self.origin, self.message),
        }
    }
}

/// Every problem found, reported together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "invalid configuration ({n} problem{}):",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

/// What a subcommand needs from the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Everything, including a connection string (run, scan, heal, check, install, config).
    Connection,
    /// Engine and schema only (sql).
    EngineOnly,
}

/// Loads and validates the configuration from the flags, the file they name,
/// and the given environment (pass `std::env::vars()`).
pub fn load(
    args: &ConfigArgs,
    env: impl IntoIterator<Item = (String, String)>,
    need: Need,
) -> Result<Settings, ConfigError> {
    let mut problems = Vec::new();
    let mut figment = Figment::new();
    if let Some(path) = &args.config {
        match file_layer(path) {
            Ok((toml, unknown)) => {
                for key in unknown {
                    problems.push(Problem {
                        key: key.clone(),
                        value: None,
                        origin: format!("config file {}", path.display()),
                        message: match suggest(&key) {
                            Some(s) => format!("unknown key (did you mean `{s}`?)"),
                            None => "unknown key".into(),
                        },
                    });
                }
                figment = figment.merge(toml);
            }
            Err(p) => problems.push(p),
        }
    }
    figment = figment.merge(Layer::env(env)).merge(Layer::flags(args));
    let mut v = Validator {
        figment: &figment,
        problems,
        origins: Vec::new(),
    };
    let settings = v.settings(need);
    match settings {
        Some(s) if v.problems.is_empty() => Ok(Settings {
            origins: v.origins,
            ..s
        }),
        _ => Err(ConfigError {
            problems: v.problems,
        }),
    }
}

fn file_layer(path: &Path) -> Result<(Figment, Vec<String>), Problem> {
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
        .filter(|k| !KEYS.contains(&k.as_str()))
        .cloned()
        .collect();
    Ok((Figment::from(Toml::file(path)), unknown))
}

/// The closest known key to a typo, when it is close.
fn suggest(key: &str) -> Option<&'static str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != *cb))
                    .min(row[j] + 1)
                    .min(row[j + 1] + 1);
                prev = cur;
            }
        }
        row[b.len()]
    }
    let normal = key.to_ascii_lowercase().replace('-', "_");
    KEYS.iter()
        .map(|k| (distance(&normal, k), *k))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k)
}

/// A figment provider of raw string values (the environment or the flags)
/// that can name the exact variable or flag a value came from.
struct Layer {
    name: &'static str,
    values: Dict,
    origin: fn(&str) -> String,
}

impl Layer {
    /// `GAP_HEALER_<KEY>` for known keys only: unknown `GAP_HEALER_*` variables
    /// are ignored, because Kubernetes injects `GAP_HEALER_SERVICE_HOST` and
    /// friends for a Service named gap-healer.
    fn env(env: impl IntoIterator<Item = (String, String)>) -> Self {
        let values = env
            .into_iter()
            .filter_map(|(k, v)| {
                let key = k.strip_prefix(ENV_PREFIX)?.to_ascii_lowercase();
                KEYS.contains(&key.as_str()).then(|| (key, Value::from(v)))
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

    fn flags(args: &ConfigArgs) -> Self {
        let values = args
            .pairs()
            .into_iter()
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

struct Validator<'a> {
    figment: &'a Figment,
    problems: Vec<Problem>,
    origins: Vec<(&'static str, String)>,
}

impl Validator<'_> {
    /// The value of `key` as text, and where it came from; `None` when unset.
    fn raw(&mut self, key: &'static str) -> Option<(String, String)> {
        let value = self.figment.find_value(key).ok()?;
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
            Value::Dict(..) | Value::Array(..) => {
                self.problems.push(Problem {
                    key: key.into(),
                    value: None,
                    origin,
                    message: "expected a single value, found a table or list".into(),
                });
                return None;
            }
        };
        Some((text, origin))
    }

    /// Parses `key` with `parse`, or records the problem; `default` when unset.
    fn get<T>(
        &mut self,
        key: &'static str,
        default: T,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        match self.raw(key) {
            None => {
                self.origins.push((key, "default".into()));
                Some(default)
            }
            Some((text, origin)) => match parse(text.trim()) {
                Ok(v) => Some(v),
                Err(message) => {
                    self.problems.push(Problem {
                        key: key.into(),
                        value: Some(text),
                        origin,
                        message,
                    });
                    None
                }
            },
        }
    }

    fn problem(&mut self, key: &str, origin: &str, message: impl Into<String>) {
        self.problems.push(Problem {
            key: key.into(),
            value: None,
            origin: origin.into(),
            message: message.into(),
        });
    }

    fn settings(&mut self, need: Need) -> Option<Settings> {
        let engine = match self.raw("engine") {
            Some((text, origin)) => match EngineKind::parse(&text) {
                Some(e) => Some(e),
                None => {
                    let message = format!(
                        "unknown engine; expected one of {}",
                        EngineKind::NAMES.join(", ")
                    );
                    self.problems.push(Problem {
                        key: "engine".into(),
                        value: Some(text),
                        origin,
                        message,
                    });
                    None
                }
            },
            None => {
                self.problem(
                    "engine",
                    "nowhere",
                    "required: set --engine, GAP_HEALER_ENGINE or engine = \"mssql\"|\"postgres\"",
                );
                None
            }
        };
        let schema = self.get("schema", DEFAULT_SCHEMA.to_string(), parse_identifier);
        let gap_timeout = self.get("gap_timeout", DEFAULT_GAP_TIMEOUT, |s| {
            parse_duration(s, Duration::ZERO)
        });
        let poll_interval = self.get("poll_interval", DEFAULT_POLL_INTERVAL, |s| {
            parse_duration(s, Duration::from_millis(10))
        });
        let lock_timeout = self.get("lock_timeout", DEFAULT_LOCK_TIMEOUT, |s| {
            parse_duration(s, Duration::from_millis(1))
        });
        let connect_timeout = self.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT, |s| {
            parse_duration(s, Duration::from_millis(100))
        });
        let metrics_addr = self.get("metrics_addr", DEFAULT_METRICS_ADDR.parse().ok()?, |s| {
            s.parse::<SocketAddr>().map_err(|_| {
                "expected HOST:PORT with an IP address, e.g. 0.0.0.0:9477 or [::1]:9477".into()
            })
        });
        let start_from = self.get("start_from", StartFrom::Checkpoints, parse_start_from);
        let lookback = self.get("lookback", DEFAULT_LOOKBACK, |s| {
            s.parse::<u64>()
                .ok()
                .filter(|n| *n <= i64::MAX as u64)
                .ok_or_else(|| "expected a whole number of positions, 0 or more".into())
        });
        let scan_page_size = self.get("scan_page_size", DEFAULT_SCAN_PAGE_SIZE, |s| {
            s.parse::<u32>()
                .ok()
                .filter(|n| (100..=1_000_000).contains(n))
                .ok_or_else(|| "expected a number of rows from 100 to 1000000".into())
        });
        let dry_run = self.get("dry_run", false, parse_bool);
        let leader_election = self.get("leader_election", true, parse_bool);
        let log_format = self.get("log_format", LogFormat::Text, |s| {
            match s.to_ascii_lowercase().as_str() {
                "text" => Ok(LogFormat::Text),
                "json" => Ok(LogFormat::Json),
                _ => Err("expected text or json".into()),
            }
        });
        let log_level = self.get("log_level", DEFAULT_LOG_LEVEL.to_string(), |s| {
            tracing_subscriber::EnvFilter::try_new(s)
                .map(|_| s.to_string())
                .map_err(|e| format!("not a log level or filter: {e}"))
        });
        let tombstone_stream = self.get(
            "tombstone_stream",
            DEFAULT_TOMBSTONE_STREAM.to_string(),
            |s| parse_name(s, 850),
        );
        let tombstone_type = self.get("tombstone_type", DEFAULT_TOMBSTONE_TYPE.to_string(), |s| {
            parse_name(s, 128)
        });
        let leader_key = self.get("leader_key", None, |s| parse_name(s, 255).map(Some));
        let give_up_after = self.get("give_up_after", None, |s| {
            if s.eq_ignore_ascii_case("never") {
                Ok(None)
            } else {
                parse_duration(s, Duration::from_secs(1))
                    .map(Some)
                    .map_err(|e| format!("{e}; or never"))
            }
        });
        let connection_string = self.connection_string(engine, need);
        let leader_key = leader_key.map(|k| {
            k.unwrap_or_else(|| {
                format!("gap-healer:{}", schema.as_deref().unwrap_or(DEFAULT_SCHEMA))
            })
        });

        Some(Settings {
            engine: engine?,
            store: StoreSettings {
                connection_string: connection_string?,
                schema: schema?,
                tombstone_stream: tombstone_stream?,
                tombstone_type: tombstone_type?,
                connect_timeout: connect_timeout?,
            },
            gap_timeout: gap_timeout?,
            poll_interval: poll_interval?,
            lock_timeout: lock_timeout?,
            metrics_addr: metrics_addr?,
            start_from: start_from?,
            lookback: lookback?,
            scan_page_size: scan_page_size?,
            dry_run: dry_run?,
            log_format: log_format?,
            log_level: log_level?,
            leader_election: leader_election?,
            leader_key: leader_key?,
            give_up_after: give_up_after?,
            origins: Vec::new(),
        })
    }

    /// The connection string from `connection_string` or `connection_string_file`
    /// (not both), checked by the engine's own parser. Never echoes the value.
    fn connection_string(
        &mut self,
        engine: Option<EngineKind>,
        need: Need,
    ) -> Option<ConnectionString> {
        let inline = self.raw("connection_string");
        let file = self.raw("connection_string_file");
        let (text, origin) = match (inline, file) {
            (Some((_, o1)), Some((_, o2))) => {
                self.problem(
                    "connection_string",
                    &format!("{o1} and {o2}"),
                    "set connection_string or connection_string_file, not both",
                );
                return None;
            }
            (Some(inline), None) => inline,
            (None, Some((path, origin))) => match read_small(&path) {
                Ok(text) => (
                    text.trim_end_matches(['\r', '\n']).to_string(),
                    format!("file {path} named by {origin}"),
                ),
                Err(e) => {
                    self.problems.push(Problem {
                        key: "connection_string_file".into(),
                        value: Some(path),
                        origin,
                        message: format!("cannot read the file: {e}"),
                    });
                    return None;
                }
            },
            (None, None) => {
                return match need {
                    Need::EngineOnly => Some(ConnectionString::new("")),
                    Need::Connection => {
                        self.problem(
                            "connection_string",
                            "nowhere",
                            "required: set GAP_HEALER_CONNECTION_STRING, connection_string_file, or --connection-string",
                        );
                        None
                    }
                };
            }
        };
        let cs = ConnectionString::new(text);
        if cs.is_empty() {
            if need == Need::Connection {
                self.problem("connection_string", &origin, "is empty");
                return None;
            }
            return Some(cs);
        }
        if let Some(engine) = engine {
            if let Err(message) = crate::engine::check_connection_string(engine, &cs) {
                self.problem("connection_string", &origin, cs.scrub(&message));
                return None;
            }
        }
        Some(cs)
    }
}

/// A secret file of at most 64 KiB (a connection string, not `/dev/zero`).
fn read_small(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    const MAX: u64 = 64 * 1024;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX {
        return Err(std::io::Error::other(
            "larger than 64 KiB: not a connection string",
        ));
    }
    Ok(text)
}

/// `[A-Za-z_][A-Za-z0-9_]*`, at most 128 characters: safe to splice into SQL.
pub fn parse_identifier(s: &str) -> Result<String, String> {
    let mut chars = s.chars();
    let ok_first = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if ok_first && s.len() <= 128 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(s.to_string())
    } else {
        Err("expected a plain identifier: a letter or _, then letters, digits or _, at most 128 characters".into())
    }
}

/// A humantime duration with a unit (`250ms`, `5s`, `1m 30s`), at least `min`.
pub fn parse_duration(s: &str, min: Duration) -> Result<Duration, String> {
    if s.starts_with('-') {
        return Err("must not be negative".into());
    }
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(format!("give a unit, e.g. \"{s}ms\" or \"{s}s\""));
    }
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("not a duration ({e}); examples: 250ms, 5s, 1m"))?;
    if d < min {
        return Err(format!(
            "must be at least {}",
            humantime::format_duration(min)
        ));
    }
    if d > Duration::from_secs(7 * 24 * 3600) {
        return Err("must be at most 7 days".into());
    }
    Ok(d)
}

fn parse_start_from(s: &str) -> Result<StartFrom, String> {
    match s.to_ascii_lowercase().as_str() {
        "checkpoints" => Ok(StartFrom::Checkpoints),
        "head" => Ok(StartFrom::Head),
        n => n
            .parse::<i64>()
            .ok()
            .filter(|p| *p >= 0)
            .map(StartFrom::Position)
            .ok_or_else(|| {
                "expected checkpoints, head, or a position (a whole number, 0 or more)".into()
            }),
    }
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

/// A name bound as a parameter: any text but control characters, not empty.
fn parse_name(s: &str, max: usize) -> Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.chars().count() > max {
        return Err(format!("must be at most {max} characters"));
    }
    if s.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(s.to_string())
}

impl Settings {
    /// The effective configuration as TOML, connection string redacted, each
    /// line commented with where its value came from.
    pub fn to_toml(&self) -> String {
        let origin = |key: &str| {
            self.origins
                .iter()
                .find(|(k, _)| *k == key)
                .map_or("default", |(_, o)| o.as_str())
                .to_string()
        };
        let d = |d: Duration| humantime::format_duration(d).to_string();
        let q = |s: &str| toml::Value::String(s.to_string()).to_string();
        let start_from = match self.start_from {
            StartFrom::Position(p) => p.to_string(),
            other => q(&other.to_string()),
        };
        let cs_origin = {
            let inline = origin("connection_string");
            if inline == "default" {
                origin("connection_string_file")
            } else {
                inline
            }
        };
        let rows: Vec<(&str, String, String)> = vec![
            ("engine", q(self.engine.as_str()), origin("engine")),
            (
                "connection_string",
                q(&self.store.connection_string.redacted()),
                cs_origin,
            ),
            ("schema", q(&self.store.schema), origin("schema")),
            (
                "gap_timeout",
                q(&d(self.gap_timeout)),
                origin("gap_timeout"),
            ),
            (
                "poll_interval",
                q(&d(self.poll_interval)),
                origin("poll_interval"),
            ),
            (
                "lock_timeout",
                q(&d(self.lock_timeout)),
                origin("lock_timeout"),
            ),
            (
                "connect_timeout",
                q(&d(self.store.connect_timeout)),
                origin("connect_timeout"),
            ),
            (
                "metrics_addr",
                q(&self.metrics_addr.to_string()),
                origin("metrics_addr"),
            ),
            ("start_from", start_from, origin("start_from")),
            ("lookback", self.lookback.to_string(), origin("lookback")),
            (
                "scan_page_size",
                self.scan_page_size.to_string(),
                origin("scan_page_size"),
            ),
            ("dry_run", self.dry_run.to_string(), origin("dry_run")),
            (
                "log_format",
                q(if self.log_format == LogFormat::Json {
                    "json"
                } else {
                    "text"
                }),
                origin("log_format"),
            ),
            ("log_level", q(&self.log_level), origin("log_level")),
            (
                "tombstone_stream",
                q(&self.store.tombstone_stream),
                origin("tombstone_stream"),
            ),
            (
                "tombstone_type",
                q(&self.store.tombstone_type),
                origin("tombstone_type"),
            ),
            (
                "leader_election",
                self.leader_election.to_string(),
                origin("leader_election"),
            ),
            ("leader_key", q(&self.leader_key), origin("leader_key")),
            (
                "give_up_after",
                q(&self.give_up_after.map_or("never".to_string(), d)),
                origin("give_up_after"),
            ),
        ];
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn args() -> ConfigArgs {
        ConfigArgs {
            engine: Some("postgres".into()),
            connection_string: Some("host=db user=u password=pw".into()),
            ..Default::default()
        }
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_apply() {
        let s = load(&args(), env(&[]), Need::Connection).unwrap();
        assert_eq!(s.gap_timeout, DEFAULT_GAP_TIMEOUT);
        assert_eq!(s.store.schema, "eventuous");
        assert_eq!(s.start_from, StartFrom::Checkpoints);
        assert!(s.leader_election);
        assert!(!s.dry_run);
        assert_eq!(s.give_up_after, None, "never gives up unless configured");
    }

    #[test]
    fn give_up_after_is_a_duration_or_never() {
        let with = |v: &str| {
            load(
                &args(),
                env(&[("GAP_HEALER_GIVE_UP_AFTER", v)]),
                Need::Connection,
            )
        };
        assert_eq!(
            with("90s").unwrap().give_up_after,
            Some(Duration::from_secs(90))
        );
        assert_eq!(with("NEVER").unwrap().give_up_after, None);
        for (bad, why) in [
            ("0s", "at least 1s"),
            ("soon", "or never"),
            ("-1m", "negative"),
        ] {
            let text = with(bad).unwrap_err().to_string();
            assert!(
                text.contains(&format!("give_up_after = \"{bad}\" (from environment variable GAP_HEALER_GIVE_UP_AFTER)"))
                    && text.contains(why),
                "{text}"
            );
        }
    }

    #[test]
    fn precedence_file_env_flags() {
        let dir = std::env::temp_dir().join(format!("gh-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("a.toml");
        std::fs::write(
            &file,
            "gap_timeout = \"7s\"\npoll_interval = \"1s\"\nlock_timeout = \"3s\"\n",
        )
        .unwrap();
        let mut a = args();
        a.config = Some(file.clone());
        a.lock_timeout = Some("4s".into());
        let s = load(
            &a,
            env(&[
                ("GAP_HEALER_POLL_INTERVAL", "2s"),
                ("GAP_HEALER_LOCK_TIMEOUT", "9s"),
            ]),
            Need::Connection,
        )
        .unwrap();
        assert_eq!(s.gap_timeout, Duration::from_secs(7));
        assert_eq!(s.poll_interval, Duration::from_secs(2));
        assert_eq!(s.lock_timeout, Duration::from_secs(4));
        let toml = s.to_toml();
        assert!(
            toml.contains("# environment variable GAP_HEALER_POLL_INTERVAL"),
            "{toml}"
        );
        assert!(toml.contains("# flag --lock-timeout"), "{toml}");
        assert!(
            toml.contains(&format!("# config file {}", file.display())),
            "{toml}"
        );
        assert!(!toml.contains("pw\""), "{toml}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn all_problems_reported_at_once_with_key_value_origin() {
        let dir = std::env::temp_dir().join(format!("gh-cfg-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("bad.toml");
        std::fs::write(&file, "gap_timout = \"5s\"\nschema = \"x; drop table y\"\n").unwrap();
        let a = ConfigArgs {
            config: Some(file.clone()),
            engine: Some("oracle".into()),
            poll_interval: Some("-1s".into()),
            ..Default::default()
        };
        let err = load(
            &a,
            env(&[("GAP_HEALER_LOCK_TIMEOUT", "soon")]),
            Need::Connection,
        )
        .unwrap_err();
        let text = err.to_string();
        for needle in [
            "gap_timout",
            "did you mean `gap_timeout`",
            "engine = \"oracle\" (from flag --engine): unknown engine",
            "schema = \"x; drop table y\"",
            "poll_interval = \"-1s\" (from flag --poll-interval): must not be negative",
            "lock_timeout = \"soon\" (from environment variable GAP_HEALER_LOCK_TIMEOUT)",
            "connection_string (from nowhere): required",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        assert_eq!(err.problems.len(), 6, "{text}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn unknown_env_vars_are_ignored() {
        let s = load(
            &args(),
            env(&[
                ("GAP_HEALER_SERVICE_HOST", "10.0.0.1"),
                ("GAP_HEALER_PORT", "tcp://x"),
            ]),
            Need::Connection,
        );
        assert!(s.is_ok());
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("250ms", Duration::ZERO),
            Ok(Duration::from_millis(250))
        );
        assert!(parse_duration("5", Duration::ZERO)
            .unwrap_err()
            .contains("unit"));
        assert!(parse_duration("-5s", Duration::ZERO)
            .unwrap_err()
            .contains("negative"));
        assert!(parse_duration("0s", Duration::from_millis(1))
            .unwrap_err()
            .contains("at least"));
        assert!(parse_duration("5 parsecs", Duration::ZERO).is_err());
    }

    #[test]
    fn bad_connection_string_never_echoes_password() {
        let mut a = args();
        a.engine = Some("mssql".into());
        a.connection_string =
            Some("Server=tcp:db,notaport;Password=hunter2secret;User Id=sa".into());
        if let Err(e) = load(&a, env(&[]), Need::Connection) {
            assert!(!e.to_string().contains("hunter2secret"), "{e}");
        }
        let mut a = args();
        a.connection_string = Some("host=db port=notaport password=hunter2secret".into());
        let e = load(&a, env(&[]), Need::Connection).unwrap_err();
        assert!(!e.to_string().contains("hunter2secret"), "{e}");
        assert!(e.to_string().contains("connection_string"), "{e}");
    }

    proptest! {
        #[test]
        fn identifier_rule(s in "\\PC{0,140}") {
            let ok = parse_identifier(&s).is_ok();
            let re = !s.is_empty() && s.len() <= 128
                && s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            prop_assert_eq!(ok, re);
        }

        /// Any text in any key, from any layer: never a panic, and either valid
        /// settings or problems that each name a key.
        #[test]
        fn never_panics(key in proptest::sample::select(KEYS), value in "\\PC{0,30}", layer in 0..2u8) {
            let mut a = args();
            let mut e = Vec::new();
            if layer == 0 {
                e.push((format!("GAP_HEALER_{}", key.to_ascii_uppercase()), value.clone()));
            } else {
                a.gap_timeout = Some(value.clone());
            }
            if let Err(err) = load(&a, e, Need::Connection) {
                prop_assert!(!err.problems.is_empty());
                prop_assert!(err.problems.iter().all(|p| !p.key.is_empty()));
            }
        }
    }
}
