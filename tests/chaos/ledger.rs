//! The ledger-core chaos run on PostgreSQL: seed 003's `events` table
//! (`tests/fixtures/ledger_core_postgres.sql`) in the run's own throwaway
//! cluster, appended to the way seed 003 appends but WITHOUT its global
//! advisory lock, so appends run in parallel and commit out of position
//! order; healed by 3 healer processes of the real binary with
//! `--profile ledger-core` and a `watermark_table`, killed and restarted, the
//! server restarted once, as in the other runs (`run.rs` drives it and
//! judges the store: [`LedgerStore`] is its [`Backend`], a schema of the
//! run's cluster as `postgres.rs`'s [`InCluster`] keeps one, and
//! [`LedgerEvents`] its [`Verdict`], what it adds).
//!
//! The writers are the chaos writers: rollbacks after insert, slow appends
//! held open 50-500 ms, and appends that conflict on the unique
//! (stream_category, stream_id, version) key: a two-stream append whose
//! second stream is written at a stale version, and the races two
//! unlocked appends to one stream really run (both read the same current
//! version; the second insert waits for the first and fails). Each append
//! reads its stream's current version and writes the next ones, as seed
//! 003's `AppendAsync` does once it holds its lock.
//!
//! On top of the run's verdict:
//!
//! - the watermark is sampled every 100 ms ([`Watermark`]): every position
//!   up to it a committed event or tombstone in that snapshot, never
//!   decreasing, reaching the head at the end;
//! - a naive reader like seed 003's `ReadAll`, polling `WHERE position >
//!   @after AND position <= (SELECT position FROM <watermark table> WHERE
//!   store = 'default') ORDER BY position`, must read every committed
//!   non-tombstone event exactly once, in position order;
//! - a second naive reader without the watermark predicate runs beside it:
//!   the events it skipped (committed after it had read past them) are
//!   counted and reported, not judged;
//! - tombstone versions are each of 1..=n exactly once (in fill order:
//!   position order within a fill, not across fills).
//!
//! `CHAOS_LEDGER_NO_WATERMARK=1` drops the watermark predicate from the
//! checked reader: the run must then fail (it skips late commits), which
//! shows the reader check can see it.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gap_healer_testkit::ledger::{Ledger, TOMBSTONE_CATEGORY};
use gap_healer_testkit::pg::{self, Throwaway};
use gap_healer_testkit::subscriber::PageRow;
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::postgres::{end_append, refusal, try_connect, InCluster};
use crate::run::*;
use crate::support::*;
use crate::watermark::{create_watermark_table, Watermark};

/// The writers' streams' category (the stream id tells them apart).
const CATEGORY: &str = "account";
/// The unique key a lost race meets.
const VERSION_KEY: &str = "events_stream_version_key";
const PKEY: &str = "events_pkey";
/// The store's name in the watermark table (a store configured by flags).
const STORE: &str = "default";

/// A stream's name in the verdict: the tombstone stream's is the chaos
/// run's [`TOMBSTONE_STREAM`], any other's `category/stream_id`.
fn name_sql() -> String {
    format!(
        "CASE WHEN stream_category = '{TOMBSTONE_CATEGORY}' AND stream_id = '{}' THEN '{TOMBSTONE_STREAM}' \
         ELSE stream_category || '/' || stream_id::text END",
        Uuid::nil()
    )
}

/// The ledger stream a writer's stream name stands for.
fn stream_of(name: &str) -> (Uuid, String) {
    let mut h = std::hash::DefaultHasher::new();
    name.hash(&mut h);
    let a = h.finish();
    a.hash(&mut h);
    let id = Uuid::from_u64_pair(a, h.finish());
    (id, format!("{CATEGORY}/{id}"))
}

/// seed 003's table in a schema of the run's cluster ([`InCluster`], which
/// it derefs to).
pub struct LedgerStore {
    store: InCluster,
}

impl std::ops::Deref for LedgerStore {
    type Target = InCluster;

    fn deref(&self) -> &InCluster {
        &self.store
    }
}

impl LedgerStore {
    async fn create(cluster: Arc<Throwaway>, db: &str) -> LedgerStore {
        let store = InCluster::new(cluster, db, "chaos_ledger");
        Ledger::create(store.url(), &store.schema).await;
        LedgerStore { store }
    }

    /// Every tombstone's version, in position order.
    async fn tombstone_versions(&self) -> Vec<(i64, i64)> {
        let sql = format!(
            "SELECT position, version FROM {}.events WHERE event_type = $1 ORDER BY position",
            self.schema
        );
        self.select(&sql, &[&TOMBSTONE_TYPE])
            .await
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }
}

impl Backend for LedgerStore {
    type Conn = Client;
    const NAME: &'static str = "PostgreSQL";
    const FIRST: i64 = 1;
    const DUPLICATES_IGNORED: bool = false;
    const MESSAGE_IDS: bool = false;
    /// 50 ms to 3 s: late commits a naive reader skips, and positions held
    /// past gap_timeout, which the healers must wait out.
    const SLOW_HOLD: (f64, f64) = (0.05, 3.0);

    async fn connect(&self) -> Result<Client, String> {
        self.store.connect().await
    }

    /// seed 003's append without its lock: per stream, read the current
    /// version, insert the events at the versions after it; one
    /// transaction. An event's id (the chaos run's message id) is kept in
    /// its data, as `id`.
    async fn append(&self, c: &mut Client, append: &Append<'_>) -> Attempt {
        let c: &Client = c;
        let s = &self.schema;
        let refused = |e: &tokio_postgres::Error, what: &str| -> Attempt {
            append.refused(what, refusal(e, PKEY, Some(VERSION_KEY)), &format!("{e:?}"))
        };
        if let Err(e) = c.batch_execute("BEGIN").await {
            return refused(&e, "BEGIN");
        }
        let mut events = Vec::new();
        for (pi, part) in append.parts.iter().enumerate() {
            let (stream_id, name) = stream_of(&part.stream);
            let current: i64 = match c
                .query_one(
                    &format!("SELECT COALESCE(MAX(version), 0) FROM {s}.events WHERE stream_category = $1 AND stream_id = $2"),
                    &[&CATEGORY, &stream_id],
                )
                .await
            {
                Ok(r) => r.get(0),
                Err(e) => {
                    let _ = c.batch_execute("ROLLBACK").await;
                    return refused(&e, "the current version");
                }
            };
            for (i, id) in part.ids.iter().enumerate() {
                let data = append.data(pi, i);
                let mut stored = data.clone();
                stored["id"] = serde_json::json!(id.to_string());
                // A stale expected version: one already taken (0 on a new
                // stream, which the CHECK refuses).
                let version = if part.fail {
                    current
                } else {
                    current + 1 + i as i64
                };
                let inserted = c
                    .query_one(
                        &format!(
                            "INSERT INTO {s}.events (stream_category, stream_id, version, event_type, data) \
                             VALUES ($1, $2, $3, $4, $5) RETURNING position"
                        ),
                        &[&CATEGORY, &stream_id, &version, &EVENT_TYPE, &stored],
                    )
                    .await;
                match inserted {
                    Ok(r) => {
                        append.inserted(part);
                        events.push(Event {
                            id: *id,
                            stream: name.clone(),
                            global: r.get(0),
                            stream_pos: version as i32,
                            data,
                        });
                    }
                    Err(e) => {
                        let constraint = e.as_db_error().and_then(|d| d.constraint());
                        let expected = part.fail
                            && (e.code() == Some(&SqlState::CHECK_VIOLATION)
                                || (e.code() == Some(&SqlState::UNIQUE_VIOLATION)
                                    && constraint == Some(VERSION_KEY)));
                        let _ = c.batch_execute("ROLLBACK").await;
                        if expected {
                            return append.failed_as_meant(part);
                        }
                        return refused(&e, "an insert");
                    }
                }
            }
        }
        end_append(c, append, events, refused).await
    }

    async fn resolve(&self, journal: &Journal, events: &[Event]) -> bool {
        if events.is_empty() {
            return false;
        }
        let c = self.check().await;
        let ids: Vec<String> = events.iter().map(|e| e.id.to_string()).collect();
        let positions: Vec<i64> = events.iter().map(|e| e.global).collect();
        let found: i64 = c
            .query_one(
                &format!(
                    "SELECT COUNT(*) FROM {}.events WHERE position = ANY($1) AND data->>'id' = ANY($2)",
                    self.schema
                ),
                &[&positions, &ids],
            )
            .await
            .expect("read back an append")
            .get(0);
        journal.read_back(usize::try_from(found).unwrap_or(0), events.len())
    }

    async fn page(&self, c: &mut Client, next: i64) -> Result<Vec<PageRow>, String> {
        let rows = c
            .query(
                &format!(
                    "SELECT position, COALESCE((data->>'id')::uuid, '{nil}'), {name}, event_type,
                            recorded_at < now() - interval '1 hour'
                     FROM {s}.events WHERE position >= $1 ORDER BY position LIMIT 500",
                    nil = Uuid::nil(),
                    name = name_sql(),
                    s = self.schema
                ),
                &[&next],
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(pg::page_rows(&rows))
    }

    fn healer_store(&self, slot: usize) -> Spec {
        let wm = format!("{}.watermarks", self.schema);
        self.store.healer_store(
            slot,
            &["--profile", "ledger-core", "--watermark-table", &wm],
        )
    }

    async fn restart(&self) -> (Duration, String) {
        self.store.restart().await
    }

    async fn count_and_head(&self) -> (i64, i64) {
        let sql = format!(
            "SELECT COUNT(*), COALESCE(MAX(position), 0) FROM {}.events",
            self.schema
        );
        let row = &self.select(&sql, &[]).await[0];
        (row.get(0), row.get(1))
    }

    /// The rows, the id out of the data.
    async fn rows(&self) -> Vec<StoredRow> {
        self.stored_rows(&format!(
            "SELECT position, COALESCE((data->>'id')::uuid, '{nil}'), {name}, version::int, event_type, (data - 'id')::text
             FROM {s}.events ORDER BY 1",
            nil = Uuid::nil(),
            name = name_sql(),
            s = self.schema
        ))
        .await
    }

    /// Each stream's versions, counted from 0 as the verdict counts
    /// Eventuous's stream positions (ledger-core's start at 1): contiguous
    /// versions 1..=n are "Version n-1, positions 0..=n-1".
    async fn streams(&self) -> Vec<StoredStream> {
        self.stored_streams(&format!(
            "SELECT {name}, MAX(version)::int - 1, COUNT(*), MIN(version)::int - 1, MAX(version)::int - 1
             FROM {s}.events GROUP BY 1 ORDER BY 1",
            name = name_sql(),
            s = self.schema
        ))
        .await
    }

    /// A fill's rows share its transaction's `recorded_at` (`now()`).
    async fn fill_transactions(&self) -> i64 {
        let sql = format!(
            "SELECT COUNT(DISTINCT recorded_at) FROM {}.events WHERE event_type = $1",
            self.schema
        );
        self.select(&sql, &[&TOMBSTONE_TYPE]).await[0].get(0)
    }

    fn describe(&self) -> String {
        self.store.describe()
    }

    async fn remove(&self) {
        self.store.remove().await;
    }
}

/// What a naive reader read.
#[derive(Default)]
struct ReaderLog {
    /// (position, id) of every event read, in reading order.
    read: Vec<(i64, Uuid)>,
    tombstones: u64,
    /// The last position read (seed 003's `@after`).
    after: i64,
    polls: u64,
    reconnects: u64,
    /// Heads seen above `after`, and when first seen.
    behind: VecDeque<(i64, Instant)>,
    /// The longest time from a head being visible until the reader had
    /// read past it, and that head.
    longest_lag: (Duration, i64),
}

impl ReaderLog {
    fn lagged(&mut self, head: i64, took: Duration) {
        if took > self.longest_lag.0 {
            self.longest_lag = (took, head);
        }
    }
}

/// A polling reader like seed 003's `ReadAll` (with or without the
/// watermark predicate), on a task of its own; reconnects whenever the
/// server goes.
struct Reader {
    log: Arc<Mutex<ReaderLog>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Reader {
    fn start(url: &str, schema: &str, watermark: Option<&str>) -> Reader {
        let bound = watermark.map_or(String::new(), |t| {
            format!(" AND position <= (SELECT position FROM {t} WHERE store = '{STORE}')")
        });
        let read = format!(
            "SELECT position, event_type, data->>'id' FROM {schema}.events \
             WHERE position > $1{bound} ORDER BY position LIMIT 500"
        );
        let head = format!("SELECT COALESCE(MAX(position), 0) FROM {schema}.events");
        let log = Arc::new(Mutex::new(ReaderLog::default()));
        let stop = CancellationToken::new();
        let (l, st, url) = (log.clone(), stop.clone(), url.to_string());
        let task = tokio::spawn(async move {
            let mut client: Option<Client> = None;
            while !st.is_cancelled() {
                let c = match &client {
                    Some(c) => c,
                    None => match try_connect(&url).await {
                        Ok(c) => {
                            l.lock().unwrap().reconnects += 1;
                            client.insert(c)
                        }
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                };
                let after = l.lock().unwrap().after;
                let polled = async {
                    let head: i64 = c.query_one(&head, &[]).await?.get(0);
                    Ok::<_, tokio_postgres::Error>((head, c.query(&read, &[&after]).await?))
                }
                .await;
                let (head, rows) = match polled {
                    Ok(p) => p,
                    Err(_) => {
                        client = None;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                {
                    let mut log = l.lock().unwrap();
                    let now = Instant::now();
                    log.polls += 1;
                    if head > log.after && log.behind.back().is_none_or(|(h, _)| *h < head) {
                        log.behind.push_back((head, now));
                    }
                    for r in &rows {
                        let position: i64 = r.get(0);
                        let kind: String = r.get(1);
                        if kind == TOMBSTONE_TYPE {
                            log.tombstones += 1;
                        } else {
                            let id: Option<String> = r.get(2);
                            let id = id.and_then(|i| i.parse().ok()).unwrap_or_default();
                            log.read.push((position, id));
                        }
                        log.after = position;
                    }
                    while let Some((h, since)) = log.behind.front().copied() {
                        if h > log.after {
                            break;
                        }
                        log.behind.pop_front();
                        log.lagged(h, now - since);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // Still behind at the end: those lags count too.
            let mut log = l.lock().unwrap();
            if let Some((h, since)) = log.behind.front().copied() {
                log.lagged(h, since.elapsed());
            }
        });
        Reader { log, stop, task }
    }

    fn after(&self) -> i64 {
        self.log.lock().unwrap().after
    }

    async fn stop(self) -> ReaderLog {
        self.stop.cancel();
        self.task.await.expect("a reader panicked");
        Arc::try_unwrap(self.log)
            .ok()
            .expect("the reader is done")
            .into_inner()
            .unwrap()
    }
}

/// What the ledger run adds to the chaos loop: the watermark's samples, and
/// the end waits for it and both readers to reach the head.
struct LedgerEvents {
    store: Arc<LedgerStore>,
    wm: Watermark,
    checked: Reader,
    unbounded: Reader,
}

impl Extra for LedgerEvents {
    async fn tick(&mut self, _: Duration, _: &mut Healers) {
        self.wm.sample().await;
    }

    async fn settled(&mut self) -> bool {
        self.wm.sample().await;
        let (_, head) = self.store.count_and_head().await;
        self.wm.last == Some(head) && self.checked.after() >= head && self.unbounded.after() >= head
    }
}

/// The checker's own test: the checked reader without the watermark
/// predicate, so it must skip late commits and the run fail.
fn no_watermark() -> bool {
    std::env::var("CHAOS_LEDGER_NO_WATERMARK").is_ok()
}

impl Verdict for LedgerEvents {
    /// The watermark's samples, the readers (the checked one: every
    /// committed event exactly once, in order; the unbounded one counted),
    /// the tombstone versions.
    async fn verdict(self, head: i64) -> (Vec<String>, String) {
        let LedgerEvents {
            store,
            wm,
            checked,
            unbounded,
        } = self;
        let (checked, unbounded) = (checked.stop().await, unbounded.stop().await);
        let mut failures = wm.failures(head);

        // The committed events, as the readers must have read them.
        let rows = store.rows().await;
        let committed: Vec<(i64, Uuid)> = rows
            .iter()
            .filter(|r| r.4 != TOMBSTONE_TYPE)
            .map(|r| (r.0, r.1))
            .collect();
        let committed_set: HashSet<(i64, Uuid)> = committed.iter().copied().collect();
        let missed = |log: &ReaderLog| -> Vec<(i64, Uuid)> {
            let read: HashSet<(i64, Uuid)> = log.read.iter().copied().collect();
            committed
                .iter()
                .filter(|e| !read.contains(e))
                .copied()
                .collect()
        };

        // The checked reader: every committed event exactly once, in order.
        let skipped = missed(&checked);
        let label = if no_watermark() {
            "the checked reader (WITHOUT the watermark predicate: CHAOS_LEDGER_NO_WATERMARK)"
        } else {
            "the reader bounded by the watermark"
        };
        if !skipped.is_empty() {
            failures.push(format!(
                "{label} never read {} committed events, e.g. (position, id) {:?}",
                skipped.len(),
                &skipped[..skipped.len().min(5)]
            ));
        }
        if let Some(w) = checked.read.windows(2).find(|w| w[0].0 >= w[1].0) {
            failures.push(format!(
                "{label} read out of position order or twice: {w:?}"
            ));
        }
        let foreign: Vec<_> = checked
            .read
            .iter()
            .filter(|e| !committed_set.contains(e))
            .take(5)
            .collect();
        if !foreign.is_empty() {
            failures.push(format!(
                "{label} read events that are not committed (or not at that position), e.g. {foreign:?}"
            ));
        }

        // The unbounded reader: counted, not judged.
        let unbounded_skipped = missed(&unbounded);

        // Tombstone versions: each of 1..=n exactly once. They follow the
        // order of the fills, which is position order within one fill but not
        // across fills: a position held by a slow append is filled after the
        // holes above it.
        let tombstones = store.tombstone_versions().await;
        let mut versions: Vec<i64> = tombstones.iter().map(|(_, v)| *v).collect();
        versions.sort_unstable();
        if let Some((k, v)) = versions
            .iter()
            .enumerate()
            .find(|(k, v)| **v != *k as i64 + 1)
        {
            failures.push(format!(
                "tombstone versions are not each of 1..={} once: sorted, the {}th is {v}",
                tombstones.len(),
                k + 1
            ));
        }
        let out_of_order = tombstones.windows(2).filter(|w| w[1].1 < w[0].1).count();

        let mut figures = wm.figures(head);
        figures.push_str(&format!(
            "bounded reader         read {} events ({} distinct) of {} committed, {} not read (and {} tombstones), {} polls, {} connections; longest lag behind the head {:.2?} (head {}){}\n",
            checked.read.len(),
            checked.read.iter().collect::<HashSet<_>>().len(),
            committed.len(),
            skipped.len(),
            checked.tombstones,
            checked.polls,
            checked.reconnects,
            checked.longest_lag.0,
            checked.longest_lag.1,
            if no_watermark() { "; WITHOUT the watermark predicate" } else { "" }
        ));
        figures.push_str(&format!(
            "unbounded reader       read {} of {} committed events: skipped {} that committed after it had read past their positions (expected, not judged)\n",
            unbounded.read.len(),
            committed.len(),
            unbounded_skipped.len(),
        ));
        figures.push_str(&format!(
            "tombstone versions     {} tombstones, each of versions 1..={} once; {} places where a later position has a lower version (filled after the holes above it)\n",
            tombstones.len(),
            versions.last().copied().unwrap_or(0),
            out_of_order
        ));
        (failures, figures)
    }
}

/// The ledger-core chaos run: seed 003's table in a cluster of its own, a
/// watermark table, the two readers; [`run`] drives and judges it.
pub async fn run() {
    let cluster = Arc::new(Throwaway::started("chaos-ledger", "trust"));
    cluster.create_database("chaos").await;
    let store = Arc::new(LedgerStore::create(cluster, "chaos").await);
    let wm_table = format!("{}.watermarks", store.schema);
    create_watermark_table(
        &store.check().await,
        store.url(),
        &["--schema", &store.schema, "--profile", "ledger-core"],
        &wm_table,
    )
    .await;
    println!(
        "chaos ledger-core: cluster port {}, watermark table {wm_table}{}",
        store.port(),
        if no_watermark() {
            "; the checked reader WITHOUT the watermark predicate"
        } else {
            ""
        }
    );
    let checked_bound = (!no_watermark()).then_some(wm_table.as_str());
    let events = LedgerEvents {
        store: store.clone(),
        wm: Watermark::new(
            store.url(),
            &format!("{}.events", store.schema),
            "position",
            &wm_table,
            STORE,
        ),
        checked: Reader::start(store.url(), &store.schema, checked_bound),
        unbounded: Reader::start(store.url(), &store.schema, None),
    };
    crate::run::run(store, Some("ledger-core"), events).await;
}
