//! `gap-healer scan`: each store's holes between where its scan starts and
//! its head, found without writing and printed as text or JSON.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::one_shot::{one_shot_healer, scan_all, Out};
use super::{plural, Failure, Format, EXIT_HOLES_FOUND, EXIT_OK};
use crate::config::{commands, Flags, Store};
use crate::engine::Engine;

type ScanFlags = Flags<{ commands::SCAN }>;

pub(super) const SCAN_EXIT: &str = "\
Exit codes (in a fleet, the highest of any store's):
  0  no holes
  1  holes found
  2  bad usage or configuration
  3  could not complete: database unreachable, missing table or right";

/// Holes `scan` lists in its text output unless told otherwise.
const SCAN_LIST_DEFAULT: usize = 20;

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

pub(super) async fn scan<E: Engine>(
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
            "holes": holes[..shown].iter().map(|r| serde_json::json!({"start": r.start(), "end": r.end(), "width": r.width()})).collect::<Vec<_>>(),
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
