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
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tokio_postgres::SimpleQueryMessage;

use super::conn::Manager;
use super::errors::db_error;
use super::sql::{without_comments, SHARED_CHECKPOINTS};
use crate::engine::pool::Pool;
use crate::engine::shared_reading::{Member, Readings};
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

/// The stores of one pool and their last reading: each member's part is
/// its checkpoints table (a validated, qualified name), its value the
/// table's rows.
pub(crate) struct Checkpoints {
    pool: Arc<Pool<Manager>>,
    /// For error messages, free of the password.
    cs: ConnectionString,
    readings: Arc<Readings<String, Vec<Checkpoint>>>,
}

impl Checkpoints {
    pub(crate) fn new(pool: Arc<Pool<Manager>>, cs: ConnectionString) -> Self {
        Checkpoints {
            pool,
            cs,
            readings: Arc::default(),
        }
    }

    /// Joins a store whose checkpoints table is `table`; it is read with
    /// the others once it read its own.
    pub(crate) fn join(self: &Arc<Self>, table: String) -> Membership {
        Membership {
            member: self.readings.join(table),
            shared: self.clone(),
        }
    }

    /// One statement for `members`.
    async fn read(
        &self,
        members: Vec<(u64, String)>,
    ) -> Result<HashMap<u64, Vec<Checkpoint>>, DbError> {
        let parts: Vec<String> = members
            .iter()
            .enumerate()
            .map(|(i, (_, table))| {
                format!(
                    "SELECT {} AS n, id::text AS id, position::bigint AS position FROM {table}",
                    i + 1
                )
            })
            .collect();
        let sql = READING.replace("__checkpoints__", &parts.join(" UNION ALL "));
        let mut rows: HashMap<u64, Vec<Checkpoint>> =
            members.iter().map(|(id, _)| (*id, Vec::new())).collect();
        let conn = self.pool.checkout().await?;
        self.readings.sent_one();
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
            let (id, _) = members
                .get(n.wrapping_sub(1))
                .ok_or_else(|| unexpected("n"))?;
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
    member: Member<String, Vec<Checkpoint>>,
}

impl Membership {
    /// The store's own reading found its table and succeeded (`true`: it
    /// is read with the others from now on) or not.
    pub(crate) fn share(&self, ok: bool) {
        self.member.share(ok);
    }

    /// The store's checkpoints from a reading at most [`FRESH`] old, taking
    /// one when there is none; `None` when the store is not in the
    /// readings or the reading failed (it reads its own, and is out of the
    /// readings until that succeeds).
    pub(crate) async fn checkpoints(&self) -> Option<Vec<Checkpoint>> {
        self.member
            .value_within(FRESH, |members| self.shared.read(members))
            .await
    }

    /// Readings the store's pool has sent (for tests and diagnostics).
    pub(crate) fn readings(&self) -> u64 {
        self.member.sent()
    }
}
