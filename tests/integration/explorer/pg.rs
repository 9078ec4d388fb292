//! The interleaving explorer: every order of the steps of two appends that
//! race on one stream, a third append that commits above them, and the
//! healer's own scan and fill, run over real sessions of the local
//! PostgreSQL, one statement a step.
//!
//! The writers do what the ones users run do (tests/fixtures: Eventuous's
//! `append_events`, with no row lock in its version check and a bare
//! `ON CONFLICT DO NOTHING`; and a plain INSERT into a table whose unique
//! key on the stream position is inserted before the position's key). The
//! healer is [`Healer::scan_step`] and [`Healer::fill_due`] over the real
//! engine, with `gap_timeout` 0: a schedule stands for the moments a daemon
//! would act, whatever the clock says.
//!
//! A schedule is replayed from an empty store. After every step the explorer
//! waits until each unfinished statement is either done or waiting for a
//! lock (pg_locks), so the next step always meets the same state: the runs
//! are deterministic. A step is enabled when its actor has no statement
//! waiting; the schedules are every sequence of enabled steps (depth-first,
//! by replay).
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

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gap_healer::config::StartFrom;
use gap_healer::engine::postgres::PostgresEngine;
use gap_healer::healer::{Healer, Options};
use gap_healer_testkit::eventuous::{self, EVENT_TYPE, TOMBSTONE_STREAM};
use gap_healer_testkit::{engine as kit, pg};
use tokio::task::JoinHandle;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How the two racing appends write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    /// Eventuous's `append_events`, each with its own message id.
    Eventuous,
    /// Eventuous's `append_events`, the second an idempotent retry of the
    /// first (the same message id).
    EventuousRetry,
    /// A plain INSERT into a table whose unique index on (stream, stream
    /// position) comes before the primary key in index order.
    PlainUniqueFirst,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Ending {
    Commit,
    Rollback,
}

/// One step. Writers 0 and 1 append to stream `s` at expected version 0.
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
struct Seen {
    /// The append's answer: `Ok` or the SQLSTATE it failed with.
    append: Result<(), String>,
    /// Committed and its COMMIT answered without error.
    committed: bool,
    /// Its message id is in stream `s`.
    stored: bool,
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
}

/// One variant's store and sessions, reused by every schedule (reset in
/// between).
struct Lab {
    shape: Shape,
    endings: [Ending; 2],
    store: pg::Store,
    writers: [Arc<Client>; 2],
    pids: [i32; 2],
    other: Client,
    engine: Arc<PostgresEngine>,
    ids: [Uuid; 2],
}

impl Lab {
    async fn new(shape: Shape, endings: [Ending; 2]) -> Lab {
        let store = pg::Store::new("explore").await;
        let s = &store.schema;
        if shape == Shape::PlainUniqueFirst {
            // The primary key re-created: its index now comes after the
            // unique (stream_id, stream_position) index in OID order, so a
            // plain INSERT checks that one first and may wait there with its
            // position drawn and no key.
            store
                .client
                .batch_execute(&format!(
                    "ALTER TABLE {s}.messages DROP CONSTRAINT messages_pkey;
                     ALTER TABLE {s}.messages ADD PRIMARY KEY (global_position);"
                ))
                .await
                .unwrap();
        }
        let mut writers = Vec::new();
        let mut pids = Vec::new();
        for _ in 0..2 {
            let c = pg::connect_to(&store.url()).await;
            let pid: i32 = c
                .query_one("SELECT pg_backend_pid()", &[])
                .await
                .unwrap()
                .get(0);
            writers.push(Arc::new(c));
            pids.push(pid);
        }
        let other = pg::connect_to(&store.url()).await;
        let engine = store.engine();
        let first = Uuid::new_v4();
        let second = if shape == Shape::EventuousRetry {
            first
        } else {
            Uuid::new_v4()
        };
        Lab {
            shape,
            endings,
            writers: [writers[0].clone(), writers[1].clone()],
            pids: [pids[0], pids[1]],
            other,
            engine,
            store,
            ids: [first, second],
        }
    }

    fn name(&self) -> String {
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

    /// An empty store with stream `s` at Version 0 (one event, position 1)
    /// and stream `other`.
    async fn reset(&self) {
        let s = &self.store.schema;
        self.store
            .client
            .batch_execute(&format!(
                "TRUNCATE {s}.messages, {s}.streams, {s}.checkpoints RESTART IDENTITY"
            ))
            .await
            .unwrap();
        let c = &self.store.client;
        eventuous::pg::append_events(c, s, "s", -1, &[Uuid::new_v4()], EVENT_TYPE)
            .await
            .unwrap();
        c.batch_execute(&format!(
            "INSERT INTO {s}.streams (stream_name) VALUES ('other')"
        ))
        .await
        .unwrap();
    }

    fn healer(&self) -> Healer<PostgresEngine> {
        kit::healer(
            self.engine.clone(),
            Options {
                gap_timeout: Duration::ZERO,
                poll_interval: Duration::from_millis(10),
                lock_timeout: Duration::from_millis(50),
                scan_page_size: 1_000,
                start_from: StartFrom::Position(1),
                lookback: 0,
                dry_run: false,
                give_up_after: None,
                publish_watermark: false,
            },
        )
    }

    /// Writer `w`'s append, on its own task: it may wait.
    fn append(&self, w: usize) -> JoinHandle<Result<(), String>> {
        let c = self.writers[w].clone();
        let s = self.store.schema.clone();
        let id = self.ids[w];
        let shape = self.shape;
        tokio::spawn(async move {
            c.batch_execute("BEGIN").await.map_err(code)?;
            match shape {
                Shape::Eventuous | Shape::EventuousRetry => {
                    eventuous::pg::append_events(&c, &s, "s", 0, &[id], EVENT_TYPE)
                        .await
                        .map(|_| ())
                        .map_err(code)
                }
                Shape::PlainUniqueFirst => c
                    .execute(
                        &format!(
                            "INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, json_data, created)
                             SELECT $1, $2, stream_id, version + 1, '{{}}', now() FROM {s}.streams WHERE stream_name = 's'"
                        ),
                        &[&id, &EVENT_TYPE],
                    )
                    .await
                    .map(|_| ())
                    .map_err(code),
            }
        })
    }

    async fn other_append(&self) {
        let s = &self.store.schema;
        match self.shape {
            Shape::Eventuous | Shape::EventuousRetry => {
                eventuous::pg::append_events(
                    &self.other,
                    s,
                    "other",
                    -2,
                    &[Uuid::new_v4()],
                    EVENT_TYPE,
                )
                .await
                .unwrap();
            }
            Shape::PlainUniqueFirst => {
                self.other
                    .execute(
                        &format!(
                            "INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, json_data, created)
                             SELECT gen_random_uuid(), $1, stream_id, 0, '{{}}', now() FROM {s}.streams WHERE stream_name = 'other'"
                        ),
                        &[&EVENT_TYPE],
                    )
                    .await
                    .unwrap();
            }
        }
    }

    /// Whether each of `pids` is waiting for a lock now.
    async fn waiting(&self, pids: &[i32]) -> Vec<bool> {
        let rows = self
            .store
            .client
            .query(
                "SELECT DISTINCT pid FROM pg_locks WHERE NOT granted AND pid = ANY($1)",
                &[&pids],
            )
            .await
            .unwrap();
        let waiting: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
        pids.iter().map(|p| waiting.contains(p)).collect()
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
            let open: Vec<i32> = (0..2)
                .filter(|w| pending[*w].is_some())
                .map(|w| self.pids[w])
                .collect();
            if open.is_empty() || self.waiting(&open).await.iter().all(|w| *w) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "a statement neither finished nor waited within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn count_rows(&self, at_most: i64) -> i64 {
        let s = &self.store.schema;
        self.store
            .client
            .query_one(
                &format!("SELECT count(*) FROM {s}.messages WHERE global_position <= $1"),
                &[&at_most],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Runs the schedule `script` picks over the actors `steps_of` (with
    /// the healer's or without).
    async fn run(&self, script: Script<'_>, steps_of: &[Vec<Step>]) -> Run {
        self.reset().await;
        let mut h = self.healer();
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
                Step::Append(w) => pending[w] = Some(self.append(w)),
                Step::End(w) => {
                    let sql = match self.endings[w] {
                        Ending::Commit => "COMMIT",
                        Ending::Rollback => "ROLLBACK",
                    };
                    let ok = self.writers[w].batch_execute(sql).await.is_ok();
                    committed[w] = ok && self.endings[w] == Ending::Commit;
                }
                Step::Other => self.other_append().await,
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
                    watermarks.push((w, self.count_rows(w).await));
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
            violations.extend(self.judge(&watermarks).await);
        }
        let mut seen = Vec::new();
        for w in 0..2 {
            let append = answers[w]
                .clone()
                .unwrap_or_else(|| Err("never ran".into()));
            seen.push(Seen {
                committed: committed[w] && append.is_ok(),
                append,
                stored: self.stored(w).await,
            });
        }
        Run {
            trace,
            text,
            seen: [seen[0].clone(), seen[1].clone()],
            violations,
        }
    }

    async fn stored(&self, w: usize) -> bool {
        let s = &self.store.schema;
        self.store
            .client
            .query_one(
                &format!(
                    "SELECT count(*) FROM {s}.messages m JOIN {s}.streams st USING (stream_id)
                     WHERE st.stream_name = 's' AND m.message_id = $1"
                ),
                &[&self.ids[w]],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            > 0
    }

    /// The store-side invariants at the end of a schedule with the healer.
    async fn judge(&self, watermarks: &[(i64, i64)]) -> Vec<String> {
        let s = &self.store.schema;
        let c = &self.store.client;
        let mut out = Vec::new();
        for (w, rows) in watermarks {
            let now = self.count_rows(*w).await;
            if now != *rows {
                out.push(format!(
                    "a row committed at or below the watermark {w} after it was computed ({rows} rows then, {now} now)"
                ));
            }
        }
        let t = c
            .query_one(
                &format!(
                    "SELECT count(*), COALESCE(MAX(m.stream_position), -1),
                            COALESCE((SELECT version FROM {s}.streams WHERE stream_name = $1), -1)
                     FROM {s}.messages m JOIN {s}.streams st USING (stream_id) WHERE st.stream_name = $1"
                ),
                &[&TOMBSTONE_STREAM],
            )
            .await
            .unwrap();
        let (n, max, version): (i64, i32, i32) = (t.get(0), t.get(1), t.get(2));
        if i64::from(max) != n - 1 || version != max {
            out.push(format!(
                "tombstone stream: {n} rows, highest stream position {max}, Version {version}"
            ));
        }
        let holes: i64 = c
            .query_one(
                &format!(
                    "SELECT count(*) FROM generate_series(1, (SELECT MAX(global_position) FROM {s}.messages)) g (p)
                     WHERE NOT EXISTS (SELECT 1 FROM {s}.messages m WHERE m.global_position = g.p)"
                ),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if holes > 0 {
            out.push(format!("{holes} position(s) left unfilled below the head"));
        }
        out
    }

    /// Every schedule, with the healer and (once per order of the writers'
    /// steps) without it; the violations, each with its schedule.
    async fn explore(&self) -> (usize, Vec<String>) {
        let writers = vec![
            vec![Step::Append(0), Step::End(0)],
            vec![Step::Append(1), Step::End(1)],
            vec![Step::Other],
        ];
        let mut with = writers.clone();
        with.push(vec![Step::Scan, Step::Fill]);
        let mut baselines: HashMap<Vec<Step>, [Seen; 2]> = HashMap::new();
        let mut choices: Vec<usize> = Vec::new();
        let mut explored = 0;
        let mut violations = Vec::new();
        loop {
            let run = self.run(Script::Choices(&choices), &with).await;
            explored += 1;
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
            // The next schedule: the deepest step that has an untried sibling.
            let Some(d) = run.trace.iter().rposition(|(_, pick, n)| pick + 1 < *n) else {
                break;
            };
            choices = run.trace[..d].iter().map(|(_, pick, _)| *pick).collect();
            choices.push(run.trace[d].1 + 1);
        }
        (explored, violations)
    }
}

fn code(e: tokio_postgres::Error) -> String {
    e.code()
        .map_or_else(|| e.to_string(), |c| c.code().to_string())
}

/// Variants explored at once: each holds about six sessions.
const AT_ONCE: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_interleaving_of_two_racing_appends_and_the_healer_keeps_every_event() {
    let started = Instant::now();
    let permits = Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
    let mut tasks = Vec::new();
    for shape in [
        Shape::Eventuous,
        Shape::EventuousRetry,
        Shape::PlainUniqueFirst,
    ] {
        for a in [Ending::Rollback, Ending::Commit] {
            for b in [Ending::Commit, Ending::Rollback] {
                let permits = permits.clone();
                tasks.push(tokio::spawn(async move {
                    let _permit = permits.acquire().await.unwrap();
                    let lab = Lab::new(shape, [a, b]).await;
                    let t = Instant::now();
                    let (explored, violations) = lab.explore().await;
                    println!(
                        "explorer: {}: {explored} schedules, {} violations ({:.1} s)",
                        lab.name(),
                        violations.len(),
                        t.elapsed().as_secs_f64()
                    );
                    lab.store.drop_schema().await;
                    (explored, violations)
                }));
            }
        }
    }
    let mut total = 0;
    let mut all = Vec::new();
    for task in tasks {
        let (explored, violations) = task.await.unwrap();
        total += explored;
        all.extend(violations);
    }
    println!(
        "explorer: {total} schedules explored, {} violations, {:.1} s",
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

/// The issue's case, as a user meets it: Eventuous's own `append_events`,
/// the real binary (`--gap-timeout 1s --lock-timeout 300ms`). Append A holds
/// its insert open; append B to the same stream at the same expected version
/// waits inside its insert with its position drawn and no key; another
/// stream commits above. Before the waiting-writer check the daemon filled
/// B's position, and when A rolled back B's row met the tombstone and was
/// dropped while `append_events` reported success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_eventuous_append_keeps_its_position_against_the_daemon() {
    use gap_healer_testkit::bin::{timing, Daemon};
    let store = pg::Store::new("waiting_append").await;
    let s = store.schema.clone();
    let c = &store.client;
    eventuous::pg::append_events(c, &s, "s", -1, &[Uuid::new_v4()], EVENT_TYPE)
        .await
        .unwrap();
    let a = pg::connect_to(&store.url()).await;
    a.batch_execute("BEGIN").await.unwrap();
    eventuous::pg::append_events(&a, &s, "s", 0, &[Uuid::new_v4()], EVENT_TYPE)
        .await
        .unwrap();
    let b_id = Uuid::new_v4();
    let b = {
        let (url, s) = (store.url(), s.clone());
        tokio::spawn(async move {
            let b = pg::connect_to(&url).await;
            eventuous::pg::append_events(&b, &s, "s", 0, &[b_id], EVENT_TYPE).await
        })
    };
    let waited = gap_healer_testkit::wait::until(Duration::from_secs(10), || async {
        let waiting: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'transactionid'
                        AND pid IN (SELECT pid FROM pg_locks WHERE relation = TO_REGCLASS($1))",
                &[&format!("{s}.messages")],
            )
            .await
            .unwrap()
            .get(0);
        waiting > 0
    })
    .await;
    assert!(waited, "B waits inside its insert");
    eventuous::pg::append_events(c, &s, "other", -1, &[Uuid::new_v4()], EVENT_TYPE)
        .await
        .unwrap();
    let daemon = Daemon::start(&store, &timing("1s", "100ms", &["--lock-timeout", "300ms"]));
    // Past gap_timeout and several fill cycles with A and B still open.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let early = store.tombstone_positions().await;
    a.batch_execute("ROLLBACK").await.unwrap();
    let (version, _) = b.await.unwrap().expect("B's append reports success");
    assert_eq!(version, 1, "B's event is the stream's second");
    let stored: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM {s}.messages WHERE message_id = $1"),
            &[&b_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1, "B reported success: its event must be stored");
    assert!(early.is_empty(), "filled while B waited: {early:?}");
    let refused = daemon
        .metric(r#"gap_healer_fill_attempts_total{store="default",outcome="writer_waiting"}"#)
        .await
        .unwrap_or(0.0);
    assert!(
        refused >= 1.0,
        "fills refused while B waits: {refused}\n{}",
        daemon.log()
    );
    assert!(
        !daemon
            .lines_containing("not filling until it moves")
            .is_empty(),
        "{}",
        daemon.log()
    );
    // A's position (2) is a real hole now, and is filled.
    let filled = gap_healer_testkit::wait::until(Duration::from_secs(15), || async {
        store.tombstone_positions().await == vec![2]
    })
    .await;
    assert!(filled, "A's position filled\n{}", daemon.log());
    assert!(store.missing().await.is_empty());
    store.assert_tombstone_stream_consistent().await;
    drop(daemon);
    store.drop_schema().await;
}

/// Which waiting writers refuse a fill. A writer that has inserted into
/// messages and now waits for another transaction's stream row (a row
/// lock: it holds the row's tuple lock while it waits) can hold no drawn,
/// unkeyed position: the fill goes on. Once the table has a BEFORE INSERT
/// row trigger (user code between the draw and the key, which may wait for
/// anything), every waiting writer refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_lock_wait_does_not_refuse_a_fill_unless_a_trigger_runs_before_the_key() {
    use gap_healer::engine::{Engine, Fence, FillOutcome};
    let store = pg::Store::new("waiting_kinds").await;
    let s = store.schema.clone();
    let c = &store.client;
    // Rows at 1, 2, 4, 6; holes at 3 and 5 (appends rolled back).
    for (stream, keep) in [
        ("x", true),
        ("y", true),
        ("x", false),
        ("y", true),
        ("x", false),
        ("y", true),
    ] {
        c.batch_execute("BEGIN").await.unwrap();
        eventuous::pg::append_events(c, &s, stream, -2, &[Uuid::new_v4()], EVENT_TYPE)
            .await
            .unwrap();
        c.batch_execute(if keep { "COMMIT" } else { "ROLLBACK" })
            .await
            .unwrap();
    }
    let engine = store.engine();
    // A writer of messages waiting on a row lock of stream y, with or
    // without the trigger; the fill's answer meanwhile.
    let fill_beside_a_row_lock_wait = |position: i64| {
        let (url, s, engine) = (store.url(), s.clone(), engine.clone());
        async move {
            let holder = pg::connect_to(&url).await;
            holder
                .batch_execute(&format!(
                    "BEGIN; SELECT 1 FROM {s}.streams WHERE stream_name = 'y' FOR UPDATE"
                ))
                .await
                .unwrap();
            let waiter = {
                let (url, s) = (url.clone(), s.clone());
                tokio::spawn(async move {
                    let w = pg::connect_to(&url).await;
                    w.batch_execute("BEGIN").await.unwrap();
                    eventuous::pg::append_events(&w, &s, "x", -2, &[Uuid::new_v4()], EVENT_TYPE)
                        .await
                        .unwrap();
                    w.batch_execute(&format!(
                        "SELECT 1 FROM {s}.streams WHERE stream_name = 'y' FOR UPDATE"
                    ))
                    .await
                    .unwrap();
                    w.batch_execute("ROLLBACK").await.unwrap();
                })
            };
            tokio::time::sleep(Duration::from_millis(500)).await;
            let range = gap_healer::gaps::PosRange::single(position);
            let outcome = engine
                .fill_ranges(&[range], Duration::from_millis(200), &Fence::Unfenced)
                .await
                .unwrap();
            holder.batch_execute("ROLLBACK").await.unwrap();
            waiter.await.unwrap();
            outcome
        }
    };
    assert_eq!(
        fill_beside_a_row_lock_wait(3).await,
        FillOutcome::Filled { rows: 1 },
        "a row-lock wait holds no unkeyed position"
    );
    c.batch_execute(&format!(
        "CREATE FUNCTION {s}.noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$;
         CREATE TRIGGER noop BEFORE INSERT ON {s}.messages FOR EACH ROW EXECUTE FUNCTION {s}.noop();"
    ))
    .await
    .unwrap();
    let refused = fill_beside_a_row_lock_wait(5).await;
    assert!(
        matches!(refused, FillOutcome::WriterWaiting { sessions: 1, .. }),
        "with a BEFORE INSERT trigger every waiting writer counts: {refused:?}"
    );
    store.drop_schema().await;
}
