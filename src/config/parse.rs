//! The parsers the keys' rows use: text in, a typed value or why not out.
//! Each knows nothing of keys, layers or origins; the row that calls it
//! names the key, and the reader says where the text came from.

use std::time::Duration;

use crate::engine::Ident;

use super::read::StartFrom;

/// The closest of `candidates` to `word`, at most `max` edits away.
pub fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
    max: usize,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(word, c), c))
        .filter(|(d, _)| *d <= max)
        .min()
        .map(|(_, c)| c)
}

/// `[A-Za-z_][A-Za-z0-9_]*`, at most 128 characters: safe to splice into SQL.
pub fn parse_identifier(s: &str) -> Result<Ident, String> {
    Ident::parse(s)
}

/// A UUID in its canonical form (8-4-4-4-12 hex digits), lower case.
pub fn parse_uuid(s: &str) -> Result<String, String> {
    let groups: Vec<&str> = s.split('-').collect();
    let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
    if lengths == [8, 4, 4, 4, 12]
        && groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
    {
        Ok(s.to_ascii_lowercase())
    } else {
        Err("expected a UUID such as 00000000-0000-0000-0000-000000000000".into())
    }
}

/// A humantime duration with a unit (`250ms`, `5s`, `1m 30s`), at least `min`.
pub fn parse_duration(s: &str, min: Duration) -> Result<Duration, String> {
    if s.starts_with('-') {
        return Err("must not be negative".into());
    }
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(format!("give a unit, e.g. \"{s}ms\" or \"{s}s\""));
    }
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("not a duration ({e}); examples: 250ms, 5s, 1m"))?;
    if d < min {
        return Err(format!(
            "must be at least {}",
            humantime::format_duration(min)
        ));
    }
    if d > Duration::from_secs(7 * 24 * 3600) {
        return Err("must be at most 7 days".into());
    }
    Ok(d)
}

pub fn parse_start_from(s: &str) -> Result<StartFrom, String> {
    match s.to_ascii_lowercase().as_str() {
        "checkpoints" => Ok(StartFrom::Checkpoints),
        "head" => Ok(StartFrom::Head),
        n => n
            .parse::<i64>()
            .ok()
            .filter(|p| *p >= 0)
            .map(StartFrom::Position)
            .ok_or_else(|| {
                "expected checkpoints, head, or a position (a whole number, 0 or more)".into()
            }),
    }
}

pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err("expected true or false".into()),
    }
}

/// A name bound as a parameter: any text but control characters, not empty.
pub fn parse_name(s: &str, max: usize) -> Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".into());
    }
    if s.chars().count() > max {
        return Err(format!("must be at most {max} characters"));
    }
    if s.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(s.to_string())
}

pub const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// A level, or a tracing filter (`info,gap_healer=debug`). A bare word that is
/// not a level is refused: the filter would read it as a target name and
/// silence every other log line (`wran` for `warn`).
pub fn parse_log_level(s: &str) -> Result<String, String> {
    for directive in s.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare = directive
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | ':'));
        let level = directive.parse::<tracing::level_filters::LevelFilter>();
        if bare && level.is_err() {
            let hint = closest(&directive.to_ascii_lowercase(), LEVELS, 2)
                .map(|l| format!(" (did you mean `{l}`?)"))
                .unwrap_or_default();
            return Err(format!(
                "`{directive}` is not a level{hint}; expected {}, or target=level directives such as info,gap_healer=debug",
                LEVELS.join(", ")
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| s.to_string())
        .map_err(|e| format!("not a log level or filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn log_levels() {
        for ok in [
            "info",
            "WARN",
            "debug,tokio=off",
            "info,gap_healer=debug",
            "gap_healer=trace",
            "off",
            "",
        ] {
            assert_eq!(parse_log_level(ok), Ok(ok.to_string()));
        }
        let err = parse_log_level("wran").unwrap_err();
        assert!(err.contains("did you mean `warn`"), "{err}");
        let err = parse_log_level("info,gap_healer").unwrap_err();
        assert!(err.contains("`gap_healer` is not a level"), "{err}");
        assert!(parse_log_level("info[").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("250ms", Duration::ZERO),
            Ok(Duration::from_millis(250))
        );
        assert!(parse_duration("5", Duration::ZERO)
            .unwrap_err()
            .contains("unit"));
        assert!(parse_duration("-5s", Duration::ZERO)
            .unwrap_err()
            .contains("negative"));
        assert!(parse_duration("0s", Duration::from_millis(1))
            .unwrap_err()
            .contains("at least"));
        assert!(parse_duration("5 parsecs", Duration::ZERO).is_err());
    }

    proptest! {
        #[test]
        fn identifier_rule(s in "\\PC{0,140}") {
            let ok = parse_identifier(&s).is_ok();
            let re = !s.is_empty() && s.len() <= 128
                && s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            prop_assert_eq!(ok, re);
        }
    }
}
