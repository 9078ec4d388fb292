//! The connection pool both engines use: bb8, plus what bb8 leaves out.
//!
//! bb8 reports a failed connection attempt only to its error sink and keeps
//! the caller waiting for the whole connection timeout, even when the server
//! refused the login at once. [`Pool::checkout`] listens to the sink, so a
//! refused connection fails the caller at once with the server's reason, and
//! a timeout says what the last attempt met.
//!
//! Architecture invariant: every pooled session a caller gets comes from
//! [`Pool::checkout`]; engines never call bb8's `get` themselves.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use bb8::{ManageConnection, PooledConnection, RunError};

use super::DbError;

/// Most sessions one engine holds in its pool: a fill, a scan and a probe at
/// once, and one spare.
pub const MAX_POOLED_SESSIONS: u32 = 4;

/// Most sessions a pool shared by many stores of one database holds: 500
/// stores (schemas) in one database need these, not 500 times
/// [`MAX_POOLED_SESSIONS`].
pub const MAX_SHARED_SESSIONS: u32 = 16;

/// The last error of a background connection attempt, and a wake-up for
/// whoever waits for a connection.
#[derive(Clone, Default)]
pub struct LastError {
    slot: Arc<Mutex<Option<DbError>>>,
    failed: Arc<tokio::sync::Notify>,
}

impl LastError {
    pub fn get(&self) -> Option<DbError> {
        self.slot.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Forgets the last failure (a connection attempt succeeded).
    pub fn clear(&self) {
        if let Ok(mut slot) = self.slot.lock() {
            *slot = None;
        }
    }
}

impl fmt::Debug for LastError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LastError").field(&self.get()).finish()
    }
}

impl bb8::ErrorSink<DbError> for LastError {
    fn sink(&self, error: DbError) {
        tracing::debug!(error = %error.message, "connection attempt failed");
        if let Ok(mut slot) = self.slot.lock() {
            *slot = Some(error);
        }
        self.failed.notify_waiters();
    }

    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<DbError>> {
        Box::new(self.clone())
    }
}

/// A bb8 pool of sessions whose manager reports [`DbError`]s.
pub struct Pool<M: ManageConnection<Error = DbError>> {
    /// Built on first use: bb8 spawns its reaper on the runtime, so building
    /// must happen inside one, and every caller of `checkout` is async.
    inner: OnceLock<bb8::Pool<M>>,
    manager: Mutex<Option<M>>,
    /// Read when the pool is built (first checkout); [`Shared`] grows it
    /// for each store that shares the pool before that.
    max_size: AtomicU32,
    last: LastError,
    connect_timeout: Duration,
    /// The server and where it is, for messages: "PostgreSQL at db:5432".
    server: String,
}

impl<M: ManageConnection<Error = DbError>> fmt::Debug for Pool<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("last", &self.last)
            .field("connect_timeout", &self.connect_timeout)
            .field("server", &self.server)
            .finish()
    }
}

impl<M: ManageConnection<Error = DbError>> Pool<M> {
    /// A lazy pool: nothing connects (nor is spawned) until the first
    /// checkout, so a daemon started while the database is down comes up and
    /// retries.
    /// `server`: what it connects to and where, for messages ("PostgreSQL
    /// at db:5432"): a connection attempt that never answers (a dropped
    /// SYN, a listener that says nothing) leaves no error of its own.
    pub fn new(
        server: impl Into<String>,
        manager: M,
        max_size: u32,
        connect_timeout: Duration,
    ) -> Self {
        let server = server.into();
        Pool {
            inner: OnceLock::new(),
            manager: Mutex::new(Some(manager)),
            max_size: AtomicU32::new(max_size),
            last: LastError::default(),
            connect_timeout,
            server,
        }
    }

    fn inner(&self) -> Result<&bb8::Pool<M>, DbError> {
        if let Some(pool) = self.inner.get() {
            return Ok(pool);
        }
        let manager = self.manager.lock().ok().and_then(|mut m| m.take());
        if let Some(manager) = manager {
            // LIFO: the session used last is used next, so one warm session
            // serves a store's loop and the others idle out. A server
            // compiles a statement once per session and text (Babelfish:
            // 1.6-2.7 s for the fill batch, 0.3 s for a small one, the first
            // time in a session; 22-31 ms and 2 ms after, measured), and
            // FIFO handed every statement to every session in turn.
            let pool = bb8::Pool::builder()
                .queue_strategy(bb8::QueueStrategy::Lifo)
                .max_size(self.max_size.load(Ordering::Relaxed).max(1))
                .min_idle(Some(0))
                .connection_timeout(self.connect_timeout)
                .retry_connection(false)
                .error_sink(Box::new(self.last.clone()))
                .build_unchecked(manager);
            // A concurrent first checkout may have built it: keep one.
            let _ = self.inner.set(pool);
        }
        self.inner
            .get()
            .ok_or_else(|| DbError::transient("the connection pool is being built"))
    }

    /// Most sessions, once built.
    pub fn max_size(&self) -> u32 {
        self.max_size.load(Ordering::Relaxed)
    }

    /// A pooled session, or the reason there is none: the server's own
    /// error as soon as an attempt fails, else a timeout after
    /// `connect_timeout` naming the last failure seen.
    pub async fn checkout(&self) -> Result<PooledConnection<'_, M>, DbError> {
        // Listening before asking, so a connection refused at once is heard.
        let failed = self.last.failed.notified();
        tokio::pin!(failed);
        failed.as_mut().enable();
        let inner = self.inner()?;
        let got = tokio::select! {
            got = inner.get() => got,
            _ = &mut failed => return Err(self.failed()),
        };
        match got {
            Ok(session) => {
                self.last.clear();
                Ok(session)
            }
            Err(RunError::User(e)) => Err(e),
            Err(RunError::TimedOut) => Err(self.timed_out()),
        }
    }

    /// The failed attempt's own error: the managers' connect errors say
    /// which server and where (`cannot connect to PostgreSQL at db:5432:
    /// ...`), so a prefix here would say it twice.
    fn failed(&self) -> DbError {
        match self.last.get() {
            Some(last) => last,
            None => DbError::transient(format!("the connection to {} failed", self.server)),
        }
    }

    fn timed_out(&self) -> DbError {
        let waited = humantime::format_duration(self.connect_timeout);
        match self.last.get() {
            // The last failure names the server and where already.
            Some(last) => DbError {
                message: format!("no connection within {waited}: {}", last.message),
                ..last
            },
            None => DbError::transient(format!("no connection to {} within {waited}", self.server)),
        }
    }
}

/// Things shared by the stores of one database, by key: stores whose
/// connection strings (and connect timeouts) are the same get the same
/// pool ([`Pool::shared`]) and, on PostgreSQL, the same head readings. Held
/// weakly: a value goes when its last store does.
pub struct Shared<T> {
    items: Mutex<HashMap<String, Weak<T>>>,
}

impl<T> Default for Shared<T> {
    fn default() -> Self {
        Shared {
            items: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Shared<T> {
    /// The value for `key`, made by `make` for the first store that asks;
    /// `joined` is told of each later store that gets it.
    pub fn get(&self, key: &str, make: impl FnOnce() -> T, joined: impl FnOnce(&T)) -> Arc<T> {
        let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        items.retain(|_, item| item.strong_count() > 0);
        if let Some(item) = items.get(key).and_then(Weak::upgrade) {
            joined(&item);
            return item;
        }
        let item = Arc::new(make());
        items.insert(key.to_string(), Arc::downgrade(&item));
        item
    }

    /// Distinct values alive now.
    pub fn len(&self) -> usize {
        let items = self.items.lock().unwrap_or_else(|e| e.into_inner());
        items.values().filter(|i| i.strong_count() > 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<M: ManageConnection<Error = DbError>> Pool<M> {
    /// The pool stores of one database share: made by `make` for the first
    /// store, grown by one session per later store from
    /// [`MAX_POOLED_SESSIONS`] up to [`MAX_SHARED_SESSIONS`] while it has
    /// not connected yet.
    pub fn shared(pools: &Shared<Self>, key: &str, make: impl FnOnce() -> Self) -> Arc<Self> {
        pools.get(key, make, |pool| {
            let _ = pool
                .max_size
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some((n + 1).min(MAX_SHARED_SESSIONS))
                });
        })
    }
}
