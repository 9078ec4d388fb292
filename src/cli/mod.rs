//! The command line: clap's definitions ([`Cli`], [`Command`]), the
//! dispatch ([`run()`]) and the exit codes, here; each command in a file of
//! its own with its printers and types: `run.rs`, `scan.rs`, `heal.rs`,
//! `check.rs`, `install.rs`, `sql.rs`, `config.rs`, and `docs.rs`
//! (`completions` and `man`); `one_shot.rs` is what the commands that work
//! on a store's engine share, `progress.rs` the indicatif adapter. The tests
//! call them through the real binary.
//!
//! [`run()`] matches each parsed command once and hands it what it needs and
//! nothing else: the settings its flags make (none for `completions` and
//! `man`), and for `scan`, `heal`, `check` and `install` an `OnStore`, the
//! only commands a store's engine is ever opened for.
//!
//! Each command takes the flags of the configuration keys it reads
//! ([`crate::config::Key::commands`]), listed by `gap-healer <command> --help`
//! under their headings; the same flags may also come before the command's
//! name, where the command refuses any it does not read.
//!
//! Exit codes ([`EXIT_CODES`]): 0 success; 1 holes: `scan` found some,
//! `heal --once` left some (not as a dry run); 2 bad usage or configuration; 3 could not
//! complete (database unreachable, missing table, missing rights, a fill
//! failed); 143 or 130: `heal --once` stopped by SIGTERM or SIGINT before
//! its pass ended (128 + the signal's number).

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

use crate::config::{commands, ConfigError, Flags, Need, Settings};
use crate::engine::DbError;
use crate::telemetry;

mod check;
mod config;
mod docs;
mod heal;
mod install;
mod on_store;
mod one_shot;
mod progress;
mod run;
mod scan;
mod sql;

pub use check::CheckArgs;
pub use heal::HealArgs;
pub use scan::ScanArgs;
pub use sql::SqlArgs;

use check::CHECK_EXIT;
use heal::HEAL_EXIT;
use install::INSTALL_EXIT;
use on_store::OnStore;
use run::RUN_EXIT;
use scan::SCAN_EXIT;

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

const PRINT_EXIT: &str = "\
Exit codes:
  0  printed
  2  bad usage or configuration";

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
    pub fn flags(&self) -> Option<(&crate::config::ConfigArgs, &[String])> {
        fn of<const C: u16>(f: &Flags<C>) -> Option<(&crate::config::ConfigArgs, &[String])> {
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
    let key = crate::config::KEYS
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
            crate::config::not_read(flag, key, name),
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
    Config(#[from] ConfigError),
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

/// Runs the command: each loads the configuration its flags, the
/// environment and the file make (those that take any), validated whole
/// before anything connects, and works only with what it was given.
pub fn run(cli: Cli) -> Result<u8, Failure> {
    match cli.command {
        Command::Completions { shell } => docs::completions(shell),
        Command::Man { command } => docs::man(command.as_deref()),
        Command::Config(flags) => config::print(&load(&flags, Need::Connection)?),
        Command::Sql(args) => {
            sql::print(&load(&args.flags, Need::EngineOnly)?, args.role.as_deref())
        }
        Command::Run(flags) => {
            let settings = load(&flags, Need::Connection)?;
            on_runtime(&settings, run::daemon(&settings))
        }
        Command::Scan(args) => {
            on_each_store(load(&args.flags, Need::Connection)?, OnStore::Scan(args))
        }
        Command::Heal(args) => {
            on_each_store(load(&args.flags, Need::Connection)?, OnStore::Heal(args))
        }
        Command::Check(args) => {
            on_each_store(load(&args.flags, Need::Connection)?, OnStore::Check(args))
        }
        Command::Install(flags) => on_each_store(load(&flags, Need::Connection)?, OnStore::Install),
    }
}

/// The settings `flags`, the environment and the configuration file make,
/// validated whole and narrowed to the stores `--store` names.
fn load<const C: u16>(flags: &Flags<C>, need: Need) -> Result<Settings, Failure> {
    let mut settings = crate::config::load(&flags.config, std::env::vars(), need)?;
    settings.select(&flags.stores)?;
    Ok(settings)
}

/// Runs `command` on each store `settings` select.
fn on_each_store(settings: Settings, command: OnStore) -> Result<u8, Failure> {
    on_runtime(&settings, on_store::each_store(&settings, &command))
}

/// Logs as `settings` say, and runs `work` to its end on the runtime of a
/// command that connects.
fn on_runtime(
    settings: &Settings,
    work: impl std::future::Future<Output = Result<u8, Failure>>,
) -> Result<u8, Failure> {
    telemetry::init_logging(settings.daemon.log_format, &settings.daemon.log_level);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("starting the async runtime: {e}"))?;
    runtime.block_on(work)
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

fn plural(n: impl Into<u64>) -> &'static str {
    if n.into() == 1 {
        ""
    } else {
        "s"
    }
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
        let s = crate::config::load(cli.command.flags().unwrap().0, [], Need::EngineOnly).unwrap();
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
            for key in crate::config::KEYS {
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
            assert!(listed(name).len() > crate::config::KEYS.len(), "{name}");
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
