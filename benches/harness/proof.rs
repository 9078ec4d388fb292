//! Section 8: what a reading of open transactions costs (the transaction-end
//! proof reads `pg_locks` after a scan that found a new hole, and while a
//! due hole waits). On a throwaway cluster of its own (`max_connections`
//! 250, which the shared server does not allow) with many other sessions
//! each in an open transaction: most holding the locks of a read of the
//! store's tables (AccessShareLock on the tables and their indexes, the
//! fast-path kind every session holds), one in ten with an append open (its
//! position drawn: RowExclusiveLock on the sequence, which the reading
//! lists). Measured, never asserted: the round trip of one reading (both
//! statements, as the daemon sends them) with no other session, and with
//! the many; beside it, the round trip of `SELECT 1` on the same pooled
//! session; and the server time of the `pg_locks` statement alone
//! (`EXPLAIN ANALYZE`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gap_healer::engine::{Engine, OpenTransactions};
use gap_healer_testkit::pg::{connect_to, Throwaway};

use crate::support::*;

pub async fn run(size: Size, report: &mut Report) -> Result<()> {
    let sessions: usize = size.pick(20, 200, 200);
    let readings: usize = size.pick(50, 500, 2_000);
    let cluster = Throwaway::started_with(
        "bench-proof",
        "trust",
        "-c max_connections=250 -c max_locks_per_transaction=64",
    );
    cluster.create_database("es").await;
    let store = cluster.store("es").await;
    let engine = store.engine();
    let s = store.schema.clone();
    // A committed row, so the sequence has handed something out.
    store
        .append("warm", 1, gap_healer_testkit::pg::Ending::Commit)
        .await;

    let alone = time_readings(&*engine, readings).await?;
    let select1 = time_select1(&store.url(), readings).await?;

    let mut held = Vec::with_capacity(sessions);
    let mut appending = 0;
    for i in 0..sessions {
        let c = connect_to(&store.url()).await;
        c.batch_execute("BEGIN").await?;
        if i % 10 == 0 {
            c.batch_execute(&format!(
                "INSERT INTO {s}.streams (stream_name) VALUES ('open{i}');
                 INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, json_data, created)
                 SELECT gen_random_uuid(), 'Bench', stream_id, 0, '{{}}', now() FROM {s}.streams WHERE stream_name = 'open{i}'"
            ))
            .await
            .context("an open append")?;
            appending += 1;
        } else {
            c.batch_execute(&format!(
                "SELECT count(*) FROM {s}.messages; SELECT count(*) FROM {s}.streams; SELECT count(*) FROM {s}.checkpoints"
            ))
            .await?;
        }
        held.push(c);
    }
    let admin = connect_to(&store.url()).await;
    let locks: i64 = admin
        .query_one("SELECT count(*) FROM pg_locks", &[])
        .await?
        .get(0);
    let listed = match engine
        .open_transactions(tokio::time::Instant::now())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?
    {
        OpenTransactions::Read(r) => r.open.len(),
        OpenTransactions::KeyOrderOnly => 0,
    };
    let busy = time_readings(&*engine, readings).await?;
    let server_ms = explain_ms(&admin).await?;
    for c in &held {
        let _ = c.batch_execute("ROLLBACK").await;
    }
    drop(held);

    let q = |v: &[Duration], x: f64| quantile(v, x).map(ms).unwrap_or_else(|| "-".into());
    report.row(
        &format!("8. one reading of open transactions, {sessions} other sessions in open transactions ({locks} locks)"),
        format!(
            "p50 {} / p99 {} / max {} (alone: p50 {}, p99 {}; SELECT 1: p50 {})",
            q(&busy, 0.5),
            q(&busy, 0.99),
            q(&busy, 1.0),
            q(&alone, 0.5),
            q(&alone, 0.99),
            q(&select1, 0.5)
        ),
        "",
        None,
    );
    report.detail(format!(
        "### 8. The reading of open transactions\n\n\
         A throwaway cluster (`max_connections` 250), one Eventuous store, {sessions} other \
         sessions each in an open transaction: {reading_sessions} holding a read of the store's \
         three tables, {appending} an append with its position drawn ({locks} rows in \
         `pg_locks` in all). One reading is the two statements the daemon sends (the sequence's \
         last value, then `pg_locks`), on one pooled session, {readings} times in a row: \
         p50 {b50}, p99 {b99}, max {bmax} (it listed {listed} open transactions); with no other \
         session p50 {a50}, p99 {a99}; a `SELECT 1` round trip on the same pool p50 {s50}. The \
         `pg_locks` statement's own server time (`EXPLAIN ANALYZE`, median of 20): \
         {server_ms:.2} ms. A reading is taken after a scan that found a new hole and while a due \
         hole waits, at most once a poll per database (the stores of a pool share it), so a \
         daemon idling with nothing to fill takes none.\n",
        reading_sessions = sessions - appending,
        b50 = q(&busy, 0.5),
        b99 = q(&busy, 0.99),
        bmax = q(&busy, 1.0),
        a50 = q(&alone, 0.5),
        a99 = q(&alone, 0.99),
        s50 = q(&select1, 0.5),
    ));
    drop(engine);
    drop(store);
    drop(cluster);
    Ok(())
}

/// `n` readings through the engine, each one's round trip, sorted.
async fn time_readings<E: Engine>(engine: &E, n: usize) -> Result<Vec<Duration>> {
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        engine
            .open_transactions(tokio::time::Instant::now())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        took.push(t.elapsed());
    }
    took.sort();
    Ok(took)
}

/// `n` round trips of `SELECT 1`, sorted.
async fn time_select1(url: &str, n: usize) -> Result<Vec<Duration>> {
    let c = connect_to(url).await;
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        c.simple_query("SELECT 1").await?;
        took.push(t.elapsed());
    }
    took.sort();
    Ok(took)
}

/// The server time of the reading's `pg_locks` statement, median of 20.
async fn explain_ms(c: &tokio_postgres::Client) -> Result<f64> {
    let statement = include_str!("../../sql/postgres/transactions.sql")
        .replace("$1::oid []", "ARRAY[0]::oid []");
    let mut times = Vec::new();
    for _ in 0..20 {
        let rows = c
            .simple_query(&format!("EXPLAIN (ANALYZE, FORMAT JSON) {statement}"))
            .await?;
        for m in rows {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                let plan: serde_json::Value = serde_json::from_str(r.get(0).unwrap_or("[]"))?;
                if let Some(t) = plan[0]["Execution Time"].as_f64() {
                    times.push(t);
                }
            }
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times.get(times.len() / 2).copied().unwrap_or(f64::NAN))
}
