//! What `gap-healer --version` says besides the package's version: the
//! commit built (`GAP_HEALER_COMMIT`) and the build's date
//! (`GAP_HEALER_BUILD_DATE`, UTC, `YYYY-MM-DD`).
//!
//! The commit is, in this order: `GAP_HEALER_BUILD_COMMIT` when a builder
//! sets it (a build from a copy of the source without `.git`, as the
//! Dockerfile's, can pass its revision so); git's `HEAD` when the package
//! is itself a git checkout (its top level, not a directory inside some
//! other repository); the `sha1` of `.cargo_vcs_info.json` in a crate
//! packaged by cargo; else `unknown`. The date is `SOURCE_DATE_EPOCH`'s
//! when set (reproducible builds), else today's. Nothing here fails the
//! build: without git, or with a git that refuses the directory, the
//! commit is `unknown`.
//!
//! The script runs again when `HEAD` or the branch it names moves, and
//! when either variable changes; so in a development tree the date is
//! that of the first build of the commit.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=GAP_HEALER_BUILD_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = std::env::var("GAP_HEALER_BUILD_COMMIT")
        .ok()
        .and_then(|c| short(c.trim()))
        .or_else(|| git_commit(&dir))
        .or_else(|| packaged_commit(&dir))
        .unwrap_or_else(|| "unknown".into());
    let epoch = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
        });
    println!("cargo:rustc-env=GAP_HEALER_COMMIT={commit}");
    println!("cargo:rustc-env=GAP_HEALER_BUILD_DATE={}", date(epoch));
}

/// The first 12 hex digits of a commit id, if it is one.
fn short(commit: &str) -> Option<String> {
    let ok = commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit());
    ok.then(|| {
        commit
            .chars()
            .take(12)
            .collect::<String>()
            .to_ascii_lowercase()
    })
}

/// `git -C dir ARGS`'s output, trimmed, when it succeeds.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8(out.stdout).ok()?.trim().to_string())
}

/// `HEAD` of the checkout `dir` is the top of; `None` when `dir` is no
/// checkout's top (a tarball unpacked inside another repository is not
/// that repository's commit). Asks to run again when `HEAD` moves.
fn git_commit(dir: &Path) -> Option<String> {
    let top = git(dir, &["rev-parse", "--show-toplevel"])?;
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same(Path::new(&top), dir) {
        return None;
    }
    let commit = short(&git(dir, &["rev-parse", "HEAD"])?)?;
    // HEAD itself, the branch it names (a file, or a line of packed-refs).
    let path = |name: &str| {
        git(dir, &["rev-parse", "--git-path", name]).map(|p| {
            let p = PathBuf::from(p);
            if p.is_absolute() {
                p
            } else {
                dir.join(p)
            }
        })
    };
    let mut watched = vec![path("HEAD"), path("packed-refs")];
    if let Some(head) = watched[0]
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
    {
        if let Some(branch) = head.trim().strip_prefix("ref: ") {
            watched.push(path(branch));
        }
    }
    // A path that does not exist would make cargo run this every build.
    for p in watched.into_iter().flatten().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    Some(commit)
}

/// The commit cargo recorded when it packaged the crate.
fn packaged_commit(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(".cargo_vcs_info.json")).ok()?;
    let after = text.split("\"sha1\"").nth(1)?;
    let value = after.split('"').nth(1)?;
    short(value)
}

/// `YYYY-MM-DD` of a Unix time, UTC (days to the civil calendar, as in
/// Howard Hinnant's `civil_from_days`).
fn date(epoch: i64) -> String {
    let days = epoch.div_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
