//! The fill: one transaction that writes tombstones at every position of a
//! batch of ranges, or nothing. This file holds Eventuous's transaction and
//! what every profile's fill errors mean; the table profiles' transactions
//! (SQLStreamStore's with its stream row among them) are in `table.rs`.
//!
//! Order inside Eventuous's transaction: lock the tombstone stream's row (creating it
//! on the first fill) under a short lock timeout, check the leader fence,
//! take the table's ROW EXCLUSIVE lock under the caller's lock timeout, then
//! insert every position with `OVERRIDING SYSTEM VALUE`, move the stream's
//! Version by exactly the rows inserted, commit. The healer hands a fill only
//! positions whose drawing transactions have ended (the transaction-end
//! proof, [`crate::proof`]); the insert must still check the primary key: it
//! waits on an open append's key and then fails with 55P03 (still open:
//! Held), fails with 23505 on the primary key (it committed: Committed), or
//! succeeds (it rolled back).

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use super::errors::{db_error, get, Stage};
use super::leader::advisory_key;
use super::sql::{LEADER_CHECK, POSITION_KEYS};
use super::PostgresEngine;
use crate::engine::profile::Tombstone;
use crate::engine::{DbError, DbErrorKind, DbResult, Fence, FillOutcome};
use crate::gaps::PosRange;

/// Rows per fill transaction. PostgreSQL has no lock escalation; the bound
/// keeps each transaction (and the tombstone stream's row lock) short.
pub(crate) const MAX_FILL_ROWS: u64 = 20_000;
/// Ranges per fill transaction: scattered narrow holes go in together.
pub(crate) const MAX_FILL_RANGES: usize = 1_000;
/// Wait for the tombstone stream's row (another healer filling) before `Busy`.
pub(super) const STREAM_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a fill transaction ended early: a driver error at a stage, or an
/// answer the engine cannot read.
pub(super) enum Failed {
    At(tokio_postgres::Error, Stage),
    Db(DbError),
}

impl From<DbError> for Failed {
    fn from(e: DbError) -> Self {
        Failed::Db(e)
    }
}

/// `SET LOCAL lock_timeout` for the rest of the fill's transaction (at
/// least 1 ms: 0 would mean no timeout).
pub(super) async fn set_lock_timeout(
    tx: &tokio_postgres::Transaction<'_>,
    timeout: Duration,
    stage: Stage,
) -> Result<(), Failed> {
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = '{}ms'",
        timeout.as_millis().max(1)
    ))
    .await
    .map_err(at(stage))
}

/// The ranges' starts and ends, as the fill statements bind them.
pub(super) fn bounds(ranges: &[PosRange]) -> (Vec<i64>, Vec<i64>) {
    ranges.iter().map(|r| (r.start(), r.end())).unzip()
}

pub(super) fn at(stage: Stage) -> impl Fn(tokio_postgres::Error) -> Failed {
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
        // The ranges ascend (the caller's guarantee): the span they cover.
        let span = PosRange::new(first.start(), last.end()).unwrap_or(*first);
        let mut conn = self.pool.checkout().await?;
        let result = match &self.profile.tombstone {
            Tombstone::EventuousStream => {
                self.fill_transaction(&mut conn.client, ranges, lock_timeout, fence)
                    .await
            }
            Tombstone::Columns(_) => {
                self.fill_table(&mut conn.client, &self.profile, ranges, lock_timeout, fence)
                    .await
            }
            Tombstone::StreamRow { stream, .. } => {
                self.fill_stream_row(&mut conn.client, stream, ranges, lock_timeout, fence)
                    .await
            }
        };
        let (e, stage) = match result {
            Ok(outcome) => return Ok(outcome),
            Err(Failed::Db(e)) => return Err(e),
            Err(Failed::At(e, stage)) => (e, stage),
        };
        conn.retire = e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION);
        match (e.code(), stage) {
            (Some(&SqlState::LOCK_NOT_AVAILABLE), Stage::Insert) => Ok(FillOutcome::Held),
            (Some(&SqlState::LOCK_NOT_AVAILABLE), Stage::Stream) => Ok(FillOutcome::Busy),
            (Some(&SqlState::LOCK_NOT_AVAILABLE), Stage::Table) => Ok(FillOutcome::TableLocked),
            (Some(&SqlState::UNIQUE_VIOLATION), Stage::Insert) => {
                let constraint = e
                    .as_db_error()
                    .and_then(|d| d.constraint())
                    .unwrap_or_default()
                    .to_string();
                let keys = self.position_keys(&conn.client).await?;
                if keys.contains(&constraint) {
                    Ok(FillOutcome::Committed)
                } else if let Tombstone::Columns(_) = self.profile.tombstone {
                    // The version lock serialises healers; a writer that
                    // takes no lock raced this one. The next cycle reads
                    // the stream's version again.
                    Err(DbError {
                        kind: DbErrorKind::Transient,
                        code: Some("23505".into()),
                        message: format!(
                            "fill {span}: duplicate key on {constraint}, not on a key of the position: \
                             another writer added to the tombstone stream meanwhile; retrying"
                        ),
                        during: Some(format!("fill {span}")),
                    })
                } else {
                    Err(DbError {
                        kind: DbErrorKind::Permanent,
                        code: Some("23505".into()),
                        message: format!(
                            "fill {span}: duplicate key on {constraint}, not on the primary key {}: \
                             the tombstone stream's version no longer matches its rows; \
                             run `gap-healer check` and repair it before healing",
                            keys.join(", ")
                        ),
                        during: Some(format!("fill {span}")),
                    })
                }
            }
            _ => Err(db_error(&self.target.cs, &e, &format!("fill {span}"))),
        }
    }

    /// The names of the unique keys on exactly the position, looked up once.
    async fn position_keys(&self, client: &tokio_postgres::Client) -> DbResult<Vec<String>> {
        if let Some(names) = self.position_keys.get() {
            return Ok(names.clone());
        }
        let rows = client
            .query(
                POSITION_KEYS,
                &[&self.table_name(), &self.position_column()],
            )
            .await
            .map_err(|e| self.error(&e, "position key lookup"))?;
        let names = rows
            .iter()
            .map(|r| get(r, "name"))
            .collect::<DbResult<Vec<String>>>()?;
        Ok(self.position_keys.get_or_init(|| names).clone())
    }

    /// Inside a fill's transaction: whether the fence still holds (the
    /// leader lock's session still has the lock). `false`: write nothing.
    /// The tombstone stream's row, locked (`lock`: its statement and
    /// parameters), made first (`create`) when there is none, and the
    /// fence checked after it: `None` when the fill must write nothing
    /// this cycle (Busy), because the row went between two statements or
    /// another healer may lead now. Every profile with a stream row of its
    /// own takes it this way, first in its fill transaction.
    pub(super) async fn lock_stream_row(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        lock: (&str, &[&(dyn ToSql + Sync)]),
        create: (&str, &[&(dyn ToSql + Sync)]),
        fence: &Fence,
    ) -> Result<Option<tokio_postgres::Row>, Failed> {
        let mut row = tx
            .query_opt(lock.0, lock.1)
            .await
            .map_err(at(Stage::Stream))?;
        if row.is_none() {
            tx.execute(create.0, create.1)
                .await
                .map_err(at(Stage::Stream))?;
            row = tx
                .query_opt(lock.0, lock.1)
                .await
                .map_err(at(Stage::Stream))?;
        }
        if row.is_none() || !self.fence_holds(tx, fence).await? {
            return Ok(None);
        }
        Ok(row)
    }

    pub(super) async fn fence_holds(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        fence: &Fence,
    ) -> Result<bool, Failed> {
        let Fence::Leader(token) = fence else {
            return Ok(true);
        };
        // A pid that does not fit PostgreSQL's int cannot hold the lock.
        let Ok(pid) = i32::try_from(token.session_id) else {
            return Ok(false);
        };
        let held = tx
            .query_one(LEADER_CHECK, &[&pid, &advisory_key(&token.lock)])
            .await
            .map_err(at(Stage::Stream))?;
        Ok(get::<bool>(&held, "held")?)
    }

    /// Inside a fill's transaction, before the insert: the healed table's
    /// ROW EXCLUSIVE lock, taken explicitly under the caller's lock
    /// timeout. A lock timeout here is a TABLE lock (a non-concurrent
    /// `CREATE INDEX`, `LOCK TABLE`, DDL), never an append's key: the whole
    /// store backs off ([`FillOutcome::TableLocked`]) instead of taking it
    /// for a held position. Once it is held, the insert's lock timeouts can
    /// only come from keys and rows.
    pub(super) async fn lock_table(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
    ) -> Result<(), Failed> {
        tx.batch_execute(&self.sql.lock_table)
            .await
            .map_err(at(Stage::Table))
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
        set_lock_timeout(&tx, STREAM_LOCK_TIMEOUT, Stage::Begin).await?;
        let q = &self.sql;
        let stream = &self.tombstone_stream;
        let locked = self
            .lock_stream_row(
                &tx,
                (&q.lock_stream, &[stream]),
                (&q.create_stream, &[stream]),
                fence,
            )
            .await?;
        let Some(row) = locked else {
            return Ok(FillOutcome::Busy);
        };
        let stream_id: i32 = get(&row, "stream_id")?;
        let version: i32 = get(&row, "version")?;
        let (starts, ends) = bounds(ranges);
        set_lock_timeout(&tx, lock_timeout, Stage::Insert).await?;
        self.lock_table(&tx).await?;
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
