//! Leader election on PostgreSQL: one filler among many healers, and a
//! bounded takeover when the leader dies. The leader lock itself (one
//! holder, released with its session, a follower's kept session) is the
//! engine contract's (`contract::pg::leader_lock_*`).

use std::time::{Duration, Instant};

use gap_healer_testkit::bin::{timing, Daemon};
use gap_healer_testkit::pg::{Ending, Store};
use gap_healer_testkit::wait::time_until;

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
    // Issue 27: and it says it is a dry run, so GapHealerNoLeader can leave
    // out a store that only dry runs watch (deploy/prometheus/alerts.yml).
    assert_eq!(dry.metric("gap_healer_dry_run").await, Some(1.0));
    assert_eq!(filler.metric("gap_healer_dry_run").await, Some(0.0));
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
    store.grant_healer_rights(&role_b).await;
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
    store.grant_healer_rights(&role_a).await;
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
}
