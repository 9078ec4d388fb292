//! The readings of open transactions that the transaction-end proof rests
//! on ([`crate::proof`]): on SQL Server the transactions holding an
//! intent-exclusive lock on Messages (`sys.dm_tran_locks`, which needs
//! `VIEW SERVER STATE`), on Babelfish those holding RowExclusiveLock on the
//! identity's sequence (`pg_locks`). Neither says how far the identity had
//! handed out, so the healer takes the position it had examined before the
//! reading began.
//!
//! Without the right to read `sys.dm_tran_locks` the reading is
//! [`OpenTransactions::KeyOrderOnly`]: SQL Server writes a row into the
//! clustered index, with its key lock, before anything else of the insert
//! can wait, so Eventuous's table (clustered on the position) keys every
//! drawn position at once, and the fill's key check decides alone.

use tokio::time::Instant;

use super::{get, get_integer, MssqlEngine};
use crate::engine::{DbError, DbResult, OpenTransaction, OpenTransactions, TransactionReading};

/// SQL Server's refusals of a dynamic management view to a login without
/// the right: 300 (a permission denied, naming it), 297 (no permission to
/// perform this action).
const NO_VIEW_RIGHT: [&str; 2] = ["300", "297"];

impl MssqlEngine {
    /// One reading of the transactions that hold Messages open for writing.
    pub(crate) async fn read_open_transactions(&self) -> DbResult<OpenTransactions> {
        let babelfish = self.server().await?.babelfish.is_some();
        let sql = if babelfish {
            &self.sql.open_transactions_babelfish
        } else {
            &self.sql.open_transactions
        };
        let began = Instant::now();
        let mut sets = match self.read(sql, &[]).await {
            Ok(sets) => sets,
            Err(e)
                if !babelfish
                    && e.code
                        .as_deref()
                        .is_some_and(|c| NO_VIEW_RIGHT.contains(&c)) =>
            {
                return Ok(OpenTransactions::KeyOrderOnly)
            }
            Err(e) => return Err(e),
        };
        if babelfish {
            // First the sequence the table draws from: without it, no row
            // of pg_locks could be read as "none open".
            let sequence = match sets.first().and_then(|set| set.first()) {
                Some(row) => get_integer(row, "sequence_oid")?,
                None => None,
            };
            if sequence.is_none() || sets.len() < 2 {
                return Err(DbError::permanent(format!(
                    "open transactions: Babelfish shows no sequence for the identity of [{}].[Messages]",
                    self.settings.schema.as_str()
                )));
            }
            sets.remove(0);
        }
        let rows = sets.into_iter().next().unwrap_or_default();
        let mut open = Vec::with_capacity(rows.len());
        for row in &rows {
            open.push(OpenTransaction {
                id: get::<&str>(row, "id")?.unwrap_or_default().to_string(),
                xid: None,
                session: get_integer(row, "session_id")?,
                application: get::<&str>(row, "application")?
                    .filter(|a| !a.is_empty())
                    .map(str::to_string),
            });
        }
        Ok(OpenTransactions::Read(TransactionReading {
            began,
            handed_out: None,
            open,
        }))
    }
}
