//! The one place where the kit builds engines and in-process healers from
//! gap-healer's API, so a change of that API is made here once; and
//! [`FillRange`], the one-range fill only tests use.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use gap_healer::engine::mssql::MssqlEngine;
use gap_healer::engine::postgres::PostgresEngine;
use gap_healer::engine::{
    DbResult, Engine, Fence, FillOutcome, Ident, Openable, Pools, StoreSettings,
};
use gap_healer::gaps::PosRange;
use gap_healer::healer::{FillReport, Healer, Options};
use gap_healer::leader::Leader;
use gap_healer::secret::ConnectionString;
use gap_healer::telemetry::Health;

use crate::eventuous::{TOMBSTONE_STREAM, TOMBSTONE_TYPE};

/// A store's settings with the default tombstone stream and type.
pub fn settings(connection_string: &str, schema: &str, connect_timeout: Duration) -> StoreSettings {
    StoreSettings {
        connection_string: ConnectionString::new(connection_string),
        schema: Ident::parse(schema).expect("a test schema is a plain identifier"),
        tombstone_stream: TOMBSTONE_STREAM.into(),
        tombstone_type: TOMBSTONE_TYPE.into(),
        connect_timeout,
        watermark_table: None,
        profile: gap_healer::engine::profile::TableShape::eventuous(),
    }
}

/// The PostgreSQL engine, as the daemon builds it.
pub fn postgres(settings: &StoreSettings) -> DbResult<Arc<PostgresEngine>> {
    postgres_sharing(settings, &Pools::default())
}

/// The PostgreSQL engine as the daemon's factory opens it for a fleet:
/// sharing `pools` (and its head readings) with the stores of one database.
pub fn postgres_sharing(settings: &StoreSettings, pools: &Pools) -> DbResult<Arc<PostgresEngine>> {
    Ok(Arc::new(PostgresEngine::engine_for(settings, pools)?))
}

/// The SQL Server engine, as the daemon builds it.
pub fn mssql(settings: &StoreSettings) -> DbResult<MssqlEngine> {
    MssqlEngine::new(settings)
}

/// [`Engine::fill_ranges`] for one range: what the tests of a single
/// fill call, kept out of the engine's contract since the healer never
/// needs it.
pub trait FillRange: Engine {
    fn fill(
        &self,
        range: PosRange,
        lock_timeout: Duration,
        fence: &Fence,
    ) -> impl Future<Output = DbResult<FillOutcome>> + Send {
        async move { self.fill_ranges(&[range], lock_timeout, fence).await }
    }
}

impl<E: Engine> FillRange for E {}

/// A healer in this process that always leads, with the health thresholds
/// the daemon derives from the same options (poll interval, lock timeout).
pub fn healer<E: Engine>(engine: Arc<E>, options: Options) -> Healer<E> {
    let health = Health::new(options.poll_interval, options.lock_timeout);
    Healer::new(engine, options, Leader::always(), health)
}

/// The 10,000-wide hole around one held position, both engines' test: one
/// scan must track exactly `first + 1 ..= last - 1`; then everything due is
/// filled, the figures printed, and every position but the held one must be
/// a tombstone.
pub async fn fill_wide_hole_around_one_held<E: Engine>(
    h: &mut Healer<E>,
    first: i64,
    last: i64,
) -> FillReport {
    h.scan_step().await.unwrap();
    assert_eq!(
        h.tracker().ranges(),
        vec![PosRange::new(first + 1, last - 1).unwrap()]
    );
    let started = std::time::Instant::now();
    let report = h
        .fill_due(&tokio_util::sync::CancellationToken::new())
        .await;
    let took = started.elapsed();
    println!(
        "10,000-wide hole with one held position: {} tombstones in {took:?}, {} statements, {} lock timeouts",
        report.tombstones, report.statements, report.held
    );
    assert_eq!(report.tombstones, (last - first - 2) as u64);
    report
}
