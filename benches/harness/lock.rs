//! Section 5: the append-lock comparison on seed 003's own table
//! (`tests/fixtures/ledger_core_postgres.sql`), 8 writers appending small
//! batches the way seed 003's `AppendAsync` does (read the stream's version,
//! compare it with the expected one, insert the batch, commit):
//! (a) each append first takes seed 003's global lock in a statement of its
//!     own (`SELECT pg_advisory_xact_lock(key)`), read by a naive reader
//!     (`position > @after ORDER BY position`);
//! (b) the same appends without the lock, the real binary healing the table
//!     (`--profile ledger-core`) and publishing its watermark, read by the
//!     naive reader with the watermark predicate
//!     (`AND position <= (SELECT position FROM <watermarks> WHERE store = 'default')`);
//! (c) in the same run as (b), under the same load, the naive reader without
//!     the predicate: what holes that commit late cost it.
//!
//! Each reader records when it returned every event (the database clock) and
//! each writer when its append committed (the database clock, read in the
//! statement pipelined right after COMMIT): their difference is the reader's
//! delay behind the head.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gap_healer_testkit::ledger::{APPEND_LOCK_KEY, TOMBSTONE_CATEGORY};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_postgres::Client;
use uuid::Uuid;

use crate::support::*;

/// Seed 003's table, in a schema of the harness's own.
const LEDGER_SQL: &str = include_str!("../../tests/fixtures/ledger_core_postgres.sql");

/// The healer's timing in (b): a hole is filled `GAP_TIMEOUT` after it is
/// first seen, and the watermark published in the loop turn after it moves.
const GAP_TIMEOUT: &str = "250ms";
const POLL_INTERVAL: &str = "50ms";

/// The workloads the designs are compared under.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Batches of 1-5 events, 1 % rolled back after their insert.
    Fast,
    /// And 1 % of appends held open 100 ms after inserting.
    Slow,
    /// Fast, with every commit's WAL flush taking 1 ms more.
    SlowFlush,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Fast => "fast",
            Kind::Slow => "1 % held open 100 ms",
            Kind::SlowFlush => "fast, 1 ms flush (emulated)",
        }
    }
}

/// What the writers do.
#[derive(Clone)]
struct Load {
    writers: usize,
    /// Seed 003's global advisory lock, as a statement of its own.
    lock: bool,
    rollback: f64,
    slow: f64,
    hold: Duration,
    session_sql: Option<&'static str>,
}

/// What the writers did.
#[derive(Default)]
struct Appended {
    appends: u64,
    events: u64,
    rollbacks: u64,
    elapsed: Duration,
    /// Event position -> its append's commit, seconds since the epoch on the
    /// database clock.
    committed: HashMap<i64, f64>,
}

/// What a reader returned: event position -> when (database clock).
#[derive(Default)]
struct Read {
    returned: HashMap<i64, f64>,
    /// It reached the head read after the writers stopped.
    caught_up: bool,
}

/// A reader's verdict over one run.
#[derive(Default)]
struct Judged {
    lost: usize,
    /// Seconds from commit to being returned, one per event returned.
    delays: Vec<f64>,
    behind_at_end: bool,
}

fn judge(a: &Appended, r: &Read) -> Judged {
    let mut j = Judged {
        behind_at_end: !r.caught_up,
        ..Judged::default()
    };
    for (p, committed) in &a.committed {
        match r.returned.get(p) {
            // The commit time is read just after COMMIT returns, so a reader
            // may return the event a little before it: counted as 0.
            Some(at) => j.delays.push((at - committed).max(0.0)),
            None => j.lost += 1,
        }
    }
    j
}

struct Outcome {
    appended: Appended,
    /// (a)'s reader, or (b)'s bounded one.
    reader: Judged,
    /// (c): the naive reader in (b)'s run.
    naive: Option<Judged>,
    tombstones: i64,
    cpu: CpuUse,
}

/// One design's runs, added up.
#[derive(Default)]
struct Totals {
    appends: u64,
    events: u64,
    rollbacks: u64,
    secs: f64,
    reader: Judged,
    naive: Option<Judged>,
    tombstones: i64,
    other: f64,
}

impl Totals {
    fn add(&mut self, o: Outcome) {
        let secs = o.appended.elapsed.as_secs_f64();
        self.appends += o.appended.appends;
        self.events += o.appended.events;
        self.rollbacks += o.appended.rollbacks;
        self.secs += secs;
        self.tombstones += o.tombstones;
        self.other += o.cpu.other * secs;
        merge(&mut self.reader, o.reader);
        if let Some(n) = o.naive {
            merge(self.naive.get_or_insert_with(Judged::default), n);
        }
    }
    fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.secs
    }
}

fn merge(into: &mut Judged, j: Judged) {
    into.lost += j.lost;
    into.delays.extend(j.delays);
    into.behind_at_end |= j.behind_at_end;
}

/// p50 / p99 / max of a reader's delays.
fn delays(j: &mut Judged) -> (String, String, String) {
    j.delays.sort_by(|a, b| a.total_cmp(b));
    let f = |q: f64| {
        quantile(&j.delays, q)
            .map(|s| ms(Duration::from_secs_f64(s)))
            .unwrap_or_else(|| "-".into())
    };
    (f(0.5), f(0.99), f(1.0))
}

pub async fn run(size: Size, report: &mut Report) -> Result<()> {
    let duration = size.pick(
        Duration::from_secs(2),
        Duration::from_secs(8),
        Duration::from_secs(15),
    );
    let rounds = size.pick(1, 2, 3);
    let workloads: Vec<Kind> = size.pick(
        vec![Kind::Fast, Kind::Slow],
        vec![Kind::Fast, Kind::Slow, Kind::SlowFlush],
        vec![Kind::Fast, Kind::Slow, Kind::SlowFlush],
    );
    let mut table = String::from(
        "| appends | design | appends/s | events/s | rolled back | tombstones | reader | events never returned | reader delay p50 | p99 | max | other work (cores) |\n\
         |---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n",
    );
    let (mut lost_a, mut lost_b) = (0usize, 0usize);
    let mut lost_c: Vec<String> = Vec::new();
    let mut behind = false;
    for kind in workloads {
        let label = kind.label();
        let base = Load {
            writers: 8,
            lock: false,
            rollback: 0.01,
            slow: if kind == Kind::Slow { 0.01 } else { 0.0 },
            hold: Duration::from_millis(100),
            // Every WAL flush first waits 1 ms (the group's leader sleeps,
            // later commits join its flush): a 1 ms storage flush, where
            // this machine's takes 0.09 ms.
            session_sql: (kind == Kind::SlowFlush)
                .then_some("SET commit_siblings = 0; SET commit_delay = 1000"),
        };
        let mut totals = [Totals::default(), Totals::default()];
        // The designs interleaved round by round, so background load falls on both.
        for _ in 0..rounds {
            for (i, lock) in [true, false].into_iter().enumerate() {
                let load = Load {
                    lock,
                    ..base.clone()
                };
                let schema = ledger_schema().await?;
                let result = measure(&schema, &load, duration).await;
                drop_schema(&schema).await?;
                let o = result?;
                println!(
                    "lock comparison, {label}, {}: {:.0} events/s, reader lost {}, naive reader lost {}, tombstones {}",
                    if lock { "(a) global lock" } else { "(b) parallel + healer" },
                    o.appended.events as f64 / o.appended.elapsed.as_secs_f64(),
                    o.reader.lost,
                    o.naive.as_ref().map_or("-".into(), |n| n.lost.to_string()),
                    o.tombstones,
                );
                totals[i].add(o);
            }
        }
        let [mut a, mut b] = totals;
        let (mut ra, mut rb) = (std::mem::take(&mut a.reader), std::mem::take(&mut b.reader));
        let mut rc = b.naive.take().unwrap_or_default();
        lost_a += ra.lost;
        lost_b += rb.lost;
        behind |= ra.behind_at_end || rb.behind_at_end;
        lost_c.push(format!(
            "{label}: {} of {}",
            rc.lost,
            thousands((rc.delays.len() + rc.lost) as u64)
        ));
        let (da, db, dc) = (delays(&mut ra), delays(&mut rb), delays(&mut rc));
        let rows = [
            (
                "(a) global lock, own statement (seed 003)",
                &a,
                "naive",
                &ra,
                &da,
            ),
            (
                "(b) parallel + gap-healer",
                &b,
                "naive + watermark",
                &rb,
                &db,
            ),
            ("(c) (b)'s run", &b, "naive, no watermark", &rc, &dc),
        ];
        for (design, t, reader, j, (p50, p99, max)) in rows {
            let same = design.starts_with("(c)");
            let fig = |v: String| if same { "same run".to_string() } else { v };
            table.push_str(&format!(
                "| {label} | {design} | {} | {} | {} | {} | {reader} | {} of {}{} | {p50} | {p99} | {max} | {} |\n",
                fig(format!("{:.0}", t.appends as f64 / t.secs)),
                fig(format!("{:.0}", t.events_per_sec())),
                fig(t.rollbacks.to_string()),
                fig(t.tombstones.to_string()),
                j.lost,
                thousands((j.delays.len() + j.lost) as u64),
                if j.behind_at_end { " (behind at the end)" } else { "" },
                fig(format!("{:.2}", t.other / t.secs)),
            ));
        }
        let (ea, eb) = (a.events_per_sec(), b.events_per_sec());
        report.row(
            &format!(
                "5. throughput (b) parallel + healer / (a) global lock, seed 003's table, {label}"
            ),
            format!("{eb:.0} / {ea:.0} events/s = {:.1}x", eb / ea),
            if kind == Kind::Slow { "≥ 3x" } else { "" },
            (kind == Kind::Slow).then_some(eb / ea >= 3.0),
        );
        report.row(
            &format!("5. reader delay p99 behind the commit, {label}: (a) / (b) / (c)"),
            format!("{} / {} / {}", da.1, db.1, dc.1),
            "",
            None,
        );
    }
    report.row(
        "5. events lost: (a) lock + naive reader / (b) healer + watermark reader / (c) naive reader under (b)",
        format!("{lost_a} / {lost_b} / {}", lost_c.join("; ")),
        "(a), (b): 0",
        Some(lost_a == 0 && lost_b == 0 && !behind),
    );
    report.detail(format!(
        "### 5. The append-lock comparison on seed 003's table\n\n\
         Seed 003's `events` table (`tests/fixtures/ledger_core_postgres.sql`), 8 writers, each on \
         its own connection and 50 streams of its own, appending batches of 1-5 events as seed \
         003's `AppendAsync` does: in one transaction, read the stream's version \
         (`max(version)`), compare it with the expected one, insert the batch \
         (`RETURNING position`), commit; BEGIN goes out with the first statement, as Npgsql \
         sends it. 1 % of appends roll back after their insert; the second workload also keeps \
         1 % of appends open 100 ms after their insert (a slow client or network); the third is \
         the first with every WAL flush delayed 1 ms (`commit_siblings = 0`, `commit_delay = \
         1000` in the writers' sessions), to show storage slower than this machine's (fdatasync \
         0.09 ms). {runs} of {dur} per design and workload, the designs interleaved, a fresh \
         schema per run.\n\n\
         (a): every append first runs `SELECT pg_advisory_xact_lock({key})`, a statement of its \
         own, as seed 003's code does, so the lock is held over its reply, the version read, the \
         insert and the commit; its reader is the naive one \
         (`WHERE position > $1 ORDER BY position LIMIT 1000`, polling every 5 ms when it gets \
         less than a page). (b): the same appends without the lock; the release binary \
         (`run --profile ledger-core --watermark-table <schema>.watermarks --gap-timeout \
         {GAP_TIMEOUT} --poll-interval {POLL_INTERVAL} --no-leader-election`, the table created \
         from `gap-healer sql --watermark-table` output) fills holes with `$gap` tombstones and \
         publishes the watermark; its reader is the same query with `AND position <= (SELECT \
         position FROM <schema>.watermarks WHERE store = 'default')`. (c): in (b)'s runs, beside \
         (b)'s reader, the naive reader without the predicate; its throughput is (b)'s (the load \
         (b) is measured under includes both readers and the daemon).\n\n\
         Events never returned: committed events (tombstones excluded) that the reader had not \
         returned once the writers had stopped and it had read up to the head (the highest \
         committed position then; (b)'s reader waits up to 10 s for the watermark to reach it). \
         Reader delay: for every event a reader returned, the database clock when the reader's \
         query produced its row (`clock_timestamp()` in the select list) minus its append's \
         commit time (the database clock read in the statement the writer pipelines right after \
         COMMIT, so the delay is understated by up to one round trip; negative values count as \
         0); it includes the reader's 5 ms idle poll. In (b), a rolled-back hole holds the \
         watermark for gap_timeout plus up to a poll interval until its tombstone commits, and \
         at 1 % rollbacks a hole is almost always pending: (b)'s delay is the gap_timeout's \
         price and moves with it. Other work: the CPU the machine spent beyond the harness, its \
         sessions and the daemon, in cores.\n\n{table}",
        key = APPEND_LOCK_KEY,
        dur = secs(duration),
        runs = if rounds == 1 {
            "One run".to_string()
        } else {
            format!("{rounds} runs")
        },
    ));
    Ok(())
}

/// `ghb_lock_<pid>` with seed 003's table and a watermark table made from
/// `gap-healer sql --watermark-table` output.
async fn ledger_schema() -> Result<String> {
    let client = connect().await?;
    let schema = format!("{SCHEMA_PREFIX}lock_{}", std::process::id());
    client
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await?;
    client
        .batch_execute(&LEDGER_SQL.replace("__schema__", &schema))
        .await
        .context("create seed 003's table")?;
    let table = format!("{schema}.watermarks");
    let url = pg_url();
    let out = gap_healer_testkit::bin::cli(
        &[
            "sql",
            "--engine",
            "postgres",
            "--connection-string",
            &url,
            "--schema",
            &schema,
            "--profile",
            "ledger-core",
            "--watermark-table",
            &table,
        ],
        &[],
    );
    if out.code != 0 {
        bail!("gap-healer sql --watermark-table: {}", out.all());
    }
    // Its GRANTs name the daemon's role, which the bench server lacks.
    let ddl: String = out
        .stdout
        .lines()
        .filter(|l| !l.starts_with("GRANT") && !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let start = ddl
        .find("CREATE TABLE")
        .context("no watermark table in `gap-healer sql` output")?;
    client
        .batch_execute(&ddl[start..])
        .await
        .context("create the watermark table")?;
    Ok(schema)
}

async fn drop_schema(schema: &str) -> Result<()> {
    connect()
        .await?
        .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
        .await?;
    Ok(())
}

async fn measure(schema: &str, load: &Load, duration: Duration) -> Result<Outcome> {
    let watermarks = format!("{schema}.watermarks");
    let mut daemon = if load.lock {
        None
    } else {
        Some(start_healer(
            schema,
            &[
                ("--profile", "ledger-core"),
                ("--watermark-table", &watermarks),
                ("--gap-timeout", GAP_TIMEOUT),
                ("--poll-interval", POLL_INTERVAL),
            ],
        )?)
    };
    let (write_stop, read_stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let head: Arc<std::sync::Mutex<Option<i64>>> = Arc::default();
    let reader = tokio::spawn(reader(
        schema.to_string(),
        (!load.lock).then(|| watermarks.clone()),
        read_stop.clone(),
        head.clone(),
    ));
    let naive = (!load.lock).then(|| {
        tokio::spawn(self::reader(
            schema.to_string(),
            None,
            read_stop.clone(),
            head.clone(),
        ))
    });
    let watch = CpuWatch::start(daemon.iter().map(|d| d.pid()).collect()).await?;
    let writers = tokio::spawn({
        let (schema, stop, load) = (schema.to_string(), write_stop.clone(), load.clone());
        async move { write(&schema, &load, stop).await }
    });
    tokio::time::sleep(duration).await;
    write_stop.store(true, Ordering::Relaxed);
    let appended = writers.await??;
    let cpu = watch.finish().await?;
    // Every append has ended: the readers go on up to the head as it is now.
    let client = connect().await?;
    let top: i64 = client
        .query_one(
            &format!("SELECT COALESCE(MAX(position), 0) FROM {schema}.events"),
            &[],
        )
        .await?
        .get(0);
    *head.lock().unwrap() = Some(top);
    read_stop.store(true, Ordering::Relaxed);
    let read = reader.await??;
    let naive_read = match naive {
        Some(t) => Some(t.await??),
        None => None,
    };
    let tombstones: i64 = client
        .query_one(
            &format!("SELECT COUNT(*) FROM {schema}.events WHERE stream_category = $1"),
            &[&TOMBSTONE_CATEGORY],
        )
        .await?
        .get(0);
    if let Some(d) = daemon.take() {
        d.terminate();
    }
    Ok(Outcome {
        reader: judge(&appended, &read),
        naive: naive_read.map(|r| judge(&appended, &r)),
        appended,
        tombstones,
        cpu,
    })
}

/// Runs `load.writers` writers until `stop` is set.
async fn write(schema: &str, load: &Load, stop: Arc<AtomicBool>) -> Result<Appended> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for id in 0..load.writers {
        let client = connect().await?;
        let (schema, load, stop) = (schema.to_string(), load.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            writer(client, &schema, id, &load, &stop).await
        }));
    }
    let mut total = Appended::default();
    for t in tasks {
        let w = t.await??;
        total.appends += w.appends;
        total.events += w.events;
        total.rollbacks += w.rollbacks;
        total.committed.extend(w.committed);
    }
    total.elapsed = started.elapsed();
    Ok(total)
}

/// One writer: seed 003's append, on streams of its own.
async fn writer(
    client: Client,
    schema: &str,
    id: usize,
    load: &Load,
    stop: &AtomicBool,
) -> Result<Appended> {
    if let Some(sql) = load.session_sql {
        client.batch_execute(sql).await?;
    }
    let lock = client.prepare("SELECT pg_advisory_xact_lock($1)").await?;
    let version = client
        .prepare(&format!(
            "SELECT COALESCE(MAX(version), 0) FROM {schema}.events \
             WHERE stream_category = $1 AND stream_id = $2"
        ))
        .await?;
    let insert = client
        .prepare(&format!(
            "INSERT INTO {schema}.events (stream_category, stream_id, version, event_type, data) \
             SELECT $1::text, $2::uuid, $3::bigint + g, 'Deposited', jsonb_build_object('n', g) \
             FROM generate_series(1, $4::bigint) AS g RETURNING position"
        ))
        .await?;
    let clock = client
        .prepare("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")
        .await?;
    let mut rng = StdRng::seed_from_u64(0x3003 + id as u64);
    // (stream, the version this writer loaded)
    let mut streams: Vec<(Uuid, i64)> = (0..50)
        .map(|_| (Uuid::from_u128(rng.random()), 0))
        .collect();
    let category = "account";
    let mut out = Appended::default();
    while !stop.load(Ordering::Relaxed) {
        let s = rng.random_range(0..streams.len());
        let (stream, expected) = streams[s];
        let n: i64 = rng.random_range(1..=5);
        let roll: f64 = rng.random();
        let fail = roll < load.rollback;
        let slow = !fail && roll < load.rollback + load.slow;
        // BEGIN goes out with the first statement (Npgsql sends it so).
        let key: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&category, &stream];
        let actual: i64 = if load.lock {
            let (begin, locked) = tokio::join!(
                client.batch_execute("BEGIN"),
                client.query_one(&lock, &[&APPEND_LOCK_KEY])
            );
            begin?;
            locked?;
            client.query_one(&version, &key).await?.get(0)
        } else {
            let (begin, v) = tokio::join!(
                client.batch_execute("BEGIN"),
                client.query_one(&version, &key)
            );
            begin?;
            v?.get(0)
        };
        if actual != expected {
            client.batch_execute("ROLLBACK").await?;
            bail!("writer {id}: stream at version {actual}, expected {expected}");
        }
        let rows = client
            .query(&insert, &[&category, &stream, &expected, &n])
            .await?;
        if fail {
            client.batch_execute("ROLLBACK").await?;
            out.rollbacks += 1;
            continue;
        }
        if slow {
            tokio::time::sleep(load.hold).await;
        }
        // Pipelined: the clock is read right after the commit.
        let (commit, at) = tokio::join!(
            client.batch_execute("COMMIT"),
            client.query_one(&clock, &[])
        );
        commit?;
        let at: f64 = at?.get(0);
        streams[s].1 = expected + n;
        out.appends += 1;
        out.events += n as u64;
        for r in &rows {
            out.committed.insert(r.get(0), at);
        }
    }
    Ok(out)
}

/// The naive reader (`position > last ORDER BY position`), bounded by the
/// watermark when `watermarks` is given. After `stop` it reads on until it
/// has returned everything up to `head` (10 s at most).
async fn reader(
    schema: String,
    watermarks: Option<String>,
    stop: Arc<AtomicBool>,
    head: Arc<std::sync::Mutex<Option<i64>>>,
) -> Result<Read> {
    let client = connect().await?;
    let bound = watermarks
        .map(|t| format!(" AND position <= (SELECT position FROM {t} WHERE store = 'default')"))
        .unwrap_or_default();
    let page = client
        .prepare(&format!(
            "SELECT position, stream_category = $2, EXTRACT(EPOCH FROM clock_timestamp())::float8 \
             FROM {schema}.events WHERE position > $1{bound} ORDER BY position LIMIT 1000"
        ))
        .await?;
    let mut last = 0i64;
    let mut out = Read::default();
    let mut deadline: Option<Instant> = None;
    loop {
        let rows = client.query(&page, &[&last, &TOMBSTONE_CATEGORY]).await?;
        for r in &rows {
            let (p, tombstone, at): (i64, bool, f64) = (r.get(0), r.get(1), r.get(2));
            if !tombstone {
                out.returned.entry(p).or_insert(at);
            }
            last = p;
        }
        if rows.len() < 1000 {
            if stop.load(Ordering::Relaxed) {
                let end = *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(10));
                let top = head.lock().unwrap().unwrap_or(0);
                if last >= top {
                    out.caught_up = true;
                    return Ok(out);
                }
                if Instant::now() >= end {
                    return Ok(out);
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
