//! `gap-healer install`: the fill procedure created in each store's schema
//! (SQL Server procedure mode; elsewhere, nothing to install).

use std::sync::Arc;

use super::one_shot::Out;
use super::{Failure, EXIT_OK};
use crate::engine::Engine;

pub(super) const INSTALL_EXIT: &str = "\
Exit codes:
  0  installed, or nothing to install
  2  bad usage or configuration
  3  could not complete";

/// Installs what the store's engine needs installed, and says what it did.
pub(super) async fn install<E: Engine>(engine: Arc<E>, out: &Out) -> Result<u8, Failure> {
    let done = engine.install().await?;
    out.line(done);
    Ok(EXIT_OK)
}
