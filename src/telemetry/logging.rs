//! Logging to stderr: text or JSON lines, with colour only where a person
//! reads a terminal.

use crate::config::LogFormat;

/// Starts logging to stderr. `RUST_LOG`, when set, overrides `level`.
pub fn init_logging(format: LogFormat, level: &str) {
    use tracing_subscriber::EnvFilter;
    // tiberius logs every transaction at INFO and every server error (our
    // expected 2627/1222 refusals included) at ERROR; the engine reports each
    // real failure itself, with context. RUST_LOG=tiberius=debug brings it back.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("tiberius=off,{level}")));
    let colour = use_colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Colour in text logs only on a terminal, and not when `NO_COLOR` is set to
/// anything but the empty string (<https://no-color.org>): journald,
/// `kubectl logs` and files get plain text.
fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some(OsStr::new(""))));
        assert!(!use_colour(true, Some(OsStr::new("1"))));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some(OsStr::new(""))));
    }
}
