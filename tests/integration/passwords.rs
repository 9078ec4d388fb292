//! Issue 27 over the real binary: for a few random passwords, written in
//! each PostgreSQL form, `check` proves the password is read exactly (a
//! SCRAM server takes it), and with the password wrong, or the string
//! invalid beside it, nothing `scan`, `check --format json`, `run` (its
//! log, `/metrics`, `/status`, `/readyz`, `/healthz`) or a
//! `--connection-string-file` run prints holds any three consecutive
//! characters of it.
//!
//! The outputs hold timestamps, durations, addresses and our own words, so
//! a random 3-character piece of a password could appear in them by
//! chance. Each password is therefore drawn with a mark, a letter beyond
//! ASCII, at every third character (the rest printable ASCII, separators
//! and quotes included), and every three consecutive characters of it hold
//! a mark; no output of ours holds one, so the check that no mark shows
//! cannot fail by chance, and is stricter than the check for pieces (which
//! is made too). The passwords are new on every run and printed when a
//! check fails.

use std::time::Duration;

use gap_healer_testkit::bin::{cli, Daemon, Output};
use gap_healer_testkit::pg::Throwaway;
use rand::Rng;
use uuid::Uuid;

/// Letters none of gap-healer's outputs hold.
const MARKS: &[char] = &['é', 'ü', 'ß', 'ж', 'Ω', '密', '☃', '€', 'ñ', 'ø'];

/// A mark, then two printable ASCII characters, six times.
fn random_password(rng: &mut impl Rng) -> String {
    (0..6)
        .flat_map(|_| {
            [
                MARKS[rng.random_range(0..MARKS.len())],
                char::from(rng.random_range(0x20u8..=0x7e)),
                char::from(rng.random_range(0x20u8..=0x7e)),
            ]
        })
        .collect()
}

/// The pieces of three consecutive characters of `pw`.
fn pieces(pw: &str) -> Vec<String> {
    let chars: Vec<char> = pw.chars().collect();
    chars.windows(3).map(|w| w.iter().collect()).collect()
}

/// Fails when `text` holds a mark or a piece of any of `passwords`.
fn assert_secret(what: &str, passwords: &[&str], text: &str) {
    let marks: String = text.chars().filter(|c| MARKS.contains(c)).collect();
    assert!(
        marks.is_empty(),
        "{what}: a character of {passwords:?} shows ({marks:?}) in\n{text}"
    );
    for pw in passwords {
        for piece in pieces(pw) {
            assert!(
                !text.contains(&piece),
                "{what}: {piece:?} of {pw:?} shows in\n{text}"
            );
        }
    }
}

fn libpq_quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// libpq's unquoted form: a backslash before whitespace, a backslash and a
/// leading quote, and `;` or `=` as they are (the issue's
/// `password=Tr0ub4dor;horse=staple`).
fn libpq_escape(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if c == '\\' || c.is_ascii_whitespace() || (i == 0 && c == '\'') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `pw` in each PostgreSQL form (libpq unquoted and quoted, URL, Npgsql), for the server at `port` (with a mistake
/// beside it when `invalid`).
fn strings(port: u16, pw: &str, invalid: bool) -> Vec<(&'static str, String)> {
    let (libpq_bad, url_bad, npgsql_bad) = if invalid {
        (" colour=blue", "&colour=blue", ";Colour=blue")
    } else {
        ("", "", "")
    };
    vec![
        (
            "libpq unquoted",
            format!(
                "host=127.0.0.1 port={port} user=postgres dbname=postgres password={}{libpq_bad}",
                libpq_escape(pw)
            ),
        ),
        (
            "libpq",
            format!(
                "host=127.0.0.1 port={port} user=postgres dbname=postgres password={}{libpq_bad}",
                libpq_quote(pw)
            ),
        ),
        (
            "URL",
            format!(
                "postgresql://postgres:{}@127.0.0.1:{port}/postgres?connect_timeout=5{url_bad}",
                percent_encode(pw)
            ),
        ),
        (
            "Npgsql",
            format!(
                "Host=127.0.0.1;Port={port};Username=postgres;Database=postgres;Password='{}'{npgsql_bad}",
                pw.replace('\'', "''")
            ),
        ),
    ]
}

/// `gap-healer ARGS` for the `store` schema with `cs` from the environment.
fn run_with(args: &[&str], cs: &str) -> Output {
    let mut argv = args.to_vec();
    argv.extend([
        "--engine",
        "postgres",
        "--schema",
        "store",
        "--connect-timeout",
        "3s",
    ]);
    cli(&argv, &[("GAP_HEALER_CONNECTION_STRING", cs)])
}

/// The same, with `cs` in a file named by `--connection-string-file`.
fn run_from_file(args: &[&str], cs: &str) -> Output {
    let file = std::env::temp_dir().join(format!("gh-pw27-{}", Uuid::new_v4().simple()));
    std::fs::write(&file, format!("{cs}\n")).unwrap();
    let path = file.to_str().unwrap().to_string();
    let mut argv = args.to_vec();
    argv.extend([
        "--engine",
        "postgres",
        "--schema",
        "store",
        "--connect-timeout",
        "3s",
        "--connection-string-file",
        &path,
    ]);
    let out = cli(&argv, &[]);
    std::fs::remove_file(&file).ok();
    out
}

/// A daemon on `cs` until it has said why it is not ready (or a few
/// seconds), then every endpoint and its whole log.
async fn daemon_says(cs: &str) -> String {
    let d = Daemon::with_connection_string(cs, "store", &["--poll-interval", "100ms"]);
    let mut said = String::new();
    for _ in 0..60 {
        let (_, body) = d.get("/readyz").await;
        if body.contains("login refused") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for path in ["/readyz", "/healthz", "/status", "/metrics", "/"] {
        let (code, body) = d.get(path).await;
        said.push_str(&format!("GET {path}: {code}\n{body}\n"));
    }
    let (_, _, log) = d.terminate();
    said.push_str(&log);
    said
}

/// Issue 27: `host=127.0.0.1 user=u dbname=store password=Tr0ub4dor;horse=staple`
/// was refused naming `horse`, from scan, check --format json, run and
/// --connection-string-file alike, and other passwords showed other
/// pieces. For random passwords in every form, nothing printed shows one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_output_holds_a_piece_of_a_random_password() {
    let pg = Throwaway::started("pw27", "scram-sha-256");
    let _store = pg.store("postgres").await;
    let mut rng = rand::rng();
    for round in 0..3 {
        let right = random_password(&mut rng);
        let wrong = random_password(&mut rng);
        let both = [right.as_str(), wrong.as_str()];
        pg.admin("postgres")
            .await
            .batch_execute(&format!(
                "ALTER ROLE postgres PASSWORD '{}'",
                right.replace('\'', "''")
            ))
            .await
            .unwrap();
        // Read exactly: the server takes the password in every form.
        for (form, cs) in strings(pg.port, &right, false) {
            let out = run_with(&["check", "--format", "json"], &cs);
            let what = format!("{form}, the right password, check");
            assert_eq!(out.code, 0, "{what} ({both:?}): {}", out.all());
            assert_secret(&what, &both, &out.all());
        }
        // Wrong, and invalid: refused, never shown.
        for (invalid, code) in [(false, 3), (true, 2)] {
            for (form, cs) in strings(pg.port, &wrong, invalid) {
                let runs = [
                    ("scan", run_with(&["scan"], &cs)),
                    (
                        "check --format json",
                        run_with(&["check", "--format", "json"], &cs),
                    ),
                    ("scan from a file", run_from_file(&["scan"], &cs)),
                    ("check from a file", run_from_file(&["check"], &cs)),
                ];
                for (command, out) in runs {
                    let what = format!("{form}, invalid {invalid}, {command}");
                    assert_eq!(out.code, code, "{what} ({both:?}): {}", out.all());
                    assert_secret(&what, &both, &out.all());
                }
            }
        }
        // The daemon with the wrong password: its log and every endpoint.
        let (form, cs) = strings(pg.port, &wrong, false).swap_remove(round);
        let said = daemon_says(&cs).await;
        assert!(said.contains("login refused"), "{form}: {said}");
        assert_secret(&format!("{form}, run"), &both, &said);
        // An invalid string: `run` refuses it before it starts.
        let (form, cs) = strings(pg.port, &wrong, true).swap_remove(round);
        let out = run_with(&["run", "--metrics-addr", "127.0.0.1:0"], &cs);
        assert_eq!(out.code, 2, "{form}: {}", out.all());
        assert_secret(&format!("{form}, run, invalid"), &both, &out.all());
    }
}
