//! Idle poll cost as the table grows: the detection query the daemon runs
//! every `poll_interval` when nothing new arrived, against Eventuous tables
//! of 100k and 1M rows (10M with BENCH_ROWS=100000,1000000,10000000) in the
//! local PostgreSQL. Prints time per poll and buffers read (EXPLAIN ANALYZE).
//!
//!   cargo bench --bench idle_poll
//!
//! A benchmark prints figures; it asserts nothing about time.

use std::time::{Duration, Instant};

use gap_healer::engine::postgres::PostgresEngine;
use gap_healer::engine::{Engine, StoreSettings};
use gap_healer::secret::ConnectionString;
use tokio_postgres::NoTls;

const POLLS: usize = 500;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let url = std::env::var("GAP_HEALER_TEST_PG")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".into());
    let sizes: Vec<i64> = std::env::var("BENCH_ROWS")
        .unwrap_or_else(|_| "100000,1000000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("BENCH_ROWS: comma-separated row counts")
        })
        .collect();
    let (client, conn) = tokio_postgres::connect(&url, NoTls)
        .await
        .expect("PostgreSQL");
    tokio::spawn(conn);
    let fixture = include_str!("../tests/fixtures/eventuous_postgres.sql");
    let scan_sql = include_str!("../sql/postgres/scan.sql");
    println!("| rows | setup | idle poll p50 | idle poll p99 | buffers per poll (EXPLAIN) |");
    println!("|---:|---:|---:|---:|---:|");
    let mut p50s = Vec::new();
    for rows in sizes {
        let schema = format!("gh_bench_{rows}_{}", std::process::id());
        let started = Instant::now();
        client
            .batch_execute(&fixture.replace("__schema__", &schema))
            .await
            .unwrap();
        client
            .batch_execute(&format!(
                "INSERT INTO {schema}.streams (stream_name, version) VALUES ('bench', {last});
                 INSERT INTO {schema}.messages (message_id, message_type, stream_id, stream_position, global_position, json_data, created)
                 OVERRIDING SYSTEM VALUE
                 SELECT gen_random_uuid(), 'E', 1, g - 1, g, '{{}}', now() FROM generate_series(1, {rows}) g;
                 VACUUM ANALYZE {schema}.messages;",
                last = rows - 1
            ))
            .await
            .unwrap();
        let setup = started.elapsed();
        let engine = PostgresEngine::new(&StoreSettings {
            connection_string: ConnectionString::new(url.clone()),
            schema: schema.clone(),
            tombstone_stream: "__tombstones__".into(),
            tombstone_type: "$tombstone".into(),
            connect_timeout: Duration::from_secs(5),
        })
        .unwrap();
        let head = engine.head().await.unwrap().unwrap();
        for _ in 0..20 {
            engine.scan(head, 10_000).await.unwrap();
        }
        let mut times: Vec<Duration> = (0..POLLS).map(|_| Duration::ZERO).collect();
        for t in times.iter_mut() {
            let s = Instant::now();
            let page = engine.scan(head, 10_000).await.unwrap();
            *t = s.elapsed();
            assert_eq!(page.rows, 0);
        }
        times.sort();
        let plan = client
            .query(
                &format!(
                    "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
                    scan_sql
                        .replace("__schema__", &schema)
                        .replace("$1::bigint", &head.to_string())
                        .replace("$2::bigint", "10000")
                ),
                &[],
            )
            .await
            .unwrap();
        let json: serde_json::Value = plan[0].get(0);
        let top = &json[0]["Plan"];
        let buffers = top["Shared Hit Blocks"].as_i64().unwrap_or(0)
            + top["Shared Read Blocks"].as_i64().unwrap_or(0);
        let (p50, p99) = (times[POLLS / 2], times[POLLS * 99 / 100]);
        p50s.push((rows, p50));
        println!("| {rows} | {setup:.1?} | {p50:.0?} | {p99:.0?} | {buffers} |");
        client
            .batch_execute(&format!("DROP SCHEMA {schema} CASCADE"))
            .await
            .unwrap();
    }
    if let (Some(first), Some(last)) = (p50s.first(), p50s.last()) {
        println!(
            "\nidle poll p50 ratio {} rows / {} rows: {:.2}",
            last.0,
            first.0,
            last.1.as_secs_f64() / first.1.as_secs_f64()
        );
    }
}
