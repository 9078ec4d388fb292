//! What was read: the value types of the configuration's own that the
//! keys' parsers make ([`StartFrom`], [`LogFormat`]).

use std::fmt;

/// Where the first scan starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartFrom {
    /// The lowest position in the Checkpoints table; `lookback` below the head without one.
    Checkpoints,
    /// The current head: only holes that appear from now on.
    Head,
    /// This position (a backfill from here).
    Position(i64),
}

impl fmt::Display for StartFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartFrom::Checkpoints => f.write_str("checkpoints"),
            StartFrom::Head => f.write_str("head"),
            StartFrom::Position(p) => write!(f, "{p}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}
