//! Cleanup that must run when a test's store goes out of scope, also when
//! the test fails or panics: the stores' guards ([`crate::pg::Guard`],
//! [`crate::mssql::TestDb`]) call [`run_to_end`] from their `Drop`.

use std::future::Future;

/// Runs `cleanup` to its end on a thread of its own, with a current-thread
/// runtime of its own, and waits for it. A `Drop` cannot await, and the
/// test's runtime may be a current-thread one that this very drop blocks, so
/// the cleanup must not need it. A cleanup that fails or panics is reported
/// on stderr as what was left behind, never as a panic: a panic in a drop
/// that runs while a failing test unwinds would abort the whole test binary.
pub(crate) fn run_to_end<F, Fut>(what: &str, cleanup: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>>,
{
    let thread = std::thread::Builder::new()
        .name("test-store-cleanup".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("no runtime for the cleanup: {e}"))?;
            runtime.block_on(cleanup())
        });
    let outcome = match thread {
        Err(e) => Err(format!("no thread for the cleanup: {e}")),
        Ok(thread) => thread
            .join()
            .unwrap_or_else(|_| Err("the cleanup panicked".into())),
    };
    if let Err(e) = outcome {
        eprintln!("left behind: {what}: {e}");
    }
}
