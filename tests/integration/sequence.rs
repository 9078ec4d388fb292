//! The identity sequence behind the position, on the real PostgreSQL and
//! the real binary: positions it has not handed out are never filled, and a
//! sequence that lets a hole be a value another session still holds is
//! refused.

use gap_healer_testkit::pg::{Ending, Store};

/// One row of stream A copied in at position 100 with OVERRIDING SYSTEM
/// VALUE and no setval, as a logical-replication cutover leaves it.
async fn copy_in_at_100(store: &Store) {
    let s = &store.schema;
    store
        .client
        .batch_execute(&format!(
            "INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, global_position, json_data, created)
             OVERRIDING SYSTEM VALUE
             SELECT gen_random_uuid(), 'Copied', stream_id, 2, 100, '{{}}', now() FROM {s}.streams WHERE stream_name = 'A'"
        ))
        .await
        .unwrap();
}

/// Two appends, then one row copied in at position 100 with OVERRIDING
/// SYSTEM VALUE and no setval (a logical-replication cutover): the
/// sequence stays at 2, so 3..99 will still be handed out. Before the
/// check, `heal --once` filled 3..99 and the application's next append
/// failed with a duplicate key at 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_the_identity_has_not_handed_out_are_never_filled() {
    let store = Store::new("seq_behind").await;
    let s = store.schema.clone();
    store.append("A", 2, Ending::Commit).await;
    copy_in_at_100(&store).await;
    let check = store.cli(&["check"]);
    assert_eq!(check.code, 3, "{}", check.all());
    let line = check
        .stdout
        .lines()
        .find(|l| l.starts_with("FAIL identity sequence"))
        .unwrap_or_else(|| panic!("{}", check.all()));
    assert!(
        line.contains("last value 2 lies below the table's highest position 100"),
        "{line}"
    );
    assert!(
        line.contains(&format!("setval('{s}.messages_global_position_seq', 100)")),
        "{line}"
    );

    let heal = store.heal_once("0s", &[]);
    assert_eq!(heal.code, 3, "{}", heal.all());
    assert!(heal.all().contains("identity sequence"), "{}", heal.all());
    assert!(
        store.tombstone_positions().await.is_empty(),
        "nothing filled"
    );
    // The application goes on appending where its identity stands.
    assert_eq!(store.append("B", 1, Ending::Commit).await, vec![3]);

    // After the setval the advice names, 4..99 are holes for good, and filled.
    store
        .client
        .batch_execute(&format!(
            "SELECT setval('{s}.messages_global_position_seq', 100)"
        ))
        .await
        .unwrap();
    let heal = store.heal_once("0s", &[]);
    assert_eq!(heal.code, 0, "{}", heal.all());
    assert_eq!(
        store.tombstone_positions().await,
        (4..=99).collect::<Vec<i64>>()
    );
    assert_eq!(store.append("C", 1, Ending::Commit).await, vec![101]);
}

/// A sequence that hands positions out other than one at a time to this
/// table's own inserts is refused by `check` and `run`, each reason named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_stepped_or_shared_sequence_is_refused() {
    let store = Store::with_holes("seq_shape", &[1]).await;
    let s = store.schema.clone();
    let seq = format!("{s}.messages_global_position_seq");
    for (change, says) in [
        (
            format!("ALTER SEQUENCE {seq} CACHE 20"),
            "CACHE 20: each session pre-allocates 20 values",
        ),
        (format!("ALTER SEQUENCE {seq} INCREMENT 2"), "INCREMENT 2"),
        (
            format!("CREATE TABLE {s}.other (id bigint DEFAULT nextval('{seq}'))"),
            "also drawn from by",
        ),
    ] {
        store.client.batch_execute(&change).await.unwrap();
        let check = store.cli(&["check"]);
        assert_eq!(check.code, 3, "{change}: {}", check.all());
        assert!(
            check
                .stdout
                .lines()
                .any(|l| l.starts_with("FAIL identity sequence") && l.contains(says)),
            "{change}: {}",
            check.all()
        );
        let heal = store.heal_once("0s", &[]);
        assert_eq!(heal.code, 3, "{change}: {}", heal.all());
        assert!(
            store.tombstone_positions().await.is_empty(),
            "{change}: nothing filled"
        );
        store
            .client
            .batch_execute(&format!(
                "ALTER SEQUENCE {seq} CACHE 1 INCREMENT 1; DROP TABLE IF EXISTS {s}.other"
            ))
            .await
            .unwrap();
    }
    let check = store.cli(&["check"]);
    assert_eq!(check.code, 0, "{}", check.all());
    assert!(
        check.stdout.contains("ok   identity sequence"),
        "{}",
        check.stdout
    );
}

/// The same copy-in while a daemon runs (after its start's check passed):
/// the fill refuses every position above what the identity has handed out,
/// says what to run, and writes nothing; the application's next append
/// takes the next number as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_daemon_never_fills_above_the_identity() {
    use gap_healer_testkit::bin::{timing, Daemon};
    let store = Store::new("seq_running").await;
    store.append("A", 2, Ending::Commit).await;
    let daemon = Daemon::start(&store, &timing("200ms", "50ms", &[]));
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    copy_in_at_100(&store).await;
    let refused = gap_healer_testkit::wait::until(std::time::Duration::from_secs(10), || async {
        !daemon
            .lines_containing("the identity has handed out positions only up to 2")
            .is_empty()
    })
    .await;
    assert!(refused, "{}", daemon.log());
    assert!(
        store.tombstone_positions().await.is_empty(),
        "{}",
        daemon.log()
    );
    assert!(
        daemon.log().contains("setval(pg_get_serial_sequence"),
        "{}",
        daemon.log()
    );
    assert_eq!(store.append("B", 1, Ending::Commit).await, vec![3]);
    drop(daemon);
}
