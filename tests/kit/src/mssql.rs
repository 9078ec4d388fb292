//! SQL Server for the integration tests and the chaos run: where the server
//! comes from, one database per test, an append that does what Eventuous's
//! `append_events` does, and the pages a subscriber that follows Eventuous's
//! all-stream gap rules reads ([`Pages`]).
//!
//! # Where the server comes from
//! 1. `GAP_HEALER_TEST_MSSQL`: an ADO.NET connection string of a login that
//!    may create databases and logins (CI sets it for a `services:` container);
//! 2. else a `mcr.microsoft.com/mssql/server:2022-latest` container through
//!    testcontainers, when a Docker engine answers; it is shared by every test
//!    of the run, and left running when the run ends (a process exit drops no
//!    statics): its id is printed so it can be removed (`docker rm -f`);
//! 3. else no server.
//!
//! # Skipping honestly
//! Every SQL Server test is `#[ignore]`d, so a plain `cargo test` reports them
//! as ignored, never as passed. Run them with `cargo test --test integration
//! -- --ignored mssql::` (and the chaos run with `cargo test --test chaos --
//! --ignored sql_server`). Run that way without a server, each one prints
//! `SQL Server tests skipped: <reason>` and FAILS (panics with the reason): a
//! run that asked for SQL Server and did not get one must not look green.

use std::fmt::Write as _;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use gap_healer::engine::mssql::MssqlEngine;
use gap_healer::engine::StoreSettings;
use tiberius::{Row, ToSql, Uuid};
use tokio::net::TcpStream;
use tokio_util::compat::Compat;

pub use crate::eventuous::{EVENT_TYPE, TOMBSTONE_STREAM, TOMBSTONE_TYPE};
use crate::subscriber::PageRow;

pub const ENV: &str = "GAP_HEALER_TEST_MSSQL";
/// `on`: every test database gets optimized locking (SQL Server 2025).
pub const OPTIMIZED_LOCKING_ENV: &str = "GAP_HEALER_TEST_MSSQL_OPTIMIZED_LOCKING";
/// `on` or `off`: every test database gets READ_COMMITTED_SNAPSHOT so.
pub const RCSI_ENV: &str = "GAP_HEALER_TEST_MSSQL_RCSI";
pub const SCHEMA: &str = "eventuous";
const IMAGE_TAG: &str = "2022-latest";
const SA_PASSWORD: &str = "GapHealer-Test-2025!";
const FIXTURE: &str = include_str!("../../fixtures/eventuous_mssql.sql");
/// Eventuous's append procedures, batches separated by `GO` lines.
const PROCEDURES: &str = include_str!("../../fixtures/eventuous_mssql_procedures.sql");

pub type Client = tiberius::Client<Compat<TcpStream>>;

static SERVER: OnceLock<Result<String, String>> = OnceLock::new();

/// The admin connection string, or why there is none.
pub fn server() -> Result<&'static str, String> {
    SERVER
        .get_or_init(find_server)
        .as_deref()
        .map_err(Clone::clone)
}

/// The admin connection string. Without a server: prints the reason and
/// panics (see the module doc: these tests are ignored by default, and a run
/// that includes them must not pass without SQL Server).
pub fn require_server() -> &'static str {
    match server() {
        Ok(cs) => cs,
        Err(reason) => {
            eprintln!("SQL Server tests skipped: {reason}");
            panic!("SQL Server tests skipped: {reason}");
        }
    }
}

fn find_server() -> Result<String, String> {
    if let Ok(cs) = std::env::var(ENV) {
        if !cs.trim().is_empty() {
            return Ok(cs.trim().trim_end_matches(';').to_string());
        }
    }
    // testcontainers on a runtime of its own, in a thread that keeps the
    // container alive for the rest of the process.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("mssql-container".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(format!("no tokio runtime for testcontainers: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                match start_container().await {
                    Ok((container, cs)) => {
                        eprintln!(
                            "SQL Server test container {} is left running after the tests; remove it with `docker rm -f {}`",
                            container.id(),
                            container.id()
                        );
                        let _ = tx.send(Ok(cs));
                        std::future::pending::<()>().await;
                        drop(container);
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            });
        })
        .map_err(|e| format!("cannot start the container thread: {e}"))?;
    rx.recv()
        .map_err(|_| "the container thread died".to_string())?
}

async fn start_container() -> Result<
    (
        testcontainers::ContainerAsync<testcontainers_modules::mssql_server::MssqlServer>,
        String,
    ),
    String,
> {
    use testcontainers::runners::AsyncRunner;
    use testcontainers::ImageExt;
    use testcontainers_modules::mssql_server::MssqlServer;

    let container = MssqlServer::default()
        .with_accept_eula()
        .with_sa_password(SA_PASSWORD)
        .with_tag(IMAGE_TAG)
        .with_startup_timeout(Duration::from_secs(240))
        .start()
        .await
        .map_err(|e| format!("{ENV} is not set and no Docker engine answered ({e})"))?;
    let host = container
        .get_host()
        .await
        .map_err(|e| format!("container host: {e}"))?;
    let port = container
        .get_host_port_ipv4(1433)
        .await
        .map_err(|e| format!("container port: {e}"))?;
    let cs = format!(
        "Server=tcp:{host},{port};User Id=sa;Password={SA_PASSWORD};Encrypt=true;TrustServerCertificate=true"
    );
    // The image logs "ready" a little before logins work.
    crate::wait::retry(Duration::from_secs(60), Duration::from_millis(500), || {
        connect(&cs)
    })
    .await
    .map_err(|e| format!("container never accepted a login: {e}"))?;
    Ok((container, cs))
}

/// A tiberius client for an ADO.NET string, opened as the engine opens its
/// sessions (so `Encrypt=false` reaches a server without TLS, as SqlClient does).
pub async fn connect(cs: &str) -> Result<Client, String> {
    gap_healer::engine::mssql::open_session(&gap_healer::secret::ConnectionString::new(cs))
        .await
        .map_err(|e| format!("login: {}", e.message))
}

/// `cs` without its credentials and database, plus `extra`.
fn with_keys(cs: &str, extra: &str) -> String {
    let dropped = [
        "user id",
        "uid",
        "user",
        "password",
        "pwd",
        "database",
        "initial catalog",
    ];
    let mut out = String::new();
    for pair in cs.split(';').filter(|p| !p.trim().is_empty()) {
        let key = pair
            .split('=')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if !dropped.contains(&key.as_str()) {
            let _ = write!(out, "{pair};");
        }
    }
    out + extra
}

pub async fn exec(client: &mut Client, sql: &str) {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{e}\nin:\n{sql}"))
        .into_results()
        .await
        .unwrap_or_else(|e| panic!("{e}\nin:\n{sql}"));
}

/// The watermark table made from the script `gap-healer sql
/// --watermark-table ...` printed: its last batch, without the GRANT to the
/// placeholder user (the tests log in as the admin), its two statements
/// (the schema, then the table) sent apart.
pub async fn create_watermark_table(client: &mut Client, script: &str) {
    let ddl = script
        .split("\nGO\n")
        .last()
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("GRANT") && !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let (create_schema, create_table) = ddl.split_once("IF OBJECT_ID").expect("two statements");
    exec(client, create_schema).await;
    exec(client, &format!("IF OBJECT_ID{create_table}")).await;
}

pub async fn rows(client: &mut Client, sql: &str, params: &[&dyn ToSql]) -> Vec<Row> {
    client
        .query(sql, params)
        .await
        .unwrap_or_else(|e| panic!("{e}\nin:\n{sql}"))
        .into_first_result()
        .await
        .unwrap_or_else(|e| panic!("{e}\nin:\n{sql}"))
}

/// One row of Messages, joined with its stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub position: i64,
    pub stream: String,
    pub stream_position: i32,
    pub message_type: String,
}

/// A database of its own for one test, with the Eventuous schema. It is a
/// guard: when it goes out of scope, also when the test fails or panics, the
/// database and the logins made for it are dropped (on a thread of its own:
/// see [`crate::cleanup`]); [`TestDb::drop`] does it on the caller's runtime.
pub struct TestDb {
    pub name: String,
    admin: &'static str,
    logins: Vec<String>,
    /// Whether the drop is still to be done.
    armed: bool,
}

/// DDL of concurrent tests runs one at a time: Babelfish (PostgreSQL's
/// catalogs) fails concurrent CREATE DATABASE, logins and grants with
/// "tuple concurrently updated".
fn ddl() -> &'static tokio::sync::Mutex<()> {
    static DDL: OnceLock<tokio::sync::Mutex<()>> = OnceLock::new();
    DDL.get_or_init(|| tokio::sync::Mutex::new(()))
}

/// Whether the test server is Babelfish for PostgreSQL (asked once).
pub async fn is_babelfish() -> bool {
    static BABELFISH: tokio::sync::OnceCell<bool> = tokio::sync::OnceCell::const_new();
    *BABELFISH
        .get_or_init(|| async {
            let mut c = connect(require_server())
                .await
                .unwrap_or_else(|e| panic!("SQL Server at {ENV}: {e}"));
            let r = rows(&mut c, "SELECT CAST(@@VERSION AS NVARCHAR(400))", &[]).await;
            r.first()
                .and_then(|r| r.get::<&str, _>(0))
                .is_some_and(|v| v.contains("Babelfish"))
        })
        .await
}

/// On Babelfish, says that the calling test checks a behaviour Babelfish
/// lacks and returns true (the test then returns early): printed, and kept
/// in `target/tmp/babelfish-skips.txt` for the run's summary.
pub async fn skipped_on_babelfish(test: &str, reason: &str) -> bool {
    if !is_babelfish().await {
        return false;
    }
    let line = format!("{test}: skipped on Babelfish: {reason}");
    eprintln!("{line}");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/tmp");
    let _ = std::fs::create_dir_all(&dir);
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("babelfish-skips.txt"))
    {
        use std::io::Write as _;
        let _ = writeln!(f, "{line}");
    }
    true
}

impl TestDb {
    pub async fn create() -> TestDb {
        TestDb::create_named(&format!(
            "gap_healer_{}",
            &Uuid::new_v4().simple().to_string()[..12]
        ))
        .await
    }

    /// [`TestDb::create`] with a name of the caller's (a store set's pattern
    /// must match its own databases only).
    pub async fn create_named(name: &str) -> TestDb {
        let admin = require_server();
        // The guard first, so a creation that fails half way is dropped
        // too; the DDL lock in an inner scope, so it is released before the
        // guard's drop takes it.
        let db = TestDb {
            name: name.to_string(),
            admin,
            logins: Vec::new(),
            armed: true,
        };
        {
            let _ddl = ddl().lock().await;
            let mut master = connect(admin)
                .await
                .unwrap_or_else(|e| panic!("SQL Server at {ENV}: {e}"));
            exec(&mut master, &format!("CREATE DATABASE [{}];", db.name)).await;
            let mut client = db.client().await;
            exec(&mut client, FIXTURE).await;
            for batch in PROCEDURES.split("\nGO\n").filter(|b| b.contains("CREATE")) {
                exec(&mut client, batch).await;
            }
            db.apply_database_options(&mut master).await;
        }
        db
    }

    /// The database options a CI job asks for through the environment, set
    /// on each test's database and checked, so a job that means to test
    /// optimized locking cannot pass without it:
    /// `GAP_HEALER_TEST_MSSQL_OPTIMIZED_LOCKING=on` (accelerated database
    /// recovery, then optimized locking: SQL Server 2025) and
    /// `GAP_HEALER_TEST_MSSQL_RCSI=on|off`.
    async fn apply_database_options(&self, master: &mut Client) {
        let wanted = |name: &str| {
            std::env::var(name)
                .ok()
                .map(|v| v.trim().eq_ignore_ascii_case("on"))
        };
        if let Some(on) = wanted(OPTIMIZED_LOCKING_ENV) {
            let state = if on { "ON" } else { "OFF" };
            if on {
                exec(
                    master,
                    &format!(
                        "ALTER DATABASE [{}] SET ACCELERATED_DATABASE_RECOVERY = ON;",
                        self.name
                    ),
                )
                .await;
            }
            exec(
                master,
                &format!(
                    "ALTER DATABASE [{}] SET OPTIMIZED_LOCKING = {state} WITH ROLLBACK IMMEDIATE;",
                    self.name
                ),
            )
            .await;
            let got = self
                .scalar(
                    "SELECT CAST(DATABASEPROPERTYEX(DB_NAME(), 'IsOptimizedLockingOn') AS BIGINT)",
                )
                .await;
            assert_eq!(got, Some(i64::from(on)), "OPTIMIZED_LOCKING {state}");
        }
        if let Some(on) = wanted(RCSI_ENV) {
            self.set_read_committed_snapshot(on).await;
        }
    }

    /// The server's admin connection string, without a database.
    pub fn admin(&self) -> &'static str {
        self.admin
    }

    /// The admin's connection string for this database.
    pub fn connection_string(&self) -> String {
        format!("{};Database={}", self.admin, self.name)
    }

    pub fn settings_for(&self, cs: &str) -> StoreSettings {
        crate::engine::settings(cs, SCHEMA, Duration::from_secs(10))
    }

    pub fn settings(&self) -> StoreSettings {
        self.settings_for(&self.connection_string())
    }

    /// [`TestDb::engine`] publishing the watermark in `table`.
    pub fn engine_with_watermark(&self, table: &str) -> MssqlEngine {
        let mut settings = self.settings();
        let table = gap_healer::engine::QualifiedName::parse(table).expect("schema.table");
        settings.watermark_table = Some(table);
        crate::engine::mssql(&settings).expect("engine")
    }

    /// The engine as the admin, as the daemon builds it.
    pub fn engine(&self) -> MssqlEngine {
        crate::engine::mssql(&self.settings()).expect("engine")
    }

    pub async fn client(&self) -> Client {
        connect(&self.connection_string())
            .await
            .expect("connect to the test database")
    }

    pub async fn master(&self) -> Client {
        connect(self.admin).await.expect("connect to master")
    }

    pub async fn scalar(&self, sql: &str) -> Option<i64> {
        let mut c = self.client().await;
        let rows = rows(&mut c, sql, &[]).await;
        rows.first().and_then(|r| r.get::<i64, _>(0))
    }

    pub async fn ident_current(&self) -> i64 {
        self.scalar("SELECT CAST(IDENT_CURRENT(N'eventuous.Messages') AS BIGINT)")
            .await
            .expect("IDENT_CURRENT")
    }

    pub async fn head(&self) -> Option<i64> {
        self.scalar("SELECT MAX(GlobalPosition) FROM eventuous.Messages")
            .await
    }

    /// Every committed row, in position order.
    pub async fn messages(&self) -> Vec<Message> {
        let mut c = self.client().await;
        rows(
            &mut c,
            "SELECT m.GlobalPosition, s.StreamName, m.StreamPosition, m.MessageType \
             FROM eventuous.Messages AS m INNER JOIN eventuous.Streams AS s ON s.StreamId = m.StreamId \
             ORDER BY m.GlobalPosition",
            &[],
        )
        .await
        .iter()
        .map(|r| Message {
            position: r.get::<i64, _>(0).unwrap_or(-1),
            stream: r.get::<&str, _>(1).unwrap_or_default().to_string(),
            stream_position: r.get::<i32, _>(2).unwrap_or(-1),
            message_type: r.get::<&str, _>(3).unwrap_or_default().to_string(),
        })
        .collect()
    }

    pub async fn message_at(&self, position: i64) -> Option<Message> {
        self.messages()
            .await
            .into_iter()
            .find(|m| m.position == position)
    }

    /// The tombstone stream's Version, `None` when the stream does not exist.
    pub async fn tombstone_version(&self) -> Option<i64> {
        self.scalar("SELECT CAST([Version] AS BIGINT) FROM eventuous.Streams WHERE StreamName = N'__tombstones__'")
            .await
    }

    /// Invariant 5: the tombstone stream's positions are 0..n-1, Version n-1.
    pub async fn assert_tombstone_stream_contiguous(&self) {
        let tombstones: Vec<Message> = self
            .messages()
            .await
            .into_iter()
            .filter(|m| m.stream == TOMBSTONE_STREAM)
            .collect();
        let mut positions: Vec<i32> = tombstones.iter().map(|m| m.stream_position).collect();
        positions.sort_unstable();
        let n = positions.len() as i32;
        assert_eq!(
            positions,
            (0..n).collect::<Vec<_>>(),
            "tombstone stream positions"
        );
        assert!(tombstones.iter().all(|m| m.message_type == TOMBSTONE_TYPE));
        let version = self.tombstone_version().await;
        if n > 0 || version.is_some() {
            assert_eq!(version, Some(i64::from(n) - 1), "tombstone stream Version");
        }
    }

    /// Appends `ids.len()` events to `stream` like Eventuous's append_events
    /// (stream row, one INSERT ... SELECT, Version update) in one committed
    /// transaction. Returns the positions, or the server error number.
    pub async fn try_append_ids(&self, stream: &str, ids: &[Uuid]) -> Result<Vec<i64>, u32> {
        let mut c = self.client().await;
        let sql = format!(
            "SET XACT_ABORT ON;\nBEGIN TRANSACTION;\n{}\nCOMMIT TRANSACTION;",
            append_sql(ids.len())
        );
        run_append(&mut c, &sql, stream, ids).await
    }

    pub async fn append(&self, stream: &str, count: usize) -> Vec<i64> {
        let ids: Vec<Uuid> = (0..count).map(|_| Uuid::new_v4()).collect();
        self.try_append_ids(stream, &ids)
            .await
            .unwrap_or_else(|code| panic!("append failed: {code}"))
    }

    /// An append that has inserted its rows and holds their keys, not yet
    /// committed or rolled back.
    pub async fn begin_append(&self, stream: &str, count: usize) -> OpenAppend {
        let mut c = self.client().await;
        exec(&mut c, "BEGIN TRANSACTION;").await;
        let ids: Vec<Uuid> = (0..count).map(|_| Uuid::new_v4()).collect();
        let sql = format!("SET XACT_ABORT ON;\n{}", append_sql(count));
        let positions = run_append(&mut c, &sql, stream, &ids)
            .await
            .expect("open append");
        OpenAppend {
            client: c,
            positions,
        }
    }

    /// An insert of one event of `stream` at `position` itself
    /// (`IDENTITY_INSERT`: as a second filler or an import writes), left
    /// open: it holds the position's key. On SQL Server it takes no lock the
    /// transaction-end proof reads as a drawer's beyond the table's IX; on
    /// Babelfish it takes the identity's sequence lock too.
    pub async fn begin_explicit(&self, stream: &str, position: i64) -> OpenAppend {
        let mut c = self.client().await;
        let stream_sql = stream.replace('\'', "''");
        exec(
            &mut c,
            &format!(
                "IF NOT EXISTS (SELECT 1 FROM eventuous.Streams WHERE StreamName = N'{stream_sql}')
                     INSERT INTO eventuous.Streams (StreamName, [Version]) VALUES (N'{stream_sql}', -1);"
            ),
        )
        .await;
        exec(
            &mut c,
            &format!(
                "SET XACT_ABORT ON; BEGIN TRANSACTION;
                 SET IDENTITY_INSERT eventuous.Messages ON;
                 INSERT INTO eventuous.Messages (GlobalPosition, MessageId, MessageType, StreamId, StreamPosition, JsonData, Created)
                 SELECT {position}, NEWID(), N'{EVENT_TYPE}', StreamId, [Version] + 1, N'{DATA}', SYSUTCDATETIME()
                 FROM eventuous.Streams WHERE StreamName = N'{stream_sql}';
                 SET IDENTITY_INSERT eventuous.Messages OFF;"
            ),
        )
        .await;
        OpenAppend {
            client: c,
            positions: vec![position],
        }
    }

    /// A hole at a rolled-back append's positions; returns them.
    pub async fn rolled_back_append(&self, stream: &str, count: usize) -> Vec<i64> {
        let open = self.begin_append(stream, count).await;
        let positions = open.positions.clone();
        open.rollback().await;
        positions
    }

    pub async fn set_read_committed_snapshot(&self, on: bool) {
        let mut m = self.master().await;
        let state = if on { "ON" } else { "OFF" };
        exec(
            &mut m,
            &format!(
                "ALTER DATABASE [{}] SET READ_COMMITTED_SNAPSHOT {state} WITH ROLLBACK IMMEDIATE;",
                self.name
            ),
        )
        .await;
        let got = self
            .scalar("SELECT CAST(is_read_committed_snapshot_on AS BIGINT) FROM sys.databases WHERE database_id = DB_ID()")
            .await;
        assert_eq!(got, Some(i64::from(on)), "READ_COMMITTED_SNAPSHOT {state}");
    }

    /// Moves the identity so the next append lands `gap` positions later.
    pub async fn jump_identity(&self, gap: i64) {
        let current = self.ident_current().await;
        let mut c = self.client().await;
        exec(
            &mut c,
            &format!(
                "DBCC CHECKIDENT ('eventuous.Messages', RESEED, {});",
                current + gap
            ),
        )
        .await;
    }

    /// A login and database user with exactly `grants` (T-SQL GRANT
    /// statements naming the user `{user}`); returns its connection string.
    pub async fn login_with(&mut self, grants: &[&str]) -> String {
        let _ddl = ddl().lock().await;
        let login = format!("gh_login_{}", &Uuid::new_v4().simple().to_string()[..10]);
        let password = format!("Gh-{}-x9!", Uuid::new_v4().simple());
        let mut m = self.master().await;
        exec(
            &mut m,
            &format!("CREATE LOGIN [{login}] WITH PASSWORD = N'{password}', CHECK_POLICY = OFF;"),
        )
        .await;
        self.logins.push(login.clone());
        let mut c = self.client().await;
        exec(
            &mut c,
            &format!("CREATE USER [{login}] FOR LOGIN [{login}];"),
        )
        .await;
        for grant in grants {
            exec(&mut c, &grant.replace("{user}", &format!("[{login}]"))).await;
        }
        with_keys(
            self.admin,
            &format!("Database={};User Id={login};Password={password}", self.name),
        )
    }

    /// Drops the database and the logins made for it now, on the caller's
    /// runtime, instead of when the value goes.
    pub async fn drop(mut self) {
        self.armed = false;
        drop_database(self.admin, &self.name, &self.logins).await;
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (admin, name, logins) = (self.admin, self.name.clone(), self.logins.clone());
        let what = format!("SQL Server database {name} and logins {logins:?}");
        crate::cleanup::run_to_end(&what, move || async move {
            drop_database(admin, &name, &logins).await;
            Ok(())
        });
    }
}

/// Drops the database `name` and the `logins` made for it, as the admin.
async fn drop_database(admin: &str, name: &str, logins: &[String]) {
    let _ddl = ddl().lock().await;
    let mut m = connect(admin).await.expect("connect to master");
    // Babelfish has no ALTER DATABASE ... SET SINGLE_USER.
    let babelfish = is_babelfish().await;
    let single_user = if babelfish {
        ""
    } else {
        "ALTER DATABASE [{0}] SET SINGLE_USER WITH ROLLBACK IMMEDIATE;"
    };
    let drop =
        format!("IF DB_ID(N'{{0}}') IS NOT NULL BEGIN {single_user} DROP DATABASE [{{0}}]; END;")
            .replace("{0}", name);
    let statements = std::iter::once(drop).chain(
        logins
            .iter()
            .map(|login| format!("IF SUSER_ID(N'{login}') IS NOT NULL DROP LOGIN [{login}];")),
    );
    for sql in statements {
        if babelfish {
            // Sessions of engines that just went out of scope close a
            // moment later, and Babelfish refuses to drop a database (or
            // a login) in use: retried, then left behind with a note.
            retry_on_babelfish(&mut m, &sql).await;
        } else {
            exec(&mut m, &sql).await;
        }
    }
}

/// Runs cleanup `sql` until it works (5 s at most), else says what was left.
async fn retry_on_babelfish(m: &mut Client, sql: &str) {
    let mut last = String::new();
    for _ in 0..20 {
        let result = match m.simple_query(sql).await {
            Ok(stream) => stream.into_results().await.map(|_| ()),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => return,
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("left behind on Babelfish ({sql}): {last}");
}

/// An append in flight.
pub struct OpenAppend {
    client: Client,
    pub positions: Vec<i64>,
}

impl OpenAppend {
    pub async fn commit(mut self) {
        exec(&mut self.client, "COMMIT TRANSACTION;").await;
    }

    pub async fn rollback(mut self) {
        exec(&mut self.client, "IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;").await;
    }
}

/// The test events' JSON data.
const DATA: &str = "{\"n\":1}";

/// An Eventuous-like append of `count` events of [`EVENT_TYPE`] (see
/// [`crate::eventuous::mssql::append_sql`]).
fn append_sql(count: usize) -> String {
    crate::eventuous::mssql::append_sql(EVENT_TYPE, count, false)
}

/// Runs an append batch for `stream` and `ids`: the positions it took, or the
/// server's error number.
async fn run_append(
    c: &mut Client,
    sql: &str,
    stream: &str,
    ids: &[Uuid],
) -> Result<Vec<i64>, u32> {
    let mut params: Vec<&dyn ToSql> = vec![&stream];
    for id in ids {
        params.push(id);
        params.push(&DATA);
    }
    let result = async { c.query(sql, &params).await?.into_first_result().await }.await;
    match result {
        Ok(rows) => Ok(rows.iter().filter_map(|r| r.get::<i64, _>(0)).collect()),
        Err(e) => Err(e
            .code()
            .unwrap_or_else(|| panic!("append failed without a server error: {e}"))),
    }
}

/// Up to `limit` rows from `next` on, in position order, as a subscriber
/// reads them (under the database's default isolation, as Eventuous's
/// reader does).
pub async fn page(
    c: &mut Client,
    next: i64,
    limit: u32,
) -> Result<Vec<PageRow>, tiberius::error::Error> {
    let sql = format!(
        "SELECT TOP ({limit}) m.GlobalPosition, m.MessageId, s.StreamName, m.MessageType, \
         CAST(CASE WHEN m.Created < DATEADD(HOUR, -1, SYSUTCDATETIME()) THEN 1 ELSE 0 END AS BIT) \
         FROM eventuous.Messages AS m INNER JOIN eventuous.Streams AS s ON s.StreamId = m.StreamId \
         WHERE m.GlobalPosition >= @P1 ORDER BY m.GlobalPosition"
    );
    let rows = c.query(sql, &[&next]).await?.into_first_result().await?;
    Ok(rows
        .iter()
        .map(|r| PageRow {
            position: r.get::<i64, _>(0).unwrap_or(-1),
            id: r.get::<Uuid, _>(1).unwrap_or_default(),
            stream: r.get::<&str, _>(2).unwrap_or_default().to_string(),
            message_type: r.get::<&str, _>(3).unwrap_or_default().to_string(),
            old: r.get::<bool, _>(4).unwrap_or(false),
        })
        .collect())
}

/// A SQL Server store's pages ([`page`], 100 rows each) for a
/// [`crate::subscriber::Subscriber`], on a session of their own (under the
/// database's default isolation, as Eventuous's reader reads).
pub struct Pages(pub Client);

impl Pages {
    pub async fn new(db: &TestDb) -> Pages {
        Pages(db.client().await)
    }
}

impl crate::subscriber::Pages for Pages {
    async fn page(&mut self, next: i64) -> Vec<PageRow> {
        page(&mut self.0, next, 100)
            .await
            .expect("the subscriber's page")
    }
}

/// `gap-healer SUBCOMMAND` on the database `db_cs` names, `flags` last.
pub fn healer(db_cs: &str, subcommand: &[&str], flags: &[&str]) -> Command {
    let store = [
        "--engine",
        "mssql",
        "--connection-string",
        db_cs,
        "--schema",
        SCHEMA,
    ];
    let args = subcommand.iter().chain(&store).chain(flags);
    crate::bin::command(args, std::iter::empty::<(&str, &str)>())
}
