//! The chaos run itself, whatever the engine: the chaos loop, the end, the
//! verdict on every claim of issue 5, and the figures.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::*;

const WRITERS: usize = 8;
const HEALERS: usize = 3;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn secs(us: i64) -> f64 {
    us as f64 / 1e6
}

/// The slot of the healer that logged most recently that it leads, if any.
fn current_leader(instances: &[Instance], slots: &[Option<usize>]) -> Option<usize> {
    slots
        .iter()
        .enumerate()
        .find_map(|(slot, i)| instances[(*i)?].says_it_leads().then_some(slot))
}

/// One chaos run against `backend`'s store; panics with every failure found.
pub async fn run<B: Backend>(backend: B) {
    let backend = Arc::new(backend);
    let engine = B::NAME;
    let first = B::FIRST;
    let seconds = env_u64("CHAOS_SECONDS").unwrap_or(20).max(5);
    let seed = env_u64("CHAOS_SEED").unwrap_or_else(rand::random);
    println!(
        "chaos on {engine} ({}): {seconds} s, seed {seed} (CHAOS_SEED={seed} replays the random choices)",
        backend.describe()
    );
    let mut rng = StdRng::seed_from_u64(seed);

    let journal = Arc::new(Journal::default());
    let stop_writers = CancellationToken::new();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            tokio::spawn(writer(
                backend.clone(),
                w,
                seed,
                journal.clone(),
                stop_writers.clone(),
            ))
        })
        .collect();
    let sub_log = Arc::new(Mutex::new(SubscriberLog::default()));
    let stop_subscriber = CancellationToken::new();
    let sub = tokio::spawn(subscriber(
        backend.clone(),
        sub_log.clone(),
        stop_subscriber.clone(),
    ));

    let mut instances: Vec<Instance> = Vec::new();
    let mut slots: Vec<Option<usize>> = vec![None; HEALERS];
    let mut down_until: Vec<Option<Instant>> = vec![None; HEALERS];
    for (slot, s) in slots.iter_mut().enumerate() {
        instances.push(Instance::start(
            slot,
            instances.len(),
            &backend.healer_store(slot),
        ));
        *s = Some(instances.len() - 1);
    }
    let mut failures: Vec<String> = Vec::new();
    let started = Instant::now();
    let t0_us = now_us();
    let deadline = started + Duration::from_secs(seconds);
    let restart_at = started + Duration::from_secs(seconds).mul_f64(0.45);
    let mut restart: Option<(f64, Duration, String)> = None;
    let mut kills = 0usize;
    let mut next_kill = started + Duration::from_millis(rng.random_range(1_500..4_000));

    // The chaos: kill healers at random (the leader half of the time),
    // restart them after a while, restart PostgreSQL once.
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        for slot in 0..HEALERS {
            if let Some(i) = slots[slot] {
                if instances[i].reap() {
                    failures.push(format!(
                        "healer run {i} (slot {slot}) exited on its own with {:?}; its log ends:\n{}",
                        instances[i].exit,
                        instances[i].log().iter().rev().take(20).rev().cloned().collect::<Vec<_>>().join("\n")
                    ));
                    slots[slot] = None;
                    down_until[slot] = Some(Instant::now());
                }
            }
        }
        let now = Instant::now();
        if restart.is_none() && now >= restart_at {
            let at = secs(now_us() - t0_us);
            println!("chaos: restarting {engine} at {at:.3} s");
            let (took, what) = backend.restart().await;
            println!(
                "chaos: {engine} answers again at {:.3} s, after {took:?} ({what})",
                secs(now_us() - t0_us)
            );
            restart = Some((at, took, what));
        }
        if now >= next_kill {
            let alive: Vec<usize> = (0..HEALERS).filter(|s| slots[*s].is_some()).collect();
            let victim = match current_leader(&instances, &slots) {
                Some(leader) if rng.random_bool(0.5) => Some(leader),
                _ if !alive.is_empty() => Some(alive[rng.random_range(0..alive.len())]),
                _ => None,
            };
            if let Some(slot) = victim {
                let i = slots[slot].take().unwrap();
                instances[i].kill9();
                kills += 1;
                down_until[slot] = Some(now + Duration::from_millis(rng.random_range(200..2_000)));
            }
            next_kill = now + Duration::from_millis(rng.random_range(1_500..4_000));
        }
        for slot in 0..HEALERS {
            if slots[slot].is_none() && down_until[slot].is_some_and(|t| Instant::now() >= t) {
                instances.push(Instance::start(
                    slot,
                    instances.len(),
                    &backend.healer_store(slot),
                ));
                slots[slot] = Some(instances.len() - 1);
                down_until[slot] = None;
            }
        }
    }

    // The end: writers stop (a slow append finishes first), every slot runs a
    // healer again, and the healers get to fill what is left.
    stop_writers.cancel();
    for w in writers {
        tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("writers stop within 30 s")
            .expect("a writer panicked");
    }
    let wrote_for = started.elapsed();
    for (slot, s) in slots.iter_mut().enumerate() {
        if s.is_none() {
            instances.push(Instance::start(
                slot,
                instances.len(),
                &backend.healer_store(slot),
            ));
            *s = Some(instances.len() - 1);
        }
    }
    let settle = Instant::now();
    let mut settled = false;
    let mut head = 0i64;
    while settle.elapsed() < Duration::from_secs(90) {
        let (count, max) = backend.count_and_head().await;
        head = max;
        if count == max - first + 1 && sub_log.lock().unwrap().next > max {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let settle_took = settle.elapsed();
    if !settled {
        failures.push(format!(
            "after the writers stopped, the holes were not all filled (or the subscriber did not reach the head {head}) within 90 s"
        ));
    }
    for i in slots.iter().flatten().copied() {
        if instances[i].reap() {
            failures.push(format!(
                "healer run {i} exited on its own with {:?}",
                instances[i].exit
            ));
        } else {
            instances[i].terminate();
            if instances[i].exit.and_then(|s| s.code()) != Some(0) {
                failures.push(format!(
                    "healer run {i} did not exit 0 on SIGTERM: {:?}",
                    instances[i].exit
                ));
            }
        }
    }
    stop_subscriber.cancel();
    sub.await.expect("the subscriber panicked");

    // ---- The verdict. ----
    failures.extend(journal.violations.lock().unwrap().iter().cloned());
    let acked = journal.acked.lock().unwrap().clone();
    let rows: Vec<StoredRow> = backend.rows().await;
    let by_pos: HashMap<i64, usize> = rows.iter().enumerate().map(|(i, r)| (r.0, i)).collect();

    // 1. Every acknowledged append's events are present and unchanged.
    let mut lost = 0;
    for e in &acked {
        match by_pos.get(&e.global).map(|i| &rows[*i]) {
            Some((_, id, stream, sp, kind, data))
                if *id == e.id
                    && *stream == e.stream
                    && *sp == e.stream_pos
                    && kind == EVENT_TYPE
                    && *data == e.data => {}
            found => {
                lost += 1;
                if lost <= 10 {
                    failures.push(format!(
                        "acknowledged event {e:?} is not intact; at its position: {found:?}"
                    ));
                }
            }
        }
    }
    if lost > 10 {
        failures.push(format!(
            "... {lost} acknowledged events lost or changed in all"
        ));
    }

    // 2. Every position from the first to the head is an event or a tombstone.
    let missing: Vec<i64> = {
        let present: HashSet<i64> = rows.iter().map(|r| r.0).collect();
        (first..=head).filter(|p| !present.contains(p)).collect()
    };
    if !missing.is_empty() {
        failures.push(format!(
            "{} positions below the head {head} are neither an event nor a tombstone: {:?}",
            missing.len(),
            &missing[..missing.len().min(20)]
        ));
    }

    // 3. No committed event the writers did not acknowledge (an append whose
    //    outcome was unknown was resolved by reading back its message ids).
    let acked_ids: HashSet<(i64, Uuid)> = acked.iter().map(|e| (e.global, e.id)).collect();
    let events: Vec<&StoredRow> = rows.iter().filter(|r| r.4 != TOMBSTONE_TYPE).collect();
    let unacked: Vec<_> = events
        .iter()
        .filter(|r| !acked_ids.contains(&(r.0, r.1)))
        .collect();
    if !unacked.is_empty() {
        failures.push(format!(
            "{} committed events no writer acknowledged (or a non-event row), e.g. {:?}",
            unacked.len(),
            &unacked[..unacked.len().min(5)]
        ));
    }

    // 4. The tombstone stream: only tombstones, positions 0..n-1, version n-1;
    //    every other stream's positions contiguous too (the healer never
    //    touched them).
    let tombstones: Vec<i64> = rows
        .iter()
        .filter(|r| r.4 == TOMBSTONE_TYPE)
        .map(|r| r.0)
        .collect();
    let streams: Vec<StoredStream> = backend.streams().await;
    for (name, version, count, min, max) in &streams {
        if !(i64::from(*version) == count - 1
            && i64::from(*max) == count - 1
            && (*min == 0 || *count == 0))
        {
            failures.push(format!(
                "stream {name} inconsistent: {count} rows at positions {min}..{max}, version {version}"
            ));
        }
    }
    let in_tomb_stream = rows.iter().filter(|r| r.2 == TOMBSTONE_STREAM).count();
    if in_tomb_stream != tombstones.len()
        || rows
            .iter()
            .any(|r| (r.2 == TOMBSTONE_STREAM) != (r.4 == TOMBSTONE_TYPE))
    {
        failures.push(format!(
            "the tombstone stream holds {in_tomb_stream} rows but there are {} tombstones, or one is misplaced",
            tombstones.len()
        ));
    }

    // 5. The subscriber handled every committed event exactly once, in
    //    position order, and nothing else.
    let sub_log = Arc::try_unwrap(sub_log)
        .ok()
        .expect("subscriber done")
        .into_inner()
        .unwrap();
    let handled = &sub_log.handled;
    if let Some(w) = handled.windows(2).find(|w| w[0].0 >= w[1].0) {
        failures.push(format!(
            "the subscriber handled out of order or twice: {w:?}"
        ));
    }
    let handled_set: HashSet<(i64, Uuid)> = handled.iter().copied().collect();
    let event_set: HashSet<(i64, Uuid)> = events.iter().map(|r| (r.0, r.1)).collect();
    if handled.len() != handled_set.len() || handled_set != event_set {
        let not_handled: Vec<_> = event_set.difference(&handled_set).take(5).collect();
        let extra: Vec<_> = handled_set.difference(&event_set).take(5).collect();
        failures.push(format!(
            "the subscriber handled {} events ({} distinct) but {} are committed; not handled e.g. {not_handled:?}; handled but not committed e.g. {extra:?}",
            handled.len(),
            handled_set.len(),
            event_set.len()
        ));
    }
    if sub_log.tombstones != tombstones.len() as u64 {
        failures.push(format!(
            "the subscriber skipped {} tombstones but there are {}",
            sub_log.tombstones,
            tombstones.len()
        ));
    }

    // 6. Never more than one process filling at a time, from the healers' own
    //    logs. A fill statement that filled, or found a position committed or
    //    held, passed the leader fence inside its transaction: it wrote, or
    //    would have. "busy" wrote nothing (fenced, or the tombstone stream's
    //    row was taken) and "error" rolled back. A leadership interval is the
    //    process's own view: when the server ends the lock session (a
    //    restart), the process learns it at its next check, up to two seconds
    //    later, and another may lead meanwhile. So: two fillers at once means
    //    two processes both ran writing fill statements during a time both
    //    believed they led; and every writing statement of a process starts
    //    inside its own leadership.
    let facts: Vec<LogFacts> = instances.iter().map(Instance::facts).collect();
    let writes = |f: &&FillAttempt| matches!(f.outcome.as_str(), "filled" | "committed" | "held");
    let mut overlaps = 0;
    let mut shared = 0;
    let mut fenced_in_shared = 0;
    for (i, f) in facts.iter().enumerate() {
        if f.panicked {
            failures.push(format!("healer run {i} panicked"));
        }
        for e in &f.errors {
            failures.push(format!("healer run {i} logged an error: {e}"));
        }
        for fill in f.fills.iter().filter(writes) {
            let own = f
                .leading
                .iter()
                .any(|(s, e)| *s - 5_000 <= fill.start_us && fill.start_us <= *e);
            if !own {
                failures.push(format!(
                    "healer run {i} ran a fill statement outside its own leadership {:?}: {}",
                    f.leading, fill.line
                ));
            }
        }
        for (j, g) in facts.iter().enumerate().skip(i + 1) {
            for (si, ei) in &f.leading {
                for (sj, ej) in &g.leading {
                    let (from, to) = ((*si).max(*sj), (*ei).min(*ej));
                    if from >= to {
                        continue;
                    }
                    shared += 1;
                    let inside = |x: &&FillAttempt| x.start_us < to && from < x.end_us;
                    let (wi, wj): (Vec<&FillAttempt>, Vec<&FillAttempt>) = (
                        f.fills.iter().filter(writes).filter(inside).collect(),
                        g.fills.iter().filter(writes).filter(inside).collect(),
                    );
                    fenced_in_shared += f
                        .fills
                        .iter()
                        .chain(&g.fills)
                        .filter(inside)
                        .filter(|x| x.outcome == "busy")
                        .count();
                    if let (Some(a), Some(b)) = (wi.first(), wj.first()) {
                        overlaps += 1;
                        failures.push(format!(
                            "two fillers at once: runs {i} and {j} both led during [{:.3}, {:.3}] s and both ran fill statements that passed the fence ({} and {}), e.g.\n  {}\n  {}",
                            secs(from - t0_us), secs(to - t0_us), wi.len(), wj.len(), a.line, b.line
                        ));
                        continue;
                    }
                    // The newer leader took the lock when it says it became
                    // the leader; from then on the older one holds nothing,
                    // and a write of its that starts later got past the fence.
                    let (older, o, newer_since) =
                        if si <= sj { (f, i, from) } else { (g, j, from) };
                    if let Some(late) = older
                        .fills
                        .iter()
                        .filter(writes)
                        .find(|x| x.start_us > newer_since && x.start_us < to)
                    {
                        overlaps += 1;
                        failures.push(format!(
                            "two fillers at once: run {o} wrote at {:.3} s, after another run took the lock at {:.3} s: {}",
                            secs(late.start_us - t0_us), secs(newer_since - t0_us), late.line
                        ));
                    }
                }
            }
        }
    }
    let mut leading: Vec<(i64, i64, usize)> = facts
        .iter()
        .enumerate()
        .flat_map(|(i, f)| f.leading.iter().map(move |(s, e)| (*s, *e, i)))
        .collect();
    leading.sort();

    // ---- The figures. ----
    let st = &journal.stats;
    let g = WriterStats::get;
    let mut holes = 0usize;
    let mut widest = 0usize;
    let mut run = 0usize;
    let tomb_set: HashSet<i64> = tombstones.iter().copied().collect();
    for p in first..=head + 1 {
        if tomb_set.contains(&p) {
            run += 1;
        } else if run > 0 {
            holes += 1;
            widest = widest.max(run);
            run = 0;
        }
    }
    let all_fills: Vec<&FillAttempt> = facts.iter().flat_map(|f| f.fills.iter()).collect();
    let outcomes = tally(
        all_fills
            .iter()
            .filter(|f| !f.line.contains("\"an open append holds this position"))
            .map(|f| f.outcome.as_str()),
    );
    let logged_rows: u64 = all_fills
        .iter()
        .filter(|f| f.outcome == "filled")
        .map(|f| f.rows)
        .sum();
    let fill_txs = backend.fill_transactions().await;
    let fillers: BTreeMap<usize, usize> =
        all_fills
            .iter()
            .filter(|f| f.outcome == "filled")
            .fold(BTreeMap::new(), |mut m, f| {
                *m.entry(f.instance).or_default() += 1;
                m
            });
    let became: usize = facts.iter().map(|f| f.became_leader).sum();
    let stepped: usize = facts.iter().map(|f| f.stepped_down).sum();
    // The figures go to stdout and to a file that `.ci/run` prints (cargo
    // test shows a passing test's stdout only with --nocapture).
    let mut figures = String::new();
    macro_rules! fig {
        ($($arg:tt)*) => {{
            use std::fmt::Write as _;
            writeln!(figures, $($arg)*).unwrap();
        }};
    }
    fig!("\n=== chaos figures, {engine} ({seconds} s of writes, seed {seed}) ===");
    fig!(
        "appends acknowledged   {} ({} events); rolled back after insert {}; slow appends committed {} / rolled back {}",
        g(&st.appends), acked.len(), g(&st.rolled_back), g(&st.slow_committed), g(&st.slow_rolled_back)
    );
    fig!(
        "duplicate message ids  {} ignored (position burnt), {} failed the append; multi-stream appends {} committed, {} failed part way; deadlocks {}; stream-position races lost {}",
        g(&st.duplicates_ignored), g(&st.duplicates_failed), g(&st.multi_committed), g(&st.multi_failed), g(&st.deadlocks), g(&st.lost_races)
    );
    fig!(
        "connection losses      {} (COMMIT outcome unknown, read back: {} committed, {} not)",
        g(&st.lost_connection),
        g(&st.unknown_committed),
        g(&st.unknown_not_committed)
    );
    fig!(
        "positions              {first}..={head}: {} events, {} tombstones in {holes} holes (widest {widest})",
        events.len(), tombstones.len()
    );
    fig!(
        "fill statements        {:?}; {} tombstones logged as filled; {} fill transactions in the database",
        outcomes, logged_rows, fill_txs
    );
    fig!("fills per healer run   {fillers:?}");
    fig!(
        "healer processes       {} runs, {kills} killed with SIGKILL, {became} times became the leader (leader changes), {stepped} step-downs",
        instances.len()
    );
    if let Some((at, took, what)) = &restart {
        fig!(
            "{:<23}at {at:.1} s ({what}); answered again after {took:.1?}",
            format!("{engine} restart")
        );
    }
    fig!(
        "subscriber             handled {} events, skipped {} tombstones, {} connections; longest stall {:.2?} at position {}",
        handled.len(), sub_log.tombstones, sub_log.reconnects, sub_log.longest_stall.0, sub_log.longest_stall.1
    );
    fig!(
        "two fillers at once    {overlaps} ({} leadership intervals; {shared} stretches where two processes both believed they led (an old leader not yet aware its lock session had ended), {fenced_in_shared} fill statements in them refused by the fence or the stream's row lock)",
        leading.len()
    );
    fig!(
        "wrote for {wrote_for:.1?}; healed the rest and caught up in {settle_took:.1?} after the writers stopped"
    );
    // Every run's log, for a failed run's post-mortem (CI can keep the directory).
    let logs = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("chaos-{}", backend.describe().replace(' ', "-")));
    std::fs::create_dir_all(&logs).unwrap();
    for inst in &instances {
        std::fs::write(
            logs.join(format!("run-{}.log", inst.number)),
            inst.log().join("\n"),
        )
        .unwrap();
    }
    fig!("healer logs            {}", logs.display());
    if std::env::var("CHAOS_VERBOSE").is_ok() {
        for inst in &instances {
            println!(
                "  run {} in slot {}: started {:.3} s, ended {:?} s, killed {}",
                inst.number,
                inst.slot,
                secs(inst.started_us - t0_us),
                inst.ended_us.map(|e| secs(e - t0_us)),
                inst.killed
            );
        }
        for (s, e, i) in &leading {
            println!(
                "  run {i} led [{:.3}, {:.3}] s",
                secs(s - t0_us),
                secs(e - t0_us)
            );
        }
    }

    // Minimums that make the run meaningful.
    if restart.is_none() {
        failures.push(format!("{engine} was not restarted"));
    }
    if kills == 0 || became < 2 {
        failures.push(format!(
            "too little leadership churn: {kills} kills, {became} leaders"
        ));
    }
    if tombstones.is_empty() || acked.is_empty() {
        failures.push("no tombstones or no events: nothing was tested".into());
    }

    if failures.is_empty() {
        fig!("all invariants held");
    } else {
        fig!("{} failure(s): see the test's output", failures.len());
    }
    print!("{figures}");
    let slug: String = engine
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    std::fs::write(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-figures-{slug}.txt")),
        &figures,
    )
    .unwrap();

    if failures.is_empty() {
        backend.remove().await;
    } else {
        panic!(
            "{} failure(s) ({} kept for inspection):\n{}",
            failures.len(),
            backend.describe(),
            failures.join("\n")
        );
    }
}
