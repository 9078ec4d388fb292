//! The healers' JSON logs (`--log-format json`) read back: lines by message,
//! and one process's leadership and fill statements on the clock its
//! timestamps use (microseconds since the Unix epoch).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

/// Microseconds since the Unix epoch: the clock the healers' log timestamps use.
pub fn now_us() -> i64 {
    to_us(SystemTime::now())
}

pub fn to_us(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as i64
}

/// `us` as an RFC 3339 timestamp with microseconds, for messages.
pub fn format_us(us: i64) -> String {
    humantime::format_rfc3339_micros(UNIX_EPOCH + Duration::from_micros(us.max(0) as u64))
        .to_string()
}

/// `2026-11-30T13:11:20.904869Z` as µs since the epoch (tracing's JSON timestamps).
pub fn parse_timestamp(ts: &str) -> Option<i64> {
    let (date, time) = ts.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<i64>());
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let micros: i64 = format!("{frac:0<6}")[..6].parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + hh * 3_600 + mm * 60 + ss) * 1_000_000) + micros)
}

/// The JSON lines whose message starts with `message`.
pub fn lines_with<S: AsRef<str>>(lines: &[S], message: &str) -> Vec<Value> {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l.as_ref()).ok())
        .filter(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(message))
        })
        .collect()
}

/// One fill statement a healer ran, from its log: it ran within [start_us, end_us].
#[derive(Clone, Debug)]
pub struct FillAttempt {
    /// Which process ran it (the caller's numbering).
    pub instance: usize,
    pub start_us: i64,
    pub end_us: i64,
    pub message: String,
    pub outcome: String,
    pub rows: u64,
    pub line: String,
}

/// What one process's log says.
#[derive(Clone, Debug, Default)]
pub struct LogFacts {
    /// When it said it became the leader, each time.
    pub became: Vec<i64>,
    /// Leadership intervals [became, stepped down or ended].
    pub leading: Vec<(i64, i64)>,
    pub fills: Vec<FillAttempt>,
    pub became_leader: usize,
    pub stepped_down: usize,
    pub errors: Vec<String>,
    pub unparsed: usize,
    pub panicked: bool,
    /// Fill cycles whose due holes waited for an open transaction that may
    /// have drawn them (one line each, `outcome` "open_transaction", no `ms`:
    /// no statement ran).
    pub waited: usize,
}

/// Reads a process's JSON log into leadership intervals and fill attempts;
/// a leadership still open at the end of the log lasts until `end_us` (when
/// the process ended, or now). A fill attempt is any line with an `outcome`
/// and an `ms` field (the fill statement's duration, logged when it
/// returned); it ran within [timestamp - ms - 1 ms, timestamp].
pub fn facts<S: AsRef<str>>(lines: &[S], instance: usize, end_us: i64) -> LogFacts {
    let mut f = LogFacts::default();
    let mut since: Option<i64> = None;
    for line in lines {
        let line = line.as_ref();
        if line.contains("panicked") {
            f.panicked = true;
        }
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            f.unparsed += 1;
            continue;
        };
        let Some(ts) = v["timestamp"].as_str().and_then(parse_timestamp) else {
            f.unparsed += 1;
            continue;
        };
        let message = v["message"].as_str().unwrap_or_default();
        if message.starts_with("became the leader") {
            f.became_leader += 1;
            f.became.push(ts);
            since.get_or_insert(ts);
        } else if message.starts_with("stepped down as leader") {
            f.stepped_down += 1;
            if let Some(s) = since.take() {
                f.leading.push((s, ts));
            }
        }
        if v["level"] == "ERROR" {
            f.errors.push(line.to_string());
        }
        if v["outcome"] == "open_transaction" && v["ms"].is_null() {
            f.waited += 1;
        }
        if let (Some(outcome), Some(ms)) = (v["outcome"].as_str(), v["ms"].as_u64()) {
            f.fills.push(FillAttempt {
                instance,
                start_us: ts - (ms as i64 + 1) * 1_000,
                end_us: ts,
                message: message.to_string(),
                outcome: outcome.to_string(),
                rows: v["rows"].as_u64().unwrap_or(0),
                line: line.to_string(),
            });
        }
    }
    if let Some(s) = since {
        f.leading.push((s, end_us));
    }
    f
}

/// The store a JSON log line of a fleet daemon belongs to: the `store` span
/// it was logged in (every line of a store's task is), else a `store` field
/// of its own; `None` for the process's own lines (start, listening, end).
pub fn store_of(v: &Value) -> Option<&str> {
    v["spans"]
        .as_array()
        .and_then(|spans| {
            spans
                .iter()
                .rev()
                .find(|s| s["name"] == "store")
                .and_then(|s| s["store"].as_str())
        })
        .or_else(|| v["store"].as_str())
}

/// [`facts`] over the lines of one store of a fleet daemon (see
/// [`store_of`]); a panic anywhere in the process counts for every store.
pub fn facts_of_store<S: AsRef<str>>(
    lines: &[S],
    store: &str,
    instance: usize,
    end_us: i64,
) -> LogFacts {
    let mut panicked = false;
    let mine: Vec<&str> = lines
        .iter()
        .map(AsRef::as_ref)
        .filter(|l| {
            panicked |= l.contains("panicked");
            serde_json::from_str::<Value>(l)
                .ok()
                .is_some_and(|v| store_of(&v) == Some(store))
        })
        .collect();
    let mut f = facts(&mine, instance, end_us);
    f.panicked |= panicked;
    f
}

/// The ERROR lines of a process that belong to no store (see [`store_of`]).
pub fn errors_outside_stores<S: AsRef<str>>(lines: &[S]) -> Vec<String> {
    lines
        .iter()
        .map(AsRef::as_ref)
        .filter(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .is_some_and(|v| v["level"] == "ERROR" && store_of(&v).is_none())
        })
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_to_the_microsecond() {
        let t = humantime::parse_rfc3339("2026-11-30T13:11:20.904869Z").unwrap();
        assert_eq!(
            parse_timestamp("2026-11-30T13:11:20.904869Z"),
            Some(to_us(t))
        );
        assert_eq!(format_us(to_us(t)), "2026-11-30T13:11:20.904869Z");
    }
}
