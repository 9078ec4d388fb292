//! The leader lock: `pg_try_advisory_lock` on a session opened for it alone,
//! outside the pool. Winning it yields a [`FenceToken`] (the session's
//! backend pid and the leader key) that fills check inside their
//! transaction (`sql/postgres/leader_check.sql`, the same question the
//! leader's once-a-second heartbeat asks on its own session).

use super::errors::get;
use super::sql::{LEADER_CHECK, LEADER_LOCK, ROLL, ROLL_JOIN};
use super::PostgresEngine;
use crate::engine::{DbResult, FenceToken, LeaderLock, LeaderSession};
use crate::replicas::{Replica, Roll};

/// The first key of the two-key advisory locks that put a lock session on
/// its database's roll `roll` of replicas (the second is the replica's
/// number): a class no leader lock uses (those take one bigint key), with
/// the roll's 30 low bits, so the daemons of one configuration see each
/// other and no other daemon.
pub fn roll_class(roll: u32) -> i32 {
    (0x4000_0000 | (roll & 0x3fff_ffff)) as i32
}

/// The advisory lock key for a leader lock name: FNV-1a, stable across
/// versions and processes, so every healer of a store computes the same one.
pub fn advisory_key(name: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

/// A dedicated session for `pg_try_advisory_lock`; dropping it closes the
/// session, and the server releases the lock.
pub struct PgLeaderSession {
    client: tokio_postgres::Client,
    /// The session's backend pid: what the fill fence checks.
    pid: i32,
    /// The leader key, once this session tried it.
    key: String,
    connection: tokio::task::JoinHandle<()>,
}

impl PgLeaderSession {
    /// The server process of the session (`pg_backend_pid()`), for logs and tests.
    pub fn backend_pid(&self) -> i32 {
        self.pid
    }
}

impl LeaderSession for PgLeaderSession {
    fn fence_token(&self) -> FenceToken {
        FenceToken {
            session_id: i64::from(self.pid),
            lock: self.key.clone(),
        }
    }
}

impl Drop for PgLeaderSession {
    fn drop(&mut self) {
        // Closing the session releases the lock on the server.
        self.connection.abort();
    }
}

impl LeaderLock for PostgresEngine {
    type Session = PgLeaderSession;

    async fn open_session(&self, key: &str) -> DbResult<PgLeaderSession> {
        let (client, connection) = self.target.connect_dedicated().await?;
        Ok(PgLeaderSession {
            client,
            pid: 0,
            key: key.to_string(),
            connection,
        })
    }

    fn reusable(&self, session: &PgLeaderSession) -> bool {
        !session.client.is_closed()
    }

    async fn try_lock(
        &self,
        mut session: PgLeaderSession,
        key: &str,
    ) -> DbResult<(bool, PgLeaderSession)> {
        let row = session
            .client
            .query_one(LEADER_LOCK, &[&advisory_key(key)])
            .await
            .map_err(|e| self.error(&e, "leader lock"))?;
        session.pid = get(&row, "session_id")?;
        session.key = key.to_string();
        Ok((get(&row, "taken")?, session))
    }

    async fn unlock(&self, session: &mut PgLeaderSession, key: &str) -> DbResult<()> {
        let row = session
            .client
            .query_one(
                "SELECT PG_ADVISORY_UNLOCK($1::bigint) AS released",
                &[&advisory_key(key)],
            )
            .await
            .map_err(|e| self.error(&e, "leader unlock"))?;
        let _: bool = get(&row, "released")?;
        Ok(())
    }

    async fn join_roll(&self, session: &mut PgLeaderSession, me: Replica) -> DbResult<bool> {
        let row = session
            .client
            .query_one(ROLL_JOIN, &[&roll_class(me.roll), &(me.number as i32)])
            .await
            .map_err(|e| self.error(&e, "joining the roll of replicas"))?;
        get(&row, "joined")
    }

    async fn read_roll(
        &self,
        session: &mut PgLeaderSession,
        me: Replica,
    ) -> DbResult<Option<Roll>> {
        let row = session
            .client
            .query_one(ROLL, &[&roll_class(me.roll)])
            .await
            .map_err(|e| self.error(&e, "reading the roll of replicas"))?;
        let replicas: Vec<i64> = get(&row, "replicas")?;
        let held: Vec<i64> = get(&row, "held")?;
        Ok(Some(Roll {
            replicas: replicas
                .into_iter()
                .map(|r| Replica::new(me.roll, r as u32))
                .collect(),
            held: held.into_iter().collect(),
        }))
    }

    fn roll_id(&self, key: &str) -> i64 {
        advisory_key(key)
    }

    async fn still_held(&self, session: &mut PgLeaderSession, key: &str) -> DbResult<bool> {
        // The same question the fill fence asks, from the session itself.
        let row = session
            .client
            .query_one(LEADER_CHECK, &[&session.pid, &advisory_key(key)])
            .await
            .map_err(|e| self.error(&e, "leader heartbeat"))?;
        get(&row, "held")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advisory_key_is_stable() {
        assert_eq!(
            advisory_key("gap-healer:eventuous"),
            advisory_key("gap-healer:eventuous")
        );
        assert_ne!(
            advisory_key("gap-healer:eventuous"),
            advisory_key("gap-healer:other")
        );
        // Pinned: healers of different versions must agree on the key.
        assert_eq!(advisory_key(""), 0xcbf2_9ce4_8422_2325_u64 as i64);
    }
}
