//! seed 003's ledger-core store: its `events` table in a schema of the
//! test's own (`tests/fixtures/ledger_core_postgres.sql`), and appends the
//! way its `AppendAsync` writes them (one stream, versions from the
//! caller's expected version), with or without its global advisory lock.

use tokio_postgres::Client;
use uuid::Uuid;

use crate::pg::{connect_to, pg_url, schema_name, Ending, Guard};

const FIXTURE: &str = include_str!("../../fixtures/ledger_core_postgres.sql");

/// The advisory lock key seed 003's appends take (any constant does).
pub const APPEND_LOCK_KEY: i64 = 3003;

/// The tombstone stream ledger-core's profile writes by default.
pub const TOMBSTONE_CATEGORY: &str = "$gap";

/// One test's ledger: a schema with the `events` table and a session; one
/// made by [`Ledger::new`] holds the guard that drops its schema when it
/// goes, also when the test fails.
pub struct Ledger {
    pub schema: String,
    pub client: Client,
    url: String,
    /// Last, so the ledger's own session is dropped before the cleanup runs.
    guard: Option<Guard>,
}

/// An append whose transaction is open: its positions are taken, not
/// committed.
pub struct OpenLedgerAppend {
    client: Client,
    pub positions: Vec<i64>,
}

impl OpenLedgerAppend {
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

impl Ledger {
    /// A fresh schema `gh_<tag>_<random>` with seed 003's table.
    pub async fn new(tag: &str) -> Ledger {
        let (url, schema) = (pg_url(), schema_name(tag));
        let guard = Guard::schema(&url, &schema);
        Ledger {
            guard: Some(guard),
            ..Ledger::create(&url, &schema).await
        }
    }

    /// `schema` with seed 003's table on the server `url` names, left there
    /// when the value goes (the chaos run's cluster is removed whole).
    pub async fn create(url: &str, schema: &str) -> Ledger {
        let client = connect_to(url).await;
        client
            .batch_execute(&FIXTURE.replace("__schema__", schema))
            .await
            .expect("create the ledger-core table");
        Ledger {
            schema: schema.into(),
            client,
            url: url.into(),
            guard: None,
        }
    }

    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The engine over this ledger with the ledger-core profile's defaults,
    /// as the daemon builds it.
    pub fn engine(&self) -> std::sync::Arc<gap_healer::engine::postgres::PostgresEngine> {
        use gap_healer::engine::profile::{TableShape, NIL_UUID};
        use gap_healer::engine::Ident;
        let mut settings =
            crate::engine::settings(&self.url, &self.schema, std::time::Duration::from_secs(5));
        settings.tombstone_stream = TOMBSTONE_CATEGORY.into();
        settings.profile = TableShape::ledger_core(
            Ident::parse("events").unwrap(),
            Ident::parse("position").unwrap(),
            TOMBSTONE_CATEGORY,
            NIL_UUID,
            &settings.tombstone_type,
        );
        crate::engine::postgres(&settings).expect("engine")
    }

    /// `--engine postgres --connection-string URL --schema SCHEMA --profile ledger-core`.
    pub fn args(&self) -> Vec<String> {
        [
            "--engine",
            "postgres",
            "--connection-string",
            &self.url,
            "--schema",
            &self.schema,
            "--profile",
            "ledger-core",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// `args`, then this ledger's flags.
    pub fn argv(&self, args: &[&str]) -> Vec<String> {
        args.iter()
            .map(|s| s.to_string())
            .chain(self.args())
            .collect()
    }

    /// The append statement: `count` events of a new stream of `category`
    /// at versions 1..=count, positions returned.
    fn insert_sql(&self) -> String {
        format!(
            "INSERT INTO {}.events (stream_category, stream_id, version, event_type, data) \
             SELECT $1::text, $2::uuid, v, 'Deposited', jsonb_build_object('n', v) \
             FROM generate_series(1, $3::bigint) AS v RETURNING position",
            self.schema
        )
    }

    /// Appends `count` events to a new stream of `category` on a session of
    /// its own; with `global_lock`, behind seed 003's advisory lock.
    pub async fn append(
        &self,
        category: &str,
        count: i64,
        ending: Ending,
        global_lock: bool,
    ) -> Vec<i64> {
        let open = self.append_open(category, count, global_lock).await;
        let positions = open.positions.clone();
        match ending {
            Ending::Commit => open.commit().await.expect("commit"),
            Ending::RollbackAfterInsert => open.rollback().await,
        }
        positions
    }

    /// Inserts `count` events to a new stream and leaves the transaction open.
    pub async fn append_open(
        &self,
        category: &str,
        count: i64,
        global_lock: bool,
    ) -> OpenLedgerAppend {
        let client = connect_to(&self.url).await;
        client.batch_execute("BEGIN").await.expect("begin");
        if global_lock {
            client
                .execute("SELECT pg_advisory_xact_lock($1)", &[&APPEND_LOCK_KEY])
                .await
                .expect("append lock");
        }
        let rows = client
            .query(&self.insert_sql(), &[&category, &Uuid::new_v4(), &count])
            .await
            .expect("append");
        OpenLedgerAppend {
            client,
            positions: rows.iter().map(|r| r.get(0)).collect(),
        }
    }

    /// Every row as (position, stream_category, version).
    pub async fn rows(&self) -> Vec<(i64, String, i64)> {
        self.client
            .query(
                &format!(
                    "SELECT position, stream_category, version FROM {}.events ORDER BY position",
                    self.schema
                ),
                &[],
            )
            .await
            .expect("read events")
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect()
    }

    /// Positions of the tombstone stream's rows, with their versions.
    pub async fn tombstones(&self) -> Vec<(i64, i64)> {
        self.rows()
            .await
            .into_iter()
            .filter(|(_, c, _)| c == TOMBSTONE_CATEGORY)
            .map(|(p, _, v)| (p, v))
            .collect()
    }

    /// Positions between the lowest and the highest row that hold nothing.
    pub async fn missing(&self) -> Vec<i64> {
        self.client
            .query(
                &format!(
                    "SELECT g.p FROM (SELECT MIN(position) AS lo, MAX(position) AS hi FROM {s}.events) AS b \
                     CROSS JOIN LATERAL generate_series(b.lo, b.hi) AS g (p) \
                     WHERE NOT EXISTS (SELECT 1 FROM {s}.events AS e WHERE e.position = g.p) ORDER BY g.p",
                    s = self.schema
                ),
                &[],
            )
            .await
            .expect("missing positions")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Drops the schema now, on the caller's runtime, instead of when the
    /// ledger goes.
    pub async fn drop_schema(mut self) {
        self.client
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema))
            .await
            .expect("drop schema");
        if let Some(guard) = self.guard.take() {
            guard.drop_now().await;
        }
    }
}
