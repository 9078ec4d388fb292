//! Section 4: overhead on appenders. 8 writers (batches of 1-5 events, 1 %
//! of appends rolled back, so the healer has holes to fill) append without
//! pause for the whole section, while the real binary is started and stopped:
//! short windows without and with it, in pairs whose order alternates, so a
//! burst of other work on the machine falls on both sides of a pair. The
//! CPU the daemon and its server sessions used is measured too: on a
//! CPU-bound machine that is the throughput the appenders can lose. A third
//! window runs the daemon with `options='-c jit=off'` in its connection
//! string: the probe's plan is costed by table size, and above
//! `jit_above_cost` every probe pays for a JIT compilation.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::support::*;

pub async fn run(size: Size, report: &mut Report) -> Result<()> {
    let schema = bench_store("overhead").await?;
    let result = measure(&schema, size, report).await;
    schema.try_drop_schema().await?;
    result
}

/// What runs beside the writers in a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Off,
    /// The daemon as configured by default.
    On,
    /// The daemon with `options='-c jit=off'` in its connection string.
    OnNoJit,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::On => "running",
            Mode::OnNoJit => "running, jit=off",
        }
    }
}

/// One window's figures.
struct Window {
    events_per_sec: f64,
    cpu: CpuUse,
    /// Daemon process and its server sessions, % of one core.
    healer_cpu: Option<(f64, f64)>,
}

/// Other work on the machine above this (cores) makes a window unclean.
const QUIET: f64 = 0.25;

async fn measure(schema: &Store, size: Size, report: &mut Report) -> Result<()> {
    let groups = size.pick(1, 10, 25);
    let window = size.pick(
        Duration::from_secs(1),
        Duration::from_secs(3),
        Duration::from_secs(5),
    );
    let app = healer_app_name();
    let no_jit_url = pg_url_with(&app, "-c jit=off");
    let progress = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Workload::eight_writers();
    load.progress = Some(progress.clone());
    let writers = tokio::spawn({
        let (name, stop) = (schema.schema.clone(), stop.clone());
        async move { write(&name, &load, stop).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;

    let mut windows: Vec<(usize, Mode, Window)> = Vec::new();
    let mut tombstones = 0.0;
    let result: Result<()> = async {
        for group in 1..=groups {
            // Rotate the order, so drift falls on every mode alike.
            let mut order = [Mode::Off, Mode::On, Mode::OnNoJit];
            order.rotate_left(group % 3);
            for mode in order {
                let daemon = match mode {
                    Mode::Off => None,
                    Mode::On | Mode::OnNoJit => {
                        let mut flags = vec![("--start-from", "head")];
                        if mode == Mode::OnNoJit {
                            flags.push(("--connection-string", &no_jit_url));
                        }
                        let d =
                            tokio::task::block_in_place(|| start_healer(&schema.schema, &flags))?;
                        // Its first scan and pool connections, outside the window.
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        Some(d)
                    }
                };
                let watch = CpuWatch::start(daemon.iter().map(|d| d.pid()).collect()).await?;
                let d0 = match &daemon {
                    Some(d) => proc_sample(d.pid())?.cpu_ticks,
                    None => 0,
                };
                let s0 = session_ticks(&schema.client, &app).await?;
                let e0 = progress.load(Ordering::Relaxed);
                let t0 = Instant::now();
                tokio::time::sleep(window).await;
                let events = progress.load(Ordering::Relaxed) - e0;
                let took = t0.elapsed().as_secs_f64();
                let cpu = watch.finish().await?;
                let healer_cpu = match daemon {
                    Some(d) => {
                        let dt = proc_sample(d.pid())?.cpu_ticks - d0;
                        let st = session_ticks(&schema.client, &app)
                            .await?
                            .saturating_sub(s0);
                        tombstones += d
                            .try_metric("gap_healer_tombstones_inserted_total")
                            .await
                            .unwrap_or(0.0);
                        tokio::task::block_in_place(|| d.terminate());
                        let pct = |t: u64| t as f64 / clock_ticks() / took * 100.0;
                        Some((pct(dt), pct(st)))
                    }
                    None => None,
                };
                windows.push((
                    group,
                    mode,
                    Window {
                        events_per_sec: events as f64 / took,
                        cpu,
                        healer_cpu,
                    },
                ));
            }
        }
        Ok(())
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    let written = writers.await??;
    result?;

    let mut table = String::from(
        "| group | healer | events/s | CPU busy (cores) | harness + its sessions | other work | daemon | its server sessions |\n|---:|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let quiet = |w: &Window| w.cpu.other < QUIET;
    // (all groups' ratios, quiet groups' ratios, summed rates) per healer mode.
    let ratios = |mode: Mode| {
        let (mut all, mut clean, mut sums) = (Vec::new(), Vec::new(), (0.0, 0.0));
        for group in 1..=groups {
            let get = |m: Mode| windows.iter().find(|w| w.0 == group && w.1 == m);
            let (Some(on), Some(off)) = (get(mode), get(Mode::Off)) else {
                continue;
            };
            let r = on.2.events_per_sec / off.2.events_per_sec;
            all.push(r);
            if quiet(&on.2) && quiet(&off.2) {
                clean.push(r);
            }
            sums.0 += on.2.events_per_sec;
            sums.1 += off.2.events_per_sec;
        }
        all.sort_by(f64::total_cmp);
        clean.sort_by(f64::total_cmp);
        (all, clean, sums.0 / sums.1)
    };
    let mut share = Vec::new();
    for (group, mode, w) in &windows {
        let (d, s) = match w.healer_cpu {
            Some((d, s)) => {
                if *mode == Mode::On {
                    // The healer's share of all the CPU the machine spent.
                    share.push((d + s) / (w.cpu.busy * 100.0));
                }
                (format!("{d:.1} %"), format!("{s:.1} %"))
            }
            None => ("-".into(), "-".into()),
        };
        table.push_str(&format!(
            "| {group} | {} | {:.0} | {:.2} | {:.2} | {:.2}{} | {d} | {s} |\n",
            mode.label(),
            w.events_per_sec,
            w.cpu.busy,
            w.cpu.ours,
            w.cpu.other,
            if quiet(w) { "" } else { " (busy)" },
        ));
    }
    share.sort_by(f64::total_cmp);
    let cpu_share = quantile(&share, 0.5).unwrap_or(0.0);
    // The verdict uses the groups no other work disturbed, when there are
    // enough; the median is given with the spread of the per-group ratios
    // it comes from, and a spread wider than the effect is said so.
    let summary = |mode: Mode| {
        let (all, clean, pooled) = ratios(mode);
        let median_all = quantile(&all, 0.5).unwrap_or(0.0);
        let (used, what) = if clean.len() >= 3 {
            (&clean, format!("{} quiet groups", clean.len()))
        } else {
            (&all, format!("all {} groups", all.len()))
        };
        let spread = Spread::of(used);
        let mut text = format!(
            "{m:.3} (median of {what}; per-group ratios {lo:.3}-{hi:.3}, IQR {q1:.3}-{q3:.3}",
            m = spread.median,
            lo = spread.min,
            hi = spread.max,
            q1 = spread.q1,
            q3 = spread.q3,
        );
        if used.len() != all.len() {
            text.push_str(&format!("; all groups {median_all:.3}"));
        }
        text.push_str(&format!(", pooled {pooled:.3})"));
        let unsettled = spread.wider_than_effect();
        if let Some(why) = &unsettled {
            text.push_str(&format!("; the spread is wider than the effect ({why})"));
        }
        (spread.median, text, unsettled.is_some())
    };
    let (on, on_text, unsettled) = summary(Mode::On);
    let (_, nojit_text, _) = summary(Mode::OnNoJit);
    let what = "4. append throughput, healer running / not (8 writers)";
    let figure = format!(
        "{on_text}; the healer used {:.1} % of the CPU spent",
        cpu_share * 100.0
    );
    if unsettled {
        report.row_unsettled(what, figure, "≥ 0.97");
    } else {
        report.row(what, figure, "≥ 0.97", Some(on >= 0.97));
    }
    report.row(
        "4. the same, healer with `options='-c jit=off'`",
        nojit_text.clone(),
        "",
        None,
    );
    report.detail(format!(
        "### 4. Overhead on appenders\n\n\
         8 writers, each on its own connection and streams, appending batches of 1-5 events through \
         an Eventuous-style append function (one round trip, commit included) without pause for the \
         whole section; 1 % of appends fail after their insert and leave a hole. Meanwhile {groups} \
         groups of three {dur} windows: without the healer, with the real binary (`--gap-timeout 1s \
         --poll-interval 250ms --start-from head`, started before its window and stopped after it), \
         and with the same binary given `options='-c jit=off'` in its connection string; the order \
         rotates between groups. In all, {appends} appends, {rollbacks} rolled back, \
         {tombstones:.0} tombstones written in the windows with a healer.\n\n\
         Where the CPU went, in cores: all of it; the harness process with its server sessions, the \
         daemon and the daemon's sessions (found by application name); and the rest, other work on \
         the machine plus the server's background processes. A window with more than {QUIET} cores \
         of other work is marked busy; groups without a busy window are quiet. Throughput with / \
         without the healer: {on_text}; with jit off: {nojit_text}. The default daemon and its \
         sessions took a median {share:.1} % of the CPU the machine spent.\n\n{table}",
        dur = secs(window),
        appends = thousands(written.appends),
        rollbacks = thousands(written.rollbacks),
        share = cpu_share * 100.0,
    ));
    Ok(())
}

/// The spread of per-group ratios around their median.
struct Spread {
    median: f64,
    min: f64,
    max: f64,
    q1: f64,
    q3: f64,
}

impl Spread {
    /// Of sorted ratios.
    fn of(sorted: &[f64]) -> Spread {
        let q = |p: f64| quantile(sorted, p).unwrap_or(f64::NAN);
        Spread {
            median: q(0.5),
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            q1: q(0.25),
            q3: q(0.75),
        }
    }

    /// Why the effect (|1 - median|) cannot be told from the noise: the
    /// interquartile range or the whole range covers 1.0, or the
    /// interquartile range is wider than the effect. `None` when it can.
    fn wider_than_effect(&self) -> Option<String> {
        let effect = (1.0 - self.median).abs();
        let iqr = self.q3 - self.q1;
        if self.q1 <= 1.0 && 1.0 <= self.q3 {
            Some(format!("the IQR {:.3}-{:.3} covers 1.0", self.q1, self.q3))
        } else if iqr > effect {
            Some(format!("the IQR is {iqr:.3} wide, the effect {effect:.3}"))
        } else if self.min <= 1.0 && 1.0 <= self.max {
            Some(format!(
                "the groups range {:.3}-{:.3}, across 1.0",
                self.min, self.max
            ))
        } else {
            None
        }
    }
}
