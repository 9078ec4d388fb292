//! What the one-shot commands (`scan`, `heal --once`, `check`, `install`)
//! share: each store's output ([`Out`]), the job that runs a command on a
//! store's engine ([`OneShot`]), and the healer they drive without a leader
//! election.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::progress::{progress, Shown};
use super::{check, heal, install, scan, Command, Failure};
use crate::config::Store;
use crate::engine::{Engine, LeaderLock, Opened, WithEngine};
use crate::healer::{Healer, Options};
use crate::leader::Leader;
use crate::telemetry::Health;

/// Where a one-shot command prints a store's lines: stdout, each line led
/// by `[store NAME] ` in a fleet.
pub(super) struct Out {
    pub(super) prefix: Option<String>,
}

impl Out {
    /// One line on stdout.
    pub(super) fn line(&self, text: impl std::fmt::Display) {
        println!("{}{text}", self.prefix.as_deref().unwrap_or_default());
    }

    /// One line on stderr (a remark beside the output, not part of it).
    pub(super) fn note(&self, text: impl std::fmt::Display) {
        eprintln!("{}{text}", self.prefix.as_deref().unwrap_or_default());
    }
}

/// A one-shot command on one store, on whichever engine
/// [`engine::open()`] opens for it.
pub(super) struct OneShot<'a> {
    pub(super) store: &'a Store,
    pub(super) command: &'a Command,
    pub(super) out: &'a Out,
}

impl<'a> WithEngine for OneShot<'a> {
    type Output = std::pin::Pin<Box<dyn std::future::Future<Output = Result<u8, Failure>> + 'a>>;

    fn with<E: Engine, L: LeaderLock>(self, opened: Opened<E, L>) -> Self::Output {
        Box::pin(dispatch(opened.engine, self.store, self.command, self.out))
    }
}

async fn dispatch<E: Engine>(
    engine: Arc<E>,
    store: &Store,
    command: &Command,
    out: &Out,
) -> Result<u8, Failure> {
    match command {
        Command::Scan(a) => scan::scan(engine, store, a.format, a.limit, a.all, out).await,
        Command::Heal(a) => heal::heal_once(engine, store, a.format, out).await,
        Command::Check(a) => check::check(engine, store, a.format, out).await,
        Command::Install(_) => install::install(engine, store, out).await,
        Command::Run(_)
        | Command::Sql(_)
        | Command::Config(_)
        | Command::Completions { .. }
        | Command::Man { .. } => {
            unreachable!("handled before a store's engine is made")
        }
    }
}

pub(super) async fn scan_all<E: Engine>(
    healer: &mut Healer<E>,
    stop: &CancellationToken,
) -> Result<crate::healer::Start, Failure> {
    let start = healer.begin().await?;
    let bar = progress((start.head - start.after).max(0) as u64, "scanning");
    let mut shown = Shown {
        bar: &bar,
        from: start.after,
        done: 0,
    };
    healer.scan_to_head(stop, &mut shown).await?;
    let done = shown.done;
    bar.finish(done, stop.is_cancelled());
    Ok(start)
}

pub(super) fn one_shot_healer<E: Engine>(engine: Arc<E>, settings: &Store) -> Healer<E> {
    let health = Health::for_store(
        &settings.name,
        settings.poll_interval,
        settings.lock_timeout,
    );
    Healer::new(engine, Options::from(settings), Leader::always(), health)
}
