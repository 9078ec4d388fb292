//! The command line: each subcommand is a function that `main` calls and the
//! tests call through the real binary.
//!
//! Exit codes: 0 success; 1 holes: `scan` found some, `heal --once` left
//! some (not as a dry run); 2 bad usage or configuration; 3 could not
//! complete (database unreachable, missing table, missing rights, a fill
//! failed).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;
use tracing::{info, Instrument};

use crate::config::{self, ConfigArgs, Need, Settings, Store};
use crate::engine::{self, DbError, Engine, EngineKind, Pools};
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

#[derive(Parser, Debug)]
#[command(
    name = "gap-healer",
    version = VERSION,
    about = "Fills holes in the global position of identity-positioned event stores with tombstones, so all-stream subscriptions never stall."
)]
pub struct Cli {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Only this store of the file's [[stores]] (repeatable; default: every store).
    #[arg(long = "store", global = true, value_name = "NAME")]
    pub stores: Vec<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Run the daemon: scan, fill holes older than gap_timeout, serve metrics.
    Run,
    /// Report the current holes without writing; exit 1 when there is at least one.
    Scan {
        /// Output: text, or json (one object per store, each on its own line: README, "JSON output").
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// List at most N holes (text: 20 unless given; JSON: every hole unless given).
        #[arg(long, value_name = "N")]
        limit: Option<usize>,
        /// List every hole, however many.
        #[arg(long, conflicts_with = "limit")]
        all: bool,
    },
    /// One detect-and-fill pass, then exit (for Jobs and cron); exit 1 when holes are left.
    Heal {
        /// Required: one pass, then exit.
        #[arg(long, required = true)]
        once: bool,
        /// Output: text, or json (one object per store, each on its own line: README, "JSON output").
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Preflight: connection, TLS, table shapes, rights; one line per finding.
    Check {
        /// Output: text, or json (one object per store, each on its own line: README, "JSON output").
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
    },
    /// Print the SQL objects and grants the healer needs, for a DBA.
    Sql {
        /// The role (PostgreSQL) or database user (SQL Server) of the
        /// healer's login, to grant to; without it the script says
        /// <healer_role>, to be replaced before it runs.
        #[arg(long, value_name = "ROLE", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        role: Option<String>,
    },
    /// Print the effective configuration (secrets redacted) and where each value came from.
    Config,
    /// Create the fill procedure in the store's schema (SQL Server procedure mode).
    Install,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
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
    let cli = match Cli::try_parse() {
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
    let need = match cli.command {
        Command::Sql { .. } => Need::EngineOnly,
        _ => Need::Connection,
    };
    let mut settings = config::load(&cli.config, std::env::vars(), need)?;
    settings.select(&cli.stores)?;
    let many = settings.stores.len() + settings.sets.len() > 1;
    match cli.command {
        Command::Config => {
            print!("{}", settings.to_toml());
            return Ok(EXIT_OK);
        }
        Command::Sql { role } => {
            let role = role.as_deref();
            for store in &settings.stores {
                if many {
                    println!("-- store {}", store.name);
                }
                print!("{}", engine::setup_sql(store.engine, &store.store, role));
            }
            for set in &settings.sets {
                println!(
                    "-- store set {}: in every database LIKE '{}'",
                    set.name, set.databases
                );
                print!(
                    "{}",
                    engine::setup_sql(set.template.engine, &set.template.store, role)
                );
            }
            return Ok(EXIT_OK);
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
        if let Command::Run = cli.command {
            return run_daemon(&settings).await;
        }
        let pools = Pools::default();
        let stores = crate::fleet::expand(&settings).await?;
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
            let done = async {
                match store.engine {
                    EngineKind::Postgres => {
                        let engine =
                            engine::postgres::PostgresEngine::sharing(&store.store, &pools);
                        dispatch(Arc::new(engine?), store, cli.command.clone(), &out).await
                    }
                    EngineKind::Mssql => {
                        let engine = engine::mssql::MssqlEngine::sharing(&store.store, &pools);
                        dispatch(Arc::new(engine?), store, cli.command.clone(), &out).await
                    }
                }
            }
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
        }
        Ok(worst)
    })
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

async fn dispatch<E: Engine>(
    engine: Arc<E>,
    store: &Store,
    command: Command,
    out: &Out,
) -> Result<u8, Failure> {
    match command {
        Command::Scan { format, limit, all } => scan(engine, store, format, limit, all, out).await,
        Command::Heal { format, .. } => heal_once(engine, store, format, out).await,
        Command::Check { format } => check(engine, store, format, out).await,
        Command::Install => install(engine, store, out).await,
        Command::Run | Command::Sql { .. } | Command::Config => {
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
                "the scan would start at {from}, above the head {head} of {}.messages (a table with events): no hole at or below {head} would ever be examined; give a position of at most {}, or head, or checkpoints",
                settings.store.schema,
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
    /// 6 positions in 4ms (1,500 positions/s)`.
    fn finish(self, done: u64) {
        use indicatif::HumanCount;
        self.bar.finish_and_clear();
        let took = self.started.elapsed();
        let rate = done as f64 / took.as_secs_f64().max(1e-6);
        info!(
            "{}: done, {} of {} positions in {} ({} positions/s)",
            self.what,
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
    let mut done = 0;
    healer
        .scan_to_head(stop, |examined| {
            done = (examined - start.after).max(0) as u64;
            bar.set(done)
        })
        .await?;
    bar.finish(done);
    Ok(start)
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
    match format {
        Format::Json => {
            let mut report = serde_json::json!({
                "store": settings.name,
                "from": from,
                "head": head,
                "empty": start.empty,
                "holes": holes[..shown].iter().map(|r| serde_json::json!({"start": r.start, "end": r.end, "width": r.width()})).collect::<Vec<_>>(),
                "hole_count": holes.len(),
                "holes_not_listed": holes.len() - shown,
                "positions": positions,
            });
            if let Some(warning) = &above_head {
                report["warning"] = serde_json::json!(warning);
            }
            println!("{report}");
        }
        Format::Text => {
            if let Some(warning) = &above_head {
                out.line(format_args!("WARNING: {warning}"));
            }
            let span = if above_head.is_some() {
                format!(" from {from} on, above the head {head}")
            } else if start.empty && holes.is_empty() {
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
    Ok(if holes.is_empty() {
        EXIT_OK
    } else {
        EXIT_HOLES_FOUND
    })
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
    // The tracker holds at most MAX_TRACKED holes: a store with more is
    // healed in rounds, each scanning on from where the last one paused.
    let (mut holes, mut positions) = (0, 0u64);
    let mut report = crate::healer::FillReport::default();
    loop {
        scan_all(&mut healer, &stop).await?;
        let stats = healer.tracker().stats();
        if stats.holes == 0 {
            break;
        }
        holes += stats.holes;
        positions += stats.positions;
        // A dry run fills nothing, so waiting for the holes to come due
        // would only pass the time: it reports what it found at once.
        if settings.dry_run {
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
                _ = stop.cancelled() => return Ok(EXIT_OK),
            }
        }
        let bar = progress(stats.positions, "filling");
        let mut filled = 0;
        let round = healer
            .fill_due_with_progress(&stop, &mut |so_far| {
                filled = so_far.tombstones;
                bar.set(so_far.tombstones)
            })
            .await;
        healer.publish_watermark().await;
        bar.finish(filled);
        report.add(&round);
        if !healer.scan_paused() || round.tombstones == 0 || stop.is_cancelled() {
            break;
        }
    }
    let left = if settings.dry_run {
        crate::gaps::Stats {
            holes,
            positions,
            ..healer.tracker().stats()
        }
    } else {
        healer.tracker().stats()
    };
    let code = if report.errors > 0 {
        EXIT_INCOMPLETE
    } else if left.holes > 0 && !settings.dry_run {
        EXIT_HOLES_FOUND
    } else {
        EXIT_OK
    };
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
            })
        );
        return Ok(code);
    }
    if holes == 0 {
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
        out.line(format_args!(
            "filled {} position(s) with {} statement(s) ({filling} wrote tombstones, {} refused by a committed append, {} by a held position, {} failed); {} position(s) in {} hole(s) left",
            report.tombstones,
            report.statements,
            report.committed,
            report.held,
            report.errors,
            left.positions,
            left.holes
        ));
    }
    Ok(code)
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
            settings.store.schema,
            match &settings.store.profile {
                engine::profile::Profile::Eventuous => String::new(),
                engine::profile::Profile::Table(t) =>
                    format!("profile {}, table {}.{}, ", t.kind, t.table, t.position),
            },
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
    if watermark_usable {
        // The row itself: it must describe this store's table.
        match engine.read_watermark(&settings.name).await {
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
        Cli::try_parse_from(std::iter::once("gap-healer").chain(argv.iter().copied()))
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
            assert_eq!(cli.config.get(key), Some(value), "{argv:?}");
        }
        let cli = parse(&["heal", "--once", "--dry-run=no", "--engine", "postgres"]).unwrap();
        let s = config::load(&cli.config, [], Need::EngineOnly).unwrap();
        assert!(!s.stores[0].dry_run);
        // A value must follow `=`: `--dry-run heal` keeps `heal` the subcommand.
        assert!(parse(&["run", "--leader-election", "false"]).is_err());
    }

    #[test]
    fn every_configuration_key_is_a_global_flag() {
        let cmd = <Cli as clap::CommandFactory>::command();
        for key in config::KEYS {
            assert!(
                cmd.get_arguments()
                    .any(|a| a.get_long() == Some(key.long().as_str()) && a.is_global_set()),
                "--{}",
                key.long()
            );
        }
        cmd.debug_assert();
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
