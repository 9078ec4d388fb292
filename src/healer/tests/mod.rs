//! The loop's timing rules under a paused clock, against an in-memory
//! model of a store. This is a unit test of scheduling logic only: the
//! database behaviour is proven against real PostgreSQL in tests/.
use super::start::start_floor;
use super::*;
use crate::engine::{
    Checkpoint, DbError, EngineKind, Fence, FillLimits, FillOutcome, Finding, HeadReading,
    OpenTransaction, OpenTransactions, Probe, ScanPage, TransactionReading, WatermarkTable,
};
use crate::gaps::PosRange;
use std::collections::BTreeSet;
use std::sync::Mutex;
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Model {
    committed: BTreeSet<i64>,
    held: BTreeSet<i64>,
    filled: Vec<(PosRange, Instant)>,
    scans: Vec<i64>,
    probes: Vec<(Instant, Vec<PosRange>)>,
    /// The fence each fill was handed.
    fences: Vec<Fence>,
    checkpoints: Vec<Checkpoint>,
    /// Positions a dirty read shows in flight (whatever their key says).
    dirty: BTreeSet<i64>,
    /// Every fill: its ranges and lock timeout.
    attempts: Vec<(Vec<PosRange>, Duration)>,
    /// The published watermark's row.
    watermark: Option<i64>,
    /// Answer [`SharedHeads::shared_head`] (else `NotShared`, as a
    /// store outside the readings), counting the readings.
    shared: bool,
    shared_reads: usize,
    /// What every probe fails with, when set.
    probe_error: Option<DbError>,
    /// The open transactions a reading shows (ids), and the readings taken.
    open: Vec<String>,
    readings: usize,
}

struct Fake(Mutex<Model>);

impl Engine for Fake {
    type Heads = Self;
    type Watermark = Self;
    fn kind(&self) -> EngineKind {
        EngineKind::Postgres
    }
    fn fill_limits(&self) -> FillLimits {
        FillLimits {
            rows: 4_000,
            ranges: 1,
            range_cost: 0,
        }
    }
    async fn identity_floor(&self) -> DbResult<i64> {
        Ok(1)
    }
    async fn head(&self) -> DbResult<Option<i64>> {
        Ok(self.0.lock().unwrap().committed.last().copied())
    }
    async fn first_position(&self) -> DbResult<Option<i64>> {
        Ok(self.0.lock().unwrap().committed.first().copied())
    }
    async fn checkpoints(&self) -> DbResult<Vec<Checkpoint>> {
        Ok(self.0.lock().unwrap().checkpoints.clone())
    }
    async fn scan(&self, after: i64, limit: u32) -> DbResult<ScanPage> {
        let mut m = self.0.lock().unwrap();
        m.scans.push(after);
        let rows: Vec<i64> = m
            .committed
            .range(after + 1..)
            .take(limit as usize)
            .copied()
            .collect();
        let mut prev = after;
        let mut holes = vec![];
        for &p in &rows {
            if let Some(h) = PosRange::new(prev + 1, p - 1) {
                holes.push(h);
            }
            prev = p;
        }
        Ok(ScanPage {
            holes,
            high: prev,
            rows: rows.len() as u64,
        })
    }
    fn shared_heads(&self) -> Option<&Self> {
        Some(self)
    }
    async fn probe(&self, ranges: &[PosRange]) -> DbResult<Probe> {
        let mut m = self.0.lock().unwrap();
        m.probes.push((Instant::now(), ranges.to_vec()));
        if let Some(e) = m.probe_error.clone() {
            return Err(e);
        }
        let committed = ranges
            .iter()
            .flat_map(|r| m.committed.range(r.start()..=r.end()).copied())
            .collect();
        let in_flight = ranges
            .iter()
            .flat_map(|r| m.dirty.range(r.start()..=r.end()).copied())
            .filter(|p| !m.committed.contains(p))
            .collect();
        Ok(Probe {
            committed,
            in_flight,
        })
    }
    async fn open_transactions(&self, _not_before: Instant) -> DbResult<OpenTransactions> {
        let mut m = self.0.lock().unwrap();
        m.readings += 1;
        Ok(OpenTransactions::Read(TransactionReading {
            began: Instant::now(),
            handed_out: None,
            open: m
                .open
                .iter()
                .map(|id| OpenTransaction {
                    id: id.clone(),
                    xid: None,
                    session: None,
                    application: None,
                })
                .collect(),
        }))
    }
    async fn fill_ranges(
        &self,
        ranges: &[PosRange],
        lock_timeout: Duration,
        fence: &Fence,
    ) -> DbResult<FillOutcome> {
        let mut m = self.0.lock().unwrap();
        m.fences.push(fence.clone());
        m.attempts.push((ranges.to_vec(), lock_timeout));
        for range in ranges {
            if m.committed
                .range(range.start()..=range.end())
                .next()
                .is_some()
            {
                return Ok(FillOutcome::Committed);
            }
            if m.held.range(range.start()..=range.end()).next().is_some() {
                return Ok(FillOutcome::Held);
            }
        }
        for range in ranges {
            m.committed.extend(range.start()..=range.end());
            m.filled.push((*range, Instant::now()));
        }
        Ok(FillOutcome::Filled {
            rows: ranges.iter().map(|r| r.width()).sum(),
        })
    }
    async fn preflight(&self) -> DbResult<Vec<Finding>> {
        Ok(vec![])
    }
    fn schema(&self) -> &str {
        "fake"
    }
    fn watermark_table(&self) -> Option<&Self> {
        Some(self)
    }
}

impl SharedHeads for Fake {
    async fn shared_head(&self, _not_before: Instant) -> HeadReading {
        let mut m = self.0.lock().unwrap();
        if !m.shared {
            return HeadReading::NotShared;
        }
        m.shared_reads += 1;
        m.committed
            .last()
            .map_or(HeadReading::Empty, |&h| HeadReading::At(h))
    }
}

impl WatermarkTable for Fake {
    async fn read_watermark(&self, _store: &str) -> DbResult<Option<i64>> {
        Ok(self.0.lock().unwrap().watermark)
    }
    async fn publish_watermark(&self, _store: &str, position: i64) -> DbResult<()> {
        let mut m = self.0.lock().unwrap();
        m.watermark = Some(m.watermark.map_or(position, |w| w.max(position)));
        Ok(())
    }
}

fn opts() -> Options {
    Options {
        store: Default::default(),
        gap_timeout: Duration::from_secs(5),
        poll_interval: Duration::from_millis(250),
        lock_timeout: Duration::from_secs(2),
        scan_page_size: 100,
        start_from: StartFrom::Position(1),
        lookback: 0,
        dry_run: false,
        give_up_after: None,
        publish_watermark: false,
    }
}

fn healer(committed: impl IntoIterator<Item = i64>, o: Options) -> (Arc<Fake>, Healer<Fake>) {
    let fake = Arc::new(Fake(Mutex::new(Model {
        committed: committed.into_iter().collect(),
        ..Default::default()
    })));
    let h = Healer::new(
        fake.clone(),
        o,
        Leader::always(),
        Health::new(Duration::from_millis(250), Duration::from_secs(2)),
    );
    (fake, h)
}

mod fill;
mod scan;
mod start;
