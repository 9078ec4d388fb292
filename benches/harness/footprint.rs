//! Section 6: footprint of the real binary: its size, then RSS (VmRSS, VmHWM) and
//! CPU (utime + stime from /proc/PID/stat) idle with the default 250 ms poll,
//! and while it fills one wide hole plus thousands of one-position holes.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::support::*;

pub async fn run(size: Size, report: &mut Report) -> Result<()> {
    let bytes = std::fs::metadata(gap_healer_testkit::bin::path())?.len();
    let debug = cfg!(debug_assertions);
    let idle_for = size.pick(
        Duration::from_secs(3),
        Duration::from_secs(30),
        Duration::from_secs(60),
    );
    let (singles, wide) = size.pick((200, 100_000), (5_000, 1_000_000), (20_000, 1_000_000));
    let schema = bench_store("footprint").await?;
    let idle = idle_run(&schema, idle_for).await;
    schema.try_drop_schema().await?;
    let idle = idle?;
    let schema = bench_store("footprint_fill").await?;
    let fill = fill_run(&schema, singles, wide).await;
    schema.try_drop_schema().await?;
    let fill = fill?;

    let mb = |kib: u64| kib as f64 / 1024.0;
    report.row(
        "6. binary size (release, stripped)",
        format!(
            "{:.1} MB{}",
            bytes as f64 / 1048576.0,
            if debug { " (debug build!)" } else { "" }
        ),
        "",
        None,
    );
    report.row(
        "6. RSS idle, 250 ms poll (VmHWM)",
        format!("{:.1} MB ({:.1} MB)", mb(idle.rss_max), mb(idle.hwm)),
        "≤ 15 MB",
        Some(mb(idle.hwm) <= 15.0),
    );
    report.row(
        "6. CPU idle, 250 ms poll",
        format!("{:.2} % of a core", idle.cpu_pct),
        "≤ 1 %",
        Some(idle.cpu_pct <= 1.0),
    );
    report.row(
        &format!(
            "6. RSS / CPU filling {} + {} one-position holes",
            thousands(wide as u64),
            thousands(singles as u64)
        ),
        format!(
            "{:.1} MB peak, {:.1} % of a core over {}",
            mb(fill.hwm),
            fill.cpu_pct,
            secs(fill.elapsed)
        ),
        "",
        None,
    );
    report.detail(format!(
        "### 6. Footprint\n\n\
         The binary cargo built for this run: {size_mb:.1} MB{debug_note}. Idle: the daemon on a \
         caught-up table (`--poll-interval 250ms`, JSON logs, leader election off), measured over \
         {idle_for} after 2 s of warm-up: RSS sampled every second (max {rss:.1} MB, VmHWM \
         {hwm:.1} MB), CPU {cpu:.2} % of one core ({ticks} clock ticks of {tck:.0} per second). \
         Filling: one {wide}-wide hole and {singles} one-position holes below it, from start \
         (gap_timeout 1 s included) to the last tombstone: {fill_s}, {tps} tombstones/s overall, \
         CPU {fcpu:.1} % of one core, VmHWM {fhwm:.1} MB, {stmts} fill statements.\n",
        size_mb = bytes as f64 / 1048576.0,
        debug_note = if debug {
            " (a debug build: run without --profile dev for real figures)"
        } else {
            " (release profile, stripped)"
        },
        idle_for = secs(idle_for),
        rss = mb(idle.rss_max),
        hwm = mb(idle.hwm),
        cpu = idle.cpu_pct,
        ticks = idle.ticks,
        tck = clock_ticks(),
        wide = thousands(wide as u64),
        singles = thousands(singles as u64),
        fill_s = secs(fill.elapsed),
        tps = thousands(((singles + wide) as f64 / fill.elapsed.as_secs_f64()) as u64),
        fcpu = fill.cpu_pct,
        fhwm = mb(fill.hwm),
        stmts = fill.statements,
    ));
    Ok(())
}

struct Usage {
    rss_max: u64,
    hwm: u64,
    cpu_pct: f64,
    ticks: u64,
    elapsed: Duration,
    statements: f64,
}

async fn idle_run(schema: &Store, idle_for: Duration) -> Result<Usage> {
    for i in 0..10 {
        bench_append(schema, &format!("s{i}"), 3).await?;
    }
    let daemon = start_healer(&schema.schema, &[])?;
    let pid = daemon.pid();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let first = proc_sample(pid)?;
    let started = Instant::now();
    let mut rss_max = first.rss_kib;
    while started.elapsed() < idle_for {
        tokio::time::sleep(Duration::from_secs(1)).await;
        rss_max = rss_max.max(proc_sample(pid)?.rss_kib);
    }
    let last = proc_sample(pid)?;
    let elapsed = started.elapsed();
    daemon.terminate();
    let ticks = last.cpu_ticks - first.cpu_ticks;
    Ok(Usage {
        rss_max,
        hwm: last.hwm_kib,
        cpu_pct: ticks as f64 / clock_ticks() / elapsed.as_secs_f64() * 100.0,
        ticks,
        elapsed,
        statements: 0.0,
    })
}

async fn fill_run(schema: &Store, singles: i64, wide: i64) -> Result<Usage> {
    let s = &schema.schema;
    // Events at the odd positions 1..=2*singles+1 (a hole at each even one),
    // then one event past a `wide` hole.
    let top = 2 * singles + 1 + wide + 1;
    schema
        .client
        .batch_execute(&format!(
            "INSERT INTO {s}.streams (stream_name, version) VALUES ('bench', {v});
             INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position,
                                        global_position, json_data, created)
             OVERRIDING SYSTEM VALUE
             SELECT gen_random_uuid(), 'BenchEvent', 1, n, p, '{{}}', now() AT TIME ZONE 'utc'
             FROM (SELECT row_number() OVER (ORDER BY p) - 1 AS n, p
                   FROM (SELECT generate_series(1, {odd_top}, 2) AS p UNION ALL SELECT {top}) x) y;
             SELECT setval(pg_get_serial_sequence('{s}.messages', 'global_position'), {top});",
            v = singles + 1,
            odd_top = 2 * singles + 1,
        ))
        .await?;
    schema
        .client
        .batch_execute(&format!("VACUUM ANALYZE {s}.messages"))
        .await?;
    let want = (singles + wide) as f64;
    let daemon = start_healer(&schema.schema, &[])?;
    let pid = daemon.pid();
    let first = proc_sample(pid)?;
    let started = Instant::now();
    let mut hwm = first.hwm_kib;
    loop {
        let sample = proc_sample(pid)?;
        hwm = hwm.max(sample.hwm_kib);
        let done = daemon
            .try_metric("gap_healer_tombstones_inserted_total")
            .await
            .unwrap_or(0.0);
        if done >= want {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("filling did not finish: {done} of {want} tombstones");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    let last = proc_sample(pid)?;
    let statements = daemon
        .try_metric("gap_healer_fill_attempts_total{outcome=\"filled\"}")
        .await
        .unwrap_or(0.0);
    daemon.terminate();
    if schema.try_missing_count().await? != 0 {
        bail!("holes left after filling");
    }
    let ticks = last.cpu_ticks - first.cpu_ticks;
    Ok(Usage {
        rss_max: last.rss_kib,
        hwm: hwm.max(last.hwm_kib),
        cpu_pct: ticks as f64 / clock_ticks() / elapsed.as_secs_f64() * 100.0,
        ticks,
        elapsed,
        statements,
    })
}
