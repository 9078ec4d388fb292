//! The leader lock: `sp_getapplock` (Exclusive, owner Session, no wait) on a
//! session opened for it alone, outside the pool
//! (`sql/mssql/leader_lock.sql`); the leader checks every second with
//! `APPLOCK_MODE` on that session (`sql/mssql/leader_check.sql`). Dropping
//! the [`MssqlLeaderSession`] closes its connection, and the server releases
//! a session's application locks when the session ends. An application lock
//! is no write: it touches no table.
//!
//! # The fence
//! A healer whose lock session alone died (KILL, a dropped connection) keeps
//! filling through its pool until its next check notices, while another
//! healer may already have taken the lock. So the lock session also takes a
//! second application lock with a fresh, random name (the fence lock); the
//! winning session's [`FenceToken`] carries its name, and every fill fenced
//! by that token checks inside its transaction, after the tombstone
//! stream's row is locked, that `APPLOCK_TEST` finds the fence lock held, or
//! rolls back and reports [`crate::engine::FillOutcome::Busy`]. A pooled
//! session cannot ask whether session N holds the leader lock without VIEW
//! SERVER STATE (sys.dm_tran_locks; `APPLOCK_MODE` answers for the caller's
//! own session only), but any session may ask whether a lock that only
//! session N holds is held. Running fills on the lock session itself was
//! the other way; it would put every fill's lock waits in front of the
//! once-a-second check and lose leadership with every abandoned fill.
//!
//! # Babelfish
//! Babelfish keeps an application lock as a PostgreSQL advisory lock whose
//! key is a hash of its name ([`AppLockKey`]), and there every
//! `APPLOCK_TEST` or `sp_getapplock` that finds a lock held leaves an entry
//! on the session's error stack: the fifth crashes the whole server
//! ("PANIC: ERRORDATA_STACK_SIZE exceeded", Babelfish 4.2). So on Babelfish
//! neither ever meets a held lock of ours: a follower looks at
//! `pg_catalog.pg_locks` for the leader lock's key before it asks for the
//! lock, and keeps its session for the next try (it logs in again only
//! when the lock was taken between its look and its request, which
//! `sp_getapplock` answers with -999); and the fence tests in `pg_locks`
//! that the leader's session (`@@SPID`, its backend's pid) still holds the
//! fence lock's key, which it stops holding before PostgreSQL stops listing
//! the session. The session that takes the lock checks there once that it
//! holds both keys as computed.

use std::fmt;

use super::conn::{self, Client};
use super::errors::{applock_result, LOCK_TIMEOUT};
use super::sql::{babelfish_leader_lock, AppLockKey, LEADER_KEYS_BABELFISH};
use super::{get, get_integer, run, sql, MssqlEngine};
use crate::engine::{DbError, DbResult, FenceToken, LeaderLock, LeaderSession};

/// The longest leader key `sp_getapplock` takes whole: its `@Resource` is
/// NVARCHAR(255), counted in UTF-16 code units, and it silently truncates
/// longer names (two keys that share their first 255 units would then be one
/// lock). Longer keys are refused instead.
pub const MAX_LEADER_KEY_UNITS: usize = 255;

pub(super) fn check_leader_key(key: &str) -> DbResult<()> {
    let units = key.encode_utf16().count();
    if units == 0 || units > MAX_LEADER_KEY_UNITS {
        return Err(DbError::permanent(format!(
            "the leader key must be 1 to {MAX_LEADER_KEY_UNITS} UTF-16 code units for sp_getapplock; it has {units}"
        )));
    }
    Ok(())
}

/// `APPLOCK_MODE`'s answer on the leader's session: only `Exclusive` means
/// the lock is held (`NoLock` or anything else: it is not).
fn lock_mode_is_held(mode: Option<&str>) -> bool {
    mode == Some("Exclusive")
}

/// The dedicated session that holds the SQL Server leader lock.
///
/// Its own connection, never a pooled one. Dropping it closes the connection;
/// SQL Server then ends the session and releases its application locks.
pub struct MssqlLeaderSession {
    client: Client,
    /// `@@SPID`: smallint on SQL Server, int on Babelfish.
    session_id: i64,
    /// The name of the fence lock this session holds besides the leader lock.
    fence: String,
    /// A query on this session started and did not complete (its future was
    /// dropped by a timeout, or it failed): the session is not trusted again,
    /// and every later check is an error.
    in_doubt: bool,
}

impl MssqlLeaderSession {
    /// `@@SPID` of the session, as the lock batch reported it (for logs, and
    /// for tests that KILL it).
    pub fn session_id(&self) -> i64 {
        self.session_id
    }

    /// The name of the fence lock this session holds (see the module doc).
    pub fn fence(&self) -> &str {
        &self.fence
    }
}

impl LeaderSession for MssqlLeaderSession {
    /// The fence is the session's own fence lock: any pooled session may
    /// ask whether it is still held (`APPLOCK_TEST`), and only this session
    /// can hold it.
    fn fence_token(&self) -> FenceToken {
        FenceToken {
            session_id: self.session_id,
            lock: self.fence.clone(),
        }
    }
}

impl fmt::Debug for MssqlLeaderSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MssqlLeaderSession")
            .field("session_id", &self.session_id)
            .field("fence", &self.fence)
            .field("in_doubt", &self.in_doubt)
            .finish_non_exhaustive()
    }
}

/// Where a lock batch runs: on SQL Server or Babelfish, and in the
/// session's own database or, through that database's `sp_executesql`,
/// in the database of the store whose lock it is (a lock session the
/// stores of one instance share; SQL Server scopes application locks to
/// the current database).
#[derive(Clone, Copy, Debug)]
pub(super) struct Site<'a> {
    pub babelfish: bool,
    pub database: Option<&'a str>,
}

/// The batches a lock session sends, each with its parameters' declaration
/// and count (as [`sql::in_database`] takes them).
#[derive(Clone, Copy)]
enum Batch {
    Lock,
    BabelfishLock,
    Check,
    Release,
}

impl Batch {
    const ALL: [Batch; 4] = [
        Batch::Lock,
        Batch::BabelfishLock,
        Batch::Check,
        Batch::Release,
    ];

    fn text(self) -> (String, &'static str, usize) {
        match self {
            Batch::Lock => (sql::LEADER_LOCK.to_string(), "@P1 NVARCHAR(255)", 1),
            Batch::BabelfishLock => (
                babelfish_leader_lock(),
                "@P1 NVARCHAR(255), @P2 BIGINT, @P3 BIGINT",
                3,
            ),
            Batch::Check => (sql::LEADER_CHECK.to_string(), "@P1 NVARCHAR(255)", 1),
            Batch::Release => (
                sql::LEADER_RELEASE.to_string(),
                "@P1 NVARCHAR(255), @P2 NVARCHAR(255)",
                2,
            ),
        }
    }
}

/// Every batch as sent in the session's own database (`[0]`) and in a
/// store's (`[1]`), rendered once: a follower tries its locks every
/// second, and the leaders' sessions check theirs as often.
static BATCHES: std::sync::LazyLock<[[String; 2]; 4]> = std::sync::LazyLock::new(|| {
    Batch::ALL.map(|batch| {
        let (text, declared, n) = batch.text();
        let elsewhere = sql::in_database(&text, declared, n);
        [text, elsewhere]
    })
});

impl Site<'_> {
    /// `batch` as this site runs it.
    fn batch(&self, batch: Batch) -> &'static str {
        &BATCHES[batch as usize][usize::from(self.database.is_some())]
    }

    /// `params`, and the database after them when the batch runs in one.
    fn params<'p>(&'p self, params: &[&'p dyn tiberius::ToSql]) -> Vec<&'p dyn tiberius::ToSql> {
        let mut all = params.to_vec();
        if let Some(database) = &self.database {
            all.push(database);
        }
        all
    }
}

/// Whether the one row a check or a release answered names the lock
/// `Exclusive`ly held (`what`: the batch, for the error).
fn held_by_answer(sets: &[Vec<tiberius::Row>], what: &str) -> DbResult<bool> {
    let row = sets
        .first()
        .and_then(|rows| rows.first())
        .ok_or_else(|| DbError::permanent(format!("the leader {what} returned no row")))?;
    Ok(lock_mode_is_held(get::<&str>(row, "lock_mode")?))
}

impl MssqlEngine {
    /// A session of its own for the leader lock, outside the pool: in the
    /// engine's database, or in `database` (the first store of an instance
    /// that asks for the session the instance's stores share).
    pub(super) async fn connect_leader_session(
        &self,
        database: Option<&str>,
    ) -> DbResult<MssqlLeaderSession> {
        let client = match database {
            Some(database) => {
                let mut config = self.config.clone();
                config.database(database);
                conn::connect(&config, &self.settings.connection_string).await?
            }
            None => conn::connect(&self.config, &self.settings.connection_string).await?,
        };
        Ok(MssqlLeaderSession {
            client,
            session_id: 0,
            fence: String::new(),
            in_doubt: false,
        })
    }

    /// Runs the lock batch on `session` for the store's own leader key.
    async fn lock_on(
        &self,
        mut session: MssqlLeaderSession,
        key: &str,
    ) -> DbResult<(bool, MssqlLeaderSession)> {
        let server = self.server().await?;
        let name = server.leader_lock_name(key);
        check_leader_key(&name)?;
        let site = Site {
            babelfish: server.babelfish.is_some(),
            database: None,
        };
        let taken = self.take_lock(&mut session, &name, site).await?;
        Ok((taken, session))
    }

    /// Runs the lock batch on `session` at `site`: whether it took the
    /// application lock `name` (and with it a fence lock, whose name the
    /// session keeps). After an error the session is in doubt, unless the
    /// server answered it on SQL Server (the session is sound: the batch
    /// was refused), where the caller may keep it.
    pub(super) async fn take_lock(
        &self,
        session: &mut MssqlLeaderSession,
        name: &str,
        site: Site<'_>,
    ) -> DbResult<bool> {
        session.in_doubt = true;
        let babelfish = site.babelfish;
        let key = AppLockKey::of(name);
        let (classid, objid) = (i64::from(key.classid), i64::from(key.objid));
        let batch = site.batch(if babelfish {
            Batch::BabelfishLock
        } else {
            Batch::Lock
        });
        let own: [&dyn tiberius::ToSql; 3] = [&name, &classid, &objid];
        let params = site.params(if babelfish { &own } else { &own[..1] });
        let sets = match run(&mut session.client, batch, &params).await {
            Ok(sets) => sets,
            // @LockTimeout = 0 reports a held lock as -1, not as an error;
            // should a server raise 1222 instead, it means the same.
            Err(tiberius::error::Error::Server(token)) if token.code() == LOCK_TIMEOUT => {
                session.in_doubt = false;
                return Ok(false);
            }
            // Babelfish keeps an entry on the session's error stack for
            // every error (see above): such a session stays in doubt.
            Err(e @ tiberius::error::Error::Server(_)) => {
                session.in_doubt = babelfish;
                return Err(self.driver_error(&e));
            }
            Err(e) => return Err(self.driver_error(&e)),
        };
        let row = sets
            .first()
            .and_then(|rows| rows.first())
            .ok_or_else(|| DbError::permanent("the leader lock batch returned no row"))?;
        let code = get::<i32>(row, "lock_result")?
            .ok_or_else(|| DbError::permanent("sp_getapplock returned no code"))?;
        session.session_id = get_integer(row, "session_id")?.unwrap_or(0);
        // On Babelfish a session whose sp_getapplock found the lock held
        // (-999: taken between the batch's look at pg_locks and its
        // request) is not tried again: that answer left an entry on its
        // error stack, and the fifth crashes the server ("PANIC:
        // ERRORDATA_STACK_SIZE exceeded", Babelfish 4.2). A follower that
        // saw the lock held in pg_locks asked nothing and keeps its session,
        // as every SQL Server follower does.
        session.in_doubt = get::<i32>(row, "refused")?.is_some() && babelfish;
        if !applock_result(code)? {
            return Ok(false);
        }
        // The fence lock, taken in the same batch: without it this session
        // must not lead (dropped with the error, it releases the leader lock).
        let fence_code = get::<i32>(row, "fence_result")?
            .ok_or_else(|| DbError::permanent("the leader lock batch took no fence lock"))?;
        if !applock_result(fence_code)? {
            return Err(DbError::transient(
                "the leader fence lock was held by another session; not leading",
            ));
        }
        session.fence = get::<&str>(row, "fence")?
            .filter(|name| !name.is_empty())
            .ok_or_else(|| DbError::permanent("the leader lock batch named no fence lock"))?
            .to_string();
        if babelfish {
            self.babelfish_keys_held(session, name).await?;
        }
        tracing::debug!(
            session_id = session.session_id,
            lock = name,
            database = site.database,
            fence = %session.fence,
            "took the SQL Server leader lock"
        );
        Ok(true)
    }

    /// `APPLOCK_MODE` of the lock `name` on `session`, at `site`. Any
    /// failure, including a session already in doubt, is an error.
    pub(super) async fn lock_held(
        &self,
        session: &mut MssqlLeaderSession,
        name: &str,
        site: Site<'_>,
    ) -> DbResult<bool> {
        if session.in_doubt {
            return Err(DbError::transient(
                "the leader session failed or was interrupted before; it is not used again",
            ));
        }
        session.in_doubt = true;
        let sets = run(
            &mut session.client,
            site.batch(Batch::Check),
            &site.params(&[&name]),
        )
        .await
        .map_err(|e| self.driver_error(&e))?;
        let held = held_by_answer(&sets, "check")?;
        session.in_doubt = false;
        Ok(held)
    }

    /// Gives up the lock `name` and its fence lock `fence` on `session`, at
    /// `site`, keeping the session (`sql/mssql/leader_release.sql`). An
    /// error when the lock is still held after it.
    pub(super) async fn drop_lock(
        &self,
        session: &mut MssqlLeaderSession,
        name: &str,
        fence: &str,
        site: Site<'_>,
    ) -> DbResult<()> {
        session.in_doubt = true;
        let sets = run(
            &mut session.client,
            site.batch(Batch::Release),
            &site.params(&[&name, &fence]),
        )
        .await
        .map_err(|e| self.driver_error(&e))?;
        if held_by_answer(&sets, "release")? {
            return Err(DbError::permanent(
                "the leader lock was still held after its release",
            ));
        }
        session.in_doubt = false;
        Ok(())
    }

    /// Babelfish only, on a session that has just taken the leader lock
    /// `name` and its fence lock: whether `pg_locks` shows it holding the
    /// keys [`AppLockKey`] computes for them. A fence whose key it does not
    /// hold would refuse every fill, so such a session does not lead (an
    /// error: dropped, it releases both locks; the next try names a new
    /// fence lock). A leader lock whose key it does not hold only leaves
    /// followers blind: they ask for the lock, and log in again after each
    /// refusal, as before; that is said.
    async fn babelfish_keys_held(
        &self,
        session: &mut MssqlLeaderSession,
        name: &str,
    ) -> DbResult<()> {
        let (leader, fence) = (AppLockKey::of(name), AppLockKey::of(&session.fence));
        let params: [i64; 4] = [
            leader.classid.into(),
            leader.objid.into(),
            fence.classid.into(),
            fence.objid.into(),
        ];
        let sets = run(
            &mut session.client,
            LEADER_KEYS_BABELFISH,
            &[&params[0], &params[1], &params[2], &params[3]],
        )
        .await
        .map_err(|e| self.driver_error(&e))?;
        let row = sets
            .first()
            .and_then(|rows| rows.first())
            .ok_or_else(|| DbError::permanent("the leader keys check returned no row"))?;
        let held = |column| get::<i32>(row, column).map(|v| v == Some(1));
        if !held("fence_held")? {
            return Err(DbError::transient(format!(
                "Babelfish's pg_locks does not show this session holding its leader fence lock {:?} \
                 at the key computed for it ({fence:?}), so its fills could not be fenced: not leading",
                session.fence
            )));
        }
        if !held("leader_held")? {
            tracing::warn!(
                key = name,
                ?leader,
                "the leader lock is not at its computed key in pg_locks: followers cannot see it held \
                 and will log in again after each try"
            );
        }
        Ok(())
    }

    /// Runs `work` within the connect timeout: a silent server must not hold
    /// the election up.
    pub(super) async fn within_connect_timeout<T>(
        &self,
        work: impl std::future::Future<Output = DbResult<T>>,
    ) -> DbResult<T> {
        let limit = self.settings.connect_timeout;
        tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
            Err(DbError::transient(format!(
                "no SQL Server leader session at {} within {}",
                conn::shown_addr(&self.config.get_addr()),
                humantime::format_duration(limit)
            )))
        })
    }
}

impl LeaderLock for MssqlEngine {
    type Session = MssqlLeaderSession;

    /// A dedicated session, within the connect timeout. A key that
    /// `sp_getapplock` would cut short is refused before connecting.
    async fn open_session(&self, key: &str) -> DbResult<MssqlLeaderSession> {
        check_leader_key(key)?;
        self.within_connect_timeout(self.connect_leader_session(None))
            .await
    }

    fn reusable(&self, session: &MssqlLeaderSession) -> bool {
        !session.in_doubt
    }

    /// The lock batch on `session`, within the connect timeout: the leader
    /// lock and with it the fence lock, whose name the session's
    /// [`FenceToken`] carries.
    async fn try_lock(
        &self,
        session: MssqlLeaderSession,
        key: &str,
    ) -> DbResult<(bool, MssqlLeaderSession)> {
        check_leader_key(key)?;
        self.within_connect_timeout(self.lock_on(session, key))
            .await
    }

    /// `APPLOCK_MODE` on the lock's own session. Any failure, including a
    /// session already in doubt, is an error: the caller steps down.
    async fn still_held(&self, session: &mut MssqlLeaderSession, key: &str) -> DbResult<bool> {
        let server = self.server().await?;
        let site = Site {
            babelfish: server.babelfish.is_some(),
            database: None,
        };
        self.lock_held(session, &server.leader_lock_name(key), site)
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::engine::tests_support::mssql_settings as settings;
    use crate::engine::DbErrorKind;

    #[test]
    fn leader_keys_fit_sp_getapplock() {
        assert!(check_leader_key("gap-healer:eventuous").is_ok());
        assert!(check_leader_key(&"k".repeat(255)).is_ok());
        // Counted in UTF-16 units, as NVARCHAR counts: the emoji is two.
        let astral = format!("{}😀", "k".repeat(253));
        assert_eq!(
            (astral.chars().count(), astral.encode_utf16().count()),
            (254, 255)
        );
        assert!(check_leader_key(&astral).is_ok());
        // 255 characters, 256 units: too long.
        let too_long = format!("{}😀", "k".repeat(254));
        let err = check_leader_key(&too_long).unwrap_err();
        assert_eq!(err.kind, DbErrorKind::Permanent);
        assert!(check_leader_key(&"k".repeat(256)).is_err());
        assert!(check_leader_key("").is_err());
    }

    /// The keys `pg_locks` showed on Babelfish 4.2.0 for locks taken with
    /// these names (`classid` * 2^32 + `objid`).
    #[test]
    fn app_lock_keys_are_babelfishs() {
        let key = |name: &str| {
            let k = AppLockKey::of(name);
            (u64::from(k.classid) << 32) | u64::from(k.objid)
        };
        assert_eq!(key("master/gap-healer:abc"), 1_066_068_296_589_719_242);
        assert_eq!(
            AppLockKey::of("master/gap-healer:abc"),
            AppLockKey {
                classid: 248_213_367,
                objid: 2_894_673_610
            }
        );
        assert_eq!(key("gap-healer fence 1 ABC"), 1_116_410_563_894_383_064);
        assert_eq!(key("master/gap-héaler"), 4_200_648_220_098_293_988);
        assert_eq!(key("master/€uro"), 3_061_182_514_779_619_798);
        assert_eq!(key("master/Жук"), 3_754_642_764_675_229_168);
        assert_eq!(key("master/😀x"), 420_751_052_447_751_854);
        // Cut at 255 bytes, before a character that does not fit whole.
        assert_eq!(
            key(&format!("master/{}", "k".repeat(300))),
            3_277_454_835_512_028_704
        );
        assert_eq!(
            key(&format!("master/x{}", "é".repeat(200))),
            4_924_733_651_227_819_245
        );
        assert_eq!(
            key(&format!("master/ab{}", "😀".repeat(70))),
            3_138_953_025_419_682_004
        );
    }

    /// The batches are rendered once, as each site sends them: as they
    /// are in the session's database, through `sp_executesql` in another.
    #[test]
    fn each_batch_is_rendered_for_its_site() {
        let here = Site {
            babelfish: false,
            database: None,
        };
        let there = Site {
            babelfish: false,
            database: Some("tenant_1"),
        };
        assert_eq!(here.batch(Batch::Check), sql::LEADER_CHECK);
        assert_eq!(here.batch(Batch::Lock), sql::LEADER_LOCK);
        assert_eq!(here.batch(Batch::BabelfishLock), babelfish_leader_lock());
        assert_eq!(
            there.batch(Batch::Release),
            sql::in_database(
                sql::LEADER_RELEASE,
                "@P1 NVARCHAR(255), @P2 NVARCHAR(255)",
                2
            )
        );
        assert_eq!(
            there.batch(Batch::Lock),
            sql::in_database(sql::LEADER_LOCK, "@P1 NVARCHAR(255)", 1)
        );
        assert!(std::ptr::eq(
            here.batch(Batch::Check),
            here.batch(Batch::Check)
        ));
        assert_eq!(there.params(&[&"k"]).len(), 2);
        assert_eq!(here.params(&[&"k"]).len(), 1);
    }

    #[test]
    fn only_exclusive_means_held() {
        assert!(lock_mode_is_held(Some("Exclusive")));
        for other in [
            None,
            Some("NoLock"),
            Some("Shared"),
            Some("exclusive"),
            Some(""),
        ] {
            assert!(!lock_mode_is_held(other), "{other:?}");
        }
    }

    #[tokio::test]
    async fn try_lead_without_a_server_is_a_transient_secret_free_error() {
        let engine = MssqlEngine::new(&settings(
            "Server=tcp:127.0.0.1,1;User Id=app;Password=Hunter2;TrustServerCertificate=true",
        ))
        .unwrap();
        let started = Instant::now();
        let err = engine
            .try_lead("gap-healer:eventuous")
            .await
            .expect_err("nothing listens on port 1");
        assert!(err.is_transient(), "{err:?}");
        assert!(!err.message.contains("Hunter2"), "{}", err.message);
        assert!(started.elapsed() < Duration::from_secs(5));
        // A key sp_getapplock would truncate is refused before connecting.
        let err = engine.try_lead(&"k".repeat(256)).await.unwrap_err();
        assert_eq!(err.kind, DbErrorKind::Permanent);
    }

    #[tokio::test]
    async fn try_lead_gives_up_at_the_connect_timeout() {
        // A listener that accepts and never answers the TDS prelogin.
        let (port, silent) = crate::engine::tests_support::silent_listener().await;
        let engine = MssqlEngine::new(&settings(&format!(
            "Server=tcp:127.0.0.1,{port};User Id=app;Password=Hunter2;TrustServerCertificate=true"
        )))
        .unwrap();
        let started = Instant::now();
        let err = engine.try_lead("gap-healer:eventuous").await.unwrap_err();
        let waited = started.elapsed();
        assert!(err.is_transient(), "{err:?}");
        assert!(
            err.message.starts_with(&format!(
                "no SQL Server leader session at 127.0.0.1:{port} within"
            )),
            "{}",
            err.message
        );
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        silent.abort();
    }
}
