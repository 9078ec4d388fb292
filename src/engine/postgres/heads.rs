//! One statement reads the head of every store of a database that polls at
//! the same moment, instead of one scan per store.
//!
//! A daemon with 500 stores (schemas) in one database at a 1 s poll sent 500
//! scans a second while nothing happened; the round trips (system calls and
//! wake-ups, not the queries) cost it 8-9 % of a core. The healer's polls
//! fall on one grid ([`crate::healer`]), so the stores of a database ask for
//! their heads together: the first asks the server for all of them
//! (`SELECT ARRAY[(SELECT MAX(position) FROM a), ...]`), the others take that
//! reading. A store scans itself only when its head has moved past what it
//! examined, or when it tracks holes (they need the probe).
//!
//! A reading waits at most [`LOCK_TIMEOUT`] for a table lock: DDL holding
//! one store's table fails the reading (every store scans on its own for
//! that poll), and the held store, whose own scan is then in flight, is left
//! out of the readings until that scan ends.
//!
//! Architecture invariants:
//! - A reading is used only by a poll due no later than the reading began,
//!   so it shows every row committed before the poll was due: using it is a
//!   poll at that moment.
//! - A store is in a reading only after its own scan last succeeded, and
//!   not while one runs: a store whose table is gone, refused or locked
//!   fails or waits on its own, and a reading that failed sends every store
//!   of it back to its own scan for that poll.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::SimpleQueryMessage;

use super::conn::Manager;
use super::errors::db_error;
use super::sql::{without_comments, SHARED_HEADS};
use crate::engine::pool::Pool;
use crate::engine::{DbError, HeadReading};
use crate::secret::ConnectionString;

/// How long a reading waits for a table lock (DDL on one store's table)
/// before it fails and every store of it scans on its own.
const LOCK_TIMEOUT: Duration = Duration::from_millis(200);

/// The stores of one pool and their last reading.
pub(crate) struct Heads {
    pool: Arc<Pool<Manager>>,
    /// For error messages, free of the password.
    cs: ConnectionString,
    members: Mutex<HashMap<u64, Member>>,
    /// Held while a reading is taken: the stores that ask meanwhile wait
    /// for it instead of sending their own.
    last: tokio::sync::Mutex<Option<Reading>>,
    next_id: AtomicU64,
    /// Readings sent to the server.
    readings: AtomicU64,
}

struct Member {
    /// `(SELECT MAX(position) FROM table)`, validated names spliced in.
    head: String,
    /// Its own scan last succeeded.
    scans: bool,
}

struct Reading {
    began: Instant,
    /// Each member's head (`None`: an empty table), or why there is none.
    heads: Result<HashMap<u64, Option<i64>>, DbError>,
}

/// `sql/postgres/shared_heads.sql` as sent, but for its `__heads__`.
static READING: LazyLock<String> = LazyLock::new(|| {
    without_comments(SHARED_HEADS)
        .replace("__lock_timeout_ms__", &LOCK_TIMEOUT.as_millis().to_string())
});

impl Heads {
    /// The readings of the stores of `pool` (one database and login);
    /// `cs` names it in errors.
    pub(crate) fn new(pool: Arc<Pool<Manager>>, cs: ConnectionString) -> Self {
        Heads {
            pool,
            cs,
            members: Mutex::new(HashMap::new()),
            last: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(0),
            readings: AtomicU64::new(0),
        }
    }

    /// Joins a store whose head is `head_sql` (`sql/postgres/shared_head.sql`
    /// as [`super::sql::statement`] renders it).
    pub(crate) fn join(self: &Arc<Self>, head_sql: String) -> Membership {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.members().insert(
            id,
            Member {
                head: head_sql,
                scans: false,
            },
        );
        Membership {
            heads: self.clone(),
            id,
        }
    }

    fn members(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Member>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One statement for every member whose own scan last succeeded.
    async fn read(&self) -> Result<HashMap<u64, Option<i64>>, DbError> {
        let (ids, sql) = {
            let members = self.members();
            let mut ids = Vec::new();
            let mut heads = Vec::new();
            for (id, m) in members.iter().filter(|(_, m)| m.scans) {
                ids.push(*id);
                heads.push(m.head.as_str());
            }
            (ids, READING.replace("__heads__", &heads.join(", ")))
        };
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let conn = self.pool.checkout().await?;
        self.readings.fetch_add(1, Ordering::Relaxed);
        let messages = conn
            .simple_query(&sql)
            .await
            .map_err(|e| db_error(&self.cs, &e, "shared head reading"))?;
        let mut heads = HashMap::with_capacity(ids.len());
        for message in messages {
            let SimpleQueryMessage::Row(row) = message else {
                continue;
            };
            let column = |name: &str| row.try_get(name).map_err(|_| unexpected(name));
            let n: usize = parse(column("n")?)?.ok_or_else(|| unexpected("n"))?;
            let id = *ids.get(n.wrapping_sub(1)).ok_or_else(|| unexpected("n"))?;
            heads.insert(id, parse(column("h")?)?);
        }
        if heads.len() != ids.len() {
            return Err(unexpected("the number of rows"));
        }
        Ok(heads)
    }
}

/// A column of the reading's text rows, `None` for NULL.
fn parse<T: std::str::FromStr>(text: Option<&str>) -> Result<Option<T>, DbError> {
    text.map(|t| t.parse().map_err(|_| unexpected(t)))
        .transpose()
}

fn unexpected(what: &str) -> DbError {
    DbError::transient(format!("shared head reading: unexpected {what}"))
}

/// A store's place in its pool's shared readings; leaves them when dropped.
pub(crate) struct Membership {
    heads: Arc<Heads>,
    id: u64,
}

impl Membership {
    /// The store's own scan succeeded (`true`: it may be read with the
    /// others) or failed (`false`: it scans alone until one succeeds).
    pub(crate) fn scanned(&self, ok: bool) {
        if let Some(m) = self.heads.members().get_mut(&self.id) {
            m.scans = ok;
        }
    }

    /// The store's head from a reading that began no earlier than
    /// `not_before`, taking one when there is none;
    /// [`HeadReading::NotShared`] when the store is not in readings (its
    /// own scan has not succeeded).
    pub(crate) async fn head(&self, not_before: Instant) -> HeadReading {
        if !self.heads.members().get(&self.id).is_some_and(|m| m.scans) {
            return HeadReading::NotShared;
        }
        let mut last = self.heads.last.lock().await;
        if let Some(found) = last.as_ref().and_then(|r| self.from(r, not_before)) {
            return found;
        }
        let began = Instant::now();
        let heads = self.heads.read().await;
        let reading = Reading { began, heads };
        let found = self.from(&reading, not_before);
        *last = Some(reading);
        found.unwrap_or(HeadReading::NotShared)
    }

    /// How many readings the store's pool has sent (for tests and
    /// diagnostics).
    pub(crate) fn readings(&self) -> u64 {
        self.heads.readings.load(Ordering::Relaxed)
    }

    /// What `reading` says of the store; `None` when it cannot answer
    /// (it began before `not_before`, or without the store).
    fn from(&self, reading: &Reading, not_before: Instant) -> Option<HeadReading> {
        if reading.began < not_before {
            return None;
        }
        match &reading.heads {
            Ok(heads) => heads.get(&self.id).map(|head| match head {
                None => HeadReading::Empty,
                Some(at) => HeadReading::At(*at),
            }),
            Err(e) => Some(HeadReading::Failed(e.clone())),
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.heads.members().remove(&self.id);
    }
}
