//! gap-healer's performance harness, against the local PostgreSQL (SQL
//! Server is not measured: there is none on the development machines).
//!
//! ```text
//! cargo bench --bench harness                      # default size: at most 10 min on 2 cores;
//!                                                  # prints the table, writes docs/benchmarks.md
//! cargo bench --bench harness -- --size smoke      # under a minute, writes nothing (CI: .ci/bench-smoke)
//! cargo bench --bench harness -- --size full       # longer runs, no extrapolation
//!     --only footprint,latency,wide,overhead,lock,idle,fleet,proof   sections to run (default:
//!                                                        all; with --only, nothing is written
//!                                                        unless --write PATH, and then only
//!                                                        those sections' rows and blocks are
//!                                                        replaced, the others kept)
//!     --rows 100000,1000000,10000000                     idle-poll table sizes
//!     --write PATH | --no-write                          where the results go
//! ```
//!
//! Every section has its own schema (`ghb_<section>_<pid>`), dropped
//! afterwards; schemas left by a killed run are dropped by the next one.
//! The harness prints figures and never asserts timings: a target missed is
//! reported as missed. The pure parts (hole tracking, fill planning) are in
//! the criterion bench `benches/pure.rs`.

mod fleet;
mod footprint;
mod idle;
mod latency;
mod lock;
mod overhead;
mod proof;
mod support;
mod wide;

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use support::{Report, Size};

const SECTIONS: [&str; 8] = [
    "footprint",
    "latency",
    "wide",
    "overhead",
    "lock",
    "idle",
    "fleet",
    "proof",
];

/// The number each section's summary rows (`N. ...`) and detail block
/// (`### N. ...`) start with in the generated text: the issue's numbering.
fn number(section: &str) -> &'static str {
    match section {
        "latency" => "1.",
        "wide" => "2.",
        "idle" => "3.",
        "overhead" => "4.",
        "lock" => "5.",
        "footprint" => "6.",
        "fleet" => "7.",
        "proof" => "8.",
        _ => unreachable!("sections are checked when parsed"),
    }
}
const BEGIN: &str = "<!-- harness:begin -->";
const END: &str = "<!-- harness:end -->";

struct Args {
    size: Size,
    only: Vec<String>,
    rows: Vec<i64>,
    write: Option<PathBuf>,
    /// Started by `cargo bench` (which passes `--bench`) or with `--size`;
    /// `cargo test --all-targets` runs bench targets without either.
    run: bool,
}

fn usage() -> &'static str {
    "usage: cargo bench --bench harness -- [--size smoke|default|full] [--only SECTION,...] \
     [--rows N,N,...] [--write PATH | --no-write]\nsections: footprint, latency, wide, overhead, lock, idle, fleet, proof"
}

fn parse_args() -> Result<Args> {
    let mut size = std::env::var("BENCH_SIZE")
        .ok()
        .map(|s| Size::parse(&s).with_context(|| format!("BENCH_SIZE={s}")))
        .transpose()?;
    let mut run = size.is_some();
    let mut only = None;
    let mut rows = None;
    let mut write: Option<Option<PathBuf>> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().with_context(|| format!("{name} needs a value"));
        match a.as_str() {
            "--bench" => run = true,
            "--size" => {
                let v = value("--size")?;
                size = Some(Size::parse(&v).with_context(|| format!("--size {v}"))?);
                run = true;
            }
            "--only" => {
                let v = value("--only")?;
                let list: Vec<String> = v.split(',').map(|s| s.trim().to_string()).collect();
                if let Some(bad) = list.iter().find(|s| !SECTIONS.contains(&s.as_str())) {
                    bail!("--only: unknown section {bad}");
                }
                only = Some(list);
            }
            "--rows" => {
                let v = value("--rows")?;
                let list = v
                    .split(',')
                    .map(|s| s.trim().replace('_', "").parse::<i64>())
                    .collect::<Result<Vec<_>, _>>()
                    .with_context(|| format!("--rows {v}"))?;
                if list.is_empty() || list.iter().any(|r| *r < 1) {
                    bail!("--rows: positive row counts, comma-separated");
                }
                rows = Some(list);
            }
            "--write" => write = Some(Some(PathBuf::from(value("--write")?))),
            "--no-write" => write = Some(None),
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}"),
        }
    }
    let size = size.unwrap_or(Size::Default);
    let mut rows = rows.unwrap_or_else(|| {
        size.pick(
            vec![10_000, 100_000],
            vec![100_000, 1_000_000, 10_000_000],
            vec![100_000, 1_000_000, 10_000_000],
        )
    });
    rows.sort_unstable();
    rows.dedup();
    // A partial run (--only) writes only where --write says, and then
    // replaces only its sections' results (merge.rs).
    let write = write.unwrap_or_else(|| {
        (size != Size::Smoke && only.is_none())
            .then(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/benchmarks.md"))
    });
    Ok(Args {
        size,
        only: only.unwrap_or_else(|| SECTIONS.iter().map(|s| s.to_string()).collect()),
        rows,
        write,
        run,
    })
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("harness: {e:#}\n{}", usage());
            return ExitCode::from(2);
        }
    };
    if !args.run {
        println!("harness: not started by `cargo bench`; run `cargo bench --bench harness` (or `-- --size smoke`)");
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("harness: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("harness: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the sections; false when one of them failed (its error is in the report).
async fn run(args: Args) -> Result<bool> {
    let started = Instant::now();
    let admin = support::connect().await?;
    support::drop_stale_schemas(&admin).await?;
    let row = admin
        .query_one(
            "SELECT current_setting('server_version'), current_setting('fsync'),
                    current_setting('synchronous_commit'), current_setting('autovacuum')",
            &[],
        )
        .await?;
    let server = Server {
        version: row.get(0),
        fsync: row.get(1),
        synchronous_commit: row.get(2),
        autovacuum: row.get(3),
    };
    let pg_version = server.version.clone();
    let debug = cfg!(debug_assertions);
    // Other work on the machine skews every figure: measure it first.
    let cpu0 = support::cpu_jiffies();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let background = support::busy_pct(cpu0, support::cpu_jiffies());
    println!("machine CPU busy before the run (nothing of the harness running): {background:.0} %");
    println!(
        "gap-healer harness, size {}, {} build, PostgreSQL {pg_version}, sections {}",
        args.size.name(),
        if debug { "debug" } else { "release" },
        args.only.join(",")
    );
    let mut report = Report::default();
    let mut ok = true;
    for section in SECTIONS
        .iter()
        .filter(|s| args.only.iter().any(|o| o == *s))
    {
        // Each section starts without the previous one's dirty buffers.
        let _ = admin.batch_execute("CHECKPOINT").await;
        let t = Instant::now();
        println!("\n== {section}");
        // A section reports into its own part, kept only when it succeeds.
        let mut part = Report::default();
        let mut result = run_section(section, &args, &mut part).await;
        if let Err(e) = &result {
            // The server is shared: another session's tests may restart it.
            eprintln!("section {section} failed ({e:#}); retrying it once");
            report.retried.push(format!("{section} ({e:#})"));
            tokio::time::sleep(Duration::from_secs(5)).await;
            part = Report::default();
            result = run_section(section, &args, &mut part).await;
        }
        if result.is_ok() {
            report.summary.append(&mut part.summary);
            report.details.append(&mut part.details);
        }
        if let Err(e) = result {
            ok = false;
            eprintln!("section {section} failed: {e:#}");
            report.row(section, format!("failed: {e:#}"), "", Some(false));
        }
        println!("== {section}: {}", support::secs(t.elapsed()));
    }
    let total = started.elapsed();
    let text = render(&args, &report, &server, total, background);
    println!("\n{text}");
    if let Some(path) = &args.write {
        if args.only.len() == SECTIONS.len() {
            write_docs(path, &text)?;
        } else if ok {
            merge_docs(path, &args, &report, &text)?;
        } else {
            println!("not written to {}: a section failed", path.display());
            return Ok(ok);
        }
        println!("written to {}", path.display());
    }
    Ok(ok)
}

/// The server's version and the settings that move the figures.
struct Server {
    version: String,
    fsync: String,
    synchronous_commit: String,
    autovacuum: String,
}

async fn run_section(section: &str, args: &Args, report: &mut Report) -> Result<()> {
    match section {
        "footprint" => footprint::run(args.size, report).await,
        "latency" => latency::run(args.size, report).await,
        "wide" => wide::run(args.size, report).await,
        "overhead" => overhead::run(args.size, report).await,
        "lock" => lock::run(args.size, report).await,
        "fleet" => fleet::run(args.size, report).await,
        "proof" => proof::run(args.size, report).await,
        "idle" => {
            let polls = args.size.pick(200, 1_000, 2_000);
            idle::run(&args.rows, polls, report).await
        }
        _ => unreachable!("sections are checked when parsed"),
    }
}

fn render(
    args: &Args,
    report: &Report,
    server: &Server,
    total: Duration,
    background: f64,
) -> String {
    let cmd = |program: &str, a: &[&str]| -> String {
        Command::new(program)
            .args(a)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "?".into())
    };
    let commit = cmd("git", &["rev-parse", "--short", "HEAD"]);
    let dirty = !cmd("git", &["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let date = cmd("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or("?".into(), |kib| format!("{:.1} GiB", kib / 1048576.0));
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "?".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mut out = String::new();
    out.push_str(&format!(
        "`cargo bench --bench harness -- --size {size}`, finished {date}, commit `{commit}`{dirty}, \
         {build} build, {total} in all.\n\nMachine: {cores} CPUs ({cpu}), {mem_gib} memory, \
         PostgreSQL {pg_version} on the same machine over loopback (fsync {fsync}, \
         synchronous_commit {sync}, autovacuum {autovacuum}), `{rustc}`. CPU busy before the run, \
         with nothing of the harness running: {background:.0} % (other work on a shared machine \
         skews the throughput figures).\n\n",
        size = args.size.name(),
        dirty = if dirty {
            " with uncommitted changes"
        } else {
            ""
        },
        build = if cfg!(debug_assertions) {
            "**debug**"
        } else {
            "release (bench profile)"
        },
        total = support::secs(total),
        rustc = cmd("rustc", &["--version"]),
        pg_version = server.version,
        fsync = server.fsync,
        sync = server.synchronous_commit,
        autovacuum = server.autovacuum,
    ));
    if !report.retried.is_empty() {
        out.push_str(&format!(
            "Sections that failed once and were run again: {}.\n\n",
            report.retried.join("; ")
        ));
    }
    out.push_str("| what | figure | target | |\n|---|---|---|---|\n");
    for [what, figure, target, verdict] in &report.summary {
        out.push_str(&format!("| {what} | {figure} | {target} | {verdict} |\n"));
    }
    for block in &report.details {
        out.push('\n');
        out.push_str(block);
    }
    out
}

/// Replaces the text between the markers of `path`; appends it when the file
/// has no markers, creates the file when there is none.
fn write_docs(path: &PathBuf, text: &str) -> Result<()> {
    let region = format!("{BEGIN}\n{text}\n{END}");
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if b < e => format!("{}{region}{}", &old[..b], &old[e + END.len()..]),
        _ if old.is_empty() => format!("# Benchmarks\n\n{region}\n"),
        _ => format!("{}\n\n{region}\n", old.trim_end()),
    };
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}

/// A partial run (`--only ... --write PATH`): in the generated part of
/// `path`, replaces the summary rows and detail blocks of the sections run
/// (found by their number, see [`number`]) and keeps every other section's,
/// with a line saying when and how these were measured. Without a generated
/// part yet, writes the partial text as it is.
fn merge_docs(path: &PathBuf, args: &Args, report: &Report, text: &str) -> Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let (Some(b), Some(e)) = (old.find(BEGIN), old.find(END)) else {
        return write_docs(path, text);
    };
    if b > e {
        return write_docs(path, text);
    }
    let region = &old[b + BEGIN.len()..e];
    let ours = |line: &str| {
        args.only.iter().any(|s| {
            let n = number(s);
            line.starts_with(&format!("| {n} ")) || line.starts_with(&format!("### {n} "))
        })
    };
    // Header, summary table, then detail blocks (each starts with "### ").
    let (head, details) = match region.find("\n### ") {
        Some(i) => (&region[..i], &region[i + 1..]),
        None => (region, ""),
    };
    let mut lines: Vec<String> = Vec::new();
    let mut in_table = false;
    let mut table_end = None;
    for line in head.trim_matches('\n').lines() {
        if line.starts_with("| what | figure |") {
            in_table = true;
        }
        if in_table && !line.starts_with('|') {
            in_table = false;
            table_end.get_or_insert(lines.len());
        }
        if in_table && ours(line) {
            continue;
        }
        lines.push(line.to_string());
    }
    let at = table_end.unwrap_or(lines.len());
    let new_rows: Vec<String> = report
        .summary
        .iter()
        .map(|[w, f, t, v]| format!("| {w} | {f} | {t} | {v} |"))
        .collect();
    lines.splice(at..at, new_rows);
    // The partial run's own header (command, date, commit, time; the
    // machine and its load) says when and where these sections were measured.
    let mut paragraphs = text.split("\n\n");
    let first = paragraphs.next().unwrap_or_default();
    let machine = paragraphs
        .next()
        .filter(|p| p.starts_with("Machine:"))
        .unwrap_or_default();
    let note = format!(
        "Section(s) {} measured separately: {} {machine}",
        args.only.join(", "),
        first.replace(
            &format!("--size {}`", args.size.name()),
            &format!(
                "--size {} --only {}`",
                args.size.name(),
                args.only.join(",")
            )
        )
    )
    .trim_end()
    .to_string();
    // Replaces an earlier note about the same sections.
    let prefix = format!("Section(s) {} measured separately:", args.only.join(", "));
    lines.retain(|l| !l.starts_with(&prefix));
    let insert_at = lines
        .iter()
        .position(|l| l.starts_with("| what | figure |"))
        .unwrap_or(lines.len());
    lines.splice(insert_at..insert_at, [note, String::new()]);
    let mut blocks: Vec<String> = details
        .split("\n### ")
        .filter(|b| !b.trim().is_empty())
        .map(|b| {
            let b = b.trim_matches('\n');
            if b.starts_with("### ") {
                b.to_string()
            } else {
                format!("### {b}")
            }
        })
        .filter(|b| !ours(b))
        .collect();
    blocks.extend(
        report
            .details
            .iter()
            .map(|d| d.trim_matches('\n').to_string()),
    );
    let mut merged = lines.join("\n");
    for block in blocks {
        merged.push_str("\n\n");
        merged.push_str(&block);
    }
    let new = format!(
        "{}{BEGIN}\n{merged}\n{END}{}",
        &old[..b],
        &old[e + END.len()..]
    );
    std::fs::write(path, new).with_context(|| format!("writing {}", path.display()))
}
