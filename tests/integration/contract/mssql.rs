//! The engine contract on SQL Server or Babelfish ([`super`]): a database of
//! the test's own (the kit's [`TestDb`], dropped by its guard). Every test is
//! `#[ignore]`d: without a server, asked for with `--ignored`, it fails.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gap_healer::engine::mssql::{FillMode, MssqlEngine, MssqlLeaderSession};
use gap_healer_testkit::mssql::{self as ms, skipped_on_babelfish, TestDb};
use uuid::Uuid;

use super::{contract_tests, Row, Server};

contract_tests!(
    MssqlStore,
    #[ignore = "needs SQL Server: set GAP_HEALER_TEST_MSSQL or run with Docker"]
);

/// Why a test of a login with exactly the direct-mode rights cannot run on
/// Babelfish.
const NO_GRANT_ALTER: &str =
    "GRANT ALTER on a table is not supported, so a login with exactly the direct-mode rights cannot be made";

/// Exactly the rights a direct-mode fill needs, as documented.
pub const DIRECT_GRANTS: [&str; 3] = [
    "GRANT SELECT, INSERT, ALTER ON OBJECT::eventuous.Messages TO {user};",
    "GRANT SELECT, INSERT, UPDATE ON OBJECT::eventuous.Streams TO {user};",
    "GRANT SELECT ON OBJECT::eventuous.Checkpoints TO {user};",
];

/// One test's database on SQL Server, as the contract sees it (and, through
/// `Deref`, the kit's [`TestDb`] for what only SQL Server has).
pub struct MssqlStore(pub TestDb);

impl Deref for MssqlStore {
    type Target = TestDb;

    fn deref(&self) -> &TestDb {
        &self.0
    }
}

impl DerefMut for MssqlStore {
    fn deref_mut(&mut self) -> &mut TestDb {
        &mut self.0
    }
}

/// Sessions that hold an application lock in this database, as the server's
/// lock manager sees them: (session id, owner type, mode).
async fn app_lock_holders(db: &TestDb) -> Vec<(i64, String, String)> {
    let mut c = db.client().await;
    ms::rows(
        &mut c,
        "SELECT request_session_id, request_owner_type, request_mode FROM sys.dm_tran_locks \
         WHERE resource_type = N'APPLICATION' AND resource_database_id = DB_ID() AND request_status = N'GRANT'",
        &[],
    )
    .await
    .iter()
    .map(|r| {
        (
            r.get::<i32, _>(0).map_or(-1, i64::from),
            r.get::<&str, _>(1).unwrap_or_default().to_string(),
            r.get::<&str, _>(2).unwrap_or_default().to_string(),
        )
    })
    .collect()
}

/// Takes `n` identity values with inserts that roll back (one set-based
/// statement, rows of the store's first stream: it needs one): the next
/// append lands `n` positions later. Not `DBCC
/// CHECKIDENT`, which on Babelfish waits for an exclusive lock on the table,
/// behind any open append.
pub async fn burn_identity(db: &TestDb, n: i64) {
    let mut c = db.client().await;
    ms::exec(
        &mut c,
        &format!(
            "SET NOCOUNT ON;
             DECLARE @s INT = (SELECT MIN(StreamId) FROM eventuous.Streams);
             BEGIN TRANSACTION;
             WITH d AS (SELECT v FROM (VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)) AS t(v)),
             n AS (
                 SELECT a.v + 10 * b.v + 100 * c.v + 1000 * e.v + 10000 * f.v AS i
                 FROM d AS a CROSS JOIN d AS b CROSS JOIN d AS c CROSS JOIN d AS e CROSS JOIN d AS f
             )
             INSERT INTO eventuous.Messages (MessageId, MessageType, StreamId, StreamPosition, JsonData, Created)
             SELECT NEWID(), N'TestEvent', @s, 1000000 + n.i, N'{{}}', SYSUTCDATETIME()
             FROM n WHERE n.i < {n};
             ROLLBACK TRANSACTION;"
        ),
    )
    .await;
}

/// Appends `n` committed rows of a stream `bulk` above the head in one
/// set-based statement (explicit identity values from a numbers CTE), one
/// every `step` positions (a step of 2 leaves a hole after each): how long
/// it took.
pub async fn load_bulk(db: &TestDb, from_stream_position: i64, n: i64, step: i64) -> Duration {
    let started = Instant::now();
    let mut c = db.client().await;
    ms::exec(
        &mut c,
        &format!(
            "SET NOCOUNT ON;
             IF NOT EXISTS (SELECT 1 FROM eventuous.Streams WHERE StreamName = N'bulk')
                 INSERT INTO eventuous.Streams (StreamName, [Version]) VALUES (N'bulk', -1);
             DECLARE @s INT = (SELECT StreamId FROM eventuous.Streams WHERE StreamName = N'bulk');
             DECLARE @head BIGINT = (SELECT MAX(GlobalPosition) FROM eventuous.Messages);
             SET IDENTITY_INSERT eventuous.Messages ON;
             WITH d AS (SELECT v FROM (VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)) AS t(v)),
             n AS (
                 SELECT a.v + 10 * b.v + 100 * c.v + 1000 * e.v + 10000 * f.v + 100000 * g.v AS i
                 FROM d AS a CROSS JOIN d AS b CROSS JOIN d AS c CROSS JOIN d AS e
                 CROSS JOIN d AS f CROSS JOIN d AS g
             )
             INSERT INTO eventuous.Messages
                 (GlobalPosition, MessageId, MessageType, StreamId, StreamPosition, JsonData, Created)
             SELECT @head + {step} * (n.i + 1), NEWID(), N'TestEvent', @s, {from_stream_position} + n.i, N'{{}}', SYSUTCDATETIME()
             FROM n WHERE n.i < {n};
             SET IDENTITY_INSERT eventuous.Messages OFF;
             UPDATE eventuous.Streams SET [Version] = {from_stream_position} + {n} - 1 WHERE StreamId = @s;"
        ),
    )
    .await;
    started.elapsed()
}

impl Server for MssqlStore {
    type Engine = MssqlEngine;
    type Open = ms::OpenAppend;
    type Pages = ms::Pages;

    const FIRST_POSITION: i64 = 0;
    const STATEMENTS_FOR_10000: u64 = 3;
    const PROBE_SEES_IN_FLIGHT: bool = true;
    const ENDS_A_SESSION_WITHIN: Duration = Duration::from_secs(10);
    const KILL_NOTICED_WITHIN: Duration = Duration::from_secs(10);
    const PROBE_ANSWERS_A_POSITION_ONCE: bool = true;
    const SESSION_IDS_REUSED: bool = true;

    async fn empty() -> Self {
        MssqlStore(TestDb::create().await)
    }

    fn engine(&self) -> Arc<MssqlEngine> {
        Arc::new(self.0.engine())
    }

    fn engine_as(&self, connection_string: &str) -> Arc<MssqlEngine> {
        Arc::new(MssqlEngine::new(&self.settings_for(connection_string)).expect("engine"))
    }

    fn leader_key(&self) -> String {
        // Application locks are the database's, and the database the test's.
        format!("gap-healer:{}", ms::SCHEMA)
    }

    fn store_args(&self) -> Vec<String> {
        [
            "--engine",
            "mssql",
            "--connection-string",
            &self.connection_string(),
            "--schema",
            ms::SCHEMA,
        ]
        .map(String::from)
        .to_vec()
    }

    async fn append(&self, stream: &str, count: usize) -> Vec<i64> {
        self.0.append(stream, count).await
    }

    async fn append_with_id(&self, stream: &str, id: Uuid) -> Vec<i64> {
        match self.0.try_append_ids(stream, &[id]).await {
            Ok(positions) => positions,
            Err(code) => {
                assert_eq!(code, 2627, "a duplicate id meets UQ_StreamIdAndMessageId");
                vec![]
            }
        }
    }

    async fn load_every_other(&self, n: i64) {
        load_bulk(self, 0, n, 2).await;
    }

    async fn begin_append(&self, stream: &str, count: usize) -> ms::OpenAppend {
        self.0.begin_append(stream, count).await
    }

    async fn begin_explicit(&self, stream: &str, position: i64) -> ms::OpenAppend {
        self.0.begin_explicit(stream, position).await
    }

    async fn explicit_insert_is_read(&self) -> bool {
        ms::is_babelfish().await
    }

    fn positions(open: &ms::OpenAppend) -> Vec<i64> {
        open.positions.clone()
    }

    async fn commit(open: ms::OpenAppend) {
        open.commit().await;
    }

    async fn rollback(open: ms::OpenAppend) {
        open.rollback().await;
    }

    async fn skip_positions(&self, n: i64) {
        burn_identity(self, n).await;
    }

    async fn rows(&self) -> Vec<Row> {
        self.messages()
            .await
            .into_iter()
            .map(|m| (m.position, m.stream, m.message_type))
            .collect()
    }

    async fn pages(&self) -> ms::Pages {
        ms::Pages::new(self).await
    }

    async fn identity(&self) -> i64 {
        self.ident_current().await
    }

    async fn tombstone_version(&self) -> Option<i64> {
        self.0.tombstone_version().await
    }

    async fn assert_tombstone_stream_consistent(&self) {
        self.assert_tombstone_stream_contiguous().await;
    }

    fn session_id(session: &MssqlLeaderSession) -> i64 {
        session.session_id()
    }

    async fn kill_session(&self, id: i64) {
        let mut master = self.master().await;
        ms::exec(&mut master, &format!("KILL {id};")).await;
    }

    /// Two exclusive, session-owned application locks (the leader lock and
    /// the leader fence), on the session the engine reported, which is not a
    /// pooled connection.
    async fn assert_lock_session(&self, engine: &MssqlEngine, leader: &MssqlLeaderSession) {
        let spid = leader.session_id();
        assert!(
            leader.fence().starts_with("gap-healer fence "),
            "{leader:?}"
        );
        if !skipped_on_babelfish(
            "leader_lock_one_holder_...: the two locks as sys.dm_tran_locks lists them",
            "no sys.dm_tran_locks (the rest of the test still runs)",
        )
        .await
        {
            assert_eq!(
                app_lock_holders(self).await,
                vec![(spid, "SESSION".to_string(), "X".to_string()); 2]
            );
        }
        assert_ne!(engine.session_state().await.unwrap().session_id, spid);
    }

    async fn assert_pool_clean(engine: &MssqlEngine) {
        let s = engine.session_state().await.unwrap();
        assert!(
            s.identity_insert_free && s.open_transactions == 0 && s.lock_timeout_ms == -1,
            "{s:?}"
        );
    }

    async fn assert_fills_directly(engine: &MssqlEngine) {
        assert_eq!(engine.fill_mode().await.unwrap(), FillMode::Direct);
    }

    /// A login with exactly [`DIRECT_GRANTS`]; on Babelfish the admin's:
    /// such a login cannot be made there.
    async fn writer_login(&mut self, case: &str) -> String {
        let what = format!("{case}: the login with exactly the direct-mode rights");
        if skipped_on_babelfish(&what, NO_GRANT_ALTER).await {
            self.connection_string()
        } else {
            self.login_with(&DIRECT_GRANTS).await
        }
    }

    /// A database user with no grant at all.
    async fn bare_login(&mut self) -> String {
        self.login_with(&[]).await
    }

    async fn skipped(&self, case: &str, reason: &str) -> bool {
        skipped_on_babelfish(case, reason).await
    }
}
