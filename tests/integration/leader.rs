//! Leader election on PostgreSQL: one filler among many healers, and a
//! bounded takeover when the leader dies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gap_healer::engine::postgres::PostgresEngine;
use gap_healer::engine::LeaderLock;
use gap_healer_testkit::bin::{timing, Daemon};
use gap_healer_testkit::pg::{Ending, Store};
use gap_healer_testkit::wait::time_until;

fn engine(store: &Store) -> Arc<PostgresEngine> {
    store.engine()
}

#[tokio::test]
async fn the_lock_is_exclusive_and_released_with_its_session() {
    let store = Store::new("lock").await;
    let key = format!("gap-healer:{}", store.schema);
    let (a, b) = (engine(&store), engine(&store));
    let mut first = a.try_lead(&key).await.unwrap().expect("free lock taken");
    assert!(
        b.try_lead(&key).await.unwrap().is_none(),
        "a second session cannot take it"
    );
    assert!(a.still_held(&mut first, &key).await.unwrap());
    assert!(
        b.try_lead(&format!("{key}-other")).await.unwrap().is_some(),
        "other keys are independent"
    );
    drop(first);
    let mut second = None;
    for _ in 0..50 {
        second = b.try_lead(&key).await.unwrap();
        if second.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut second = second.expect("released when the holder's session closed");
    // The server ends the leader's session: the holder must find out.
    store
        .client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()
               AND ((classid::bigint << 32) | objid::bigint) = $1",
            &[&gap_healer::engine::postgres::advisory_key(&key)],
        )
        .await
        .unwrap();
    let after_kill = b.still_held(&mut second, &key).await;
    assert!(!matches!(after_kill, Ok(true)), "{after_kill:?}");
    store.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_fills_and_a_follower_takes_over_when_it_is_killed() {
    let store = Store::with_holes("failover", &[2]).await;
    let flags = timing("200ms", "50ms", &[]);
    let a = Daemon::start(&store, &flags);
    let b = Daemon::start(&store, &flags);
    store.wait_until_healed(Duration::from_secs(10)).await;
    assert!(store.missing().await.is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leaders = (
        a.metric("gap_healer_leader").await.unwrap(),
        b.metric("gap_healer_leader").await.unwrap(),
    );
    assert!(
        leaders == (1.0, 0.0) || leaders == (0.0, 1.0),
        "exactly one leader: {leaders:?}"
    );
    let (leader, follower) = if leaders.0 == 1.0 { (a, b) } else { (b, a) };
    assert_eq!(
        leader.metric("gap_healer_tombstones_inserted_total").await,
        Some(2.0)
    );
    assert_eq!(
        follower
            .metric("gap_healer_tombstones_inserted_total")
            .await,
        Some(0.0)
    );
    assert_eq!(
        follower.metric("gap_healer_open_gaps").await,
        Some(0.0),
        "the follower still scans and reports"
    );

    let killed = Instant::now();
    leader.kill9();
    let took = time_until(killed, Duration::from_secs(15), || async {
        follower.metric("gap_healer_leader").await == Some(1.0)
    })
    .await
    .expect("the follower took over");
    println!("leader killed with SIGKILL: follower leads {took:?} later");
    assert!(took <= Duration::from_secs(3), "{took:?}");
    store.append("X", 1, Ending::RollbackAfterInsert).await;
    store.append("C", 1, Ending::Commit).await;
    store.wait_until_healed(Duration::from_secs(10)).await;
    assert!(store.missing().await.is_empty(), "the new leader fills");
    assert_eq!(
        follower
            .metric("gap_healer_tombstones_inserted_total")
            .await,
        Some(1.0)
    );
    store.assert_tombstone_stream_consistent().await;
    let (code, _, log) = follower.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("became the leader"), "{log}");
    store.drop_schema().await;
}

/// A follower tries the lock every second on the session it kept from its
/// last try, not on a new login each time; a kept session that died is
/// replaced without an error; and the kept session is the one that leads
/// once the holder goes.
#[tokio::test]
async fn a_follower_keeps_one_session_between_tries() {
    let store = Store::new("follower").await;
    let key = format!("gap-healer:{}", store.schema);
    let (a, b) = (engine(&store), engine(&store));
    let held = a.try_lead(&key).await.unwrap().expect("free lock taken");
    let mut idle = None;
    assert!(b.try_lead_reusing(&key, &mut idle).await.unwrap().is_none());
    let pid = idle.as_ref().expect("the session is kept").backend_pid();
    for _ in 0..5 {
        assert!(b.try_lead_reusing(&key, &mut idle).await.unwrap().is_none());
        assert_eq!(idle.as_ref().map(|s| s.backend_pid()), Some(pid));
    }
    store
        .client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        b.try_lead_reusing(&key, &mut idle).await.unwrap().is_none(),
        "a dead kept session is replaced, not reported"
    );
    let replaced = idle.as_ref().expect("a new session is kept").backend_pid();
    assert_ne!(replaced, pid);
    drop(held);
    let mut leading = None;
    for _ in 0..50 {
        leading = b.try_lead_reusing(&key, &mut idle).await.unwrap();
        if leading.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut leading = leading.expect("the follower takes the freed lock");
    assert_eq!(leading.backend_pid(), replaced, "on the kept session");
    assert!(idle.is_none());
    assert!(b.still_held(&mut leading, &key).await.unwrap());
    store.drop_schema().await;
}

/// A dry run fills nothing, so it must not lead: before, a `run --dry-run`
/// started first took the leader lock and a normal `run` beside it only
/// followed, and the holes stayed open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_never_takes_the_leader_lock_from_a_healer_that_fills() {
    let store = Store::with_holes("dry_leader", &[2]).await;
    let flags = timing("200ms", "50ms", &[]);
    let dry = Daemon::start(&store, &[&flags[..], &["--dry-run"]].concat());
    // The dry run has scanned and seen the holes before the other starts.
    let seen = dry
        .wait_metric(
            r#"gap_healer_open_gaps{store="default"}"#,
            1.0,
            Duration::from_secs(10),
        )
        .await;
    assert!(seen >= 1.0, "{}", dry.log());
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let filler = Daemon::start(&store, &flags);
    store.wait_until_healed(Duration::from_secs(10)).await;
    assert!(store.missing().await.is_empty(), "{}", filler.log());
    assert_eq!(dry.metric("gap_healer_leader").await, Some(0.0));
    assert_eq!(filler.metric("gap_healer_leader").await, Some(1.0));
    assert!(
        !dry.lines_containing("not taking part in the leader election")
            .is_empty(),
        "{}",
        dry.log()
    );
    assert!(
        dry.lines_containing("became the leader").is_empty(),
        "{}",
        dry.log()
    );
    store.drop_schema().await;
}

/// What a healer's role needs on `store` (`gap-healer sql`'s grants).
async fn grant_healer_rights(store: &Store, role: &str) {
    let s = &store.schema;
    store
        .client
        .batch_execute(&format!(
            "GRANT USAGE ON SCHEMA {s} TO {role};
             GRANT SELECT, INSERT ON {s}.messages TO {role};
             GRANT SELECT, INSERT (stream_name, version), UPDATE (version) ON {s}.streams TO {role};
             GRANT SELECT ON {s}.checkpoints TO {role};"
        ))
        .await
        .unwrap();
}

/// `gap-healer run` on `store` logging in with `cs`.
fn daemon_at(store: &Store, cs: &str, flags: &[&str]) -> Daemon {
    let args: Vec<String> = ["run".to_string()]
        .into_iter()
        .chain(store.args_at(cs))
        .chain(["--log-format".into(), "json".into()])
        .chain(flags.iter().map(|f| f.to_string()))
        .collect();
    Daemon::spawn(&args, &[])
}

/// A healer whose login may connect but not read the store starts first:
/// every scan fails (42501). Before, it kept the lock (`leader` 1) and the
/// healthy one beside it only followed. Now it never takes the lock; and a
/// leader whose scans start failing gives it up, so another that can fill
/// takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healer_that_cannot_scan_gives_the_lock_to_one_that_can() {
    let store = Store::with_holes("blind_leader", &[1]).await;
    let (role_a, role_b) = (format!("{}_a", store.schema), format!("{}_b", store.schema));
    let cs_a = store.create_login(&role_a).await;
    let cs_b = store.create_login(&role_b).await;
    grant_healer_rights(&store, &role_b).await;
    let flags = timing("200ms", "50ms", &[]);
    let a = daemon_at(&store, &cs_a, &flags);
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(
        a.metric("gap_healer_leader").await,
        Some(0.0),
        "{}",
        a.log()
    );
    let b = daemon_at(&store, &cs_b, &flags);
    assert!(
        store.wait_until_healed(Duration::from_secs(10)).await,
        "{}",
        b.log()
    );
    assert_eq!(b.metric("gap_healer_leader").await, Some(1.0));
    assert!(
        !a.lines_containing("not taking the leader lock").is_empty(),
        "{}",
        a.log()
    );

    // The leader loses its rights, the other is given them: the leader's
    // scans fail, it steps down, and the other takes over and fills.
    grant_healer_rights(&store, &role_a).await;
    let s = &store.schema;
    store
        .client
        .batch_execute(&format!("REVOKE SELECT ON {s}.messages FROM {role_b}"))
        .await
        .unwrap();
    let took = time_until(Instant::now(), Duration::from_secs(15), || async {
        a.metric("gap_healer_leader").await == Some(1.0)
    })
    .await;
    assert!(
        took.is_some(),
        "A leads once it can fill:\n{}\n{}",
        a.log(),
        b.log()
    );
    println!("a leader whose scans fail: the other leads {took:?} later");
    assert_eq!(b.metric("gap_healer_leader").await, Some(0.0));
    assert!(
        !b.lines_containing("stepped down as leader: this healer cannot fill")
            .is_empty(),
        "{}",
        b.log()
    );
    store.append("X", 1, Ending::RollbackAfterInsert).await;
    store.append("C", 1, Ending::Commit).await;
    assert!(
        store.wait_until_healed(Duration::from_secs(10)).await,
        "{}",
        a.log()
    );
    drop((a, b));
    let url = store.url();
    store.drop_schema().await;
    let c = gap_healer_testkit::pg::connect_to(&url).await;
    for role in [role_a, role_b] {
        c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
            .await
            .unwrap();
    }
}
