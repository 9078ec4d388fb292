//! `gap-healer check`: the preflight, one finding a line (or a JSON object
//! of them) per store.

use std::sync::Arc;

use super::one_shot::Out;
use super::{plural, Failure, Format, EXIT_INCOMPLETE, EXIT_OK};
use crate::config::{commands, Flags, Store};
use crate::engine::{self, Engine, WatermarkTable};

type CheckFlags = Flags<{ commands::CHECK }>;

pub(super) const CHECK_EXIT: &str = "\
Exit codes (in a fleet, the highest of any store's):
  0  every check passed (a WARN finding is not a failure)
  2  bad usage or configuration
  3  a check failed, or the database is unreachable";

#[derive(clap::Args, Debug, Clone)]
pub struct CheckArgs {
    #[command(flatten)]
    pub flags: CheckFlags,
    /// Output: text, or json (one object per store, each on its own line: README, "JSON output").
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// What `check`'s configuration line says of the healed table: a described
/// table's profile, table and position column; nothing for Eventuous's own,
/// the default the line has always left unsaid.
fn configured_table(shape: &engine::profile::TableShape) -> String {
    match shape.tombstone {
        engine::profile::Tombstone::EventuousStream => String::new(),
        engine::profile::Tombstone::Columns(_) | engine::profile::Tombstone::StreamRow { .. } => {
            format!(
                "profile {}, table {}.{}, ",
                shape.kind,
                shape.table.as_str(),
                shape.position.as_str()
            )
        }
    }
}

pub(super) async fn check<E: Engine>(
    engine: Arc<E>,
    settings: &Store,
    format: Format,
    out: &Out,
) -> Result<u8, Failure> {
    let mut findings = vec![engine::Finding::pass(
        engine::Check::Configuration,
        format!(
            "engine {}, schema {}, {}gap_timeout {}, lock_timeout {}, connection {}",
            settings.engine,
            settings.store.schema.as_str(),
            configured_table(&settings.store.profile),
            humantime::format_duration(settings.gap_timeout),
            humantime::format_duration(settings.lock_timeout),
            settings.store.connection_string.redacted()
        ),
    )];
    match engine.preflight().await {
        Ok(more) => findings.extend(more),
        Err(e) => findings.push(engine::Finding::fail(engine::Check::Connection, e.message)),
    }
    let watermark_usable = findings
        .iter()
        .any(|f| f.check == engine::Check::Watermark && f.ok);
    if let Some(table) = engine.watermark_table().filter(|_| watermark_usable) {
        // The row itself: it must describe this store's table.
        match table.read_watermark(settings.name.as_str()).await {
            Ok(Some(p)) => findings.push(engine::Finding::pass(
                engine::Check::Watermark,
                format!("store {}: published up to position {p}", settings.name),
            )),
            Ok(None) => {}
            Err(e) => findings.push(engine::Finding::fail(engine::Check::Watermark, e.message)),
        }
    }
    let failed = findings.iter().filter(|f| !f.ok).count();
    let warnings = findings.iter().filter(|f| f.warning).count();
    match format {
        Format::Json => println!(
            "{}",
            serde_json::json!({ "store": settings.name, "ok": failed == 0, "warnings": warnings, "findings": findings })
        ),
        Format::Text => {
            for f in &findings {
                let label = match (f.ok, f.warning) {
                    (false, _) => "FAIL",
                    (true, true) => "WARN",
                    (true, false) => "ok  ",
                };
                out.line(format_args!("{label} {:<26} {}", f.what, f.detail));
            }
            let warned = match warnings {
                0 => String::new(),
                n => format!(" ({n} warning{})", plural(n as u64)),
            };
            out.line(if failed == 0 {
                format!("all checks passed{warned}")
            } else {
                format!("{failed} check(s) failed{warned}")
            });
        }
    }
    Ok(if failed == 0 {
        EXIT_OK
    } else {
        EXIT_INCOMPLETE
    })
}
