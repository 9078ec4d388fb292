//! The stores of one SQL Server instance read their checkpoints together:
//! one statement names each store's table by its three-part name
//! (`[db].[schema].[Checkpoints]`), so a database-per-tenant fleet reads
//! every tenant's checkpoints in one round trip on one session every
//! `checkpoint_refresh`, instead of one statement per store. As the heads
//! (`heads.rs`), stores share a reading when they connect with the same
//! server, login and options, whatever their database; a reading of more
//! than [`MAX_PER_STATEMENT`] stores is several statements, each on a
//! session of the asking store's pool.
//!
//! Membership as PostgreSQL's (`postgres/checkpoints.rs`): a store joins
//! the shared readings once its own reading found its Checkpoints table and
//! succeeded, and leaves them when a shared reading fails: a table dropped,
//! a database gone or a lock held past the reading's lock timeout fails one
//! reading, every store of it then reads its own once, and those that
//! succeed join again. Only stores whose profile keeps checkpoints join.
//!
//! Architecture invariant: a reading serves only an ask at most
//! [`FRESH`] after it began, so no store's figures are older than one
//! `checkpoint_refresh` plus that.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::heads::MAX_PER_STATEMENT;
use super::sql::{quote_ident, SHARED_CHECKPOINTS as READING};
use super::{get, MssqlEngine};
use crate::engine::shared_reading::{Member, Readings};
use crate::engine::{Checkpoint, DbError, Ident};

/// How long after it began a reading serves the stores that ask.
pub(crate) const FRESH: Duration = Duration::from_secs(5);

/// The one store's SELECT of `shared_checkpoints.sql` that a reading
/// repeats, `0` its place and `__checkpoints__` its table.
const PART: &str = "SELECT 0 AS n, c.Id AS id, c.Position AS position FROM __checkpoints__ AS c";

/// The stores of one instance and their last reading: each member's part
/// is its Checkpoints table by three-part name, its value the table's rows.
pub(crate) type Checkpoints = Readings<String, Vec<Checkpoint>>;

/// `[database].[schema].[Checkpoints]`, quoted.
fn table(database: &str, schema: &Ident) -> String {
    format!("{}.{}.[Checkpoints]", quote_ident(database), schema.tsql())
}

/// Joins the store whose checkpoints are `[database].[schema].[Checkpoints]`
/// to `shared`; it is read with the others once it read its own.
pub(crate) fn join(shared: &Arc<Checkpoints>, database: &str, schema: &Ident) -> Membership {
    Membership {
        member: shared.join(table(database, schema)),
        shared: shared.clone(),
    }
}

/// The statement for `tables`, the n-th named `n`.
fn statement<'a>(tables: impl Iterator<Item = &'a String>) -> String {
    let parts: Vec<String> = tables
        .enumerate()
        .map(|(i, t)| {
            PART.replace("SELECT 0 AS n", &format!("SELECT {} AS n", i + 1))
                .replace("__checkpoints__", t)
        })
        .collect();
    READING.replace(PART, &parts.join(" UNION ALL "))
}

/// The checkpoints of `members`, in statements of at most
/// [`MAX_PER_STATEMENT`] stores, on `engine`'s pool.
async fn read(
    shared: &Checkpoints,
    engine: &MssqlEngine,
    members: Vec<(u64, String)>,
) -> Result<HashMap<u64, Vec<Checkpoint>>, DbError> {
    let mut found: HashMap<u64, Vec<Checkpoint>> =
        members.iter().map(|(id, _)| (*id, Vec::new())).collect();
    for chunk in members.chunks(MAX_PER_STATEMENT) {
        let sql = statement(chunk.iter().map(|(_, t)| t));
        shared.sent_one();
        let sets = engine.read(&sql, &[]).await?;
        for row in sets.iter().flatten() {
            let n = super::get_integer(row, "n")?.unwrap_or(0);
            let (id, _) = usize::try_from(n - 1)
                .ok()
                .and_then(|i| chunk.get(i))
                .ok_or_else(|| unexpected("n"))?;
            found.entry(*id).or_default().push(Checkpoint {
                id: get::<&str>(row, "id")?
                    .ok_or_else(|| unexpected("id"))?
                    .to_string(),
                position: get::<i64>(row, "position")?,
            });
        }
    }
    for list in found.values_mut() {
        list.sort_by(|a, b| a.id.cmp(&b.id));
    }
    Ok(found)
}

fn unexpected(what: &str) -> DbError {
    DbError::transient(format!("shared checkpoint reading: unexpected {what}"))
}

/// A store's place in its instance's shared checkpoint readings; leaves
/// them when dropped.
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
    /// one on `engine`'s pool when there is none; `None` when the store is
    /// not in the readings or the reading failed (it reads its own, and is
    /// out of the readings until that succeeds).
    pub(crate) async fn checkpoints(&self, engine: &MssqlEngine) -> Option<Vec<Checkpoint>> {
        self.member
            .value_within(FRESH, |members| read(&self.shared, engine, members))
            .await
    }

    /// Statements of shared checkpoint readings sent for the instance
    /// (tests, diagnostics).
    pub(crate) fn readings(&self) -> u64 {
        self.member.sent()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_names_each_table_by_three_parts_and_its_place() {
        assert!(READING.contains(PART), "the repeated SELECT is in the file");
        // A reading waits at most 200 ms for a lock.
        assert!(READING.contains("SET LOCK_TIMEOUT 200;"));
        let schema = Ident::parse("eventuous").unwrap();
        let tables = [table("tenant]1", &schema), table("t2", &schema)];
        assert_eq!(tables[0], "[tenant]]1].[eventuous].[Checkpoints]");
        let sql = statement(tables.iter());
        assert!(sql.ends_with(
            "SELECT 1 AS n, c.Id AS id, c.Position AS position FROM [tenant]]1].[eventuous].[Checkpoints] AS c \
             UNION ALL SELECT 2 AS n, c.Id AS id, c.Position AS position FROM [t2].[eventuous].[Checkpoints] AS c;\n"
        ), "{sql}");
        assert!(!sql.contains("FROM __checkpoints__"));
    }
}
