//! The command line: each subcommand is a function that `main` calls and the
//! tests call through the real binary.
//!
//! Each command takes the flags of the configuration keys it reads
//! ([`config::Key::commands`]), listed by `gap-healer <command> --help`
//! under their headings; the same flags may also come before the command's
//! name, where the command refuses any it does not read.
//!
//! Exit codes ([`EXIT_CODES`]): 0 success; 1 holes: `scan` found some,
//! `heal --once` left some (not as a dry run); 2 bad usage or configuration; 3 could not
//! complete (database unreachable, missing table, missing rights, a fill
//! failed); 143 or 130: `heal --once` stopped by SIGTERM or SIGINT before
//! its pass ended (128 + the signal's number).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;
use tracing::{info, Instrument};

use crate::config::{self, commands, Flags, Need, Settings, Store};
use crate::engine::{self, DbError, Engine, LeaderLock, Opened, Pools, WatermarkTable, WithEngine};
use crate::healer::{Ended, Healer, Options};
use crate::leader::Leader;
use crate::telemetry::{self, Board, Health};

pub const EXIT_OK: u8 = 0;
/// `scan` found holes; `heal --once` left holes unfilled (a dry run, which
/// fills nothing by design, exits 0).
pub const EXIT_HOLES_FOUND: u8 = 1;
pub const EXIT_USAGE: u8 = 2;
pub const EXIT_INCOMPLETE: u8 = 3;

/// `0.1.0 (commit 40bf8af1c2d3, built 2026-05-02)`: the package's version,
/// the commit it was built from (`unknown` when built outside a git
/// checkout, as the Docker build is) and the date of the build (UTC; or of
/// `SOURCE_DATE_EPOCH`), as build.rs found them.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("GAP_HEALER_COMMIT"),
    ", built ",
    env!("GAP_HEALER_BUILD_DATE"),
    ")"
);

/// The exit codes, as `--help` shows them (the README's table says the same).
pub const EXIT_CODES: &str = "\
Exit codes (in a fleet, the highest of any store's):
  0  done: scan found no holes, heal --once left none, check passed (warnings included)
  1  holes: scan found some; heal --once left some unfilled (held by appends still open; a dry run exits 0)
  2  bad usage or configuration (every problem listed, before connecting; run: start_from above the head)
  3  could not complete: database unreachable, missing table or right, a failed check or fill; run: give_up_after passed
  143, 130  heal --once stopped by SIGTERM, SIGINT before its pass ended (128 + the signal, as a shell reports a process the signal ended; run exits 0)";

const RUN_EXIT: &str = "\
Exit codes:
  0  stopped by SIGTERM or SIGINT (the fill in flight drains within 2 s)
  2  bad usage or configuration (before connecting), or start_from above the head of a table with events
  3  every scan failed for give_up_after, or metrics_addr cannot be bound

With NOTIFY_SOCKET set (systemd Type=notify), READY=1 is sent once the HTTP endpoints listen.";

const SCAN_EXIT: &str = "\
Exit codes (in a fleet, the highest of any store's):
  0  no holes
  1  holes found
  2  bad usage or configuration
  3  could not complete: database unreachable, missing table or right";

const HEAL_EXIT: &str = "\
Exit codes (in a fleet, the highest of any store's):
  0  every hole found is filled (or there were none; or --dry-run, which fills none)
  1  holes left: held by appends still open (run it again later)
  2  bad usage or configuration
  3  could not complete: database unreachable, missing table or right, or a fill failed
  143  stopped by SIGTERM before the pass ended (130: SIGINT): 128 + the signal, as a shell reports a process the signal ended;
       the report says what was filled and what was found and left";

const CHECK_EXIT: &str = "\
Exit codes (in a fleet, the highest of any store's):
  0  every check passed (a WARN finding is not a failure)
  2  bad usage or configuration
  3  a check failed, or the database is unreachable";

const PRINT_EXIT: &str = "\
Exit codes:
  0  printed
  2  bad usage or configuration";

const INSTALL_EXIT: &str = "\
Exit codes:
  0  installed, or nothing to install
  2  bad usage or configuration
  3  could not complete";

const ABOUT: &str = "Fills holes in the global position of identity-positioned event stores with tombstones, so all-stream subscriptions never stall.";

#[derive(Parser, Debug)]
#[command(
    name = "gap-healer",
    version = VERSION,
    about = ABOUT,
    after_help = EXIT_CODES,
    after_long_help = EXIT_CODES,
)]
pub struct Cli {
    /// The configuration flags given before the command's name: any key's,
    /// unlisted; [`Cli::try_parse_args`] hands them to the command, which
    /// refuses those it does not read.
    #[command(flatten)]
    early: Flags<{ commands::ALL }, true>,
    #[command(subcommand)]
    pub command: Command,
}

/// The command line as documented: each command with its own flags and
/// none before its name (the parser takes them there too, for the command
/// lines written before each command had flags of its own, but offers
/// them nowhere). Completions and man pages are made of it.
#[derive(Parser, Debug)]
#[command(
    name = "gap-healer",
    version = VERSION,
    about = ABOUT,
    after_help = EXIT_CODES,
    after_long_help = EXIT_CODES,
)]
struct Documented {
    #[command(subcommand)]
    command: Command,
}

type RunFlags = Flags<{ commands::RUN }>;
type ScanFlags = Flags<{ commands::SCAN }>;
type HealFlags = Flags<{ commands::HEAL }>;
type CheckFlags = Flags<{ commands::CHECK }>;
type SqlFlags = Flags<{ commands::SQL }>;
type ConfigFlags = Flags<{ commands::CONFIG }>;
type InstallFlags = Flags<{ commands::INSTALL }>;

#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Run the daemon: scan, fill holes older than gap_timeout, serve /metrics, /healthz, /readyz and /status.
    #[command(after_help = RUN_EXIT)]
    Run(RunFlags),
    /// Report the current holes without writing; exit 1 when there is at least one.
    #[command(after_help = SCAN_EXIT)]
    Scan(ScanArgs),
    /// One detect-and-fill pass, then exit (for Jobs and cron); exit 1 when holes are left.
    #[command(after_help = HEAL_EXIT)]
    Heal(HealArgs),
    /// Preflight: connection, TLS, table shapes, rights; one line per finding.
    #[command(after_help = CHECK_EXIT)]
    Check(CheckArgs),
    /// Print the SQL objects and grants the healer needs, for a DBA.
    #[command(after_help = PRINT_EXIT)]
    Sql(SqlArgs),
    /// Print the effective configuration (secrets redacted) and where each value came from.
    #[command(after_help = PRINT_EXIT)]
    Config(ConfigFlags),
    /// Create the fill procedure in the store's schema (SQL Server procedure mode).
    #[command(after_help = INSTALL_EXIT)]
    Install(InstallFlags),
    /// Print a shell completion script, from these very flags (e.g. gap-healer completions bash > /etc/bash_completion.d/gap-healer).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print a man page (roff), gap-healer's or one command's (e.g. gap-healer man scan | man -l -).
    Man {
        /// The command whose page to print; without it, gap-healer(1).
        #[arg(value_parser = clap::builder::PossibleValuesParser::new(MAN_PAGES))]
        command: Option<String>,
    },
}

/// The commands with a man page of their own.
const MAN_PAGES: [&str; 9] = [
    "run",
    "scan",
    "heal",
    "check",
    "sql",
    "config",
    "install",
    "completions",
    "man",
];

#[derive(clap::Args, Debug, Clone)]
pub struct ScanArgs {
    #[command(flatten)]
    pub flags: ScanFlags,
    /// Output: text, or json (one object per store, each on its own line: README, "JSON output").
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// List at most N holes (text: 20 unless given; JSON: every hole unless given).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// List every hole, however many.
    #[arg(long, conflicts_with = "limit")]
    pub all: bool,
}

#[derive(clap::Args, Debug, Clone)]
pub struct HealArgs {
    #[command(flatten)]
    pub flags: HealFlags,
    /// Required: one pass, then exit.
    #[arg(long, required = true)]
    pub once: bool,
    /// Output: text, or json (one object per store, each on its own line: README, "JSON output").
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    #[command(flatten)]
    pub flags: CheckFlags,
    /// Output: text, or json (one object per store, each on its own line: README, "JSON output").
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

#[derive(clap::Args, Debug, Clone)]
pub struct SqlArgs {
    #[command(flatten)]
    pub flags: SqlFlags,
    /// The role (PostgreSQL) or database user (SQL Server) of the
    /// healer's login, to grant to; without it the script says
    /// <healer_role>, to be replaced before it runs.
    #[arg(long, value_name = "ROLE", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub role: Option<String>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

impl Command {
    /// The command's name, as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Run(_) => "run",
            Command::Scan(_) => "scan",
            Command::Heal(_) => "heal",
            Command::Check(_) => "check",
            Command::Sql(_) => "sql",
            Command::Config(_) => "config",
            Command::Install(_) => "install",
            Command::Completions { .. } => "completions",
            Command::Man { .. } => "man",
        }
    }

    /// The configuration flags given (`None`: a command without any).
    pub fn flags(&self) -> Option<(&config::ConfigArgs, &[String])> {
        fn of<const C: u16>(f: &Flags<C>) -> Option<(&config::ConfigArgs, &[String])> {
            Some((&f.config, &f.stores))
        }
        match self {
            Command::Run(f) => of(f),
            Command::Scan(a) => of(&a.flags),
            Command::Heal(a) => of(&a.flags),
            Command::Check(a) => of(&a.flags),
            Command::Sql(a) => of(&a.flags),
            Command::Config(f) => of(f),
            Command::Install(f) => of(f),
            Command::Completions { .. } | Command::Man { .. } => None,
        }
    }

    /// Takes the flags given before the command's name, refusing any key
    /// the command does not read.
    fn take_early(&mut self, early: Flags<{ commands::ALL }, true>) -> Result<(), String> {
        fn merge<const C: u16>(
            flags: &mut Flags<C>,
            early: Flags<{ commands::ALL }, true>,
            name: &str,
        ) -> Result<(), String> {
            *flags = std::mem::take(flags).after(early, name)?;
            Ok(())
        }
        let name = self.name();
        match self {
            Command::Run(f) => merge(f, early, name),
            Command::Scan(a) => merge(&mut a.flags, early, name),
            Command::Heal(a) => merge(&mut a.flags, early, name),
            Command::Check(a) => merge(&mut a.flags, early, name),
            Command::Sql(a) => merge(&mut a.flags, early, name),
            Command::Config(f) => merge(f, early, name),
            Command::Install(f) => merge(f, early, name),
            Command::Completions { .. } | Command::Man { .. } if early.is_empty() => Ok(()),
            Command::Completions { .. } | Command::Man { .. } => {
                Err(format!("`gap-healer {name}` takes no configuration flags"))
            }
        }
    }
}

impl Cli {
    /// Parses `argv` (the program's name first): the command with every
    /// configuration flag it was given, before or after its name.
    pub fn try_parse_args<I, T>(argv: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut cli = Cli::try_parse_from(argv).map_err(explain)?;
        let early = std::mem::take(&mut cli.early);
        if let Err(message) = cli.command.take_early(early) {
            return Err(command_error(
                cli.command.name(),
                clap::error::ErrorKind::ArgumentConflict,
                message,
            ));
        }
        Ok(cli)
    }
}

/// clap's refusal of a key's flag after a command that does not read it
/// (`scan --metrics-addr`), said as such: which command reads it instead.
fn explain(e: clap::Error) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return e;
    }
    let Some(ContextValue::String(given)) = e.get(ContextKind::InvalidArg) else {
        return e;
    };
    let flag = given.split('=').next().unwrap_or_default();
    let long = flag.strip_prefix("--").unwrap_or_default();
    let key = config::KEYS
        .iter()
        .find(|k| k.long() == long || format!("no-{}", k.long()) == long);
    // The command is the usage line's second word: `gap-healer scan [OPTIONS]`.
    let usage = match e.get(ContextKind::Usage) {
        Some(ContextValue::StyledStr(usage)) => usage.to_string(),
        _ => String::new(),
    };
    let name = usage
        .split_whitespace()
        .skip_while(|w| *w != "gap-healer")
        .nth(1)
        .filter(|n| MAN_PAGES.contains(n));
    match (key, name) {
        (Some(key), Some(name)) => command_error(
            name,
            ErrorKind::UnknownArgument,
            config::not_read(flag, key, name),
        ),
        _ => e,
    }
}

/// An error of command `name`, shown with its usage line.
fn command_error(name: &str, kind: clap::error::ErrorKind, message: String) -> clap::Error {
    let mut cmd = Cli::command();
    cmd.build();
    match cmd.find_subcommand_mut(name) {
        Some(sub) => sub.error(kind, message),
        None => cmd.error(kind, message),
    }
}

/// Why a command stopped short, and the exit code that says so.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{0}")]
    Config(#[from] config::ConfigError),
    #[error("{0}")]
    Db(#[from] DbError),
    #[error("{0:#}")]
    Other(#[from] anyhow::Error),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Config(_) => EXIT_USAGE,
            Failure::Db(_) | Failure::Other(_) => EXIT_INCOMPLETE,
        }
    }
}

/// Parses the command line and runs the command; what `main` calls.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse_args(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { EXIT_OK };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("gap-healer: {failure}");
            ExitCode::from(failure.exit_code())
        }
    }
}

pub fn run(cli: Cli) -> Result<u8, Failure> {
    match &cli.command {
        Command::Completions { shell } => return print_out(&completion_script(*shell)),
        Command::Man { command } => return man(command.as_deref()),
        _ => {}
    }
    let Some((args, stores)) = cli.command.flags() else {
        unreachable!("every other command takes configuration flags")
    };
    let need = match cli.command {
        Command::Sql(_) => Need::EngineOnly,
        _ => Need::Connection,
    };
    let mut settings = config::load(args, std::env::vars(), need)?;
    settings.select(stores)?;
    let many = settings.stores.len() + settings.sets.len() > 1;
    match &cli.command {
        Command::Config(_) => return print_out(settings.to_toml().as_bytes()),
        Command::Sql(SqlArgs { role, .. }) => {
            return print_out(setup_sql(&settings, role.as_deref(), many).as_bytes());
        }
        _ => {}
    }
    telemetry::init_logging(settings.daemon.log_format, &settings.daemon.log_level);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("starting the async runtime: {e}"))?;
    runtime.block_on(async move {
        if let Command::Run(_) = cli.command {
            return run_daemon(&settings).await;
        }
        let pools = Pools::default();
        let stores = crate::fleet::expand(&settings, &pools).await?;
        let many = many || stores.len() > 1;
        let mut worst = EXIT_OK;
        for store in &stores {
            // In a fleet every line says its store: each output line, each
            // object (its "store"), each log line (the store span).
            let out = Out {
                prefix: many.then(|| format!("[store {}] ", store.name)),
            };
            let span = if many {
                tracing::info_span!("store", store = %store.name)
            } else {
                tracing::Span::none()
            };
            let command = OneShot {
                store,
                command: &cli.command,
                out: &out,
            };
            let done = async { engine::open(store.engine, &store.store, &pools, command)?.await }
                .instrument(span)
                .await;
            match done {
                Ok(code) => worst = worst.max(code),
                // One store: its failure is the command's.
                Err(failure) if !many => return Err(failure),
                Err(failure) => {
                    eprintln!("gap-healer: [store {}] {failure}", store.name);
                    worst = worst.max(failure.exit_code());
                }
            }
            // Stopped by a signal: the stores after this one are not begun.
            if let Some(signal) = crate::shutdown::received() {
                return Ok(worst.max(signal.exit_code()));
            }
        }
        Ok(worst)
    })
}

/// `sql`'s setup statements for every selected store and store set, each
/// led by a comment naming it when there are many.
fn setup_sql(settings: &Settings, role: Option<&str>, many: bool) -> String {
    let mut sql = String::new();
    for store in &settings.stores {
        if many {
            sql.push_str(&format!("-- store {}\n", store.name));
        }
        sql.push_str(&engine::setup_sql(store.engine, &store.store, role));
    }
    for set in &settings.sets {
        sql.push_str(&format!(
            "-- store set {}: in every database LIKE '{}'\n",
            set.name, set.databases
        ));
        sql.push_str(&engine::setup_sql(
            set.template.engine,
            &set.template.store,
            role,
        ));
    }
    sql
}

/// Writes a command's whole output to stdout. A reader that closes the pipe
/// before the end (`gap-healer man | head`) is no failure: it has read what
/// it wanted, so the command ends quietly with 0, as it would had the reader
/// read on (under `set -o pipefail` the pipeline succeeds), instead of
/// "Broken pipe" and exit 3.
fn print_out(bytes: &[u8]) -> Result<u8, Failure> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(EXIT_OK),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(EXIT_OK),
        Err(e) => Err(anyhow::anyhow!("writing to stdout: {e}").into()),
    }
}

/// The binary's name, as a shell completes it.
const BIN: &str = "gap-healer";

/// The name bash's script is generated under (see [`completion_script`]).
const BASH_NAME: &str = "gap_healer";

/// The documented command line as completions and man pages show it: the
/// keys whose values are a closed set list them, so `--engine <TAB>`
/// offers `mssql postgres`. (Parsing leaves those values to the
/// configuration, which names every problem at once.)
fn documented() -> clap::Command {
    const CLOSED: [(&str, [&str; 2]); 2] = [
        ("engine", ["mssql", "postgres"]),
        ("log_format", ["text", "json"]),
    ];
    let mut cmd = Documented::command();
    for name in MAN_PAGES {
        cmd = cmd.mut_subcommand(name, |mut sub| {
            for (key, values) in CLOSED {
                if sub.get_arguments().any(|a| a.get_id() == key) {
                    sub = sub.mut_arg(key, |a| a.value_parser(values));
                }
            }
            sub
        });
    }
    cmd
}

/// `gap-healer completions SHELL`: the script, made from the documented
/// command line. clap_complete 4.6 gets bash wrong for a hyphenated name: its
/// loop sets `cmd="gap__healer__subcmd__run"` while its case arms are named
/// `gap__subcmd__healer__subcmd__run)`, so no flag of any subcommand
/// completes. Generated under a name without a hyphen both agree; the
/// script is then registered (`complete -F _gap_healer ...`) for the real
/// name, the one word of it that names the command the shell completes.
fn completion_script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut cmd = documented();
    let mut out = Vec::new();
    if shell != clap_complete::Shell::Bash {
        clap_complete::generate(shell, &mut cmd, BIN, &mut out);
        return out;
    }
    clap_complete::generate(shell, &mut cmd, BASH_NAME, &mut out);
    let mut script = String::new();
    for line in String::from_utf8_lossy(&out).lines() {
        match line.strip_suffix(&format!(" {BASH_NAME}")) {
            Some(head) if head.trim_start().starts_with("complete ") => {
                script.push_str(&format!("{head} {BIN}\n"));
            }
            _ => {
                script.push_str(line);
                script.push('\n');
            }
        }
    }
    script.into_bytes()
}

/// Where a one-shot command prints a store's lines: stdout, each line led
/// by `[store NAME] ` in a fleet.
struct Out {
    prefix: Option<String>,
}

impl Out {
    /// One line on stdout.
    fn line(&self, text: impl std::fmt::Display) {
        println!("{}{text}", self.prefix.as_deref().unwrap_or_default());
    }

    /// One line on stderr (a remark beside the output, not part of it).
    fn note(&self, text: impl std::fmt::Display) {
        eprintln!("{}{text}", self.prefix.as_deref().unwrap_or_default());
    }
}

/// `gap-healer man [COMMAND]`: the page, from the same definitions as the flags.
fn man(command: Option<&str>) -> Result<u8, Failure> {
    let mut cmd = documented();
    cmd.build();
    let page = match command {
        None => cmd,
        Some(name) => cmd
            .find_subcommand(name)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no command {name}"))?,
    };
    let mut roff = Vec::new();
    clap_mangen::Man::new(page)
        .date(env!("GAP_HEALER_BUILD_DATE"))
        .source(format!("gap-healer {}", env!("CARGO_PKG_VERSION")))
        .manual("gap-healer")
        .render(&mut roff)
        .map_err(|e| anyhow::anyhow!("making the man page: {e}"))?;
    print_out(&roff)
}

/// A one-shot command on one store, on whichever engine
/// [`engine::open()`] opens for it.
struct OneShot<'a> {
    store: &'a Store,
    command: &'a Command,
    out: &'a Out,
}

impl<'a> WithEngine for OneShot<'a> {
    type Output = std::pin::Pin<Box<dyn std::future::Future<Output = Result<u8, Failure>> + 'a>>;

    fn with<E: Engine, L: LeaderLock>(self, opened: Opened<E, L>) -> Self::Output {
        Box::pin(dispatch(opened.engine, self.store, self.command, self.out))
    }
}

async fn dispatch<E: Engine>(
    engine: Arc<E>,
    store: &Store,
    command: &Command,
    out: &Out,
) -> Result<u8, Failure> {
    match command {
        Command::Scan(a) => scan(engine, store, a.format, a.limit, a.all, out).await,
        Command::Heal(a) => heal_once(engine, store, a.format, out).await,
        Command::Check(a) => check(engine, store, a.format, out).await,
        Command::Install(_) => install(engine, store, out).await,
        Command::Run(_)
        | Command::Sql(_)
        | Command::Config(_)
        | Command::Completions { .. }
        | Command::Man { .. } => {
            unreachable!("handled before a store's engine is made")
        }
    }
}

async fn run_daemon(settings: &Settings) -> Result<u8, Failure> {
    let stop = crate::shutdown::on_signal()
        .map_err(|e| anyhow::anyhow!("installing signal handlers: {e}"))?;
    let longest_poll = settings
        .stores
        .iter()
        .map(|s| s.poll_interval)
        .chain(settings.sets.iter().map(|s| s.template.poll_interval))
        .max()
        .unwrap_or_default();
    let metrics = telemetry::install_metrics(telemetry::retire_after(longest_poll))?;
    let board = Board::new();
    let (addr, server) = telemetry::bind(
        settings.daemon.metrics_addr,
        metrics,
        board.clone(),
        stop.clone(),
    )
    .await?;
    let names: Vec<&str> = settings.stores.iter().map(|s| s.name.as_str()).collect();
    info!(addr = %addr, stores = %names.join(","), "gap-healer listening on {addr}");
    let server = tokio::spawn(server);
    // Ready for systemd once the endpoints answer: a store's database may
    // be down for long (the daemon waits for it, /readyz says why), and a
    // start that waited for it would fail the unit at TimeoutStartSec.
    crate::systemd::ready(&format!(
        "serving /metrics, /healthz, /readyz, /status on {addr}; healing {} store(s) and {} store set(s)",
        settings.stores.len(),
        settings.sets.len()
    ));
    let (ended, culprit) = crate::fleet::run(settings, board, stop.clone()).await;
    crate::systemd::stopping();
    stop.cancel();
    match tokio::time::timeout(std::time::Duration::from_millis(300), server).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "metrics server stopped with an error"),
        Err(_) => tracing::warn!("metrics server did not stop in time"),
        _ => {}
    }
    Ok(match ended {
        Ended::Stopped => EXIT_OK,
        Ended::GaveUp { .. } => EXIT_INCOMPLETE,
        Ended::StartAboveHead { from, head } => {
            let store = settings
                .stores
                .iter()
                .find(|s| Some(&s.name) == culprit.as_ref())
                .unwrap_or(&settings.stores[0]);
            return Err(start_above_head(store, settings.fleet, from, head).into());
        }
    })
}

/// `run` refuses a `start_from` above the head of a table with events, as a
/// configuration problem (exit 2) naming the key, its value and origin.
fn start_above_head(settings: &Store, fleet: bool, from: i64, head: i64) -> config::ConfigError {
    let origin = settings
        .origins
        .iter()
        .find(|(key, _)| *key == "start_from")
        .map_or("default", |(_, origin)| origin.as_str());
    config::ConfigError {
        problems: vec![config::Problem {
            key: "start_from".into(),
            value: Some(settings.start_from.to_string()),
            origin: origin.into(),
            message: format!(
                "the scan would start at {from}, above the head {head} of {} (a table with events): no hole at or below {head} would ever be examined; give a position of at most {}, or head, or checkpoints",
                settings.store.profile.qualified(&settings.store.schema).name(),
                head + 1
            ),
            store: fleet.then(|| settings.name.clone()),
        }],
    }
}

/// How often a progress line is logged when stderr is not a terminal.
const PROGRESS_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// Holes `scan` lists in its text output unless told otherwise.
const SCAN_LIST_DEFAULT: usize = 20;

/// Progress on stderr: a bar when stderr is a terminal; otherwise the same
/// figures as an INFO log line at most every [`PROGRESS_LOG_EVERY`] (the
/// first that long after the start, which the healer logs itself); and,
/// either way, a completion line ([`Progress::finish`]).
fn progress(len: u64, what: &'static str) -> Progress {
    use indicatif::{HumanCount, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
    let (bar, template) = if std::io::stderr().is_terminal() {
        (
            ProgressBar::new(len),
            "{msg} [{bar:40}] {human_pos}/{human_len} positions ({rate}, eta {eta})",
        )
    } else {
        let log = ProgressDrawTarget::term_like_with_hz(Box::new(ProgressLog::new()), 1);
        (
            ProgressBar::with_draw_target(Some(len), log),
            "{msg}: {human_pos} of {human_len} positions ({rate}, eta {eta})",
        )
    };
    // indicatif's {per_sec} prints four decimals ("320,142.9452/s").
    let rate = |state: &ProgressState, w: &mut dyn std::fmt::Write| {
        let per_sec = state.per_sec();
        let per_sec = if per_sec.is_finite() {
            per_sec.round()
        } else {
            0.0
        };
        let _ = write!(w, "{} positions/s", HumanCount(per_sec as u64));
    };
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key("rate", rate);
    bar.set_style(style.progress_chars("=> "));
    bar.set_message(what.to_string());
    Progress {
        bar,
        what,
        len,
        started: std::time::Instant::now(),
    }
}

/// A bar or progress log of [`progress`], and what it counts.
struct Progress {
    bar: indicatif::ProgressBar,
    what: &'static str,
    len: u64,
    started: std::time::Instant,
}

impl Progress {
    fn set(&self, done: u64) {
        self.bar.set_position(done);
    }

    /// Clears the bar and logs the completion line: `scanning: done, 6 of
    /// 6 positions in 4ms (1,500 positions/s)`; `stopped` instead of `done`
    /// when a signal cut the work short.
    fn finish(self, done: u64, stopped: bool) {
        use indicatif::HumanCount;
        self.bar.finish_and_clear();
        let took = self.started.elapsed();
        let rate = done as f64 / took.as_secs_f64().max(1e-6);
        info!(
            "{}: {}, {} of {} positions in {} ({} positions/s)",
            self.what,
            if stopped { "stopped" } else { "done" },
            HumanCount(done),
            HumanCount(self.len.max(done)),
            humantime::format_duration(std::time::Duration::from_millis(took.as_millis() as u64)),
            HumanCount(rate.round() as u64)
        );
    }
}

/// The draw target of [`progress`] without a terminal: each frame indicatif
/// draws becomes an INFO line, at most one every [`PROGRESS_LOG_EVERY`].
#[derive(Debug)]
struct ProgressLog {
    frame: std::sync::Mutex<String>,
    last: std::sync::Mutex<std::time::Instant>,
}

impl ProgressLog {
    /// The first line comes [`PROGRESS_LOG_EVERY`] after now: a frame at
    /// the start would only say "0 of N".
    fn new() -> Self {
        ProgressLog {
            frame: std::sync::Mutex::default(),
            last: std::sync::Mutex::new(std::time::Instant::now()),
        }
    }
}

impl indicatif::TermLike for ProgressLog {
    fn width(&self) -> u16 {
        200
    }
    fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.write_str(s)?;
        self.flush()
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        if let Ok(mut frame) = self.frame.lock() {
            frame.push_str(s);
        }
        Ok(())
    }
    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        let frame = match self.frame.lock() {
            Ok(mut frame) => std::mem::take(&mut *frame),
            Err(_) => return Ok(()),
        };
        let line = frame.trim_matches(|c: char| c == '\r' || c.is_whitespace());
        if line.is_empty() {
            return Ok(());
        }
        if let Ok(mut last) = self.last.lock() {
            let now = std::time::Instant::now();
            if now.duration_since(*last) >= PROGRESS_LOG_EVERY {
                *last = now;
                info!("{line}");
            }
        }
        Ok(())
    }
}

async fn scan_all<E: Engine>(
    healer: &mut Healer<E>,
    stop: &CancellationToken,
) -> Result<crate::healer::Start, Failure> {
    let start = healer.begin().await?;
    let bar = progress((start.head - start.after).max(0) as u64, "scanning");
    let mut shown = Shown {
        bar: &bar,
        from: start.after,
        done: 0,
    };
    healer.scan_to_head(stop, &mut shown).await?;
    let done = shown.done;
    bar.finish(done, stop.is_cancelled());
    Ok(start)
}

/// A one-shot command's [`progress`] bar following the healer: positions
/// examined above `from` while scanning, tombstones while filling.
struct Shown<'b> {
    bar: &'b Progress,
    from: i64,
    done: u64,
}

impl crate::healer::Progress for Shown<'_> {
    fn scanned(&mut self, examined: i64) {
        self.done = (examined - self.from).max(0) as u64;
        self.bar.set(self.done);
    }

    fn filled(&mut self, so_far: &crate::healer::FillReport) {
        self.done = so_far.tombstones;
        self.bar.set(self.done);
    }
}

fn one_shot_healer<E: Engine>(engine: Arc<E>, settings: &Store) -> Healer<E> {
    let health = Health::for_store(
        &settings.name,
        settings.poll_interval,
        settings.lock_timeout,
    );
    Healer::new(engine, Options::from(settings), Leader::always(), health)
}

fn plural(n: impl Into<u64>) -> &'static str {
    if n.into() == 1 {
        ""
    } else {
        "s"
    }
}

async fn scan<E: Engine>(
    engine: Arc<E>,
    settings: &Store,
    format: Format,
    limit: Option<usize>,
    all: bool,
    out: &Out,
) -> Result<u8, Failure> {
    let stop = CancellationToken::new();
    let mut healer = one_shot_healer(engine, settings);
    let start = scan_all(&mut healer, &stop).await?;
    let holes: Vec<_> = healer.tracker().ranges();
    let positions: u64 = holes.iter().map(|r| r.width()).sum();
    // The head is the table's: a start above it examined nothing up there.
    let head = if start.above_head() {
        start.head
    } else {
        healer.examined().unwrap_or(start.head)
    };
    let from = start.after + 1;
    let above_head = start.above_head().then(|| {
        format!(
            "the scan started at {from}, above the head {}: positions at or below {} were not examined, so holes among them are not reported (--start-from 0 examines the whole table)",
            start.head,
            start.after
        )
    });
    let shown = if all {
        holes.len()
    } else {
        match format {
            Format::Text => limit.unwrap_or(SCAN_LIST_DEFAULT),
            Format::Json => limit.unwrap_or(holes.len()),
        }
        .min(holes.len())
    };
    let scanned = Scanned {
        holes,
        positions,
        from,
        head,
        empty: start.empty,
        above_head,
        shown,
    };
    match format {
        Format::Json => scanned.print_json(settings),
        Format::Text => scanned.print_text(out),
    }
    Ok(if scanned.holes.is_empty() {
        EXIT_OK
    } else {
        EXIT_HOLES_FOUND
    })
}

/// What `scan` found, ready to be printed.
struct Scanned {
    holes: Vec<crate::gaps::PosRange>,
    positions: u64,
    /// The first position examined.
    from: i64,
    head: i64,
    /// The table had no rows.
    empty: bool,
    /// The warning of a scan that started above the head.
    above_head: Option<String>,
    /// How many of the holes are listed.
    shown: usize,
}

impl Scanned {
    /// Prints the findings as one JSON object.
    fn print_json(&self, settings: &Store) {
        let Scanned {
            ref holes,
            positions,
            from,
            head,
            empty,
            ref above_head,
            shown,
        } = *self;
        let mut report = serde_json::json!({
            "store": settings.name,
            "from": from,
            "head": head,
            "empty": empty,
            "holes": holes[..shown].iter().map(|r| serde_json::json!({"start": r.start, "end": r.end, "width": r.width()})).collect::<Vec<_>>(),
            "hole_count": holes.len(),
            "holes_not_listed": holes.len() - shown,
            "positions": positions,
        });
        if let Some(warning) = above_head {
            report["warning"] = serde_json::json!(warning);
        }
        println!("{report}");
    }

    /// Prints the findings as a summary line and the listed holes.
    fn print_text(&self, out: &Out) {
        let Scanned {
            ref holes,
            positions,
            from,
            head,
            empty,
            ref above_head,
            shown,
        } = *self;
        if let Some(warning) = above_head {
            out.line(format_args!("WARNING: {warning}"));
        }
        let span = if above_head.is_some() {
            format!(" from {from} on, above the head {head}")
        } else if empty && holes.is_empty() {
            ": the table has no rows yet".to_string()
        } else if from > head {
            format!(": nothing to examine, the scan starts at {from} and the head is {head}")
        } else {
            format!(" between {from} and the head {head}")
        };
        out.line(format_args!(
            "{} hole{} ({} missing position{}){span}",
            holes.len(),
            plural(holes.len() as u64),
            positions,
            plural(positions),
        ));
        for r in &holes[..shown] {
            let range = r.to_string();
            out.line(format_args!(
                "  {range:<24} {:>10} position{}",
                r.width(),
                plural(r.width())
            ));
        }
        let more = holes.len() - shown;
        if more > 0 {
            out.line(format_args!(
                "... and {more} more hole{} (use --all)",
                plural(more as u64)
            ));
        }
    }
}

async fn heal_once<E: Engine>(
    engine: Arc<E>,
    settings: &Store,
    format: Format,
    out: &Out,
) -> Result<u8, Failure> {
    let stop = crate::shutdown::on_signal()
        .map_err(|e| anyhow::anyhow!("installing signal handlers: {e}"))?;
    let mut healer = one_shot_healer(engine, settings);
    let healed = heal_rounds(&mut healer, settings, out, &stop).await?;
    let left = if settings.dry_run {
        crate::gaps::Stats {
            holes: healed.holes,
            positions: healed.positions,
            ..healer.tracker().stats()
        }
    } else {
        healer.tracker().stats()
    };
    // Stopped by a signal: the pass did not finish, which is neither "holes
    // held by open appends" (1) nor a failure (3).
    let stopped = stopped_by(&stop);
    let code = if let Some(signal) = stopped {
        signal.exit_code()
    } else if healed.report.errors > 0 {
        EXIT_INCOMPLETE
    } else if left.holes > 0 && !settings.dry_run {
        EXIT_HOLES_FOUND
    } else {
        EXIT_OK
    };
    print_heal_report(settings, format, out, &healed, &left, stopped);
    Ok(code)
}

/// The signal that cancelled `stop`, if it is cancelled.
fn stopped_by(stop: &CancellationToken) -> Option<crate::shutdown::Stop> {
    if !stop.is_cancelled() {
        return None;
    }
    // The token is cancelled only by a signal; the fallback never shows.
    Some(crate::shutdown::received().unwrap_or(crate::shutdown::Stop::Term))
}

/// What `heal` found over all its rounds, and what its fills did.
struct Healed {
    holes: usize,
    positions: u64,
    report: crate::healer::FillReport,
}

/// Scans and fills in rounds until nothing is left to find, or until told
/// to stop (then with what it found and filled until then).
async fn heal_rounds<E: Engine>(
    healer: &mut Healer<E>,
    settings: &Store,
    out: &Out,
    stop: &CancellationToken,
) -> Result<Healed, Failure> {
    // The tracker holds at most MAX_TRACKED holes: a store with more is
    // healed in rounds, each scanning on from where the last one paused.
    let (mut holes, mut positions) = (0, 0u64);
    let mut report = crate::healer::FillReport::default();
    loop {
        scan_all(healer, stop).await?;
        let stats = healer.tracker().stats();
        if stats.holes == 0 {
            break;
        }
        holes += stats.holes;
        positions += stats.positions;
        // A dry run fills nothing, so waiting for the holes to come due
        // would only pass the time: it reports what it found at once.
        if settings.dry_run || stop.is_cancelled() {
            break;
        }
        if let Some(due) = healer.tracker().last_due() {
            let wait = due.saturating_duration_since(tokio::time::Instant::now());
            out.note(format_args!(
                "found {} hole(s), {} position(s); waiting {} (gap_timeout) before filling",
                stats.holes,
                stats.positions,
                humantime::format_duration(std::time::Duration::from_millis(
                    wait.as_millis() as u64
                ))
            ));
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = stop.cancelled() => break,
            }
        }
        let bar = progress(stats.positions, "filling");
        let mut shown = Shown {
            bar: &bar,
            from: 0,
            done: 0,
        };
        let round = healer.fill_due_with(stop, &mut shown).await;
        let filled = shown.done;
        healer.publish_watermark().await;
        bar.finish(filled, stop.is_cancelled());
        report.add(&round);
        if !healer.scan_paused() || round.tombstones == 0 || stop.is_cancelled() {
            break;
        }
    }
    Ok(Healed {
        holes,
        positions,
        report,
    })
}

/// Prints what `heal` found, filled and left, as one JSON object or one line.
fn print_heal_report(
    settings: &Store,
    format: Format,
    out: &Out,
    healed: &Healed,
    left: &crate::gaps::Stats,
    stopped: Option<crate::shutdown::Stop>,
) {
    let Healed {
        holes,
        positions,
        ref report,
    } = *healed;
    let filling = report
        .statements
        .saturating_sub(report.committed + report.held + report.errors);
    if format == Format::Json {
        println!(
            "{}",
            serde_json::json!({
                "store": settings.name,
                "dry_run": settings.dry_run,
                "found": { "holes": holes, "positions": positions },
                "filled": report.tombstones,
                "statements": {
                    "total": report.statements,
                    "wrote": filling,
                    "committed": report.committed,
                    "held": report.held,
                    "failed": report.errors,
                },
                "left": { "holes": left.holes, "positions": left.positions },
                "waited_for_open_transactions": report.open_transaction,
                "stopped": stopped.map(crate::shutdown::Stop::name),
            })
        );
        return;
    }
    if let Some(signal) = stopped {
        out.line(format_args!(
            "stopped by {} before the pass ended: filled {} position(s) with {} statement(s); {} position(s) in {} hole(s) found and not filled (run it again)",
            signal.name(),
            report.tombstones,
            report.statements,
            left.positions,
            left.holes
        ));
    } else if holes == 0 {
        out.line("no holes: nothing to fill");
    } else if settings.dry_run {
        let unless = if settings.gap_timeout.is_zero() {
            String::new()
        } else {
            format!(
                " (holes as found now: a fill waits gap_timeout, {}, and leaves out what commits meanwhile)",
                humantime::format_duration(settings.gap_timeout)
            )
        };
        out.line(format_args!(
            "dry run: would have filled {positions} position(s) in {holes} hole(s); nothing written{unless}"
        ));
    } else {
        let waited = if report.open_transaction > 0 {
            format!(
                "; {} position(s) not tried: a transaction that may have drawn them was still open (run it again once it has ended)",
                report.open_transaction
            )
        } else {
            String::new()
        };
        out.line(format_args!(
            "filled {} position(s) with {} statement(s) ({filling} wrote tombstones, {} refused by a committed append, {} by a held position, {} failed); {} position(s) in {} hole(s) left{waited}",
            report.tombstones,
            report.statements,
            report.committed,
            report.held,
            report.errors,
            left.positions,
            left.holes
        ));
    }
}

/// What `check`'s configuration line says of the healed table: a described
/// table's profile, table and position column; nothing for Eventuous's own,
/// the default the line has always left unsaid.
fn configured_table(shape: &engine::profile::TableShape) -> String {
    match shape.tombstone {
        engine::profile::Tombstone::EventuousStream => String::new(),
        engine::profile::Tombstone::Columns(_) => format!(
            "profile {}, table {}.{}, ",
            shape.kind,
            shape.table.as_str(),
            shape.position.as_str()
        ),
    }
}

async fn check<E: Engine>(
    engine: Arc<E>,
    settings: &Store,
    format: Format,
    out: &Out,
) -> Result<u8, Failure> {
    let mut findings = vec![engine::Finding::pass(
        engine::Check::Configuration,
        format!(
            "engine {}, schema {}, {}gap_timeout {}, lock_timeout {}, connection {}",
            settings.engine,
            settings.store.schema.as_str(),
            configured_table(&settings.store.profile),
            humantime::format_duration(settings.gap_timeout),
            humantime::format_duration(settings.lock_timeout),
            settings.store.connection_string.redacted()
        ),
    )];
    match engine.preflight().await {
        Ok(more) => findings.extend(more),
        Err(e) => findings.push(engine::Finding::fail(engine::Check::Connection, e.message)),
    }
    let watermark_usable = findings
        .iter()
        .any(|f| f.check == engine::Check::Watermark && f.ok);
    if let Some(table) = engine.watermark_table().filter(|_| watermark_usable) {
        // The row itself: it must describe this store's table.
        match table.read_watermark(&settings.name).await {
            Ok(Some(p)) => findings.push(engine::Finding::pass(
                engine::Check::Watermark,
                format!("store {}: published up to position {p}", settings.name),
            )),
            Ok(None) => {}
            Err(e) => findings.push(engine::Finding::fail(engine::Check::Watermark, e.message)),
        }
    }
    let failed = findings.iter().filter(|f| !f.ok).count();
    let warnings = findings.iter().filter(|f| f.warning).count();
    match format {
        Format::Json => println!(
            "{}",
            serde_json::json!({ "store": settings.name, "ok": failed == 0, "warnings": warnings, "findings": findings })
        ),
        Format::Text => {
            for f in &findings {
                let label = match (f.ok, f.warning) {
                    (false, _) => "FAIL",
                    (true, true) => "WARN",
                    (true, false) => "ok  ",
                };
                out.line(format_args!("{label} {:<26} {}", f.what, f.detail));
            }
            let warned = match warnings {
                0 => String::new(),
                n => format!(" ({n} warning{})", plural(n as u64)),
            };
            out.line(if failed == 0 {
                format!("all checks passed{warned}")
            } else {
                format!("{failed} check(s) failed{warned}")
            });
        }
    }
    Ok(if failed == 0 {
        EXIT_OK
    } else {
        EXIT_INCOMPLETE
    })
}

async fn install<E: Engine>(engine: Arc<E>, settings: &Store, out: &Out) -> Result<u8, Failure> {
    let done = engine.install().await?;
    out.line(done);
    let _ = settings;
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(argv: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_args(std::iter::once("gap-healer").chain(argv.iter().copied()))
    }

    fn get<'a>(cli: &'a Cli, key: &str) -> Option<&'a str> {
        cli.command.flags().and_then(|(args, _)| args.get(key))
    }

    #[test]
    fn booleans_can_be_set_to_false_from_the_command_line() {
        for (argv, key, value) in [
            (&["run", "--dry-run"][..], "dry_run", "true"),
            (&["run", "--dry-run=false"], "dry_run", "false"),
            (&["--dry-run", "heal", "--once"], "dry_run", "true"),
            (
                &["run", "--leader-election=false"],
                "leader_election",
                "false",
            ),
            (&["run", "--no-leader-election"], "leader_election", "false"),
            (&["run", "--no-dry-run"], "dry_run", "false"),
        ] {
            let cli = parse(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            assert_eq!(get(&cli, key), Some(value), "{argv:?}");
        }
        let cli = parse(&["heal", "--once", "--dry-run=no", "--engine", "postgres"]).unwrap();
        let s = config::load(cli.command.flags().unwrap().0, [], Need::EngineOnly).unwrap();
        assert!(!s.stores[0].dry_run);
        // A value must follow `=`: `--dry-run heal` keeps `heal` the subcommand.
        assert!(parse(&["run", "--leader-election", "false"]).is_err());
    }

    /// Each command lists the flags of the keys it reads and no others;
    /// `run` and `config` take every key, and every key is taken
    /// somewhere before and after a command's name.
    #[test]
    fn each_command_takes_the_flags_of_the_keys_it_reads() {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        cmd.build();
        let listed = |name: &str| -> Vec<String> {
            cmd.find_subcommand(name)
                .unwrap()
                .get_arguments()
                .filter(|a| !a.is_hide_set())
                .filter_map(|a| a.get_long().map(String::from))
                .collect()
        };
        for (bit, name) in commands::NAMES {
            let listed = listed(name);
            for key in config::KEYS {
                assert_eq!(
                    listed.contains(&key.long()),
                    key.taken_by(bit),
                    "{name} --{}",
                    key.long()
                );
            }
            assert!(listed.contains(&"config".to_string()), "{name}");
            assert!(listed.contains(&"store".to_string()), "{name}");
        }
        for name in ["run", "config"] {
            assert!(listed(name).len() > config::KEYS.len(), "{name}");
        }
        // The operator's examples: each is refused, saying where it belongs.
        for (argv, needle) in [
            (
                &["scan", "--metrics-addr", "0.0.0.0:1"][..],
                "--metrics-addr is not a flag of `gap-healer scan`",
            ),
            (
                &["sql", "--connect-timeout", "1s"],
                "--connect-timeout is not a flag of `gap-healer sql`",
            ),
            (
                &["--poll-interval", "1s", "check"],
                "--poll-interval is not a flag of `gap-healer check`",
            ),
            (
                &["completions", "bash", "--schema", "x"],
                "`gap-healer completions` takes no configuration flags (--schema is a flag of run",
            ),
            (
                &["--schema", "x", "man"],
                "`gap-healer man` takes no configuration flags",
            ),
        ] {
            let err = parse(argv).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{argv:?}");
            assert!(err.to_string().contains(needle), "{argv:?}: {err}");
        }
        // No key's flag is global any more, and the root lists none.
        assert!(cmd.get_arguments().all(|a| !a.is_global_set()
            && (a.is_hide_set() || a.get_long().is_some_and(|l| l == "help" || l == "version"))));
        cmd.debug_assert();
    }

    /// Completions and man pages offer each command's own flags, and none
    /// before a command's name.
    #[test]
    fn the_documented_command_line_is_the_parsed_one_without_early_flags() {
        let mut documented = Documented::command();
        documented.build();
        let mut parsed = <Cli as clap::CommandFactory>::command();
        parsed.build();
        let longs = |c: &clap::Command| -> Vec<String> {
            c.get_arguments()
                .filter_map(|a| a.get_long().map(String::from))
                .collect()
        };
        assert_eq!(longs(&documented), ["help", "version"]);
        for sub in parsed.get_subcommands() {
            let twin = documented.find_subcommand(sub.get_name()).unwrap();
            assert_eq!(longs(sub), longs(twin), "{}", sub.get_name());
        }
        documented.debug_assert();
    }

    #[test]
    fn format_has_help_wherever_it_is_taken() {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        cmd.build();
        for name in ["scan", "heal", "check"] {
            let format = cmd
                .find_subcommand(name)
                .unwrap()
                .get_arguments()
                .find(|a| a.get_long() == Some("format"))
                .unwrap_or_else(|| panic!("{name} has no --format"));
            let help = format.get_help().map(|h| h.to_string()).unwrap_or_default();
            assert!(help.contains("json"), "{name}: {help:?}");
        }
    }

    #[test]
    fn the_version_names_the_commit_and_the_build_date() {
        let (version, rest) = VERSION.split_once(" (commit ").unwrap();
        assert_eq!(version, env!("CARGO_PKG_VERSION"));
        let (commit, date) = rest.split_once(", built ").unwrap();
        assert!(
            commit == "unknown"
                || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
            "{VERSION}"
        );
        let date = date.strip_suffix(')').unwrap();
        let parts: Vec<&str> = date.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [4, 2, 2],
            "{VERSION}"
        );
    }
}
