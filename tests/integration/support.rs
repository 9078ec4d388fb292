//! Shared test support for PostgreSQL and the real binary:
//! - [`Store`]: a fresh Eventuous schema per test in the local PostgreSQL;
//! - [`Store::append`]: appends the way Eventuous does (stream row, rows,
//!   version update, one transaction), with controllable failure;
//! - [`Subscriber`]: an all-stream subscriber following Eventuous 0.17's rules;
//! - [`Daemon`] and [`cli`]: the real `gap-healer` binary.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

pub const BIN: &str = env!("CARGO_BIN_EXE_gap-healer");
pub const EVENT_TYPE: &str = "TestEvent";
pub const TOMBSTONES: &str = "__tombstones__";
const FIXTURE: &str = include_str!("../fixtures/eventuous_postgres.sql");

/// The local PostgreSQL (override with GAP_HEALER_TEST_PG). A test that needs
/// it fails, never skips, when it is not there.
pub fn pg_url() -> String {
    std::env::var("GAP_HEALER_TEST_PG")
        .unwrap_or_else(|_| "host=127.0.0.1 port=5432 user=postgres dbname=test".into())
}

pub async fn connect() -> Client {
    let (client, conn) = tokio_postgres::connect(&pg_url(), NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "PostgreSQL at {} is required for these tests: {e}",
                pg_url()
            )
        });
    tokio::spawn(conn);
    client
}

/// One test's store: its own schema, dropped by [`Store::drop_schema`].
pub struct Store {
    pub schema: String,
    pub client: Client,
}

/// How an append ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Commit,
    /// Inserts (taking positions), then rolls back.
    RollbackAfterInsert,
}

/// An append whose transaction is still open: its positions are taken and
/// locked, not committed.
pub struct OpenAppend {
    client: Client,
    pub positions: Vec<i64>,
    pub stream: String,
}

impl OpenAppend {
    pub async fn commit(self) -> Result<(), tokio_postgres::Error> {
        self.client.batch_execute("COMMIT").await
    }
    pub async fn rollback(self) {
        self.client
            .batch_execute("ROLLBACK")
            .await
            .expect("rollback");
    }
}

impl Store {
    pub async fn new(tag: &str) -> Store {
        let client = connect().await;
        let schema = format!("gh_{tag}_{}", &Uuid::new_v4().simple().to_string()[..8]);
        client
            .batch_execute(&FIXTURE.replace("__schema__", &schema))
            .await
            .expect("create schema");
        Store { schema, client }
    }

    pub async fn drop_schema(self) {
        self.client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", self.schema))
            .await
            .expect("drop schema");
    }

    /// The connection string the healer gets.
    pub fn url(&self) -> String {
        pg_url()
    }

    /// The PostgreSQL engine over this store, as the daemon builds it.
    pub fn engine(&self) -> std::sync::Arc<gap_healer::engine::postgres::PostgresEngine> {
        std::sync::Arc::new(
            gap_healer::engine::postgres::PostgresEngine::new(&gap_healer::engine::StoreSettings {
                connection_string: gap_healer::secret::ConnectionString::new(self.url()),
                schema: self.schema.clone(),
                tombstone_stream: TOMBSTONES.into(),
                tombstone_type: "$tombstone".into(),
                connect_timeout: Duration::from_secs(5),
            })
            .expect("engine"),
        )
    }

    async fn append_in(
        &self,
        client: &Client,
        stream: &str,
        count: usize,
        message_id: Option<Uuid>,
    ) -> Result<Vec<i64>, tokio_postgres::Error> {
        let s = &self.schema;
        client
            .execute(&format!("INSERT INTO {s}.streams (stream_name) VALUES ($1) ON CONFLICT (stream_name) DO NOTHING"), &[&stream])
            .await?;
        let row = client
            .query_one(
                &format!(
                    "SELECT stream_id, version FROM {s}.streams WHERE stream_name = $1 FOR UPDATE"
                ),
                &[&stream],
            )
            .await?;
        let (id, version): (i32, i32) = (row.get(0), row.get(1));
        let mut positions = Vec::new();
        let mut written = 0;
        for i in 0..count {
            let mid = message_id.unwrap_or_else(Uuid::new_v4);
            // Eventuous's PostgreSQL append: a duplicate message id is dropped by
            // ON CONFLICT DO NOTHING, yet its identity value is burnt.
            let rows = client
                .query(
                    &format!(
                        "INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, json_data, created)
                         VALUES ($1, $2, $3, $4, '{{\"n\": 1}}', now() AT TIME ZONE 'utc')
                         ON CONFLICT (stream_id, message_id) DO NOTHING RETURNING global_position"
                    ),
                    &[&mid, &EVENT_TYPE, &id, &(version + 1 + i as i32)],
                )
                .await?;
            if let Some(r) = rows.first() {
                positions.push(r.get(0));
                written += 1;
            }
        }
        client
            .execute(
                &format!("UPDATE {s}.streams SET version = $2 WHERE stream_id = $1"),
                &[&id, &(version + written)],
            )
            .await?;
        Ok(positions)
    }

    /// Appends `count` events to `stream` and commits or rolls back.
    pub async fn append(&self, stream: &str, count: usize, ending: Ending) -> Vec<i64> {
        let client = connect().await;
        client.batch_execute("BEGIN").await.unwrap();
        let positions = self
            .append_in(&client, stream, count, None)
            .await
            .expect("append");
        client
            .batch_execute(if ending == Ending::Commit {
                "COMMIT"
            } else {
                "ROLLBACK"
            })
            .await
            .unwrap();
        positions
    }

    /// Appends one event with a given message id (a duplicate burns a position).
    pub async fn append_with_id(&self, stream: &str, id: Uuid) -> Vec<i64> {
        let client = connect().await;
        client.batch_execute("BEGIN").await.unwrap();
        let positions = self
            .append_in(&client, stream, 1, Some(id))
            .await
            .expect("append");
        client.batch_execute("COMMIT").await.unwrap();
        positions
    }

    /// Starts an append and leaves its transaction open.
    pub async fn append_open(&self, stream: &str, count: usize) -> OpenAppend {
        let client = connect().await;
        client.batch_execute("BEGIN").await.unwrap();
        let positions = self
            .append_in(&client, stream, count, None)
            .await
            .expect("append");
        OpenAppend {
            client,
            positions,
            stream: stream.into(),
        }
    }

    /// Moves the identity so the next append lands `gap` positions further on
    /// (what SQL Server's identity cache does after a failover).
    pub async fn jump_identity(&self, gap: i64) {
        let s = &self.schema;
        self.client
            .execute(
                &format!(
                    "SELECT setval(pg_get_serial_sequence('{s}.messages', 'global_position'),
                       (SELECT last_value FROM {s}.messages_global_position_seq) + $1)"
                ),
                &[&gap],
            )
            .await
            .expect("jump identity");
    }

    /// (position, stream, type) of every row, in position order.
    pub async fn rows(&self) -> Vec<(i64, String, String)> {
        let s = &self.schema;
        self.client
            .query(
                &format!("SELECT m.global_position, s.stream_name::text, m.message_type::text FROM {s}.messages m JOIN {s}.streams s USING (stream_id) ORDER BY 1"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    pub async fn tombstone_positions(&self) -> Vec<i64> {
        self.rows()
            .await
            .into_iter()
            .filter(|r| r.2 == "$tombstone")
            .map(|r| r.0)
            .collect()
    }

    pub async fn head(&self) -> i64 {
        let s = &self.schema;
        self.client
            .query_one(
                &format!("SELECT COALESCE(MAX(global_position), 0) FROM {s}.messages"),
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    /// Positions missing between 1 and the head.
    pub async fn missing(&self) -> Vec<i64> {
        let s = &self.schema;
        self.client
            .query(
                &format!(
                    "SELECT g FROM generate_series(1, (SELECT COALESCE(MAX(global_position), 0) FROM {s}.messages)) g
                     WHERE NOT EXISTS (SELECT 1 FROM {s}.messages m WHERE m.global_position = g) ORDER BY g"
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Polls until no position below the head is missing, or `limit` passes;
    /// whether it got there.
    pub async fn wait_until_healed(&self, limit: Duration) -> bool {
        let started = Instant::now();
        while !self.missing().await.is_empty() {
            if started.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }

    /// Asserts invariant 5: the tombstone stream's positions are 0..n-1 and its version n-1.
    pub async fn assert_tombstone_stream_consistent(&self) -> i64 {
        let s = &self.schema;
        let row = self
            .client
            .query_opt(
                &format!(
                    "SELECT s.version, COUNT(m.*), COALESCE(MAX(m.stream_position), -1), COUNT(DISTINCT m.stream_position)
                     FROM {s}.streams s LEFT JOIN {s}.messages m USING (stream_id) WHERE s.stream_name = $1 GROUP BY s.version"
                ),
                &[&TOMBSTONES],
            )
            .await
            .unwrap();
        let Some(row) = row else { return 0 };
        let (version, count, max, distinct): (i32, i64, i32, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        assert_eq!(
            i64::from(version),
            count - 1,
            "tombstone stream version {version} but {count} rows"
        );
        assert_eq!(
            i64::from(max),
            count - 1,
            "tombstone positions end at {max} but {count} rows"
        );
        assert_eq!(distinct, count);
        count
    }

    pub async fn set_checkpoint(&self, id: &str, position: Option<i64>) {
        let s = &self.schema;
        self.client
            .execute(&format!("INSERT INTO {s}.checkpoints (id, position) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET position = $2"), &[&id, &position])
            .await
            .unwrap();
    }
}

/// An event a subscriber handled.
#[derive(Clone, Debug)]
pub struct Handled {
    pub position: i64,
    pub stream: String,
    pub at: Instant,
}

/// An all-stream subscription following Eventuous 0.17's rules: reads pages in
/// position order from the next expected position; at a hole it records the
/// gap and stops the page; it releases the gap only when the row after it is
/// older than one hour (GapAgeThresholdMs); it ignores `$tombstone` rows.
pub struct Subscriber {
    schema: String,
    client: Client,
    pub next: i64,
    pub gap_seen: Option<(i64, Instant)>,
    pub handled: Vec<Handled>,
    pub ignored: u64,
}

impl Subscriber {
    pub async fn new(store: &Store) -> Subscriber {
        Subscriber {
            schema: store.schema.clone(),
            client: connect().await,
            next: 1,
            gap_seen: None,
            handled: vec![],
            ignored: 0,
        }
    }

    /// One poll: handles what it may; returns how many events it handled.
    pub async fn poll(&mut self) -> usize {
        let s = &self.schema;
        let rows = self
            .client
            .query(
                &format!(
                    "SELECT m.global_position, st.stream_name::text, m.message_type::text,
                            m.created < (now() AT TIME ZONE 'utc') - interval '1 hour'
                     FROM {s}.messages m JOIN {s}.streams st USING (stream_id)
                     WHERE m.global_position >= $1 ORDER BY m.global_position LIMIT 500"
                ),
                &[&self.next],
            )
            .await
            .unwrap();
        let before = self.handled.len();
        for r in rows {
            let (position, stream, kind, old): (i64, String, String, bool) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            if position > self.next {
                if old {
                    self.next = position; // GapAgeThresholdMs: skip the hole
                } else {
                    if self.gap_seen.map(|(p, _)| p) != Some(self.next) {
                        self.gap_seen = Some((self.next, Instant::now()));
                    }
                    break;
                }
            }
            self.gap_seen = None;
            if kind == "$tombstone" {
                self.ignored += 1;
            } else {
                self.handled.push(Handled {
                    position,
                    stream,
                    at: Instant::now(),
                });
            }
            self.next = position + 1;
        }
        self.handled.len() - before
    }

    /// Polls every 50 ms until `pred` holds or `limit` passes; the moment it held.
    pub async fn poll_until(
        &mut self,
        limit: Duration,
        mut pred: impl FnMut(&Subscriber) -> bool,
    ) -> Option<Instant> {
        let end = Instant::now() + limit;
        loop {
            self.poll().await;
            if pred(self) {
                return Some(Instant::now());
            }
            if Instant::now() >= end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn handled_stream(&self, stream: &str) -> bool {
        self.handled.iter().any(|h| h.stream == stream)
    }
}

/// The output of one run of the binary.
#[derive(Debug)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `gap-healer ARGS` to completion with only the given GAP_HEALER_* variables.
pub fn cli(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("GAP_HEALER_") || k == "RUST_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("run gap-healer");
    Output {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// The common flags for a store.
pub fn store_args(store: &Store) -> Vec<String> {
    vec![
        "--engine".into(),
        "postgres".into(),
        "--connection-string".into(),
        store.url(),
        "--schema".into(),
        store.schema.clone(),
    ]
}

/// `gap-healer run` in the background, with its stderr captured.
pub struct Daemon {
    pub child: Child,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<String>>,
}

impl Daemon {
    pub fn start(store: &Store, extra: &[&str]) -> Daemon {
        let mut args = vec!["run".to_string()];
        args.extend(store_args(store));
        args.extend(["--log-format".into(), "json".into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        Daemon::spawn(&args, &[])
    }

    /// `gap-healer ARGS --metrics-addr 127.0.0.1:0` with only the given
    /// GAP_HEALER_* variables; waits for its "listening on" line.
    pub fn spawn(args: &[String], env: &[(&str, &str)]) -> Daemon {
        let mut cmd = Command::new(BIN);
        cmd.args(args).args(["--metrics-addr", "127.0.0.1:0"]);
        for (k, _) in std::env::vars() {
            if k.starts_with("GAP_HEALER_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start gap-healer run");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(addr) = line.split("listening on ").nth(1) {
                    if let Some(tx) = tx.take() {
                        let addr: String = addr
                            .chars()
                            .take_while(|c| !c.is_whitespace() && *c != '"')
                            .collect();
                        let _ = tx.send(addr);
                    }
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("gap-healer did not start: {}", log.lock().unwrap()));
        Daemon {
            child,
            addr: addr.parse().expect("listen address"),
            log,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let resp = reqwest::get(format!("http://{}{path}", self.addr))
            .await
            .expect("http get");
        (resp.status().as_u16(), resp.text().await.unwrap())
    }

    /// The value of one sample of the scrape, e.g. `gap_healer_open_gaps`.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics").await;
        body.lines().find_map(|l| {
            l.strip_prefix(sample)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
    }

    /// SIGTERM, then waits; returns (exit code, time to exit).
    pub fn terminate(mut self) -> (Option<i32>, Duration, String) {
        let started = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if started.elapsed() > Duration::from_secs(10) {
                self.child.kill().ok();
                break self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = started.elapsed();
        std::thread::sleep(Duration::from_millis(50));
        let log = self.log.lock().unwrap().clone();
        (status.code(), took, log)
    }

    pub fn kill9(mut self) -> String {
        self.child.kill().ok();
        self.child.wait().ok();
        std::thread::sleep(Duration::from_millis(50));
        let log = self.log.lock().unwrap().clone();
        log
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
