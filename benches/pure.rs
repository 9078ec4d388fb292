//! Criterion benchmarks of the pure parts: hole tracking (`gaps::Tracker`)
//! and fill planning (`plan::pieces`) with a million tracked positions in
//! several range shapes, plus the memory a tracker holds (measured with a
//! counting allocator), which is bounded by ranges, not positions.
//!
//! ```text
//! cargo bench --bench pure              # all; prints a table, writes docs/benchmarks.md's pure section
//! cargo bench --bench pure -- observe   # a filter, as criterion takes it (writes nothing)
//! ```
//! Under `cargo test --all-targets` (no `--bench`) criterion runs each
//! benchmark once on 10,000 positions instead of 1,000,000.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput};
use gap_healer::gaps::{Hole, PosRange, Tracker};
use gap_healer::plan;
use gap_healer_testkit::thousands;
use tokio::time::Instant;

/// Counts live heap bytes, so a tracker's footprint is measured, not guessed.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        System.dealloc(p, layout);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let q = System.realloc(p, layout, new_size);
        if !q.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const GAP_TIMEOUT: Duration = Duration::from_secs(5);
const BEGIN: &str = "<!-- pure:begin -->";
const END: &str = "<!-- pure:end -->";

/// `count` holes of `width` positions, one committed position between two.
#[derive(Clone, Copy)]
struct Shape {
    count: i64,
    width: i64,
}

impl Shape {
    fn id(&self) -> String {
        format!("{}x{}", self.count, self.width)
    }
    fn ranges(&self) -> Vec<PosRange> {
        (0..self.count)
            .map(|i| {
                let start = 1 + i * (self.width + 1);
                PosRange::new(start, start + self.width - 1).expect("a width of one or more")
            })
            .collect()
    }
    fn tracker(&self, now: Instant) -> Tracker {
        let mut t = Tracker::new();
        for r in self.ranges() {
            t.observe(r, now, GAP_TIMEOUT);
        }
        t
    }
}

/// Full runs under `cargo bench`; one quick pass under `cargo test`.
fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn positions() -> i64 {
    if bench_mode() {
        1_000_000
    } else {
        10_000
    }
}

fn shapes() -> Vec<Shape> {
    let total = positions();
    [total, 1_000, 10, 1]
        .into_iter()
        .map(|width| Shape {
            count: total / width,
            width,
        })
        .collect()
}

fn tracker_benches(c: &mut Criterion) {
    let now = Instant::now();
    let mut g = c.benchmark_group("tracker");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for shape in shapes() {
        let ranges = shape.ranges();
        g.throughput(Throughput::Elements(shape.count as u64));
        // A scan reporting every hole of the shape to an empty tracker.
        g.bench_with_input(
            BenchmarkId::new("observe", shape.id()),
            &ranges,
            |b, ranges| {
                b.iter_batched(
                    Tracker::new,
                    |mut t| {
                        for r in ranges {
                            t.observe(*r, now, GAP_TIMEOUT);
                        }
                        t
                    },
                    BatchSize::PerIteration,
                )
            },
        );
        let mut full = shape.tracker(now);
        // What every loop turn computes whatever the holes' age: the ranges
        // to probe, the published stats, the next wake-up.
        g.bench_function(BenchmarkId::new("per_poll", shape.id()), |b| {
            b.iter(|| {
                black_box(full.ranges());
                black_box(full.stats());
                black_box(full.next_due())
            })
        });
        // A fill cycle: every hole is due.
        g.bench_function(BenchmarkId::new("due", shape.id()), |b| {
            b.iter(|| black_box(full.due(now + GAP_TIMEOUT)))
        });
        // A probe found 1,000 positions committed (spread over the tracker):
        // remove them, then report them missing again, so the state repeats.
        let step = (shape.count * shape.width / 1_000).max(1);
        let committed: Vec<i64> = ranges
            .iter()
            .flat_map(|r| r.start()..=r.end())
            .step_by(step as usize)
            .take(1_000)
            .collect();
        g.throughput(Throughput::Elements(committed.len() as u64));
        g.bench_function(
            BenchmarkId::new("remove_1000_then_observe", shape.id()),
            |b| {
                b.iter(|| {
                    full.remove_positions(&committed);
                    for p in &committed {
                        full.observe(PosRange::single(*p), now, GAP_TIMEOUT);
                    }
                })
            },
        );
    }
    g.finish();
}

fn plan_benches(c: &mut Criterion) {
    let total = positions();
    let range = PosRange::new(1, total).expect("positions from 1");
    let mut g = c.benchmark_group("plan");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(total as u64));
    for excluded in excluded_counts() {
        let step = if excluded == 0 { 1 } else { total / excluded };
        let held: Vec<i64> = (0..excluded).map(|i| 1 + i * step).collect();
        g.bench_with_input(
            BenchmarkId::new("pieces_20000", format!("{excluded}_excluded")),
            &held,
            |b, held| b.iter(|| black_box(plan::pieces(range, held, 20_000))),
        );
    }
    // Scattered one-position holes grouped into fill transactions, with the
    // PostgreSQL engine's limits (20,000 rows, 1,000 ranges per statement).
    let singles = single_pieces();
    g.throughput(Throughput::Elements(singles.len() as u64));
    g.bench_with_input(
        BenchmarkId::new("batches_20000_1000", format!("{}_pieces", singles.len())),
        &singles,
        |b, singles| {
            b.iter(|| {
                black_box(plan::batches(
                    singles,
                    gap_healer::gaps::FillLimits {
                        rows: 20_000,
                        ranges: 1_000,
                        range_cost: 0,
                    },
                ))
            })
        },
    );
    g.finish();
}

/// Positions held out of the planned range: none, 0.1 % and 10 %.
fn excluded_counts() -> Vec<i64> {
    let total = positions();
    vec![0, total / 1_000, total / 10]
}

/// Every other position of the first `positions()` as its own piece.
fn single_pieces() -> Vec<PosRange> {
    (1..=positions()).step_by(2).map(PosRange::single).collect()
}

/// Heap bytes a tracker of each shape holds.
fn memory() -> Vec<(Shape, usize)> {
    let now = Instant::now();
    shapes()
        .into_iter()
        .map(|shape| {
            let before = LIVE.load(Ordering::Relaxed);
            let t = shape.tracker(now);
            let bytes = LIVE.load(Ordering::Relaxed).saturating_sub(before);
            assert_eq!(t.len() as i64, shape.count);
            drop(t);
            (shape, bytes)
        })
        .collect()
}

fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join("criterion")
}

/// Criterion's median estimate for one benchmark, in nanoseconds.
fn median_ns(group: &str, function: &str, param: &str) -> Option<f64> {
    let path = criterion_dir()
        .join(group)
        .join(function)
        .join(param)
        .join("new/estimates.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    json["median"]["point_estimate"].as_f64()
}

fn human(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn table(mem: &[(Shape, usize)]) -> String {
    let mut out = format!(
        "`size_of::<Hole>()` = {} bytes (range {} + first_seen + not_before + retries), kept in a \
         `BTreeMap<i64, Hole>`: one entry per range. Heap measured with a counting allocator; \
         times are criterion medians (`cargo bench --bench pure`).\n\n\
         | {} positions as | tracker heap | bytes per range | observe all (per range) | per poll: ranges + stats + next_due | due (all) | remove 1,000 + observe back |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        std::mem::size_of::<Hole>(),
        std::mem::size_of::<PosRange>(),
        thousands(positions() as u64)
    );
    let t = |f: &str, id: &str| median_ns("tracker", f, id).map_or("-".into(), human);
    for (shape, bytes) in mem {
        let id = shape.id();
        let per_range = median_ns("tracker", "observe", &id)
            .map_or("-".into(), |ns| human(ns / shape.count as f64));
        out.push_str(&format!(
            "| {} range{} of {} | {} | {:.0} | {} ({per_range}) | {} | {} | {} |\n",
            thousands(shape.count as u64),
            if shape.count == 1 { "" } else { "s" },
            thousands(shape.width as u64),
            if *bytes >= 1 << 20 {
                format!("{:.1} MB", *bytes as f64 / 1048576.0)
            } else {
                format!("{:.1} KB", *bytes as f64 / 1024.0)
            },
            *bytes as f64 / shape.count as f64,
            t("observe", &id),
            t("per_poll", &id),
            t("due", &id),
            t("remove_1000_then_observe", &id),
        ));
    }
    out.push_str(&format!(
        "\n`plan::pieces` of one {}-position range in pieces of at most 20,000: ",
        thousands(positions() as u64)
    ));
    let parts: Vec<String> = excluded_counts()
        .iter()
        .map(|e| {
            let ns = median_ns("plan", "pieces_20000", &format!("{e}_excluded"));
            format!(
                "{} with {} positions excluded",
                ns.map_or("-".into(), human),
                thousands(*e as u64),
            )
        })
        .collect();
    out.push_str(&parts.join(", "));
    let n = single_pieces().len();
    let ns = median_ns("plan", "batches_20000_1000", &format!("{n}_pieces"));
    out.push_str(&format!(
        ". `plan::batches` of {} one-position pieces into transactions of at most 1,000 ranges: {}.\n",
        thousands(n as u64),
        ns.map_or("-".into(), human)
    ));
    out
}

fn write_docs(text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/benchmarks.md");
    let Ok(old) = std::fs::read_to_string(&path) else {
        return;
    };
    if let (Some(b), Some(e)) = (old.find(BEGIN), old.find(END)) {
        if b < e {
            let new = format!("{}{BEGIN}\n{text}{END}{}", &old[..b], &old[e + END.len()..]);
            if let Err(err) = std::fs::write(&path, new) {
                eprintln!("writing {}: {err}", path.display());
            } else {
                println!("written to {}", path.display());
            }
        }
    }
}

fn main() {
    let mem = memory();
    let mut c = Criterion::default().configure_from_args();
    tracker_benches(&mut c);
    plan_benches(&mut c);
    c.final_summary();
    let text = table(&mem);
    println!("\n{text}");
    // A filter (any argument that is not a flag) runs some benchmarks only:
    // then the table mixes old and new figures, so it is not written.
    let filtered = std::env::args().skip(1).any(|a| !a.starts_with('-'));
    if bench_mode() && !filtered {
        write_docs(&text);
    }
}
