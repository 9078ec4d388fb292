//! What the one-shot commands that work on a store's engine (`scan`,
//! `heal --once`, `check`, `install`) share: their output ([`Out`]), and
//! the healer they drive without a leader election ([`one_shot_healer`],
//! [`scan_all`]). Which command runs on which store is `on_store.rs`'s.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::progress::{progress, Shown};
use super::Failure;
use crate::config::Store;
use crate::engine::Engine;
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

/// Begins the healer and scans to the head, showing progress: the
/// resolved start.
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

/// The healer a one-shot command drives: it always leads (no election),
/// with a health of its own that nothing serves.
pub(super) fn one_shot_healer<E: Engine>(engine: Arc<E>, settings: &Store) -> Healer<E> {
    let health = Health::for_store(
        &settings.name,
        settings.poll_interval,
        settings.lock_timeout,
    );
    Healer::new(engine, Options::from(settings), Leader::always(), health)
}
