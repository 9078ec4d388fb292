//! `gap-healer heal --once`: one pass over each store (scan to the head,
//! wait `gap_timeout`, fill, again while the tracker was full), and its report.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::one_shot::{one_shot_healer, scan_all, Out};
use super::progress::{progress, Shown};
use super::{Failure, Format, EXIT_HOLES_FOUND, EXIT_INCOMPLETE, EXIT_OK};
use crate::config::{commands, Flags, Store};
use crate::engine::Engine;
use crate::healer::Healer;

type HealFlags = Flags<{ commands::HEAL }>;

pub(super) const HEAL_EXIT: &str = "\
Exit codes (in a fleet, the highest of any store's):
  0  every hole found is filled (or there were none; or --dry-run, which fills none)
  1  holes left: held by appends still open (run it again later)
  2  bad usage or configuration
  3  could not complete: database unreachable, missing table or right, or a fill failed
  143  stopped by SIGTERM before the pass ended (130: SIGINT): 128 + the signal, as a shell reports a process the signal ended;
       the report says what was filled and what was found and left";

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

pub(super) async fn heal_once<E: Engine>(
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
