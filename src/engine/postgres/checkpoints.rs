//! One statement reads the checkpoints of every store of a database, instead
//! of two per store (whether the table exists, then its rows) every
//! `checkpoint_refresh`: 500 stores sent 1,000 statements in one burst every
//! 15 s.
//!
//! A store joins the shared readings once its own reading found its
//! checkpoints table and succeeded, and leaves them when a shared reading
//! fails: a table dropped or locked by DDL fails one reading (after
//! [`LOCK_TIMEOUT`] for a lock), every store of it then reads its own
//! once, and those that succeed join again.
//!
//! Architecture invariant: a reading serves only an ask at most
//! [`FRESH`] after it began, so no store's figures are older than one
//! `checkpoint_refresh` plus that.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::SimpleQueryMessage;

use super::conn::Manager;
use super::errors::db_error;
use super::sql::{without_comments, SHARED_CHECKPOINTS};
use crate::engine::pool::Pool;
use crate::engine::{Checkpoint, DbError};
use crate::secret::ConnectionString;

/// How long a reading waits for a table lock before it fails.
const LOCK_TIMEOUT: Duration = Duration::from_millis(200);

/// How long after it began a reading serves the stores that ask.
pub(crate) const FRESH: Duration = Duration::from_secs(5);

/// `sql/postgres/shared_checkpoints.sql` as sent, but for its
/// `__checkpoints__`.
static READING: LazyLock<String> = LazyLock::new(|| {
    without_comments(SHARED_CHECKPOINTS)
        .replace("__lock_timeout_ms__", &LOCK_TIMEOUT.as_millis().to_string())
});

/// The stores of one pool and their last reading.
pub(crate) struct Checkpoints {
    pool: Arc<Pool<Manager>>,
    /// For error messages, free of the password.
    cs: ConnectionString,
    /// Each member's checkpoints table, and whether it is in the readings.
    members: Mutex<HashMap<u64, (String, bool)>>,
    last: tokio::sync::Mutex<Option<Reading>>,
    next_id: AtomicU64,
    readings: AtomicU64,
}

struct Reading {
    began: Instant,
    rows: Result<HashMap<u64, Vec<Checkpoint>>, DbError>,
}

impl Checkpoints {
    pub(crate) fn new(pool: Arc<Pool<Manager>>, cs: ConnectionString) -> Self {
        Checkpoints {
            pool,
            cs,
            members: Mutex::new(HashMap::new()),
            last: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(0),
            readings: AtomicU64::new(0),
        }
    }

    /// Joins a store whose checkpoints table is `table` (a validated,
    /// qualified name); it is read with the others once it read its own.
    pub(crate) fn join(self: &Arc<Self>, table: String) -> Membership {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.members().insert(id, (table, false));
        Membership {
            shared: self.clone(),
            id,
        }
    }

    fn members(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (String, bool)>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One statement for every member in the readings.
    async fn read(&self) -> Result<HashMap<u64, Vec<Checkpoint>>, DbError> {
        let (ids, sql) = {
            let members = self.members();
            let mut ids = Vec::new();
            let mut parts = Vec::new();
            for (id, (table, _)) in members.iter().filter(|(_, (_, shared))| *shared) {
                parts.push(format!(
                    "SELECT {n} AS n, id::text AS id, position::bigint AS position FROM {table}",
                    n = ids.len() + 1
                ));
                ids.push(*id);
            }
            (
                ids,
                READING.replace("__checkpoints__", &parts.join(" UNION ALL ")),
            )
        };
        let mut rows: HashMap<u64, Vec<Checkpoint>> =
            ids.iter().map(|id| (*id, Vec::new())).collect();
        if ids.is_empty() {
            return Ok(rows);
        }
        let conn = self.pool.checkout().await?;
        self.readings.fetch_add(1, Ordering::Relaxed);
        let messages = conn
            .simple_query(&sql)
            .await
            .map_err(|e| db_error(&self.cs, &e, "shared checkpoint reading"))?;
        for message in messages {
            let SimpleQueryMessage::Row(row) = message else {
                continue;
            };
            let n: usize = row
                .try_get("n")
                .ok()
                .flatten()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| unexpected("n"))?;
            let id = ids.get(n.wrapping_sub(1)).ok_or_else(|| unexpected("n"))?;
            let checkpoint = Checkpoint {
                id: row
                    .try_get("id")
                    .ok()
                    .flatten()
                    .ok_or_else(|| unexpected("id"))?
                    .to_string(),
                position: match row
                    .try_get("position")
                    .map_err(|_| unexpected("position"))?
                {
                    None => None,
                    Some(p) => Some(p.parse().map_err(|_| unexpected("position"))?),
                },
            };
            rows.entry(*id).or_default().push(checkpoint);
        }
        for list in rows.values_mut() {
            list.sort_by(|a, b| a.id.cmp(&b.id));
        }
        Ok(rows)
    }
}

fn unexpected(what: &str) -> DbError {
    DbError::transient(format!("shared checkpoint reading: unexpected {what}"))
}

/// A store's place in its pool's shared checkpoint readings; leaves them
/// when dropped.
pub(crate) struct Membership {
    shared: Arc<Checkpoints>,
    id: u64,
}

impl Membership {
    /// The store's own reading found its table and succeeded (`true`: it
    /// is read with the others from now on) or not.
    pub(crate) fn read_alone(&self, ok: bool) {
        if let Some(m) = self.shared.members().get_mut(&self.id) {
            m.1 = ok;
        }
    }

    /// The store's checkpoints from a reading at most [`FRESH`] old, taking
    /// one when there is none; `None` when the store is not in the
    /// readings or the reading failed (it reads its own, and is out of the
    /// readings until that succeeds).
    pub(crate) async fn checkpoints(&self) -> Option<Vec<Checkpoint>> {
        if !self.shared.members().get(&self.id).is_some_and(|m| m.1) {
            return None;
        }
        let mut last = self.shared.last.lock().await;
        let stale = last
            .as_ref()
            .is_none_or(|r| r.began.elapsed() >= FRESH || !r.serves(self.id));
        if stale {
            let began = Instant::now();
            let rows = self.shared.read().await;
            *last = Some(Reading { began, rows });
        }
        let reading = last.as_ref()?;
        match &reading.rows {
            Ok(rows) => rows.get(&self.id).cloned(),
            Err(_) => {
                self.read_alone(false);
                None
            }
        }
    }

    /// Readings the store's pool has sent (for tests and diagnostics).
    pub(crate) fn readings(&self) -> u64 {
        self.shared.readings.load(Ordering::Relaxed)
    }
}

impl Reading {
    /// Whether the reading holds `id` (it joined after the reading began:
    /// not yet) or failed (every store then reads its own).
    fn serves(&self, id: u64) -> bool {
        self.rows
            .as_ref()
            .map_or(true, |rows| rows.contains_key(&id))
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.shared.members().remove(&self.id);
    }
}
