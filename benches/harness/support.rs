//! What every section of the harness shares: the connection, a schema per
//! benchmark (the test kit's [`Store`], plus a one-round-trip append
//! function), concurrent writers, the two kinds of readers, the real
//! `gap-healer` binary with the harness's defaults, `/proc` sampling and
//! percentiles. The Eventuous tables, the subscription rule and the process
//! handling are the test kit's (tests/kit), shared with the tests.
//!
//! Everything runs against the local PostgreSQL (`GAP_HEALER_TEST_PG`, by
//! default `host=127.0.0.1 port=5432 user=postgres dbname=test`).

#![allow(dead_code)]

use std::collections::HashSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use gap_healer_testkit::subscriber::{Follower, Offered};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::Client;

pub use gap_healer_testkit::bin::Daemon;
pub use gap_healer_testkit::eventuous::TOMBSTONE_TYPE;
pub use gap_healer_testkit::pg::{pg_url, Store};
pub use gap_healer_testkit::thousands;

/// Prefix of every schema the harness creates; the pid follows the tag.
pub const SCHEMA_PREFIX: &str = "ghb_";

/// The append function every writer calls: Eventuous's append in one round
/// trip (stream row locked, rows inserted with the identity, Version moved),
/// optionally behind one global advisory lock (seed 003's store), optionally
/// failing after its insert (a rollback that burns its positions).
const APPEND_FN: &str = r#"
CREATE FUNCTION __schema__.bench_append(_stream varchar, _n int, _lock boolean, _fail boolean)
RETURNS bigint LANGUAGE plpgsql AS $fn$
DECLARE
    _id int;
    _version int;
    _last bigint;
BEGIN
    IF _lock THEN
        PERFORM pg_advisory_xact_lock(3003);
    END IF;
    SELECT stream_id, version INTO _id, _version
    FROM __schema__.streams WHERE stream_name = _stream FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO __schema__.streams (stream_name) VALUES (_stream)
        RETURNING stream_id, version INTO _id, _version;
    END IF;
    WITH ins AS (
        INSERT INTO __schema__.messages
            (message_id, message_type, stream_id, stream_position, json_data, created)
        SELECT gen_random_uuid(), 'BenchEvent', _id, _version + g, '{"n": 1}',
               now() AT TIME ZONE 'utc'
        FROM generate_series(1, _n) AS g
        RETURNING global_position
    )
    SELECT max(global_position) INTO _last FROM ins;
    UPDATE __schema__.streams SET version = _version + _n WHERE stream_id = _id;
    IF _fail THEN
        RAISE EXCEPTION 'bench: append rolled back' USING ERRCODE = 'P0001';
    END IF;
    RETURN _last;
END
$fn$;
"#;

/// The application name of every session the harness opens, so its share of
/// the server's CPU can be told from other work on the machine.
pub fn app_name() -> String {
    format!("ghb_{}", std::process::id())
}

/// The application name of the daemons the harness starts.
pub fn healer_app_name() -> String {
    format!("ghb_{}_healer", std::process::id())
}

pub async fn connect() -> Result<Client> {
    gap_healer_testkit::pg::try_connect(&pg_url_named(&app_name()))
        .await
        .with_context(|| format!("PostgreSQL at {}", pg_url()))
}

/// How big a run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// Seconds: proves every section still works (CI).
    Smoke,
    /// At most 10 minutes on a 2-core machine: the figures in docs/benchmarks.md.
    Default,
    /// Longer runs and no extrapolation.
    Full,
}

impl Size {
    pub fn parse(s: &str) -> Option<Size> {
        match s {
            "smoke" => Some(Size::Smoke),
            "default" => Some(Size::Default),
            "full" => Some(Size::Full),
            _ => None,
        }
    }

    /// `smoke`, `default` or `full` value of a knob.
    pub fn pick<T>(self, smoke: T, default: T, full: T) -> T {
        match self {
            Size::Smoke => smoke,
            Size::Default => default,
            Size::Full => full,
        }
    }

    pub fn name(self) -> &'static str {
        self.pick("smoke", "default", "full")
    }
}

/// Drops `ghb_*` schemas left by harness runs whose process is gone (a run
/// that was killed); schemas of a run still going are left alone.
pub async fn drop_stale_schemas(client: &Client) -> Result<()> {
    let rows = client
        .query(
            "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'ghb\\_%'",
            &[],
        )
        .await?;
    for row in rows {
        let name: String = row.get(0);
        let pid = name.rsplit('_').next().and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                .await?;
        }
    }
    Ok(())
}

/// One benchmark's store: its own schema `ghb_<tag>_<pid>` with the Eventuous
/// tables and the append function, on a session named [`app_name`]. Drop it
/// with [`Store::try_drop_schema`].
pub async fn bench_store(tag: &str) -> Result<Store> {
    let client = connect().await?;
    let name = format!("{SCHEMA_PREFIX}{tag}_{}", std::process::id());
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
        .await?;
    let store = Store::create(client, &pg_url(), &name)
        .await
        .context("create the Eventuous schema")?;
    store
        .client
        .batch_execute(&APPEND_FN.replace("__schema__", &name))
        .await
        .context("create the append function")?;
    Ok(store)
}

/// Appends `n` events to `stream` through the append function and commits;
/// the last position.
pub async fn bench_append(store: &Store, stream: &str, n: i32) -> Result<i64> {
    let row = store
        .client
        .query_one(
            &format!("SELECT {}.bench_append($1, $2, false, false)", store.schema),
            &[&stream, &n],
        )
        .await?;
    Ok(row.get(0))
}

/// Positions of every committed event that is not a tombstone.
pub async fn event_positions(store: &Store) -> Result<Vec<i64>> {
    let s = &store.schema;
    Ok(store
        .client
        .query(
            &format!(
                "SELECT global_position FROM {s}.messages WHERE message_type <> $1 ORDER BY 1"
            ),
            &[&TOMBSTONE_TYPE],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

pub async fn tombstone_count(store: &Store) -> Result<i64> {
    let s = &store.schema;
    Ok(store
        .client
        .query_one(
            &format!("SELECT COUNT(*) FROM {s}.messages WHERE message_type = $1"),
            &[&TOMBSTONE_TYPE],
        )
        .await?
        .get(0))
}

/// What the writers do.
#[derive(Clone, Debug)]
pub struct Workload {
    pub writers: usize,
    /// Events per append, inclusive bounds.
    pub batch: (i32, i32),
    /// Share of appends that fail after their insert (their positions burn).
    pub rollback: f64,
    /// Share of appends that keep their transaction open `hold` after inserting.
    pub slow: f64,
    pub hold: Duration,
    /// Seed 003's global `pg_advisory_xact_lock`, and where it is taken.
    pub lock: AppendLock,
    /// Pause between two appends of one writer (`None`: as fast as it can).
    pub pace: Option<Duration>,
    /// Record (last position, commit time on the database clock) per commit.
    pub record_commits: bool,
    /// Events committed so far by all writers, for measuring windows of a run.
    pub progress: Option<Arc<AtomicU64>>,
    /// Run in each writer's session first (e.g. `SET commit_delay`).
    pub session_sql: Option<&'static str>,
}

impl Workload {
    /// 8 writers, batches of 1 to 5 events, 1 % rollbacks, as fast as they can.
    pub fn eight_writers() -> Workload {
        Workload {
            writers: 8,
            batch: (1, 5),
            rollback: 0.01,
            slow: 0.0,
            hold: Duration::ZERO,
            lock: AppendLock::None,
            pace: None,
            record_commits: false,
            progress: None,
            session_sql: None,
        }
    }
}

/// Seed 003's one lock for every append of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendLock {
    /// Appends run in parallel (Eventuous).
    None,
    /// Taken first thing inside the one-round-trip append function: the
    /// shortest hold this design allows.
    InAppend,
    /// Taken by a statement of its own in the append's transaction, as seed
    /// 003's code does: held over the lock's reply, the append and the commit.
    Statement,
}

/// What the writers did.
#[derive(Clone, Debug, Default)]
pub struct Written {
    pub appends: u64,
    pub events: u64,
    pub rollbacks: u64,
    pub slow: u64,
    pub elapsed: Duration,
    /// (highest position of the append, seconds since the epoch on the
    /// database clock just after its commit), when recorded.
    pub commits: Vec<(i64, f64)>,
}

impl Written {
    pub fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64()
    }
    pub fn appends_per_sec(&self) -> f64 {
        self.appends as f64 / self.elapsed.as_secs_f64()
    }
    fn add(&mut self, o: Written) {
        self.appends += o.appends;
        self.events += o.events;
        self.rollbacks += o.rollbacks;
        self.slow += o.slow;
        self.commits.extend(o.commits);
    }
}

/// Runs `w.writers` writers, each on its own connection and its own streams,
/// until `stop` is set; returns their totals.
pub async fn write(schema: &str, w: &Workload, stop: Arc<AtomicBool>) -> Result<Written> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for id in 0..w.writers {
        let client = connect().await?;
        let schema = schema.to_string();
        let w = w.clone();
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            writer(client, &schema, id, &w, &stop).await
        }));
    }
    let mut total = Written::default();
    for t in tasks {
        total.add(t.await??);
    }
    total.elapsed = started.elapsed();
    Ok(total)
}

async fn writer(
    client: Client,
    schema: &str,
    id: usize,
    w: &Workload,
    stop: &AtomicBool,
) -> Result<Written> {
    if let Some(sql) = w.session_sql {
        client.batch_execute(sql).await?;
    }
    let append = client
        .prepare(&format!(
            "SELECT {schema}.bench_append($1::varchar, $2::int, $3::boolean, $4::boolean)"
        ))
        .await?;
    let clock = client
        .prepare("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")
        .await?;
    let lock = client.prepare("SELECT pg_advisory_xact_lock(3003)").await?;
    let in_append = w.lock == AppendLock::InAppend;
    let mut rng = StdRng::seed_from_u64(0x5eed + id as u64);
    let mut out = Written::default();
    let (yes, no) = (true, false);
    while !stop.load(Ordering::Relaxed) {
        let stream = format!("w{id}-{}", rng.random_range(0..50));
        let n = rng.random_range(w.batch.0..=w.batch.1);
        let roll: f64 = rng.random();
        let fail = roll < w.rollback;
        let slow = !fail && roll < w.rollback + w.slow;
        let explicit = slow || w.lock == AppendLock::Statement;
        if explicit {
            client.batch_execute("BEGIN").await?;
            if w.lock == AppendLock::Statement {
                client.query_one(&lock, &[]).await?;
            }
        }
        let flag = if fail { &yes } else { &no };
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&stream, &n, &in_append, flag];
        let committed: Option<(i64, f64)> = if fail {
            match client.query_one(&append, &params).await {
                Err(e) if e.code().is_some_and(|c| c.code() == "P0001") => {}
                Err(e) => return Err(e.into()),
                Ok(_) => bail!("the failing append committed"),
            }
            if explicit {
                client.batch_execute("ROLLBACK").await?;
            }
            out.rollbacks += 1;
            None
        } else if explicit {
            let row = client.query_one(&append, &params).await?;
            if slow {
                tokio::time::sleep(w.hold).await;
                out.slow += 1;
            }
            // Pipelined: the clock is read right after the commit.
            let (commit, at) = tokio::join!(
                client.batch_execute("COMMIT"),
                client.query_one(&clock, &[])
            );
            commit?;
            Some((row.get(0), at?.get(0)))
        } else {
            // Pipelined: the clock is read right after the implicit commit.
            let (row, at) = tokio::join!(
                client.query_one(&append, &params),
                client.query_one(&clock, &[])
            );
            Some((row?.get(0), at?.get(0)))
        };
        if let Some(commit) = committed {
            out.appends += 1;
            out.events += n as u64;
            if let Some(p) = &w.progress {
                p.fetch_add(n as u64, Ordering::Relaxed);
            }
            if w.record_commits {
                out.commits.push(commit);
            }
        }
        if let Some(p) = w.pace {
            tokio::time::sleep(p).await;
        }
    }
    Ok(out)
}

/// A reader without gap handling: `global_position > last_seen`, as seed
/// 003's projections read. Returns the event positions it saw.
pub async fn naive_reader(schema: String, stop: Arc<AtomicBool>) -> Result<HashSet<i64>> {
    let client = connect().await?;
    let page = client
        .prepare(&format!(
            "SELECT global_position, message_type::text FROM {schema}.messages
             WHERE global_position > $1 ORDER BY global_position LIMIT 1000"
        ))
        .await?;
    let mut last = 0i64;
    let mut seen = HashSet::new();
    let mut final_polls = 0;
    loop {
        let rows = client.query(&page, &[&last]).await?;
        for r in &rows {
            let p: i64 = r.get(0);
            let kind: String = r.get(1);
            if kind != TOMBSTONE_TYPE {
                seen.insert(p);
            }
            last = p;
        }
        if rows.len() < 1000 {
            if stop.load(Ordering::Relaxed) {
                final_polls += 1;
                if final_polls >= 3 {
                    return Ok(seen);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// What an Eventuous-rules reader did.
#[derive(Clone, Debug, Default)]
pub struct Followed {
    pub handled: HashSet<i64>,
    pub tombstones_ignored: u64,
    /// How long it stood at each hole before moving on.
    pub stops: Vec<Duration>,
    /// The next position it expected when it ended.
    pub next: i64,
    /// It reached `until` before its deadline.
    pub caught_up: bool,
}

/// An all-stream subscription following Eventuous 0.17's rules (the kit's
/// [`Follower`]): reads in position order from the next expected position; at
/// a hole it stops and re-reads later (it would skip only once the row after
/// the hole is an hour old); it ignores `$tombstone` rows. After `stop` it
/// goes on until it has handled everything up to the head read then, or
/// until `deadline` after stop.
pub async fn eventuous_reader(
    schema: String,
    stop: Arc<AtomicBool>,
    deadline: Duration,
) -> Result<Followed> {
    let client = connect().await?;
    let page = client
        .prepare(&format!(
            "SELECT global_position, message_type::text,
                    created < (now() AT TIME ZONE 'utc') - interval '1 hour'
             FROM {schema}.messages WHERE global_position >= $1
             ORDER BY global_position LIMIT 500"
        ))
        .await?;
    let head = client
        .prepare(&format!(
            "SELECT COALESCE(MAX(global_position), 0) FROM {schema}.messages"
        ))
        .await?;
    let mut out = Followed::default();
    let mut follower = Follower::new(1);
    let mut until: Option<(i64, Instant)> = None;
    loop {
        if until.is_none() && stop.load(Ordering::Relaxed) {
            let h: i64 = client.query_one(&head, &[]).await?.get(0);
            until = Some((h, Instant::now() + deadline));
        }
        let rows = client.query(&page, &[&follower.next()]).await?;
        let mut stopped_at_hole = false;
        for r in &rows {
            let (p, kind, old): (i64, String, bool) = (r.get(0), r.get(1), r.get(2));
            let Offered::Take { waited } = follower.offer(p, old) else {
                stopped_at_hole = true;
                break;
            };
            if let Some((_, took)) = waited {
                out.stops.push(took);
            }
            if kind == TOMBSTONE_TYPE {
                out.tombstones_ignored += 1;
            } else {
                out.handled.insert(p);
            }
        }
        out.next = follower.next();
        if let Some((h, end)) = until {
            if out.next > h {
                out.caught_up = true;
                return Ok(out);
            }
            if Instant::now() >= end {
                return Ok(out);
            }
        }
        if stopped_at_hole || rows.len() < 500 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The real `gap-healer run` on `schema` with `--gap-timeout 1s
/// --poll-interval 250ms --start-from 0 --log-format json
/// --no-leader-election` and the defaults otherwise (its sessions named
/// [`healer_app_name`]), its log kept to the newest 20,000 lines or so;
/// `flags` replace or add `--key value` pairs.
pub fn start_healer(schema: &str, flags: &[(&str, &str)]) -> Result<Daemon> {
    let url = pg_url_named(&healer_app_name());
    let mut pairs: Vec<(&str, &str)> = vec![
        ("--engine", "postgres"),
        ("--connection-string", &url),
        ("--schema", schema),
        ("--gap-timeout", "1s"),
        ("--poll-interval", "250ms"),
        ("--metrics-addr", "127.0.0.1:0"),
        ("--start-from", "0"),
        ("--log-format", "json"),
    ];
    for (k, v) in flags {
        match pairs.iter_mut().find(|(key, _)| key == k) {
            Some(pair) => pair.1 = v,
            None => pairs.push((k, v)),
        }
    }
    let mut args = vec!["run".to_string(), "--no-leader-election".to_string()];
    for (k, v) in pairs {
        args.push(k.to_string());
        args.push(v.to_string());
    }
    Daemon::try_spawn(&args, &[], 20_000)
}

/// A process's memory and CPU from /proc.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcSample {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
}

pub fn proc_sample(pid: u32) -> Result<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is field 3,
    // utime field 14, stime field 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow!("odd /proc/{pid}/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
    let stime: u64 = fields.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok(ProcSample {
        rss_kib: kib("VmRSS:"),
        hwm_kib: kib("VmHWM:"),
        cpu_ticks: utime + stime,
    })
}

/// Clock ticks per second of /proc's CPU times.
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The `q` quantile (0..=1) of sorted values, nearest rank.
pub fn quantile<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

pub fn ms(d: Duration) -> String {
    let v = d.as_secs_f64() * 1e3;
    if v >= 100.0 {
        format!("{v:.0} ms")
    } else if v >= 1.0 {
        format!("{v:.1} ms")
    } else {
        format!("{:.0} µs", v * 1e3)
    }
}

pub fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// What a section contributes to the report.
#[derive(Debug, Default)]
pub struct Report {
    /// (what, figure, target, verdict) rows of the summary table.
    pub summary: Vec<[String; 4]>,
    /// Markdown blocks with the details, in order.
    pub details: Vec<String>,
    /// Sections that failed once and were run again, with the first error.
    pub retried: Vec<String>,
}

impl Report {
    pub fn row(&mut self, what: &str, figure: String, target: &str, met: Option<bool>) {
        let verdict = match met {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "",
        };
        self.row_with(what, figure, target, verdict);
    }

    /// A row whose figure cannot decide its target (its spread is wider
    /// than the effect): neither met nor missed.
    pub fn row_unsettled(&mut self, what: &str, figure: String, target: &str) {
        self.row_with(what, figure, target, "not settled");
    }

    fn row_with(&mut self, what: &str, figure: String, target: &str, verdict: &str) {
        self.summary.push([
            what.to_string(),
            figure,
            target.to_string(),
            verdict.to_string(),
        ]);
    }

    pub fn detail(&mut self, block: String) {
        println!("{block}");
        self.details.push(block);
    }
}

/// The 1-minute load average (other work on the machine shows here).
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// (busy, total) jiffies of all CPUs since boot, from /proc/stat.
pub fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = fields.iter().take(8).sum();
    // idle and iowait
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Share of all CPUs busy between two [`cpu_jiffies`] samples, in %.
pub fn busy_pct(before: (u64, u64), after: (u64, u64)) -> f64 {
    let total = after.1.saturating_sub(before.1).max(1);
    after.0.saturating_sub(before.0) as f64 / total as f64 * 100.0
}

/// `pg_url()` with an application name, so the daemon's sessions can be found.
pub fn pg_url_named(app: &str) -> String {
    gap_healer_testkit::pg::named(&pg_url(), app)
}

/// `pg_url_named(app)` with server `options` (e.g. `-c jit=off`).
pub fn pg_url_with(app: &str, options: &str) -> String {
    gap_healer_testkit::pg::with_param(&pg_url_named(app), "options", options)
}

/// CPU ticks used so far by the server sessions named `app`.
pub async fn session_ticks(client: &Client, app: &str) -> Result<u64> {
    let pids: Vec<i32> = client
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(pids
        .iter()
        .filter_map(|p| proc_sample(*p as u32).ok())
        .map(|s| s.cpu_ticks)
        .sum())
}

/// Where the machine's CPU went during a measurement, in cores.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuUse {
    /// All CPUs' busy time.
    pub busy: f64,
    /// The harness process, the processes it was given (daemons), and the
    /// server sessions named [`app_name`] or [`healer_app_name`].
    pub ours: f64,
    /// The rest: other work on the machine, plus the server's own background
    /// processes (WAL writer, checkpointer) working for everyone.
    pub other: f64,
}

/// Samples CPU use every 250 ms until [`CpuWatch::finish`].
pub struct CpuWatch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<CpuUse>>,
}

impl CpuWatch {
    pub async fn start(procs: Vec<u32>) -> Result<CpuWatch> {
        let client = connect().await?;
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let started = Instant::now();
                let jiffies0 = cpu_jiffies();
                // pid -> (ticks when first seen, ticks when last seen)
                let mut seen: std::collections::HashMap<u32, (u64, u64)> =
                    std::collections::HashMap::new();
                let names = [app_name(), healer_app_name()];
                loop {
                    let done = stop.load(Ordering::Relaxed);
                    let rows = client
                        .query(
                            "SELECT pid FROM pg_stat_activity WHERE application_name = ANY($1)",
                            &[&names.as_slice()],
                        )
                        .await?;
                    let pids = rows
                        .iter()
                        .map(|r| r.get::<_, i32>(0) as u32)
                        .chain(procs.iter().copied())
                        .chain([std::process::id()]);
                    for pid in pids {
                        if let Ok(s) = proc_sample(pid) {
                            seen.entry(pid).or_insert((s.cpu_ticks, s.cpu_ticks)).1 = s.cpu_ticks;
                        }
                    }
                    if done {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                let secs = started.elapsed().as_secs_f64();
                let jiffies1 = cpu_jiffies();
                let tck = clock_ticks();
                let busy = jiffies1.0.saturating_sub(jiffies0.0) as f64 / tck / secs;
                let ours = seen.values().map(|(a, b)| b - a).sum::<u64>() as f64 / tck / secs;
                Ok(CpuUse {
                    busy,
                    ours,
                    other: (busy - ours).max(0.0),
                })
            }
        });
        Ok(CpuWatch { stop, task })
    }

    pub async fn finish(self) -> Result<CpuUse> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await?
    }
}
