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
use std::sync::Arc;

use tokio::time::Instant;

use super::sql::{quote_ident, SHARED_HEADS as READING};
use super::table::rename;
use super::{get_integer, MssqlEngine};
use crate::engine::profile::TableShape;
use crate::engine::shared_reading::{Member, Readings};
use crate::engine::{DbError, HeadReading, Ident};

/// Stores per statement: past this a reading is several statements.
pub(crate) const MAX_PER_STATEMENT: usize = 200;

/// The stores of one instance and their last reading: each member's part
/// is its row's head expression, its value the head (`None`: an empty
/// table).
pub(crate) type Heads = Readings<String, Option<i64>>;

/// `(SELECT TOP (1) ...)`: one store's head expression in the reading
/// (Eventuous's Messages, or a described table by its names).
fn head_row(database: &str, schema: &Ident, shape: &TableShape) -> String {
    rename(
        &format!(
            "(SELECT TOP (1) m.GlobalPosition FROM {}.{}.[Messages] AS m WITH (READCOMMITTEDLOCK, READPAST) ORDER BY m.GlobalPosition DESC)",
            quote_ident(database),
            schema.tsql()
        ),
        shape,
    )
}

/// Joins the store whose table is `[database].[schema].[Messages]` (or
/// its profile's table) to `heads`.
pub(crate) fn join(
    heads: &Arc<Heads>,
    database: &str,
    schema: &Ident,
    shape: &TableShape,
) -> Membership {
    Membership {
        member: heads.join(head_row(database, schema, shape)),
        heads: heads.clone(),
    }
}

/// The heads of `members`, in statements of at most
/// [`MAX_PER_STATEMENT`], on `engine`'s pool.
async fn read(
    heads: &Heads,
    engine: &MssqlEngine,
    members: Vec<(u64, String)>,
) -> Result<HashMap<u64, Option<i64>>, DbError> {
    let mut found = HashMap::with_capacity(members.len());
    for chunk in members.chunks(MAX_PER_STATEMENT) {
        let rows: Vec<String> = chunk
            .iter()
            .enumerate()
            .map(|(i, (_, head))| format!("({}, {head})", i + 1))
            .collect();
        let sql = READING.replace("(0, __heads__)", &rows.join(", "));
        heads.sent_one();
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
            found.insert(*id, get_integer(row, "h")?);
        }
    }
    Ok(found)
}

/// A store's place in its instance's shared readings; leaves them when
/// dropped.
pub(crate) struct Membership {
    heads: Arc<Heads>,
    member: Member<String, Option<i64>>,
}

impl Membership {
    /// The store's own scan succeeded (`true`: it may be read with the
    /// others) or failed or runs (`false`).
    pub(crate) fn scanned(&self, ok: bool) {
        self.member.share(ok);
    }

    /// The store's head from a reading that began no earlier than
    /// `not_before`, taking one on `engine`'s pool when there is none.
    pub(crate) async fn head(&self, engine: &MssqlEngine, not_before: Instant) -> HeadReading {
        let found = self
            .member
            .value(
                |r| r.began >= not_before,
                |members| read(&self.heads, engine, members),
            )
            .await;
        HeadReading::from_shared(found)
    }

    /// Statements of shared readings sent for the instance (tests,
    /// diagnostics).
    pub(crate) fn readings(&self) -> u64 {
        self.member.sent()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_row_names_the_table_by_three_parts_quoted() {
        let schema = Ident::parse("eventuous").unwrap();
        assert_eq!(
            head_row("tenant]1", &schema, &TableShape::eventuous()),
            "(SELECT TOP (1) m.GlobalPosition FROM [tenant]]1].[eventuous].[Messages] AS m WITH (READCOMMITTEDLOCK, READPAST) ORDER BY m.GlobalPosition DESC)"
        );
        // A reading waits at most 200 ms for a table lock.
        assert!(READING.contains("SET LOCK_TIMEOUT 200;"));
        assert!(READING.contains("(VALUES (0, __heads__))"));
    }
}
