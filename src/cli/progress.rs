//! The indicatif adapter: a one-shot command's progress on stderr (a bar on
//! a terminal, INFO lines otherwise), following the healer's
//! [`crate::healer::Progress`].

use std::io::IsTerminal;

use tracing::info;

/// How often a progress line is logged when stderr is not a terminal.
const PROGRESS_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Progress on stderr: a bar when stderr is a terminal; otherwise the same
/// figures as an INFO log line at most every [`PROGRESS_LOG_EVERY`] (the
/// first that long after the start, which the healer logs itself); and,
/// either way, a completion line ([`Progress::finish`]).
pub(super) fn progress(len: u64, what: &'static str) -> Progress {
    use indicatif::{HumanCount, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};
    let (bar, template) = if std::io::stderr().is_terminal() {
        (
            ProgressBar::new(len),
            "{msg} [{bar:40}] {human_pos}/{human_len} positions ({rate}, eta {eta})",
        )
    } else {
        let log = ProgressDrawTarget::term_like_with_hz(Box::new(ProgressLog::new()), 1);
        (
            ProgressBar::with_draw_target(Some(len), log),
            "{msg}: {human_pos} of {human_len} positions ({rate}, eta {eta})",
        )
    };
    // indicatif's {per_sec} prints four decimals ("320,142.9452/s").
    let rate = |state: &ProgressState, w: &mut dyn std::fmt::Write| {
        let per_sec = state.per_sec();
        let per_sec = if per_sec.is_finite() {
            per_sec.round()
        } else {
            0.0
        };
        let _ = write!(w, "{} positions/s", HumanCount(per_sec as u64));
    };
    let style = ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .with_key("rate", rate);
    bar.set_style(style.progress_chars("=> "));
    bar.set_message(what.to_string());
    Progress {
        bar,
        what,
        len,
        started: std::time::Instant::now(),
    }
}

/// A bar or progress log of [`progress`], and what it counts.
pub(super) struct Progress {
    bar: indicatif::ProgressBar,
    what: &'static str,
    len: u64,
    started: std::time::Instant,
}

impl Progress {
    pub(super) fn set(&self, done: u64) {
        self.bar.set_position(done);
    }

    /// Clears the bar and logs the completion line: `scanning: done, 6 of
    /// 6 positions in 4ms (1,500 positions/s)`; `stopped` instead of `done`
    /// when a signal cut the work short.
    pub(super) fn finish(self, done: u64, stopped: bool) {
        use indicatif::HumanCount;
        self.bar.finish_and_clear();
        let took = self.started.elapsed();
        let rate = done as f64 / took.as_secs_f64().max(1e-6);
        info!(
            "{}: {}, {} of {} positions in {} ({} positions/s)",
            self.what,
            if stopped { "stopped" } else { "done" },
            HumanCount(done),
            HumanCount(self.len.max(done)),
            humantime::format_duration(std::time::Duration::from_millis(took.as_millis() as u64)),
            HumanCount(rate.round() as u64)
        );
    }
}

/// The draw target of [`progress`] without a terminal: each frame indicatif
/// draws becomes an INFO line, at most one every [`PROGRESS_LOG_EVERY`].
#[derive(Debug)]
struct ProgressLog {
    frame: std::sync::Mutex<String>,
    last: std::sync::Mutex<std::time::Instant>,
}

impl ProgressLog {
    /// The first line comes [`PROGRESS_LOG_EVERY`] after now: a frame at
    /// the start would only say "0 of N".
    fn new() -> Self {
        ProgressLog {
            frame: std::sync::Mutex::default(),
            last: std::sync::Mutex::new(std::time::Instant::now()),
        }
    }
}

impl indicatif::TermLike for ProgressLog {
    fn width(&self) -> u16 {
        200
    }
    fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
        Ok(())
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.write_str(s)?;
        self.flush()
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        if let Ok(mut frame) = self.frame.lock() {
            frame.push_str(s);
        }
        Ok(())
    }
    fn clear_line(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        let frame = match self.frame.lock() {
            Ok(mut frame) => std::mem::take(&mut *frame),
            Err(_) => return Ok(()),
        };
        let line = frame.trim_matches(|c: char| c == '\r' || c.is_whitespace());
        if line.is_empty() {
            return Ok(());
        }
        if let Ok(mut last) = self.last.lock() {
            let now = std::time::Instant::now();
            if now.duration_since(*last) >= PROGRESS_LOG_EVERY {
                *last = now;
                info!("{line}");
            }
        }
        Ok(())
    }
}

/// A one-shot command's [`progress`] bar following the healer: positions
/// examined above `from` while scanning, tombstones while filling.
pub(super) struct Shown<'b> {
    pub(super) bar: &'b Progress,
    pub(super) from: i64,
    pub(super) done: u64,
}

impl crate::healer::Progress for Shown<'_> {
    fn scanned(&mut self, examined: i64) {
        self.done = (examined - self.from).max(0) as u64;
        self.bar.set(self.done);
    }

    fn filled(&mut self, so_far: &crate::healer::FillReport) {
        self.done = so_far.tombstones;
        self.bar.set(self.done);
    }
}
