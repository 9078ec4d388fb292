//! Section 7: one daemon, many stores. The real binary with one config file
//! holding (a) `[[stores]]` entries for many schemas in one database and (b)
//! a `[[store_sets]]` entry whose `LIKE` pattern finds many databases, each
//! with the Eventuous tables. Measured, never asserted: time until `/readyz`
//! answers 200 with every store on the board, the sessions the daemon holds
//! (by its application_name) then and at the peak, its RSS, its idle CPU
//! and its server sessions' CPU with nothing to heal, and the time from a
//! hole's creation to its tombstone when many stores get one hole at the
//! same moment.
//!
//! Schemas are `ghb_fleet<i>_<pid>` (dropped by the harness's usual stale
//! schema sweep if the run is killed); databases are `ghb_fleet_<pid>_<i>`,
//! created from a template database `ghb_fleettpl_<pid>` holding the
//! tables, and dropped afterwards (stale ones, whose pid is gone, at the
//! start of the next run).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use gap_healer_testkit::pg::{named, try_connect, with_param, FIXTURE};
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::support::*;

/// How big the fleet is.
struct Shape {
    schemas: usize,
    databases: usize,
    /// Stores that get one hole at the same moment.
    holes: usize,
    /// Of those, how many are databases of the set (one session each).
    hole_databases: usize,
    idle_for: Duration,
}

const GAP_TIMEOUT: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_secs(1);
/// Schemas created (or dropped) per transaction: each holds ~10 relation
/// locks, and the server's lock table is shared by every session.
const CHUNK: usize = 20;

pub async fn run(size: Size, report: &mut Report) -> Result<()> {
    let shape = size.pick(
        Shape {
            schemas: 20,
            databases: 3,
            holes: 10,
            hole_databases: 3,
            idle_for: Duration::from_secs(3),
        },
        Shape {
            schemas: 500,
            databases: 50,
            holes: 50,
            hole_databases: 10,
            idle_for: Duration::from_secs(30),
        },
        Shape {
            schemas: 500,
            databases: 50,
            holes: 50,
            hole_databases: 10,
            idle_for: Duration::from_secs(60),
        },
    );
    let admin = connect().await?;
    drop_stale_databases(&admin).await?;
    let pid = std::process::id();
    let schemas: Vec<String> = (0..shape.schemas)
        .map(|i| format!("{SCHEMA_PREFIX}fleet{i}_{pid}"))
        .collect();
    let databases: Vec<String> = (0..shape.databases)
        .map(|i| format!("{SCHEMA_PREFIX}fleet_{pid}_{i}"))
        .collect();
    let template = format!("{SCHEMA_PREFIX}fleettpl_{pid}");
    let made = Instant::now();
    let result = async {
        create_schemas(&admin, &schemas).await?;
        let schemas_took = made.elapsed();
        let t = Instant::now();
        create_databases(&admin, &template, &databases).await?;
        println!(
            "fleet: {} schemas in {}, {} databases in {}",
            schemas.len(),
            secs(schemas_took),
            databases.len(),
            secs(t.elapsed())
        );
        measure(&admin, &shape, &schemas, &databases, report).await
    }
    .await;
    // Dropped whatever happened.
    let dropped = drop_all(&admin, &schemas, &template, &databases).await;
    result?;
    dropped
}

/// The schemas in chunks of [`CHUNK`] per transaction, each with one
/// committed event at position 1 (so a later hole lies between two rows).
async fn create_schemas(admin: &Client, schemas: &[String]) -> Result<()> {
    for chunk in schemas.chunks(CHUNK) {
        let mut sql = String::from("BEGIN;\n");
        for s in chunk {
            sql.push_str(&format!("DROP SCHEMA IF EXISTS {s} CASCADE;\n"));
            sql.push_str(&FIXTURE.replace("__schema__", s));
            sql.push_str(&seed_sql(s));
        }
        sql.push_str("COMMIT;");
        admin
            .batch_execute(&sql)
            .await
            .context("create the fleet's schemas")?;
    }
    Ok(())
}

fn seed_sql(schema: &str) -> String {
    format!(
        "INSERT INTO {schema}.streams (stream_name, version) VALUES ('seed', 0);
         INSERT INTO {schema}.messages (message_id, message_type, stream_id, stream_position, json_data, created)
         VALUES (gen_random_uuid(), 'Seed', 1, 0, '{{}}', now() AT TIME ZONE 'utc');\n"
    )
}

/// A URL for database `db` on the harness's server, named `app`.
fn db_url(db: &str, app: &str) -> String {
    named(
        &with_param(&pg_url().replace("dbname=test", ""), "dbname", db),
        app,
    )
}

/// One template database with the tables in schema `eventuous` and one
/// event, then each database copied from it.
async fn create_databases(admin: &Client, template: &str, databases: &[String]) -> Result<()> {
    for sql in [
        format!("DROP DATABASE IF EXISTS {template} WITH (FORCE)"),
        format!("CREATE DATABASE {template}"),
    ] {
        admin.batch_execute(&sql).await?;
    }
    {
        let client = try_connect(&db_url(template, &app_name())).await?;
        client
            .batch_execute(&format!(
                "{}{}",
                FIXTURE.replace("__schema__", "eventuous"),
                seed_sql("eventuous")
            ))
            .await?;
    }
    // Its session must be gone before it can be copied.
    for _ in 0..50 {
        let n: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&template],
            )
            .await?
            .get(0);
        if n == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for db in databases {
        for sql in [
            format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"),
            format!("CREATE DATABASE {db} TEMPLATE {template}"),
        ] {
            admin
                .batch_execute(&sql)
                .await
                .with_context(|| format!("create database {db}"))?;
        }
    }
    Ok(())
}

async fn drop_all(
    admin: &Client,
    schemas: &[String],
    template: &str,
    databases: &[String],
) -> Result<()> {
    for chunk in schemas.chunks(CHUNK) {
        let sql: String = chunk
            .iter()
            .map(|s| format!("DROP SCHEMA IF EXISTS {s} CASCADE;\n"))
            .collect();
        admin
            .batch_execute(&format!("BEGIN;\n{sql}COMMIT;"))
            .await?;
    }
    for db in databases.iter().map(String::as_str).chain([template]) {
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
            .await?;
    }
    Ok(())
}

/// Drops `ghb_fleet*` databases left by runs whose process is gone.
async fn drop_stale_databases(admin: &Client) -> Result<()> {
    let rows = admin
        .query(
            "SELECT datname::text FROM pg_database WHERE datname LIKE 'ghb\\_fleet%'",
            &[],
        )
        .await?;
    for row in rows {
        let name: String = row.get(0);
        // ghb_fleet_<pid>_<i> or ghb_fleettpl_<pid>
        let pid = name.split('_').filter_map(|p| p.parse::<u32>().ok()).next();
        let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if !alive {
            admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await?;
        }
    }
    Ok(())
}

/// Client sessions free on the server now.
async fn free_sessions(admin: &Client) -> Result<i64> {
    Ok(admin
        .query_one(
            "SELECT current_setting('max_connections')::int
                  - current_setting('superuser_reserved_connections')::int
                  - (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int",
            &[],
        )
        .await?
        .get::<_, i32>(0) as i64)
}

/// (pid, database) of every session named `app`.
async fn sessions(admin: &Client, app: &str) -> Result<Vec<(i32, String)>> {
    Ok(admin
        .query(
            "SELECT pid, datname::text FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// CPU ticks of each session named `app`, by pid.
async fn session_ticks_by_pid(admin: &Client, app: &str) -> Result<HashMap<i32, u64>> {
    Ok(sessions(admin, app)
        .await?
        .into_iter()
        .filter_map(|(pid, _)| Some((pid, proc_sample(pid as u32).ok()?.cpu_ticks)))
        .collect())
}

/// Samples the daemon's sessions every 200 ms until stopped; the peak.
fn watch_sessions(app: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Result<usize>> {
    tokio::spawn(async move {
        let client = connect().await?;
        let mut peak = 0;
        while !stop.load(Ordering::Relaxed) {
            peak = peak.max(sessions(&client, &app).await?.len());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(peak)
    })
}

/// One simple-query string, returning the first column of its last row.
async fn last_value(client: &Client, sql: &str) -> Result<f64> {
    let messages = client.simple_query(sql).await?;
    messages
        .iter()
        .rev()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()),
            _ => None,
        })
        .ok_or_else(|| anyhow!("no value from {sql}"))
}

/// In each schema: an append rolled back (a burnt position), then one
/// committed above it, all in one session and one commit; then the clock.
fn hole_sql(schemas: &[&str]) -> String {
    let insert = |s: &str| {
        format!(
            "INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, json_data, created)
             VALUES (gen_random_uuid(), 'Bench', 1, 1, '{{}}', now() AT TIME ZONE 'utc');\n"
        )
    };
    let mut sql = String::from("BEGIN;\n");
    for s in schemas {
        sql.push_str(&insert(s));
    }
    sql.push_str("ROLLBACK;\nBEGIN;\n");
    for s in schemas {
        sql.push_str(&insert(s));
        sql.push_str(&format!(
            "UPDATE {s}.streams SET version = 1 WHERE stream_id = 1;\n"
        ));
    }
    sql.push_str("COMMIT;\nSELECT EXTRACT(EPOCH FROM clock_timestamp())::float8::text;");
    sql
}

/// The tombstones' `created` (epoch seconds, the fill transaction's start)
/// in `schema`.
fn tombstone_sql(schema: &str) -> String {
    format!(
        "SELECT EXTRACT(EPOCH FROM created)::float8 FROM {schema}.messages WHERE message_type = '{TOMBSTONE_TYPE}'"
    )
}

async fn measure(
    admin: &Client,
    shape: &Shape,
    schemas: &[String],
    databases: &[String],
    report: &mut Report,
) -> Result<()> {
    let app = healer_app_name();
    let cs = pg_url_named(&app);
    let template = with_param(&cs.replace("dbname=test", ""), "dbname", "{database}");
    let pid = std::process::id();
    let stores = schemas.len() + databases.len();
    // 50 databases need a lock session each (advisory locks are per
    // database) beside their pooled session: on a shared server with 100
    // sessions that may not fit, and the harness must not take the server
    // from everyone else.
    let free = free_sessions(admin).await?;
    let need_with_election = 2 * databases.len() as i64 + 17 + shape.hole_databases as i64 + 10;
    let set_election = need_with_election <= free;
    let mut text = format!(
        "engine = \"postgres\"\ngap_timeout = \"{}\"\npoll_interval = \"{}\"\nstart_from = \"0\"\nlog_format = \"json\"\n",
        humantime(GAP_TIMEOUT),
        humantime(POLL)
    );
    for (i, s) in schemas.iter().enumerate() {
        text += &format!(
            "\n[[stores]]\nname = \"s{i}\"\nconnection_string = {}\nschema = \"{s}\"\n",
            toml_str(&cs)
        );
    }
    text += &format!(
        "\n[[store_sets]]\nname = \"tenants\"\ndatabases = \"{SCHEMA_PREFIX}fleet_{pid}_%\"\nconnection_string = {}\n{}",
        toml_str(&template),
        if set_election {
            ""
        } else {
            "leader_election = false\n"
        }
    );
    let dir = std::env::temp_dir().join(format!("ghb-fleet-{pid}"));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("fleet.toml");
    std::fs::write(&file, text)?;

    let stop_watch = Arc::new(AtomicBool::new(false));
    let watcher = watch_sessions(app.clone(), stop_watch.clone());
    let started = Instant::now();
    let daemon = tokio::task::block_in_place(|| {
        Daemon::try_spawn(
            &[
                "run".to_string(),
                "--config".to_string(),
                file.display().to_string(),
            ],
            &[],
            20_000,
        )
    });
    let daemon = match daemon {
        Ok(d) => d,
        Err(e) => {
            stop_watch.store(true, Ordering::Relaxed);
            let _ = watcher.await;
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let result = observe(
        admin, shape, schemas, databases, &daemon, &app, started, stores,
    )
    .await;
    stop_watch.store(true, Ordering::Relaxed);
    let peak = watcher.await??;
    let log = daemon.log();
    tokio::task::block_in_place(|| daemon.terminate());
    let _ = std::fs::remove_dir_all(&dir);
    let o = result.with_context(|| {
        let tail: Vec<&str> = log.lines().rev().take(20).collect();
        format!("daemon log, last lines:\n{}", tail.join("\n"))
    })?;

    let mb = |kib: u64| kib as f64 / 1024.0;
    let within = GAP_TIMEOUT + POLL + Duration::from_secs(1);
    let lat = &o.latencies;
    let q = |p: f64| quantile(lat, p).unwrap_or_default();
    let (p50, p99, max) = (q(0.5), q(0.99), lat.last().copied().unwrap_or_default());
    let config_note = if set_election {
        String::new()
    } else {
        format!(
            " (leader election off for the set: with it, each database needs a lock session of its own, {need_with_election} sessions in all, and only {free} were free on this shared server)"
        )
    };
    report.row(
        &format!(
            "7. fleet of {} schemas + {} databases: /readyz 200 with every store",
            schemas.len(),
            databases.len()
        ),
        format!(
            "{} after the start; gap_healer_stores{{state=\"healthy\"}} {}",
            secs(o.ready_after),
            o.healthy
        ),
        "",
        None,
    );
    report.row(
        "7. fleet: server sessions the daemon holds, all stores up / peak",
        format!(
            "{} ({} in the schemas' database, {} over {} databases) / {peak}{config_note}",
            o.sessions_up,
            o.sessions_main,
            o.sessions_set,
            databases.len()
        ),
        "",
        None,
    );
    report.row(
        "7. fleet: daemon RSS, all stores up (VmHWM)",
        format!("{:.1} MB ({:.1} MB)", mb(o.rss.rss_kib), mb(o.rss.hwm_kib)),
        "≤ 40 MB",
        Some(mb(o.rss.rss_kib) <= 40.0),
    );
    report.row(
        "7. fleet: daemon CPU idle, 1 s poll",
        format!(
            "{:.1} % of a core; its server sessions {:.1} %",
            o.idle_cpu, o.idle_sessions_cpu
        ),
        "≤ 5 %",
        Some(o.idle_cpu <= 5.0),
    );
    report.row(
        &format!(
            "7. fleet: {} stores given one hole at once, hole made to tombstone, p50 / p99 / max",
            lat.len()
        ),
        format!(
            "{} / {} / {} (gap_timeout {}, poll {})",
            ms(p50),
            ms(p99),
            ms(max),
            humantime(GAP_TIMEOUT),
            humantime(POLL)
        ),
        &format!("p99 ≤ {}", secs(within)),
        Some(lat.len() == shape.holes && p99 <= within),
    );
    report.detail(format!(
        "### 7. Fleet: many stores in one daemon\n\n\
         One `gap-healer run --config` file: {schemas} `[[stores]]` entries, one per schema of one \
         database (each schema made from the Eventuous fixture, {CHUNK} per transaction), and one \
         `[[store_sets]]` entry whose pattern finds {dbs} databases (copies of a template database \
         holding the tables){config_note}; every store with one committed event; `gap_timeout = \
         \"{gt}\"`, `poll_interval = \"{poll}\"`, `start_from = \"0\"`, JSON logs, the rest default. \
         Sessions are the server's sessions with the daemon's application_name, sampled every 200 ms \
         from the start to the end (peak {peak}).\n\n\
         | what | figure |\n|---|---|\n\
         | start to `/readyz` 200 with all {stores} stores on `/status` | {ready} |\n\
         | `gap_healer_stores{{state=\"healthy\"}}` in a `/metrics` scrape then | {healthy} (scrape: {scrape_kb:.0} KB, {series} samples, {scrape_ms}) |\n\
         | sessions held once all stores are up: schemas' database / set's databases / all | {main} / {set} / {all} |\n\
         | sessions at the peak | {peak} |\n\
         | RSS once all stores are up (VmHWM) | {rss:.1} MB ({hwm:.1} MB) |\n\
         | idle CPU over {idle}, nothing to heal: daemon / its server sessions (% of one core) | {cpu:.1} % ({ticks} ticks) / {scpu:.1} % |\n\
         | {n} stores ({hdb} of them databases of the set) each given one hole in the same moment: hole made (commit of the append above the rolled-back one) to the tombstone's `created` (its fill transaction's start), database clock, p50 / p99 / max | {p50} / {p99} / {max} |\n\
         | holes filled within gap_timeout + poll + 1 s ({within}) | {ok} of {n} |\n",
        schemas = schemas.len(),
        dbs = databases.len(),
        gt = humantime(GAP_TIMEOUT),
        poll = humantime(POLL),
        ready = secs(o.ready_after),
        healthy = o.healthy,
        scrape_kb = o.scrape_bytes as f64 / 1024.0,
        series = o.scrape_samples,
        scrape_ms = ms(o.scrape_took),
        main = o.sessions_main,
        set = o.sessions_set,
        all = o.sessions_up,
        rss = mb(o.rss.rss_kib),
        hwm = mb(o.rss.hwm_kib),
        idle = secs(o.idle_took),
        cpu = o.idle_cpu,
        ticks = o.idle_ticks,
        scpu = o.idle_sessions_cpu,
        n = lat.len(),
        hdb = shape.hole_databases,
        p50 = ms(p50),
        p99 = ms(p99),
        max = ms(max),
        within = secs(within),
        ok = lat.iter().filter(|l| **l <= within).count(),
    ));
    Ok(())
}

fn humantime(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// What [`observe`] measured.
struct Observed {
    ready_after: Duration,
    healthy: f64,
    scrape_bytes: usize,
    scrape_samples: usize,
    scrape_took: Duration,
    sessions_up: usize,
    sessions_main: usize,
    sessions_set: usize,
    rss: ProcSample,
    idle_cpu: f64,
    idle_ticks: u64,
    idle_sessions_cpu: f64,
    idle_took: Duration,
    /// Hole made to tombstone, sorted.
    latencies: Vec<Duration>,
}

#[allow(clippy::too_many_arguments)]
async fn observe(
    admin: &Client,
    shape: &Shape,
    schemas: &[String],
    databases: &[String],
    daemon: &Daemon,
    app: &str,
    started: Instant,
    stores: usize,
) -> Result<Observed> {
    // Up: /readyz 200 with every store on the board.
    let limit = Duration::from_secs(180);
    loop {
        let (status, body) = daemon.try_get("/status").await?;
        let on_board = if status == 200 {
            serde_json::from_str::<serde_json::Value>(&body)?["stores"]
                .as_array()
                .map_or(0, Vec::len)
        } else {
            0
        };
        if on_board == stores && daemon.try_get("/readyz").await?.0 == 200 {
            break;
        }
        if started.elapsed() > limit {
            let why = daemon.try_get("/readyz").await?.1;
            let why: Vec<&str> = why.lines().take(5).collect();
            bail!(
                "not ready after {}: {on_board} of {stores} stores on /status; {}",
                secs(limit),
                why.join("; ")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready_after = started.elapsed();
    let t = Instant::now();
    let (_, scrape) = daemon.try_get("/metrics").await?;
    let scrape_took = t.elapsed();
    let healthy = scrape
        .lines()
        .find_map(|l| l.strip_prefix("gap_healer_stores{state=\"healthy\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN);
    let scrape_samples = scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    // Settle: every store's first scans and its election done.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = sessions(admin, app).await?;
    let main = held.iter().filter(|(_, db)| db == "test").count();
    let rss = proc_sample(daemon.pid())?;

    // Idle: nothing to heal.
    let d0 = proc_sample(daemon.pid())?.cpu_ticks;
    let s0 = session_ticks_by_pid(admin, app).await?;
    let t0 = Instant::now();
    tokio::time::sleep(shape.idle_for).await;
    let d1 = proc_sample(daemon.pid())?.cpu_ticks;
    let s1 = session_ticks_by_pid(admin, app).await?;
    let idle_took = t0.elapsed();
    let tck = clock_ticks();
    let pct = |ticks: u64| ticks as f64 / tck / idle_took.as_secs_f64() * 100.0;
    let session_ticks: u64 = s1
        .iter()
        .map(|(pid, t)| t.saturating_sub(s0.get(pid).copied().unwrap_or(0)))
        .sum();

    // Holes: in some schemas (one session, one commit) and some databases
    // (a session each, all sent at once).
    let in_schemas: Vec<&str> = schemas
        .iter()
        .take(shape.holes.saturating_sub(shape.hole_databases))
        .map(String::as_str)
        .collect();
    let hole_dbs: Vec<&String> = databases.iter().take(shape.hole_databases).collect();
    let mut db_clients = Vec::new();
    for db in &hole_dbs {
        db_clients.push(Arc::new(try_connect(&db_url(db, &app_name())).await?));
    }
    let one = hole_sql(&["eventuous"]);
    let many = hole_sql(&in_schemas);
    let (made_schemas, made_dbs) = tokio::join!(
        async {
            if in_schemas.is_empty() {
                Ok(0.0)
            } else {
                last_value(admin, &many).await
            }
        },
        async {
            let tasks: Vec<_> = db_clients
                .iter()
                .map(|c| {
                    let (c, sql) = (c.clone(), one.clone());
                    tokio::spawn(async move { last_value(&c, &sql).await })
                })
                .collect();
            let mut made = Vec::new();
            for t in tasks {
                made.push(t.await??);
            }
            Ok::<_, anyhow::Error>(made)
        }
    );
    let made_schemas = made_schemas?;
    let made_dbs = made_dbs?;
    // Wait for every tombstone.
    let union: String = in_schemas
        .iter()
        .map(|s| tombstone_sql(s))
        .collect::<Vec<_>>()
        .join(" UNION ALL ");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut latencies;
    loop {
        latencies = Vec::new();
        if !in_schemas.is_empty() {
            for row in admin.query(&union, &[]).await? {
                latencies.push(row.get::<_, f64>(0) - made_schemas);
            }
        }
        for (client, made) in db_clients.iter().zip(&made_dbs) {
            for row in client.query(&tombstone_sql("eventuous"), &[]).await? {
                latencies.push(row.get::<_, f64>(0) - made);
            }
        }
        if latencies.len() >= shape.holes || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if latencies.len() < shape.holes {
        println!(
            "fleet: only {} of {} holes filled within 30 s",
            latencies.len(),
            shape.holes
        );
    }
    let mut latencies: Vec<Duration> = latencies
        .into_iter()
        .map(|s| Duration::from_secs_f64(s.max(0.0)))
        .collect();
    latencies.sort();
    Ok(Observed {
        ready_after,
        healthy,
        scrape_bytes: scrape.len(),
        scrape_samples,
        scrape_took,
        sessions_up: held.len(),
        sessions_main: main,
        sessions_set: held.len() - main,
        rss,
        idle_cpu: pct(d1 - d0),
        idle_ticks: d1 - d0,
        idle_sessions_cpu: pct(session_ticks),
        idle_took,
        latencies,
    })
}
