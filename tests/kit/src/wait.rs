//! Waiting for something to hold, and retrying something until it works (a
//! server that is starting or restarting).

use std::future::Future;
use std::time::{Duration, Instant};

/// Checks `cond` every 50 ms until it holds (true) or `limit` has passed
/// (false).
pub async fn until<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if cond().await {
            return true;
        }
        if started.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Calls `attempt` every `every` until it succeeds; its last error once
/// `limit` has passed.
pub async fn retry<C, E, F, Fut>(limit: Duration, every: Duration, mut attempt: F) -> Result<C, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<C, E>>,
{
    let started = Instant::now();
    loop {
        match attempt().await {
            Ok(c) => return Ok(c),
            Err(e) if started.elapsed() > limit => return Err(e),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// Calls `connect` every 100 ms (the server may be restarting) until it
/// succeeds; panics with its last error after `limit`.
pub async fn connect_retrying<C, F, Fut>(what: &str, limit: Duration, connect: F) -> C
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<C, String>>,
{
    retry(limit, Duration::from_millis(100), connect)
        .await
        .unwrap_or_else(|e| panic!("{what} did not answer within {limit:?}: {e}"))
}

/// Checks `cond` every 20 ms while less than `limit` has passed since
/// `since`: how long after `since` it held, if it did.
pub async fn time_until<F, Fut>(since: Instant, limit: Duration, mut cond: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    while since.elapsed() < limit {
        if cond().await {
            return Some(since.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}
