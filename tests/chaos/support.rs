//! The chaos test's moving parts, whatever the engine: Eventuous-style writers
//! that survive the server restarting, an Eventuous 0.17 all-stream
//! subscriber that survives it too, healer processes of the real binary, and
//! the healers' JSON logs read back as leadership intervals and fill attempts.
//! What differs per engine (SQL, errors, how to restart the server) is a
//! [`Backend`]: `postgres.rs` and `mssql.rs`.
//!
//! Everything here records what it saw; `run.rs` judges it. What the chaos
//! run shares with the other tests (the Eventuous 0.17 subscription rule, the
//! real binary, the log reading, connecting with retries) is the test kit's.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gap_healer_testkit::bin::{self, Process};
use gap_healer_testkit::subscriber::{Follower, Offered, PageRow};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use gap_healer_testkit::eventuous::{TOMBSTONE_STREAM, TOMBSTONE_TYPE};
pub use gap_healer_testkit::logs::{now_us, parse_timestamp, FillAttempt, LogFacts};
pub use gap_healer_testkit::wait::connect_retrying;

pub const EVENT_TYPE: &str = "ChaosEvent";
/// The healers' gap_timeout; slow appends are held 0.5 to 3 times this long.
pub const GAP_TIMEOUT: Duration = Duration::from_secs(1);
/// Streams the writers pick from.
const STREAMS: usize = 40;
/// Streams that Eventuous's own append function races on (every writer's
/// calls share them, so two appends meet at one expected version).
const HOT_STREAMS: usize = 3;

/// One committed row as the verdict reads it: global position, message id,
/// stream name, stream position, message type, data.
pub type StoredRow = (i64, Uuid, String, i32, String, serde_json::Value);

/// One stream as the verdict reads it: name, Version, rows, lowest and
/// highest stream position (0 and -1 without rows).
pub type StoredStream = (String, i32, i64, i32, i32);

/// What one engine brings to the run.
pub trait Backend: Send + Sync + 'static {
    /// A writer's or the subscriber's own connection.
    type Conn: Send + 'static;
    /// "PostgreSQL", "SQL Server".
    const NAME: &'static str;
    /// The identity's first value: the lowest position there can be.
    const FIRST: i64;
    /// Whether an append with a duplicate message id can skip the duplicate
    /// and go on (PostgreSQL's ON CONFLICT DO NOTHING); on SQL Server the
    /// append fails.
    const DUPLICATES_IGNORED: bool;
    /// Whether events carry message ids that an append can duplicate
    /// (Eventuous's); without them (ledger-core's table) the writers make
    /// no duplicate-id appends, and that share of them fails part way at a
    /// stale version instead.
    const MESSAGE_IDS: bool = true;
    /// How long a slow append holds its transaction open, in multiples of
    /// [`GAP_TIMEOUT`]: from half of it (never due while open) to three
    /// times (due, and refused by its lock) by default.
    const SLOW_HOLD: (f64, f64) = (0.5, 3.0);

    /// Whether the store has Eventuous's own append function (the
    /// fixture's `append_events`, PostgreSQL): then a share of the appends
    /// go through it, racing on a few hot streams ([`Backend::append_function`]).
    const EVENTUOUS_FUNCTION: bool = false;

    /// How long between two kills, in milliseconds: a new healer must be
    /// able to lead between them, or the run shows no hand-overs.
    fn kill_every(&self) -> std::ops::Range<u64> {
        1_500..4_000
    }

    fn connect(&self) -> impl Future<Output = Result<Self::Conn, String>> + Send;

    /// One call of Eventuous's own `append_events` in one transaction, as
    /// [`Call`] says; what the writer saw and what it left behind.
    fn append_function(
        &self,
        c: &mut Self::Conn,
        call: &Call<'_>,
    ) -> impl Future<Output = Called> + Send {
        let _ = (c, call);
        async { Called::NotCommitted }
    }
    /// One append attempt in one transaction, on `c`.
    fn append(
        &self,
        c: &mut Self::Conn,
        append: &Append<'_>,
    ) -> impl Future<Output = Attempt> + Send;
    /// Whether the events of an append whose COMMIT got no answer are there
    /// (all: true, none: false, some: a violation, reported in `journal`).
    fn resolve(&self, journal: &Journal, events: &[Event]) -> impl Future<Output = bool> + Send;
    /// Up to 500 rows from `next` on, in position order.
    fn page(
        &self,
        c: &mut Self::Conn,
        next: i64,
    ) -> impl Future<Output = Result<Vec<PageRow>, String>> + Send;
    /// The healer's store flags and environment for one slot.
    fn healer_store(&self, slot: usize) -> (Vec<String>, Vec<(String, String)>);
    /// Restarts the server (or what stands for it) and returns how long until
    /// a new connection worked, and what was restarted.
    fn restart(&self) -> impl Future<Output = (Duration, String)> + Send;
    /// Row count and highest position.
    fn count_and_head(&self) -> impl Future<Output = (i64, i64)> + Send;
    fn rows(&self) -> impl Future<Output = Vec<StoredRow>> + Send;
    fn streams(&self) -> impl Future<Output = Vec<StoredStream>> + Send;
    /// Distinct `Created` values among the tombstones: fill transactions.
    fn fill_transactions(&self) -> impl Future<Output = i64> + Send;
    /// Where the store lives, for the messages ("schema gh_chaos_1234").
    fn describe(&self) -> String;
    /// Removes the store (after a run that passed).
    fn remove(&self) -> impl Future<Output = ()> + Send;
}

/// Runs `command` (a shell command that restarts a server); panics with its
/// output if it fails.
pub async fn run_restart_command(command: String) {
    let out = tokio::task::spawn_blocking(move || {
        Command::new("sh")
            .args(["-c", &command])
            .output()
            .unwrap_or_else(|e| panic!("run the restart command {command:?}: {e}"))
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the restart command failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One event a writer believes committed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub id: Uuid,
    pub stream: String,
    pub global: i64,
    pub stream_pos: i32,
    pub data: serde_json::Value,
}

/// What the writers did, for the figures and the verdict.
#[derive(Default)]
pub struct WriterStats {
    pub appends: AtomicU64,
    pub rolled_back: AtomicU64,
    pub slow_committed: AtomicU64,
    pub slow_rolled_back: AtomicU64,
    pub duplicates_ignored: AtomicU64,
    pub duplicates_failed: AtomicU64,
    pub multi_committed: AtomicU64,
    pub multi_failed: AtomicU64,
    pub deadlocks: AtomicU64,
    pub lost_races: AtomicU64,
    /// Calls of Eventuous's own append function: stored, idempotent
    /// retries, rows dropped by its ON CONFLICT after a lost race.
    pub function_stored: AtomicU64,
    pub function_retries: AtomicU64,
    pub function_races_dropped: AtomicU64,
    pub function_not_committed: AtomicU64,
    pub lost_connection: AtomicU64,
    pub unknown_committed: AtomicU64,
    pub unknown_not_committed: AtomicU64,
}

impl WriterStats {
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Shared by the writers: what they acknowledged and what went wrong.
#[derive(Default)]
pub struct Journal {
    pub acked: Mutex<Vec<Event>>,
    /// Anything a writer saw that must never happen (a duplicate key on the
    /// messages primary key, a half-committed append, an unexpected error).
    pub violations: Mutex<Vec<String>>,
    pub stats: WriterStats,
}

impl Journal {
    pub fn violation(&self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.violations.lock().unwrap().push(what);
    }

    /// An append whose COMMIT got no answer, read back: `found` of its
    /// `total` events are there. All: it committed; none: it did not; some:
    /// a violation (it counts as committed, so its events are checked).
    pub fn read_back(&self, found: usize, total: usize) -> bool {
        if found == total {
            true
        } else if found == 0 {
            false
        } else {
            self.violation(format!(
                "an append whose COMMIT got no answer is half there: {found} of {total} events"
            ));
            true
        }
    }
}

/// One stream's part of an append.
pub struct Part {
    pub stream: String,
    /// Message ids to insert; a duplicate id is one already in the stream.
    pub ids: Vec<Uuid>,
    /// Insert plainly (SQL Server style, the duplicate fails the append)
    /// rather than with ON CONFLICT DO NOTHING (PostgreSQL style).
    pub strict: bool,
    /// Insert at a stream position already taken (a lost concurrency race),
    /// so this part fails after burning a global position.
    pub fail: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Normal,
    Rollback,
    Slow { commit: bool },
    DuplicateIgnored,
    DuplicateFailed,
    MultiCommitted,
    MultiFailed,
}

impl Kind {
    /// Whether the writer commits this kind of append at the end.
    pub fn commits(self) -> bool {
        !matches!(
            self,
            Kind::Rollback
                | Kind::Slow { commit: false }
                | Kind::DuplicateFailed
                | Kind::MultiFailed
        )
    }
}

/// One append attempt of a writer.
#[derive(Clone, Copy)]
pub struct Append<'a> {
    /// Where it reports what must never happen, and its figures.
    pub journal: &'a Journal,
    /// The writer, and its attempt's number.
    pub w: usize,
    pub n: u64,
    pub kind: Kind,
    pub parts: &'a [Part],
    /// How long the transaction stays open after its inserts (a slow append).
    pub hold: Option<Duration>,
}

/// What ended an append attempt early, as the backend reads the error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The connection went (the server restarting): nothing committed.
    Lost,
    /// A duplicate key on the messages primary key.
    PrimaryKey,
    Deadlock,
    /// Two appends to one stream raced for its next position (or to create
    /// it) and this one lost (Babelfish ignores the appender's UPDLOCK,
    /// HOLDLOCK hint, so the loser meets the stream-position or stream-name
    /// key instead of waiting on the Streams row; Eventuous reports that as a
    /// wrong expected version).
    LostRace,
    /// Anything else the server refused.
    Other,
}

/// The verdict on what happens to an attempt, the same for every engine.
impl Append<'_> {
    /// The JSON data of event `i` of part `part`: which writer's which
    /// attempt wrote it, so that every event is told apart.
    pub fn data(&self, part: usize, i: usize) -> serde_json::Value {
        serde_json::json!({"w": self.w, "n": self.n, "part": part, "i": i})
    }

    /// The attempt ends on an error in `what`: a duplicate key on the
    /// messages primary key means a tombstone took an append's position (a
    /// violation); a deadlock is counted; any other error is a violation
    /// unless the attempt was meant to fail.
    pub fn refused(&self, what: &str, refusal: Refusal, error: &str) -> Attempt {
        let (w, n, kind) = (self.w, self.n, self.kind);
        match refusal {
            Refusal::Lost => return Attempt::Lost,
            Refusal::PrimaryKey => self.journal.violation(format!(
                "writer {w} append {n} ({kind:?}): {what} hit a duplicate key on the messages primary key: \
                 a tombstone took an append's position: {error}"
            )),
            Refusal::Deadlock => WriterStats::bump(&self.journal.stats.deadlocks),
            Refusal::LostRace => WriterStats::bump(&self.journal.stats.lost_races),
            Refusal::Other if !matches!(kind, Kind::DuplicateFailed | Kind::MultiFailed) => {
                self.journal.violation(format!(
                    "writer {w} append {n} ({kind:?}): unexpected error in {what}: {error}"
                ))
            }
            Refusal::Other => {}
        }
        Attempt::NotCommitted
    }

    /// A part meant to fail (a duplicate id inserted plainly, or rows at a
    /// stream position already taken) failed as meant.
    pub fn failed_as_meant(&self, part: &Part) -> Attempt {
        let stats = &self.journal.stats;
        WriterStats::bump(if part.fail {
            &stats.multi_failed
        } else {
            &stats.duplicates_failed
        });
        Attempt::NotCommitted
    }

    /// Checks a part's inserts that succeeded: one at a stream position
    /// already taken must not have.
    pub fn inserted(&self, part: &Part) {
        if part.fail {
            self.journal.violation(format!(
                "writer {} append {}: the insert at a taken stream position of {} succeeded",
                self.w, self.n, part.stream
            ));
        }
    }

    /// An attempt not meant to commit was rolled back.
    pub fn rolled_back(&self) -> Attempt {
        let stats = &self.journal.stats;
        WriterStats::bump(if matches!(self.kind, Kind::Slow { .. }) {
            &stats.slow_rolled_back
        } else {
            &stats.rolled_back
        });
        Attempt::NotCommitted
    }
}

/// One call of Eventuous's own append function: one event on `stream` at
/// `expected` (its Version read just before, without a lock, as an
/// application does), with message id `id` (a fresh one, or an idempotent
/// retry of one already stored); held open `hold` after the call, then
/// committed or rolled back.
pub struct Call<'a> {
    pub journal: &'a Journal,
    pub w: usize,
    pub n: u64,
    pub stream: &'a str,
    pub id: Uuid,
    pub retry: bool,
    pub hold: Option<Duration>,
    pub commit: bool,
}

/// How a call of the function ended, in the writer's own view.
pub enum Called {
    /// It reported success, committed, and its event is there (looked up
    /// by its message id).
    Stored(Event),
    /// It reported success and committed; its message id was already in the
    /// stream (an idempotent retry: nothing new).
    AlreadyThere,
    /// It reported success and committed, but its row was dropped because
    /// another append had taken its stream position first: Eventuous's own
    /// bare ON CONFLICT DO NOTHING at work, with or without a healer.
    LostRace,
    /// Rolled back, refused (a wrong expected version, a deadlock), or its
    /// COMMIT's outcome unknown and not there.
    NotCommitted,
    /// The connection went.
    Lost,
}

/// How one attempt ended.
pub enum Attempt {
    Committed(Vec<Event>),
    NotCommitted,
    /// The connection died after COMMIT was sent: the events are these, if
    /// the server committed.
    Unknown(Vec<Event>),
    /// The connection died before COMMIT: nothing committed.
    Lost,
}

/// An Eventuous-style writer: stream row, rows, version update, one
/// transaction, on its own connection; reconnects whenever the server goes.
pub async fn writer<B: Backend>(
    backend: Arc<B>,
    w: usize,
    seed: u64,
    journal: Arc<Journal>,
    stop: CancellationToken,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ (w as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut client: Option<B::Conn> = None;
    // Recently acknowledged (stream, id): sources of duplicate ids.
    let mut mine: Vec<(String, Uuid)> = Vec::new();
    let mut n: u64 = 0;
    while !stop.is_cancelled() {
        let c = match &mut client {
            Some(c) => c,
            None => match backend.connect().await {
                Ok(c) => client.insert(c),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let roll: f64 = rng.random();
        if B::EVENTUOUS_FUNCTION && roll >= 0.94 {
            n += 1;
            let stream = format!("hot-{}", rng.random_range(0..HOT_STREAMS));
            let earlier = mine
                .iter()
                .rev()
                .find(|(s, _)| *s == stream)
                .map(|(_, id)| *id);
            let (id, retry) = match earlier {
                Some(id) if rng.random_bool(0.2) => (id, true),
                _ => (new_id(&mut rng), false),
            };
            let slow = rng.random_bool(0.25);
            let call = Call {
                journal: &journal,
                w,
                n,
                stream: &stream,
                id,
                retry,
                hold: slow
                    .then(|| GAP_TIMEOUT.mul_f64(rng.random_range(B::SLOW_HOLD.0..B::SLOW_HOLD.1))),
                commit: !slow || rng.random_bool(0.5),
            };
            let stats = &journal.stats;
            match backend.append_function(c, &call).await {
                Called::Stored(event) => {
                    WriterStats::bump(&stats.appends);
                    WriterStats::bump(&stats.function_stored);
                    mine.push((event.stream.clone(), event.id));
                    journal.acked.lock().unwrap().push(event);
                }
                Called::AlreadyThere => WriterStats::bump(&stats.function_retries),
                Called::LostRace => WriterStats::bump(&stats.function_races_dropped),
                Called::NotCommitted => WriterStats::bump(&stats.function_not_committed),
                Called::Lost => {
                    WriterStats::bump(&stats.lost_connection);
                    client = None;
                }
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(2..25))).await;
            continue;
        }
        let kind = match roll {
            r if r < 0.10 => Kind::Rollback,
            r if r < 0.15 => Kind::Slow {
                commit: rng.random_bool(0.75),
            },
            r if r < 0.19 && B::MESSAGE_IDS && !mine.is_empty() && B::DUPLICATES_IGNORED => {
                Kind::DuplicateIgnored
            }
            r if r < 0.22 && B::MESSAGE_IDS && !mine.is_empty() => Kind::DuplicateFailed,
            r if r < 0.27 => Kind::MultiFailed,
            r if r < 0.31 => Kind::MultiCommitted,
            _ => Kind::Normal,
        };
        let stream = |rng: &mut StdRng| format!("s-{}", rng.random_range(0..STREAMS));
        let fresh = |rng: &mut StdRng, k: usize| (0..k).map(|_| new_id(rng)).collect::<Vec<_>>();
        let parts = match kind {
            Kind::DuplicateIgnored | Kind::DuplicateFailed => {
                let (s, dup) = mine[rng.random_range(0..mine.len())].clone();
                let k = rng.random_range(0..3);
                let mut ids = fresh(&mut rng, k);
                ids.insert(rng.random_range(0..=ids.len()), dup);
                vec![Part {
                    stream: s,
                    ids,
                    strict: kind == Kind::DuplicateFailed,
                    fail: false,
                }]
            }
            Kind::MultiFailed | Kind::MultiCommitted => {
                let a = stream(&mut rng);
                let mut b = stream(&mut rng);
                while b == a {
                    b = stream(&mut rng);
                }
                let k = rng.random_range(1..4);
                let ids = fresh(&mut rng, k);
                let ids_b = fresh(&mut rng, 1);
                vec![
                    Part {
                        stream: a,
                        ids,
                        strict: false,
                        fail: false,
                    },
                    Part {
                        stream: b,
                        ids: ids_b,
                        strict: false,
                        fail: kind == Kind::MultiFailed,
                    },
                ]
            }
            _ => {
                let k = rng.random_range(1..5);
                vec![Part {
                    stream: stream(&mut rng),
                    ids: fresh(&mut rng, k),
                    strict: false,
                    fail: false,
                }]
            }
        };
        let hold = match kind {
            Kind::Slow { .. } => {
                Some(GAP_TIMEOUT.mul_f64(rng.random_range(B::SLOW_HOLD.0..B::SLOW_HOLD.1)))
            }
            _ => None,
        };
        n += 1;
        let append = Append {
            journal: &journal,
            w,
            n,
            kind,
            parts: &parts,
            hold,
        };
        let attempt = backend.append(c, &append).await;
        let stats = &journal.stats;
        let events = match attempt {
            Attempt::Committed(events) => Some(events),
            Attempt::NotCommitted => None,
            Attempt::Lost => {
                WriterStats::bump(&stats.lost_connection);
                client = None;
                None
            }
            Attempt::Unknown(events) => {
                WriterStats::bump(&stats.lost_connection);
                client = None;
                let committed = backend.resolve(&journal, &events).await;
                WriterStats::bump(if committed {
                    &stats.unknown_committed
                } else {
                    &stats.unknown_not_committed
                });
                committed.then_some(events)
            }
        };
        if let Some(events) = events {
            WriterStats::bump(&stats.appends);
            match kind {
                Kind::Slow { .. } => WriterStats::bump(&stats.slow_committed),
                Kind::DuplicateIgnored => WriterStats::bump(&stats.duplicates_ignored),
                Kind::MultiCommitted => WriterStats::bump(&stats.multi_committed),
                Kind::Rollback | Kind::DuplicateFailed | Kind::MultiFailed => {
                    journal.violation(format!(
                        "writer {w} append {n} ({kind:?}) committed though it was meant to fail"
                    ));
                }
                Kind::Normal => {}
            }
            for e in &events {
                mine.push((e.stream.clone(), e.id));
            }
            if mine.len() > 200 {
                mine.drain(..100);
            }
            journal.acked.lock().unwrap().extend(events);
        }
        let pause = rng.random_range(2..25);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

pub fn new_id(rng: &mut StdRng) -> Uuid {
    uuid::Builder::from_random_bytes(rng.random()).into_uuid()
}

/// What the all-stream subscriber saw.
#[derive(Default)]
pub struct SubscriberLog {
    /// (position, message id) of every event handled, in handling order.
    pub handled: Vec<(i64, Uuid)>,
    pub tombstones: u64,
    pub next: i64,
    /// Longest time spent at one position while later rows existed, and that position.
    pub longest_stall: (Duration, i64),
    pub reconnects: u64,
}

impl SubscriberLog {
    fn stalled(&mut self, at: i64, took: Duration) {
        if took > self.longest_stall.0 {
            self.longest_stall = (took, at);
        }
    }
}

/// An all-stream subscription following Eventuous 0.17's rules (the kit's
/// [`Follower`]) that survives connection loss: it reconnects whenever the
/// server goes.
pub async fn subscriber<B: Backend>(
    backend: Arc<B>,
    log: Arc<Mutex<SubscriberLog>>,
    stop: CancellationToken,
) {
    let mut client: Option<B::Conn> = None;
    let mut follower = Follower::new(B::FIRST);
    while !stop.is_cancelled() {
        let c = match &mut client {
            Some(c) => c,
            None => match backend.connect().await {
                Ok(c) => {
                    log.lock().unwrap().reconnects += 1;
                    client.insert(c)
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let rows = match backend.page(c, follower.next()).await {
            Ok(rows) => rows,
            Err(_) => {
                client = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        {
            let mut l = log.lock().unwrap();
            for row in rows {
                let Offered::Take { waited } = follower.offer(row.position, row.old) else {
                    // A hole with later rows present: wait (GapAgeThresholdMs is an hour).
                    break;
                };
                if let Some((at, took)) = waited {
                    l.stalled(at, took);
                }
                if row.is_tombstone() {
                    l.tombstones += 1;
                } else {
                    l.handled.push((row.position, row.id));
                }
            }
            l.next = follower.next();
            if let Some((at, since)) = follower.stalled() {
                l.stalled(at, since.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The checker's own test, `CHAOS_SPLIT_LEADERS`: each slot its own leader
/// key, so every healer leads at once and the run must fail with "two
/// fillers at once".
pub fn split_leaders() -> bool {
    std::env::var("CHAOS_SPLIT_LEADERS").is_ok()
}

/// One run of the healer binary.
pub struct Instance {
    pub slot: usize,
    pub number: usize,
    process: Process,
    pub started_us: i64,
    /// When it was killed or seen gone (µs since the epoch).
    pub ended_us: Option<i64>,
    pub killed: bool,
    /// Exit status when it ended on its own or after SIGTERM.
    pub exit: Option<ExitStatus>,
    /// Where it serves HTTP, once read from its log.
    addr: Option<SocketAddr>,
}

impl Instance {
    /// `gap-healer run` with the store's flags (or a fleet's `--config`) and
    /// environment, and the chaos run's timings (flags: every store's).
    pub fn start(
        slot: usize,
        number: usize,
        store: &(Vec<String>, Vec<(String, String)>),
    ) -> Instance {
        let mut args: Vec<String> = ["run"].iter().map(|s| s.to_string()).collect();
        args.extend(store.0.iter().cloned());
        args.extend(
            [
                "--metrics-addr",
                "127.0.0.1:0",
                "--log-format",
                "json",
                "--log-level",
                "info,gap_healer=debug",
                "--gap-timeout",
                "1s",
                "--poll-interval",
                "100ms",
                "--lock-timeout",
                "1s",
                "--connect-timeout",
                "2s",
                "--start-from",
                "0",
            ]
            .map(String::from),
        );
        let started_us = now_us();
        let process = Process::spawn(bin::command(&args, store.1.iter().map(|(k, v)| (k, v))))
            .expect("start gap-healer run");
        Instance {
            slot,
            number,
            process,
            started_us,
            ended_us: None,
            killed: false,
            exit: None,
            addr: None,
        }
    }

    /// Where it serves HTTP, once it has said so (`None` before, or when it
    /// never does).
    pub fn addr(&mut self) -> Option<SocketAddr> {
        if self.addr.is_none() && self.ended_us.is_none() {
            self.addr = self.process.listening(Duration::ZERO);
        }
        self.addr
    }

    /// SIGKILL; the leadership it may have had ends now.
    pub fn kill9(&mut self) {
        if self.ended_us.is_none() {
            self.ended_us = Some(now_us());
            self.killed = true;
            self.process.kill();
        }
    }

    /// Notices a process that ended without being told to (a crash).
    pub fn reap(&mut self) -> bool {
        if self.ended_us.is_none() {
            if let Some(status) = self.process.try_wait() {
                self.ended_us = Some(now_us());
                self.exit = Some(status);
                return true;
            }
        }
        false
    }

    /// SIGTERM and wait (10 s at most, then SIGKILL).
    pub fn terminate(&mut self) {
        if self.ended_us.is_none() {
            // One started moments ago (the end restarts the killed ones, and
            // the holes may all be filled 25 ms later) may not have installed
            // its signal handlers yet, and would die of the SIGTERM itself:
            // wait until it listens (handlers come first), up to 20 s.
            if self.addr.is_none() {
                tokio::task::block_in_place(|| self.process.listening(Duration::from_secs(20)));
            }
            let (status, _) = self.process.terminate();
            self.ended_us = Some(now_us());
            self.exit = Some(status);
        }
    }

    pub fn log(&self) -> Vec<String> {
        self.process.lines()
    }

    /// Whether its latest word on leadership is that it became the leader.
    pub fn says_it_leads(&self) -> bool {
        self.process.with_lines(|lines| {
            lines
                .iter()
                .rev()
                .find(|l| {
                    l.contains("\"became the leader") || l.contains("\"stepped down as leader")
                })
                .is_some_and(|l| l.contains("\"became the leader"))
        })
    }

    /// Its log read as leadership intervals and fill attempts: all of it,
    /// or only the lines of one store of a fleet.
    pub fn facts(&self, store: Option<&str>) -> LogFacts {
        let end = self.ended_us.unwrap_or_else(now_us);
        self.process.with_lines(|lines| match store {
            None => gap_healer_testkit::logs::facts(lines, self.number, end),
            Some(store) => gap_healer_testkit::logs::facts_of_store(lines, store, self.number, end),
        })
    }
}

/// Counts per key, for the figures.
pub fn tally<'a>(items: impl IntoIterator<Item = &'a str>) -> Vec<(String, usize)> {
    let mut m: HashMap<&str, usize> = HashMap::new();
    for i in items {
        *m.entry(i).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = m.into_iter().map(|(k, n)| (k.to_string(), n)).collect();
    v.sort();
    v
}
