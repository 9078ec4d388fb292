//! Idle poll cost as the table grows: the harness's idle-poll section alone
//! (see benches/harness.rs and docs/benchmarks.md), kept so the README's
//! command still works.
//!
//! ```text
//! cargo bench --bench idle_poll                    # 100k and 1M rows
//! BENCH_ROWS=100000,1000000,10000000 cargo bench --bench idle_poll
//! ```
//!
//! A benchmark prints figures; it asserts nothing about time.

#[path = "harness/idle.rs"]
mod idle;
#[path = "harness/support.rs"]
mod support;

use std::process::ExitCode;

fn main() -> ExitCode {
    if !std::env::args().any(|a| a == "--bench") {
        println!("idle_poll: not started by `cargo bench`; run `cargo bench --bench idle_poll`");
        return ExitCode::SUCCESS;
    }
    let sizes: Vec<i64> = match std::env::var("BENCH_ROWS")
        .unwrap_or_else(|_| "100000,1000000".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect()
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("BENCH_ROWS: comma-separated row counts: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut report = support::Report::default();
    match runtime.block_on(idle::run(&sizes, 500, &mut report)) {
        Ok(()) => {
            for [what, figure, target, verdict] in &report.summary {
                println!("{what}: {figure} (target {target}) {verdict}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("idle_poll: {e:#}");
            ExitCode::FAILURE
        }
    }
}
