//! The explorer on SQL Server or Babelfish ([`super`]), where a server is
//! given (the test kit's `mssql` module): Eventuous's own SQL Server append
//! (tests/fixtures/eventuous_mssql_procedures.sql: `append_events` in the
//! writer's transaction) and a plain INSERT into a table whose primary key
//! was created after its unique keys. A schedule, with its run without the
//! healer, took 2 to 4 s on Babelfish here (420 per variant would be hours),
//! so the test draws a seeded sample of each variant's schedules:
//! GAP_HEALER_EXPLORER_MSSQL_SCHEDULES of them (default 10), from the seed
//! GAP_HEALER_EXPLORER_MSSQL_SEED (default 1).
//!
//! A writer that waits is seen waiting in pg_locks on Babelfish (PostgreSQL
//! underneath; `@@SPID` is the backend's pid) and in
//! sys.dm_exec_requests (`blocking_session_id`) on SQL Server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use gap_healer::engine::mssql::MssqlEngine;
use gap_healer_testkit::eventuous::mssql::append_events_sql;
use gap_healer_testkit::mssql::{self as ms, rows, Client, TestDb, EVENT_TYPE, TOMBSTONE_STREAM};
use tiberius::ToSql;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::{report, variants, Ending, Lab, Shape, World};

/// The shapes explored on a TDS server: on Babelfish also `CheckWaits`,
/// whose gate is an advisory lock a T-SQL function takes (SQL Server's
/// functions take no lock of their own).
async fn shapes() -> Vec<Shape> {
    let mut shapes = vec![
        Shape::Eventuous,
        Shape::EventuousRetry,
        Shape::PlainUniqueFirst,
    ];
    if ms::is_babelfish().await {
        shapes.push(Shape::CheckWaits);
    }
    shapes
}

/// One variant's database and sessions on SQL Server or Babelfish.
pub struct MssqlWorld {
    shape: Shape,
    db: TestDb,
    babelfish: bool,
    writers: [Arc<Mutex<Client>>; 2],
    spids: [i32; 2],
    /// Setup, the other stream's appends and every read.
    admin: Mutex<Client>,
    engine: Arc<MssqlEngine>,
    ids: [Uuid; 2],
    /// The schedule's stream is `s<n>`: each schedule starts a fresh one.
    schedule: AtomicUsize,
}

impl MssqlWorld {
    async fn new(shape: Shape) -> MssqlWorld {
        let db = TestDb::create().await;
        let babelfish = ms::is_babelfish().await;
        let mut admin = db.client().await;
        if shape == Shape::PlainUniqueFirst {
            // The primary key re-created after the unique keys: on
            // Babelfish (PostgreSQL's index order) a plain INSERT then checks
            // (StreamId, StreamPosition) first and may wait there with its
            // position drawn and no key. SQL Server writes the clustered key
            // first whatever the order of creation.
            ms::exec(
                &mut admin,
                "ALTER TABLE eventuous.Messages DROP CONSTRAINT PK_Events;
                 ALTER TABLE eventuous.Messages ADD CONSTRAINT PK_Events PRIMARY KEY CLUSTERED (GlobalPosition);",
            )
            .await;
        }
        if shape == Shape::CheckWaits {
            // A tenant's gate: each append takes its stream's advisory
            // lock in the CHECK, after its position is drawn, and holds it
            // to its end (Babelfish only: see `shapes`).
            ms::exec(
                &mut admin,
                "CREATE FUNCTION eventuous.tenant_gate(@s INT) RETURNS BIT AS
                 BEGIN DECLARE @v INT; SELECT @v = COUNT(*) FROM pg_catalog.pg_advisory_xact_lock(4243, @s); RETURN 1; END",
            )
            .await;
            ms::exec(
                &mut admin,
                "ALTER TABLE eventuous.Messages ADD CONSTRAINT tenant_gate CHECK (eventuous.tenant_gate(StreamId) = 1);",
            )
            .await;
        }
        db.append("other", 1).await;
        let mut writers = Vec::new();
        let mut spids = Vec::new();
        for _ in 0..2 {
            let mut c = db.client().await;
            let spid = rows(&mut c, "SELECT CAST(@@SPID AS INT)", &[]).await[0]
                .get::<i32, _>(0)
                .unwrap();
            writers.push(Arc::new(Mutex::new(c)));
            spids.push(spid);
        }
        let first = Uuid::new_v4();
        let second = if shape == Shape::EventuousRetry {
            first
        } else {
            Uuid::new_v4()
        };
        MssqlWorld {
            shape,
            engine: Arc::new(db.engine()),
            db,
            babelfish,
            writers: [writers[0].clone(), writers[1].clone()],
            spids: [spids[0], spids[1]],
            admin: Mutex::new(admin),
            ids: [first, second],
            schedule: AtomicUsize::new(0),
        }
    }

    fn stream(&self) -> String {
        format!("s{}", self.schedule.load(Ordering::SeqCst))
    }
}

/// The server's error number, as the writers' answers carry it.
fn code(e: tiberius::error::Error) -> String {
    e.code().map_or_else(|| e.to_string(), |c| c.to_string())
}

impl World for MssqlWorld {
    type Engine = MssqlEngine;

    fn engine(&self) -> Arc<MssqlEngine> {
        self.engine.clone()
    }

    /// A fresh stream `s<n>` at Version 0 (one committed event); the
    /// position the healer starts after is that event's (the schedules with
    /// the healer before were healed to the head; those without it left
    /// their holes below, which no healer of a later schedule examines).
    async fn reset(&self) -> i64 {
        let n = self.schedule.fetch_add(1, Ordering::SeqCst) + 1;
        let positions = self.db.append(&format!("s{n}"), 1).await;
        positions[0]
    }

    fn append(&self, w: usize) -> JoinHandle<Result<(), String>> {
        let c = self.writers[w].clone();
        let id = self.ids[w];
        let shape = self.shape;
        let stream = self.stream();
        tokio::spawn(async move {
            let mut c = c.lock().await;
            c.simple_query("SET XACT_ABORT ON; BEGIN TRANSACTION;")
                .await
                .map_err(code)?
                .into_results()
                .await
                .map_err(code)?;
            let (data, version) = ("{}", 0_i32);
            let result = match shape {
                Shape::Eventuous | Shape::EventuousRetry | Shape::CheckWaits => {
                    let sql = append_events_sql(EVENT_TYPE, 1);
                    let params: [&dyn ToSql; 4] = [&stream, &version, &id, &data];
                    async { c.query(sql.as_str(), &params).await?.into_results().await }.await
                }
                Shape::PlainUniqueFirst => {
                    let sql = format!(
                        "INSERT INTO eventuous.Messages (MessageId, MessageType, StreamId, StreamPosition, JsonData, Created)
                         SELECT @P2, N'{EVENT_TYPE}', s.StreamId, s.[Version] + 1, @P3, SYSUTCDATETIME()
                         FROM eventuous.Streams AS s WHERE s.StreamName = @P1;"
                    );
                    let params: [&dyn ToSql; 3] = [&stream, &id, &data];
                    async { c.query(sql.as_str(), &params).await?.into_results().await }.await
                }
            };
            result.map(|_| ()).map_err(code)
        })
    }

    async fn end(&self, w: usize, ending: Ending) -> bool {
        let sql = match ending {
            Ending::Commit => "COMMIT TRANSACTION;",
            Ending::Rollback => "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;",
        };
        let mut c = self.writers[w].lock().await;
        let answered = async { c.simple_query(sql).await?.into_results().await }.await;
        answered.is_ok()
    }

    async fn other_append(&self) {
        let mut c = self.admin.lock().await;
        let sql = append_events_sql(EVENT_TYPE, 1);
        let (stream, any, id, data) = ("other", -2_i32, Uuid::new_v4(), "{}");
        let params: [&dyn ToSql; 4] = [&stream, &any, &id, &data];
        rows(&mut c, &sql, &params).await;
    }

    async fn waiting(&self, writers: &[usize]) -> Vec<bool> {
        let spids: Vec<String> = writers.iter().map(|w| self.spids[*w].to_string()).collect();
        let sql = if self.babelfish {
            format!(
                "SELECT DISTINCT pid FROM pg_catalog.pg_locks WHERE granted = 'false' AND pid IN ({})",
                spids.join(", ")
            )
        } else {
            format!(
                "SELECT CAST(session_id AS INT) FROM sys.dm_exec_requests
                 WHERE blocking_session_id <> 0 AND session_id IN ({})",
                spids.join(", ")
            )
        };
        let mut c = self.admin.lock().await;
        let waiting: Vec<i32> = rows(&mut c, &sql, &[])
            .await
            .iter()
            .filter_map(|r| r.get::<i32, _>(0))
            .collect();
        writers
            .iter()
            .map(|w| waiting.contains(&self.spids[*w]))
            .collect()
    }

    /// Committed rows only: READPAST skips the keys of open appends, which
    /// a plain read on SQL Server would wait for.
    async fn count_rows(&self, at_most: i64) -> i64 {
        let mut c = self.admin.lock().await;
        rows(
            &mut c,
            "SELECT COUNT_BIG(*) FROM eventuous.Messages WITH (READCOMMITTEDLOCK, READPAST) WHERE GlobalPosition <= @P1",
            &[&at_most],
        )
        .await[0]
            .get::<i64, _>(0)
            .unwrap_or(0)
    }

    async fn stored(&self, w: usize) -> bool {
        let mut c = self.admin.lock().await;
        let stream = self.stream();
        rows(
            &mut c,
            "SELECT COUNT_BIG(*) FROM eventuous.Messages AS m JOIN eventuous.Streams AS s ON s.StreamId = m.StreamId
             WHERE s.StreamName = @P1 AND m.MessageId = @P2",
            &[&stream, &self.ids[w]],
        )
        .await[0]
            .get::<i64, _>(0)
            .unwrap_or(0)
            > 0
    }

    async fn tombstones_and_holes(&self, after: i64) -> ((i64, i64, i64), i64) {
        let mut c = self.admin.lock().await;
        let t = &rows(
            &mut c,
            "SELECT COUNT_BIG(m.GlobalPosition), CAST(COALESCE(MAX(m.StreamPosition), -1) AS BIGINT),
                    CAST(COALESCE(MAX(s.[Version]), -1) AS BIGINT)
             FROM eventuous.Streams AS s LEFT JOIN eventuous.Messages AS m ON m.StreamId = s.StreamId
             WHERE s.StreamName = @P1",
            &[&TOMBSTONE_STREAM],
        )
        .await[0];
        let tombstones = (
            t.get::<i64, _>(0).unwrap_or(0),
            t.get::<i64, _>(1).unwrap_or(-1),
            t.get::<i64, _>(2).unwrap_or(-1),
        );
        // Above the schedule's start (the runs without the healer before
        // it left their holes below).
        let h = &rows(
            &mut c,
            "SELECT COALESCE(MAX(GlobalPosition) - @P1 - COUNT_BIG(*), 0) FROM eventuous.Messages WHERE GlobalPosition > @P1",
            &[&after],
        )
        .await[0];
        let holes = h.get::<i64, _>(0).unwrap_or(0);
        (tombstones, holes)
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs SQL Server: set GAP_HEALER_TEST_MSSQL or run with Docker"]
async fn a_sample_of_the_interleavings_on_sql_server_keeps_every_event() {
    let started = Instant::now();
    let schedules = env_or("GAP_HEALER_EXPLORER_MSSQL_SCHEDULES", 10_usize);
    let seed = env_or("GAP_HEALER_EXPLORER_MSSQL_SEED", 1_u64);
    let mut results = Vec::new();
    let mut server = "SQL Server";
    for (shape, endings) in variants(&shapes().await) {
        let lab = Lab {
            shape,
            endings,
            world: MssqlWorld::new(shape).await,
        };
        if lab.world.babelfish {
            server = "Babelfish";
        }
        let t = Instant::now();
        let (explored, violations) = lab.explore(Some((schedules, seed))).await;
        println!(
            "explorer on {server}: {}: {explored} distinct schedules of {schedules} drawn, {} violations ({:.1} s)",
            lab.name(),
            violations.len(),
            t.elapsed().as_secs_f64()
        );
        results.push((lab.name(), explored, violations));
        let Lab { world, .. } = lab;
        // Every session of the database closed first: a database in use
        // cannot be dropped.
        let MssqlWorld {
            db,
            writers,
            admin,
            engine,
            ..
        } = world;
        drop((writers, admin, engine));
        db.drop().await;
    }
    report(results, started, server);
}
