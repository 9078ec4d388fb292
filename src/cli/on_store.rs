//! The commands that work on a store's engine (`scan`, `heal --once`,
//! `check`, `install`) as one value, [`OnStore`]: each selected store in
//! turn ([`each_store`]), the command run as the job handed to the engine
//! [`engine::open()`] opens for it. The commands import what they share
//! from `one_shot.rs`; only this file imports the commands.

use std::sync::Arc;

use tracing::Instrument;

use super::one_shot::Out;
use super::{check, heal, install, scan, CheckArgs, Failure, HealArgs, ScanArgs, EXIT_OK};
use crate::config::{Settings, Store};
use crate::engine::{self, Engine, LeaderLock, Opened, Pools, WithEngine};

/// A command that works on each store's engine, with what it was given:
/// only these reach a store, so none other needs an answer there.
pub(super) enum OnStore {
    Scan(ScanArgs),
    Heal(HealArgs),
    Check(CheckArgs),
    Install,
}

/// Runs `command` on each store `settings` selects (a store set's
/// databases listed once), one after another: the highest exit code of
/// any. In a fleet every line says its store.
pub(super) async fn each_store(settings: &Settings, command: &OnStore) -> Result<u8, Failure> {
    let pools = Pools::default();
    let stores = crate::fleet::expand(settings, &pools).await?;
    let many = settings.stores.len() + settings.sets.len() > 1 || stores.len() > 1;
    let mut worst = EXIT_OK;
    for store in &stores {
        // In a fleet every line says its store: each output line, each
        // object (its "store"), each log line (the store span).
        let out = Out {
            prefix: many.then(|| format!("[store {}] ", store.name)),
        };
        let span = if many {
            tracing::info_span!("store", store = %store.name)
        } else {
            tracing::Span::none()
        };
        let job = OneShot {
            store,
            command,
            out: &out,
        };
        let done = async { engine::open(store.engine, &store.store, &pools, job)?.await }
            .instrument(span)
            .await;
        match done {
            Ok(code) => worst = worst.max(code),
            // One store: its failure is the command's.
            Err(failure) if !many => return Err(failure),
            Err(failure) => {
                eprintln!("gap-healer: [store {}] {failure}", store.name);
                worst = worst.max(failure.exit_code());
            }
        }
        // Stopped by a signal: the stores after this one are not begun.
        if let Some(signal) = crate::shutdown::received() {
            return Ok(worst.max(signal.exit_code()));
        }
    }
    Ok(worst)
}

/// A one-shot command on one store, on whichever engine
/// [`engine::open()`] opens for it.
struct OneShot<'a> {
    store: &'a Store,
    command: &'a OnStore,
    out: &'a Out,
}

impl<'a> WithEngine for OneShot<'a> {
    type Output = std::pin::Pin<Box<dyn std::future::Future<Output = Result<u8, Failure>> + 'a>>;

    fn with<E: Engine, L: LeaderLock>(self, opened: Opened<E, L>) -> Self::Output {
        Box::pin(dispatch(opened.engine, self.store, self.command, self.out))
    }
}

/// The command, on the store's engine.
async fn dispatch<E: Engine>(
    engine: Arc<E>,
    store: &Store,
    command: &OnStore,
    out: &Out,
) -> Result<u8, Failure> {
    match command {
        OnStore::Scan(a) => scan::scan(engine, store, a.format, a.limit, a.all, out).await,
        OnStore::Heal(a) => heal::heal_once(engine, store, a.format, out).await,
        OnStore::Check(a) => check::check(engine, store, a.format, out).await,
        OnStore::Install => install::install(engine, out).await,
    }
}
