//! Section 5: the append-lock comparison (seed 003): 8 writers appending small
//! batches
//! (a) each behind one global `pg_advisory_xact_lock`, read by that store's
//!     reader (`global_position > last_seen`), and
//! (b) in parallel, with the real binary healing and an Eventuous-rules
//!     reader (in order, stops at a hole, ignores `$tombstone`);
//! (c) the same naive reader under (b)'s load, without the lock and without
//!     gap handling, counting the events it never saw.
//! (a) twice: the lock inside the one-round-trip append (its best case), and
//! as a statement of its own as seed 003's code takes it. Every design with
//! fast appends only, then with 1 % of appends holding their transaction
//! open 100 ms after inserting (a slow client or network).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use crate::support::*;

struct Outcome {
    written: Written,
    naive_lost: usize,
    eventuous: Option<(usize, Followed)>,
    events: usize,
    tombstones: i64,
    cpu: CpuUse,
}

/// The workloads the designs are compared under.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Small batches, 1 % rolled back.
    Fast,
    /// And 1 % of appends held open 100 ms after inserting.
    Slow,
    /// Fast, with every commit's WAL flush taking 1 ms more.
    SlowFlush,
}

/// One design's runs, added up.
#[derive(Default)]
struct Totals {
    appends: u64,
    events: u64,
    rollbacks: u64,
    secs: f64,
    stored: usize,
    naive_lost: usize,
    eventuous_lost: Option<usize>,
    still_waiting: bool,
    longest_stop: Option<Duration>,
    tombstones: i64,
    /// Other work on the machine, in core-seconds.
    other: f64,
}

impl Totals {
    fn add(&mut self, o: Outcome) {
        self.appends += o.written.appends;
        self.events += o.written.events;
        self.rollbacks += o.written.rollbacks;
        self.secs += o.written.elapsed.as_secs_f64();
        self.stored += o.events;
        self.naive_lost += o.naive_lost;
        self.tombstones += o.tombstones;
        self.other += o.cpu.other * o.written.elapsed.as_secs_f64();
        if let Some((lost, f)) = o.eventuous {
            *self.eventuous_lost.get_or_insert(0) += lost;
            self.still_waiting |= !f.caught_up;
            let longest = f.stops.iter().max().copied();
            self.longest_stop = self.longest_stop.max(longest);
        }
    }
    fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.secs
    }
}

pub async fn run(size: Size, report: &mut Report) -> Result<()> {
    let duration = size.pick(
        Duration::from_secs(2),
        Duration::from_secs(8),
        Duration::from_secs(15),
    );
    let rounds = size.pick(1, 2, 3);
    let mut table = String::from(
        "| appends | design | appends/s | events/s | rolled back | naive reader: events never seen | Eventuous reader: events never handled | its longest stop at a hole | other work (cores) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let designs = [
        (AppendLock::InAppend, "(a) global lock, inside the append"),
        (
            AppendLock::Statement,
            "(a') global lock, own statement (seed 003)",
        ),
        (AppendLock::None, "(b) parallel + gap-healer"),
    ];
    // (workload, lock, naive reader's misses, Eventuous reader's misses, events)
    let mut lost: Vec<(&str, AppendLock, usize, Option<usize>, usize)> = Vec::new();
    let workloads: Vec<Kind> = size.pick(
        vec![Kind::Fast, Kind::Slow],
        vec![Kind::Fast, Kind::Slow, Kind::SlowFlush],
        vec![Kind::Fast, Kind::Slow, Kind::SlowFlush],
    );
    for kind in workloads {
        let slow = kind == Kind::Slow;
        let mut w = Workload::eight_writers();
        if slow {
            w.slow = 0.01;
            w.hold = Duration::from_millis(100);
        }
        if kind == Kind::SlowFlush {
            // Every WAL flush first waits 1 ms (the group's leader sleeps,
            // later commits join its flush): a 1 ms storage flush, where
            // this machine's takes 0.09 ms.
            w.session_sql = Some("SET commit_siblings = 0; SET commit_delay = 1000");
        }
        let label = match kind {
            Kind::Fast => "fast",
            Kind::Slow => "1 % held open 100 ms",
            Kind::SlowFlush => "fast, 1 ms flush (emulated)",
        };
        let mut totals: Vec<Totals> = designs.iter().map(|_| Totals::default()).collect();
        // Designs interleaved round by round, so background load falls on all.
        for _ in 0..rounds {
            for (i, (lock, design)) in designs.iter().enumerate() {
                let mut w = w.clone();
                w.lock = *lock;
                let schema = bench_store("lock").await?;
                let result = measure(&schema, &w, duration).await;
                schema.try_drop_schema().await?;
                let o = result?;
                println!(
                    "lock comparison, {label}, {design}: {:.0} events/s, naive reader missed {}, tombstones {}",
                    o.written.events_per_sec(),
                    o.naive_lost,
                    o.tombstones
                );
                totals[i].add(o);
            }
        }
        for ((lock, design), t) in designs.iter().zip(&totals) {
            let ev_lost = match t.eventuous_lost {
                Some(n) if t.still_waiting => format!("{n} (still waiting at the end)"),
                Some(n) => n.to_string(),
                None => "-".into(),
            };
            table.push_str(&format!(
                "| {label} | {design} | {:.0} | {:.0} | {} | {} of {} | {ev_lost} | {} | {:.2} |\n",
                t.appends as f64 / t.secs,
                t.events_per_sec(),
                t.rollbacks,
                t.naive_lost,
                thousands(t.stored as u64),
                t.longest_stop.map(ms).unwrap_or_else(|| "-".into()),
                t.other / t.secs,
            ));
            lost.push((label, *lock, t.naive_lost, t.eventuous_lost, t.stored));
        }
        let (a, a2, b) = (
            totals[0].events_per_sec(),
            totals[1].events_per_sec(),
            totals[2].events_per_sec(),
        );
        report.row(
            &format!("5. throughput (b) parallel + healer / (a) global lock, {label}"),
            format!(
                "{b:.0} / {a:.0} events/s = {:.1}x (vs the lock as its own statement: {:.1}x)",
                b / a,
                b / a2
            ),
            if kind == Kind::Fast { "≥ 3x" } else { "" },
            (kind == Kind::Fast).then_some(b / a >= 3.0),
        );
    }
    let a_lost: usize = lost
        .iter()
        .filter(|l| l.1 != AppendLock::None)
        .map(|l| l.2)
        .sum();
    let b_lost: usize = lost.iter().filter_map(|l| l.3).sum();
    let c: Vec<String> = lost
        .iter()
        .filter(|l| l.1 == AppendLock::None)
        .map(|l| format!("{}: {} of {}", l.0, l.2, thousands(l.4 as u64)))
        .collect();
    report.row(
        "5. events lost: (a) lock + naive reader / (b) healer + Eventuous reader / (c) naive reader under (b)",
        format!("{a_lost} / {b_lost} / {}", c.join("; ")),
        "(a), (b): 0",
        Some(a_lost == 0 && b_lost == 0),
    );
    report.detail(format!(
        "### 5. The append-lock comparison (seed 003)\n\n\
         8 writers, batches of 1-5 events, 1 % of appends rolled back after their insert; {runs} \
         of {dur} per design and workload, the designs interleaved, a fresh schema per run; the \
         second workload also keeps 1 % of appends open 100 ms after their insert (a slow client or network); the third is the first with every WAL \
         flush delayed 1 ms (`commit_siblings = 0`, `commit_delay = 1000` in the writers' \
         sessions: the flush group's leader sleeps 1 ms, later commits join its flush), to show \
         storage slower than this machine's (fdatasync 0.09 ms). (a): every append first takes \
         `pg_advisory_xact_lock(3003)` inside the one-round-trip append function, the shortest \
         hold this design allows. (a'): the lock is a statement of its own in the append's \
         transaction, as seed 003's code does, so it is held over the lock's reply, the append \
         and the commit. (b): the same appends without the lock, the real binary running \
         (`--gap-timeout 1s`), and an Eventuous-rules reader (in order, stops at a hole, ignores \
         `$tombstone`, would skip a hole only after an hour). A naive reader \
         (`global_position > last_seen`, polling every 5 ms) runs in every run: in (a) it is that \
         store's own reader; in (b) it is (c), what holes cost a reader with neither remedy. \
         \"Never seen\" and \"never handled\" count committed events missing from what the \
         reader returned once the writers had stopped and the reader had caught up with the head. \
         Other work: the CPU the machine spent beyond the harness, its sessions and the daemon \
         (other users of the machine, and the server's background processes), in cores.\n\n{table}",
        dur = secs(duration),
        runs = if rounds == 1 {
            "one run".to_string()
        } else {
            format!("{rounds} runs")
        },
    ));
    Ok(())
}

async fn measure(schema: &Store, w: &Workload, duration: Duration) -> Result<Outcome> {
    let healing = w.lock == AppendLock::None;
    let daemon = if healing {
        Some(start_healer(&schema.schema, &[])?)
    } else {
        None
    };
    let (write_stop, read_stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let naive = tokio::spawn(naive_reader(schema.schema.clone(), read_stop.clone()));
    let eventuous = healing.then(|| {
        tokio::spawn(eventuous_reader(
            schema.schema.clone(),
            read_stop.clone(),
            Duration::from_secs(20),
        ))
    });
    let watch = CpuWatch::start(daemon.iter().map(|d| d.pid()).collect()).await?;
    let writers = tokio::spawn({
        let (name, stop, w) = (schema.schema.clone(), write_stop.clone(), w.clone());
        async move { write(&name, &w, stop).await }
    });
    tokio::time::sleep(duration).await;
    write_stop.store(true, Ordering::Relaxed);
    let written = writers.await??;
    let cpu = watch.finish().await?;
    // Only now: every append has ended, so the readers' last reads see all.
    read_stop.store(true, Ordering::Relaxed);
    let seen = naive.await??;
    let followed = match eventuous {
        Some(t) => Some(t.await??),
        None => None,
    };
    let events = event_positions(schema).await?;
    let missing = |got: &HashSet<i64>| events.iter().filter(|p| !got.contains(p)).count();
    let naive_lost = missing(&seen);
    let eventuous = followed.map(|f| (missing(&f.handled), f));
    let tombstones = tombstone_count(schema).await?;
    if let Some(d) = daemon {
        d.terminate();
    }
    Ok(Outcome {
        written,
        naive_lost,
        eventuous,
        events: events.len(),
        tombstones,
        cpu,
    })
}
