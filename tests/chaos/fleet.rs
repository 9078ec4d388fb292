//! The fleet chaos run on PostgreSQL: four stores (three schemas in one
//! database, one in a second database) in the run's own throwaway cluster,
//! healed by the same three healer processes of the real binary, each
//! running the whole fleet from one `[[stores]]` file (leader election per
//! store). Every store has writers and a subscriber; the healers are killed
//! and restarted and the server restarted as in the single-store run
//! (`run.rs` drives both). On top of that:
//!
//! - one store is broken mid-run: its schema renamed away
//!   (`ALTER SCHEMA ... RENAME`) for at least 10 s, then renamed back. Its
//!   writers and subscriber wait out the break (the backend's gate); its
//!   healers fail every scan meanwhile. During the break every running
//!   healer is scraped over HTTP (`/status` and `gap_healer_stores`), and
//!   at least one scrape must show it failing. Its ERROR lines during the
//!   break are counted, not failures; every other invariant holds for it
//!   too.
//! - the other stores' longest subscriber stall must stay within
//!   [`STALL_BOUND`], shorter than the break: a store that waited on the
//!   broken one would stall for the whole break.
//! - one store publishes a watermark (`watermark_table`); every 100 ms it is
//!   sampled together with the rows at or below it in one statement (one
//!   snapshot): every position up to it must be a committed event or a
//!   tombstone at that moment, and it must never decrease. At the end it
//!   must reach the head.
//!
//! Each store's verdict reads only its own lines of the healers' logs (the
//! `store` span). A store could use another table profile and writer: a
//! store is a [`Backend`] of its own in a [`Tested`], and its `[[stores]]`
//! entry comes from [`FleetStore::entry`].

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gap_healer_testkit::bin;
use gap_healer_testkit::pg::Throwaway;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::postgres::{connect_within, Postgres};
use crate::run::*;
use crate::support::*;
use crate::watermark::{create_watermark_table, Watermark};

/// Writers per store (the single-store run has 8 on its one store).
const FLEET_WRITERS: usize = 3;
/// The healthy stores' longest subscriber stall may not exceed this. The
/// single-store run's longest stall is about 2 s (README); the break lasts
/// at least 10 s, so a store held up by the broken one shows.
pub const STALL_BOUND: Duration = Duration::from_secs(8);
/// The shortest break.
const MIN_BREAK: Duration = Duration::from_secs(10);

/// One store of the fleet: its backend and its `[[stores]]` entry.
pub struct FleetStore {
    pub name: String,
    pub backend: Arc<Postgres>,
    pub database: String,
    pub watermark_table: Option<String>,
}

impl FleetStore {
    /// Its `[[stores]]` entry for the healer in `slot`.
    pub fn entry(&self, slot: usize) -> String {
        let cs = self.backend.healer_url(slot);
        let mut e = format!(
            "\n[[stores]]\nname = \"{}\"\nconnection_string = \"{cs}\"\nschema = \"{}\"\n",
            self.name, self.backend.schema
        );
        if let Some(t) = &self.watermark_table {
            e.push_str(&format!("watermark_table = \"{t}\"\n"));
        }
        if split_leaders() {
            e.push_str(&format!(
                "leader_key = \"chaos-split-{slot}-{}\"\n",
                self.name
            ));
        }
        e
    }
}

/// The break of one store, run on a task of its own: waits for its writers'
/// appends in flight (the gate), renames the schema away, waits for
/// `restore`, renames it back (retrying through the server's restart).
struct Break {
    /// When the break was asked for, the schema renamed away, and back
    /// (µs since the epoch).
    asked_us: i64,
    times: Arc<Mutex<(Option<i64>, Option<i64>)>>,
    restore: CancellationToken,
    task: JoinHandle<()>,
}

impl Break {
    fn start(store: Arc<Postgres>) -> Break {
        let times = Arc::new(Mutex::new((None, None)));
        let restore = CancellationToken::new();
        let (t, r) = (times.clone(), restore.clone());
        let task = tokio::spawn(async move {
            let _gate = store.gate.clone().write_owned().await;
            let (s, away) = (&store.schema, format!("{}_broken", store.schema));
            rename(store.url(), s, &away).await;
            t.lock().unwrap().0 = Some(now_us());
            r.cancelled().await;
            rename(store.url(), &away, s).await;
            t.lock().unwrap().1 = Some(now_us());
        });
        Break {
            asked_us: now_us(),
            times,
            restore,
            task,
        }
    }

    fn broken_since(&self) -> Option<i64> {
        self.times.lock().unwrap().0
    }

    fn restored_at(&self) -> Option<i64> {
        self.times.lock().unwrap().1
    }
}

/// `ALTER SCHEMA from RENAME TO to`, retried while the server restarts.
async fn rename(url: &str, from: &str, to: &str) {
    let started = Instant::now();
    loop {
        let c = connect_within(url, Duration::from_secs(60)).await;
        match c
            .batch_execute(&format!("ALTER SCHEMA {from} RENAME TO {to}"))
            .await
        {
            Ok(()) => return,
            Err(e) if started.elapsed() < Duration::from_secs(60) => {
                eprintln!("chaos: renaming schema {from} to {to} failed, retrying: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("rename schema {from} to {to}: {e}"),
        }
    }
}

/// One scrape of a healer during the break.
struct Scrape {
    /// The broken store's `state` in `/status`.
    state: Option<String>,
    /// `gap_healer_stores{state="failing"}`.
    failing: Option<f64>,
    /// The other stores' states.
    others: Vec<String>,
}

/// What the fleet run adds to the chaos loop.
struct FleetEvents {
    broken: Arc<Postgres>,
    broken_name: String,
    others: Vec<String>,
    break_at: Duration,
    restore_at: Duration,
    brk: Option<Break>,
    next_scrape: Duration,
    scrapes: Vec<Scrape>,
    scrape_errors: u64,
    /// The watermark store, and its watermark.
    wm_store: Arc<Postgres>,
    wm: Watermark,
}

impl FleetEvents {
    async fn scrape(&mut self, healers: &mut Healers) {
        let addrs: Vec<_> = healers.running().filter_map(|i| i.addr()).collect();
        for addr in addrs {
            let status = bin::http_get(addr, "/status").await;
            let metrics = bin::http_get(addr, "/metrics").await;
            let (Ok((_, status)), Ok((_, metrics))) = (status, metrics) else {
                // Killed meanwhile.
                self.scrape_errors += 1;
                continue;
            };
            let Ok(status) = serde_json::from_str::<serde_json::Value>(&status) else {
                self.scrape_errors += 1;
                continue;
            };
            let stores = status["stores"].as_array().cloned().unwrap_or_default();
            let state_of = |name: &str| {
                stores
                    .iter()
                    .find(|s| s["store"] == name)
                    .and_then(|s| s["state"].as_str().map(str::to_string))
            };
            self.scrapes.push(Scrape {
                state: state_of(&self.broken_name),
                failing: bin::metric_in(&metrics, "gap_healer_stores{state=\"failing\"}"),
                others: self.others.iter().filter_map(|n| state_of(n)).collect(),
            });
        }
    }
}

impl Extra for FleetEvents {
    async fn tick(&mut self, at: Duration, healers: &mut Healers) {
        if self.brk.is_none() && at >= self.break_at {
            println!(
                "chaos: breaking store {} (renaming schema {} away) at {:.3} s",
                self.broken_name,
                self.broken.schema,
                at.as_secs_f64()
            );
            self.brk = Some(Break::start(self.broken.clone()));
        }
        if let Some((since, restored, restore)) = self
            .brk
            .as_ref()
            .map(|b| (b.broken_since(), b.restored_at(), b.restore.clone()))
        {
            // Scrape every second from 3 s into the break (the store fails
            // at its first scan, up to a backoff step later) until it ends.
            if let (Some(since), None) = (since, restored) {
                if now_us() - since >= 3_000_000 && at >= self.next_scrape && at < self.restore_at {
                    self.next_scrape = at + Duration::from_secs(1);
                    self.scrape(healers).await;
                }
            }
            if at >= self.restore_at && since.is_some() && !restore.is_cancelled() {
                println!(
                    "chaos: restoring store {} at {:.3} s",
                    self.broken_name,
                    at.as_secs_f64()
                );
                restore.cancel();
            }
        }
        self.wm.sample().await;
    }

    async fn settled(&mut self) -> bool {
        self.wm.sample().await;
        if let Some(brk) = &self.brk {
            brk.restore.cancel();
            if !brk.task.is_finished() {
                return false;
            }
        }
        let (_, head) = self.wm_store.count_and_head().await;
        self.wm.last == Some(head)
    }
}

/// The fleet chaos run; panics with every failure found.
pub async fn run() {
    let engine = Postgres::NAME;
    let (seconds, seed) = seconds_and_seed();
    let cluster = Arc::new(Throwaway::started("chaos-fleet", "trust"));
    let layout = [
        ("orders", "chaos"),
        ("billing", "chaos"),
        ("audit", "chaos"),
        ("tenant", "chaos_b"),
    ];
    cluster.create_database("chaos").await;
    cluster.create_database("chaos_b").await;
    let mut stores = Vec::new();
    for (name, db) in layout {
        stores.push(FleetStore {
            name: name.into(),
            backend: Arc::new(Postgres::in_cluster(cluster.clone(), db).await),
            database: db.into(),
            watermark_table: None,
        });
    }
    // The first store publishes a watermark; the second is broken.
    let wm_table = format!("{}.watermarks", stores[0].backend.schema);
    let wm_store = &stores[0].backend;
    create_watermark_table(
        &wm_store.check().await,
        wm_store.url(),
        &["--schema", &wm_store.schema],
        &wm_table,
    )
    .await;
    stores[0].watermark_table = Some(wm_table.clone());
    let broken = 1;
    println!(
        "chaos fleet on {engine} (cluster port {}): {} stores, {seconds} s, seed {seed} (CHAOS_SEED={seed} replays the random choices)",
        cluster.port,
        stores.len()
    );

    // The healers' config files, one per slot (its application name, and
    // its own leader keys under CHAOS_SPLIT_LEADERS), kept beside the
    // healers' logs (`Healers::save_logs`).
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("chaos-fleet-{}", stores[0].backend.schema));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    for slot in 0..HEALERS {
        let mut toml = "engine = \"postgres\"\n".to_string();
        for s in &stores {
            toml.push_str(&s.entry(slot));
        }
        let path = dir.join(format!("healer-{slot}.toml"));
        std::fs::write(&path, toml).unwrap();
        files.push(path.display().to_string());
    }

    let mut tested: Vec<Tested<Postgres>> = stores
        .iter()
        .enumerate()
        .map(|(k, s)| {
            Tested::start(
                s.backend.clone(),
                Some(s.name.clone()),
                FLEET_WRITERS,
                seed.wrapping_add(k as u64 * 0x1000_0001),
            )
        })
        .collect();
    let mut healers = Healers::start(Box::new(move |slot| {
        (vec!["--config".into(), files[slot].clone()], vec![])
    }));
    let total = Duration::from_secs(seconds);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0xf1ee7);
    let break_at = total.mul_f64(rng.random_range(0.15..0.25));
    let restore_at = (break_at + MIN_BREAK).max(total.mul_f64(0.6));
    let mut events = FleetEvents {
        broken: stores[broken].backend.clone(),
        broken_name: stores[broken].name.clone(),
        others: stores
            .iter()
            .enumerate()
            .filter(|(k, _)| *k != broken)
            .map(|(_, s)| s.name.clone())
            .collect(),
        break_at,
        restore_at,
        brk: None,
        next_scrape: Duration::ZERO,
        scrapes: Vec::new(),
        scrape_errors: 0,
        wm_store: stores[0].backend.clone(),
        wm: Watermark::new(
            stores[0].backend.url(),
            &format!("{}.messages", stores[0].backend.schema),
            "global_position",
            &wm_table,
            &stores[0].name,
        ),
    };
    let server = stores[0].backend.clone();
    let driven = drive(
        &*server,
        &mut tested,
        &mut healers,
        &mut events,
        seconds,
        seed,
    )
    .await;

    // ---- The verdict, store by store, and the fleet's own. ----
    let mut failures = std::mem::take(&mut healers.failures);
    let secs_of = |us: i64| secs(us - driven.t0_us);
    let brk = events.brk.as_ref();
    let (asked, since, restored) = (
        brk.map(|b| b.asked_us),
        brk.and_then(Break::broken_since),
        brk.and_then(Break::restored_at),
    );
    // The broken store's errors are forgiven from when the break was asked
    // for until 2 s after the schema was back.
    let forgive = asked.map(|a| (a, restored.unwrap_or(i64::MAX) + 2_000_000));
    let mut figures = format!(
        "\n=== chaos figures, fleet of {} stores on {engine} ({seconds} s of writes, seed {seed}) ===\n",
        stores.len()
    );
    let mut stalls = Vec::new();
    let mut totals = (0usize, 0usize, 0usize);
    for (k, t) in tested.into_iter().enumerate() {
        let s = &stores[k];
        let judged = judge(
            t,
            &healers,
            &driven,
            driven.heads[k],
            (k == broken).then_some(forgive).flatten(),
        )
        .await;
        let role = match k {
            0 => " (publishes a watermark)",
            k if k == broken => " (broken mid-run)",
            _ => "",
        };
        figures.push_str(&format!(
            "--- store {} (schema {}, database {}){role}\n",
            s.name, s.backend.schema, s.database
        ));
        figures.push_str(&judged.figures);
        if k == broken {
            figures.push_str(&format!(
                "errors forgiven        {} ERROR lines of this store during its break\n",
                judged.forgiven
            ));
        } else if judged.longest_stall.0 > STALL_BOUND {
            failures.push(format!(
                "store {}: its subscriber stalled {:.2?} at position {} (more than {STALL_BOUND:?}): the broken store or the chaos delayed it",
                s.name, judged.longest_stall.0, judged.longest_stall.1
            ));
        }
        stalls.push(format!(
            "{} {:.2?}{}",
            s.name,
            judged.longest_stall.0,
            if k == broken { " (broken)" } else { "" }
        ));
        totals.0 += judged.events;
        totals.1 += judged.tombstones;
        totals.2 += judged.became;
        failures.extend(
            judged
                .failures
                .into_iter()
                .map(|f| format!("store {}: {f}", s.name)),
        );
    }
    // Errors no store logged (the process's own).
    for (i, inst) in healers.instances.iter().enumerate() {
        for e in gap_healer_testkit::logs::errors_outside_stores(&inst.log()) {
            failures.push(format!(
                "healer run {i} logged an error outside any store: {e}"
            ));
        }
    }

    // The break showed, over HTTP, while it lasted.
    let failing_status = events
        .scrapes
        .iter()
        .filter(|s| s.state.as_deref() == Some("failing"))
        .count();
    let failing_metric = events
        .scrapes
        .iter()
        .filter(|s| s.failing.is_some_and(|v| v >= 1.0))
        .count();
    let others_healthy = events
        .scrapes
        .iter()
        .filter(|s| s.others.len() == stores.len() - 1 && s.others.iter().all(|o| o == "healthy"))
        .count();
    match (since, restored) {
        (Some(_), Some(_)) => {}
        _ => failures.push(format!(
            "the store {} was not broken and restored (broken at {since:?}, restored at {restored:?})",
            events.broken_name
        )),
    }
    if failing_status == 0 && failing_metric == 0 {
        failures.push(format!(
            "no scrape during the break showed the store {} failing ({} scrapes, {} failed)",
            events.broken_name,
            events.scrapes.len(),
            events.scrape_errors
        ));
    }

    // The watermark.
    failures.extend(events.wm.failures(driven.heads[0]));
    if driven.restart.is_none() {
        failures.push(format!("{engine} was not restarted"));
    }

    figures.push_str("--- the fleet\n");
    figures.push_str(&format!(
        "all stores             {} events, {} tombstones, {} times a healer became a store's leader; {} healer runs, {} killed with SIGKILL\n",
        totals.0, totals.1, totals.2, healers.instances.len(), healers.kills
    ));
    if let Some((at, took, what)) = &driven.restart {
        figures.push_str(&format!(
            "{engine} restart     at {at:.1} s ({what}); answered again after {took:.1?}\n"
        ));
    }
    figures.push_str(&format!(
        "break                  store {}: asked at {:.1} s, schema renamed away at {:.1} s, back at {:.1} s\n",
        events.broken_name,
        asked.map_or(f64::NAN, secs_of),
        since.map_or(f64::NAN, secs_of),
        restored.map_or(f64::NAN, secs_of),
    ));
    figures.push_str(&format!(
        "scrapes in the break   {} ({} failed); the broken store failing in /status {failing_status}, gap_healer_stores{{state=\"failing\"}} >= 1 in {failing_metric}; every other store healthy in {others_healthy}\n",
        events.scrapes.len(),
        events.scrape_errors
    ));
    figures.push_str(&format!(
        "longest stalls         {} (bound for the healthy stores {STALL_BOUND:?})\n",
        stalls.join(", ")
    ));
    figures.push_str(&events.wm.figures(driven.heads[0]));
    figures.push_str(&format!(
        "wrote for {:.1?}; healed the rest and caught up in {:.1?} after the writers stopped\n",
        driven.wrote_for, driven.settle_took
    ));
    let logs = healers.save_logs(&format!("fleet-{}", stores[0].backend.schema));
    figures.push_str(&format!("healer logs            {}\n", logs.display()));
    let backends: Vec<Arc<Postgres>> = stores.iter().map(|s| s.backend.clone()).collect();
    finish(&format!("fleet-{engine}"), &figures, failures, &backends).await;
}
