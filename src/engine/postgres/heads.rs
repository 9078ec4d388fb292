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
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::SimpleQueryMessage;

use super::conn::Manager;
use super::errors::db_error;
use super::sql::{without_comments, SHARED_HEADS};
use crate::engine::pool::Pool;
use crate::engine::shared_reading::{Member, Readings};
use crate::engine::{DbError, HeadReading};
use crate::secret::ConnectionString;

/// How long a reading waits for a table lock (DDL on one store's table)
/// before it fails and every store of it scans on its own.
const LOCK_TIMEOUT: Duration = Duration::from_millis(200);

/// The stores of one pool and their last reading: each member's part is
/// `(SELECT MAX(position) FROM table)`, validated names spliced in; its
/// value the head (`None`: an empty table).
pub(crate) struct Heads {
    pool: Arc<Pool<Manager>>,
    /// For error messages, free of the password.
    cs: ConnectionString,
    readings: Arc<Readings<String, Option<i64>>>,
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
            readings: Arc::default(),
        }
    }

    /// Joins a store whose head is `head_sql` (`sql/postgres/shared_head.sql`
    /// as [`super::sql::statement`] renders it).
    pub(crate) fn join(self: &Arc<Self>, head_sql: String) -> Membership {
        Membership {
            member: self.readings.join(head_sql),
            heads: self.clone(),
        }
    }

    /// One statement for `members` (those whose own scan last succeeded).
    async fn read(
        &self,
        members: Vec<(u64, String)>,
    ) -> Result<HashMap<u64, Option<i64>>, DbError> {
        if members.is_empty() {
            return Ok(HashMap::new());
        }
        let heads: Vec<&str> = members.iter().map(|(_, h)| h.as_str()).collect();
        let sql = READING.replace("__heads__", &heads.join(", "));
        let conn = self.pool.checkout().await?;
        self.readings.sent_one();
        let messages = conn
            .simple_query(&sql)
            .await
            .map_err(|e| db_error(&self.cs, &e, "shared head reading"))?;
        let mut found = HashMap::with_capacity(members.len());
        for message in messages {
            let SimpleQueryMessage::Row(row) = message else {
                continue;
            };
            let column = |name: &str| row.try_get(name).map_err(|_| unexpected(name));
            let n: usize = parse(column("n")?)?.ok_or_else(|| unexpected("n"))?;
            let (id, _) = members
                .get(n.wrapping_sub(1))
                .ok_or_else(|| unexpected("n"))?;
            found.insert(*id, parse(column("h")?)?);
        }
        if found.len() != members.len() {
            return Err(unexpected("the number of rows"));
        }
        Ok(found)
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
    member: Member<String, Option<i64>>,
}

impl Membership {
    /// The store's own scan succeeded (`true`: it may be read with the
    /// others) or failed (`false`: it scans alone until one succeeds).
    pub(crate) fn scanned(&self, ok: bool) {
        self.member.share(ok);
    }

    /// The store's head from a reading that began no earlier than
    /// `not_before`, taking one when there is none;
    /// [`HeadReading::NotShared`] when the store is not in readings (its
    /// own scan has not succeeded).
    pub(crate) async fn head(&self, not_before: Instant) -> HeadReading {
        let found = self
            .member
            .value(
                |r| r.began >= not_before,
                |members| self.heads.read(members),
            )
            .await;
        HeadReading::from_shared(found)
    }

    /// How many readings the store's pool has sent (for tests and
    /// diagnostics).
    pub(crate) fn readings(&self) -> u64 {
        self.member.sent()
    }
}
