//! PostgreSQL: the local server (`GAP_HEALER_TEST_PG`, else 127.0.0.1:5432,
//! else a throwaway cluster of the test process's own), one schema per test
//! with the Eventuous tables of `tests/fixtures/eventuous_postgres.sql`
//! ([`Store`]), and clusters of a test's own ([`Throwaway`]).

mod throwaway;

use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use gap_healer::engine::postgres::PostgresEngine;
use gap_healer::engine::DbResult;
use tokio_postgres::{Client, NoTls};
use uuid::Uuid;

use crate::bin::{self, Output};
use crate::eventuous::{self, pg::Duplicate, EVENT_TYPE, TOMBSTONE_STREAM, TOMBSTONE_TYPE};
use crate::subscriber::PageRow;

pub use throwaway::{free_port, is_root, Throwaway};

/// The Eventuous tables; `__schema__` stands for the schema's name.
pub const FIXTURE: &str = include_str!("../../fixtures/eventuous_postgres.sql");

/// The server the tests use when none is given.
const DEFAULT_URL: &str = "host=127.0.0.1 port=5432 user=postgres dbname=test";
const DEFAULT_PORT: u16 = 5432;

/// The PostgreSQL the tests use: `GAP_HEALER_TEST_PG` when set, else the
/// local server at 127.0.0.1:5432 when something answers there, else a
/// throwaway cluster of this test process's own (started on first use, with
/// database `test`; stopped and deleted when the process ends: see
/// [`Throwaway::for_this_process`]). A test that needs a server fails, never
/// skips, when none can be had.
pub fn pg_url() -> String {
    if let Ok(url) = std::env::var("GAP_HEALER_TEST_PG") {
        return url;
    }
    match local_server() {
        None => DEFAULT_URL.into(),
        Some(own) => own.url("test"),
    }
}

/// The port of [`pg_url`]'s server, for tests that write connection strings
/// of their own: the process's own cluster's, else 5432.
pub fn pg_port() -> u16 {
    if std::env::var("GAP_HEALER_TEST_PG").is_ok() {
        return DEFAULT_PORT;
    }
    local_server().map_or(DEFAULT_PORT, |own| own.port)
}

/// `None` when something answers at 127.0.0.1:5432 (a TCP connect within
/// 1 s; what answers is used as it is, as before), else the process's own
/// cluster, started once.
fn local_server() -> Option<&'static Throwaway> {
    static SERVER: OnceLock<Result<Option<Throwaway>, String>> = OnceLock::new();
    let server = SERVER.get_or_init(|| {
        let default = SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT));
        if TcpStream::connect_timeout(&default, Duration::from_secs(1)).is_ok() {
            return Ok(None);
        }
        // Once: a failure is reported to every test, not retried by each.
        std::panic::catch_unwind(Throwaway::for_this_process)
            .map(Some)
            .map_err(|e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            })
    });
    match server {
        Ok(own) => own.as_ref(),
        Err(e) => panic!(
            "nothing answers at 127.0.0.1:{DEFAULT_PORT} and GAP_HEALER_TEST_PG is not set, \
             so the tests start a throwaway PostgreSQL cluster of their own, which failed \
             (the server binaries are needed: initdb, pg_ctl, postgres): {e}"
        ),
    }
}

/// `url` with one more parameter, in its own syntax (key=value, or a URL's
/// query).
pub fn with_param(url: &str, key: &str, value: &str) -> String {
    if url.contains("://") {
        let sep = if url.contains('?') { '&' } else { '?' };
        let encoded = value.replace(' ', "%20").replace('=', "%3D");
        format!("{url}{sep}{key}={encoded}")
    } else if value.contains([' ', '\'', '\\']) {
        let quoted = value.replace('\\', "\\\\").replace('\'', "\\'");
        format!("{url} {key}='{quoted}'")
    } else {
        format!("{url} {key}={value}")
    }
}

/// `url` with an application name, so the server's sessions of one client
/// can be found (and ended) in pg_stat_activity.
pub fn named(url: &str, app: &str) -> String {
    with_param(url, "application_name", app)
}

/// A new session; its connection runs on a task of its own.
pub async fn try_connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// `url` connecting as `user` instead (the last `user` given wins, in
/// key=value strings and URLs alike).
pub fn as_user(url: &str, user: &str) -> String {
    with_param(url, "user", user)
}

/// A session to `url`; panics when there is none.
pub async fn connect_to(url: &str) -> Client {
    try_connect(url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} is required for these tests: {e}"))
}

/// A session to the local PostgreSQL; panics when it is not there.
pub async fn connect() -> Client {
    connect_to(&pg_url()).await
}

/// `gh_<tag>_<8 random hex digits>`: a schema name no other test uses.
pub fn schema_name(tag: &str) -> String {
    format!("gh_{tag}_{}", &Uuid::new_v4().simple().to_string()[..8])
}

/// Creates `schema` with the Eventuous tables.
pub async fn create_schema(client: &Client, schema: &str) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute(&FIXTURE.replace("__schema__", schema))
        .await
}

/// Creates the watermark table `table` (schema.table, its schema too when
/// missing) by running what `gap-healer sql` prints for `store_args`
/// (`--schema`, `--profile`), as printed, with the grants to the test's
/// own role (`postgres`, the superuser the tests connect as).
pub async fn create_watermark_table(client: &Client, url: &str, store_args: &[&str], table: &str) {
    let mut args = vec!["sql", "--engine", "postgres"];
    args.extend(store_args);
    args.extend(["--watermark-table", table, "--role", "postgres"]);
    let out = bin::cli(&args, &[("GAP_HEALER_CONNECTION_STRING", url)]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("CREATE TABLE"), "{}", out.stdout);
    client.batch_execute(&out.stdout).await.unwrap();
}

/// Up to 500 rows from `next` on, in position order, as a subscriber reads
/// them.
pub async fn page(
    client: &Client,
    schema: &str,
    next: i64,
) -> Result<Vec<PageRow>, tokio_postgres::Error> {
    let rows = client
        .query(
            &format!(
                "SELECT m.global_position, m.message_id, st.stream_name::text, m.message_type::text,
                        m.created < (now() AT TIME ZONE 'utc') - interval '1 hour'
                 FROM {schema}.messages m JOIN {schema}.streams st USING (stream_id)
                 WHERE m.global_position >= $1 ORDER BY m.global_position LIMIT 500"
            ),
            &[&next],
        )
        .await?;
    Ok(page_rows(&rows))
}

/// Rows selected as (position, message id, stream, type, older than one
/// hour) as a subscriber reads them.
pub fn page_rows(rows: &[tokio_postgres::Row]) -> Vec<PageRow> {
    rows.iter()
        .map(|r| PageRow {
            position: r.get(0),
            id: r.get(1),
            stream: r.get(2),
            message_type: r.get(3),
            old: r.get(4),
        })
        .collect()
}

/// One test's store: a schema with the Eventuous tables, a session to it, and
/// the server's connection string (for new sessions and the healer). A store
/// the test made holds the [`Guard`] that drops its schema (and the login
/// roles made for it) when the store goes out of scope; a store opened on a
/// schema another value owns, or one on a throwaway cluster (removed whole
/// with its [`Throwaway`]), holds none.
pub struct Store {
    pub schema: String,
    pub client: Client,
    url: String,
    /// Last, so the store's own session is dropped before the cleanup runs.
    guard: Option<Guard>,
}

/// What a test made on a PostgreSQL server, taken away when the guard goes
/// out of scope, also when the test fails or panics: a schema (`DROP SCHEMA
/// ... CASCADE`) or a database (`DROP DATABASE ... WITH (FORCE)`), then the
/// login roles made for it. Sessions that still hold a lock on the schema's
/// tables (an append left open by a failed test) are ended first, so the
/// drop never waits on the test's own sessions. [`Guard::drop_now`] does it
/// on the caller's runtime and disarms the guard.
pub struct Guard {
    /// The server to connect to for the cleanup (for a database: one of its
    /// other databases).
    url: String,
    made: Made,
    roles: std::sync::Mutex<Vec<String>>,
    armed: bool,
}

/// What a [`Guard`] takes away.
#[derive(Clone, Debug)]
enum Made {
    Schema(String),
    Database(String),
}

impl Guard {
    /// Drops `schema` of the server `url` names when the guard goes.
    pub fn schema(url: &str, schema: &str) -> Guard {
        Guard::new(url, Made::Schema(schema.into()))
    }

    /// Drops the database `name` (connecting to `url`, a session of another
    /// database of the server) when the guard goes.
    pub fn database(url: &str, name: &str) -> Guard {
        Guard::new(url, Made::Database(name.into()))
    }

    fn new(url: &str, made: Made) -> Guard {
        Guard {
            url: url.into(),
            made,
            roles: std::sync::Mutex::new(Vec::new()),
            armed: true,
        }
    }

    /// Drops the login role `role` (and what it was granted) too.
    pub fn add_role(&self, role: &str) {
        self.roles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(role.into());
    }

    /// Takes everything away now, on the caller's runtime, and disarms the
    /// guard; panics when that fails.
    pub async fn drop_now(mut self) {
        self.armed = false;
        let roles = self.roles.lock().unwrap_or_else(|e| e.into_inner()).clone();
        take_away(&self.url, &self.made, &roles)
            .await
            .unwrap_or_else(|e| panic!("drop {:?}: {e}", self.made));
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (url, made) = (self.url.clone(), self.made.clone());
        let roles = self.roles.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let what = format!("{made:?} and roles {roles:?}");
        crate::cleanup::run_to_end(&what, move || async move {
            take_away(&url, &made, &roles)
                .await
                .map_err(|e| e.to_string())
        });
    }
}

/// Drops what `made` names, then `roles`, on a new session to `url`.
async fn take_away(url: &str, made: &Made, roles: &[String]) -> Result<(), tokio_postgres::Error> {
    let c = try_connect(url).await?;
    match made {
        Made::Schema(schema) => {
            // Sessions holding a lock on the schema's tables (a failed
            // test's open append) would make the drop wait for ever.
            c.execute(
                "SELECT pg_terminate_backend(l.pid) FROM pg_locks l
                   JOIN pg_class t ON t.oid = l.relation JOIN pg_namespace n ON n.oid = t.relnamespace
                 WHERE n.nspname = $1 AND l.pid <> pg_backend_pid()
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[schema],
            )
            .await?;
            c.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .await?;
        }
        Made::Database(name) => {
            c.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await?;
        }
    }
    for role in roles {
        let exists = c
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[role])
            .await?
            .is_some();
        if exists {
            c.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
                .await?;
        }
    }
    Ok(())
}

/// How an append ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Commit,
    /// Inserts (taking positions), then rolls back.
    RollbackAfterInsert,
}

/// An append whose transaction is still open: its positions are taken and
/// locked, not committed.
pub struct OpenAppend {
    client: Client,
    pub positions: Vec<i64>,
    pub stream: String,
}

impl OpenAppend {
    pub async fn commit(self) -> Result<(), tokio_postgres::Error> {
        self.client.batch_execute("COMMIT").await
    }
    pub async fn rollback(self) {
        self.client
            .batch_execute("ROLLBACK")
            .await
            .expect("rollback");
    }
}

impl Store {
    /// A fresh schema `gh_<tag>_<random>` on the local PostgreSQL.
    pub async fn new(tag: &str) -> Store {
        Store::create(connect().await, &pg_url(), &schema_name(tag))
            .await
            .expect("create schema")
    }

    /// A store with holes of the given widths: an event on stream A, then
    /// for each width a rolled-back append of that many events (X, Y, ...)
    /// and an event (B, C, ...).
    pub async fn with_holes(tag: &str, widths: &[usize]) -> Store {
        let store = Store::new(tag).await;
        store.append_holes(widths).await;
        store
    }

    /// Creates `schema` with the Eventuous tables through `client`, a session
    /// of the server `url` names; the store's guard drops the schema (made
    /// here or before) when it goes.
    pub async fn create(
        client: Client,
        url: &str,
        schema: &str,
    ) -> Result<Store, tokio_postgres::Error> {
        let guard = Guard::schema(url, schema);
        create_schema(&client, schema).await?;
        Ok(Store {
            guard: Some(guard),
            ..Store::open(client, url, schema)
        })
    }

    /// A store whose schema exists already, owned by another value: nothing
    /// is dropped when this one goes.
    pub fn open(client: Client, url: &str, schema: &str) -> Store {
        Store {
            schema: schema.into(),
            client,
            url: url.into(),
            guard: None,
        }
    }

    /// This store without its guard: the schema outlives the value (a
    /// throwaway cluster's store, removed with the cluster, which a test
    /// may open again after a restart).
    pub fn kept(mut self) -> Store {
        if let Some(mut guard) = self.guard.take() {
            guard.armed = false;
        }
        self
    }

    /// Drops the schema now, on this session or, if it was lost, a new one
    /// (the guard's drop then finds nothing left to drop).
    pub async fn try_drop_schema(&self) -> Result<(), tokio_postgres::Error> {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema);
        if self.client.batch_execute(&sql).await.is_err() {
            try_connect(&self.url).await?.batch_execute(&sql).await?;
        }
        Ok(())
    }

    /// Drops the schema (and the login roles made for it) now, on the
    /// caller's runtime, instead of when the store goes.
    pub async fn drop_schema(mut self) {
        match self.guard.take() {
            Some(guard) => guard.drop_now().await,
            None => take_away(&self.url, &Made::Schema(self.schema.clone()), &[])
                .await
                .expect("drop schema"),
        }
    }

    /// Creates the login role `role`, with no right at all, and returns the
    /// connection string that logs in as it (trust authentication). The
    /// store's guard drops the role with the schema.
    pub async fn create_login(&self, role: &str) -> String {
        if let Some(guard) = &self.guard {
            guard.add_role(role);
        }
        self.client
            .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
            .await
            .expect("create the login role");
        as_user(&self.url, role)
    }

    /// Grants `role` what a healer's role needs on the store (`gap-healer
    /// sql`'s grants, the identity's sequence for the transaction-end
    /// proof among them).
    pub async fn grant_healer_rights(&self, role: &str) {
        let s = &self.schema;
        self.client
            .batch_execute(&format!(
                "GRANT USAGE ON SCHEMA {s} TO {role};
                 GRANT SELECT, INSERT ON {s}.messages TO {role};
                 GRANT SELECT, INSERT (stream_name, version), UPDATE (version) ON {s}.streams TO {role};
                 GRANT SELECT ON {s}.checkpoints TO {role};
                 GRANT SELECT ON SEQUENCE {s}.messages_global_position_seq TO {role};"
            ))
            .await
            .expect("grant the healer's rights");
    }

    /// Closes the store's session and hands over its guard: what the store
    /// made stays until the guard goes (a test that must end its own
    /// sessions on a database before changing it).
    pub fn close_session(self) -> Option<Guard> {
        self.guard
    }

    /// This store's guard drops the database `name` too (connecting to this
    /// store's server), for a test that makes databases of its own.
    pub fn owning_database(mut self, admin_url: &str, name: &str) -> Store {
        let database = Guard::database(admin_url, name);
        if let Some(mut schema) = self.guard.replace(database) {
            // The schema goes with its database.
            schema.armed = false;
        }
        self
    }

    /// The connection string the healer gets.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The PostgreSQL engine over this store, as the daemon builds it.
    pub fn try_engine(&self) -> DbResult<Arc<PostgresEngine>> {
        crate::engine::postgres(&crate::engine::settings(
            &self.url,
            &self.schema,
            Duration::from_secs(5),
        ))
    }

    pub fn engine(&self) -> Arc<PostgresEngine> {
        self.try_engine().expect("engine")
    }

    /// `--engine postgres --connection-string URL --schema SCHEMA`.
    pub fn args(&self) -> Vec<String> {
        self.args_at(&self.url)
    }

    /// [`Store::args`] with another connection string to the same server.
    pub fn args_at(&self, url: &str) -> Vec<String> {
        vec![
            "--engine".into(),
            "postgres".into(),
            "--connection-string".into(),
            url.into(),
            "--schema".into(),
            self.schema.clone(),
        ]
    }

    /// Runs `gap-healer ARGS` with this store's flags after `args`.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_at(&self.url, args)
    }

    /// [`Store::cli`] with another connection string to the same server.
    pub fn cli_at(&self, url: &str, args: &[&str]) -> Output {
        let all = self.argv_at(url, args);
        bin::cli(&all.iter().map(String::as_str).collect::<Vec<_>>(), &[])
    }

    /// [`Store::cli`] with stderr on a pseudo-terminal and the variables
    /// `env` ([`bin::cli_on_terminal`]).
    pub fn cli_on_terminal(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let all = self.argv(args);
        bin::cli_on_terminal(&all.iter().map(String::as_str).collect::<Vec<_>>(), env)
    }

    /// `args`, then this store's flags.
    pub fn argv(&self, args: &[&str]) -> Vec<String> {
        self.argv_at(&self.url, args)
    }

    /// [`Store::argv`] with another connection string to the same server.
    fn argv_at(&self, url: &str, args: &[&str]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string())
            .chain(self.args_at(url))
            .collect()
    }

    /// `gap-healer heal --once` from the first position, filling holes
    /// `gap_timeout` old, `more` flags after.
    pub fn heal_once(&self, gap_timeout: &str, more: &[&str]) -> Output {
        let args = [
            "heal",
            "--once",
            "--start-from",
            "0",
            "--gap-timeout",
            gap_timeout,
        ];
        self.cli(&[&args[..], more].concat())
    }

    /// An Eventuous append of `count` events to `stream` on `client`, in its
    /// open transaction; the positions it took (a duplicate message id burns
    /// one and takes none).
    async fn append_in(
        &self,
        client: &Client,
        stream: &str,
        count: usize,
        message_id: Option<Uuid>,
    ) -> Result<Vec<i64>, tokio_postgres::Error> {
        let s = &self.schema;
        let (id, version) = eventuous::pg::lock_stream(client, s, stream).await?;
        let mut positions = Vec::new();
        for i in 0..count {
            let mid = message_id.unwrap_or_else(Uuid::new_v4);
            let at = version + 1 + i as i32;
            let inserted = eventuous::pg::insert(
                client,
                s,
                id,
                at,
                &mid,
                EVENT_TYPE,
                "{\"n\": 1}",
                Duplicate::Skip,
            )
            .await?;
            positions.extend(inserted);
        }
        eventuous::pg::set_version(client, s, id, version + positions.len() as i32).await?;
        Ok(positions)
    }

    /// One append in one transaction on `client`, ended as `ending` says.
    async fn append_on(
        &self,
        client: &Client,
        stream: &str,
        count: usize,
        message_id: Option<Uuid>,
        ending: Ending,
    ) -> Vec<i64> {
        client.batch_execute("BEGIN").await.unwrap();
        let positions = self
            .append_in(client, stream, count, message_id)
            .await
            .expect("append");
        client
            .batch_execute(if ending == Ending::Commit {
                "COMMIT"
            } else {
                "ROLLBACK"
            })
            .await
            .unwrap();
        positions
    }

    /// Appends `count` events to `stream` on a session of its own, and
    /// commits or rolls back.
    pub async fn append(&self, stream: &str, count: usize, ending: Ending) -> Vec<i64> {
        let client = connect_to(&self.url).await;
        self.append_on(&client, stream, count, None, ending).await
    }

    /// [`Store::append`] on the store's own session.
    pub async fn append_here(&self, stream: &str, count: usize, ending: Ending) -> Vec<i64> {
        self.append_on(&self.client, stream, count, None, ending)
            .await
    }

    /// Appends one event with a given message id (a duplicate burns a position).
    pub async fn append_with_id(&self, stream: &str, id: Uuid) -> Vec<i64> {
        let client = connect_to(&self.url).await;
        self.append_on(&client, stream, 1, Some(id), Ending::Commit)
            .await
    }

    /// Starts an append and leaves its transaction open.
    pub async fn append_open(&self, stream: &str, count: usize) -> OpenAppend {
        let client = connect_to(&self.url).await;
        client.batch_execute("BEGIN").await.unwrap();
        let positions = self
            .append_in(&client, stream, count, None)
            .await
            .expect("append");
        OpenAppend {
            client,
            positions,
            stream: stream.into(),
        }
    }

    /// Inserts one event of `stream` at `position` itself, with `OVERRIDING
    /// SYSTEM VALUE` (no draw from the identity: as a second filler or an
    /// import writes), and leaves its transaction open: it holds the
    /// position's key, and no lock on the identity's sequence, so the
    /// transaction-end proof does not see it and the fill's key wait
    /// decides.
    pub async fn insert_open_at(&self, stream: &str, position: i64) -> OpenAppend {
        let s = &self.schema;
        let client = connect_to(&self.url).await;
        client
            .execute(
                &format!("INSERT INTO {s}.streams (stream_name) VALUES ($1) ON CONFLICT (stream_name) DO NOTHING"),
                &[&stream],
            )
            .await
            .expect("the stream's row");
        client.batch_execute("BEGIN").await.unwrap();
        client
            .execute(
                &format!(
                    "INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, global_position, json_data, created)
                     OVERRIDING SYSTEM VALUE
                     SELECT gen_random_uuid(), '{EVENT_TYPE}', stream_id, version + 1, $2, '{{}}', now()
                     FROM {s}.streams WHERE stream_name = $1"
                ),
                &[&stream, &position],
            )
            .await
            .expect("the explicit insert");
        OpenAppend {
            client,
            positions: vec![position],
            stream: stream.into(),
        }
    }

    /// An event on stream A, a rolled-back append, an event on stream B, and
    /// an insert at the rolled-back position left open
    /// ([`Store::insert_open_at`]): a hole below the head whose key an open
    /// transaction holds, which the transaction-end proof does not see.
    pub async fn open_insert_between(&self) -> OpenAppend {
        self.append("A", 1, Ending::Commit).await;
        let hole = self.append("X", 1, Ending::RollbackAfterInsert).await[0];
        self.append("B", 1, Ending::Commit).await;
        self.insert_open_at("slow", hole).await
    }

    /// An event on stream A, then for each width a rolled-back append of that
    /// many events (streams X, Y, Z, ...) and an event (streams B, C, D,
    /// ...): holes of those widths between committed events. The holes'
    /// positions.
    pub async fn append_holes(&self, widths: &[usize]) -> Vec<Vec<i64>> {
        const COMMITTED: [&str; 8] = ["A", "B", "C", "D", "E", "F", "G", "H"];
        const ROLLED_BACK: [&str; 7] = ["X", "Y", "Z", "U", "V", "W", "T"];
        assert!(widths.len() <= ROLLED_BACK.len(), "at most 7 holes");
        self.append(COMMITTED[0], 1, Ending::Commit).await;
        let mut holes = Vec::new();
        for (i, width) in widths.iter().enumerate() {
            holes.push(
                self.append(ROLLED_BACK[i], *width, Ending::RollbackAfterInsert)
                    .await,
            );
            self.append(COMMITTED[i + 1], 1, Ending::Commit).await;
        }
        holes
    }

    /// An event on stream A, an append of `count` events to stream `slow`
    /// left open, an event on stream B: the open append's positions are a
    /// hole below the head until it ends.
    pub async fn open_append_between(&self, count: usize) -> OpenAppend {
        self.append("A", 1, Ending::Commit).await;
        let open = self.append_open("slow", count).await;
        self.append("B", 1, Ending::Commit).await;
        open
    }

    /// `rows` events of one stream `bulk`, inserted in one statement at the
    /// positions the SQL expression `position` gives for `g` = 1..=`rows`
    /// (`g * 2` leaves a hole before every row), the identity moved past the
    /// highest. For tables too large to append event by event.
    pub async fn insert_bulk(&self, rows: i64, position: &str) {
        let s = &self.schema;
        self.client
            .batch_execute(&format!(
                "INSERT INTO {s}.streams (stream_name, version) VALUES ('bulk', {rows} - 1);
                 INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, global_position, json_data, created)
                 OVERRIDING SYSTEM VALUE
                 SELECT gen_random_uuid(), '{EVENT_TYPE}', (SELECT stream_id FROM {s}.streams WHERE stream_name = 'bulk'), g - 1, {position}, '{{}}', now()
                 FROM generate_series(1, {rows}) g;
                 SELECT setval(pg_get_serial_sequence('{s}.messages', 'global_position'), (SELECT MAX(global_position) FROM {s}.messages));"
            ))
            .await
            .expect("insert the bulk rows");
    }

    /// Moves the identity so the next append lands `gap` positions further on
    /// (what SQL Server's identity cache does after a failover).
    pub async fn try_jump_identity(&self, gap: i64) -> Result<(), tokio_postgres::Error> {
        let s = &self.schema;
        self.client
            .execute(
                &format!(
                    "SELECT setval(pg_get_serial_sequence('{s}.messages', 'global_position'),
                       (SELECT last_value FROM {s}.messages_global_position_seq) + $1)"
                ),
                &[&gap],
            )
            .await?;
        Ok(())
    }

    pub async fn jump_identity(&self, gap: i64) {
        self.try_jump_identity(gap).await.expect("jump identity");
    }

    /// (position, stream, type) of every row, in position order.
    pub async fn rows(&self) -> Vec<(i64, String, String)> {
        let s = &self.schema;
        self.client
            .query(
                &format!("SELECT m.global_position, s.stream_name::text, m.message_type::text FROM {s}.messages m JOIN {s}.streams s USING (stream_id) ORDER BY 1"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    pub async fn tombstone_positions(&self) -> Vec<i64> {
        self.rows()
            .await
            .into_iter()
            .filter(|r| r.2 == TOMBSTONE_TYPE)
            .map(|r| r.0)
            .collect()
    }

    /// The highest position, 0 in an empty store.
    pub async fn try_head(&self) -> Result<i64, tokio_postgres::Error> {
        let s = &self.schema;
        Ok(self
            .client
            .query_one(
                &format!("SELECT COALESCE(MAX(global_position), 0) FROM {s}.messages"),
                &[],
            )
            .await?
            .get(0))
    }

    pub async fn head(&self) -> i64 {
        self.try_head().await.unwrap()
    }

    /// Positions missing between 1 and the head.
    pub async fn missing(&self) -> Vec<i64> {
        let s = &self.schema;
        self.client
            .query(
                &format!(
                    "SELECT g FROM generate_series(1, (SELECT COALESCE(MAX(global_position), 0) FROM {s}.messages)) g
                     WHERE NOT EXISTS (SELECT 1 FROM {s}.messages m WHERE m.global_position = g) ORDER BY g"
                ),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// How many positions are missing between 1 and the head (one aggregate,
    /// for large tables).
    pub async fn try_missing_count(&self) -> Result<i64, tokio_postgres::Error> {
        let s = &self.schema;
        Ok(self
            .client
            .query_one(
                &format!("SELECT COALESCE(MAX(global_position), 0) - COUNT(*) FROM {s}.messages"),
                &[],
            )
            .await?
            .get(0))
    }

    /// Polls until no position below the head is missing, or `limit` passes;
    /// whether it got there.
    pub async fn wait_until_healed(&self, limit: Duration) -> bool {
        let started = Instant::now();
        while !self.missing().await.is_empty() {
            if started.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        true
    }

    /// Asserts invariant 5: the tombstone stream's positions are 0..n-1 and
    /// its version n-1; returns n.
    pub async fn assert_tombstone_stream_consistent(&self) -> i64 {
        let s = &self.schema;
        let row = self
            .client
            .query_opt(
                &format!(
                    "SELECT s.version, COUNT(m.*), COALESCE(MAX(m.stream_position), -1), COUNT(DISTINCT m.stream_position)
                     FROM {s}.streams s LEFT JOIN {s}.messages m USING (stream_id) WHERE s.stream_name = $1 GROUP BY s.version"
                ),
                &[&TOMBSTONE_STREAM],
            )
            .await
            .unwrap();
        let Some(row) = row else { return 0 };
        let (version, count, max, distinct): (i32, i64, i32, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        assert_eq!(
            i64::from(version),
            count - 1,
            "tombstone stream version {version} but {count} rows"
        );
        assert_eq!(
            i64::from(max),
            count - 1,
            "tombstone positions end at {max} but {count} rows"
        );
        assert_eq!(distinct, count);
        count
    }

    pub async fn set_checkpoint(&self, id: &str, position: Option<i64>) {
        let s = &self.schema;
        self.client
            .execute(&format!("INSERT INTO {s}.checkpoints (id, position) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET position = $2"), &[&id, &position])
            .await
            .unwrap();
    }
}
