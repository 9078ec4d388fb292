//! Section 1: heal latency: rollback holes made under a steady append load, healed by
//! the real binary (gap_timeout 1 s, the default 250 ms poll). For each
//! hole: tombstone commit time - hole visible time - gap_timeout, both ends
//! on the database clock.
//!
//! - Hole visible: the commit of the first append above the hole. Every
//!   append reads `clock_timestamp()` pipelined right behind its commit.
//! - Tombstone committed: a poller reads new rows of the tombstone stream
//!   every 5 ms with `clock_timestamp()` (an upper bound, by at most one poll);
//!   the tombstone's `created` (the fill transaction's start) is the lower bound.
//!
//! Run with the default 250 ms poll, then (default and full sizes) with a
//! 100 ms poll, to show which part of the latency the poll interval is.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use gap_healer_testkit::eventuous::TOMBSTONE_STREAM;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::support::*;

const GAP_TIMEOUT: Duration = Duration::from_secs(1);

pub async fn run(size: Size, report: &mut Report) -> Result<()> {
    let polls: Vec<u64> = size.pick(vec![250], vec![250, 100], vec![250, 100]);
    let holes: usize = size.pick(40, 1_000, 1_000);
    let mut table = String::from(
        "| poll interval | measured at | min | p50 | p90 | p99 | max | one fill transaction p50 / p99 / max |\n|---:|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut notes = Vec::new();
    for poll in polls {
        let schema = bench_store("latency").await?;
        let result = measure(&schema, holes, Duration::from_millis(poll)).await;
        schema.try_drop_schema().await?;
        let m = result?;
        let q = |v: &[Duration], x: f64| quantile(v, x).map(ms).unwrap_or_else(|| "-".into());
        // min / p50 / p90 / p99 / max, as table cells.
        let cells = |v: &[Duration]| [0.0, 0.5, 0.9, 0.99, 1.0].map(|x| q(v, x)).join(" | ");
        let fill_q = |x: f64| {
            quantile(&m.fills_ms, x)
                .map(|v| format!("{v:.0} ms"))
                .unwrap_or_else(|| "-".into())
        };
        let fills = format!("{} / {} / {}", fill_q(0.5), fill_q(0.99), fill_q(1.0));
        table.push_str(&format!(
            "| {poll} ms | tombstone seen committed (upper bound) | {} | {fills} |\n",
            cells(&m.upper),
        ));
        table.push_str(&format!(
            "| {poll} ms | fill transaction start (lower bound) | {} | |\n",
            cells(&m.lower),
        ));
        notes.push(format!(
            "{poll} ms poll: {} holes made among {} committed appends, {} tombstones inserted, \
             {} matched to a hole, {} filled earlier than gap_timeout after becoming visible.",
            m.made,
            thousands(m.appends),
            m.filled,
            m.upper.len(),
            m.early
        ));
        let figure = format!(
            "{} / {} / {} ({} holes)",
            q(&m.upper, 0.5),
            q(&m.upper, 0.99),
            q(&m.upper, 1.0),
            m.upper.len()
        );
        if poll == 250 {
            report.row(
                "1. heal latency beyond gap_timeout, p50 / p99 / max (250 ms poll)",
                figure,
                "p99 ≤ 250 ms",
                quantile(&m.upper, 0.99).map(|p| p <= Duration::from_millis(250)),
            );
        } else {
            report.row(
                &format!("1. the same with a {poll} ms poll"),
                figure,
                "",
                None,
            );
        }
    }
    report.detail(format!(
        "### 1. Heal latency\n\n\
         Rollback holes (one burnt position each, one every 20-80 ms) among the appends of 8 steady \
         writers (one append per writer every 10 ms, 1-3 events); the real binary with \
         `--gap-timeout 1s` and the poll interval shown, other settings default. Latency = tombstone \
         commit - hole visible (the commit of the first append above it) - gap_timeout, both on the \
         database clock. Upper bound: a 5 ms poller's first sight of the tombstone; lower bound: the \
         tombstone's `created` (now() of the fill transaction). One fill transaction: the daemon's \
         `ms` log field.\n\n{table}\n{}\n",
        notes.join(" ")
    ));
    Ok(())
}

struct Measured {
    made: usize,
    appends: u64,
    filled: f64,
    upper: Vec<Duration>,
    lower: Vec<Duration>,
    early: usize,
    fills_ms: Vec<f64>,
}

async fn measure(schema: &Store, holes: usize, poll: Duration) -> Result<Measured> {
    // Holes arrive every 20..80 ms (about 20 a second), between steady appends.
    let spacing = (20u64, 80u64);
    let poll_flag = format!("{}ms", poll.as_millis());
    let daemon = start_healer(&schema.schema, &[("--poll-interval", &poll_flag)])?;
    let stop = Arc::new(AtomicBool::new(false));
    let load = Workload {
        writers: 8,
        batch: (1, 3),
        rollback: 0.0,
        slow: 0.0,
        hold: Duration::ZERO,
        lock: AppendLock::None,
        pace: Some(Duration::from_millis(10)),
        record_commits: true,
        progress: None,
        session_sql: None,
    };
    let writers = tokio::spawn({
        let (name, stop) = (schema.schema.clone(), stop.clone());
        async move { write(&name, &load, stop).await }
    });
    let poll_stop = Arc::new(AtomicBool::new(false));
    let poller = tokio::spawn(tombstone_poller(schema.schema.clone(), poll_stop.clone()));

    // The hole maker: one-event appends that fail after their insert.
    let maker = connect().await?;
    let fail = maker
        .prepare(&format!(
            "SELECT {}.bench_append('holes', 1, false, true)",
            schema.schema
        ))
        .await?;
    let mut rng = StdRng::seed_from_u64(1);
    let mut made = 0usize;
    while made < holes {
        tokio::time::sleep(Duration::from_millis(
            rng.random_range(spacing.0..=spacing.1),
        ))
        .await;
        if maker.query_one(&fail, &[]).await.is_err() {
            made += 1;
        }
    }
    // Keep appending until the last hole is visible and due, then stop.
    tokio::time::sleep(GAP_TIMEOUT + poll * 2).await;
    stop.store(true, Ordering::Relaxed);
    let written = writers.await??;
    let filled = daemon
        .wait_metric(
            "gap_healer_tombstones_inserted_total",
            holes as f64,
            Duration::from_secs(20),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    poll_stop.store(true, Ordering::Relaxed);
    let seen = poller.await??;
    let mut fills_ms: Vec<f64> = daemon
        .lines_containing("filled hole with tombstones")
        .iter()
        .filter_map(|l| field(l, "\"ms\":"))
        .collect();
    fills_ms.sort_by(f64::total_cmp);
    daemon.terminate();

    let created: HashMap<i64, f64> = schema
        .client
        .query(
            &format!(
                "SELECT global_position, EXTRACT(EPOCH FROM created)::float8 FROM {}.messages WHERE message_type = $1",
                schema.schema
            ),
            &[&TOMBSTONE_TYPE],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();

    // visible(p) = earliest commit of an append whose last position is above p.
    let mut commits = written.commits.clone();
    commits.sort_by_key(|c| c.0);
    let mut suffix_min = vec![f64::INFINITY; commits.len() + 1];
    for i in (0..commits.len()).rev() {
        suffix_min[i] = suffix_min[i + 1].min(commits[i].1);
    }
    let visible = |p: i64| -> Option<f64> {
        let i = commits.partition_point(|c| c.0 <= p);
        suffix_min.get(i).copied().filter(|v| v.is_finite())
    };
    let gap = GAP_TIMEOUT.as_secs_f64();
    let mut upper: Vec<Duration> = Vec::new();
    let mut lower: Vec<Duration> = Vec::new();
    let mut early = 0;
    for (p, seen_at) in &seen {
        let Some(v) = visible(*p) else { continue };
        let beyond = seen_at - v - gap;
        if beyond < 0.0 {
            early += 1;
        }
        upper.push(Duration::from_secs_f64(beyond.max(0.0)));
        if let Some(c) = created.get(p) {
            lower.push(Duration::from_secs_f64((c - v - gap).max(0.0)));
        }
    }
    upper.sort();
    lower.sort();
    Ok(Measured {
        made,
        appends: written.appends,
        filled,
        upper,
        lower,
        early,
        fills_ms,
    })
}

/// Every 5 ms, the tombstone stream's new rows with the database clock:
/// position -> seconds since the epoch when first seen.
async fn tombstone_poller(schema: String, stop: Arc<AtomicBool>) -> Result<HashMap<i64, f64>> {
    let client = connect().await?;
    let page = client
        .prepare(&format!(
            "SELECT m.stream_position, m.global_position, EXTRACT(EPOCH FROM clock_timestamp())::float8
             FROM {schema}.messages m JOIN {schema}.streams s USING (stream_id)
             WHERE s.stream_name = $1 AND m.stream_position > $2 ORDER BY 1"
        ))
        .await?;
    let mut last = -1i32;
    let mut seen = HashMap::new();
    while !stop.load(Ordering::Relaxed) {
        for r in client.query(&page, &[&TOMBSTONE_STREAM, &last]).await? {
            last = r.get(0);
            seen.insert(r.get::<_, i64>(1), r.get::<_, f64>(2));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(seen)
}

/// The number after `key` in a JSON log line (`"ms":3`).
fn field(line: &str, key: &str) -> Option<f64> {
    let rest = line.split(key).nth(1)?;
    let num: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse().ok()
}
