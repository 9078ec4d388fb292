//! The transaction-end proof against writers that hold a drawn position
//! with no key yet, each the way a user's writer does it, statement by
//! statement, with the real binary (`run --gap-timeout 1s --poll-interval
//! 100ms --lock-timeout 300ms`): the writer draws position 2 and holds it
//! about 3 s while another append commits at 3, so the daemon sees a hole
//! at 2 that is a gap_timeout old long before the writer's key exists.
//! Each case runs twice, side by side in two schemas: once without the
//! healer (the control: the writer succeeds and every row is stored) and
//! once with it, which must end the same way, with no tombstone at the
//! writer's positions. Before the transaction-end proof, the daemon filled
//! position 2 in every one of these cases (the enumeration of waits it
//! replaced did not see them).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::SinkExt;
use gap_healer_testkit::bin::{timing, Daemon};
use gap_healer_testkit::eventuous::{self, EVENT_TYPE};
use gap_healer_testkit::pg::{self, Store};
use gap_healer_testkit::wait;
use tokio::sync::Notify;
use tokio_postgres::Client;
use uuid::Uuid;

/// How long the writer holds its drawn position.
const HOLD: Duration = Duration::from_secs(3);

/// How a writer holds a drawn position without its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Writer {
    /// Eventuous's own `append_events`; the table has a CHECK constraint
    /// whose function waits on an advisory lock another append of the
    /// tenant holds.
    CheckWaits,
    /// `INSERT ... VALUES` whose column after the position is an expression
    /// that waits on such a lock.
    ValuesExpressionWaits,
    /// Eventuous's `append_events` through a BEFORE INSERT row trigger that
    /// runs for seconds without waiting for any lock.
    SlowTrigger,
    /// `COPY ... FROM STDIN` from a client that pauses between rows.
    PausingCopy,
    /// `nextval()` in one statement, the insert of that value with
    /// `OVERRIDING SYSTEM VALUE` in a later one of the same transaction.
    NextvalThenInsert,
}

/// What a run ended with.
#[derive(Debug)]
struct Run {
    /// The writer's answer: `Ok` or the SQLSTATE it failed with.
    answer: Result<(), String>,
    /// The writer's rows in the table, and how many it wrote.
    stored: i64,
    wrote: i64,
    /// The positions its rows took.
    positions: Vec<i64>,
    tombstones: Vec<i64>,
    missing: Vec<i64>,
    /// With the healer: fill cycles it deferred for an open transaction,
    /// and its log.
    deferred: f64,
    /// With the healer: whether a hole made after the writer ended was
    /// filled.
    later_hole_filled: Option<bool>,
    log: String,
}

/// The advisory lock class of a store's tenant gate (per schema, so that
/// two stores of one database do not share it).
fn gate_class(schema: &str) -> i32 {
    schema
        .bytes()
        .fold(17i32, |h, b| h.wrapping_mul(31).wrapping_add(i32::from(b)))
}

async fn prepare(store: &Store, writer: Writer) {
    let s = &store.schema;
    let class = gate_class(s);
    let sql = match writer {
        Writer::CheckWaits => format!(
            "CREATE FUNCTION {s}.tenant_gate(stream int) RETURNS boolean LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_advisory_xact_lock({class}, stream); RETURN true; END $$;
             ALTER TABLE {s}.messages ADD CONSTRAINT tenant_gate CHECK ({s}.tenant_gate(stream_id));"
        ),
        Writer::ValuesExpressionWaits => format!(
            "CREATE FUNCTION {s}.gated_data(stream int) RETURNS jsonb LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_advisory_xact_lock({class}, stream); RETURN '{{}}'::jsonb; END $$;"
        ),
        Writer::SlowTrigger => format!(
            "CREATE FUNCTION {s}.slow() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF current_setting('gap_test.slow', true) = 'on' THEN PERFORM pg_sleep({}); END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER slow BEFORE INSERT ON {s}.messages FOR EACH ROW EXECUTE FUNCTION {s}.slow();",
            HOLD.as_secs()
        ),
        Writer::PausingCopy | Writer::NextvalThenInsert => String::new(),
    };
    store.client.batch_execute(&sql).await.unwrap();
}

/// The sequence's last value handed out.
async fn handed_out(c: &Client, schema: &str) -> i64 {
    c.query_one(
        &format!(
            "SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END
             FROM {schema}.messages_global_position_seq"
        ),
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

fn code(e: tokio_postgres::Error) -> String {
    e.code()
        .map_or_else(|| e.to_string(), |c| c.code().to_string())
}

/// Stream `s`'s id.
async fn stream_id(c: &Client, schema: &str) -> Result<i32, String> {
    Ok(c.query_one(
        &format!("SELECT stream_id FROM {schema}.streams WHERE stream_name = 's'"),
        &[],
    )
    .await
    .map_err(code)?
    .get(0))
}

/// The writer's transaction, on its own session: it draws, waits (on the
/// gate, the trigger, or `release`), and commits. Its message ids.
async fn write(
    writer: Writer,
    url: String,
    schema: String,
    ids: Vec<Uuid>,
    release: Arc<Notify>,
) -> Result<(), String> {
    let c = pg::connect_to(&url).await;
    let s = &schema;
    c.batch_execute("BEGIN").await.map_err(code)?;
    match writer {
        Writer::CheckWaits => {
            eventuous::pg::append_events(&c, s, "s", 0, &ids, EVENT_TYPE)
                .await
                .map_err(code)?;
        }
        Writer::SlowTrigger => {
            c.batch_execute("SET LOCAL gap_test.slow = 'on'")
                .await
                .map_err(code)?;
            eventuous::pg::append_events(&c, s, "s", 0, &ids, EVENT_TYPE)
                .await
                .map_err(code)?;
        }
        Writer::ValuesExpressionWaits => {
            let sid = stream_id(&c, s).await?;
            // The row's expressions run in the table's column order: the
            // position's default is drawn before json_data's.
            c.execute(
                &format!(
                    "INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, json_data, created)
                     VALUES ($1, $2, $3, 1, {s}.gated_data($3), now())"
                ),
                &[&ids[0], &EVENT_TYPE, &sid],
            )
            .await
            .map_err(code)?;
        }
        Writer::PausingCopy => {
            let sid = stream_id(&c, s).await?;
            let sink = c
                .copy_in::<_, Bytes>(&format!(
                    "COPY {s}.messages (message_id, message_type, stream_id, stream_position, json_data, created) FROM STDIN"
                ))
                .await
                .map_err(code)?;
            futures_util::pin_mut!(sink);
            let row = |i: usize| {
                Bytes::from(format!(
                    "{}\t{EVENT_TYPE}\t{sid}\t{}\t{{}}\t2026-12-02 00:00:00\n",
                    ids[i],
                    i + 1
                ))
            };
            sink.send(row(0)).await.map_err(code)?;
            // COPY buffers the formed row (its position drawn) and reads
            // the client again: the pause is a wait on the network.
            release.notified().await;
            for i in 1..ids.len() {
                sink.send(row(i)).await.map_err(code)?;
            }
            sink.finish().await.map_err(code)?;
        }
        Writer::NextvalThenInsert => {
            let drawn: i64 = c
                .query_one(
                    &format!(
                        "SELECT nextval(pg_get_serial_sequence('{s}.messages', 'global_position'))"
                    ),
                    &[],
                )
                .await
                .map_err(code)?
                .get(0);
            release.notified().await;
            c.execute(
                &format!(
                    "INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, global_position, json_data, created)
                     OVERRIDING SYSTEM VALUE
                     SELECT $1, $2, st.stream_id, 1, $3, '{{}}', now()
                     FROM {s}.streams AS st WHERE st.stream_name = 's'"
                ),
                &[&ids[0], &EVENT_TYPE, &drawn],
            )
            .await
            .map_err(code)?;
        }
    }
    c.batch_execute("COMMIT").await.map_err(code)
}

/// One run of `writer` on a store of its own, with the daemon or without.
async fn run(writer: Writer, healer: bool) -> Run {
    let tag = if healer { "proof_heal" } else { "proof_ctrl" };
    let store = Store::new(tag).await;
    let s = store.schema.clone();
    prepare(&store, writer).await;
    let c = &store.client;
    eventuous::pg::append_events(c, &s, "s", -1, &[Uuid::new_v4()], EVENT_TYPE)
        .await
        .unwrap();
    let daemon =
        healer.then(|| Daemon::start(&store, &timing("1s", "100ms", &["--lock-timeout", "300ms"])));
    if let Some(d) = &daemon {
        let began = wait::until(Duration::from_secs(20), || async {
            d.metric(r#"gap_healer_head_position{store="default"}"#)
                .await
                .is_some()
        })
        .await;
        assert!(began, "the daemon began: {}", d.log());
    }
    // Another append of the tenant holds the gate of stream s.
    let holder = pg::connect_to(&store.url()).await;
    holder
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({}, stream_id) FROM {s}.streams WHERE stream_name = 's'",
            gate_class(&s)
        ))
        .await
        .unwrap();
    let rows = if writer == Writer::PausingCopy { 3 } else { 1 };
    let ids: Vec<Uuid> = (0..rows).map(|_| Uuid::new_v4()).collect();
    let release = Arc::new(Notify::new());
    let task = tokio::spawn(write(
        writer,
        store.url(),
        s.clone(),
        ids.clone(),
        release.clone(),
    ));
    let drawn = wait::until(Duration::from_secs(10), || async {
        handed_out(c, &s).await >= 2
    })
    .await;
    assert!(drawn, "{writer:?}: the writer drew position 2");
    // Another stream's append commits above: 2 is a hole to every reader.
    let other = pg::connect_to(&store.url()).await;
    eventuous::pg::append_events(&other, &s, "other", -1, &[Uuid::new_v4()], EVENT_TYPE)
        .await
        .unwrap();
    let started = Instant::now();
    tokio::time::sleep(HOLD.saturating_sub(Duration::from_millis(300))).await;
    holder.batch_execute("COMMIT").await.unwrap();
    release.notify_one();
    let answer = tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the writer ended")
        .unwrap();
    let held_for = started.elapsed();
    let mut later_hole_filled = None;
    if daemon.is_some() {
        // The readings go on proving: a rolled-back append made now is
        // filled (a reading that never proved anything would pass the
        // rest of this test too).
        let hole = store
            .append("later", 1, pg::Ending::RollbackAfterInsert)
            .await[0];
        store.append("later", 1, pg::Ending::Commit).await;
        later_hole_filled = Some(
            wait::until(Duration::from_secs(15), || async {
                store.tombstone_positions().await.contains(&hole)
            })
            .await,
        );
    }
    let positions: Vec<i64> = c
        .query(
            &format!(
                "SELECT global_position FROM {s}.messages WHERE message_id = ANY($1) ORDER BY 1"
            ),
            &[&ids],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (deferred, log) = match &daemon {
        Some(d) => (
            d.metric(
                r#"gap_healer_fill_attempts_total{store="default",outcome="open_transaction"}"#,
            )
            .await
            .unwrap_or(0.0),
            d.log(),
        ),
        None => (0.0, String::new()),
    };
    assert!(
        held_for >= Duration::from_millis(2_500),
        "{writer:?}: the writer held its position {held_for:?}"
    );
    let run = Run {
        answer,
        stored: positions.len() as i64,
        wrote: rows as i64,
        positions,
        tombstones: store.tombstone_positions().await,
        missing: store.missing().await,
        deferred,
        later_hole_filled,
        log,
    };
    drop(daemon);
    store.drop_schema().await;
    run
}

/// The control and the healed run of `writer`, side by side.
async fn holds_against(writer: Writer) {
    let (control, healed) = tokio::join!(run(writer, false), run(writer, true));
    println!(
        "{writer:?}: without the healer {:?}, {} of {} rows; with it {:?}, {} of {} rows at {:?}, tombstones {:?}, {} fill cycle(s) deferred for an open transaction",
        control.answer, control.stored, control.wrote, healed.answer, healed.stored, healed.wrote,
        healed.positions, healed.tombstones, healed.deferred
    );
    assert_eq!(control.answer, Ok(()), "{writer:?}: the control run");
    assert_eq!(control.stored, control.wrote, "{writer:?}: the control run");
    assert_eq!(
        healed.answer,
        Ok(()),
        "{writer:?}: the writer failed with the healer\n{}",
        healed.log
    );
    assert_eq!(
        healed.stored, healed.wrote,
        "{writer:?}: the writer's rows lost with the healer (tombstones at {:?})\n{}",
        healed.tombstones, healed.log
    );
    for p in &healed.positions {
        assert!(
            !healed.tombstones.contains(p),
            "{writer:?}: tombstone at {p}"
        );
    }
    assert!(
        healed.deferred >= 1.0,
        "{writer:?}: the hole waited for the writer's transaction\n{}",
        healed.log
    );
    assert!(
        healed.log.contains(
            "not filling yet: a transaction that may have drawn these positions is still open"
        ),
        "{}",
        healed.log
    );
    assert!(
        healed.missing.is_empty(),
        "{writer:?}: {:?}",
        healed.missing
    );
    assert_eq!(
        healed.later_hole_filled,
        Some(true),
        "{writer:?}: a hole made after the writer ended was not filled\n{}",
        healed.log
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eventuous_append_behind_a_check_constraint_that_waits_on_a_lock_keeps_its_event() {
    holds_against(Writer::CheckWaits).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insert_whose_later_column_waits_on_a_lock_keeps_its_position() {
    holds_against(Writer::ValuesExpressionWaits).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_before_trigger_without_a_lock_wait_keeps_its_event() {
    holds_against(Writer::SlowTrigger).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_from_a_client_that_pauses_between_rows_keeps_every_row() {
    holds_against(Writer::PausingCopy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nextval_then_an_insert_of_that_value_in_the_same_transaction_keeps_it() {
    holds_against(Writer::NextvalThenInsert).await;
}

/// A prepared (two-phase) transaction that drew a position: its
/// virtualtransaction changes at PREPARE TRANSACTION, its transaction id
/// does not, and the proof follows it by that (a throwaway cluster with
/// `max_prepared_transactions`, which the shared server does not set).
/// The hole waits for COMMIT PREPARED without a single fill attempt (a
/// proof that lost it would try the fill and meet the prepared key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_transaction_is_waited_for_through_its_transaction_id() {
    let cluster =
        pg::Throwaway::started_with("twophase", "trust", "-c max_prepared_transactions=4");
    cluster.create_database("es").await;
    let store = cluster.store("es").await;
    let s = store.schema.clone();
    let c = &store.client;
    eventuous::pg::append_events(c, &s, "s", -1, &[Uuid::new_v4()], EVENT_TYPE)
        .await
        .unwrap();
    let daemon = Daemon::start(&store, &timing("1s", "100ms", &["--lock-timeout", "300ms"]));
    let writer = pg::connect_to(&store.url()).await;
    let id = Uuid::new_v4();
    writer.batch_execute("BEGIN").await.unwrap();
    eventuous::pg::append_events(&writer, &s, "s", 0, &[id], EVENT_TYPE)
        .await
        .unwrap();
    eventuous::pg::append_events(c, &s, "other", -1, &[Uuid::new_v4()], EVENT_TYPE)
        .await
        .unwrap();
    // The daemon sees the hole at 2 and reads the writer, then it prepares.
    let seen = wait::until(Duration::from_secs(10), || async {
        daemon
            .metric(r#"gap_healer_open_gaps{store="default"}"#)
            .await
            .is_some_and(|v| v >= 1.0)
    })
    .await;
    assert!(seen, "{}", daemon.log());
    tokio::time::sleep(Duration::from_millis(300)).await;
    writer
        .batch_execute("PREPARE TRANSACTION 'gap_healer_twophase'")
        .await
        .unwrap();
    tokio::time::sleep(HOLD).await;
    let attempts = |outcome: &'static str| {
        let daemon = &daemon;
        async move {
            daemon
                .metric(&format!(
                    r#"gap_healer_fill_attempts_total{{store="default",outcome="{outcome}"}}"#
                ))
                .await
                .unwrap_or(0.0)
        }
    };
    let deferred = attempts("open_transaction").await;
    let held = attempts("held").await;
    let age = daemon
        .metric(r#"gap_healer_blocking_transaction_age_seconds{store="default"}"#)
        .await
        .unwrap_or(0.0);
    assert!(
        store.tombstone_positions().await.is_empty(),
        "{}",
        daemon.log()
    );
    c.batch_execute("COMMIT PREPARED 'gap_healer_twophase'")
        .await
        .unwrap();
    println!("prepared: {deferred} cycles deferred, {held} held attempts, blocking age {age} s");
    assert!(deferred >= 1.0, "{}", daemon.log());
    assert_eq!(
        held,
        0.0,
        "the proof lost the prepared transaction\n{}",
        daemon.log()
    );
    assert!(
        age >= 2.0,
        "the blocking transaction's age: {age}\n{}",
        daemon.log()
    );
    let stored: i64 = c
        .query_one(
            &format!("SELECT count(*) FROM {s}.messages WHERE message_id = $1"),
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, 1);
    assert!(store.missing().await.is_empty());
    drop(daemon);
}
