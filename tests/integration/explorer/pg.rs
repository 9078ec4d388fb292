//! The explorer on PostgreSQL ([`super`]): every schedule of every variant,
//! over Eventuous's own `append_events` and a plain INSERT into a table
//! whose unique key on the stream position comes before the primary key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gap_healer::engine::postgres::PostgresEngine;
use gap_healer_testkit::eventuous::{self, EVENT_TYPE, TOMBSTONE_STREAM};
use gap_healer_testkit::pg;
use tokio::task::JoinHandle;
use tokio_postgres::Client;
use uuid::Uuid;

use super::{report, variants, Ending, Lab, Shape, World};

/// One variant's store and sessions on PostgreSQL.
pub struct PgWorld {
    shape: Shape,
    store: pg::Store,
    writers: [Arc<Client>; 2],
    pids: [i32; 2],
    other: Client,
    engine: Arc<PostgresEngine>,
    ids: [Uuid; 2],
}

impl PgWorld {
    async fn new(shape: Shape) -> PgWorld {
        let store = pg::Store::new("explore").await;
        let s = &store.schema;
        if shape == Shape::CheckWaits {
            // A tenant's gate: each append takes its stream's lock in the
            // CHECK, after its position is drawn, and holds it to its end.
            store
                .client
                .batch_execute(&format!(
                    "CREATE FUNCTION {s}.tenant_gate(stream int) RETURNS boolean LANGUAGE plpgsql AS $$
                     BEGIN PERFORM pg_advisory_xact_lock(hashtext('{s}'), stream); RETURN true; END $$;
                     ALTER TABLE {s}.messages ADD CONSTRAINT tenant_gate CHECK ({s}.tenant_gate(stream_id));"
                ))
                .await
                .unwrap();
        }
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
        PgWorld {
            shape,
            writers: [writers[0].clone(), writers[1].clone()],
            pids: [pids[0], pids[1]],
            other,
            engine,
            store,
            ids: [first, second],
        }
    }
}

impl World for PgWorld {
    type Engine = PostgresEngine;

    fn engine(&self) -> Arc<PostgresEngine> {
        self.engine.clone()
    }

    /// An empty store with stream `s` at Version 0 (one event, position 1)
    /// and stream `other`.
    async fn reset(&self) -> i64 {
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
        1
    }

    fn append(&self, w: usize) -> JoinHandle<Result<(), String>> {
        let c = self.writers[w].clone();
        let s = self.store.schema.clone();
        let id = self.ids[w];
        let shape = self.shape;
        tokio::spawn(async move {
            c.batch_execute("BEGIN").await.map_err(code)?;
            match shape {
                Shape::Eventuous | Shape::EventuousRetry | Shape::CheckWaits => {
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

    async fn end(&self, w: usize, ending: Ending) -> bool {
        let sql = match ending {
            Ending::Commit => "COMMIT",
            Ending::Rollback => "ROLLBACK",
        };
        self.writers[w].batch_execute(sql).await.is_ok()
    }

    async fn other_append(&self) {
        let s = &self.store.schema;
        match self.shape {
            Shape::Eventuous | Shape::EventuousRetry | Shape::CheckWaits => {
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

    async fn waiting(&self, writers: &[usize]) -> Vec<bool> {
        let pids: Vec<i32> = writers.iter().map(|w| self.pids[*w]).collect();
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

    async fn tombstones_and_holes(&self, after: i64) -> ((i64, i64, i64), i64) {
        let s = &self.store.schema;
        let c = &self.store.client;
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
        let holes: i64 = c
            .query_one(
                &format!(
                    "SELECT count(*) FROM generate_series($1::bigint + 1, (SELECT MAX(global_position) FROM {s}.messages)) g (p)
                     WHERE NOT EXISTS (SELECT 1 FROM {s}.messages m WHERE m.global_position = g.p)"
                ),
                &[&after],
            )
            .await
            .unwrap()
            .get(0);
        ((n, i64::from(max), i64::from(version)), holes)
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
    for (shape, endings) in variants(&Shape::ALL) {
        let permits = permits.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = permits.acquire().await.unwrap();
            let lab = Lab {
                shape,
                endings,
                world: PgWorld::new(shape).await,
            };
            let t = Instant::now();
            let (explored, violations) = lab.explore(None).await;
            println!(
                "explorer: {}: {explored} schedules, {} violations ({:.1} s)",
                lab.name(),
                violations.len(),
                t.elapsed().as_secs_f64()
            );
            let name = lab.name();
            lab.world.store.drop_schema().await;
            (name, explored, violations)
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    report(results, started, "PostgreSQL");
}

/// The issue's case, as a user meets it: Eventuous's own `append_events`,
/// the real binary (`--gap-timeout 1s --lock-timeout 300ms`). Append A holds
/// its insert open; append B to the same stream at the same expected version
/// waits inside its insert with its position drawn and no key; another
/// stream commits above. Before the waiting-writer check (issue 18) the
/// daemon filled B's position, and when A rolled back B's row met the
/// tombstone and was dropped while `append_events` reported success; the
/// transaction-end proof keeps it (B's transaction is open).
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
    let deferred = daemon
        .metric(r#"gap_healer_fill_attempts_total{store="default",outcome="open_transaction"}"#)
        .await
        .unwrap_or(0.0);
    assert!(
        deferred >= 1.0,
        "fills deferred while B waits: {deferred}\n{}",
        daemon.log()
    );
    assert!(
        !daemon
            .lines_containing("a transaction that may have drawn these positions is still open")
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
