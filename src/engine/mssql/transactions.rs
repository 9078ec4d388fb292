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
use crate::engine::{
    Check, DbError, DbResult, Finding, OpenTransaction, OpenTransactions, TransactionReading,
};

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
        let sets = match self.read(sql, &[]).await {
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
        let rows = sets.into_iter().next().unwrap_or_default();
        let mut open = Vec::with_capacity(rows.len());
        let mut sequence = None;
        for row in &rows {
            // Babelfish's row of the sequence the table draws from.
            if get::<&str>(row, "kind")? == Some("sequence") {
                sequence = get_integer(row, "sequence_oid")?;
                continue;
            }
            open.push(OpenTransaction {
                id: get::<&str>(row, "id")?.unwrap_or_default().to_string(),
                xid: None,
                session: get_integer(row, "session_id")?,
                application: get::<&str>(row, "application")?
                    .filter(|a| !a.is_empty())
                    .map(str::to_string),
            });
        }
        if babelfish && sequence.is_none() {
            // Without it, no row of pg_locks could be read as "none open".
            return Err(DbError::permanent(format!(
                "open transactions: Babelfish shows no sequence for the identity of [{}].[Messages]",
                self.settings.schema.as_str()
            ))
            .during("open transactions"));
        }
        Ok(OpenTransactions::Read(TransactionReading {
            began,
            handed_out: None,
            open,
        }))
    }
}

impl MssqlEngine {
    /// Which proof that a drawn position's transaction has ended is in
    /// force, for `check`: the transaction-end proof where this login may
    /// read the locks, else the clustered key argument alone, with the
    /// grant that upgrades it.
    pub(crate) async fn proof_finding(&self) -> Finding {
        let babelfish = match self.server().await {
            Ok(server) => server.babelfish.is_some(),
            Err(e) => return Finding::warn(Check::TransactionProof, format!("not read: {e}")),
        };
        let login = match self.read_first(LOGIN, &[]).await {
            Ok(rows) => rows.first().map_or((None, 0), |row| {
                (
                    get::<&str>(row, "login").ok().flatten().map(str::to_string),
                    get::<i32>(row, "edition").ok().flatten().unwrap_or(0),
                )
            }),
            Err(e) => return Finding::warn(Check::TransactionProof, format!("not read: {e}")),
        };
        match self.read_open_transactions().await {
            Ok(OpenTransactions::Read(_)) => Finding::pass(
                Check::TransactionProof,
                format!(
                    "in force: a hole is filled only once every transaction that held {} when it \
                     was read has ended ({})",
                    if babelfish {
                        "the identity's sequence"
                    } else {
                        "Messages open for writing"
                    },
                    if babelfish {
                        "pg_locks"
                    } else {
                        "sys.dm_tran_locks"
                    }
                ),
            ),
            Ok(OpenTransactions::KeyOrderOnly) => Finding::warn(
                Check::TransactionProof,
                key_order_only(login.0.as_deref(), login.1),
            ),
            Err(e) => Finding::warn(Check::TransactionProof, format!("not read: {e}")),
        }
    }
}

/// The login and the engine edition (5: Azure SQL Database).
const LOGIN: &str =
    "SELECT SUSER_SNAME() AS login, CAST(SERVERPROPERTY('EngineEdition') AS INT) AS edition;";

/// What `check` says without the right to read the locks. Pure.
pub(crate) fn key_order_only(login: Option<&str>, edition: i32) -> String {
    let who = super::sql::quote_ident(login.unwrap_or("<login>"));
    let grant = if edition == 5 {
        format!("GRANT VIEW DATABASE STATE TO {who}; (in the store's database)")
    } else {
        format!(
            "GRANT VIEW SERVER STATE TO {who}; (in master; VIEW SERVER PERFORMANCE STATE is enough from SQL Server 2022)"
        )
    };
    format!(
        "not in force: this login may not read sys.dm_tran_locks, so only the clustered key stands: \
         SQL Server writes the position's key before the insert's other indexes, which covers an \
         append that waits in a unique check, but not user code that waits between the draw and \
         the key (a CHECK constraint or DEFAULT calling a function, a trigger); {grant}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Ident;

    /// The grant `check` asks for without the right to read the locks is
    /// one `sql` prints (issue 27: `check` and `sql` must agree).
    #[test]
    fn the_grant_check_asks_for_is_one_sql_prints() {
        let sql = super::super::sql::setup_script(
            &Ident::parse("eventuous").unwrap(),
            "__tombstones__",
            "$tombstone",
        )
        .replace(crate::engine::HEALER_ROLE, "[healer]");
        for edition in [3, 5] {
            let advice = key_order_only(Some("healer"), edition);
            let at = advice.find("GRANT ").expect("a grant");
            let grant = &advice[at..=at + advice[at..].find(';').unwrap()];
            assert!(sql.contains(grant), "{grant} is not in `sql`:\n{sql}");
        }
    }
}
