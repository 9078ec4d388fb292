//! Many stores in one daemon, from a `[[stores]]` file: each healed, a
//! broken one delaying none, its figures under its own `store` label, one
//! pool for the stores of one database, and `--store` for the one-shot
//! commands.

use std::time::{Duration, Instant};

use gap_healer_testkit::bin::{cli, Daemon};
use gap_healer_testkit::pg::{connect, named, pg_url, with_param, Store};
use gap_healer_testkit::wait::until as wait_for;

/// A fleet file: the top-level keys, then one `[[stores]]` entry per
/// `(name, connection string, schema)`.
fn fleet_file(tag: &str, top: &str, stores: &[(&str, String, &str)]) -> std::path::PathBuf {
    let mut text = format!("engine = \"postgres\"\n{top}\n");
    for (name, cs, schema) in stores {
        text += &format!(
            "\n[[stores]]\nname = \"{name}\"\nconnection_string = {}\nschema = \"{schema}\"\n",
            toml::Value::String(cs.clone())
        );
    }
    let dir = std::env::temp_dir().join(format!("gh-fleet-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fleet.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `gap-healer run --config FILE --log-format json`.
fn run_config(file: &str) -> Daemon {
    Daemon::spawn(
        &[
            "run".into(),
            "--config".into(),
            file.to_string(),
            "--log-format".into(),
            "json".into(),
        ],
        &[],
    )
}

/// A file of one `[[store_sets]]` entry `tenants`: the databases LIKE
/// `{prefix}_%`, through `template` (with `{database}`), discovered every
/// second.
fn store_set_file(tag: &str, prefix: &str, template: String) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gh-fleet-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fleet.toml");
    std::fs::write(
        &file,
        format!(
            "engine = \"postgres\"\ngap_timeout = \"200ms\"\npoll_interval = \"100ms\"\nstart_from = \"0\"\ndiscover_interval = \"1s\"\n\n[[store_sets]]\nname = \"tenants\"\ndatabases = \"{prefix}_%\"\nconnection_string = {}\n",
            toml::Value::String(template)
        ),
    )
    .unwrap();
    file
}

/// The healer's sessions on the server, by application_name.
async fn sessions(app: &str) -> i64 {
    connect()
        .await
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            &[&app],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_heals_every_store_and_a_broken_one_delays_none() {
    let a = Store::with_holes("fleet_a", &[1, 3]).await;
    let b = Store::with_holes("fleet_b", &[2]).await;
    let app = format!("gh-fleet-{}", std::process::id());
    let cs = named(&pg_url(), &app);
    // Down: nothing listens on port 1; its password must never show.
    let down = "host=127.0.0.1 port=1 user=postgres password=FleetPw_93 connect_timeout=1";
    let file = fleet_file(
        "heal",
        "gap_timeout = \"300ms\"\npoll_interval = \"100ms\"\nstart_from = \"0\"\nconnect_timeout = \"1s\"",
        &[
            ("orders", cs.clone(), &a.schema),
            ("billing", cs.clone(), &b.schema),
            ("down", down.to_string(), "eventuous"),
        ],
    );
    let started = Instant::now();
    let d = run_config(&file.display().to_string());
    for store in [&a, &b] {
        assert!(
            store.wait_until_healed(Duration::from_secs(10)).await,
            "{} not healed:\n{}",
            store.schema,
            d.log()
        );
    }
    let healed = started.elapsed();
    println!("fleet of 3 (one down): both live stores healed {healed:?} after the start");
    assert!(healed < Duration::from_secs(5), "{healed:?}");
    assert_eq!(a.tombstone_positions().await, vec![2, 4, 5, 6]);
    assert_eq!(b.tombstone_positions().await, vec![2, 3]);

    // Each store's figures under its own label; the states counted.
    assert!(
        wait_for(Duration::from_secs(10), || async {
            d.metric("gap_healer_stores{state=\"failing\"}").await == Some(1.0)
        })
        .await
    );
    let body = d.get("/metrics").await.1;
    for sample in [
        "gap_healer_tombstones_inserted_total{store=\"orders\"} 4",
        "gap_healer_tombstones_inserted_total{store=\"billing\"} 2",
        "gap_healer_tombstones_inserted_total{store=\"down\"} 0",
        "gap_healer_leader{store=\"orders\"} 1",
        "gap_healer_stores{state=\"healthy\"} 2",
    ] {
        assert!(body.contains(sample), "missing {sample} in\n{body}");
    }
    assert!(
        body.lines().any(|l| l
            .starts_with("gap_healer_db_errors_total{operation=\"start\",store=\"down\"}")
            && !l.ends_with(" 0")),
        "{body}"
    );

    // /status: one object per store, the broken one's error without its password.
    let (code, status) = d.get("/status").await;
    assert_eq!(code, 200);
    assert!(!status.contains("FleetPw_93"), "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let by_name = |name: &str| {
        status["stores"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["store"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} not in {status}"))
    };
    let (orders, down_store) = (by_name("orders"), by_name("down"));
    assert_eq!(orders["state"], "healthy", "{status}");
    assert_eq!(orders["head"], 7, "{status}");
    assert_eq!(orders["watermark"], 7, "{status}");
    assert_eq!(down_store["state"], "failing", "{status}");
    assert!(
        down_store["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("refused")),
        "{status}"
    );

    // Readiness names the broken store, and only it.
    let (code, why) = d.get("/readyz").await;
    assert_eq!(code, 503, "{why}");
    assert!(
        why.contains("store down:") && !why.contains("store orders"),
        "{why}"
    );

    // The two stores of one database share one pool (4 sessions, grown by
    // one for the second store) and one leader lock session.
    let n = sessions(&app).await;
    println!("sessions of 2 stores on one database: {n}");
    assert!(n <= 5 + 1, "{n} sessions");

    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains("FleetPw_93"), "password in the log");
    // Every line of a store's task names its store.
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|l: &serde_json::Value| {
            l["fields"]["message"] == "hole filled" || l["message"] == "filled hole with tombstones"
        })
        .collect();
    assert!(!lines.is_empty(), "{log}");
    for line in lines {
        assert!(
            line.to_string().contains("\"store\":\"orders\"")
                || line.to_string().contains("\"store\":\"billing\""),
            "{line}"
        );
    }
    std::fs::remove_dir_all(file.parent().unwrap()).ok();
}

#[tokio::test]
async fn one_shot_commands_take_store_names() {
    let a = Store::with_holes("fleet_scan_a", &[1]).await;
    let b = Store::new("fleet_scan_b").await;
    let file = fleet_file(
        "scan",
        "start_from = \"0\"",
        &[("a", a.url(), &a.schema), ("b", b.url(), &b.schema)],
    );
    let config = file.display().to_string();
    let out = cli(&["scan", "--config", &config], &[]);
    assert_eq!(out.code, 1, "a has a hole: {}", out.all());
    // Each line on stdout names its store (issue 20: a header on stderr did).
    assert!(
        out.stdout.contains("[store a] ") && out.stdout.contains("[store b] "),
        "{}",
        out.all()
    );
    let out = cli(&["scan", "--config", &config, "--store", "b"], &[]);
    assert_eq!(out.code, 0, "b alone has none: {}", out.all());
    assert!(!out.stdout.contains("[store"), "{}", out.all());
    let out = cli(&["scan", "--config", &config, "--store", "c"], &[]);
    assert_eq!(out.code, 2, "{}", out.all());
    assert!(
        out.stderr
            .contains("store = \"c\" (from flag --store): no such store"),
        "{}",
        out.all()
    );
    let out = cli(&["check", "--config", &config, "--format", "json"], &[]);
    assert_eq!(out.code, 0, "{}", out.all());
    let stores: Vec<String> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["store"].to_string())
        .collect();
    assert_eq!(stores, ["\"a\"", "\"b\""]);
    let out = cli(&["sql", "--config", &config, "--store", "a"], &[]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout.contains(&a.schema) && !out.stdout.contains(&b.schema),
        "{}",
        out.stdout
    );
    std::fs::remove_dir_all(file.parent().unwrap()).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_stores_in_one_database_share_a_handful_of_sessions() {
    const STORES: usize = 30;
    let mut stores = Vec::new();
    for i in 0..STORES {
        stores.push(Store::with_holes(&format!("fleet30_{i}"), &[1]).await);
    }
    let app = format!("gh-fleet30-{}", std::process::id());
    let cs = named(&pg_url(), &app);
    let entries: Vec<(String, String, &str)> = stores
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("s{i}"), cs.clone(), s.schema.as_str()))
        .collect();
    let entries: Vec<(&str, String, &str)> = entries
        .iter()
        .map(|(n, c, s)| (n.as_str(), c.clone(), *s))
        .collect();
    let file = fleet_file(
        "thirty",
        "gap_timeout = \"200ms\"\npoll_interval = \"100ms\"\nstart_from = \"0\"",
        &entries,
    );
    let started = Instant::now();
    let d = Daemon::spawn(
        &["run".into(), "--config".into(), file.display().to_string()],
        &[],
    );
    for store in &stores {
        assert!(
            store.wait_until_healed(Duration::from_secs(20)).await,
            "{} not healed:\n{}",
            store.schema,
            d.log()
        );
    }
    let healed = started.elapsed();
    let mut peak = 0;
    for _ in 0..10 {
        peak = peak.max(sessions(&app).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let body = d.get("/metrics").await.1;
    let leading = body
        .lines()
        .filter(|l| l.starts_with("gap_healer_leader{") && l.ends_with(" 1"))
        .count();
    println!(
        "{STORES} stores in one database: all healed {healed:?} after the start; {peak} sessions at most (of {} without sharing); {leading} stores leading",
        STORES * 5
    );
    assert_eq!(leading, STORES, "every store leads its own lock:\n{body}");
    assert!(peak <= 16 + 1, "{peak} sessions for {STORES} stores");
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
    drop(stores);
    std::fs::remove_dir_all(file.parent().unwrap()).ok();
}

/// The transaction-end proof's readings of open transactions (one read of
/// `pg_locks` takes every lock partition): the stores of one database that
/// ask at one poll share one reading, each getting its own sequence's
/// figure and its own transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_of_one_database_share_one_reading_of_open_transactions() {
    use gap_healer::engine::{Engine, OpenTransactions, Pools};
    use gap_healer_testkit::engine::{postgres_sharing, settings};
    use tokio::time::Instant as Due;

    // Ten stores of one database, each asked for a reading at the same
    // poll: one reading (two statements) for all, not ten.
    let mut stores = Vec::new();
    for i in 0..10 {
        stores.push(Store::new(&format!("txr_{i}")).await);
    }
    let pools = Pools::default();
    let engines: Vec<_> = stores
        .iter()
        .map(|s| {
            postgres_sharing(
                &settings(&s.url(), &s.schema, Duration::from_secs(5)),
                &pools,
            )
            .unwrap()
        })
        .collect();
    let open = stores[3].append_open("slow", 1).await;
    let read = |e: &std::sync::Arc<gap_healer::engine::postgres::PostgresEngine>, due| {
        let e = e.clone();
        async move {
            match e.open_transactions(due).await.unwrap() {
                OpenTransactions::Read(r) => (r.handed_out, r.open.len()),
                OpenTransactions::KeyOrderOnly => panic!("PostgreSQL always reads"),
            }
        }
    };
    let due = Due::now();
    let mut seen = Vec::new();
    for e in &engines {
        seen.push(read(e, due).await);
    }
    let before = engines[0].transaction_readings();
    // The first store to ask read for itself alone; the next asked after
    // it and read for the ones that had asked: each store's own answer.
    assert_eq!(seen[3], (Some(1), 1), "store 3's open append: {seen:?}");
    assert!(
        seen.iter().enumerate().all(|(i, s)| i == 3 || s.1 == 0),
        "{seen:?}"
    );
    // The next poll: every store asked within the last minute, so one
    // reading serves them all.
    let due = Due::now();
    let answers = futures_util::future::join_all(engines.iter().map(|e| read(e, due))).await;
    assert_eq!(
        engines[0].transaction_readings() - before,
        1,
        "ten stores, one reading a poll: {answers:?}"
    );
    assert_eq!(answers[3], (Some(1), 1));
    open.rollback().await;
    let due = Due::now();
    assert_eq!(read(&engines[3], due).await, (Some(1), 0), "ended");
    drop(engines);
    for s in stores {
        s.drop_schema().await;
    }
}

/// The stores of one database poll together: one statement reads every
/// store's head, a row committed after a poll was due shows only in a later
/// reading, a store only joins the readings once its own scan succeeded, and
/// a store whose table vanished fails the reading once, then on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_of_one_database_read_their_heads_in_one_statement() {
    use gap_healer::engine::HeadReading::{At, Empty, Failed, NotShared};
    use gap_healer::engine::{Engine, Pools, SharedHeads};
    use gap_healer_testkit::engine::{postgres_sharing, settings};
    use gap_healer_testkit::pg::Ending;
    use tokio::time::Instant as Due;

    let a = Store::new("heads_a").await;
    let b = Store::new("heads_b").await;
    let c = Store::new("heads_c").await;
    let head_a = *a.append("s", 3, Ending::Commit).await.last().unwrap();
    let head_b = *b.append("s", 2, Ending::Commit).await.last().unwrap();
    let pools = Pools::default();
    let engine = |s: &Store| {
        postgres_sharing(
            &settings(&s.url(), &s.schema, Duration::from_secs(5)),
            &pools,
        )
        .unwrap()
    };
    let (ea, eb, ec) = (engine(&a), engine(&b), engine(&c));

    // Not read with the others before its own scan succeeded.
    assert_eq!(ea.shared_head(Due::now()).await, NotShared);
    for e in [&ea, &eb, &ec] {
        e.scan(0, 100).await.unwrap();
    }
    let due = Due::now();
    let (ha, hb, hc) = tokio::join!(
        ea.shared_head(due),
        eb.shared_head(due),
        ec.shared_head(due)
    );
    assert_eq!(ha, At(head_a));
    assert_eq!(hb, At(head_b));
    assert_eq!(hc, Empty, "an empty table has no head");
    assert_eq!(ea.shared_readings(), 1, "three stores, one statement");

    // A row committed after the poll was due: that poll's reading stands,
    // the next poll's reading shows it.
    let later = *a.append("s", 1, Ending::Commit).await.last().unwrap();
    assert_eq!(ea.shared_head(due).await, At(head_a));
    let due = Due::now();
    assert_eq!(ea.shared_head(due).await, At(later));
    assert_eq!(eb.shared_head(due).await, At(head_b));
    assert_eq!(ea.shared_readings(), 2);

    // c's schema vanishes: the next reading fails for all (each then scans
    // on its own); c's own scan fails, so the reading after leaves c out.
    c.drop_schema().await;
    let due = Due::now();
    assert!(matches!(ea.shared_head(due).await, Failed(_)));
    assert!(ec.scan(0, 100).await.is_err());
    let due = Due::now();
    assert_eq!(ea.shared_head(due).await, At(later));
    assert_eq!(ec.shared_head(due).await, NotShared, "c scans alone now");
    // A store that is dropped leaves the readings.
    drop(eb);
    let due = Due::now();
    assert_eq!(ea.shared_head(due).await, At(later));
    assert_eq!(ea.shared_readings(), 5);

    // d's table held by DDL in an open transaction: the reading fails after
    // its lock timeout instead of holding a; d's own scan then waits alone,
    // and while it does, the readings leave d out and serve a.
    let d = Store::new("heads_d").await;
    d.append("s", 1, Ending::Commit).await;
    let ed = engine(&d);
    ed.scan(0, 100).await.unwrap();
    let locker = connect().await;
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {}.messages IN ACCESS EXCLUSIVE MODE",
            d.schema
        ))
        .await
        .unwrap();
    let waited = Instant::now();
    let reading = tokio::time::timeout(Duration::from_secs(5), ea.shared_head(Due::now()))
        .await
        .expect("the reading waited for the lock: every store of the pool would wait");
    assert!(matches!(reading, Failed(_)));
    let waited = waited.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "the reading waited {waited:?}"
    );
    let held = tokio::spawn({
        let ed = ed.clone();
        async move { ed.scan(0, 100).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!held.is_finished(), "d's own scan waits for the lock");
    let served = Instant::now();
    assert_eq!(ea.shared_head(Due::now()).await, At(later));
    println!(
        "a locked table failed the shared reading after {waited:?}; without it the next reading took {:?}",
        served.elapsed()
    );
    locker.batch_execute("ROLLBACK").await.unwrap();
    held.await.unwrap().unwrap();
    assert!(matches!(ed.shared_head(Due::now()).await, At(_) | Empty));
}

/// Issue 29: the stores of one database read their checkpoints in one
/// statement (each store's own reading, a table-exists check and its rows,
/// was two statements per store every 15 s); a store joins the readings
/// once its own reading found its table, and one whose table is gone fails
/// a reading once, then reads alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_of_one_database_read_their_checkpoints_in_one_statement() {
    use gap_healer::engine::{Checkpoint, Engine, Pools};
    use gap_healer_testkit::engine::{postgres_sharing, settings};

    const STORES: usize = 20;
    let mut stores = Vec::new();
    for i in 0..STORES {
        let s = Store::new(&format!("cps_{i}")).await;
        s.client
            .batch_execute(&format!(
                "INSERT INTO {0}.checkpoints VALUES ('b-{i}', {i}), ('a', NULL)",
                s.schema
            ))
            .await
            .unwrap();
        stores.push(s);
    }
    let pools = Pools::default();
    let engines: Vec<_> = stores
        .iter()
        .map(|s| {
            postgres_sharing(
                &settings(&s.url(), &s.schema, Duration::from_secs(5)),
                &pools,
            )
            .unwrap()
        })
        .collect();
    let want = |i: usize| {
        vec![
            Checkpoint {
                id: "a".into(),
                position: None,
            },
            Checkpoint {
                id: format!("b-{i}"),
                position: Some(i as i64),
            },
        ]
    };
    // Each reads its own first, then all share one statement.
    for round in 0..2 {
        for (i, e) in engines.iter().enumerate() {
            assert_eq!(e.checkpoints().await.unwrap(), want(i), "round {round}");
        }
    }
    assert_eq!(
        engines[0].checkpoint_readings(),
        1,
        "{STORES} stores, one statement"
    );

    // Store 3's table goes: the next reading fails once, every store reads
    // its own, and the reading after leaves store 3 out.
    stores[3]
        .client
        .batch_execute(&format!("DROP TABLE {}.checkpoints", stores[3].schema))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (i, e) in engines.iter().enumerate() {
        let got = e.checkpoints().await.unwrap();
        assert_eq!(got, if i == 3 { Vec::new() } else { want(i) }, "store {i}");
    }
    assert_eq!(engines[0].checkpoint_readings(), 2, "one more, failed");
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (i, e) in engines.iter().enumerate() {
        let got = e.checkpoints().await.unwrap();
        assert_eq!(got, if i == 3 { Vec::new() } else { want(i) }, "store {i}");
    }
    let readings = engines[0].checkpoint_readings();
    println!("{STORES} stores: {readings} shared checkpoint readings in three rounds, the second failed by a dropped table");
    assert_eq!(readings, 3, "the stores but 3 read together again");
}

/// A database `name` with the Eventuous tables in schema `eventuous` and
/// holes of the given widths.
async fn tenant(name: &str, widths: &[usize]) -> Store {
    let admin = connect().await;
    for sql in [
        format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
        format!("CREATE DATABASE {name}"),
    ] {
        admin.batch_execute(&sql).await.unwrap();
    }
    let url = with_param(&pg_url().replace("dbname=test", ""), "dbname", name);
    let client = gap_healer_testkit::pg::connect_to(&url).await;
    let store = Store::create(client, &url, "eventuous")
        .await
        .unwrap()
        .owning_database(&pg_url(), name);
    store.append_holes(widths).await;
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_set_heals_every_tenant_database_and_follows_new_and_dropped_ones() {
    let prefix = format!("ghts_{}", std::process::id());
    let (a, b) = (format!("{prefix}_a"), format!("{prefix}_b"));
    let ta = tenant(&a, &[1]).await;
    let tb = tenant(&b, &[2]).await;
    let template = with_param(&pg_url().replace("dbname=test", ""), "dbname", "{database}");
    let file = store_set_file("sets", &prefix, template);
    let dir = file.parent().unwrap().to_path_buf();
    let config = file.display().to_string();

    // One-shot: the set's databases are listed once; --store picks one.
    let out = cli(&["scan", "--config", &config], &[]);
    assert_eq!(out.code, 1, "{}", out.all());
    assert!(
        out.stdout.contains(&format!("[store tenants/{a}] "))
            && out.stdout.contains(&format!("[store tenants/{b}] ")),
        "{}",
        out.all()
    );
    let out = cli(
        &[
            "scan",
            "--config",
            &config,
            "--store",
            &format!("tenants/{b}"),
        ],
        &[],
    );
    assert_eq!(out.code, 1, "{}", out.all());
    assert!(
        out.stdout.contains("1 hole (2 missing positions)"),
        "{}",
        out.stdout
    );

    let d = run_config(&config);
    for store in [&ta, &tb] {
        assert!(
            store.wait_until_healed(Duration::from_secs(10)).await,
            "{}",
            d.log()
        );
    }
    // A new tenant is found and healed, without a restart.
    let c = format!("{prefix}_c");
    let created = Instant::now();
    let tc = tenant(&c, &[3]).await;
    assert!(
        tc.wait_until_healed(Duration::from_secs(10)).await,
        "{}",
        d.log()
    );
    println!(
        "store set: a new tenant database healed {:?} after it was created (discover_interval 1s)",
        created.elapsed()
    );
    // Every tenant's series are in the scrape, under its own label.
    let label = |db: &str| format!("store=\"tenants/{db}\"");
    let series = |body: &str, db: &str| body.lines().filter(|l| l.contains(&label(db))).count();
    let body = d.get("/metrics").await.1;
    for db in [&a, &b, &c] {
        assert!(series(&body, db) > 0, "no series of {db} in\n{body}");
    }
    // A dropped one is no longer healed, and leaves /status.
    drop(tb);
    let dropped = Instant::now();
    let gone = format!("tenants/{b}");
    assert!(
        wait_for(Duration::from_secs(10), || async {
            !d.get("/status").await.1.contains(&gone)
        })
        .await,
        "{}",
        d.get("/status").await.1
    );
    let status = d.get("/status").await.1;
    assert!(
        status.contains(&format!("tenants/{a}")) && status.contains(&format!("tenants/{c}")),
        "{status}"
    );
    assert_eq!(
        d.get("/readyz").await.0,
        200,
        "{}",
        d.get("/readyz").await.1
    );
    // ... and its series leave /metrics once idle (15 s with these polls),
    // while the others' stay.
    assert!(
        wait_for(Duration::from_secs(40), || async {
            series(&d.get("/metrics").await.1, &b) == 0
        })
        .await,
        "series of the dropped store still in\n{}",
        d.get("/metrics").await.1
    );
    println!(
        "store set: the dropped tenant's series left /metrics {:?} after its database was dropped",
        dropped.elapsed()
    );
    let body = d.get("/metrics").await.1;
    for db in [&a, &c] {
        for name in [
            "gap_healer_tombstones_inserted_total",
            "gap_healer_open_gaps",
            "gap_healer_leader",
            "gap_healer_head_position",
            "gap_healer_db_errors_total",
            "gap_healer_scan_duration_seconds_count",
        ] {
            assert!(
                body.lines()
                    .any(|l| l.starts_with(name) && l.contains(&label(db))),
                "{name} of {db} missing in\n{body}"
            );
        }
    }
    assert!(
        body.contains("gap_healer_db_errors_total{operation=\"discover\",store=\"tenants\"} 0"),
        "{body}"
    );
    assert!(body.contains("gap_healer_build_info{"), "{body}");
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("its database is gone"), "{log}");
    std::fs::remove_dir_all(dir).ok();
}

/// One store's table held by `LOCK TABLE ... IN SHARE MODE` (what a
/// non-concurrent `CREATE INDEX` takes) in a daemon of two stores. Before,
/// each fill's lock timeout on the table lock was taken for a held key:
/// bisected into 25 ms probes and every position then filled alone. Now a
/// fill meets the table lock once per backoff (`table_locked`), the daemon
/// stays live, the other store heals meanwhile, and the locked one heals
/// when the lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_lock_on_one_store_backs_it_off_and_delays_neither_the_other_nor_liveness() {
    let a = Store::with_holes("tablelock_a", &[5, 5, 5]).await;
    let b = Store::new("tablelock_b").await;
    let locker = connect().await;
    locker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE {}.messages IN SHARE MODE",
            a.schema
        ))
        .await
        .unwrap();
    let file = fleet_file(
        "tablelock",
        "gap_timeout = \"200ms\"\npoll_interval = \"100ms\"\nstart_from = \"0\"\nlock_timeout = \"200ms\"",
        &[("locked", pg_url(), &a.schema), ("free", pg_url(), &b.schema)],
    );
    let d = Daemon::spawn(
        &[
            "run".to_string(),
            "--config".into(),
            file.display().to_string(),
            "--log-format".into(),
            "json".into(),
        ],
        &[],
    );
    // The free store heals holes made while the other's table is locked.
    b.append_holes(&[2]).await;
    assert!(
        b.wait_until_healed(Duration::from_secs(10)).await,
        "{}",
        d.log()
    );
    tokio::time::sleep(Duration::from_secs(6)).await;
    let sample = |outcome: &str| {
        format!(r#"gap_healer_fill_attempts_total{{outcome="{outcome}",store="locked"}}"#)
    };
    let locked = d.metric(&sample("table_locked")).await.unwrap_or(0.0);
    let held = d.metric(&sample("held")).await.unwrap_or(0.0);
    println!("table locked 6 s: {locked} table_locked fill attempts, {held} held");
    assert!(locked >= 1.0, "{}", d.log());
    assert_eq!(held, 0.0, "a table lock is not a held key");
    // At most one attempt per backoff step (0.5 s, doubling, up to 30 s).
    assert!(locked <= 8.0, "{locked} attempts in 6 s");
    assert_eq!(d.get("/healthz").await.0, 200);
    assert!(a.tombstone_positions().await.is_empty());
    locker.batch_execute("COMMIT").await.unwrap();
    assert!(
        a.wait_until_healed(Duration::from_secs(40)).await,
        "{}",
        d.log()
    );
    drop(d);
}

/// DDL holding a table (ACCESS EXCLUSIVE: `ALTER TABLE`, `VACUUM FULL`)
/// makes a scan or a probe of its store fail after the sessions' lock
/// timeout (5 s) instead of waiting as long as the DDL runs (before, they
/// had none: the store's loop froze with the DDL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_or_probe_behind_ddl_fails_after_the_lock_timeout() {
    use gap_healer::engine::Engine;
    let store = Store::with_holes("ddl_scan", &[1]).await;
    let engine = store.engine();
    engine.scan(0, 100).await.unwrap();
    let ddl = connect().await;
    ddl.batch_execute(&format!(
        "BEGIN; LOCK TABLE {}.messages IN ACCESS EXCLUSIVE MODE",
        store.schema
    ))
    .await
    .unwrap();
    let started = Instant::now();
    let scan = tokio::time::timeout(Duration::from_secs(15), engine.scan(0, 100)).await;
    let scan_took = started.elapsed();
    let started = Instant::now();
    let range = gap_healer::gaps::PosRange::new(2, 2).unwrap();
    let probe = tokio::time::timeout(Duration::from_secs(15), engine.probe(&[range])).await;
    let probe_took = started.elapsed();
    ddl.batch_execute("COMMIT").await.unwrap();
    println!("behind ACCESS EXCLUSIVE: the scan failed after {scan_took:?}, the probe after {probe_took:?}");
    for (what, result, took) in [
        ("scan", scan.map(|r| r.map(|_| ())), scan_took),
        ("probe", probe.map(|r| r.map(|_| ())), probe_took),
    ] {
        let err = result
            .unwrap_or_else(|_| panic!("the {what} waited for the DDL"))
            .expect_err("it cannot read the table");
        assert_eq!(err.code.as_deref(), Some("55P03"), "{what}: {err}");
        assert!(took < Duration::from_secs(10), "{what}: {took:?}");
    }
    engine
        .scan(0, 100)
        .await
        .expect("reads again once the DDL is gone");
}

/// A store set's database that stops being listed (here: it no longer
/// accepts connections) is no longer healed, and the daemon keeps no
/// session on it: its shared leader-lock session closes once the store's
/// task has ended (before, the lock sessions of vanished databases were
/// never pruned).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_leaves_a_store_set_keeps_no_session_of_the_healer() {
    let prefix = format!("ghls_{}", std::process::id());
    let db = format!("{prefix}_a");
    let t = tenant(&db, &[1]).await;
    let app = format!("gh-leave-{}", std::process::id());
    let template = with_param(
        &named(&pg_url(), &app).replace("dbname=test", ""),
        "dbname",
        "{database}",
    );
    let file = store_set_file("leave", &prefix, template);
    let d = run_config(&file.display().to_string());
    assert!(
        t.wait_until_healed(Duration::from_secs(10)).await,
        "{}",
        d.log()
    );
    let in_db = |db: String, app: String| async move {
        connect()
            .await
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
                &[&db, &app],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let before = in_db(db.clone(), app.clone()).await;
    assert!(before >= 1, "the healer's sessions on {db}: {before}");
    let _database = t.close_session();
    connect()
        .await
        .batch_execute(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS false"))
        .await
        .unwrap();
    let closed = wait_for(Duration::from_secs(20), || {
        let (db, app) = (db.clone(), app.clone());
        async move { in_db(db, app).await == 0 }
    })
    .await;
    let left = in_db(db.clone(), app.clone()).await;
    drop(d);
    connect()
        .await
        .batch_execute(&format!("ALTER DATABASE {db} ALLOW_CONNECTIONS true"))
        .await
        .unwrap();
    std::fs::remove_file(file).ok();
    assert!(
        closed,
        "{left} session(s) of the healer still on {db} ({before} before)"
    );
}

/// A store set lists its databases on one catalog engine it keeps: every
/// discovery pass (each second here) reuses its pool and so its session
/// on the catalog database (before, each pass opened an engine and a pool
/// of its own, and logged in anew).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_set_lists_its_databases_on_one_kept_catalog_session() {
    let prefix = format!("ghcat_{}", std::process::id());
    let db = format!("{prefix}_a");
    let t = tenant(&db, &[1]).await;
    let app = format!("gh-catalog-{}", std::process::id());
    let template = with_param(
        &named(&pg_url(), &app).replace("dbname=test", ""),
        "dbname",
        "{database}",
    );
    let file = store_set_file("catalog", &prefix, template);
    let d = run_config(&file.display().to_string());
    assert!(
        t.wait_until_healed(Duration::from_secs(10)).await,
        "{}",
        d.log()
    );
    // The healer's sessions on the catalog database: (pid, last query).
    let on_catalog = || {
        let app = app.clone();
        async move {
            connect()
                .await
                .query(
                    "SELECT pid, extract(epoch FROM query_start)::float8 FROM pg_stat_activity \
                     WHERE datname = 'postgres' AND application_name = $1",
                    &[&app],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get::<_, i32>(0), r.get::<_, Option<f64>>(1)))
                .collect::<Vec<_>>()
        }
    };
    let first = on_catalog().await;
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let later = on_catalog().await;
    drop(d);
    drop(t);
    std::fs::remove_file(file).ok();
    assert_eq!(first.len(), 1, "the catalog's sessions: {first:?}");
    assert_eq!(later.len(), 1, "the catalog's sessions: {later:?}");
    assert_eq!(first[0].0, later[0].0, "one session for every pass");
    assert!(
        later[0].1 > first[0].1,
        "the passes since listed on it: {first:?} then {later:?}"
    );
}

/// Issue 27: during a long fill the daemon showed nothing: its hole gauges
/// stood still for the whole cycle and it logged one INFO line per
/// statement. Now the gauges move while the cycle runs (published every
/// second), each statement's line is at DEBUG, and the cycle says how far
/// it is every few seconds, then once when it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_fill_moves_the_gauges_and_logs_its_progress_not_each_statement() {
    use gap_healer_testkit::bin::{timing, Daemon};
    let store = Store::new("progress").await;
    // 150,000 rows at every other position: 150,000 one-position holes,
    // 150 statements of 1,000 ranges.
    store.insert_bulk(150_000, "g * 2").await;
    // A statement trigger that sleeps 30 ms (user code on the table, as
    // real stores have): the 150 fill statements take at least 4.5 s on
    // any machine, so the gauges must move and the cycle must say how far
    // it is while it runs, not only when it ends.
    store
        .client
        .batch_execute(&format!(
            "CREATE FUNCTION {s}.slow() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN PERFORM pg_sleep(0.03); RETURN NULL; END $$; \
             CREATE TRIGGER slow AFTER INSERT ON {s}.messages \
             FOR EACH STATEMENT EXECUTE FUNCTION {s}.slow();",
            s = store.schema
        ))
        .await
        .unwrap();
    let daemon = Daemon::start(
        &store,
        &timing("0s", "100ms", &["--scan-page-size", "50000"]),
    );
    let mut seen = Vec::new();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(120) {
        let left = daemon
            .metric(r#"gap_healer_open_gap_positions{store="default"}"#)
            .await
            .unwrap_or(0.0);
        if seen.last() != Some(&left) {
            seen.push(left);
        }
        if left == 0.0 && store.tombstone_positions().await.len() >= 150_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = started.elapsed();
    println!("open positions as scraped: {seen:?} in {took:?}");
    assert_eq!(store.tombstone_positions().await.len(), 150_000);
    let between = seen.iter().filter(|v| **v > 0.0 && **v < 150_000.0).count();
    assert!(
        between >= 3,
        "the gauge moved during the fill: {seen:?}\n{}",
        daemon.log()
    );
    let lines = daemon.lines_with("filled hole with tombstones");
    assert!(!lines.is_empty(), "{}", daemon.log());
    assert!(
        lines.iter().all(|l| l["level"] == "DEBUG"),
        "a statement's line at INFO: {:?}",
        lines.iter().find(|l| l["level"] != "DEBUG")
    );
    let cycles = daemon.lines_with("filled holes with tombstones");
    assert!(cycles.iter().all(|l| l["level"] == "INFO"), "{cycles:?}");
    assert!(!cycles.is_empty(), "{}", daemon.log());
    let progress = daemon.lines_containing("\"filling: ");
    assert!(
        !progress.is_empty(),
        "no progress line in {took:?}\n{}",
        daemon.log()
    );
    println!(
        "{} progress line(s), {} cycle line(s)",
        progress.len(),
        cycles.len()
    );
    drop(daemon);
    store.drop_schema().await;
}
