//! What every shared reading of the engines has in common: stores join it
//! with what the reading needs of each (`K`: a head expression, a table),
//! are read with the others only while they say so (their own statement
//! last succeeded), and take their value (`V`) from the last reading when
//! the caller's rule lets it serve, or else from a new reading of every
//! member in it. How a reading is sent, and when one may serve, are the
//! engine's: PostgreSQL's heads and checkpoints (`postgres/heads.rs`,
//! `postgres/checkpoints.rs`), SQL Server's heads and checkpoints by
//! three-part names (`mssql/heads.rs`, `mssql/checkpoints.rs`).
//!
//! Architecture invariants:
//! - A store is in a reading only while it is shared ([`Member::share`]),
//!   so a store whose table is gone, refused or locked fails or waits on
//!   its own.
//! - A reading that failed answers every store that takes it with its
//!   error, so each falls back to its own statement; none gets a value
//!   the reading did not read.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::DbError;

/// The members of one shared reading and its last result.
pub(crate) struct Readings<K, V> {
    /// Each member's part, and whether it is in the readings.
    members: Mutex<HashMap<u64, (K, bool)>>,
    last: tokio::sync::Mutex<Option<Reading<V>>>,
    next_id: AtomicU64,
    /// Statements sent for readings (tests, diagnostics).
    sent: AtomicU64,
}

/// One reading: when it began, and each member's value or why there is
/// none.
pub(crate) struct Reading<V> {
    pub began: Instant,
    pub values: Result<HashMap<u64, V>, DbError>,
}

impl<K: Clone, V: Clone> Default for Readings<K, V> {
    fn default() -> Self {
        Readings {
            members: Mutex::new(HashMap::new()),
            last: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(0),
            sent: AtomicU64::new(0),
        }
    }
}

impl<K: Clone, V: Clone> Readings<K, V> {
    /// Joins a member whose part of a reading is `part`; it is read with
    /// the others once it is shared.
    pub(crate) fn join(self: &Arc<Self>, part: K) -> Member<K, V> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.members().insert(id, (part, false));
        Member {
            readings: self.clone(),
            id,
        }
    }

    fn members(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (K, bool)>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one statement sent for a reading.
    pub(crate) fn sent_one(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }
}

/// A store's place in a shared reading; leaves it when dropped.
pub(crate) struct Member<K: Clone, V: Clone> {
    readings: Arc<Readings<K, V>>,
    id: u64,
}

impl<K: Clone, V: Clone> Member<K, V> {
    /// Whether the store is read with the others from now on (its own
    /// statement succeeded) or not (it failed, or runs).
    pub(crate) fn share(&self, shared: bool) {
        if let Some(m) = self.readings.members().get_mut(&self.id) {
            m.1 = shared;
        }
    }

    pub(crate) fn is_shared(&self) -> bool {
        self.readings.members().get(&self.id).is_some_and(|m| m.1)
    }

    /// Statements sent for the readings this store is a member of.
    pub(crate) fn sent(&self) -> u64 {
        self.readings.sent.load(Ordering::Relaxed)
    }

    /// The store's value from the last reading when `serves` lets it serve
    /// and it holds the store (or failed); else from a new reading of every
    /// shared member, taken by `read` (the members' ids and parts). `None`
    /// when the store is not shared, or the reading did not hold it.
    pub(crate) async fn value<F, Fut>(
        &self,
        serves: impl Fn(&Reading<V>) -> bool,
        read: F,
    ) -> Option<Result<V, DbError>>
    where
        F: FnOnce(Vec<(u64, K)>) -> Fut,
        Fut: Future<Output = Result<HashMap<u64, V>, DbError>>,
    {
        if !self.is_shared() {
            return None;
        }
        let mut last = self.readings.last.lock().await;
        if let Some(found) = last
            .as_ref()
            .filter(|r| serves(r))
            .and_then(|r| self.from(r))
        {
            return Some(found);
        }
        let members: Vec<(u64, K)> = self
            .readings
            .members()
            .iter()
            .filter(|(_, (_, shared))| *shared)
            .map(|(id, (part, _))| (*id, part.clone()))
            .collect();
        let began = Instant::now();
        let values = read(members).await;
        let reading = Reading { began, values };
        let found = self.from(&reading);
        *last = Some(reading);
        found
    }

    /// The store's value from a reading at most `fresh` old, taking one
    /// by `read` when there is none (as [`Member::value`]). A failed
    /// reading takes the store out of the readings, so it reads its own
    /// until that succeeds: `None` then, as when the store is not shared.
    pub(crate) async fn value_within<F, Fut>(&self, fresh: Duration, read: F) -> Option<V>
    where
        F: FnOnce(Vec<(u64, K)>) -> Fut,
        Fut: Future<Output = Result<HashMap<u64, V>, DbError>>,
    {
        match self.value(|r| r.began.elapsed() < fresh, read).await? {
            Ok(value) => Some(value),
            Err(_) => {
                self.share(false);
                None
            }
        }
    }

    /// What `reading` says of the store: its value, the reading's error,
    /// or `None` when it does not hold the store.
    fn from(&self, reading: &Reading<V>) -> Option<Result<V, DbError>> {
        match &reading.values {
            Ok(values) => values.get(&self.id).cloned().map(Ok),
            Err(e) => Some(Err(e.clone())),
        }
    }
}

impl<K: Clone, V: Clone> Drop for Member<K, V> {
    fn drop(&mut self) {
        self.readings.members().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reading_serves_while_it_may_and_holds_only_shared_members() {
        let readings: Arc<Readings<String, i64>> = Arc::default();
        let (a, b) = (readings.join("a".into()), readings.join("bb".into()));
        let read = |members: Vec<(u64, String)>| async move {
            Ok(members
                .into_iter()
                .map(|(id, p)| (id, p.len() as i64))
                .collect())
        };
        assert!(a.value(|_| true, read).await.is_none(), "not shared yet");
        a.share(true);
        assert_eq!(a.value(|_| true, read).await.unwrap().unwrap(), 1);
        b.share(true);
        // b was shared after that reading: a new one, which serves both.
        assert_eq!(b.value(|_| true, read).await.unwrap().unwrap(), 2);
        assert_eq!(readings.sent.load(Ordering::Relaxed), 0,);
        let failed = |_: Vec<(u64, String)>| async { Err(DbError::transient("gone")) };
        assert!(a.value(|_| false, failed).await.unwrap().is_err());
        assert!(
            b.value(|_| true, read).await.unwrap().is_err(),
            "a failed reading answers every store with its error"
        );
        drop(a);
        assert_eq!(readings.members().len(), 1);
    }

    /// Checkpoints' rule: a reading serves while it is fresh, and one that
    /// failed takes the store out until its own reading succeeds.
    #[tokio::test(start_paused = true)]
    async fn a_fresh_reading_serves_and_a_failed_one_unshares_the_store() {
        let readings: Arc<Readings<String, i64>> = Arc::default();
        let a = readings.join("a".into());
        a.share(true);
        let fresh = Duration::from_secs(5);
        let read = |members: Vec<(u64, String)>| async move {
            Ok(members.into_iter().map(|(id, _)| (id, 7)).collect())
        };
        let failed = |_: Vec<(u64, String)>| async { Err(DbError::transient("gone")) };
        assert_eq!(a.value_within(fresh, read).await, Some(7));
        assert_eq!(a.value_within(fresh, failed).await, Some(7), "still fresh");
        tokio::time::sleep(fresh).await;
        assert_eq!(a.value_within(fresh, failed).await, None);
        assert!(!a.is_shared(), "a failed reading unshares the store");
        assert_eq!(a.value_within(fresh, read).await, None);
    }
}
