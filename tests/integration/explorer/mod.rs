//! The interleaving explorer: every order of the steps of two appends that
//! race on one stream, a third append that commits above them, and the
//! healer's own scan and fill, run over real sessions, one statement a step.
//! The schedules and what must hold are the same for every server; a
//! [`World`] is one server's store and sessions: PostgreSQL ([`pg`], always,
//! every schedule) and SQL Server or Babelfish ([`mssql`], where a server is
//! given).
//!
//! The writers do what the ones users run do (tests/fixtures: Eventuous's
//! own append, with no row lock in its version check; a plain INSERT into a
//! table whose unique key on the stream position is inserted before the
//! position's key; Eventuous's append into a table whose CHECK constraint
//! waits on a lock after the position is drawn). The healer is [`Healer::scan_step`] and
//! [`Healer::fill_due`] over the real engine, with `gap_timeout` 0: a
//! schedule stands for the moments a daemon would act, whatever the clock
//! says.
//!
//! A schedule is replayed from a fresh stream. After every step the explorer
//! waits until each unfinished statement is either done or waiting for a
//! lock (pg_locks: Babelfish is PostgreSQL underneath), so the next step
//! always meets the same state: the runs are deterministic. A step is
//! enabled when its actor has no statement waiting; the schedules are every
//! sequence of enabled steps (depth-first, by replay).
//!
//! What must hold at the end of each schedule, after the writers ended and
//! the healer healed what was left:
//! - every writer saw and stored exactly what it sees and stores in the same
//!   schedule without the healer (no append reports success without its
//!   rows, no append fails because a tombstone took its key);
//! - no row committed later at or below a contiguous watermark the healer
//!   had computed;
//! - the tombstone stream's positions are 0..n-1 and its Version n-1;
//! - no hole is left below the head.

mod mssql;
mod pg;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gap_healer::config::StartFrom;
use gap_healer::engine::Engine;
use gap_healer::healer::{Healer, Options};
use gap_healer_testkit::engine as kit;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How the two racing appends write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// Eventuous's own append, each with its own message id.
    Eventuous,
    /// Eventuous's own append, the second an idempotent retry of the first
    /// (the same message id).
    EventuousRetry,
    /// A plain INSERT into a table whose unique index on (stream, stream
    /// position) comes before the primary key in index order.
    PlainUniqueFirst,
    /// Eventuous's own append into a table with a CHECK constraint whose
    /// function takes a lock per stream (a tenant's gate): the second
    /// writer waits there, after its draw, outside any unique check, for as
    /// long as the first one's transaction is open.
    CheckWaits,
}

impl Shape {
    /// Every shape.
    pub const ALL: [Shape; 4] = [
        Shape::Eventuous,
        Shape::EventuousRetry,
        Shape::PlainUniqueFirst,
        Shape::CheckWaits,
    ];
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ending {
    Commit,
    Rollback,
}

/// Every variant of `shapes`: a shape and the two writers' endings.
pub fn variants(shapes: &[Shape]) -> Vec<(Shape, [Ending; 2])> {
    let mut out = Vec::new();
    for &shape in shapes {
        for a in [Ending::Rollback, Ending::Commit] {
            for b in [Ending::Commit, Ending::Rollback] {
                out.push((shape, [a, b]));
            }
        }
    }
    out
}

/// One step. Writers 0 and 1 append to the schedule's stream at expected
/// version 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    /// BEGIN and the append (one statement; it may wait).
    Append(usize),
    /// COMMIT or ROLLBACK, as the schedule's endings say.
    End(usize),
    /// An append to another stream, committed: the head moves above.
    Other,
    /// The healer's scan step.
    Scan,
    /// The healer's fill of whatever is due.
    Fill,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |w: &usize| if *w == 0 { "A" } else { "B" };
        match self {
            Step::Append(w) => write!(f, "{}.append", name(w)),
            Step::End(w) => write!(f, "{}.end", name(w)),
            Step::Other => f.write_str("C.append+commit"),
            Step::Scan => f.write_str("healer.scan"),
            Step::Fill => f.write_str("healer.fill"),
        }
    }
}

/// What a writer saw and left behind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The append's answer: `Ok` or the error code it failed with.
    append: Result<(), String>,
    /// Committed and its COMMIT answered without error.
    committed: bool,
    /// Its message id is in the schedule's stream.
    stored: bool,
}

/// One server's store and sessions for one variant, reused by every
/// schedule: what the explorer asks of it, statement by statement.
pub trait World: Send + Sync + Sized + 'static {
    type Engine: Engine;

    /// The healer's engine over the store.
    fn engine(&self) -> Arc<Self::Engine>;
    /// A fresh stream for the next schedule at Version 0 (one event) and
    /// the stream `other`; the position the healer starts after.
    fn reset(&self) -> impl Future<Output = i64> + Send;
    /// Writer `w`'s BEGIN and append, on its own task: it may wait.
    fn append(&self, w: usize) -> JoinHandle<Result<(), String>>;
    /// Writer `w`'s COMMIT or ROLLBACK: whether it answered without error.
    fn end(&self, w: usize, ending: Ending) -> impl Future<Output = bool> + Send;
    /// Another stream's append, committed.
    fn other_append(&self) -> impl Future<Output = ()> + Send;
    /// Whether each writer of `writers` has a statement waiting for a lock now.
    fn waiting(&self, writers: &[usize]) -> impl Future<Output = Vec<bool>> + Send;
    /// Rows at or below `at_most`.
    fn count_rows(&self, at_most: i64) -> impl Future<Output = i64> + Send;
    /// Whether writer `w`'s message id is in the schedule's stream.
    fn stored(&self, w: usize) -> impl Future<Output = bool> + Send;
    /// The tombstone stream's rows, its highest stream position and its
    /// Version; the positions missing between `after` and the head.
    fn tombstones_and_holes(
        &self,
        after: i64,
    ) -> impl Future<Output = ((i64, i64, i64), i64)> + Send;
}

/// One run of a schedule: the steps as taken (with "waits" where a step's
/// statement was left waiting), and what each writer saw.
struct Run {
    trace: Vec<(Step, usize, usize)>,
    text: Vec<String>,
    seen: [Seen; 2],
    violations: Vec<String>,
}

/// How a run picks its next step among the enabled ones.
#[derive(Clone, Copy)]
enum Script<'a> {
    /// By index, at each depth (0 past the end).
    Choices(&'a [usize]),
    /// These steps in this order.
    Order(&'a [Step]),
    /// At random.
    Random(&'a std::sync::Mutex<StdRng>),
}

/// One variant over one world.
pub struct Lab<W: World> {
    pub shape: Shape,
    pub endings: [Ending; 2],
    pub world: W,
}

impl<W: World> Lab<W> {
    pub fn name(&self) -> String {
        let e = |e: Ending| match e {
            Ending::Commit => "commits",
            Ending::Rollback => "rolls back",
        };
        format!(
            "{:?}: A {}, B {}",
            self.shape,
            e(self.endings[0]),
            e(self.endings[1])
        )
    }

    fn healer(&self, after: i64) -> Healer<W::Engine> {
        kit::healer(
            self.world.engine(),
            Options {
                store: Default::default(),
                gap_timeout: Duration::ZERO,
                poll_interval: Duration::from_millis(10),
                lock_timeout: Duration::from_millis(50),
                scan_page_size: 1_000,
                start_from: StartFrom::Position(after),
                lookback: 0,
                dry_run: false,
                give_up_after: None,
                publish_watermark: false,
            },
        )
    }

    /// Until every pending append is done or waiting for a lock; the done
    /// ones' answers go into `answers`.
    async fn settle(
        &self,
        pending: &mut [Option<JoinHandle<Result<(), String>>>; 2],
        answers: &mut [Option<Result<(), String>>; 2],
    ) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for w in 0..2 {
                if pending[w].as_ref().is_some_and(|h| h.is_finished()) {
                    answers[w] = Some(pending[w].take().unwrap().await.unwrap());
                }
            }
            let open: Vec<usize> = (0..2).filter(|w| pending[*w].is_some()).collect();
            if open.is_empty() || self.world.waiting(&open).await.iter().all(|w| *w) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "a statement neither finished nor waited within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Runs the schedule `script` picks over the actors `steps_of` (with
    /// the healer's or without).
    async fn run(&self, script: Script<'_>, steps_of: &[Vec<Step>]) -> Run {
        let after = self.world.reset().await;
        let mut h = self.healer(after);
        let stop = CancellationToken::new();
        let mut next = vec![0usize; steps_of.len()];
        let mut pending: [Option<JoinHandle<Result<(), String>>>; 2] = [None, None];
        let mut answers: [Option<Result<(), String>>; 2] = [None, None];
        let mut committed = [false; 2];
        let mut trace = Vec::new();
        let mut text = Vec::new();
        let mut watermarks = Vec::new();
        loop {
            let enabled: Vec<usize> = (0..steps_of.len())
                .filter(|a| next[*a] < steps_of[*a].len())
                .filter(|a| match steps_of[*a][next[*a]] {
                    Step::End(w) => pending[w].is_none(),
                    _ => true,
                })
                .collect();
            if enabled.is_empty() {
                break;
            }
            let depth = trace.len();
            let pick = match script {
                Script::Choices(choices) => choices.get(depth).copied().unwrap_or(0),
                Script::Random(rng) => rng.lock().unwrap().random_range(0..enabled.len()),
                Script::Order(order) => enabled
                    .iter()
                    .position(|a| steps_of[*a][next[*a]] == order[depth])
                    .expect("the writers' order replays without the healer"),
            };
            let actor = enabled[pick];
            let step = steps_of[actor][next[actor]];
            next[actor] += 1;
            trace.push((step, pick, enabled.len()));
            match step {
                Step::Append(w) => pending[w] = Some(self.world.append(w)),
                Step::End(w) => {
                    let ok = self.world.end(w, self.endings[w]).await;
                    committed[w] = ok && self.endings[w] == Ending::Commit;
                }
                Step::Other => self.world.other_append().await,
                Step::Scan => {
                    h.scan_step().await.unwrap();
                }
                Step::Fill => {
                    h.fill_due(&stop).await;
                }
            }
            self.settle(&mut pending, &mut answers).await;
            let mut shown = step.to_string();
            if let Step::Append(w) = step {
                if pending[w].is_some() {
                    shown.push_str(" (waits)");
                }
            }
            if let Step::End(w) = step {
                shown = format!(
                    "{}.{}",
                    if w == 0 { "A" } else { "B" },
                    match self.endings[w] {
                        Ending::Commit => "commit",
                        Ending::Rollback => "rollback",
                    }
                );
            }
            if matches!(step, Step::Scan | Step::Fill) {
                if let Some(w) = h.contiguous() {
                    watermarks.push((w, self.world.count_rows(w).await));
                }
            }
            text.push(shown);
        }
        let with_healer = steps_of.len() > 3;
        let mut violations = Vec::new();
        if with_healer {
            // What the daemon would go on to do: heal what is left, each
            // hole when its retry comes due.
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                h.scan_step().await.unwrap();
                if h.tracker().ranges().is_empty() {
                    break;
                }
                h.fill_due(&stop).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            violations.extend(self.judge(after, &watermarks).await);
        }
        let mut seen = Vec::new();
        for w in 0..2 {
            let append = answers[w]
                .clone()
                .unwrap_or_else(|| Err("never ran".into()));
            seen.push(Seen {
                committed: committed[w] && append.is_ok(),
                append,
                stored: self.world.stored(w).await,
            });
        }
        Run {
            trace,
            text,
            seen: [seen[0].clone(), seen[1].clone()],
            violations,
        }
    }

    /// The store-side invariants at the end of a schedule with the healer.
    async fn judge(&self, after: i64, watermarks: &[(i64, i64)]) -> Vec<String> {
        let mut out = Vec::new();
        for (w, rows) in watermarks {
            let now = self.world.count_rows(*w).await;
            if now != *rows {
                out.push(format!(
                    "a row committed at or below the watermark {w} after it was computed ({rows} rows then, {now} now)"
                ));
            }
        }
        let ((n, max, version), holes) = self.world.tombstones_and_holes(after).await;
        if max != n - 1 || version != max {
            out.push(format!(
                "tombstone stream: {n} rows, highest stream position {max}, Version {version}"
            ));
        }
        if holes > 0 {
            out.push(format!("{holes} position(s) left unfilled below the head"));
        }
        out
    }

    /// Schedules with the healer and (once per order of the writers' steps)
    /// without it; the violations, each with its schedule. Every schedule
    /// (depth-first) unless `sample` is given; with it, that many schedules
    /// drawn at random (seeded, so a run can be repeated), each counted once.
    pub async fn explore(&self, sample: Option<(usize, u64)>) -> (usize, Vec<String>) {
        let writers = vec![
            vec![Step::Append(0), Step::End(0)],
            vec![Step::Append(1), Step::End(1)],
            vec![Step::Other],
        ];
        let mut with = writers.clone();
        with.push(vec![Step::Scan, Step::Fill]);
        let mut baselines: HashMap<Vec<Step>, [Seen; 2]> = HashMap::new();
        let mut seen_schedules: HashSet<Vec<usize>> = HashSet::new();
        let mut choices: Vec<usize> = Vec::new();
        let mut draws = 0;
        let mut violations = Vec::new();
        let rng = std::sync::Mutex::new(StdRng::seed_from_u64(sample.map_or(0, |(_, seed)| seed)));
        loop {
            let script = match sample {
                Some(_) => Script::Random(&rng),
                None => Script::Choices(&choices),
            };
            draws += 1;
            let run = self.run(script, &with).await;
            let picks: Vec<usize> = run.trace.iter().map(|(_, pick, _)| *pick).collect();
            if seen_schedules.insert(picks) {
                let order: Vec<Step> = run
                    .trace
                    .iter()
                    .map(|(s, _, _)| *s)
                    .filter(|s| !matches!(s, Step::Scan | Step::Fill))
                    .collect();
                if !baselines.contains_key(&order) {
                    let base = self.run(Script::Order(&order), &writers).await;
                    baselines.insert(order.clone(), base.seen);
                }
                let base = &baselines[&order];
                let mut found = run.violations.clone();
                for (w, (with, without)) in run.seen.iter().zip(base).enumerate() {
                    if with != without {
                        found.push(format!(
                            "writer {} saw {with:?} with the healer, {without:?} without",
                            if w == 0 { "A" } else { "B" },
                        ));
                    }
                }
                for v in found {
                    violations.push(format!("{}: {} => {v}", self.name(), run.text.join(", ")));
                }
            }
            if let Some((most, _)) = sample {
                if draws >= most {
                    break;
                }
                continue;
            }
            // The next schedule: the deepest step that has an untried sibling.
            let Some(d) = run.trace.iter().rposition(|(_, pick, n)| pick + 1 < *n) else {
                break;
            };
            choices = run.trace[..d].iter().map(|(_, pick, _)| *pick).collect();
            choices.push(run.trace[d].1 + 1);
        }
        (seen_schedules.len(), violations)
    }
}

/// Prints each variant's counts and the first violations; fails on any.
pub fn report(results: Vec<(String, usize, Vec<String>)>, started: Instant, server: &str) {
    let mut total = 0;
    let mut all = Vec::new();
    for (_, explored, violations) in results {
        total += explored;
        all.extend(violations);
    }
    println!(
        "explorer on {server}: {total} schedules explored, {} violations, {:.1} s",
        all.len(),
        started.elapsed().as_secs_f64()
    );
    for v in all.iter().take(20) {
        println!("violation: {v}");
    }
    assert!(
        all.is_empty(),
        "{} violations; first: {}",
        all.len(),
        all[0]
    );
}
