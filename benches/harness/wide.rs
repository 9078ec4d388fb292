//! Section 2: wide holes: an identity jump of 10,000 and 100,000 positions, filled
//! by the library's healer (one scan, then `fill_due`: set-based pieces of
//! at most 20,000 rows), against one position per round: the same engine's
//! `fill` of a single position, back to back, which is the database work of
//! Eventuous's in-process PostgreSQL tombstones (one tombstone per
//! `GapHandlingTimeoutMs` round) without the wait between rounds.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use gap_healer::config::StartFrom;
use gap_healer::engine::{Fence, FillOutcome};
use gap_healer::gaps::PosRange;
use gap_healer::healer::Options;
use gap_healer_testkit::engine::FillRange;
use tokio_util::sync::CancellationToken;

use crate::support::*;

pub async fn run(size: Size, report: &mut Report) -> Result<()> {
    let widths: Vec<i64> = size.pick(vec![10_000], vec![10_000, 100_000], vec![10_000, 100_000]);
    // One-per-round is sampled and extrapolated, except the 10,000 of `full`.
    let sample = |width: i64| -> i64 {
        match size {
            Size::Smoke => 100,
            Size::Default => 500,
            Size::Full if width <= 10_000 => width,
            Size::Full => 2_000,
        }
    };
    let mut rows = String::from(
        "| hole | healer: statements | healer: time | healer: tombstones/s | one per round: sample | one per round: per position | one per round: whole hole | speed-up |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for width in widths {
        let schema = bench_store(&format!("wide{width}")).await?;
        let result = measure(&schema, width, sample(width)).await;
        schema.try_drop_schema().await?;
        let m = result?;
        let whole = m.single * m.width as u32;
        let ratio = whole.as_secs_f64() / m.healer.as_secs_f64();
        let extrapolated = if m.sample < m.width {
            " (extrapolated)"
        } else {
            ""
        };
        rows.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {}{} | {:.0}x |\n",
            thousands(m.width as u64),
            m.statements,
            secs(m.healer),
            thousands((m.width as f64 / m.healer.as_secs_f64()) as u64),
            thousands(m.sample as u64),
            ms(m.single),
            secs(whole),
            extrapolated,
            ratio
        ));
        report.row(
            &format!(
                "2. {}-wide hole: healer vs one per round",
                thousands(m.width as u64)
            ),
            format!(
                "{} ({}/s) vs {}{}: {ratio:.0}x",
                secs(m.healer),
                thousands((m.width as f64 / m.healer.as_secs_f64()) as u64),
                secs(whole),
                extrapolated,
            ),
            "≥ 100x",
            Some(ratio >= 100.0),
        );
    }
    report.detail(format!(
        "### 2. Wide holes\n\n\
         A hole made by moving the identity (`setval`) between two appends, filled by the library's \
         `Healer` (one `scan_step`, then `fill_due` with gap_timeout 0; PostgreSQL pieces of at most \
         20,000 rows, one transaction each). One per round: `fill_ranges` of one position at a time, \
         back to back, on a second hole in the same table; the whole-hole figure is per position x \
         width (extrapolated when the sample is smaller than the hole). Eventuous also waits \
         `GapHandlingTimeoutMs` between rounds, which this leaves out in its favour.\n\n{rows}"
    ));
    Ok(())
}

struct Measured {
    width: i64,
    statements: u64,
    healer: Duration,
    sample: i64,
    single: Duration,
}

async fn measure(schema: &Store, width: i64, sample: i64) -> Result<Measured> {
    bench_append(schema, "before", 1).await?;
    schema.try_jump_identity(width).await?;
    bench_append(schema, "after", 1).await?;
    let engine = schema.try_engine()?;
    let mut healer = gap_healer_testkit::engine::healer(
        engine.clone(),
        Options {
            store: Default::default(),
            gap_timeout: Duration::ZERO,
            poll_interval: Duration::from_millis(250),
            lock_timeout: Duration::from_secs(2),
            scan_page_size: 10_000,
            start_from: StartFrom::Position(1),
            lookback: 0,
            dry_run: false,
            give_up_after: None,
            publish_watermark: false,
        },
    );
    healer.scan_step().await?;
    if healer.tracker().stats().positions != width as u64 {
        bail!(
            "expected a {width}-wide hole, tracking {:?}",
            healer.tracker().stats()
        );
    }
    let started = Instant::now();
    let filled = healer.fill_due(&CancellationToken::new()).await;
    let took = started.elapsed();
    if filled.tombstones != width as u64 || schema.try_missing_count().await? != 0 {
        bail!("the {width}-wide hole was not filled: {filled:?}");
    }

    // One position per round, on a second hole of `sample` positions.
    schema.try_jump_identity(sample).await?;
    let last = bench_append(schema, "after2", 1).await?;
    let first = last - sample;
    let started = Instant::now();
    for p in first..last {
        match engine
            .fill(
                PosRange::single(p),
                Duration::from_secs(2),
                &Fence::Unfenced,
            )
            .await?
        {
            FillOutcome::Filled { rows: 1 } => {}
            other => bail!("single fill of {p}: {other:?}"),
        }
    }
    let single = started.elapsed() / sample as u32;
    if schema.try_missing_count().await? != 0 {
        bail!("the sample hole was not filled");
    }
    Ok(Measured {
        width,
        statements: filled.statements,
        healer: took,
        sample,
        single,
    })
}
