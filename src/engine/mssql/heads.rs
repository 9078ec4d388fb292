//! The stores of one SQL Server instance read their heads together: one
//! statement names each store's table by its three-part name
//! (`[db].[schema].[Messages]`), so a database-per-tenant fleet reads every
//! tenant's head in one round trip on one session, instead of a scan per
//! store per poll. PostgreSQL cannot do this (a session reaches one
//! database), which is why its readings are per database.
//!
//! Stores share a reading when they connect with the same server, login
//! and options, whatever their database (the connection string without its
//! database key). A reading of more than [`MAX_PER_STATEMENT`] stores is
//! several statements, each on a session of the asking store's pool.
//!
//! Architecture invariants, as PostgreSQL's readings (`postgres/heads.rs`):
//! - A reading is used only by a poll due no later than it began.
//! - A store is in a reading only after its own scan last succeeded, and
//!   not while one runs; a reading that failed sends every store of it back
//!   to its own scan for that poll.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

use super::sql::quote_ident;

use super::{get_integer, MssqlEngine};
use crate::engine::{DbError, HeadReading, Ident};

/// Stores per statement: past this a reading is several statements.
pub(crate) const MAX_PER_STATEMENT: usize = 200;

use super::sql::SHARED_HEADS as READING;

/// The stores of one instance and their last reading.
#[derive(Default)]
pub(crate) struct Heads {
    /// Each member's head expression, and whether its own scan last
    /// succeeded.
    members: Mutex<HashMap<u64, (String, bool)>>,
    last: tokio::sync::Mutex<Option<Reading>>,
    next_id: AtomicU64,
    readings: AtomicU64,
}

struct Reading {
    began: Instant,
    heads: Result<HashMap<u64, Option<i64>>, DbError>,
}

/// `(n, (SELECT TOP (1) ...))`: one store's row of the reading.
fn head_row(database: &str, schema: &Ident) -> String {
    format!(
        "(SELECT TOP (1) m.GlobalPosition FROM {}.{}.[Messages] AS m WITH (READCOMMITTEDLOCK, READPAST) ORDER BY m.GlobalPosition DESC)",
        quote_ident(database),
        schema.tsql()
    )
}

impl Heads {
    /// Joins the store whose table is `[database].[schema].[Messages]`.
    pub(crate) fn join(self: &Arc<Self>, database: &str, schema: &Ident) -> Membership {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.members()
            .insert(id, (head_row(database, schema), false));
        Membership {
            heads: self.clone(),
            id,
        }
    }

    fn members(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (String, bool)>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The heads of every member whose own scan last succeeded, in
    /// statements of at most [`MAX_PER_STATEMENT`], on `engine`'s pool.
    async fn read(&self, engine: &MssqlEngine) -> Result<HashMap<u64, Option<i64>>, DbError> {
        let members: Vec<(u64, String)> = self
            .members()
            .iter()
            .filter(|(_, (_, scans))| *scans)
            .map(|(id, (row, _))| (*id, row.clone()))
            .collect();
        let mut heads = HashMap::with_capacity(members.len());
        for chunk in members.chunks(MAX_PER_STATEMENT) {
            let rows: Vec<String> = chunk
                .iter()
                .enumerate()
                .map(|(i, (_, head))| format!("({}, {head})", i + 1))
                .collect();
            let sql = READING.replace("(0, __heads__)", &rows.join(", "));
            self.readings.fetch_add(1, Ordering::Relaxed);
            let sets = engine.read(&sql, &[]).await?;
            let rows = sets.into_iter().next().unwrap_or_default();
            if rows.len() != chunk.len() {
                return Err(DbError::transient(
                    "shared head reading: unexpected number of rows",
                ));
            }
            for row in &rows {
                let n = get_integer(row, "n")?.unwrap_or(0);
                let (id, _) = usize::try_from(n - 1)
                    .ok()
                    .and_then(|i| chunk.get(i))
                    .ok_or_else(|| DbError::transient("shared head reading: unexpected n"))?;
                heads.insert(*id, get_integer(row, "h")?);
            }
        }
        Ok(heads)
    }
}

/// A store's place in its instance's shared readings; leaves them when
/// dropped.
pub(crate) struct Membership {
    heads: Arc<Heads>,
    id: u64,
}

impl Membership {
    /// The store's own scan succeeded (`true`: it may be read with the
    /// others) or failed or runs (`false`).
    pub(crate) fn scanned(&self, ok: bool) {
        if let Some(m) = self.heads.members().get_mut(&self.id) {
            m.1 = ok;
        }
    }

    /// The store's head from a reading that began no earlier than
    /// `not_before`, taking one on `engine`'s pool when there is none.
    pub(crate) async fn head(&self, engine: &MssqlEngine, not_before: Instant) -> HeadReading {
        if !self.heads.members().get(&self.id).is_some_and(|m| m.1) {
            return HeadReading::NotShared;
        }
        let mut last = self.heads.last.lock().await;
        if let Some(found) = last.as_ref().and_then(|r| self.from(r, not_before)) {
            return found;
        }
        let began = Instant::now();
        let heads = self.heads.read(engine).await;
        let reading = Reading { began, heads };
        let found = self.from(&reading, not_before);
        *last = Some(reading);
        found.unwrap_or(HeadReading::NotShared)
    }

    /// Statements of shared readings sent for the instance (tests,
    /// diagnostics).
    pub(crate) fn readings(&self) -> u64 {
        self.heads.readings.load(Ordering::Relaxed)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_row_names_the_table_by_three_parts_quoted() {
        let schema = Ident::parse("eventuous").unwrap();
        assert_eq!(
            head_row("tenant]1", &schema),
            "(SELECT TOP (1) m.GlobalPosition FROM [tenant]]1].[eventuous].[Messages] AS m WITH (READCOMMITTEDLOCK, READPAST) ORDER BY m.GlobalPosition DESC)"
        );
        // A reading waits at most 200 ms for a table lock.
        assert!(READING.contains("SET LOCK_TIMEOUT 200;"));
        assert!(READING.contains("(VALUES (0, __heads__))"));
    }
}
