//! One leader lock session for every store of a SQL Server instance (the
//! same server, login and options; any database), as PostgreSQL's stores
//! of one database share one ([`SharedLock`]).
//!
//! Without it each store kept a lock session of its own beside its pool's:
//! 200 tenant databases of one Babelfish instance needed about 401
//! sessions, past Babelfish's default `max_connections`, and on SQL Server
//! 200 idle logins. Now they need one.
//!
//! SQL Server scopes application locks to the current database, so the
//! shared session takes, tests and gives up each store's lock (and its
//! fence lock) in that store's database, through the database's
//! `sp_executesql` ([`sql::in_database`]): a store's lock is the same lock,
//! in the same database and under the same name, as a healer with a lock
//! session of its own takes, so healers of either kind exclude each other.
//! Its fence lock is taken there too, where the store's fills test it.
//! Babelfish keeps every application lock as a server-wide advisory lock
//! whose name carries the database ([`super::Server::leader_lock_name`]),
//! so there the batches run as they are, wherever the session is.
//!
//! Should a SQL Server refuse the batch run in another database, the store
//! leads on a session of its own, as before this module: a failure of the
//! shared path costs a session, never the store's leadership.
//!
//! Invariants:
//! - A store's lock is named by the database its own sessions report
//!   (`DB_NAME()`) and its leader key, exactly as on a session of its own.
//! - Giving up one store's lock releases its fence before its leader lock
//!   (`leader_release.sql`) and keeps the session: the other stores' locks
//!   stay. The session is dropped (every lock on it goes, every store on it
//!   steps down) only when it fails.
//! - A store whose lock the shared session cannot take in its database (a
//!   server that refuses other databases' procedures, as Azure SQL
//!   Database does; a login that cannot reach it) leads on a session of its
//!   own from then on, without failing the shared session.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::leader::{check_leader_key, Site};
use super::{MssqlEngine, MssqlLeaderSession};
use crate::engine::shared_lock::{SharedLock, SharedPart};
use crate::engine::{DbError, DbResult, FenceToken, LeaderLock, LeaderSession};

/// A store's lock as the shared session knows it: the database it lives in
/// and its application lock's name there. Passed through [`SharedLock`] as
/// one string (its key) that names both without ambiguity.
#[derive(Clone, Debug, PartialEq, Eq)]
struct StoreKey {
    database: String,
    name: String,
}

impl StoreKey {
    /// `[database]/name`, the database quoted as `QUOTENAME` quotes it
    /// (`]` doubled), so no database and name pair reads as another.
    fn encode(&self) -> String {
        format!("[{}]/{}", self.database.replace(']', "]]"), self.name)
    }

    fn decode(key: &str) -> DbResult<StoreKey> {
        let bad = || DbError::permanent("an instance lock key is not [database]/name");
        let rest = key.strip_prefix('[').ok_or_else(bad)?;
        let mut database = String::new();
        let mut chars = rest.char_indices();
        while let Some((i, c)) = chars.next() {
            if c != ']' {
                database.push(c);
                continue;
            }
            if rest[i + 1..].starts_with(']') {
                database.push(']');
                chars.next();
                continue;
            }
            let name = rest[i + 1..].strip_prefix('/').ok_or_else(bad)?;
            return Ok(StoreKey {
                database,
                name: name.to_string(),
            });
        }
        Err(bad())
    }
}

/// The lock an instance's stores share one session of: each store's lock
/// in its own database ([`StoreKey`]), on the session.
pub struct InstanceLock {
    /// The first store's engine: its login and options (the instance's),
    /// and what the server is.
    engine: Arc<MssqlEngine>,
    /// The keys whose database refused the shared session's lock batch.
    refused: Mutex<HashSet<String>>,
}

/// The instance's lock session, and the fence lock it took with each
/// store's lock.
pub struct InstanceSession {
    session: MssqlLeaderSession,
    fences: HashMap<String, String>,
}

impl LeaderSession for InstanceSession {
    /// The fence of the lock this session took last ([`SharedLock`] reads
    /// it right after the try that took it).
    fn fence_token(&self) -> FenceToken {
        self.session.fence_token()
    }
}

impl InstanceLock {
    pub fn new(engine: Arc<MssqlEngine>) -> InstanceLock {
        InstanceLock {
            engine,
            refused: Mutex::new(HashSet::new()),
        }
    }

    /// Whether the lock batch for `key` was refused in its database.
    fn was_refused(&self, key: &str) -> bool {
        self.refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(key)
    }

    /// Where `key`'s lock batches run: in its database on SQL Server; on
    /// Babelfish wherever the session is, since its application locks are
    /// server-wide and their names carry the database (and it runs no
    /// other database's `sys.sp_executesql`, nor `EXEC @variable`:
    /// "procedure ... does not exist", Babelfish 4.2).
    async fn site<'a>(&self, key: &'a StoreKey) -> DbResult<Site<'a>> {
        let babelfish = self.engine.server().await?.babelfish.is_some();
        Ok(Site {
            babelfish,
            database: (!babelfish).then_some(key.database.as_str()),
        })
    }
}

impl LeaderLock for InstanceLock {
    type Session = InstanceSession;

    /// A session in the database of the first store that asks.
    async fn open_session(&self, key: &str) -> DbResult<InstanceSession> {
        let key = StoreKey::decode(key)?;
        let session = self
            .engine
            .within_connect_timeout(self.engine.connect_leader_session(Some(&key.database)))
            .await?;
        Ok(InstanceSession {
            session,
            fences: HashMap::new(),
        })
    }

    fn reusable(&self, session: &InstanceSession) -> bool {
        LeaderLock::reusable(&*self.engine, &session.session)
    }

    /// The store's lock in its database. A refusal by the server there is
    /// no error of the session's: the try answers "not taken", the session
    /// is kept for the other stores, and the key is marked refused (the
    /// store then leads on a session of its own, [`MssqlStoreLock`]).
    async fn try_lock(
        &self,
        mut session: InstanceSession,
        key: &str,
    ) -> DbResult<(bool, InstanceSession)> {
        let store = StoreKey::decode(key)?;
        let site = self.site(&store).await?;
        let taken = self
            .engine
            .within_connect_timeout(
                self.engine
                    .take_lock(&mut session.session, &store.name, site),
            )
            .await;
        match taken {
            Ok(taken) => {
                if taken {
                    session
                        .fences
                        .insert(key.to_string(), session.session.fence().to_string());
                }
                Ok((taken, session))
            }
            // The server refused the batch in this store's database and
            // the session is sound (SQL Server only: take_lock leaves a
            // Babelfish session in doubt after any error).
            Err(e) if LeaderLock::reusable(&*self.engine, &session.session) => {
                tracing::warn!(
                    database = %store.database,
                    error = %e,
                    "the shared leader lock session could not take a store's lock in its database"
                );
                self.refused
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key.to_string());
                Ok((false, session))
            }
            Err(e) => Err(e),
        }
    }

    async fn still_held(&self, session: &mut InstanceSession, key: &str) -> DbResult<bool> {
        let store = StoreKey::decode(key)?;
        let site = self.site(&store).await?;
        self.engine
            .lock_held(&mut session.session, &store.name, site)
            .await
    }

    async fn unlock(&self, session: &mut InstanceSession, key: &str) -> DbResult<()> {
        let store = StoreKey::decode(key)?;
        let site = self.site(&store).await?;
        let Some(fence) = session.fences.remove(key) else {
            return Err(DbError::permanent(
                "no fence lock is known for this store's leader lock",
            ));
        };
        self.engine
            .drop_lock(&mut session.session, &store.name, &fence, site)
            .await
    }
}

/// A store's leader lock on SQL Server: its part of the instance's shared
/// lock session, or (when the instance is unknown, or the shared session
/// was refused in the store's database) a lock session of its own.
pub struct MssqlStoreLock {
    engine: Arc<MssqlEngine>,
    shared: Option<Arc<SharedLock<InstanceLock>>>,
    /// Set once the shared session was refused in the store's database.
    alone: AtomicBool,
    /// The store's key on the instance's session, once known (it is asked
    /// at every check, once a second).
    store_key: std::sync::OnceLock<String>,
}

/// A store's lock session: its part of the instance's, or its own.
pub enum StoreLockSession {
    Shared(SharedPart),
    /// Boxed: a session of its own is the rare case.
    Own(Box<MssqlLeaderSession>),
}

impl LeaderSession for StoreLockSession {
    fn fence_token(&self) -> FenceToken {
        match self {
            StoreLockSession::Shared(part) => part.fence_token(),
            StoreLockSession::Own(session) => session.fence_token(),
        }
    }
}

impl MssqlStoreLock {
    /// `engine`'s lock, on `shared` (its instance's lock session) if any.
    pub fn new(
        engine: Arc<MssqlEngine>,
        shared: Option<Arc<SharedLock<InstanceLock>>>,
    ) -> MssqlStoreLock {
        MssqlStoreLock {
            engine,
            shared,
            alone: AtomicBool::new(false),
            store_key: std::sync::OnceLock::new(),
        }
    }

    /// The instance's session, unless this store leads alone.
    fn shared(&self) -> Option<&SharedLock<InstanceLock>> {
        self.shared
            .as_deref()
            .filter(|_| !self.alone.load(Ordering::SeqCst))
    }

    /// The key the instance's session knows the store's lock by: its
    /// database, as its own sessions report it, and the name a session of
    /// its own would take.
    /// (The store's leader key is the same at every call: the election
    /// has one.)
    async fn store_key(&self, key: &str) -> DbResult<&str> {
        if let Some(known) = self.store_key.get() {
            return Ok(known);
        }
        let server = self.engine.server().await?;
        let name = server.leader_lock_name(key);
        check_leader_key(&name)?;
        let encoded = StoreKey {
            database: server.database,
            name,
        }
        .encode();
        Ok(self.store_key.get_or_init(|| encoded))
    }
}

impl LeaderLock for MssqlStoreLock {
    type Session = StoreLockSession;

    async fn open_session(&self, key: &str) -> DbResult<StoreLockSession> {
        check_leader_key(key)?;
        match self.shared() {
            Some(shared) => Ok(StoreLockSession::Shared(shared.open_session(key).await?)),
            None => Ok(StoreLockSession::Own(Box::new(
                self.engine.open_session(key).await?,
            ))),
        }
    }

    fn reusable(&self, session: &StoreLockSession) -> bool {
        match session {
            StoreLockSession::Shared(_) => self.shared().is_some(),
            StoreLockSession::Own(own) => LeaderLock::reusable(&*self.engine, own),
        }
    }

    async fn try_lock(
        &self,
        session: StoreLockSession,
        key: &str,
    ) -> DbResult<(bool, StoreLockSession)> {
        let part = match (session, self.shared()) {
            (StoreLockSession::Shared(part), Some(shared)) => {
                let store = self.store_key(key).await?;
                let (taken, part) = shared.try_lock(part, store).await?;
                if taken || !shared.inner().was_refused(store) {
                    return Ok((taken, StoreLockSession::Shared(part)));
                }
                self.alone.store(true, Ordering::SeqCst);
                tracing::warn!(
                    key,
                    "the instance's shared leader lock session could not take this store's lock \
                     in its database; the store leads on a lock session of its own"
                );
                None
            }
            (StoreLockSession::Own(own), _) => Some(*own),
            (StoreLockSession::Shared(_), None) => None,
        };
        let own = match part {
            Some(own) => own,
            None => self.engine.open_session(key).await?,
        };
        let (taken, own) = self.engine.try_lock(own, key).await?;
        Ok((taken, StoreLockSession::Own(Box::new(own))))
    }

    async fn still_held(&self, session: &mut StoreLockSession, key: &str) -> DbResult<bool> {
        match session {
            StoreLockSession::Shared(part) => match &self.shared {
                Some(shared) => {
                    let store = self.store_key(key).await?;
                    shared.still_held(part, store).await
                }
                None => Ok(false),
            },
            StoreLockSession::Own(own) => self.engine.still_held(&mut **own, key).await,
        }
    }

    async fn release(&self, session: StoreLockSession, key: &str) {
        match (session, &self.shared) {
            (StoreLockSession::Shared(part), Some(shared)) => match self.store_key(key).await {
                Ok(store) => shared.release(part, store).await,
                Err(e) => {
                    tracing::warn!(key, error = %e, "could not name this store's lock to release it");
                }
            },
            (session, _) => drop(session),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_key_names_its_database_and_lock_without_ambiguity() {
        let pairs = [
            ("tenant_1", "gap-healer:eventuous"),
            ("a/b", "c"),
            ("a", "b/c"),
            ("we]ird]]", "x]/y"),
            ("", "k"),
            ("Жук", "😀"),
        ];
        let mut seen = HashSet::new();
        for (database, name) in pairs {
            let key = StoreKey {
                database: database.into(),
                name: name.into(),
            };
            let encoded = key.encode();
            assert!(seen.insert(encoded.clone()), "{encoded}");
            assert_eq!(StoreKey::decode(&encoded).unwrap(), key, "{encoded}");
        }
        assert_eq!(
            StoreKey {
                database: "tenant_1".into(),
                name: "gap-healer:eventuous".into()
            }
            .encode(),
            "[tenant_1]/gap-healer:eventuous"
        );
        for bad in ["", "tenant/x", "[tenant", "[tenant]x", "[a]]/x"] {
            assert!(StoreKey::decode(bad).is_err(), "{bad}");
        }
    }
}
