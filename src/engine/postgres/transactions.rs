//! The readings of open transactions that the transaction-end proof rests
//! on ([`crate::proof`]), one for every store of a database at once.
//!
//! A reading is two statements on one session, the second sent only after
//! the first has answered: how far each store's sequence had handed
//! positions out (`sql/postgres/handed_out.sql`, the sequence relation read
//! directly), then which transactions hold RowExclusiveLock on those
//! sequences (`sql/postgres/transactions.sql`, one read of `pg_locks`).
//! Reading `pg_locks` takes every lock partition for a moment, so the
//! stores of one database (one pool) share their readings: a store asks for
//! a reading begun no earlier than its poll was due, and the first to ask
//! reads for every store that asked within [`INTEREST`]; 500 stores polling
//! on one grid cost one reading a poll, not 500, and only while some store
//! has a hole its proof still waits for.
//!
//! Architecture invariants:
//! - The sequences are read before the locks, never together, so every
//!   position a reading says was handed out was drawn before the locks were
//!   read: by a transaction the reading lists, or by one that had ended.
//! - The reading takes no lock on a sequence but AccessShareLock (never
//!   `pg_sequence_last_value()`), and leaves out its own session, so the
//!   healer never reads itself as a writer.
//! - A reading answers a store only if it began no earlier than the
//!   store's `not_before` and read that store's sequence.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::Type;
use tokio_postgres::SimpleQueryMessage;

use super::conn::Manager;
use super::errors::{db_error, get};
use super::sql::{HANDED_OUT, IDENTITY_SEQUENCE, TRANSACTIONS};
use crate::engine::pool::Pool;
use crate::engine::{DbError, DbResult, OpenTransaction, OpenTransactions, TransactionReading};
use crate::secret::ConnectionString;

/// A store that asked for a reading this recently is read with the others,
/// so stores whose holes wait poll after poll share one reading.
const INTEREST: Duration = Duration::from_secs(60);

/// The readings of the stores of one pool.
pub(crate) struct Transactions {
    pool: Arc<Pool<Manager>>,
    /// For error messages, free of the password.
    cs: ConnectionString,
    members: Mutex<HashMap<u64, Member>>,
    /// Held while a reading is taken: stores that ask meanwhile wait for it.
    last: tokio::sync::Mutex<Option<Reading>>,
    next_id: AtomicU64,
    /// Readings sent to the server.
    readings: AtomicU64,
}

struct Member {
    /// The healed table's qualified name and position column, as the
    /// catalog functions take them.
    table: String,
    position: String,
    /// Its sequence, once resolved (again after a reading failed).
    sequence: Option<Sequence>,
    /// When it last asked for a reading.
    asked: Option<Instant>,
}

#[derive(Clone)]
struct Sequence {
    oid: u32,
    /// As the catalog quotes it: spliced into `handed_out.sql`.
    name: String,
    /// This login may read it (SELECT).
    readable: bool,
}

/// What a reading found for one member: how far its sequence had handed
/// out (`None`: not readable) and the transactions holding it.
type Found = DbResult<(Option<i64>, Vec<OpenTransaction>)>;

struct Reading {
    began: Instant,
    /// Each member read, or why the reading failed as a whole.
    found: Result<HashMap<u64, Found>, DbError>,
}

impl Transactions {
    pub(crate) fn new(pool: Arc<Pool<Manager>>, cs: ConnectionString) -> Self {
        Transactions {
            pool,
            cs,
            members: Mutex::new(HashMap::new()),
            last: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(0),
            readings: AtomicU64::new(0),
        }
    }

    /// Joins the store whose positions are `position` of `table`.
    pub(crate) fn join(self: &Arc<Self>, table: String, position: String) -> Membership {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.members().insert(
            id,
            Member {
                table,
                position,
                sequence: None,
                asked: None,
            },
        );
        Membership {
            shared: self.clone(),
            id,
        }
    }

    fn members(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Member>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn error(&self, e: &tokio_postgres::Error, during: &str) -> DbError {
        db_error(&self.cs, e, during)
    }

    /// One reading for every member that asked within [`INTEREST`] of
    /// `now`. A member whose sequence cannot be resolved (its table gone)
    /// is answered with that error and left out; the others are read.
    async fn read(&self, now: Instant) -> Result<HashMap<u64, Found>, DbError> {
        let conn = self.pool.checkout().await?;
        let wanted: Vec<(u64, String, String, Option<Sequence>)> = self
            .members()
            .iter()
            .filter(|(_, m)| m.asked.is_some_and(|a| now.duration_since(a) <= INTEREST))
            .map(|(id, m)| (*id, m.table.clone(), m.position.clone(), m.sequence.clone()))
            .collect();
        let mut found: HashMap<u64, Found> = HashMap::with_capacity(wanted.len());
        let mut sequences: Vec<(u64, Sequence)> = Vec::with_capacity(wanted.len());
        for (id, table, position, known) in wanted {
            let sequence = match known {
                Some(s) => s,
                None => match self.resolve(&conn, &table, &position).await {
                    Ok(s) => {
                        if let Some(m) = self.members().get_mut(&id) {
                            m.sequence = Some(s.clone());
                        }
                        s
                    }
                    Err(e) => {
                        found.insert(id, Err(e));
                        continue;
                    }
                },
            };
            sequences.push((id, sequence));
        }
        if sequences.is_empty() {
            return Ok(found);
        }
        self.readings.fetch_add(1, Ordering::Relaxed);
        let handed = self.handed_out(&conn, &sequences).await?;
        let oids: Vec<u32> = sequences.iter().map(|(_, s)| s.oid).collect();
        let rows = conn
            .query_typed(TRANSACTIONS.as_str(), &[(&oids, Type::OID_ARRAY)])
            .await
            .map_err(|e| self.error(&e, "open transactions"))?;
        let mut by_oid: HashMap<u32, Vec<OpenTransaction>> = HashMap::new();
        for row in &rows {
            let session: Option<i32> = get(row, "pid")?;
            by_oid
                .entry(get(row, "sequence")?)
                .or_default()
                .push(OpenTransaction {
                    id: get(row, "id")?,
                    xid: get(row, "xid")?,
                    session: session.map(i64::from),
                    application: get::<Option<String>>(row, "application")?
                        .filter(|a| !a.is_empty()),
                });
        }
        for (n, (id, s)) in sequences.iter().enumerate() {
            let open = by_oid.get(&s.oid).cloned().unwrap_or_default();
            found.insert(*id, Ok((handed.get(n).copied().flatten(), open)));
        }
        Ok(found)
    }

    /// The sequence `position` of `table` is drawn from.
    async fn resolve(
        &self,
        conn: &tokio_postgres::Client,
        table: &str,
        position: &str,
    ) -> DbResult<Sequence> {
        let row = conn
            .query_opt(IDENTITY_SEQUENCE, &[&table, &position])
            .await
            .map_err(|e| self.error(&e, "open transactions: the identity's sequence"))?
            .ok_or_else(|| {
                DbError::permanent(format!(
                    "open transactions: {table}.{position} draws from no sequence"
                ))
                .during("open transactions")
            })?;
        Ok(Sequence {
            oid: get(&row, "oid")?,
            name: get(&row, "name")?,
            readable: get(&row, "readable")?,
        })
    }

    /// How far each readable sequence had handed out, by its place in
    /// `sequences` (`None`: not readable).
    async fn handed_out(
        &self,
        conn: &tokio_postgres::Client,
        sequences: &[(u64, Sequence)],
    ) -> Result<Vec<Option<i64>>, DbError> {
        let parts: Vec<String> = sequences
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| s.readable)
            .map(|(n, (_, s))| {
                HANDED_OUT
                    .replace("__n__", &n.to_string())
                    .replace("__sequence__", &s.name)
            })
            .collect();
        let mut handed = vec![None; sequences.len()];
        if parts.is_empty() {
            return Ok(handed);
        }
        let messages = conn
            .simple_query(&parts.join("\nUNION ALL\n"))
            .await
            .map_err(|e| self.error(&e, "open transactions: how far the identity handed out"))?;
        for message in messages {
            let SimpleQueryMessage::Row(row) = message else {
                continue;
            };
            let column = |name: &str| {
                row.try_get(name)
                    .ok()
                    .flatten()
                    .ok_or_else(|| unexpected(name))
            };
            let n: usize = column("n")?.parse().map_err(|_| unexpected("n"))?;
            let h: i64 = column("h")?.parse().map_err(|_| unexpected("h"))?;
            *handed.get_mut(n).ok_or_else(|| unexpected("n"))? = Some(h);
        }
        Ok(handed)
    }
}

fn unexpected(what: &str) -> DbError {
    DbError::transient(format!("open transactions: unexpected {what}")).during("open transactions")
}

/// A store's place in its pool's readings; leaves them when dropped.
pub(crate) struct Membership {
    shared: Arc<Transactions>,
    id: u64,
}

impl Membership {
    /// The store's part of a reading that began no earlier than
    /// `not_before`, taking one when there is none.
    pub(crate) async fn reading(&self, not_before: Instant) -> DbResult<OpenTransactions> {
        if let Some(m) = self.shared.members().get_mut(&self.id) {
            m.asked = Some(Instant::now());
        }
        let mut last = self.shared.last.lock().await;
        if let Some(found) = last.as_ref().and_then(|r| self.from(r, not_before)) {
            return found;
        }
        let began = Instant::now();
        let found = self.shared.read(began).await;
        if found.is_err() {
            // Rights or names may have changed: resolve them again.
            for m in self.shared.members().values_mut() {
                m.sequence = None;
            }
        }
        let reading = Reading { began, found };
        let answer = self.from(&reading, not_before).unwrap_or_else(|| {
            Err(DbError::transient(
                "open transactions: the reading did not read this store's sequence",
            )
            .during("open transactions"))
        });
        *last = Some(reading);
        answer
    }

    /// Readings the store's pool has sent (for tests and diagnostics).
    pub(crate) fn readings(&self) -> u64 {
        self.shared.readings.load(Ordering::Relaxed)
    }

    /// What `reading` says of the store; `None` when it cannot answer (it
    /// began before `not_before`, or without the store).
    fn from(&self, reading: &Reading, not_before: Instant) -> Option<DbResult<OpenTransactions>> {
        if reading.began < not_before {
            return None;
        }
        match &reading.found {
            Ok(found) => found.get(&self.id).map(|answer| match answer {
                Ok((handed_out, open)) => Ok(OpenTransactions::Read(TransactionReading {
                    began: reading.began,
                    handed_out: *handed_out,
                    open: open.clone(),
                })),
                Err(e) => Err(e.clone()),
            }),
            Err(e) => Some(Err(e.clone())),
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.shared.members().remove(&self.id);
    }
}
