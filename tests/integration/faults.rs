//! Fault handling of the real binary against real PostgreSQL servers: the
//! database down at start and going away under a running daemon, connections
//! killed in the middle of a fill, statement timeouts, a read-only database,
//! a full disk (a tablespace on a tmpfs filled to the last byte: this one
//! mounts, so it needs root, as CI runs), and the leader's lock session dying
//! under it.
//!
//! The shared server (127.0.0.1:5432) is never restarted here (that is the
//! chaos test's job, in its own binary): a fault that needs a server to stop,
//! start or change database-wide settings gets a throwaway cluster of its own
//! ([`Throwaway`]), made with initdb on a free port and removed afterwards.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use gap_healer_testkit::bin::{cli, timing, Daemon};
use gap_healer_testkit::eventuous::EVENT_TYPE;
use gap_healer_testkit::logs::{facts, format_us};
use gap_healer_testkit::pg::{self, connect, free_port, is_root, pg_url, Ending, Store, Throwaway};
use gap_healer_testkit::wait::until as wait_for;
use nix::sys::signal::Signal;
use uuid::Uuid;

/// `gap-healer run` with the connection string in the environment for the
/// `store` schema, filling every hole at once (gap_timeout 0, 100 ms polls,
/// from the first position).
fn fill_now(cs: &str) -> Daemon {
    Daemon::with_connection_string(cs, "store", &timing("0s", "100ms", &[]))
}

/// Watches a daemon whose fills all fail for `watch`: each failure is
/// reported with SQLSTATE `code`, retried with backoff (0.5 s, 1 s, 2 s, ...;
/// at most `most` attempts, not one per poll), and the daemon stays up and
/// healthy. The failure lines.
async fn fill_errors_backed_off(
    d: &mut Daemon,
    code: &str,
    watch: Duration,
    most: usize,
) -> Vec<serde_json::Value> {
    tokio::time::sleep(watch).await;
    let failed = d.lines_with("fill failed; retrying later");
    assert!(!failed.is_empty(), "no fill error reported:\n{}", d.log());
    assert!(
        failed
            .iter()
            .all(|l| l["error"].as_str().is_some_and(|e| e.contains(code))),
        "not all {code}: {failed:?}"
    );
    assert!(
        failed.len() <= most,
        "{} fill attempts in {watch:?}",
        failed.len()
    );
    assert!(d.alive(), "{}", d.log());
    assert_eq!(d.get("/healthz").await.0, 200);
    failed
}

async fn ready(d: &Daemon) -> u16 {
    d.get("/readyz").await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_down_at_start_then_up_then_down_and_up_again() {
    let pg = Throwaway::init("down", "trust");
    // A password the server does not need (trust), so the logs can be
    // searched for it.
    let cs = format!(
        "{} password=DownPw_71x connect_timeout=1",
        pg.url("postgres")
    );
    let mut d = Daemon::with_connection_string(
        &cs,
        "store",
        &timing("200ms", "100ms", &["--connect-timeout", "1s"]),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(d.alive(), "exited with the database down:\n{}", d.log());
    assert_eq!(
        d.get("/healthz").await.0,
        200,
        "live while the database is down"
    );
    let (code, body) = d.get("/readyz").await;
    assert_eq!(code, 503, "not ready while the database is down: {body}");
    assert!(body.contains("database"), "{body}");
    let retries = d.lines_with("scan failed");
    assert!(!retries.is_empty(), "no retry lines:\n{}", d.log());
    // Backoff, not a hot loop: at most a handful of attempts in 3 s.
    assert!(retries.len() <= 10, "{} scan retries in 3 s", retries.len());
    for r in &retries {
        assert_eq!(r["level"], "WARN", "{r}");
        assert!(r["retry_in_ms"].as_u64().is_some(), "{r}");
        assert!(r["error"].as_str().is_some_and(|e| !e.is_empty()), "{r}");
    }
    // The scan's line says why. The election stays out while no scan has
    // succeeded (only a healer that can fill leads), so it logs nothing of
    // the database and does not log in every second.
    assert!(
        retries.iter().any(|l| l["error"]
            .as_str()
            .is_some_and(|e| e.contains("Connection refused"))),
        "{}",
        d.log()
    );
    assert!(
        d.lines_with("leader election: cannot reach the database")
            .is_empty(),
        "{}",
        d.log()
    );
    assert_eq!(d.metric("gap_healer_leader").await, Some(0.0));
    println!(
        "database down at start: {} retry lines in 3 s, e.g. {}",
        retries.len(),
        retries[0]
    );

    // The server comes up: the daemon connects, becomes ready and heals.
    pg.start();
    let store = pg.store("postgres").await;
    store.append_holes(&[1]).await;
    let up = Instant::now();
    assert!(
        wait_for(Duration::from_secs(40), || async { ready(&d).await == 200 }).await,
        "not ready after the server came up:\n{}",
        d.log()
    );
    println!("server up: ready after {:?}", up.elapsed());
    assert!(
        store.wait_until_healed(Duration::from_secs(20)).await,
        "hole not filled after the server came up:\n{}",
        d.log()
    );
    assert!(!d.lines_with("database reachable again").is_empty());

    // The server goes away under the running daemon: not ready, still alive.
    drop(store);
    pg.stop();
    assert!(
        wait_for(Duration::from_secs(20), || async { ready(&d).await == 503 }).await,
        "still ready with the server down:\n{}",
        d.log()
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(d.alive(), "exited when the server went down:\n{}", d.log());
    assert_eq!(d.get("/healthz").await.0, 200);

    // And comes back: the daemon heals new holes again.
    pg.start();
    let store = pg.existing_store("postgres").await;
    store.append("Y", 1, Ending::RollbackAfterInsert).await;
    store.append("C", 1, Ending::Commit).await;
    let back = Instant::now();
    assert!(
        wait_for(Duration::from_secs(40), || async {
            store.missing().await.is_empty() && ready(&d).await == 200
        })
        .await,
        "not healing after the server came back:\n{}",
        d.log()
    );
    println!(
        "server back: hole healed and ready after {:?}",
        back.elapsed()
    );
    assert_eq!(store.tombstone_positions().await, vec![2, 4]);
    store.assert_tombstone_stream_consistent().await;
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains("DownPw_71x"), "password in the log:\n{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// The backends of the connections whose application_name is `app`.
async fn backends(store: &Store, app: &str) -> Vec<(i32, Option<String>, String)> {
    store
        .client
        .query(
            "SELECT pid, wait_event_type::text, COALESCE(query, '') FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Waits until one of the healer's connections waits on a lock in its fill
/// insert, then terminates every one of its connections (fill, pool, leader).
async fn kill_while_fill_waits(store: &Store, app: &str) -> usize {
    assert!(
        wait_for(Duration::from_secs(15), || async {
            backends(store, app).await.iter().any(|(_, wait, q)| {
                wait.as_deref() == Some("Lock") && q.contains("OVERRIDING SYSTEM VALUE")
            })
        })
        .await,
        "the fill never waited on the held key: {:?}",
        backends(store, app).await
    );
    let killed: i64 = store
        .client
        .query_one(
            "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) t",
            &[&app],
        )
        .await
        .unwrap()
        .get(0);
    killed as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_killed_while_a_fill_waits_rolls_back_and_is_retried() {
    let store = Store::new("fault_kill").await;
    let app = format!("gh-{}", store.schema);
    let cs = pg::named(&store.url(), &app);
    // A key held by a writer that draws nothing (an explicit insert), so
    // the fill itself waits on it: the transaction-end proof waits for a
    // drawing append before any fill runs.
    let open = store.open_insert_between().await;
    let mut d = Daemon::with_connection_string(
        &cs,
        &store.schema,
        &timing("0s", "50ms", &["--lock-timeout", "20s"]),
    );

    // 1. Killed while waiting on an append that then rolls back: the fill is
    //    retried and fills the position.
    let killed = kill_while_fill_waits(&store, &app).await;
    assert!(
        killed >= 2,
        "the fill's and the leader's connections: {killed}"
    );
    assert!(
        wait_for(Duration::from_secs(10), || async {
            !d.lines_with("fill failed; retrying later").is_empty()
        })
        .await,
        "the broken fill was not reported:\n{}",
        d.log()
    );
    assert!(
        store.tombstone_positions().await.is_empty(),
        "the killed fill wrote nothing"
    );
    open.rollback().await;
    assert!(
        store.wait_until_healed(Duration::from_secs(30)).await,
        "the fill was not retried after the connection was killed:\n{}",
        d.log()
    );
    assert_eq!(store.tombstone_positions().await, vec![2]);
    assert_eq!(store.assert_tombstone_stream_consistent().await, 1);

    // 2. Killed while waiting on an append that then commits: the event stays.
    let held = store.append("Y", 1, Ending::RollbackAfterInsert).await[0];
    store.append("C", 1, Ending::Commit).await;
    let open = store.insert_open_at("slow2", held).await;
    kill_while_fill_waits(&store, &app).await;
    open.commit()
        .await
        .expect("the held append commits: no tombstone took its key");
    store.append("X", 1, Ending::RollbackAfterInsert).await;
    store.append("D", 1, Ending::Commit).await;
    assert!(
        store.wait_until_healed(Duration::from_secs(30)).await,
        "not healing after the second kill:\n{}",
        d.log()
    );
    let rows = store.rows().await;
    assert!(
        rows.iter()
            .any(|r| r.0 == held && r.1 == "slow2" && r.2 == EVENT_TYPE),
        "{rows:?}"
    );
    assert_eq!(store.assert_tombstone_stream_consistent().await, 2);
    assert!(d.alive(), "{}", d.log());
    assert!(
        wait_for(Duration::from_secs(10), || async {
            d.metric("gap_healer_leader").await == Some(1.0)
        })
        .await,
        "leadership not regained:\n{}",
        d.log()
    );
    let errors = d
        .metric("gap_healer_fill_attempts_total{outcome=\"error\"}")
        .await;
    assert!(errors >= Some(2.0), "{errors:?}");
    let failed = d.lines_with("fill failed; retrying later");
    println!(
        "connection killed mid-fill: {} fill error(s) reported, e.g. {}",
        failed.len(),
        failed[0]
    );
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
}

/// A login role with exactly the rights `gap-healer sql` prints; the
/// connection string as it.
async fn healer_role(store: &Store, role: &str) -> String {
    let out = cli(
        &[
            "sql",
            "--engine",
            "postgres",
            "--schema",
            &store.schema,
            "--role",
            role,
        ],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.all());
    let cs = store.create_login(role).await;
    store
        .client
        .batch_execute(&out.stdout)
        .await
        .expect("apply the printed grants");
    cs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_is_reported_and_retried() {
    let store = Store::new("fault_stmt").await;
    let role = format!("{}_role", store.schema);
    let cs = healer_role(&store, &role).await;
    // Shorter than the healer's lock_timeout: a fill waiting on a held key is
    // cancelled by the server (57014) before the healer gives up on the lock.
    store
        .client
        .batch_execute(&format!(
            "ALTER ROLE {role} SET statement_timeout = '300ms'"
        ))
        .await
        .unwrap();
    // A key held by an explicit insert: the fill waits on it.
    let open = store.open_insert_between().await;
    let mut d = Daemon::with_connection_string(
        &cs,
        &store.schema,
        &timing("0s", "100ms", &["--lock-timeout", "3s"]),
    );
    assert!(
        wait_for(Duration::from_secs(15), || async {
            d.lines_with("fill failed; retrying later").len() >= 2
        })
        .await,
        "no statement timeout reported:\n{}",
        d.log()
    );
    let failed = d.lines_with("fill failed; retrying later");
    assert!(
        failed
            .iter()
            .all(|l| l["error"].as_str().is_some_and(|e| e.contains("57014"))),
        "{failed:?}"
    );
    println!("statement timeout: {}", failed[0]);
    assert!(d.alive());
    assert_eq!(d.get("/healthz").await.0, 200);
    assert!(store.tombstone_positions().await.is_empty());
    open.rollback().await;
    assert!(
        store.wait_until_healed(Duration::from_secs(40)).await,
        "not retried after the statement timeouts:\n{}",
        d.log()
    );
    assert_eq!(store.assert_tombstone_stream_consistent().await, 1);
    let errors = d
        .metric("gap_healer_db_errors_total{operation=\"fill\"}")
        .await;
    assert!(errors >= Some(2.0), "{errors:?}");
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
}

/// A throwaway cluster with a database `ro` whose `store` schema has the
/// Eventuous tables and a hole at 2.
async fn database_ro_with_a_hole(tag: &str) -> (Throwaway, Store) {
    let pg = Throwaway::started(tag, "trust");
    pg.create_database("ro").await;
    let store = pg.store("ro").await;
    store.append_holes(&[1]).await;
    (pg, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_database_is_reported_and_retried_never_a_crash_loop() {
    let (pg, store) = database_ro_with_a_hole("ro").await;
    store
        .client
        .batch_execute("ALTER DATABASE ro SET default_transaction_read_only = on")
        .await
        .unwrap();
    let app = "gh-fault-ro";
    let cs = pg::named(&pg.url("ro"), app);
    let mut d = fill_now(&cs);
    let watch = Duration::from_secs(5);
    let failed = fill_errors_backed_off(&mut d, "25006", watch, 6).await;
    assert_eq!(store.missing().await, vec![2]);
    println!(
        "read-only database: {} fill attempts in {watch:?}, e.g. {}",
        failed.len(),
        failed[0]
    );

    // Writable again. Sessions keep the database default they started with,
    // so, as a DBA would, end the healer's sessions: it reconnects and fills.
    store
        .client
        .batch_execute("ALTER DATABASE ro RESET default_transaction_read_only")
        .await
        .unwrap();
    store
        .client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .unwrap();
    assert!(
        store.wait_until_healed(Duration::from_secs(40)).await,
        "not filled once writable:\n{}",
        d.log()
    );
    assert_eq!(store.assert_tombstone_stream_consistent().await, 1);
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
    drop(pg);
}

/// A database that was read-only (`ALTER DATABASE ... SET
/// default_transaction_read_only`) and is writable again: the healer should
/// heal without anyone ending its sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_database_made_writable_again_heals_without_reconnecting() {
    let (pg, store) = database_ro_with_a_hole("ro2").await;
    let admin = pg.admin("postgres").await;
    admin
        .batch_execute("ALTER DATABASE ro SET default_transaction_read_only = on")
        .await
        .unwrap();
    let d = fill_now(&pg.url("ro"));
    assert!(
        wait_for(Duration::from_secs(10), || async {
            !d.lines_with("fill failed; retrying later").is_empty()
        })
        .await
    );
    admin
        .batch_execute("ALTER DATABASE ro RESET default_transaction_read_only")
        .await
        .unwrap();
    let healed = store.wait_until_healed(Duration::from_secs(45)).await;
    let (_, _, log) = d.terminate();
    assert!(
        healed,
        "still failing 45 s after the database became writable:\n{log}"
    );
}

/// Leader safety when only the leader's lock session dies (a network blip on
/// one connection, `idle_session_timeout`, a proxy restart): the server frees
/// the lock at once, a follower takes it within a second, while the old leader
/// learns of it only at its next heartbeat (up to 1 s, plus 1 s timeout),
/// still filling through its pooled connections meanwhile. The log must show
/// no fill by one process after another became the leader and before it
/// stepped down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_session_killed_no_fill_while_another_leads() {
    let store = Store::new("fault_leader").await;
    let (app_a, app_b) = (
        format!("gha-{}", store.schema),
        format!("ghb-{}", store.schema),
    );
    let flags = timing("0s", "20ms", &[]);
    let a = Daemon::with_connection_string(&pg::named(&store.url(), &app_a), &store.schema, &flags);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = Daemon::with_connection_string(&pg::named(&store.url(), &app_b), &store.schema, &flags);
    // Holes appear all the time, so whoever leads fills every ~20 ms.
    let holes = {
        let s = Store::open(connect().await, &store.url(), &store.schema);
        tokio::spawn(async move {
            for _ in 0..400 {
                s.append_here("X", 1, Ending::RollbackAfterInsert).await;
                s.append_here("A", 1, Ending::Commit).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let mut violations = Vec::new();
    for round in 0..4 {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        // Kill the current leader's lock session only.
        let leader_app = if a.metric("gap_healer_leader").await == Some(1.0) {
            &app_a
        } else {
            &app_b
        };
        store
            .client
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1
                   AND pid IN (SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted)",
                &[leader_app],
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        let _ = round;
    }
    holes.abort();
    let (_, _, log_a) = a.terminate();
    let (_, _, log_b) = b.terminate();
    // What each log says: when the process became the leader, and when each
    // of its fills started: the logged time minus the fill's duration, which
    // the log gives in whole milliseconds, so between `start_us` (a whole
    // millisecond more) and a millisecond after it.
    let parse = |log: &str| {
        let f = facts(&log.lines().collect::<Vec<_>>(), 0, i64::MAX);
        let fills: Vec<(i64, i64)> = f
            .fills
            .iter()
            .filter(|x| x.message.starts_with("filled hole with tombstones"))
            .map(|x| (x.start_us, x.start_us + 1_000))
            .collect();
        (f.became, fills)
    };
    let (became_a, fills_a) = parse(&log_a);
    let (became_b, fills_b) = parse(&log_b);
    // The fencing invariant: a fill may only start while its process is the
    // most recent one to have taken the lock. A stale leader (its lock
    // session gone, its heartbeat not yet noticed) must not fill once the
    // other process has taken over; its fence refuses inside the transaction.
    for (fills, own, other, who) in [
        (&fills_a, &became_a, &became_b, "A"),
        (&fills_b, &became_b, &became_a, "B"),
    ] {
        for (earliest, latest) in fills {
            // Its own lead began by the fill's latest start; the other's
            // surely before its earliest.
            let mine = own.iter().filter(|t| *t <= latest).max();
            let theirs = other.iter().filter(|t| *t < earliest).max();
            if let (Some(mine), Some(theirs)) = (mine, theirs) {
                if theirs > mine {
                    violations.push(format!(
                        "{who} started a fill at {} after the other took the lock at {} (its own lead began {})",
                        format_us(*earliest),
                        format_us(*theirs),
                        format_us(*mine)
                    ));
                }
            }
        }
    }
    println!(
        "took the lock: A {} times, B {} times; fills: A {}, B {}",
        became_a.len(),
        became_b.len(),
        fills_a.len(),
        fills_b.len()
    );
    assert!(
        became_a.len() + became_b.len() >= 3,
        "the lock changed hands too rarely"
    );
    // On a failure, what each process said about leading and filling, for
    // telling a stale leader from a log that lost a line.
    let said = |log: &str| -> String {
        log.lines()
            .filter(|l| {
                ["leader", "lead", "fence", "filled hole"]
                    .iter()
                    .any(|w| l.contains(w))
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        violations.is_empty(),
        "two fillers at once, {} fills in all, e.g.:\n{}\n--- A:\n{}\n--- B:\n{}",
        violations.len(),
        violations[..violations.len().min(10)].join("\n"),
        said(&log_a),
        said(&log_b)
    );
}

/// Never a crash loop on a missing table either: the daemon keeps running,
/// says what is wrong, and heals once the table exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_tables_are_reported_and_the_daemon_waits_for_them() {
    let c = connect().await;
    let schema = pg::schema_name("fault_missing");
    let _schema = pg::Guard::schema(&pg_url(), &schema);
    c.batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    let mut d = Daemon::with_connection_string(&pg_url(), &schema, &timing("0s", "100ms", &[]));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let failed = d.lines_with("scan failed");
    assert!(!failed.is_empty(), "{}", d.log());
    assert!(
        failed.iter().all(|l| l["level"] == "ERROR"),
        "permanent errors are errors: {failed:?}"
    );
    assert!(
        failed[0]["error"]
            .as_str()
            .is_some_and(|e| e.contains("messages does not exist")),
        "{}",
        failed[0]
    );
    assert!(failed.len() <= 8, "{} attempts in 3 s", failed.len());
    assert!(d.alive());
    assert_eq!(d.get("/readyz").await.0, 503);
    c.batch_execute(&format!("DROP SCHEMA {schema}"))
        .await
        .unwrap();
    let store = Store::create(c, &pg_url(), &schema)
        .await
        .expect("create schema");
    store.append_holes(&[1]).await;
    assert!(
        store.wait_until_healed(Duration::from_secs(40)).await,
        "not healing once the tables exist:\n{}",
        d.log()
    );
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
}

/// A tmpfs of `size` mounted on a directory of its own, owned by postgres:
/// a real filesystem that really fills up. Unmounted (lazily) on drop.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        assert!(
            is_root(),
            "the disk-full test mounts a tmpfs and needs root (CI runs as root); run it as root or skip it with --skip disk_full"
        );
        let dir = std::env::temp_dir().join(format!(
            "gh-full-{}",
            &Uuid::new_v4().simple().to_string()[..8]
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0700")])
            .arg("tmpfs")
            .arg(&dir)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mount a {size} tmpfs on {}",
            dir.display()
        );
        let t = Tmpfs { dir };
        let ok = Command::new("chown")
            .args(["postgres:postgres", t.dir.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(ok.success(), "chown {} to postgres", t.dir.display());
        t
    }

    /// Writes a ballast file until the filesystem refuses with ENOSPC; its size.
    fn fill(&self) -> u64 {
        use std::io::Write as _;
        let mut f = std::fs::File::create(self.dir.join("ballast")).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("filling {}: {e}", self.dir.display()),
            }
        }
        written
    }

    fn free(&self) {
        std::fs::remove_file(self.dir.join("ballast")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// A real disk-full: the store's tables live in a tablespace on an 8 MiB
/// tmpfs, filled to the last byte by a ballast file. Every fill fails with
/// 53100 and rolls back whole (no tombstone, no tombstone-stream row); the
/// daemon reports it, backs off, stays up and healthy; once space is freed
/// the next retry fills the hole without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_is_reported_retried_and_healed_once_space_is_freed() {
    // Declared first, so dropped after the cluster has stopped.
    let disk = Tmpfs::mount("8m");
    let pg = Throwaway::started("full", "trust");
    let admin = pg.admin("postgres").await;
    admin
        .batch_execute(&format!(
            "CREATE TABLESPACE small LOCATION '{}'",
            disk.dir.display()
        ))
        .await
        .unwrap();
    admin
        .batch_execute("CREATE DATABASE store_on_tmpfs TABLESPACE small")
        .await
        .unwrap();
    let store = pg.store("store_on_tmpfs").await;
    let file: String = store
        .client
        .query_one("SELECT pg_relation_filepath('store.messages')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        file.starts_with("pg_tblspc/"),
        "store.messages is not on the tmpfs: {file}"
    );
    store.append("A", 1, Ending::Commit).await;
    // A 3,000-wide hole (an identity cache jump): thousands of tombstones
    // cannot fit in the pages the table already has.
    store.jump_identity(3000).await;
    store.append("B", 1, Ending::Commit).await;
    let hole = store.missing().await;
    assert_eq!(hole.len(), 3000);
    let ballast = disk.fill();

    let app = "gh-fault-full";
    let cs = pg::named(&pg.url("store_on_tmpfs"), app);
    let mut d = fill_now(&cs);
    let watch = Duration::from_secs(6);
    let failed = fill_errors_backed_off(&mut d, "53100", watch, 5).await;
    let errors = d
        .metric("gap_healer_fill_attempts_total{outcome=\"error\"}")
        .await
        .unwrap_or_default();
    assert!(errors >= 1.0, "fill errors not counted: {errors}");
    // Nothing half-written: the hole is whole and no tombstone stream exists.
    assert_eq!(store.missing().await, hole);
    assert_eq!(store.assert_tombstone_stream_consistent().await, 0);
    println!(
        "disk full: {ballast} bytes of ballast; {} fill attempts in {watch:?}, e.g. {}",
        failed.len(),
        failed[0]["error"]
    );

    disk.free();
    let freed = Instant::now();
    assert!(
        store.wait_until_healed(Duration::from_secs(45)).await,
        "not filled once space was freed:\n{}",
        d.log()
    );
    println!(
        "disk full: healed {:?} after the space was freed",
        freed.elapsed()
    );
    assert_eq!(store.assert_tombstone_stream_consistent().await, 3000);
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
    drop(store);
    drop(admin);
    drop(pg);
}

/// `give_up_after`: a daemon whose every scan fails (nothing listens on the
/// port) exits 3 once they have failed that long, not before, and says why;
/// the password never shows. Without the key it keeps retrying (above). A
/// refused connection fails the scan at once (a host that does not answer
/// takes connect_timeout, 5 s by default), so the exit comes on time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_up_after_ends_the_daemon_with_exit_3() {
    let cs = format!(
        "host=127.0.0.1 port={} user=postgres dbname=test password=GiveUp_pw93 connect_timeout=1",
        free_port()
    );
    let mut d = Daemon::with_connection_string(&cs, "eventuous", &["--give-up-after", "2s"]);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = d.try_wait() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still running 20 s after start:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    let log = d.log();
    println!(
        "give_up_after 2s: exited {:?} after {took:?}",
        status.code()
    );
    assert_eq!(status.code(), Some(3), "{log}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}\n{log}"
    );
    let gave_up = d.lines_with("every scan has failed for longer than give_up_after");
    assert_eq!(gave_up.len(), 1, "{log}");
    assert_eq!(gave_up[0]["level"], "ERROR");
    assert!(d.lines_with("scan failed").len() >= 2, "{log}");
    assert!(!log.contains("GiveUp_pw93"), "{log}");
}

/// A leader that stops without dying: SIGSTOP stands for a VM pause, CPU
/// throttling to nothing, or a network partition (its sockets stay open, so
/// the server does not end its session by itself). The server must still
/// release its lock within a bounded time, a follower take over and fill,
/// and the old leader, resumed, step down without filling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_leader_loses_the_lock_and_a_follower_takes_over() {
    let store = Store::new("fault_pause").await;
    store.append("A", 1, Ending::Commit).await;
    let flags = [
        "--gap-timeout",
        "200ms",
        "--poll-interval",
        "50ms",
        "--start-from",
        "0",
    ];
    let a = Daemon::start(&store, &flags);
    let b = Daemon::start(&store, &flags);
    let started = Instant::now();
    let leaders = loop {
        let leaders = (
            a.metric("gap_healer_leader").await.unwrap_or(0.0),
            b.metric("gap_healer_leader").await.unwrap_or(0.0),
        );
        if leaders.0 + leaders.1 == 1.0 {
            break leaders;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no single leader: {leaders:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (old, new) = if leaders.0 == 1.0 { (a, b) } else { (b, a) };

    old.signal(Signal::SIGSTOP);
    let paused = Instant::now();
    let took_over = wait_for(Duration::from_secs(30), || async {
        new.metric("gap_healer_leader").await == Some(1.0)
    })
    .await;
    let took = paused.elapsed();
    if !took_over {
        old.signal(Signal::SIGCONT);
        panic!(
            "no takeover 30 s after the leader was paused:\n{}",
            new.log()
        );
    }
    println!("leader paused (SIGSTOP): a follower leads {took:?} later");
    store.append("X", 2, Ending::RollbackAfterInsert).await;
    store.append("B", 1, Ending::Commit).await;
    let healed = store.wait_until_healed(Duration::from_secs(15)).await;

    old.signal(Signal::SIGCONT);
    let resumed = Instant::now();
    let stepped_down = wait_for(Duration::from_secs(10), || async {
        !old.lines_with("stepped down as leader").is_empty()
    })
    .await;
    let step_down_took = resumed.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(healed, "the new leader did not fill:\n{}", new.log());
    assert!(took <= Duration::from_secs(10), "takeover took {took:?}");
    assert!(
        stepped_down,
        "the resumed leader did not step down:\n{}",
        old.log()
    );
    println!("  resumed: stepped down {step_down_took:?} after SIGCONT");
    assert_eq!(old.metric("gap_healer_leader").await, Some(0.0));
    assert_eq!(new.metric("gap_healer_leader").await, Some(1.0));
    assert!(
        old.lines_with("filled hole with tombstones").is_empty(),
        "the paused leader filled:\n{}",
        old.log()
    );
    store.assert_tombstone_stream_consistent().await;
    let (code, _, log) = old.terminate();
    assert_eq!(code, Some(0), "{log}");
    let (code, _, log) = new.terminate();
    assert_eq!(code, Some(0), "{log}");
}
