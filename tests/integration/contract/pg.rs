//! The engine contract on PostgreSQL ([`super`]): a schema of the test's own
//! on the local server (the kit's [`Store`], dropped by its guard).

use std::sync::Arc;
use std::time::Duration;

use gap_healer::engine::postgres::{advisory_key, PgLeaderSession, PostgresEngine};
use gap_healer::engine::LeaderSession;
use gap_healer_testkit::bin::cli;
use gap_healer_testkit::pg::{as_user, Ending, OpenAppend, Store};
use gap_healer_testkit::subscriber::PgPages;
use uuid::Uuid;

use super::{contract_tests, Row, Server};

contract_tests!(PgStore);

/// One test's store on PostgreSQL, as the contract sees it.
pub struct PgStore {
    store: Store,
    /// Login roles made for the test: `<schema>_<n>`.
    roles: usize,
}

impl PgStore {
    /// A login role of its own, created by the store (whose guard drops it).
    async fn role(&mut self) -> (String, String) {
        self.roles += 1;
        let role = format!("{}_{}", self.store.schema, self.roles);
        let cs = self.store.create_login(&role).await;
        (role, cs)
    }
}

impl Server for PgStore {
    type Engine = PostgresEngine;
    type Open = OpenAppend;
    type Pages = PgPages;

    const FIRST_POSITION: i64 = 1;
    const STATEMENTS_FOR_10000: u64 = 1;
    const PROBE_SEES_IN_FLIGHT: bool = false;
    const ENDS_A_SESSION_WITHIN: Duration = Duration::from_secs(1);
    const KILL_NOTICED_WITHIN: Duration = Duration::ZERO;
    const PROBE_ANSWERS_A_POSITION_ONCE: bool = false;
    const SESSION_IDS_REUSED: bool = false;

    async fn empty() -> Self {
        PgStore {
            store: Store::new("contract").await,
            roles: 0,
        }
    }

    fn engine(&self) -> Arc<PostgresEngine> {
        self.store.engine()
    }

    fn engine_as(&self, connection_string: &str) -> Arc<PostgresEngine> {
        gap_healer_testkit::engine::postgres(&gap_healer_testkit::engine::settings(
            connection_string,
            &self.store.schema,
            Duration::from_secs(5),
        ))
        .expect("engine")
    }

    fn leader_key(&self) -> String {
        // Advisory locks are the database's: a key of the test's own.
        format!("gap-healer:{}", self.store.schema)
    }

    fn store_args(&self) -> Vec<String> {
        self.store.args()
    }

    async fn append(&self, stream: &str, count: usize) -> Vec<i64> {
        self.store.append(stream, count, Ending::Commit).await
    }

    async fn append_with_id(&self, stream: &str, id: Uuid) -> Vec<i64> {
        self.store.append_with_id(stream, id).await
    }

    async fn load_every_other(&self, n: i64) {
        let head = self.store.head().await;
        self.store.insert_bulk(n, &format!("{head} + 2 * g")).await;
    }

    async fn begin_append(&self, stream: &str, count: usize) -> OpenAppend {
        self.store.append_open(stream, count).await
    }

    async fn begin_explicit(&self, stream: &str, position: i64) -> OpenAppend {
        self.store.insert_open_at(stream, position).await
    }

    async fn explicit_insert_is_read(&self) -> bool {
        false
    }

    fn positions(open: &OpenAppend) -> Vec<i64> {
        open.positions.clone()
    }

    async fn commit(open: OpenAppend) {
        open.commit()
            .await
            .expect("the append commits: no tombstone took its key");
    }

    async fn rollback(open: OpenAppend) {
        open.rollback().await;
    }

    async fn skip_positions(&self, n: i64) {
        self.store.jump_identity(n).await;
    }

    async fn rows(&self) -> Vec<Row> {
        self.store.rows().await
    }

    async fn pages(&self) -> PgPages {
        PgPages::new(&self.store).await
    }

    async fn identity(&self) -> i64 {
        let s = &self.store.schema;
        self.store
            .client
            .query_one(
                &format!("SELECT last_value FROM {s}.messages_global_position_seq"),
                &[],
            )
            .await
            .unwrap()
            .get(0)
    }

    async fn tombstone_version(&self) -> Option<i64> {
        let s = &self.store.schema;
        self.store
            .client
            .query_opt(
                &format!("SELECT version::bigint FROM {s}.streams WHERE stream_name = $1"),
                &[&gap_healer_testkit::eventuous::TOMBSTONE_STREAM],
            )
            .await
            .unwrap()
            .map(|r| r.get(0))
    }

    async fn assert_tombstone_stream_consistent(&self) {
        self.store.assert_tombstone_stream_consistent().await;
    }

    fn session_id(session: &PgLeaderSession) -> i64 {
        i64::from(session.backend_pid())
    }

    async fn kill_session(&self, id: i64) {
        let pid = i32::try_from(id).expect("a backend pid");
        self.store
            .client
            .execute("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .unwrap();
    }

    /// The server lists the lock as one granted advisory lock of the
    /// session, on the key's value, and the fence names the session and key.
    async fn assert_lock_session(&self, _: &PostgresEngine, session: &PgLeaderSession) {
        let key = self.leader_key();
        let holders: Vec<i32> = self
            .store
            .client
            .query(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
                   AND ((classid::bigint << 32) | objid::bigint) = $1",
                &[&advisory_key(&key)],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(holders, vec![session.backend_pid()]);
        let token = session.fence_token();
        assert_eq!(
            (token.session_id, token.lock),
            (i64::from(session.backend_pid()), key)
        );
    }

    /// PostgreSQL's fills leave nothing on a session: SET LOCAL ends with
    /// the transaction.
    async fn assert_pool_clean(_: &PostgresEngine) {}

    /// PostgreSQL has one fill mode.
    async fn assert_fills_directly(_: &PostgresEngine) {}

    /// A role with exactly the grants `gap-healer sql --role` prints.
    async fn writer_login(&mut self, _case: &str) -> String {
        let (role, cs) = self.role().await;
        let out = cli(
            &[
                "sql",
                "--engine",
                "postgres",
                "--schema",
                &self.store.schema,
                "--role",
                &role,
            ],
            &[],
        );
        assert_eq!(out.code, 0, "{}", out.all());
        self.store
            .client
            .batch_execute(&out.stdout)
            .await
            .expect("apply the printed grants");
        cs
    }

    async fn bare_login(&mut self) -> String {
        let (role, _) = self.role().await;
        as_user(&self.store.url(), &role)
    }

    async fn skipped(&self, _case: &str, _reason: &str) -> bool {
        false
    }
}
