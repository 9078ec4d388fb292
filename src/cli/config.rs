//! `gap-healer config`: the effective configuration as TOML, secrets
//! redacted, each value with where it came from; nothing connects.

use super::{print_out, Failure};
use crate::config::Settings;

/// Prints `settings` as the file that would make them.
pub(super) fn print(settings: &Settings) -> Result<u8, Failure> {
    print_out(settings.to_toml().as_bytes())
}
