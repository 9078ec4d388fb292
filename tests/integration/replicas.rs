//! Replicas that divide the stores (issue 29, item 2): three real daemons
//! heal the same stores of one database; each store ends led by the replica
//! that prefers it (rendezvous hashing of the store's leader key and the
//! replica's name), a follower of a held lock makes no statement of its own
//! for it, and a SIGKILLed replica's stores are led again within seconds.
//!
//! On a throwaway cluster with `pg_stat_statements` and the default
//! `max_connections` of 100 (the three daemons' pools and lock sessions
//! must fit), each replica logging in as a role of its own, so the server
//! counts each replica's statements and connections.
//! `GAP_HEALER_REPLICA_STORES` sets the number of stores (30 by default;
//! docs/benchmarks.md's 1,000-store figures come from this test, with
//! `CARGO_BIN_EXE_gap-healer` naming a release binary).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gap_healer::replicas::{preferred, Replica};
use gap_healer_testkit::bin::Daemon;
use gap_healer_testkit::pg::Throwaway;

const REPLICAS: usize = 3;

/// Every live daemon's log.
fn logs(daemons: &[Option<Daemon>]) -> String {
    daemons
        .iter()
        .flatten()
        .map(|d| d.log())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

fn stores() -> usize {
    std::env::var("GAP_HEALER_REPLICA_STORES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30)
}

/// Which replica (index) leads each store, from each live daemon's
/// `gap_healer_leader` series; a store two claim is listed under both.
async fn leaders(daemons: &[Option<Daemon>]) -> BTreeMap<String, Vec<usize>> {
    let mut led: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (k, d) in daemons.iter().enumerate() {
        let Some(d) = d else { continue };
        let Ok((200, body)) = d.try_get("/metrics").await else {
            continue;
        };
        for line in body.lines() {
            if let Some(rest) = line.strip_prefix("gap_healer_leader{store=\"") {
                if let Some((store, value)) = rest.split_once("\"} ") {
                    if value.trim() == "1" {
                        led.entry(store.to_string()).or_default().push(k);
                    }
                }
            }
        }
    }
    led
}

/// Each replica role's connections now.
async fn connections(admin: &tokio_postgres::Client) -> BTreeMap<String, i64> {
    admin
        .query(
            "SELECT usename::text, count(*) FROM pg_stat_activity WHERE usename LIKE 'rep%' GROUP BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Each replica role's statements since the last reset.
async fn statements(admin: &tokio_postgres::Client) -> BTreeMap<String, i64> {
    admin
        .query(
            "SELECT r.rolname, SUM(s.calls)::bigint FROM pg_stat_statements AS s JOIN pg_roles AS r ON r.oid = s.userid WHERE r.rolname LIKE 'rep%' GROUP BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_divide_the_stores_and_a_killed_ones_are_led_again_at_once() {
    let n = stores();
    let cluster = Throwaway::started_with(
        "replicas",
        "trust",
        "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.max=20000 -c max_connections=100 -c max_locks_per_transaction=256",
    );
    cluster.create_database("es").await;
    let admin = cluster.admin("es").await;
    admin
        .batch_execute("CREATE EXTENSION pg_stat_statements")
        .await
        .unwrap();
    let fixture = include_str!("../fixtures/eventuous_postgres.sql");
    for i in 0..n {
        let s = format!("s{i}");
        admin
            .batch_execute(&fixture.replace("__schema__", &s))
            .await
            .unwrap();
        // A hole at 1 for the store's leader to fill.
        admin
            .batch_execute(&format!(
                "INSERT INTO {s}.streams (stream_name, version) VALUES ('a', 1);
                 INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, global_position, json_data, created)
                 OVERRIDING SYSTEM VALUE VALUES
                   (gen_random_uuid(), 'E', 1, 0, 0, '{{}}', now()),
                   (gen_random_uuid(), 'E', 1, 1, 2, '{{}}', now());
                 SELECT setval(pg_get_serial_sequence('{s}.messages', 'global_position'), 2);"
            ))
            .await
            .unwrap();
    }
    let names: Vec<String> = (0..REPLICAS).map(|k| format!("gap-healer-{k}")).collect();
    let numbers: std::collections::BTreeSet<Replica> =
        names.iter().map(|n| Replica::named(n)).collect();
    let want: BTreeMap<String, usize> = (0..n)
        .map(|i| {
            let r = preferred(&format!("gap-healer:s{i}"), &numbers).unwrap();
            let k = names.iter().position(|n| Replica::named(n) == r).unwrap();
            (format!("s{i}"), k)
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("gh-replicas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut daemons: Vec<Option<Daemon>> = Vec::new();
    let started = Instant::now();
    for (k, name) in names.iter().enumerate() {
        let role = format!("rep{k}");
        admin
            .batch_execute(&format!("CREATE ROLE {role} LOGIN SUPERUSER"))
            .await
            .unwrap();
        let cs = format!("host=127.0.0.1 port={} user={role} dbname=es", cluster.port);
        // A 30 s connect timeout: 1,000 stores' first scans queue for one
        // 16-session pool, and on a loaded machine the default 5 s wait
        // failed hundreds of them (each then retried 25 s later).
        let mut text = "engine = \"postgres\"\ngap_timeout = \"1s\"\npoll_interval = \"1s\"\nstart_from = \"0\"\nconnect_timeout = \"30s\"\n".to_string();
        for i in 0..n {
            text += &format!(
                "\n[[stores]]\nname = \"s{i}\"\nconnection_string = \"{cs}\"\nschema = \"s{i}\"\n"
            );
        }
        let file = dir.join(format!("{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let args: Vec<String> = [
            "run",
            "--config",
            file.to_str().unwrap(),
            "--replica",
            name,
            "--log-level",
            "info",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        daemons.push(Some(Daemon::try_spawn(&args, &[], 4000).unwrap()));
    }

    // Every store led by one replica, then by its preferred one.
    let limit = Duration::from_secs(60 + n as u64 / 10);
    let mut all_led = None;
    let mut peak = BTreeMap::new();
    let (divided, led) = loop {
        let led = leaders(&daemons).await;
        if all_led.is_none()
            && want
                .keys()
                .all(|s| led.get(s).is_some_and(|l| l.len() == 1))
        {
            all_led = Some(started.elapsed());
        }
        for (role, c) in connections(&admin).await {
            let p = peak.entry(role).or_insert(0);
            *p = c.max(*p);
        }
        let done = want
            .iter()
            .all(|(s, k)| led.get(s).is_some_and(|l| l == &vec![*k]));
        if done || started.elapsed() > limit {
            break (done, led);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let took = started.elapsed();
    // What each replica leads, and how much of it it prefers.
    let mut held = [0usize; REPLICAS];
    let mut held_preferred = [0usize; REPLICAS];
    for (s, l) in &led {
        for k in l {
            held[*k] += 1;
            if want.get(s) == Some(k) {
                held_preferred[*k] += 1;
            }
        }
    }
    println!(
        "{n} stores over {REPLICAS} replicas: every store led {:.1?} after the first start; after {took:.1?}: leaders per replica {held:?}, of them by their preferred replica {held_preferred:?}, unled {}; peak connections per replica {peak:?} (max_connections 100)",
        all_led.unwrap_or(took),
        want.keys().filter(|s| !led.contains_key(*s)).count()
    );
    assert!(
        all_led.is_some(),
        "not every store led after {took:?}\n{}",
        logs(&daemons)
    );
    assert!(
        peak.values().sum::<i64>() < 95,
        "the replicas' connections do not fit max_connections 100: {peak:?}"
    );
    let wrong: Vec<_> = want
        .iter()
        .filter(|(s, k)| led.get(*s) != Some(&vec![**k]))
        .map(|(s, k)| format!("{s}: want {k}, led by {:?}", led.get(s)))
        .collect();
    assert!(divided, "after {took:?}: {wrong:?}\n{}", logs(&daemons));
    let mut shares = [0usize; REPLICAS];
    for k in want.values() {
        shares[*k] += 1;
    }
    println!("{n} stores over {REPLICAS} replicas: each led by its preferred replica {took:.1?} after the first start; leaders per replica {shares:?}");
    for (k, share) in shares.iter().enumerate() {
        assert!(*share > 0, "replica {k} leads nothing: {shares:?}");
    }
    // Every hole filled, once.
    for i in 0..n {
        let filled: i64 = admin
            .query_one(
                &format!("SELECT count(*) FROM s{i}.messages WHERE global_position = 1"),
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(filled, 1, "s{i}'s hole");
    }

    // Each replica's statements over a quiet 10 s.
    admin
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .unwrap();
    let window = Duration::from_secs(10);
    tokio::time::sleep(window).await;
    let counted = statements(&admin).await;
    let per_second: BTreeMap<&String, f64> = counted
        .iter()
        .map(|(r, c)| (r, *c as f64 / window.as_secs_f64()))
        .collect();
    println!("statements per second, per replica, idle: {per_second:.1?}");

    // 10 s with an event appended to every store each second: each replica
    // reads the new rows of the stores it leads, and no other's.
    admin
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .unwrap();
    let mut moved = std::collections::BTreeSet::new();
    for round in 0..10 {
        let mut batch = String::new();
        for i in 0..n {
            batch += &format!(
                "INSERT INTO s{i}.messages (message_id, message_type, stream_id, stream_position, json_data, created) VALUES (gen_random_uuid(), 'E', 1, {}, '{{}}', now());",
                round + 2
            );
        }
        admin.batch_execute(&batch).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A store that another replica led for a while in the window (a
        // leader that stepped down on a loaded machine) was read by both.
        let led = leaders(&daemons).await;
        for (s, k) in &want {
            if led.get(s).is_some_and(|l| l != &vec![*k]) {
                moved.insert(s.clone());
            }
        }
    }
    let counted = statements(&admin).await;
    let per_second: BTreeMap<&String, f64> = counted
        .iter()
        .map(|(r, c)| (r, *c as f64 / window.as_secs_f64()))
        .collect();
    println!(
        "statements per second, per replica, an event a second in every store: {per_second:.1?}"
    );
    let scans = admin
        .query(
            "SELECT r.rolname, substring(s.query from 'FROM (s[0-9]+)\\.messages') AS store, SUM(s.calls)::bigint FROM pg_stat_statements AS s JOIN pg_roles AS r ON r.oid = s.userid WHERE r.rolname LIKE 'rep%' AND s.query LIKE '%WITH page AS%' GROUP BY 1, 2",
            &[],
        )
        .await
        .unwrap();
    let mut scanned = [0usize; REPLICAS];
    for row in &scans {
        let (role, store): (String, String) = (row.get(0), row.get(1));
        let k: usize = role.trim_start_matches("rep").parse().unwrap();
        if moved.contains(&store) {
            continue;
        }
        scanned[k] += 1;
        assert_eq!(
            want[&store], k,
            "replica {k} read new rows of {store}, which replica {} leads",
            want[&store]
        );
    }
    let mut kept = shares;
    for s in &moved {
        kept[want[s]] -= 1;
    }
    println!("stores whose new rows each replica read: {scanned:?} (it leads {shares:?}; {} led by another replica for a while in the window: {moved:?})", moved.len());
    assert!(
        moved.len() <= n / 20,
        "{} stores changed leader while settled",
        moved.len()
    );
    for k in 0..REPLICAS {
        assert_eq!(scanned[k], kept[k], "replica {k} read the stores it leads");
    }
    for row in admin
        .query(
            "SELECT r.rolname, SUM(s.calls)::bigint AS calls, left(regexp_replace(regexp_replace(s.query, '\\ms[0-9]+\\.', 'sN.', 'g'), '\\s+', ' ', 'g'), 70) AS q FROM pg_stat_statements AS s JOIN pg_roles AS r ON r.oid = s.userid WHERE r.rolname LIKE 'rep%' GROUP BY 1, 3 ORDER BY 1, 2 DESC",
            &[],
        )
        .await
        .unwrap()
    {
        let (role, calls, q): (String, i64, String) = (row.get(0), row.get(1), row.get(2));
        println!("  {role}: {calls:>6} {q}");
    }

    // SIGKILL the replica leading the most; its stores go to the others.
    let victim = (0..REPLICAS).max_by_key(|k| shares[*k]).unwrap();
    let orphans: Vec<&String> = want
        .iter()
        .filter(|(_, k)| **k == victim)
        .map(|(s, _)| s)
        .collect();
    let killed = Instant::now();
    daemons[victim].take().unwrap().kill9();
    let led_again = loop {
        let led = leaders(&daemons).await;
        let done = orphans
            .iter()
            .all(|s| led.get(*s).is_some_and(|l| l.len() == 1));
        if done || killed.elapsed() > Duration::from_secs(30) {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let again = killed.elapsed();
    println!(
        "replica {victim} SIGKILLed: its {} stores led again {again:.1?} later",
        orphans.len()
    );
    assert!(led_again, "after {again:?}\n{}", logs(&daemons));
    assert!(
        again < Duration::from_secs(10),
        "{again:?} until the killed replica's stores were led again"
    );
    for d in daemons.into_iter().flatten() {
        let (code, _, log) = d.terminate();
        assert_eq!(code, Some(0), "{log}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Daemons that heal other stores of the same database are not on a
/// replica's roll: each daemon leads its own store at once, even where a
/// roll shared with the other would have made the other the preferred
/// replica (names chosen so that it would, for both stores). Before rolls
/// were scoped to a configuration's stores, such a daemon left its own
/// store without a leader for 3 s, and the transaction-end proof tests,
/// which run side by side in one database, failed with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_of_other_stores_in_the_database_are_on_rolls_of_their_own() {
    use gap_healer_testkit::pg::Store;
    let (x, y) = (Store::new("roll_x").await, Store::new("roll_y").await);
    let (kx, ky) = (
        format!("gap-healer:{}", x.schema),
        format!("gap-healer:{}", y.schema),
    );
    let a = "roll-a".to_string();
    let b = (0..10_000)
        .map(|i| format!("roll-b-{i}"))
        .find(|b| {
            let both: std::collections::BTreeSet<Replica> =
                [Replica::named(&a), Replica::named(b)].into();
            preferred(&kx, &both) == Some(Replica::named(b))
                && preferred(&ky, &both) == Some(Replica::named(&a))
        })
        .expect("two names that each prefer the other's store");
    let started = Instant::now();
    let dx = Daemon::start(&x, &["--replica", &a, "--gap-timeout", "200ms"]);
    let dy = Daemon::start(&y, &["--replica", &b, "--gap-timeout", "200ms"]);
    for (d, store) in [(&dx, &x), (&dy, &y)] {
        let led = d
            .wait_metric(
                "gap_healer_leader{store=\"default\"}",
                1.0,
                Duration::from_secs(10),
            )
            .await;
        assert_eq!(led, 1.0, "{}: {}", store.schema, d.log());
        assert!(
            !d.log().contains("leaving it to that replica"),
            "{}: {}",
            store.schema,
            d.log()
        );
    }
    println!(
        "two daemons of other stores in one database: both leading {:.1?} after the first start",
        started.elapsed()
    );
    for d in [dx, dy] {
        let (code, _, log) = d.terminate();
        assert_eq!(code, Some(0), "{log}");
    }
}
