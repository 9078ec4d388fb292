//! The chaos test's moving parts, whatever the engine: Eventuous-style writers
//! that survive the server restarting, an Eventuous 0.17 all-stream
//! subscriber that survives it too, healer processes of the real binary, and
//! the healers' JSON logs read back as leadership intervals and fill attempts.
//! What differs per engine (SQL, errors, how to restart the server) is a
//! [`Backend`]: `postgres.rs` and `mssql.rs`.
//!
//! Everything here records what it saw; `run.rs` judges it.

use std::collections::HashMap;
use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub const BIN: &str = env!("CARGO_BIN_EXE_gap-healer");
pub const EVENT_TYPE: &str = "ChaosEvent";
pub const TOMBSTONES: &str = "__tombstones__";
pub const TOMBSTONE_TYPE: &str = "$tombstone";
/// The healers' gap_timeout; slow appends are held 0.5 to 3 times this long.
pub const GAP_TIMEOUT: Duration = Duration::from_secs(1);
/// Streams the writers pick from.
const STREAMS: usize = 40;

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

    fn connect(&self) -> impl Future<Output = Result<Self::Conn, String>> + Send;
    /// One append attempt in one transaction, on `c`.
    #[allow(clippy::too_many_arguments)]
    fn append(
        &self,
        c: &mut Self::Conn,
        journal: &Journal,
        w: usize,
        n: u64,
        kind: Kind,
        parts: &[Part],
        hold: Option<Duration>,
    ) -> impl Future<Output = Attempt> + Send;
    /// Whether the events of an append whose COMMIT got no answer are there
    /// (all: true, none: false, some: a violation, reported in `journal`).
    fn resolve(&self, journal: &Journal, events: &[Event]) -> impl Future<Output = bool> + Send;
    /// Up to 500 rows from `next` on, in position order: position, message
    /// id, message type, and whether the row is over an hour old.
    fn page(
        &self,
        c: &mut Self::Conn,
        next: i64,
    ) -> impl Future<Output = Result<Vec<(i64, Uuid, String, bool)>, String>> + Send;
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

/// Calls `connect` every 100 ms (the server may be restarting) until it
/// succeeds; panics with its last error after `limit`.
pub async fn connect_retrying<C, F, Fut>(what: &str, limit: Duration, mut connect: F) -> C
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<C, String>>,
{
    let started = Instant::now();
    loop {
        match connect().await {
            Ok(c) => return c,
            Err(e) if started.elapsed() > limit => {
                panic!("{what} did not answer within {limit:?}: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
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

/// Microseconds since the Unix epoch: the clock the healers' log timestamps use.
pub fn now_us() -> i64 {
    to_us(SystemTime::now())
}

pub fn to_us(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as i64
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
        let kind = match roll {
            r if r < 0.10 => Kind::Rollback,
            r if r < 0.15 => Kind::Slow {
                commit: rng.random_bool(0.75),
            },
            r if r < 0.19 && !mine.is_empty() && B::DUPLICATES_IGNORED => Kind::DuplicateIgnored,
            r if r < 0.19 && !mine.is_empty() => Kind::DuplicateFailed,
            r if r < 0.22 && !mine.is_empty() => Kind::DuplicateFailed,
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
            Kind::Slow { .. } => Some(GAP_TIMEOUT.mul_f64(rng.random_range(0.5..3.0))),
            _ => None,
        };
        n += 1;
        let attempt = backend.append(c, &journal, w, n, kind, &parts, hold).await;
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

/// An all-stream subscription following Eventuous 0.17's rules (as
/// tests/integration/support.rs models it), surviving connection loss: reads
/// pages in position order from the next expected position; stops at a hole
/// until the row after it is an hour old; ignores tombstones.
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

pub async fn subscriber<B: Backend>(
    backend: Arc<B>,
    log: Arc<Mutex<SubscriberLog>>,
    stop: CancellationToken,
) {
    let mut client: Option<B::Conn> = None;
    let mut next: i64 = B::FIRST;
    let mut stalled: Option<(i64, Instant)> = None;
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
        let rows = match backend.page(c, next).await {
            Ok(rows) => rows,
            Err(_) => {
                client = None;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        {
            let mut l = log.lock().unwrap();
            for (position, id, kind, old) in rows {
                if position > next && !old {
                    // A hole with later rows present: wait (GapAgeThresholdMs is an hour).
                    if stalled.map(|(p, _)| p) != Some(next) {
                        stalled = Some((next, Instant::now()));
                    }
                    break;
                }
                if let Some((p, since)) = stalled.take() {
                    let took = since.elapsed();
                    if took > l.longest_stall.0 {
                        l.longest_stall = (took, p);
                    }
                }
                if kind == TOMBSTONE_TYPE {
                    l.tombstones += 1;
                } else {
                    l.handled.push((position, id));
                }
                next = position + 1;
            }
            l.next = next;
            if let Some((p, since)) = stalled {
                if since.elapsed() > l.longest_stall.0 {
                    l.longest_stall = (since.elapsed(), p);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One run of the healer binary.
pub struct Instance {
    pub slot: usize,
    pub number: usize,
    pub child: Option<Child>,
    pub started_us: i64,
    /// When it was killed or seen gone (µs since the epoch).
    pub ended_us: Option<i64>,
    pub killed: bool,
    /// Exit status when it ended on its own or after SIGTERM.
    pub exit: Option<std::process::ExitStatus>,
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl Instance {
    /// `gap-healer run` with the store's flags and environment from the
    /// backend, and the chaos run's timings.
    pub fn start(
        slot: usize,
        number: usize,
        store: &(Vec<String>, Vec<(String, String)>),
    ) -> Instance {
        let mut cmd = Command::new(BIN);
        cmd.arg("run").args(&store.0).args([
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
        ]);
        if std::env::var("CHAOS_SPLIT_LEADERS").is_ok() {
            // The checker's own test: a leader key per slot, so every healer
            // leads at once and the run must fail with "two fillers at once".
            cmd.args(["--leader-key", &format!("chaos-split-{slot}")]);
        }
        for (k, _) in std::env::vars() {
            if k.starts_with("GAP_HEALER_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        cmd.envs(store.1.iter().map(|(k, v)| (k, v)));
        let started_us = now_us();
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gap-healer run");
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Instance {
            slot,
            number,
            child: Some(child),
            started_us,
            ended_us: None,
            killed: false,
            exit: None,
            lines,
        }
    }

    /// SIGKILL; the leadership it may have had ends now.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            self.ended_us = Some(now_us());
            self.killed = true;
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Notices a process that ended without being told to (a crash).
    pub fn reap(&mut self) -> bool {
        if let Some(child) = &mut self.child {
            if let Ok(Some(status)) = child.try_wait() {
                self.ended_us = Some(now_us());
                self.exit = Some(status);
                self.child = None;
                return true;
            }
        }
        false
    }

    /// SIGTERM and wait (10 s at most, then SIGKILL).
    pub fn terminate(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let started = Instant::now();
        let status = loop {
            if let Ok(Some(s)) = child.try_wait() {
                break s;
            }
            if started.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                break child.wait().expect("wait");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        self.ended_us = Some(now_us());
        self.exit = Some(status);
    }

    pub fn log(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `2026-11-30T13:11:20.904869Z` as µs since the epoch (tracing's JSON timestamps).
pub fn parse_timestamp(ts: &str) -> Option<i64> {
    let (date, time) = ts.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<i64>());
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let micros: i64 = format!("{frac:0<6}")[..6].parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + hh * 3_600 + mm * 60 + ss) * 1_000_000) + micros)
}

/// One fill statement a healer ran, from its log: it ran within [start_us, end_us].
#[derive(Clone, Debug)]
pub struct FillAttempt {
    pub instance: usize,
    pub start_us: i64,
    pub end_us: i64,
    pub outcome: String,
    pub rows: u64,
    pub line: String,
}

/// What one instance's log says.
#[derive(Clone, Debug, Default)]
pub struct LogFacts {
    /// Leadership intervals [became, stepped down or ended].
    pub leading: Vec<(i64, i64)>,
    pub fills: Vec<FillAttempt>,
    pub became_leader: usize,
    pub stepped_down: usize,
    pub errors: Vec<String>,
    pub unparsed: usize,
    pub panicked: bool,
}

/// Reads an instance's JSON log into leadership intervals and fill attempts.
/// A fill attempt is any line with an `outcome` and an `ms` field (the fill
/// statement's duration, logged when it returned); it ran within
/// [timestamp - ms - 1 ms, timestamp].
pub fn facts(instance: &Instance) -> LogFacts {
    let mut f = LogFacts::default();
    let end = instance.ended_us.unwrap_or_else(now_us);
    let mut since: Option<i64> = None;
    for line in instance.log() {
        if line.contains("panicked") {
            f.panicked = true;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            f.unparsed += 1;
            continue;
        };
        let Some(ts) = v["timestamp"].as_str().and_then(parse_timestamp) else {
            f.unparsed += 1;
            continue;
        };
        let message = v["message"].as_str().unwrap_or_default();
        if message.starts_with("became the leader") {
            f.became_leader += 1;
            since.get_or_insert(ts);
        } else if message.starts_with("stepped down as leader") {
            f.stepped_down += 1;
            if let Some(s) = since.take() {
                f.leading.push((s, ts));
            }
        }
        if v["level"] == "ERROR" {
            f.errors.push(line.clone());
        }
        if let (Some(outcome), Some(ms)) = (v["outcome"].as_str(), v["ms"].as_u64()) {
            f.fills.push(FillAttempt {
                instance: instance.number,
                start_us: ts - (ms as i64 + 1) * 1_000,
                end_us: ts,
                outcome: outcome.to_string(),
                rows: v["rows"].as_u64().unwrap_or(0),
                line: line.clone(),
            });
        }
    }
    if let Some(s) = since {
        f.leading.push((s, end));
    }
    f
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
