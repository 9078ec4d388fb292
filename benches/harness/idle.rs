//! Section 3: idle poll cost as the table grows: what the daemon does every
//! `poll_interval` when nothing new arrived (`Healer::scan_step` with no
//! tracked hole: one scan page above the head), on one Eventuous table grown
//! set-based through the sizes asked for (100k, 1M, 10M rows), plus the
//! buffers the detection query reads (EXPLAIN ANALYZE BUFFERS of the same
//! statement, prepared with parameters as the engine sends it).

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use gap_healer::config::StartFrom;
use gap_healer::engine::postgres::render_sql;
use gap_healer::engine::profile::TableShape;
use gap_healer::engine::Engine;
use gap_healer::gaps::PosRange;
use gap_healer::healer::Options;

use crate::support::*;

const SCAN_SQL: &str = include_str!("../../sql/postgres/scan.sql");
const PROBE_SQL: &str = include_str!("../../sql/postgres/probe.sql");

/// One size's figures.
pub struct IdlePoll {
    pub rows: i64,
    pub setup: Duration,
    pub p50: Duration,
    pub p99: Duration,
    pub mean: Duration,
    pub buffers: i64,
    pub server: f64,
    pub table_mb: f64,
    /// `Engine::probe` of 100 tracked ranges near the head: p50.
    pub probe: Duration,
    /// JIT time in that probe's plan (EXPLAIN ANALYZE), ms; 0 without JIT.
    pub probe_jit: f64,
}

pub async fn run(sizes: &[i64], polls: usize, report: &mut Report) -> Result<()> {
    let schema = bench_store("idle").await?;
    let result = measure(&schema, sizes, polls).await;
    schema.try_drop_schema().await?;
    let figures = result?;
    let mut table = String::from(
        "| rows | table + indexes | load (set-based) | idle poll p50 | p99 | mean | buffers per poll | server time (EXPLAIN, median) | probe of 100 tracked ranges, p50 | JIT in that probe |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for f in &figures {
        table.push_str(&format!(
            "| {} | {:.0} MB | {} | {} | {} | {} | {} | {:.3} ms | {} | {} |\n",
            thousands(f.rows as u64),
            f.table_mb,
            secs(f.setup),
            ms(f.p50),
            ms(f.p99),
            ms(f.mean),
            f.buffers,
            f.server,
            ms(f.probe),
            if f.probe_jit > 0.0 {
                format!("{:.0} ms", f.probe_jit)
            } else {
                "none".into()
            }
        ));
    }
    let (first, last) = (
        figures.first().ok_or_else(|| anyhow!("no sizes"))?,
        figures.last().ok_or_else(|| anyhow!("no sizes"))?,
    );
    let ratio = last.p50.as_secs_f64() / first.p50.as_secs_f64();
    let server_ratio = last.server / first.server;
    report.row(
        &format!(
            "3. idle poll p50, {} / {} rows",
            thousands(last.rows as u64),
            thousands(first.rows as u64)
        ),
        format!(
            "{} / {} = {ratio:.2}; server time {server_ratio:.2}; {} vs {} buffers",
            ms(last.p50),
            ms(first.p50),
            last.buffers,
            first.buffers
        ),
        "≤ 1.2",
        (figures.len() > 1).then_some(ratio <= 1.2),
    );
    report.detail(format!(
        "### 3. Idle poll cost\n\n\
         One table grown through the sizes (rows inserted set-based with the secondary indexes \
         dropped and rebuilt, then VACUUM ANALYZE). Idle poll: `Healer::scan_step` of a healer \
         caught up with the head, {polls} times after 50 warm-up polls, timed in the client \
         (round trip on loopback included). Buffers and server time: EXPLAIN (ANALYZE, BUFFERS) \
         of the prepared scan statement at the head. Probe: `Engine::probe` of 100 three-position \
         ranges near the head (what every poll adds while holes are tracked, and what every fill \
         cycle starts with), and the JIT compilation time its plan reports (EXPLAIN ANALYZE of \
         the same statement with the same arrays). Largest / smallest table: p50 of the poll \
         {ratio:.2}, server time {server_ratio:.2}.\n\n{table}"
    ));
    Ok(())
}

async fn measure(schema: &Store, sizes: &[i64], polls: usize) -> Result<Vec<IdlePoll>> {
    let s = &schema.schema;
    schema
        .client
        .execute(
            &format!("INSERT INTO {s}.streams (stream_name, version) VALUES ('bench', -1)"),
            &[],
        )
        .await?;
    let mut have = 0i64;
    let mut out = Vec::new();
    for &rows in sizes {
        let started = Instant::now();
        if rows > have {
            load(schema, have, rows).await?;
            have = rows;
        }
        let setup = started.elapsed();
        let engine = schema.try_engine()?;
        let mut healer = gap_healer_testkit::engine::healer(
            engine.clone(),
            Options {
                store: Default::default(),
                gap_timeout: Duration::from_secs(5),
                poll_interval: Duration::from_millis(250),
                lock_timeout: Duration::from_secs(2),
                scan_page_size: 10_000,
                start_from: StartFrom::Head,
                lookback: 0,
                dry_run: false,
                give_up_after: None,
                publish_watermark: false,
            },
        );
        for _ in 0..50 {
            healer.scan_step().await?;
        }
        let mut times = Vec::with_capacity(polls);
        for _ in 0..polls {
            let t = Instant::now();
            let step = healer.scan_step().await?;
            times.push(t.elapsed());
            if step.rows != 0 {
                return Err(anyhow!("an idle poll read {} rows", step.rows));
            }
        }
        let mean = times.iter().sum::<Duration>() / polls as u32;
        times.sort();
        let head = schema.try_head().await?;
        let (buffers, server) = explain(schema, head).await?;
        // What a poll adds once holes are tracked: one probe of their ranges.
        let ranges: Vec<PosRange> = (0..100)
            .filter_map(|k| PosRange::new(head - 100 * k - 5, head - 100 * k - 3))
            .collect();
        let mut probes = Vec::new();
        for _ in 0..30 {
            let t = Instant::now();
            engine.probe(&ranges).await?;
            probes.push(t.elapsed());
        }
        probes.sort();
        let probe_jit = probe_jit_ms(schema, &ranges).await?;
        let table_mb: i64 = schema
            .client
            .query_one(
                &format!("SELECT pg_total_relation_size('{s}.messages')"),
                &[],
            )
            .await?
            .get(0);
        let f = IdlePoll {
            rows,
            setup,
            p50: quantile(&times, 0.5).unwrap_or_default(),
            p99: quantile(&times, 0.99).unwrap_or_default(),
            mean,
            buffers,
            server,
            table_mb: table_mb as f64 / 1048576.0,
            probe: quantile(&probes, 0.5).unwrap_or_default(),
            probe_jit,
        };
        println!(
            "idle poll at {} rows: p50 {} p99 {} buffers {} (load {})",
            thousands(rows as u64),
            ms(f.p50),
            ms(f.p99),
            f.buffers,
            secs(setup)
        );
        out.push(f);
    }
    Ok(out)
}

/// Grows messages from `have` to `rows` rows (positions 1..=rows, one stream).
async fn load(schema: &Store, have: i64, rows: i64) -> Result<()> {
    let s = &schema.schema;
    schema
        .client
        .batch_execute(&format!(
            "BEGIN;
             SET LOCAL synchronous_commit = off;
             SET LOCAL maintenance_work_mem = '256MB';
             ALTER TABLE {s}.messages DROP CONSTRAINT messages_stream_id_fkey,
                 DROP CONSTRAINT stream_position_unique, DROP CONSTRAINT message_id_unique;
             DROP INDEX {s}.messages_stream_idx;
             INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position,
                                        global_position, json_data, created)
             OVERRIDING SYSTEM VALUE
             SELECT gen_random_uuid(), 'BenchEvent', 1, g - 1, g, '{{\"n\": 1}}', now() AT TIME ZONE 'utc'
             FROM generate_series({from}, {rows}) AS g;
             UPDATE {s}.streams SET version = {rows} - 1 WHERE stream_id = 1;
             ALTER TABLE {s}.messages
                 ADD CONSTRAINT messages_stream_id_fkey FOREIGN KEY (stream_id) REFERENCES {s}.streams (stream_id),
                 ADD CONSTRAINT stream_position_unique UNIQUE (stream_id, stream_position),
                 ADD CONSTRAINT message_id_unique UNIQUE (stream_id, message_id);
             CREATE INDEX messages_stream_idx ON {s}.messages (stream_id);
             SELECT setval(pg_get_serial_sequence('{s}.messages', 'global_position'), {rows});
             COMMIT;",
            from = have + 1,
        ))
        .await?;
    schema
        .client
        .batch_execute(&format!("VACUUM ANALYZE {s}.messages"))
        .await?;
    Ok(())
}

/// A test schema's name as the statement renderer takes it.
fn ident(schema: &str) -> gap_healer::engine::Ident {
    gap_healer::engine::Ident::parse(schema).expect("a test schema is a plain identifier")
}

/// (shared buffers hit + read, median execution time in ms over 21 runs)
/// of the scan at `head`.
async fn explain(schema: &Store, head: i64) -> Result<(i64, f64)> {
    let c = &schema.client;
    let sql = render_sql(SCAN_SQL, &ident(&schema.schema), &TableShape::eventuous());
    c.batch_execute(&format!("PREPARE ghb_idle_scan (bigint, bigint) AS {sql}"))
        .await?;
    let mut buffers = 0;
    let mut times = Vec::new();
    for _ in 0..21 {
        let rows = c
            .query(
                &format!(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE ghb_idle_scan({head}, 10000)"
                ),
                &[],
            )
            .await?;
        let json: serde_json::Value = rows[0].get(0);
        let plan = &json[0]["Plan"];
        buffers = plan["Shared Hit Blocks"].as_i64().unwrap_or(0)
            + plan["Shared Read Blocks"].as_i64().unwrap_or(0);
        times.push(json[0]["Execution Time"].as_f64().unwrap_or(0.0));
    }
    c.batch_execute("DEALLOCATE ghb_idle_scan").await?;
    times.sort_by(f64::total_cmp);
    Ok((buffers, quantile(&times, 0.5).unwrap_or(0.0)))
}

/// JIT time (ms) that EXPLAIN ANALYZE of the probe reports for `ranges`.
async fn probe_jit_ms(schema: &Store, ranges: &[PosRange]) -> Result<f64> {
    let c = &schema.client;
    let sql = render_sql(PROBE_SQL, &ident(&schema.schema), &TableShape::eventuous());
    c.batch_execute(&format!(
        "PREPARE ghb_idle_probe (bigint[], bigint[]) AS {sql}"
    ))
    .await?;
    let list = |f: fn(&PosRange) -> i64| {
        ranges
            .iter()
            .map(|r| f(r).to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let rows = c
        .query(
            &format!(
                "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE ghb_idle_probe('{{{}}}', '{{{}}}')",
                list(|r| r.start()),
                list(|r| r.end())
            ),
            &[],
        )
        .await?;
    c.batch_execute("DEALLOCATE ghb_idle_probe").await?;
    let json: serde_json::Value = rows[0].get(0);
    Ok(json[0]["JIT"]["Timing"]["Total"].as_f64().unwrap_or(0.0))
}
