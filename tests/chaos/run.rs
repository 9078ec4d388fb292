//! The chaos run itself, whatever the engine and however many stores: the
//! chaos loop, the end, the verdict on every claim of issue 5, and the
//! figures. A single-store run ([`run`]) is one [`Tested`] store whose
//! healers take flags; the fleet run (`fleet.rs`) drives several through the
//! same parts: [`Tested`] (a store's writers and subscriber), [`Healers`]
//! (the processes, killed and restarted), [`drive`] (the loop and the end,
//! with an [`Extra`] for what a run adds) and [`judge`] (one store's verdict
//! and figures).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::*;

pub const WRITERS: usize = 8;
pub const HEALERS: usize = 3;

pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

pub fn secs(us: i64) -> f64 {
    us as f64 / 1e6
}

/// `CHAOS_SECONDS` (default 20, at least 5) and `CHAOS_SEED` (random).
pub fn seconds_and_seed() -> (u64, u64) {
    (
        env_u64("CHAOS_SECONDS").unwrap_or(20).max(5),
        env_u64("CHAOS_SEED").unwrap_or_else(rand::random),
    )
}

/// A healer slot's flags and environment.
pub type Spec = (Vec<String>, Vec<(String, String)>);

/// The slot of the healer that logged most recently that it leads, if any.
fn current_leader(instances: &[Instance], slots: &[Option<usize>]) -> Option<usize> {
    slots
        .iter()
        .enumerate()
        .find_map(|(slot, i)| instances[(*i)?].says_it_leads().then_some(slot))
}

/// One store under test: its backend, writers and subscriber.
pub struct Tested<B: Backend> {
    pub backend: Arc<B>,
    /// Its name in a fleet daemon's logs (the `store` span); `None` when the
    /// healers heal only this store, so all their lines are its.
    pub store: Option<String>,
    journal: Arc<Journal>,
    stop_writers: CancellationToken,
    writers: Vec<JoinHandle<()>>,
    sub_log: Arc<Mutex<SubscriberLog>>,
    stop_subscriber: CancellationToken,
    sub: Option<JoinHandle<()>>,
}

impl<B: Backend> Tested<B> {
    /// Starts `writers` writers (their random choices from `seed`) and the
    /// subscriber.
    pub fn start(backend: Arc<B>, store: Option<String>, writers: usize, seed: u64) -> Self {
        let journal = Arc::new(Journal::default());
        let stop_writers = CancellationToken::new();
        let writers = (0..writers)
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
        let sub = Some(tokio::spawn(subscriber(
            backend.clone(),
            sub_log.clone(),
            stop_subscriber.clone(),
        )));
        Tested {
            backend,
            store,
            journal,
            stop_writers,
            writers,
            sub_log,
            stop_subscriber,
            sub,
        }
    }

    /// Stops the writers (a slow append finishes first).
    async fn stop_writers(&mut self) {
        self.stop_writers.cancel();
        for w in self.writers.drain(..) {
            tokio::time::timeout(Duration::from_secs(30), w)
                .await
                .expect("writers stop within 30 s")
                .expect("a writer panicked");
        }
    }

    /// Whether every position up to the head is filled and the subscriber
    /// has passed the head; and the head.
    async fn caught_up(&self) -> (bool, i64) {
        let (count, max) = self.backend.count_and_head().await;
        (
            count == max - B::FIRST + 1 && self.sub_log.lock().unwrap().next > max,
            max,
        )
    }

    async fn stop_subscriber(&mut self) {
        self.stop_subscriber.cancel();
        if let Some(sub) = self.sub.take() {
            sub.await.expect("the subscriber panicked");
        }
    }
}

/// The healer processes, one per slot, killed and restarted.
pub struct Healers {
    pub instances: Vec<Instance>,
    /// The instance running in each slot, if any.
    pub slots: Vec<Option<usize>>,
    down_until: Vec<Option<Instant>>,
    pub failures: Vec<String>,
    pub kills: usize,
    spec: Box<dyn Fn(usize) -> Spec + Send + Sync>,
}

impl Healers {
    /// Starts a healer in every slot, each with `spec(slot)`.
    pub fn start(spec: Box<dyn Fn(usize) -> Spec + Send + Sync>) -> Healers {
        let mut h = Healers {
            instances: Vec::new(),
            slots: vec![None; HEALERS],
            down_until: vec![None; HEALERS],
            failures: Vec::new(),
            kills: 0,
            spec,
        };
        for slot in 0..HEALERS {
            h.start_slot(slot);
        }
        h
    }

    fn start_slot(&mut self, slot: usize) {
        let number = self.instances.len();
        self.instances
            .push(Instance::start(slot, number, &(self.spec)(slot)));
        self.slots[slot] = Some(number);
        self.down_until[slot] = None;
    }

    /// The instances running now.
    pub fn running(&mut self) -> impl Iterator<Item = &mut Instance> {
        let live: HashSet<usize> = self.slots.iter().flatten().copied().collect();
        self.instances
            .iter_mut()
            .enumerate()
            .filter(move |(i, _)| live.contains(i))
            .map(|(_, inst)| inst)
    }

    /// Notices processes that exited on their own (a failure) and restarts
    /// them.
    fn reap(&mut self) {
        for slot in 0..HEALERS {
            if let Some(i) = self.slots[slot] {
                if self.instances[i].reap() {
                    self.failures.push(format!(
                        "healer run {i} (slot {slot}) exited on its own with {:?}; its log ends:\n{}",
                        self.instances[i].exit,
                        self.instances[i].log().iter().rev().take(20).rev().cloned().collect::<Vec<_>>().join("\n")
                    ));
                    self.slots[slot] = None;
                    self.down_until[slot] = Some(Instant::now());
                }
            }
        }
    }

    /// SIGKILLs one healer, the leader half of the time; it comes back
    /// 0.2-2 s later.
    fn kill_one(&mut self, rng: &mut StdRng, now: Instant) {
        let alive: Vec<usize> = (0..HEALERS).filter(|s| self.slots[*s].is_some()).collect();
        let victim = match current_leader(&self.instances, &self.slots) {
            Some(leader) if rng.random_bool(0.5) => Some(leader),
            _ if !alive.is_empty() => Some(alive[rng.random_range(0..alive.len())]),
            _ => None,
        };
        if let Some(slot) = victim {
            let i = self.slots[slot].take().unwrap();
            self.instances[i].kill9();
            self.kills += 1;
            self.down_until[slot] = Some(now + Duration::from_millis(rng.random_range(200..2_000)));
        }
    }

    /// Restarts the healers whose time down is over.
    fn restart_due(&mut self) {
        for slot in 0..HEALERS {
            if self.slots[slot].is_none()
                && self.down_until[slot].is_some_and(|t| Instant::now() >= t)
            {
                self.start_slot(slot);
            }
        }
    }

    /// Every slot runs a healer again.
    fn fill_slots(&mut self) {
        for slot in 0..HEALERS {
            if self.slots[slot].is_none() {
                self.start_slot(slot);
            }
        }
    }

    /// SIGTERM to every running healer: each must exit 0.
    fn stop(&mut self) {
        for i in self.slots.iter().flatten().copied() {
            if self.instances[i].reap() {
                self.failures.push(format!(
                    "healer run {i} exited on its own with {:?}",
                    self.instances[i].exit
                ));
            } else {
                self.instances[i].terminate();
                if self.instances[i].exit.and_then(|s| s.code()) != Some(0) {
                    self.failures.push(format!(
                        "healer run {i} did not exit 0 on SIGTERM: {:?}",
                        self.instances[i].exit
                    ));
                }
            }
        }
    }

    /// Every run's log, for a failed run's post-mortem (CI can keep the
    /// directory `target/tmp/chaos-<name>`).
    pub fn save_logs(&self, name: &str) -> std::path::PathBuf {
        let logs = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("chaos-{}", name.replace(' ', "-")));
        std::fs::create_dir_all(&logs).unwrap();
        for inst in &self.instances {
            std::fs::write(
                logs.join(format!("run-{}.log", inst.number)),
                inst.log().join("\n"),
            )
            .unwrap();
        }
        logs
    }
}

/// What a run adds to the chaos loop (the fleet's broken store and
/// watermark samples); `()` adds nothing.
pub trait Extra {
    /// Called every 100 ms of the loop, `at` after it started.
    fn tick(&mut self, at: Duration, healers: &mut Healers) -> impl Future<Output = ()>;
    /// At the end: whether what it waits for has happened too.
    fn settled(&mut self) -> impl Future<Output = bool>;
}

impl Extra for () {
    async fn tick(&mut self, _: Duration, _: &mut Healers) {}
    async fn settled(&mut self) -> bool {
        true
    }
}

/// The loop and the end as they happened.
pub struct Driven {
    pub seconds: u64,
    pub seed: u64,
    pub t0_us: i64,
    /// When the server was restarted (s into the run), how long until it
    /// answered, and what was restarted.
    pub restart: Option<(f64, Duration, String)>,
    pub wrote_for: Duration,
    pub settle_took: Duration,
    /// Each store's head at the end.
    pub heads: Vec<i64>,
}

/// A server restart under way: how long until it answered, and what was restarted.
type Restarting<'a> = Pin<Box<dyn Future<Output = (Duration, String)> + Send + 'a>>;

/// The chaos: for `seconds`, kill healers at random (the leader half of the
/// time) and restart them after a while, restart the server once (through
/// `server`) at 45 %, and `extra`'s events. Then the end: the writers stop,
/// every slot runs a healer again, the healers fill what is left (90 s at
/// most; a store not healed by then is a failure in `healers.failures`),
/// every healer gets SIGTERM and the subscribers stop.
pub async fn drive<B: Backend, E: Extra>(
    server: &B,
    stores: &mut [Tested<B>],
    healers: &mut Healers,
    extra: &mut E,
    seconds: u64,
    seed: u64,
) -> Driven {
    let engine = B::NAME;
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let t0_us = now_us();
    let deadline = started + Duration::from_secs(seconds);
    let restart_at = started + Duration::from_secs(seconds).mul_f64(0.45);
    let mut restart: Option<(f64, Duration, String)> = None;
    // The restart runs beside the loop, not in it: the kills go on while the
    // server is down (a slow restart, 63 s once on a loaded machine, must not
    // stop the leadership churn the run is judged on).
    let mut restarting: Option<(f64, Restarting<'_>)> = None;
    let mut next_kill = started + Duration::from_millis(rng.random_range(server.kill_every()));

    while Instant::now() < deadline {
        let tick = tokio::time::sleep(Duration::from_millis(100));
        tokio::pin!(tick);
        match restarting.as_mut() {
            Some((at, going)) => tokio::select! {
                (took, what) = going => {
                    println!(
                        "chaos: {engine} answers again at {:.3} s, after {took:?} ({what})",
                        secs(now_us() - t0_us)
                    );
                    restart = Some((*at, took, what));
                    restarting = None;
                    (&mut tick).await;
                }
                () = &mut tick => {}
            },
            None => tick.await,
        }
        healers.reap();
        let now = Instant::now();
        if restart.is_none() && restarting.is_none() && now >= restart_at {
            let at = secs(now_us() - t0_us);
            println!("chaos: restarting {engine} at {at:.3} s");
            restarting = Some((at, Box::pin(server.restart())));
        }
        if now >= next_kill {
            healers.kill_one(&mut rng, now);
            next_kill = now + Duration::from_millis(rng.random_range(server.kill_every()));
        }
        healers.restart_due();
        extra.tick(started.elapsed(), healers).await;
    }

    if let Some((at, going)) = restarting.take() {
        println!("chaos: the writing time is over; waiting for {engine} to answer again");
        let (took, what) = going.await;
        println!(
            "chaos: {engine} answers again at {:.3} s, after {took:?} ({what})",
            secs(now_us() - t0_us)
        );
        restart = Some((at, took, what));
    }
    for t in stores.iter_mut() {
        t.stop_writers().await;
    }
    let wrote_for = started.elapsed();
    healers.fill_slots();
    let settle = Instant::now();
    let mut heads = vec![0; stores.len()];
    let mut done = vec![false; stores.len()];
    let mut extra_done = false;
    while settle.elapsed() < Duration::from_secs(90) {
        for (i, t) in stores.iter().enumerate() {
            if !done[i] {
                (done[i], heads[i]) = t.caught_up().await;
            }
        }
        extra_done = extra_done || extra.settled().await;
        if extra_done && done.iter().all(|d| *d) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let settle_took = settle.elapsed();
    for (i, t) in stores.iter().enumerate() {
        if !done[i] {
            let of = t
                .store
                .as_ref()
                .map_or(String::new(), |s| format!(" of store {s}"));
            healers.failures.push(format!(
                "after the writers stopped, the holes{of} were not all filled (or the subscriber did not reach the head {}) within 90 s",
                heads[i]
            ));
        }
    }
    healers.stop();
    for t in stores.iter_mut() {
        t.stop_subscriber().await;
    }
    Driven {
        seconds,
        seed,
        t0_us,
        restart,
        wrote_for,
        settle_took,
        heads,
    }
}

/// One store's verdict and figures.
pub struct Judged {
    pub failures: Vec<String>,
    pub figures: String,
    pub events: usize,
    pub tombstones: usize,
    pub became: usize,
    pub longest_stall: (Duration, i64),
    /// ERROR lines forgiven (logged by a store while it was broken on purpose).
    pub forgiven: usize,
}

/// The verdict on every claim of issue 5 for one store, from the database,
/// its writers' journal, its subscriber's log and the healers' logs (only
/// its lines, in a fleet); with the figures. An ERROR line the store logged
/// within `forgive` (µs since the epoch: while it was broken on purpose) is
/// counted, not a failure.
pub async fn judge<B: Backend>(
    t: Tested<B>,
    healers: &Healers,
    driven: &Driven,
    head: i64,
    forgive: Option<(i64, i64)>,
) -> Judged {
    let engine = B::NAME;
    let first = B::FIRST;
    let backend = &t.backend;
    let journal = &t.journal;
    let instances = &healers.instances;
    let t0_us = driven.t0_us;
    let kills = healers.kills;
    let (seconds, seed) = (driven.seconds, driven.seed);
    let mut failures: Vec<String> = Vec::new();
    let mut forgiven = 0usize;
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
    let sub_log = Arc::try_unwrap(t.sub_log)
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
    let facts: Vec<LogFacts> = instances
        .iter()
        .map(|i| i.facts(t.store.as_deref()))
        .collect();
    let writes = |f: &&FillAttempt| matches!(f.outcome.as_str(), "filled" | "committed" | "held");
    let mut overlaps = 0;
    let mut shared = 0;
    let mut fenced_in_shared = 0;
    for (i, f) in facts.iter().enumerate() {
        if f.panicked {
            failures.push(format!("healer run {i} panicked"));
        }
        for e in &f.errors {
            let at = serde_json::from_str::<serde_json::Value>(e)
                .ok()
                .and_then(|v| v["timestamp"].as_str().and_then(parse_timestamp));
            match (forgive, at) {
                (Some((from, to)), Some(at)) if from <= at && at <= to => forgiven += 1,
                _ => failures.push(format!("healer run {i} logged an error: {e}")),
            }
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
    fig!(
        "appends acknowledged   {} ({} events); rolled back after insert {}; slow appends committed {} / rolled back {}",
        g(&st.appends), acked.len(), g(&st.rolled_back), g(&st.slow_committed), g(&st.slow_rolled_back)
    );
    fig!(
        "duplicate message ids  {} ignored (position burnt), {} failed the append; multi-stream appends {} committed, {} failed part way; deadlocks {}; stream-position races lost {}",
        g(&st.duplicates_ignored), g(&st.duplicates_failed), g(&st.multi_committed), g(&st.multi_failed), g(&st.deadlocks), g(&st.lost_races)
    );
    if B::EVENTUOUS_FUNCTION {
        fig!(
            "append_events calls    {} stored, {} idempotent retries, {} dropped by its ON CONFLICT after a lost race (PostgreSQL), {} not committed (rolled back, wrong expected version); 0 reported success without their rows and their stream position free (checked by each writer)",
            g(&st.function_stored), g(&st.function_retries), g(&st.function_races_dropped), g(&st.function_not_committed)
        );
    }
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
    fig!(
        "waits for open txns    {} fill cycles left due holes waiting for a transaction that may have drawn them",
        facts.iter().map(|f| f.waited).sum::<usize>()
    );
    fig!("fills per healer run   {fillers:?}");
    fig!(
        "healer processes       {} runs, {kills} killed with SIGKILL, {became} times became the leader (leader changes), {stepped} step-downs",
        instances.len()
    );
    if let Some((at, took, what)) = &driven.restart {
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
    if std::env::var("CHAOS_VERBOSE").is_ok() {
        for inst in instances {
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
    if kills == 0 || became < 2 {
        failures.push(format!(
            "too little leadership churn: {kills} kills, {became} leaders"
        ));
    }
    if tombstones.is_empty() || acked.is_empty() {
        failures.push("no tombstones or no events: nothing was tested".into());
    }
    let _ = (seconds, seed);
    Judged {
        failures,
        figures,
        events: events.len(),
        tombstones: tombstones.len(),
        became,
        longest_stall: sub_log.longest_stall,
        forgiven,
    }
}

/// What a single-store run adds to [`run`]: its events during the loop
/// ([`Extra`]), and its own verdict once the run has ended at `head`:
/// failures and figure lines. `()` adds nothing.
pub trait Verdict: Extra {
    fn verdict(self, head: i64) -> impl Future<Output = (Vec<String>, String)>;
}

impl Verdict for () {
    async fn verdict(self, _: i64) -> (Vec<String>, String) {
        (vec![], String::new())
    }
}

/// One chaos run against `backend`'s store: its writers and subscriber,
/// [`HEALERS`] healers on its flags (each its own leader key under
/// CHAOS_SPLIT_LEADERS), the loop with `extra`, the verdict and `extra`'s,
/// the figures; panics with every failure found. `kind` names a variant in
/// its lines, figures file and log directory ("ledger-core"); `None`: the
/// plain run.
pub async fn run<B: Backend, E: Verdict>(backend: Arc<B>, kind: Option<&str>, mut extra: E) {
    let engine = B::NAME;
    let (seconds, seed) = seconds_and_seed();
    let title = kind.map_or_else(|| engine.to_string(), |k| format!("{k} on {engine}"));
    println!(
        "chaos {} ({}): {seconds} s, seed {seed} (CHAOS_SEED={seed} replays the random choices)",
        kind.map_or_else(|| format!("on {engine}"), |_| title.clone()),
        backend.describe()
    );
    let mut stores = vec![Tested::start(backend.clone(), None, WRITERS, seed)];
    let b = backend.clone();
    let mut healers = Healers::start(Box::new(move |slot| {
        let mut spec = b.healer_store(slot);
        if split_leaders() {
            spec.0
                .extend(["--leader-key".into(), format!("chaos-split-{slot}")]);
        }
        spec
    }));
    let driven = drive(
        &*backend,
        &mut stores,
        &mut healers,
        &mut extra,
        seconds,
        seed,
    )
    .await;
    let head = driven.heads[0];
    let tested = stores.pop().expect("one store");
    let judged = judge(tested, &healers, &driven, head, None).await;

    let mut failures = std::mem::take(&mut healers.failures);
    failures.extend(judged.failures);
    if driven.restart.is_none() {
        failures.push(format!("{engine} was not restarted"));
    }
    let (extra_failures, extra_figures) = extra.verdict(head).await;
    failures.extend(extra_failures);
    let mut figures =
        format!("\n=== chaos figures, {title} ({seconds} s of writes, seed {seed}) ===\n");
    figures.push_str(&judged.figures);
    figures.push_str(&extra_figures);
    figures.push_str(&format!(
        "wrote for {:.1?}; healed the rest and caught up in {:.1?} after the writers stopped\n",
        driven.wrote_for, driven.settle_took
    ));
    let logs = healers.save_logs(&kind.map_or_else(
        || backend.describe(),
        |k| format!("{k}-{}", backend.describe()),
    ));
    figures.push_str(&format!("healer logs            {}\n", logs.display()));
    let name = kind.map_or_else(|| engine.to_string(), |k| format!("{k}-{engine}"));
    finish(&name, &figures, failures, &[backend]).await;
}

/// Prints the figures (and writes them to
/// `target/tmp/chaos-figures-<name>.txt`, which `.ci/run` prints: cargo test
/// shows a passing test's stdout only with --nocapture); removes the store
/// after a run that passed, else panics with every failure.
pub async fn finish<B: Backend>(
    name: &str,
    figures: &str,
    failures: Vec<String>,
    backends: &[Arc<B>],
) {
    let mut figures = figures.to_string();
    if failures.is_empty() {
        figures.push_str("all invariants held\n");
    } else {
        figures.push_str(&format!(
            "{} failure(s): see the test's output\n",
            failures.len()
        ));
    }
    print!("{figures}");
    let slug: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect::<String>()
        .to_ascii_lowercase();
    std::fs::write(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-figures-{slug}.txt")),
        &figures,
    )
    .unwrap();
    if failures.is_empty() {
        for backend in backends {
            backend.remove().await;
        }
    } else {
        panic!(
            "{} failure(s) ({} kept for inspection):\n{}",
            failures.len(),
            backends
                .iter()
                .map(|b| b.describe())
                .collect::<Vec<_>>()
                .join(", "),
            failures.join("\n")
        );
    }
}
