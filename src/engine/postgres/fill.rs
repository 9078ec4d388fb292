//! The fill: one transaction that writes tombstones at every position of a
//! batch of ranges, or nothing.
//!
//! Order inside the transaction: lock the tombstone stream's row (creating it
//! on the first fill) under a short lock timeout, check the leader fence,
//! then insert every position with `OVERRIDING SYSTEM VALUE` under the
//! caller's lock timeout, move the stream's Version by exactly the rows
//! inserted, commit. The insert must check the primary key: it waits on an
//! open append's key and then fails with 55P03 (still open: Held), fails with
//! 23505 on the primary key (it committed: Committed), or succeeds (it rolled
//! back).

use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::errors::{db_error, get, Stage};
use super::leader::advisory_key;
use super::sql::{LEADER_CHECK, PRIMARY_KEY};
use super::PostgresEngine;
use crate::engine::{DbError, DbErrorKind, DbResult, Fence, FillOutcome};
use crate::gaps::PosRange;

/// Rows per fill transaction. PostgreSQL has no lock escalation; the bound
/// keeps each transaction (and the tombstone stream's row lock) short.
pub(crate) const MAX_FILL_ROWS: u64 = 20_000;
/// Ranges per fill transaction: scattered narrow holes go in together.
pub(crate) const MAX_FILL_RANGES: usize = 1_000;
/// Wait for the tombstone stream's row (another healer filling) before `Busy`.
const STREAM_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a fill transaction ended early: a driver error at a stage, or an
/// answer the engine cannot read.
enum Failed {
    At(tokio_postgres::Error, Stage),
    Db(DbError),
}

impl From<DbError> for Failed {
    fn from(e: DbError) -> Self {
        Failed::Db(e)
    }
}

fn at(stage: Stage) -> impl Fn(tokio_postgres::Error) -> Failed {
    move |e| Failed::At(e, stage)
}

impl PostgresEngine {
    pub(crate) async fn fill_batch(
        &self,
        ranges: &[PosRange],
        lock_timeout: Duration,
        fence: &Fence,
    ) -> DbResult<FillOutcome> {
        let (Some(first), Some(last)) = (ranges.first(), ranges.last()) else {
            return Ok(FillOutcome::Filled { rows: 0 });
        };
        let span = PosRange {
            start: first.start,
            end: last.end,
        };
        let mut conn = self.pool.checkout().await?;
        let result = self
            .fill_transaction(&mut conn.client, ranges, lock_timeout, fence)
            .await;
        let (e, stage) = match result {
            Ok(outcome) => return Ok(outcome),
            Err(Failed::Db(e)) => return Err(e),
            Err(Failed::At(e, stage)) => (e, stage),
        };
        conn.retire = e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION);
        match (e.code(), stage) {
            (Some(&SqlState::LOCK_NOT_AVAILABLE), Stage::Insert) => Ok(FillOutcome::Held),
            (Some(&SqlState::LOCK_NOT_AVAILABLE), Stage::Stream) => Ok(FillOutcome::Busy),
            (Some(&SqlState::UNIQUE_VIOLATION), Stage::Insert) => {
                let constraint = e
                    .as_db_error()
                    .and_then(|d| d.constraint())
                    .unwrap_or_default()
                    .to_string();
                let pkey = self.pkey_name(&conn.client).await?;
                if constraint == pkey {
                    Ok(FillOutcome::Committed)
                } else {
                    Err(DbError {
                        kind: DbErrorKind::Permanent,
                        code: Some("23505".into()),
                        message: format!(
                            "fill {span}: duplicate key on {constraint}, not on the primary key {pkey}: \
                             the tombstone stream's version no longer matches its rows; \
                             run `gap-healer check` and repair it before healing"
                        ),
                    })
                }
            }
            _ => Err(db_error(&self.target.cs, &e, &format!("fill {span}"))),
        }
    }

    /// The name of the messages primary key, looked up once.
    async fn pkey_name(&self, client: &tokio_postgres::Client) -> DbResult<String> {
        if let Some(name) = self.messages_pkey.get() {
            return Ok(name.clone());
        }
        let row = client
            .query_opt(PRIMARY_KEY, &[&self.messages_table()])
            .await
            .map_err(|e| self.error(&e, "primary key lookup"))?;
        let name: String = match row {
            Some(row) => get(&row, "name")?,
            None => String::new(),
        };
        Ok(self.messages_pkey.get_or_init(|| name).clone())
    }

    /// The transaction itself; it rolls back when dropped.
    async fn fill_transaction(
        &self,
        client: &mut tokio_postgres::Client,
        ranges: &[PosRange],
        lock_timeout: Duration,
        fence: &Fence,
    ) -> Result<FillOutcome, Failed> {
        let tx = client.transaction().await.map_err(at(Stage::Begin))?;
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = '{}ms'",
            STREAM_LOCK_TIMEOUT.as_millis()
        ))
        .await
        .map_err(at(Stage::Begin))?;
        let q = &self.sql;
        let stream = &self.tombstone_stream;
        let mut row = tx
            .query_opt(&q.lock_stream, &[stream])
            .await
            .map_err(at(Stage::Stream))?;
        if row.is_none() {
            tx.execute(&q.create_stream, &[stream])
                .await
                .map_err(at(Stage::Stream))?;
            row = tx
                .query_opt(&q.lock_stream, &[stream])
                .await
                .map_err(at(Stage::Stream))?;
        }
        let Some(row) = row else {
            // Created and deleted between two statements: let the next cycle retry.
            return Ok(FillOutcome::Busy);
        };
        if let Fence::Leader(token) = fence {
            // A pid that does not fit PostgreSQL's int cannot hold the lock.
            let Ok(pid) = i32::try_from(token.session_id) else {
                return Ok(FillOutcome::Busy);
            };
            let held = tx
                .query_one(LEADER_CHECK, &[&pid, &advisory_key(&token.lock)])
                .await
                .map_err(at(Stage::Stream))?;
            if !get::<bool>(&held, "held")? {
                // Another healer may lead now: write nothing and let the
                // leader flag catch up.
                return Ok(FillOutcome::Busy);
            }
        }
        let stream_id: i32 = get(&row, "stream_id")?;
        let version: i32 = get(&row, "version")?;
        let starts: Vec<i64> = ranges.iter().map(|r| r.start).collect();
        let ends: Vec<i64> = ranges.iter().map(|r| r.end).collect();
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = '{}ms'",
            lock_timeout.as_millis().max(1)
        ))
        .await
        .map_err(at(Stage::Insert))?;
        let inserted = tx
            .execute(
                &q.fill,
                &[&starts, &ends, &stream_id, &version, &self.tombstone_type],
            )
            .await
            .map_err(at(Stage::Insert))?;
        let moved = i32::try_from(inserted).map_err(|_| {
            DbError::permanent(format!(
                "fill inserted {inserted} rows: more than the tombstone stream's Version can count"
            ))
        })?;
        tx.execute(&q.bump_stream, &[&stream_id, &moved])
            .await
            .map_err(at(Stage::Stream))?;
        tx.commit().await.map_err(at(Stage::Commit))?;
        Ok(FillOutcome::Filled { rows: inserted })
    }
}
