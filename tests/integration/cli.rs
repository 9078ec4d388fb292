//! The real binary: every subcommand, exit codes, bad input, secrets, the
//! HTTP endpoints and graceful shutdown.

use std::time::Duration;

use gap_healer_testkit::bin::{self, cli, timing, Daemon, Process};
use gap_healer_testkit::pg::{connect, pg_port, Store};
use nix::sys::signal::Signal;

mod shells;

/// How long the daemon may take to exit after SIGTERM. Its own worst case is
/// 2.0 s: the fill in flight gets Pacing::drain_deadline (1.5 s) before it is
/// abandoned, then the leader election 200 ms and the metrics server 300 ms
/// to stop; a bound equal to that fails on a busy machine for no fault of
/// the daemon, so it gets a second of margin.
const SIGTERM_BOUND: Duration = Duration::from_secs(3);

/// A store with holes at 2 and 4..=6.
async fn store_with_holes(tag: &str) -> Store {
    Store::with_holes(tag, &[1, 3]).await
}

#[tokio::test]
async fn scan_reports_holes_in_text_and_json_and_exits_1() {
    let store = store_with_holes("scan").await;
    let out = store.cli(&["scan", "--start-from", "0"]);
    assert_eq!(out.code, 1, "{}", out.all());
    assert!(
        out.stdout
            .starts_with("2 holes (4 missing positions) between 1 and the head 7"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("4..=6"), "{}", out.stdout);
    let out = store.cli(&["scan", "--format", "json", "--start-from", "0"]);
    assert_eq!(out.code, 1);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
    assert_eq!(v["positions"], 4);
    assert_eq!(
        v["holes"][1],
        serde_json::json!({"start": 4, "end": 6, "width": 3})
    );
    assert!(
        store.tombstone_positions().await.is_empty(),
        "scan is read-only"
    );

    // heal --once fills them (after gap_timeout), then scan is clean.
    let started = std::time::Instant::now();
    let out = store.heal_once("300ms", &[]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "heal --once waited gap_timeout"
    );
    assert!(
        out.stdout.contains("filled 4 position(s)"),
        "{}",
        out.stdout
    );
    assert_eq!(store.tombstone_positions().await, vec![2, 4, 5, 6]);
    let out = store.cli(&["scan", "--start-from", "0"]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.starts_with("0 holes"), "{}", out.stdout);
}

#[tokio::test]
async fn heal_once_backfills_a_large_table_in_chunks() {
    let store = Store::new("backfill").await;
    // 50,000 rows at g + g/9: one position missing after every 9th row.
    store.insert_bulk(50_000, "g + g / 9").await;
    let missing = store.missing().await.len();
    assert!(missing > 5_000, "{missing}");
    let started = std::time::Instant::now();
    let out = store.heal_once("0s", &["--scan-page-size", "5000"]);
    let took = started.elapsed();
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout
            .contains(&format!("filled {missing} position(s)")),
        "{}",
        out.stdout
    );
    // Without a terminal: progress lines at most every 5 s, not one INFO
    // line per fill statement, with whole rates.
    assert!(
        !out.stderr.contains("filled hole with tombstones"),
        "one log line per statement:\n{}",
        out.stderr
    );
    let progress: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains(" INFO ") && l.contains("filling: "))
        .collect();
    assert!(!progress.is_empty(), "no progress line:\n{}", out.stderr);
    assert!(
        progress.len() as u64 <= 1 + took.as_secs() / 5,
        "{} progress lines in {took:?}:\n{}",
        progress.len(),
        out.stderr
    );
    for line in &progress {
        assert_whole_rate(line);
    }
    assert!(store.missing().await.is_empty());
    assert_eq!(
        store.assert_tombstone_stream_consistent().await as usize,
        missing
    );
}

/// A rate as `heal --once` and `scan` show it: a whole number of positions
/// per second (thousands separated), never `320,142.9452/s`.
fn assert_whole_rate(line: &str) {
    let at = line
        .find(" positions/s")
        .unwrap_or_else(|| panic!("no rate in {line:?}"));
    let figure = line[..at].rsplit(['(', ' ']).next().unwrap_or_default();
    assert!(
        !figure.is_empty() && figure.chars().all(|c| c.is_ascii_digit() || c == ','),
        "rate {figure:?} in {line:?}"
    );
}

/// The frames of the bar `what` drawn on a terminal: (position, length).
fn bar_frames(terminal: &str, what: &str) -> Vec<(u64, u64)> {
    let number = |s: &str| s.trim().replace(',', "").parse::<u64>().ok();
    terminal
        .split(&format!("{what} ["))
        .skip(1)
        .filter_map(|frame| {
            let counts = frame.split("] ").nth(1)?.split(" positions").next()?;
            let (pos, len) = counts.split_once('/')?;
            assert_whole_rate(frame.split(['\r', '\n']).next()?);
            Some((number(pos)?, number(len)?))
        })
        .collect()
}

/// On a terminal, the fill's bar advances with the tombstones written (it
/// stayed at 0 until the end), and rates are whole positions per second.
#[tokio::test]
async fn heal_once_on_a_terminal_shows_the_fill_advancing() {
    let store = Store::new("bar").await;
    // One position missing after every 9th row: about 5,555 holes, which
    // take 6 statements of at most 1,000 ranges.
    store.insert_bulk(50_000, "g + g / 9").await;
    let missing = store.missing().await.len() as u64;
    let out = store.cli_on_terminal(
        &["heal", "--once", "--start-from", "0", "--gap-timeout", "0s"],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.all());
    let frames = bar_frames(&out.stderr, "filling");
    println!("the fill's bar on a terminal, (position, length) per frame: {frames:?}");
    assert!(frames.iter().all(|(_, len)| *len == missing), "{frames:?}");
    assert!(
        frames.iter().any(|(pos, len)| 0 < *pos && pos < len),
        "the fill's bar never showed a position between 0 and {missing}: {frames:?}\n{}",
        out.stderr
    );
    let positions: Vec<u64> = frames.iter().map(|(pos, _)| *pos).collect();
    assert!(positions.windows(2).all(|w| w[0] <= w[1]), "{positions:?}");
    assert!(
        !bar_frames(&out.stderr, "scanning").is_empty(),
        "{}",
        out.stderr
    );
}

/// `scan` lists 20 holes in text unless told otherwise, then says how many
/// it left out; JSON lists every hole unless given --limit.
#[tokio::test]
async fn scan_lists_at_most_a_limit_of_holes_and_counts_the_rest() {
    let store = Store::new("limit").await;
    // Rows at 1, 3, ..., 51: 25 one-position holes at 2, 4, ..., 50.
    store.insert_bulk(26, "g * 2 - 1").await;
    let listed = |stdout: &str| stdout.lines().filter(|l| l.ends_with(" position")).count();
    let out = store.cli(&["scan", "--start-from", "0"]);
    assert_eq!(out.code, 1, "{}", out.all());
    assert!(
        out.stdout
            .starts_with("25 holes (25 missing positions) between 1 and the head 51\n"),
        "{}",
        out.stdout
    );
    assert_eq!(listed(&out.stdout), 20, "{}", out.stdout);
    assert!(
        out.stdout.ends_with("... and 5 more holes (use --all)\n"),
        "{}",
        out.stdout
    );
    let out = store.cli(&["scan", "--start-from", "0", "--limit", "1"]);
    assert_eq!(listed(&out.stdout), 1, "{}", out.stdout);
    assert!(
        out.stdout.ends_with(
            "  2                                 1 position\n... and 24 more holes (use --all)\n"
        ),
        "{}",
        out.stdout
    );
    let out = store.cli(&["scan", "--start-from", "0", "--all"]);
    assert_eq!(listed(&out.stdout), 25, "{}", out.stdout);
    assert!(!out.stdout.contains("more hole"), "{}", out.stdout);

    let json = |args: &[&str]| -> serde_json::Value {
        let out = store.cli(&[&["scan", "--start-from", "0", "--format", "json"], args].concat());
        assert_eq!(out.code, 1, "{}", out.all());
        serde_json::from_str(out.stdout.trim()).expect("json")
    };
    let all = json(&[]);
    assert_eq!(all["holes"].as_array().unwrap().len(), 25);
    assert_eq!(
        (all["hole_count"].as_u64(), all["holes_not_listed"].as_u64()),
        (Some(25), Some(0))
    );
    let two = json(&["--limit", "2"]);
    assert_eq!(two["holes"].as_array().unwrap().len(), 2);
    assert_eq!(
        (two["hole_count"].as_u64(), two["holes_not_listed"].as_u64()),
        (Some(25), Some(23))
    );

    for bad in [
        &["--limit", "x"][..],
        &["--limit", "3", "--all"],
        &["--limit", "-1"],
    ] {
        let out = store.cli(&[&["scan", "--start-from", "0"], bad].concat());
        assert_eq!(out.code, 2, "{bad:?}: {}", out.all());
    }
}

/// The `heal --once` summary: positions filled, statements (and what each
/// met), and what is left, exactly. A held position costs several
/// statements (probes) but is one position left, never counted as filled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_once_summary_counts_positions_statements_and_what_is_left() {
    // Holes at 2 and 4..=6; then 9, whose key an insert left open holds
    // (an explicit insert: it draws nothing, so its key decides).
    let store = Store::with_holes("summary", &[1, 3]).await;
    let open = store.open_insert_between().await;
    assert_eq!(open.positions, vec![9]);
    let out = store.heal_once("0s", &["--lock-timeout", "300ms"]);
    // Exit 1: a hole is left (issue 20; it was 0).
    assert_eq!(out.code, 1, "{}", out.all());
    assert_eq!(
        out.stdout,
        "filled 4 position(s) with 5 statement(s) (2 wrote tombstones, 0 refused by a committed append, 3 by a held position, 0 failed); 1 position(s) in 1 hole(s) left\n",
        "{}",
        out.stderr
    );
    assert_eq!(store.tombstone_positions().await, vec![2, 4, 5, 6]);
    open.rollback().await;
    let out = store.heal_once("0s", &["--dry-run"]);
    assert_eq!(
        out.stdout, "dry run: would have filled 1 position(s) in 1 hole(s); nothing written\n",
        "{}",
        out.stderr
    );
}

/// `--start-from` above the head: `scan` shows the real head and warns that
/// nothing below was examined; `heal --once` warns; `run` refuses with exit
/// 2 naming start_from, unless the table is empty.
#[tokio::test]
async fn start_from_above_the_head_is_reported_honestly_and_refused_by_run() {
    let store = store_with_holes("above").await;
    let out = store.cli(&["scan", "--start-from", "999999"]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert_eq!(
        out.stdout,
        "WARNING: the scan started at 999999, above the head 7: positions at or below 999998 were not examined, so holes among them are not reported (--start-from 0 examines the whole table)\n\
         0 holes (0 missing positions) from 999999 on, above the head 7\n"
    );
    assert!(out.stderr.contains(" WARN "), "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(
        store
            .cli(&["scan", "--start-from", "999999", "--format", "json"])
            .stdout
            .trim(),
    )
    .unwrap();
    assert_eq!(v["head"], 7);
    assert!(
        v["warning"].as_str().unwrap().contains("above the head 7"),
        "{v}"
    );

    let out = store.cli(&[
        "heal",
        "--once",
        "--start-from",
        "999999",
        "--gap-timeout",
        "0s",
    ]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains(" WARN ") && l.contains("above the head")),
        "{}",
        out.stderr
    );

    let out = store.cli(&[
        "run",
        "--start-from",
        "999999",
        "--metrics-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(out.code, 2, "{}", out.all());
    assert!(
        out.stderr.contains("start_from = \"999999\" (from flag --start-from): the scan would start at 999999, above the head 7"),
        "{}",
        out.stderr
    );
    assert!(store.tombstone_positions().await.is_empty());
    // One above the head is where start_from = head starts: accepted.
    let mut daemon = Daemon::start(&store, &["--start-from", "8"]);
    assert!(
        runs_past_its_first_scan(&mut daemon).await,
        "{}",
        daemon.log()
    );
    assert_eq!(daemon.terminate().0, Some(0));

    // An empty table may start anywhere: the rows will come.
    let empty = Store::new("above_empty").await;
    let mut daemon = Daemon::start(&empty, &["--start-from", "999999"]);
    assert!(
        runs_past_its_first_scan(&mut daemon).await,
        "{}",
        daemon.log()
    );
    assert_eq!(daemon.terminate().0, Some(0));
}

/// The daemon has resolved its start and still runs half a second later.
async fn runs_past_its_first_scan(daemon: &mut Daemon) -> bool {
    let started = gap_healer_testkit::wait::until(Duration::from_secs(10), || async {
        !daemon.lines_with("scan starts").is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    started && daemon.alive()
}

/// Logs carry no colour (no ESC byte) when stderr is a file, as under
/// journald or `kubectl logs`; on a terminal they do, unless NO_COLOR.
#[tokio::test]
async fn logs_are_plain_text_unless_stderr_is_a_terminal() {
    let store = store_with_holes("colour").await;
    let file = std::env::temp_dir().join(format!("gh-colour-{}.log", std::process::id()));
    let args = ["scan", "--start-from", "0"];
    let status = gap_healer_testkit::bin::command(store.argv(&args), [("RUST_LOG", "debug")])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&file).unwrap())
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1));
    let log = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).ok();
    assert!(
        !log.contains(&0x1b),
        "ESC in a log file:\n{}",
        String::from_utf8_lossy(&log)
    );
    assert!(
        log.windows(6).any(|w| w == b" INFO "),
        "{}",
        String::from_utf8_lossy(&log)
    );

    let on_terminal = store.cli_on_terminal(&args, &[]);
    assert!(
        on_terminal.stderr.contains("\u{1b}[32m INFO"),
        "{:?}",
        on_terminal.stderr
    );
    let no_color = store.cli_on_terminal(&args, &[("NO_COLOR", "1")]);
    assert!(no_color.stderr.contains(" INFO "), "{:?}", no_color.stderr);
    assert!(
        !no_color.stderr.contains("\u{1b}[32m"),
        "{:?}",
        no_color.stderr
    );
}

#[tokio::test]
async fn check_passes_on_a_good_store_and_fails_with_exit_3_on_a_wrong_one() {
    let store = Store::new("check").await;
    let out = store.cli(&["check"]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout.contains("ok   global position"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("all checks passed"), "{}", out.stdout);

    store
        .client
        .batch_execute(&format!(
            "DROP TABLE {}.checkpoints; DROP TABLE {}.messages",
            store.schema, store.schema
        ))
        .await
        .unwrap();
    let out = store.cli(&["check", "--format", "json"]);
    assert_eq!(out.code, 3, "{}", out.all());
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["ok"], false);
    assert!(
        out.stdout.contains("messages does not exist"),
        "{}",
        out.stdout
    );
    let out = store.cli(&["scan"]);
    assert_eq!(out.code, 3, "scan on a missing table: {}", out.all());

    let bad = [
        "check",
        "--engine",
        "postgres",
        "--schema",
        "nope",
        "--connection-string",
        "host=127.0.0.1 port=1 user=postgres password=Sup3rS3cret! connect_timeout=2",
    ];
    let out = cli(&bad, &[]);
    assert_eq!(out.code, 3, "{}", out.all());
    assert!(!out.all().contains("Sup3rS3cret!"), "{}", out.all());
    assert!(out.stdout.contains("password=***"), "{}", out.all());
}

/// A login without rights: `check` names every missing right and the GRANT
/// that gives it, and goes on with the other findings; the GRANTs it prints
/// work as they are. `scan` (read-only) says a right is missing, never
/// "tombstone stream".
#[tokio::test]
async fn check_names_each_missing_right_with_the_grant_to_run() {
    let store = Store::with_holes("rights", &[1]).await;
    let s = store.schema.clone();
    let role = format!("{s}_login");
    let cs = store.create_login(&role).await;
    // The GRANTs of a `rights` finding, as printed.
    let grants = |stdout: &str| -> String {
        let line = stdout
            .lines()
            .find(|l| l.starts_with("FAIL rights"))
            .unwrap_or_else(|| panic!("no failed rights finding:\n{stdout}"));
        let run = line.split("run: ").nth(1).expect("the GRANTs to run");
        run.split(" (every grant").next().unwrap().to_string()
    };

    let out = store.cli_at(&cs, &["check"]);
    assert_eq!(out.code, 3, "{}", out.all());
    for other in [
        "ok   schema",
        "ok   global position",
        "ok   messages columns",
        "ok   streams columns",
        "ok   checkpoints table",
    ] {
        assert!(out.stdout.contains(other), "{other}:\n{}", out.stdout);
    }
    assert!(
        out.stdout.ends_with("1 check(s) failed\n"),
        "{}",
        out.stdout
    );
    assert_eq!(
        grants(&out.stdout),
        format!(
            "GRANT USAGE ON SCHEMA {s} TO {role}; GRANT SELECT, INSERT ON {s}.messages TO {role}; \
             GRANT SELECT, INSERT (stream_name, version), UPDATE (version) ON {s}.streams TO {role}; \
             GRANT SELECT ON {s}.checkpoints TO {role}; \
             GRANT SELECT ON SEQUENCE {s}.messages_global_position_seq TO {role};"
        )
    );
    let out = store.cli_at(&cs, &["scan", "--start-from", "0"]);
    assert_eq!(out.code, 3, "{}", out.all());
    assert!(
        out.stderr.contains("42501") && out.stderr.contains("`gap-healer check` names it"),
        "{}",
        out.stderr
    );
    assert!(!out.all().contains("tombstone stream"), "{}", out.all());

    // SELECT revoked on the store's tables, every other right there.
    store
        .client
        .batch_execute(&grants(&store.cli_at(&cs, &["check"]).stdout))
        .await
        .expect("the printed GRANTs run");
    store
        .client
        .batch_execute(&format!(
            "REVOKE SELECT ON {s}.messages, {s}.streams FROM {role}"
        ))
        .await
        .unwrap();
    let out = store.cli_at(&cs, &["check"]);
    assert_eq!(out.code, 3, "{}", out.all());
    assert_eq!(
        grants(&out.stdout),
        format!("GRANT SELECT ON {s}.messages TO {role}; GRANT SELECT ON {s}.streams TO {role};")
    );
    assert!(
        out.stdout.contains(
            "missing SELECT on {s}.messages, SELECT on {s}.streams;"
                .replace("{s}", &s)
                .as_str()
        ),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.ends_with("1 check(s) failed\n"),
        "{}",
        out.stdout
    );
    let out = store.cli_at(&cs, &["scan", "--start-from", "0"]);
    assert_eq!(out.code, 3, "{}", out.all());
    assert!(
        out.stderr.contains("permission denied for table messages"),
        "{}",
        out.stderr
    );
    assert!(!out.all().contains("tombstone stream"), "{}", out.all());

    // With what check printed, the login checks clean and heals.
    let printed = grants(&store.cli_at(&cs, &["check"]).stdout);
    store.client.batch_execute(&printed).await.unwrap();
    let out = store.cli_at(&cs, &["check"]);
    assert_eq!(out.code, 0, "{}", out.all());
    let out = store.cli_at(
        &cs,
        &["heal", "--once", "--start-from", "0", "--gap-timeout", "0s"],
    );
    assert_eq!(out.code, 0, "{}", out.all());
    assert_eq!(store.tombstone_positions().await, vec![2]);
}

/// A tombstone stream whose version ran ahead of its rows (what Eventuous's
/// own gap tombstones do): `check` says how to repair it, and the statement
/// it prints, run as printed, does.
#[tokio::test]
async fn check_prints_the_repair_of_an_inconsistent_tombstone_stream() {
    let store = Store::with_holes("repair", &[1]).await;
    assert_eq!(store.heal_once("0s", &[]).code, 0);
    store
        .client
        .execute(
            &format!(
                "UPDATE {}.streams SET version = version + 3 WHERE stream_name = '__tombstones__'",
                store.schema
            ),
            &[],
        )
        .await
        .unwrap();
    let out = store.cli(&["check"]);
    assert_eq!(out.code, 3, "{}", out.all());
    let finding = out
        .stdout
        .lines()
        .find(|l| l.starts_with("FAIL tombstone stream"))
        .unwrap_or_else(|| panic!("{}", out.stdout));
    assert!(
        finding.contains("inconsistent: 1 rows, positions 0..0, version 3: the positions are 0..0 but the version is 3"),
        "{finding}"
    );
    let repair = finding
        .split("run: ")
        .nth(1)
        .and_then(|r| r.split_inclusive(';').next())
        .expect("a statement to run");
    store
        .client
        .batch_execute(repair)
        .await
        .expect("the printed repair runs");
    let out = store.cli(&["check"]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout
            .contains("ok   tombstone stream           1 tombstones, version 0"),
        "{}",
        out.stdout
    );
}

#[test]
fn sql_prints_the_grants_without_a_connection() {
    let out = cli(&["sql", "--engine", "postgres", "--schema", "shop"], &[]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout
            .contains("GRANT SELECT, INSERT ON shop.messages TO <healer_role>;"),
        "{}",
        out.stdout
    );
    let grants = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/sql/postgres/grants.sql"
    ))
    .unwrap()
    .replace("__schema__", "shop");
    assert_eq!(
        out.stdout,
        grants.replace("__healer_role__", "<healer_role>")
    );
    // --role names the grantee, quoted where PostgreSQL needs it.
    let named = cli(
        &[
            "sql",
            "--engine",
            "postgres",
            "--schema",
            "shop",
            "--role",
            "Healer One",
        ],
        &[],
    );
    assert_eq!(named.code, 0, "{}", named.all());
    assert_eq!(
        named.stdout,
        grants.replace("__healer_role__", "\"Healer One\"")
    );
    let empty = cli(&["sql", "--engine", "postgres", "--role", ""], &[]);
    assert_eq!(empty.code, 2, "{}", empty.all());
    // The README and SECURITY.md show the very same grants.
    for doc in ["README.md", "SECURITY.md"] {
        let text =
            std::fs::read_to_string(format!("{}/{doc}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        for grant in out.stdout.lines().filter(|l| l.starts_with("GRANT ")) {
            let shown = grant.replace("shop", "<schema>");
            assert!(text.contains(&shown), "{doc} lacks {shown:?}");
        }
    }
}

#[test]
fn config_prints_effective_values_with_origins_and_no_password() {
    let dir = std::env::temp_dir().join(format!("gh-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("c.toml");
    std::fs::write(&file, "engine = \"postgres\"\ngap_timeout = \"3s\"\n").unwrap();
    let out = cli(
        &[
            "config",
            "--config",
            file.to_str().unwrap(),
            "--poll-interval",
            "1s",
        ],
        &[
            (
                "GAP_HEALER_CONNECTION_STRING",
                "host=db user=app password=p@ss;word'x",
            ),
            ("GAP_HEALER_LOCK_TIMEOUT", "750ms"),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.all());
    for needle in [
        "gap_timeout = \"3s\"",
        "# config file",
        "poll_interval = \"1s\"",
        "# flag --poll-interval",
        "lock_timeout = \"750ms\"",
        "# environment variable GAP_HEALER_LOCK_TIMEOUT",
        "password=***",
    ] {
        assert!(
            out.stdout.contains(needle),
            "missing {needle} in\n{}",
            out.stdout
        );
    }
    assert!(!out.all().contains("p@ss"), "{}", out.all());
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn bad_input_exits_2_naming_every_problem_and_never_the_password() {
    let dir = std::env::temp_dir().join(format!("gh-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.toml");
    std::fs::write(
        &file,
        "gap_timout = \"5s\"\nschema = \"public; DROP TABLE x\"\n",
    )
    .unwrap();
    let pw = "T0p;Secret='x'=ü";
    let cs = format!(
        "Server=tcp:db,1433;User Id=sa;Password='{}';Encrypt=true",
        pw.replace('\'', "''")
    );
    let out = cli(
        &[
            "run",
            "--config",
            file.to_str().unwrap(),
            "--engine",
            "oracle",
            "--gap-timeout",
            "-5s",
            "--poll-interval",
            "soon",
            "--metrics-addr",
            "nowhere",
        ],
        &[("GAP_HEALER_CONNECTION_STRING", &cs)],
    );
    assert_eq!(out.code, 2, "{}", out.all());
    for needle in [
        "gap_timout",
        "did you mean `gap_timeout`",
        "engine = \"oracle\" (from flag --engine): unknown engine",
        "schema = \"public; DROP TABLE x\"",
        "gap_timeout = \"-5s\" (from flag --gap-timeout): must not be negative",
        "poll_interval = \"soon\"",
        "metrics_addr = \"nowhere\"",
    ] {
        assert!(
            out.stderr.contains(needle),
            "missing {needle:?} in\n{}",
            out.stderr
        );
    }
    assert!(!out.all().contains("T0p"), "{}", out.all());

    // Each problem alone, each exit 2.
    for (argv, needle) in [
        (
            vec!["scan", "--engine", "postgres"],
            "connection_string (from nowhere): required",
        ),
        (
            vec![
                // check reads lock_timeout (scan, which does not, refuses the flag).
                "check",
                "--engine",
                "postgres",
                "--connection-string",
                "host=x",
                "--lock-timeout",
                "5",
            ],
            "give a unit",
        ),
        (
            vec![
                "scan",
                "--engine",
                "postgres",
                "--connection-string",
                "host=x",
                "--schema",
                "1abc",
            ],
            "plain identifier",
        ),
        (
            vec!["scan", "--connection-string", "host=x"],
            "engine (from nowhere): required",
        ),
        (
            vec!["scan", "--config", "/nonexistent.toml"],
            "cannot read the file",
        ),
        (
            vec![
                "scan",
                "--engine",
                "postgres",
                "--connection-string",
                "host=x port=notaport password=Hidden123",
            ],
            "not a PostgreSQL connection string",
        ),
    ] {
        let out = cli(&argv, &[]);
        assert_eq!(out.code, 2, "{argv:?}: {}", out.all());
        assert!(out.stderr.contains(needle), "{argv:?}: {}", out.stderr);
        assert!(!out.all().contains("Hidden123"), "{}", out.all());
    }
    let out = cli(&["frobnicate"], &[]);
    assert_eq!(out.code, 2);
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn unreachable_database_exits_3_without_the_password() {
    let out = cli(
        &[
            "heal",
            "--once",
            "--engine",
            "postgres",
            "--connect-timeout",
            "1s",
        ],
        &[(
            "GAP_HEALER_CONNECTION_STRING",
            "postgres://app:Unguessable99@127.0.0.1:1/test",
        )],
    );
    assert_eq!(out.code, 3, "{}", out.all());
    assert!(!out.all().contains("Unguessable99"), "{}", out.all());
    assert!(out.stderr.contains("connect"), "{}", out.stderr);
}

/// Issue 27: while its first scan ran, a store was `failing` in `/status`
/// and `gap_healer_stores`, and every restart looked like a failure. A
/// row-security policy whose function sleeps a second (user code on the
/// table: the daemon's login is not a superuser, so it applies) makes every
/// read of the table take that long, so the first scan is under way for
/// seconds: the store is `starting` in `/status`, in `gap_healer_stores` and
/// in `/readyz`'s text, never `failing`, and then `healthy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_is_starting_not_failing_while_its_first_scan_runs() {
    let store = store_with_holes("starting").await;
    let s = store.schema.clone();
    let role = format!("{s}_r");
    let cs = store.create_login(&role).await;
    store.grant_healer_rights(&role).await;
    store
        .client
        .batch_execute(&format!(
            "CREATE FUNCTION {s}.slow() RETURNS boolean LANGUAGE plpgsql STABLE AS
               $$ BEGIN PERFORM pg_sleep(1); RETURN true; END $$;
             ALTER TABLE {s}.messages ENABLE ROW LEVEL SECURITY;
             CREATE POLICY slow ON {s}.messages FOR SELECT USING ({s}.slow());
             CREATE POLICY write ON {s}.messages FOR INSERT WITH CHECK (true);"
        ))
        .await
        .unwrap();
    let d = Daemon::with_connection_string(&cs, &s, &timing("300ms", "250ms", &[]));
    let mut states: Vec<String> = Vec::new();
    let (mut gauge_starting, mut ready_said_starting) = (false, false);
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        if let Ok((200, status)) = d.try_get("/status").await {
            let status: serde_json::Value = serde_json::from_str(&status).unwrap();
            if let Some(state) = status["stores"][0]["state"].as_str() {
                if states.last().map(String::as_str) != Some(state) {
                    states.push(state.to_string());
                }
                if state == "starting" {
                    gauge_starting |=
                        d.metric(r#"gap_healer_stores{state="starting"}"#).await == Some(1.0);
                    if let Ok((503, why)) = d.try_get("/readyz").await {
                        ready_said_starting |= why.contains("starting");
                    }
                }
                if state == "healthy" {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("states as scraped: {states:?}");
    assert_eq!(states, ["starting", "healthy"], "{}", d.log());
    assert!(gauge_starting, "gap_healer_stores never said starting");
    assert!(ready_said_starting, "/readyz never said starting");
    assert_eq!(d.terminate().0, Some(0));
}

/// Issue 27: a store whose due hole kept being refused logged it at INFO
/// every poll (about 4 lines a second). A position held by an open insert
/// (tried again and again, held each time) and a hole that waits for an
/// open append (the transaction-end proof) are each said once at INFO in
/// six seconds of 100 ms polls, while the attempts go on (counted by
/// `gap_healer_fill_attempts_total`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_that_repeats_is_said_once_not_every_poll() {
    let held_store = Store::new("said_held").await;
    let held = held_store.open_insert_between().await;
    let open_store = Store::new("said_open").await;
    let open = open_store.open_append_between(1).await;
    let flags = timing("300ms", "100ms", &["--lock-timeout", "100ms"]);
    let held_d = Daemon::start(&held_store, &flags);
    let open_d = Daemon::start(&open_store, &flags);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let info = |d: &Daemon, message: &str| {
        d.lines_with(message)
            .iter()
            .filter(|l| l["level"] == "INFO")
            .count()
    };
    let attempts = |outcome: &str| {
        format!(r#"gap_healer_fill_attempts_total{{outcome="{outcome}",store="default"}}"#)
    };
    let held_tries = held_d.metric(&attempts("held")).await.unwrap_or(0.0);
    let waited = open_d
        .metric(&attempts("open_transaction"))
        .await
        .unwrap_or(0.0);
    let (held_lines, wait_lines) = (
        info(&held_d, "filled nothing"),
        info(&open_d, "not filling yet"),
    );
    println!(
        "held: {held_tries} attempts, {held_lines} INFO line(s); open transaction: {waited} waits, {wait_lines} INFO line(s)"
    );
    assert!(
        held_tries >= 3.0,
        "the held position was retried: {}",
        held_d.log()
    );
    assert_eq!(held_lines, 1, "{}", held_d.log());
    assert!(waited >= 10.0, "it waited every poll: {}", open_d.log());
    assert_eq!(wait_lines, 1, "{}", open_d.log());
    assert!(held_store.tombstone_positions().await.is_empty());
    assert!(open_store.tombstone_positions().await.is_empty());
    held.rollback().await;
    open.rollback().await;
    assert_eq!(held_d.terminate().0, Some(0));
    assert_eq!(open_d.terminate().0, Some(0));
}

#[tokio::test]
async fn daemon_serves_metrics_health_readiness_and_stops_on_sigterm() {
    let store = store_with_holes("daemon").await;
    store.set_checkpoint("projection", Some(3)).await;
    let d = Daemon::start(&store, &timing("300ms", "100ms", &[]));
    assert_eq!(d.get("/healthz").await.0, 200);
    let mut ready = 0;
    for _ in 0..50 {
        ready = d.get("/readyz").await.0;
        if ready == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ready, 200);
    for _ in 0..60 {
        if store.missing().await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, body) = d.get("/metrics").await;
    if let Ok(path) = std::env::var("GAP_HEALER_SCRAPE_OUT") {
        std::fs::write(path, &body).unwrap();
    }
    for name in [
        "gap_healer_open_gaps{store=\"default\"} 0",
        "gap_healer_open_gap_positions{store=\"default\"} 0",
        "gap_healer_oldest_gap_age_seconds{store=\"default\"} 0",
        "gap_healer_tombstones_inserted_total{store=\"default\"} 4",
        "gap_healer_fill_attempts_total{outcome=\"filled\",store=\"default\"}",
        "gap_healer_fill_attempts_total{outcome=\"held\",store=\"default\"} 0",
        "gap_healer_scan_duration_seconds_bucket{store=\"default\",le=",
        "gap_healer_head_position{store=\"default\"} 7",
        "gap_healer_contiguous_position{store=\"default\"} 7",
        "gap_healer_leader{store=\"default\"} 1",
        "gap_healer_dry_run{store=\"default\"} 0",
        "gap_healer_db_errors_total{operation=\"fill\",store=\"default\"} 0",
        "gap_healer_checkpoint_lag_positions{checkpoint=\"projection\",store=\"default\"} 4",
        "gap_healer_stores{state=\"healthy\"} 1",
        "gap_healer_stores{state=\"failing\"} 0",
        "gap_healer_build_info{version=",
    ] {
        assert!(body.contains(name), "missing {name} in\n{body}");
    }
    let (code, status) = d.get("/status").await;
    assert_eq!(code, 200, "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let one = &status["stores"][0];
    assert_eq!(
        (
            &one["store"],
            &one["state"],
            &one["head"],
            &one["watermark"],
            &one["open_holes"]
        ),
        (
            &"default".into(),
            &"healthy".into(),
            &7.into(),
            &7.into(),
            &0.into()
        ),
        "{status}"
    );
    assert!(!body.contains("password"));
    let (code, took, log) = d.terminate();
    println!("SIGTERM to exit: {took:?}");
    assert_eq!(code, Some(0), "{log}");
    assert!(took < SIGTERM_BOUND, "{took:?}");
    assert!(
        log.contains("\"outcome\":\"filled\""),
        "fills are logged with their outcome:\n{log}"
    );
}

#[tokio::test]
async fn sigterm_during_a_lock_wait_exits_without_waiting_it_out() {
    let store = Store::new("drain").await;
    let open = store.open_append_between(1).await;
    let d = Daemon::start(&store, &timing("0s", "50ms", &["--lock-timeout", "10s"]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (code, took, log) = d.terminate();
    println!("SIGTERM during a 10 s lock wait: exited in {took:?}");
    assert_eq!(code, Some(0), "{log}");
    assert!(took < SIGTERM_BOUND, "{took:?}");
    open.commit().await.expect("the open append still commits");
    assert!(store.tombstone_positions().await.is_empty());
}

/// `gap-healer heal --once` with this store's flags and `more`, in the
/// background.
fn heal_in_background(store: &Store, more: &[&str]) -> Process {
    let args = store.argv(&[&["heal", "--once", "--start-from", "0"][..], more].concat());
    Process::spawn(bin::command(&args, [("", ""); 0])).expect("gap-healer starts")
}

/// Issue 27: `heal --once` stopped by SIGTERM while filling logged
/// "filling: done, 135,000 of 200,000" and exited 1, as if open appends held
/// the rest. Now: "filling: stopped, ...", a report that says it was
/// stopped, what it filled and what it left, and exit 143 (128 + SIGTERM).
#[tokio::test]
async fn heal_once_stopped_by_sigterm_while_filling_says_stopped_and_exits_143() {
    let store = Store::new("heal_stopped").await;
    // 200,000 one-position holes: 200 fill statements.
    store.insert_bulk(200_000, "g * 2").await;
    let holes = store.try_missing_count().await.unwrap();
    let mut heal = heal_in_background(&store, &["--gap-timeout", "0s"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    // SIGTERM once the first statements have committed.
    loop {
        let missing = store.try_missing_count().await.unwrap();
        if missing < holes {
            break;
        }
        assert!(heal.running(), "it ended first:\n{}", heal.output());
        assert!(
            std::time::Instant::now() < deadline,
            "nothing filled in 120 s:\n{}",
            heal.output()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    heal.signal(Signal::SIGTERM).unwrap();
    let code = heal.wait(Duration::from_secs(10)).await;
    let output = heal.output();
    println!("{output}");
    assert_eq!(code, 143, "{output}");
    let log = heal.log();
    assert!(log.contains("filling: stopped, "), "{log}");
    assert!(!log.contains("filling: done"), "{log}");
    let left = store.try_missing_count().await.unwrap();
    assert!(
        left > 0,
        "everything was filled before the signal landed: {output}"
    );
    let filled = store.assert_tombstone_stream_consistent().await;
    assert_eq!(filled, holes - left, "{output}");
    assert!(
        output.contains(&format!(
            "stopped by SIGTERM before the pass ended: filled {filled} position(s)"
        )) && output.contains(&format!(
            "{left} position(s) in {left} hole(s) found and not filled"
        )),
        "{output}"
    );
}

/// Stopped while waiting for its holes to come due, `heal --once` filled
/// nothing and exited 0 as if there were nothing to do; now it says so and
/// exits 143. JSON names the signal.
#[tokio::test]
async fn heal_once_stopped_while_waiting_gap_timeout_exits_143() {
    let store = store_with_holes("heal_stopped_wait").await;
    let mut heal = heal_in_background(&store, &["--gap-timeout", "60s", "--format", "json"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !heal.log().contains("waiting") {
        assert!(heal.running(), "it ended first:\n{}", heal.output());
        assert!(std::time::Instant::now() < deadline, "{}", heal.output());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    heal.signal(Signal::SIGTERM).unwrap();
    let code = heal.wait(Duration::from_secs(10)).await;
    let output = heal.output();
    assert_eq!(code, 143, "{output}");
    let json = output
        .lines()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON report:\n{output}"));
    let report: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(report["stopped"], "SIGTERM", "{json}");
    assert_eq!(report["filled"], 0, "{json}");
    assert_eq!(report["left"]["positions"], 4, "{json}");
    assert!(store.tombstone_positions().await.is_empty());
}

#[test]
fn mssql_sql_config_and_unreachable_server_through_the_binary() {
    let out = cli(&["sql", "--engine", "mssql", "--schema", "shop"], &[]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout
            .contains("GRANT EXECUTE ON OBJECT::[shop].[gap_healer_fill] TO [<healer_role>];"),
        "{}",
        out.stdout
    );
    let named = cli(
        &[
            "sql",
            "--engine",
            "mssql",
            "--schema",
            "shop",
            "--role",
            "ops]healer",
        ],
        &[],
    );
    assert!(
        named
            .stdout
            .contains("GRANT EXECUTE ON OBJECT::[shop].[gap_healer_fill] TO [ops]]healer];"),
        "{}",
        named.all()
    );
    assert!(
        out.stdout
            .contains("CREATE OR ALTER PROCEDURE [shop].[gap_healer_fill]"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("WITH EXECUTE AS OWNER"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("GRANT EXECUTE"), "{}", out.stdout);

    let cs = "Server=tcp:127.0.0.1,1;Database=orders;User Id=gap_healer;Password='Pa;ss=wörd''s';TrustServerCertificate=true";
    let out = cli(
        &["config", "--engine", "mssql"],
        &[("GAP_HEALER_CONNECTION_STRING", cs)],
    );
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("Password=***"), "{}", out.stdout);
    assert!(!out.all().contains("wörd"), "{}", out.all());

    for cmd in [&["check"][..], &["scan"], &["heal", "--once"], &["install"]] {
        let mut argv = cmd.to_vec();
        argv.extend(["--engine", "mssql", "--connect-timeout", "1s"]);
        let out = cli(&argv, &[("GAP_HEALER_CONNECTION_STRING", cs)]);
        assert_eq!(out.code, 3, "{argv:?}: {}", out.all());
        assert!(
            !out.all().contains("wörd") && !out.all().contains("Pa;ss"),
            "{argv:?}: {}",
            out.all()
        );
    }
}

/// The local server runs with Debian's self-signed "snakeoil" certificate
/// (CN and SAN localhost), so verification can be shown both ways.
#[tokio::test]
async fn postgres_tls_verifies_the_server_certificate() {
    let ssl: String = connect()
        .await
        .query_one("SHOW ssl", &[])
        .await
        .unwrap()
        .get(0);
    if ssl != "on" && std::env::var("GAP_HEALER_TEST_PG_NO_TLS").is_ok() {
        // An explicit opt-out (CI's container image serves no TLS): say so.
        println!("PostgreSQL TLS test skipped: ssl = {ssl} and GAP_HEALER_TEST_PG_NO_TLS is set");
        return;
    }
    assert_eq!(
        ssl, "on",
        "this test needs the local PostgreSQL to serve TLS (Debian's default), or GAP_HEALER_TEST_PG_NO_TLS=1"
    );
    let store = store_with_holes("tls").await;
    let ca = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
    let good = format!(
        "host=localhost port={} user=postgres dbname=test sslmode=verify-full sslrootcert={ca}",
        pg_port()
    );
    let out = store.cli_at(&good, &["check"]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("ok   tls                        on, server certificate verified against 1 certificate(s)"), "{}", out.stdout);
    let out = store.cli_at(
        &good,
        &["heal", "--once", "--start-from", "0", "--gap-timeout", "0s"],
    );
    assert_eq!(out.code, 0, "{}", out.all());
    assert_eq!(
        store.tombstone_positions().await,
        vec![2, 4, 5, 6],
        "filled over TLS"
    );

    // The certificate names localhost, not 127.0.0.1: refused, and said why.
    let wrong_name = format!("host=127.0.0.1 port={} user=postgres dbname=test sslmode=verify-full sslrootcert={ca} password=NotShown1", pg_port());
    let out = store.cli_at(&wrong_name, &["scan", "--connect-timeout", "2s"]);
    assert_eq!(out.code, 3, "{}", out.all());
    assert!(
        out.stderr.contains("certificate not valid for name"),
        "{}",
        out.stderr
    );
    assert!(!out.all().contains("NotShown1"));
    let out = cli(
        &[
            "check",
            "--engine",
            "postgres",
            "--connection-string",
            "host=localhost sslmode=verify-full sslrootcert=/nonexistent/ca.pem",
        ],
        &[],
    );
    assert_eq!(
        out.code,
        2,
        "a missing CA file is a configuration error: {}",
        out.all()
    );
    // Named by its key: the path is text of the string.
    assert!(
        out.stderr
            .contains("the file sslrootcert names cannot be read: entity not found"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("/nonexistent/ca.pem"),
        "{}",
        out.stderr
    );
}

/// Issue 12: an Eventuous application's Npgsql connection string (the shape
/// of Eventuous's samples, plus the usual cloud `SSL Mode=Require`) works as
/// it is for `check`, `scan` and `run`, and is shown only redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eventuous_npgsql_connection_string_works_for_check_scan_and_run() {
    let store = store_with_holes("npgsql").await;
    let npgsql = &format!(
        "Host=127.0.0.1;Port={};Username=postgres;Password=Zq7Npgsql;\
         Database=test;SSL Mode=Require;Trust Server Certificate=true;\
         Include Error Detail=true",
        pg_port()
    );
    let out = store.cli_at(npgsql, &["check"]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout.contains("server certificate NOT verified"),
        "{}",
        out.stdout
    );
    assert!(!out.all().contains("Zq7Npgsql"), "{}", out.all());
    let out = store.cli_at(npgsql, &["scan", "--start-from", "0"]);
    assert_eq!(out.code, 1, "{}", out.all());
    assert!(out.stdout.contains("4..=6"), "{}", out.stdout);
    let d = Daemon::with_connection_string(
        npgsql,
        &store.schema,
        &[
            "--gap-timeout",
            "200ms",
            "--poll-interval",
            "100ms",
            "--start-from",
            "0",
        ],
    );
    d.wait_metric(
        "gap_healer_tombstones_inserted_total",
        4.0,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(store.tombstone_positions().await, vec![2, 4, 5, 6]);
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains("Zq7Npgsql"), "{log}");
}

/// Issue 20: unknown libpq keys, unsupported ones, URL query parameters, a
/// bad URL port and an unknown Npgsql key all read "invalid PostgreSQL
/// connection string: invalid connection string", naming no key. Each
/// refusal names the key from gap-healer's own tables (never a value, and,
/// since issue 27, never a key that is not in a table: it may be a piece
/// of a password) or its position, lists what is taken, and says "not a
/// PostgreSQL connection string" once.
#[test]
fn a_refused_connection_string_names_the_key_and_what_is_taken_never_the_value() {
    let libpq = "libpq's keys, case-sensitive, are host, hostaddr, port, dbname, user, password";
    let npgsql = "the Npgsql keys gap-healer takes are Host (or Server), Port";
    for (cs, said, listed) in [
        (
            "host=127.0.0.1 usr=Zq7Hidden password=Zq7Hidden",
            "an unknown key at pair 2 (of 3)",
            libpq,
        ),
        (
            "host=127.0.0.1 sslcert=/etc/Zq7Hidden.pem password=Zq7Hidden",
            "\"sslcert\" (pair 2) is not supported (client certificates",
            "accepted forms",
        ),
        (
            "postgres://app:Zq7Hidden@127.0.0.1/test?usr=Zq7Hidden",
            "query parameter 1 (of 1) of the URL is not a libpq key",
            libpq,
        ),
        (
            "postgres://app:Zq7Hidden@127.0.0.1:Zq7Hidden/test",
            "the value of the URL's port is not valid: expected port numbers",
            "accepted forms",
        ),
        (
            "host=127.0.0.1 port=Zq7Hidden",
            "the value of \"port\" (pair 2) is not valid: expected port numbers",
            "accepted forms",
        ),
        (
            "Host=127.0.0.1;Colour=Zq7Hidden;Password=Zq7Hidden",
            "an unknown Npgsql key at pair 2 (of 3)",
            npgsql,
        ),
        (
            "Host=127.0.0.1;Password=Zq7Hidden;Target Session Attributes=Zq7Hidden",
            "the value of Npgsql's \"Target Session Attributes\" (pair 3) is not valid: expected Any or ReadWrite",
            "accepted forms",
        ),
    ] {
        for sub in ["check", "scan"] {
            let out = cli(
                &[sub, "--engine", "postgres", "--connection-string", cs],
                &[],
            );
            assert_eq!(out.code, 2, "{sub} {cs}: {}", out.all());
            let all = out.all();
            assert!(all.contains(said), "{sub} {cs}: {all}");
            assert!(all.contains(listed), "{sub} {cs}: {all}");
            assert!(all.contains("accepted forms: libpq key/value"), "{all}");
            assert_eq!(
                all.matches("PostgreSQL connection string").count(),
                1,
                "{sub} {cs}: {all}"
            );
            assert!(!all.contains("Zq7Hidden"), "{sub} {cs}: {all}");
            assert!(!all.contains("usr") && !all.contains("olour"), "{sub} {cs}: {all}");
        }
    }
    // SQL Server's driver named no key either ("Not a valid boolean").
    for (cs, said) in [
        (
            "Server=tcp:db,Zq7Hidden;User Id=sa;Password=Zq7Hidden",
            "the value of `Server` is not valid: expected tcp:host,port or host,port",
        ),
        (
            "Server=db;User Id=sa;Password=Zq7Hidden;Encrypt=Zq7Hidden",
            "the value of `Encrypt` is not valid: expected true, false, yes, no, mandatory or optional",
        ),
    ] {
        let out = cli(&["check", "--engine", "mssql", "--connection-string", cs], &[]);
        assert_eq!(out.code, 2, "{cs}: {}", out.all());
        assert!(out.stderr.contains(said), "{cs}: {}", out.stderr);
        assert!(!out.all().contains("Zq7Hidden"), "{cs}: {}", out.all());
    }
}

/// Issue 20: the Npgsql keys the refusal left out of its list (Pooling,
/// Maximum Pool Size, Keepalive, Include Error Detail) are accepted, and
/// Target Session Attributes, refused before, is tokio-postgres's
/// target_session_attrs.
#[tokio::test]
async fn npgsql_pool_keepalive_and_target_session_attributes_are_accepted() {
    let store = store_with_holes("npgsql_keys").await;
    let npgsql = format!(
        "Host=127.0.0.1;Port={};Username=postgres;Password=Zq7Npgsql;Database=test;\
         Pooling=true;Maximum Pool Size=20;Keepalive=30;Include Error Detail=true;\
         Target Session Attributes=ReadWrite",
        pg_port()
    );
    let out = store.cli_at(&npgsql, &["scan", "--start-from", "0"]);
    assert_eq!(out.code, 1, "{}", out.all());
    assert!(out.stdout.contains("4..=6"), "{}", out.stdout);
    assert!(!out.all().contains("Zq7Npgsql"), "{}", out.all());
}

/// A TCP listener on a free port of 127.0.0.1 that answers each
/// connection with `answer` (an HTTP error, say) and closes it; with
/// `None` it accepts and never says a word. It lives as long as the test.
fn listener(answer: Option<&'static [u8]>) -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            match answer {
                Some(answer) => {
                    stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
                    let mut buf = [0u8; 1024];
                    let _ = stream.read(&mut buf);
                    let _ = stream.write_all(answer);
                }
                None => held.push(stream),
            }
        }
    });
    port
}

/// A port of 127.0.0.1 nothing listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Issue 20: connect errors named no host or port ("PostgreSQL connection
/// failed: connect: error connecting to server: Connection refused"), a
/// server that is not PostgreSQL read "bytes remaining on stream", and SQL
/// Server's said "SQL Server connection failed: SQL Server connection
/// failed:". Each now names host:port once, never the password, and says
/// when what answers there does not speak the engine's protocol.
#[test]
fn connect_errors_name_the_server_and_say_when_it_is_not_the_database() {
    const HTTP: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    let closed = closed_port();
    let http = listener(Some(HTTP));
    let silent = listener(None);
    let pg = |port: u16| {
        format!("host=127.0.0.1 port={port} user=postgres password=Zq7Hidden dbname=test")
    };
    let mssql = |port: u16| {
        format!(
            "Server=tcp:127.0.0.1,{port};User Id=sa;Password=Zq7Hidden;TrustServerCertificate=true"
        )
    };
    let cases = [
        (
            "postgres",
            pg(closed),
            format!("cannot connect to PostgreSQL at 127.0.0.1:{closed}: "),
        ),
        (
            "postgres",
            pg(http),
            format!("the server at 127.0.0.1:{http} does not speak the PostgreSQL protocol"),
        ),
        (
            "postgres",
            pg(silent),
            format!("no connection to PostgreSQL at 127.0.0.1:{silent} within 2s"),
        ),
        (
            "mssql",
            mssql(closed),
            format!("cannot connect to SQL Server at 127.0.0.1:{closed}: "),
        ),
        (
            "mssql",
            mssql(http),
            format!("the server at 127.0.0.1:{http} does not speak TDS, SQL Server's protocol"),
        ),
        (
            "mssql",
            mssql(silent),
            format!("no connection to SQL Server at 127.0.0.1:{silent} within 2s"),
        ),
    ];
    for (engine, cs, said) in &cases {
        for sub in ["check", "scan"] {
            let out = cli(
                &[sub, "--engine", engine, "--connect-timeout", "2s"],
                &[("GAP_HEALER_CONNECTION_STRING", cs)],
            );
            assert_eq!(out.code, 3, "{sub} {cs}: {}", out.all());
            let all = out.all();
            let line = match sub {
                // check's finding, on the connection line.
                "check" => format!("FAIL connection                 {said}"),
                _ => format!("gap-healer: {said}"),
            };
            assert!(all.contains(&line), "{sub} {cs}: wanted {line:?} in\n{all}");
            assert!(!all.contains("connection failed"), "{sub} {cs}: {all}");
            assert!(!all.contains("Zq7Hidden"), "{sub} {cs}: {all}");
        }
    }
}

/// Issue 20: each command lists the flags of the keys it reads and no
/// others (the daemon's only under `run`), `--format` has help where it is
/// taken, and a flag a command does not read is refused, before or after
/// its name, saying which commands take it.
#[test]
fn each_command_lists_and_takes_only_the_flags_it_reads() {
    let help = |argv: &[&str]| {
        let out = cli(argv, &[]);
        assert_eq!(out.code, 0, "{argv:?}: {}", out.all());
        out.stdout
    };
    let scan = help(&["scan", "--help"]);
    for absent in [
        "--metrics-addr",
        "--poll-interval",
        "--leader-election",
        "--give-up-after",
        "--gap-timeout",
        "--dry-run",
    ] {
        assert!(!scan.contains(absent), "scan lists {absent}:\n{scan}");
    }
    for present in [
        "--start-from",
        "--connect-timeout",
        "--engine",
        "--schema",
        "--store",
    ] {
        assert!(scan.contains(present), "scan lacks {present}:\n{scan}");
    }
    let sql = help(&["sql", "--help"]);
    assert!(!sql.contains("--connect-timeout"), "{sql}");
    assert!(!sql.contains("--log-level"), "{sql}");
    assert!(
        sql.contains("--watermark-table") && sql.contains("--role"),
        "{sql}"
    );
    let run = help(&["run", "--help"]);
    for present in [
        "--metrics-addr",
        "--give-up-after",
        "--no-leader-election",
        "--gap-timeout",
    ] {
        assert!(run.contains(present), "run lacks {present}:\n{run}");
    }
    // --format: with help, on every command that has it.
    for command in ["scan", "heal", "check"] {
        let text = help(&[command, "--help"]);
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("--format"))
            .unwrap_or_else(|| panic!("{command} has no --format:\n{text}"));
        assert!(
            line.contains("json (one object per store"),
            "{command}: {line}"
        );
    }
    // The exit codes, in the help.
    assert!(
        help(&["heal", "--help"]).contains("  1  holes left: held by appends still open"),
        "heal --help names its exit codes"
    );
    assert!(help(&["--help"]).contains("Exit codes"));

    for (argv, needle) in [
        (
            &["scan", "--metrics-addr", "0.0.0.0:1"][..],
            "--metrics-addr is not a flag of `gap-healer scan`: scan does not read metrics_addr; it is a flag of run, config",
        ),
        (
            &["sql", "--engine", "postgres", "--connect-timeout", "1s"],
            "--connect-timeout is not a flag of `gap-healer sql`",
        ),
        (
            &["--poll-interval", "1s", "check"],
            "--poll-interval is not a flag of `gap-healer check`",
        ),
    ] {
        let out = cli(argv, &[]);
        assert_eq!(out.code, 2, "{argv:?}: {}", out.all());
        assert!(out.stderr.contains(needle), "{argv:?}: {}", out.stderr);
    }
    // A key the command reads still goes before its name.
    let out = cli(&["--schema", "shop", "sql", "--engine", "postgres"], &[]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stdout.contains("ON shop.messages"), "{}", out.stdout);
}

/// Issue 20: `heal --once` exits 1 when it leaves holes (a position held
/// by an open append) and says so in JSON too; 0 once nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heal_once_reports_in_json_and_exits_1_while_holes_are_left() {
    let store = Store::with_holes("heal_json", &[1, 3]).await;
    let open = store.open_insert_between().await;
    let out = store.heal_once("0s", &["--lock-timeout", "300ms", "--format", "json"]);
    assert_eq!(out.code, 1, "{}", out.all());
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON object");
    assert_eq!(v["store"], "default", "{v}");
    assert_eq!(v["dry_run"], false, "{v}");
    assert_eq!(
        v["found"],
        serde_json::json!({"holes": 3, "positions": 5}),
        "{v}"
    );
    assert_eq!(v["filled"], 4, "{v}");
    assert_eq!(
        v["left"],
        serde_json::json!({"holes": 1, "positions": 1}),
        "{v}"
    );
    assert_eq!(v["statements"]["held"], 3, "{v}");
    assert_eq!(v["statements"]["failed"], 0, "{v}");
    open.rollback().await;
    let out = store.heal_once("0s", &["--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.all());
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON object");
    assert_eq!(v["filled"], 1, "{v}");
    assert_eq!(
        v["left"],
        serde_json::json!({"holes": 0, "positions": 0}),
        "{v}"
    );
    let out = store.heal_once("0s", &["--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.all());
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON object");
    assert_eq!(
        v["found"],
        serde_json::json!({"holes": 0, "positions": 0}),
        "{v}"
    );
}

/// The transaction-end proof in `heal --once`: an append that drew a
/// position and stays open holds every hole read while it is open (it may
/// have drawn any of them): nothing is tried, the summary says why, and
/// the exit code is 1 (holes left). Once it has ended, a second run fills
/// them.
#[tokio::test]
async fn heal_once_leaves_holes_an_open_transaction_may_hold_and_says_so() {
    let store = Store::with_holes("heal_open_tx", &[1, 3]).await;
    let open = store.open_append_between(1).await;
    let out = store.heal_once("0s", &["--lock-timeout", "300ms"]);
    assert_eq!(out.code, 1, "{}", out.all());
    assert_eq!(
        out.stdout,
        "filled 0 position(s) with 0 statement(s) (0 wrote tombstones, 0 refused by a committed append, 0 by a held position, 0 failed); 5 position(s) in 3 hole(s) left; 5 position(s) not tried: a transaction that may have drawn them was still open (run it again once it has ended)\n",
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(
            "not filling yet: a transaction that may have drawn these positions is still open"
        ),
        "{}",
        out.stderr
    );
    assert!(store.tombstone_positions().await.is_empty());
    let json = store.heal_once("0s", &["--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(json.stdout.trim()).expect("one JSON object");
    assert_eq!(v["waited_for_open_transactions"], 5, "{v}");
    open.commit().await.unwrap();
    let out = store.heal_once("0s", &[]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert_eq!(store.tombstone_positions().await, vec![2, 4, 5, 6]);
}

/// Issue 20: a dry run fills nothing, so it does not wait gap_timeout: it
/// reports what it found at once (exit 0: it did what it was asked).
#[tokio::test]
async fn heal_once_dry_run_reports_at_once_instead_of_waiting_gap_timeout() {
    let store = store_with_holes("dry_wait").await;
    let started = std::time::Instant::now();
    let out = store.heal_once("60s", &["--dry-run"]);
    let took = started.elapsed();
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        took < Duration::from_secs(20),
        "waited {took:?}: {}",
        out.all()
    );
    assert!(
        out.stdout.starts_with(
            "dry run: would have filled 4 position(s) in 2 hole(s); nothing written (holes as found now: a fill waits gap_timeout, 1m, "
        ),
        "{}",
        out.stdout
    );
    assert!(!out.stderr.contains("waiting"), "{}", out.stderr);
    assert!(store.tombstone_positions().await.is_empty());
}

/// Issue 20: without a terminal a scan logs no "0 of N" line at its start
/// and ends with a completion line; an empty store is said to be empty,
/// and a start at the head to have nothing to examine.
#[tokio::test]
async fn scan_ends_with_a_completion_line_and_says_what_it_examined() {
    let store = store_with_holes("scan_done").await;
    let out = store.cli(&["scan", "--start-from", "0"]);
    assert_eq!(out.code, 1, "{}", out.all());
    let done: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.contains(" INFO ") && l.contains("scanning: "))
        .collect();
    assert_eq!(done.len(), 1, "{}", out.stderr);
    assert!(
        done[0].contains("scanning: done, 7 of 7 positions in "),
        "{}",
        done[0]
    );
    assert_whole_rate(done[0]);
    let out = store.cli(&["scan", "--start-from", "head"]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert_eq!(
        out.stdout,
        "0 holes (0 missing positions): nothing to examine, the scan starts at 8 and the head is 7\n"
    );

    let empty = Store::new("scan_empty").await;
    let out = empty.cli(&["scan", "--start-from", "0"]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert_eq!(
        out.stdout,
        "0 holes (0 missing positions): the table has no rows yet\n"
    );
    let out = empty.cli(&["scan", "--start-from", "0", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(v["empty"], true, "{v}");
}

/// Issue 20: a store whose database answers with a refusal is not ready,
/// and `/readyz` says the refusal, not that the database has not answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_the_refusal_when_the_database_answers_with_one() {
    let store = store_with_holes("ready_why").await;
    let role = format!("{}_login", store.schema);
    let cs = store.create_login(&role).await;
    let d = Daemon::with_connection_string(&cs, &store.schema, &["--poll-interval", "100ms"]);
    let mut body = String::new();
    for _ in 0..100 {
        let (code, text) = d.get("/readyz").await;
        assert_eq!(code, 503, "{text}");
        body = text;
        if body.contains("permission denied") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        body.contains("no scan has succeeded since start; every scan has failed, for ")
            && body.contains(" ms (the database is not reachable, or the store is broken): ")
            && body.contains("permission denied"),
        "{body}"
    );
    assert!(!body.contains("has not answered"), "{body}");
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
}

/// Issue 20: the one store of a daemon that gives up does not say "the
/// others go on": there are none, and the daemon exits 3.
#[tokio::test]
async fn a_lone_store_that_gives_up_says_the_daemon_exits() {
    let cmd = gap_healer_testkit::bin::command(
        [
            "run",
            "--engine",
            "postgres",
            "--metrics-addr",
            "127.0.0.1:0",
            "--give-up-after",
            "1s",
            "--connect-timeout",
            "1s",
        ],
        [(
            "GAP_HEALER_CONNECTION_STRING",
            "host=127.0.0.1 port=1 user=postgres dbname=test",
        )],
    );
    let (code, output) = gap_healer_testkit::bin::run(cmd, Duration::from_secs(30)).await;
    assert_eq!(code, 3, "{output}");
    assert!(
        output.contains("this store gave up; no store is left to heal: the daemon exits"),
        "{output}"
    );
    assert!(!output.contains("the others go on"), "{output}");
}

/// A config file listing `stores` as [[stores]] of the local server.
fn fleet_file(tag: &str, stores: &[(&str, &str)]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gh-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut text = format!(
        "engine = \"postgres\"\nconnection_string = {}\n",
        toml_string(&gap_healer_testkit::pg::pg_url())
    );
    for (name, schema) in stores {
        text += &format!("[[stores]]\nname = \"{name}\"\nschema = \"{schema}\"\n");
    }
    let file = dir.join("fleet.toml");
    std::fs::write(&file, text).unwrap();
    file
}

fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Issue 20: in a fleet, `scan`, `check` and `heal --once` print every
/// line on stdout with its store (no header on stderr), and `--format
/// json` prints one object per store, each on its own line, each naming
/// its store; every key of those objects is documented in the README.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_output_names_the_store_in_each_line_and_object() {
    let a = Store::with_holes("fleet_out_a", &[1]).await;
    let b = Store::with_holes("fleet_out_b", &[1, 3]).await;
    let file = fleet_file("fleet-out", &[("a", &a.schema), ("b", &b.schema)]);
    let config = file.to_str().unwrap();
    let run = |argv: &[&str]| cli(&[argv, &["--config", config]].concat(), &[]);
    let prefixed = |stdout: &str| {
        assert!(!stdout.trim().is_empty());
        for line in stdout.lines() {
            assert!(
                line.starts_with("[store a] ") || line.starts_with("[store b] "),
                "{line:?} in\n{stdout}"
            );
        }
        assert!(
            stdout.contains("[store a] ") && stdout.contains("[store b] "),
            "{stdout}"
        );
    };
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let json_section = readme
        .split("### JSON output")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a JSON output section in the README");
    let documented = |v: &serde_json::Value, what: &str| {
        for key in v.as_object().unwrap().keys() {
            assert!(
                json_section.contains(&format!("`{key}`")),
                "{what}: `{key}` is not in the README's JSON output section"
            );
        }
    };
    let objects = |stdout: &str, what: &str| -> Vec<serde_json::Value> {
        let objects: Vec<serde_json::Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: {e}: {l}")))
            .collect();
        let stores: Vec<&str> = objects
            .iter()
            .map(|o| o["store"].as_str().unwrap())
            .collect();
        assert_eq!(stores, ["a", "b"], "{what}: {stdout}");
        for o in &objects {
            documented(o, what);
        }
        objects
    };

    let out = run(&["scan", "--start-from", "0"]);
    assert_eq!(out.code, 1, "{}", out.all());
    prefixed(&out.stdout);
    assert!(
        out.stdout
            .contains("[store b] 2 holes (4 missing positions) between 1 and the head 7\n"),
        "{}",
        out.stdout
    );
    assert!(!out.stderr.contains("== store"), "{}", out.stderr);
    let out = run(&["scan", "--start-from", "0", "--format", "json"]);
    assert_eq!(out.code, 1, "{}", out.all());
    let scans = objects(&out.stdout, "scan");
    assert_eq!(scans[1]["positions"], 4);
    for hole in scans[1]["holes"].as_array().unwrap() {
        documented(hole, "scan hole");
    }

    let out = run(&["check"]);
    assert_eq!(out.code, 0, "{}", out.all());
    prefixed(&out.stdout);
    assert!(
        out.stdout.contains("[store a] all checks passed\n"),
        "{}",
        out.stdout
    );
    let out = run(&["check", "--format", "json"]);
    let checks = objects(&out.stdout, "check");
    documented(&checks[0]["findings"][0], "check finding");

    let out = run(&["heal", "--once", "--start-from", "0", "--gap-timeout", "0s"]);
    assert_eq!(out.code, 0, "{}", out.all());
    prefixed(&out.stdout);
    let out = run(&[
        "heal",
        "--once",
        "--start-from",
        "0",
        "--gap-timeout",
        "0s",
        "--format",
        "json",
    ]);
    assert_eq!(out.code, 0, "{}", out.all());
    let heals = objects(&out.stdout, "heal");
    for what in ["found", "statements", "left"] {
        documented(&heals[0][what], &format!("heal {what}"));
    }
    std::fs::remove_dir_all(file.parent().unwrap()).ok();
}

/// Issue 20: man pages come from the same definitions as the flags: each
/// command's own. (Completions are tried in the shells themselves:
/// `cli::shells`.)
#[test]
fn man_pages_come_from_the_flag_definitions() {
    let man = cli(&["man"], &[]);
    assert_eq!(man.code, 0, "{}", man.all());
    assert!(
        man.stdout.starts_with(".ie \\n(.g .ds Aq") || man.stdout.contains(".TH gap-healer 1"),
        "{}",
        man.stdout
    );
    assert!(man.stdout.contains("Exit codes"), "{}", man.stdout);
    let scan = cli(&["man", "scan"], &[]);
    assert_eq!(scan.code, 0, "{}", scan.all());
    assert!(
        scan.stdout.contains(".TH gap-healer-scan 1"),
        "{}",
        scan.stdout
    );
    assert!(scan.stdout.contains("start\\-from"), "{}", scan.stdout);
    assert!(!scan.stdout.contains("metrics\\-addr"), "{}", scan.stdout);
    assert_eq!(cli(&["man", "nope"], &[]).code, 2);
}

/// Issue 27: `--gap-timeout`'s help called it Eventuous's
/// GapHandlingTimeoutMs, a subscriber setting the README says to leave
/// unset; it is gap-healer's own wait.
#[test]
fn gap_timeout_help_is_gap_healers_own_wait() {
    for command in ["run", "heal", "check", "config"] {
        let out = cli(&[command, "--help"], &[]);
        assert_eq!(out.code, 0, "{}", out.all());
        let line = out
            .stdout
            .lines()
            .skip_while(|l| !l.contains("--gap-timeout"))
            .take(3)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(line.contains("gap-healer waits"), "{command}: {line}");
        assert!(
            !out.stdout.contains("GapHandlingTimeoutMs"),
            "{command}: {}",
            out.stdout
        );
    }
}

/// Issue 20: `--version` names the commit (this checkout's, when built
/// from one) and the build's date.
#[test]
fn version_names_the_commit_and_the_build_date() {
    let out = cli(&["--version"], &[]);
    assert_eq!(out.code, 0, "{}", out.all());
    let line = out.stdout.trim();
    let rest = line
        .strip_prefix(&format!(
            "gap-healer {} (commit ",
            env!("CARGO_PKG_VERSION")
        ))
        .unwrap_or_else(|| panic!("{line}"));
    let (commit, built) = rest
        .split_once(", built ")
        .unwrap_or_else(|| panic!("{line}"));
    let date = built.strip_suffix(')').unwrap_or_else(|| panic!("{line}"));
    let digits: Vec<usize> = date.split('-').map(str::len).collect();
    assert_eq!(digits, [4, 2, 2], "{line}");
    let dir = env!("CARGO_MANIFEST_DIR");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let top = git(&["rev-parse", "--show-toplevel"]);
    let same =
        top.is_some_and(|t| std::fs::canonicalize(t).ok() == std::fs::canonicalize(dir).ok());
    if same {
        let head = git(&["rev-parse", "--short=12", "HEAD"]).unwrap();
        assert_eq!(commit, head, "{line}");
    } else {
        assert_eq!(commit, "unknown", "{line}: built outside a git checkout");
    }
}

/// Issue 20: `/` answers with links to the endpoints, and any other path
/// with a 404 naming them, instead of an empty 404.
#[tokio::test]
async fn the_http_root_links_the_endpoints() {
    let store = Store::new("http_root").await;
    let d = Daemon::start(&store, &[]);
    let (code, body) = d.get("/").await;
    assert_eq!(code, 200, "{body}");
    for path in ["/metrics", "/healthz", "/readyz", "/status"] {
        assert!(
            body.contains(&format!("<a href=\"{path}\">")),
            "{path}: {body}"
        );
    }
    let (code, body) = d.get("/nope").await;
    assert_eq!(code, 404, "{body}");
    assert!(
        body.contains("no endpoint /nope") && body.contains("/status"),
        "{body}"
    );
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
}

/// Issue 20: under systemd (`Type=notify`, `NOTIFY_SOCKET`) the daemon
/// says READY=1 once its endpoints answer, and STOPPING=1 on SIGTERM.
#[tokio::test]
async fn systemd_hears_ready_once_the_endpoints_answer_and_stopping_at_the_end() {
    use std::os::unix::net::UnixDatagram;
    let store = Store::new("notify").await;
    let dir = std::env::temp_dir().join(format!("gh-notify-{}", store.schema));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut args = vec!["run".to_string()];
    args.extend(store.args());
    let d = Daemon::spawn(&args, &[("NOTIFY_SOCKET", path.to_str().unwrap())]);
    let mut buf = [0u8; 1024];
    let n = socket.recv(&mut buf).expect("READY=1 within 20 s");
    let message = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(
        message.starts_with("READY=1\nSTATUS=serving /metrics, /healthz, /readyz, /status on "),
        "{message:?}"
    );
    assert_eq!(d.get("/healthz").await.0, 200);
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
    let n = socket.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(String::from_utf8_lossy(&buf[..n]), "STOPPING=1\n");
    std::fs::remove_dir_all(&dir).ok();
}

/// An IPv4 address of this machine that is not a loopback one: where the
/// route off the machine leaves from (nothing is sent).
fn non_loopback_ipv4() -> std::net::IpAddr {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    socket.connect("203.0.113.1:9").expect(
        "this test needs an IPv4 route off this machine, to find a non-loopback address of its own",
    );
    let ip = socket.local_addr().unwrap().ip();
    assert!(!ip.is_loopback() && !ip.is_unspecified(), "{ip}");
    ip
}

/// Forwards every connection to `listener` to 127.0.0.1:`port`, on threads
/// of its own, for as long as the test process runs.
fn forward(listener: std::net::TcpListener, port: u16) {
    use std::net::{Shutdown, TcpStream};
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { break };
            let Ok(mut server) = TcpStream::connect(("127.0.0.1", port)) else {
                continue;
            };
            let (mut client2, mut server2) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut client, &mut server);
                let _ = server.shutdown(Shutdown::Write);
            });
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut server2, &mut client2);
                let _ = client2.shutdown(Shutdown::Write);
            });
        }
    });
}

/// Issue 20: `check` warns (never fails) when the session is not encrypted
/// and the server is not this machine; a local one gets no warning.
#[tokio::test]
async fn check_warns_when_tls_is_off_to_a_server_that_is_not_this_machine() {
    let store = Store::new("tls_warn").await;
    let ip = non_loopback_ipv4();
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    forward(listener, pg_port());
    let remote = format!("host={ip} port={port} user=postgres dbname=test sslmode=disable");
    let out = store.cli_at(&remote, &["check"]);
    assert_eq!(out.code, 0, "a warning is not a failure: {}", out.all());
    let tls = out
        .stdout
        .lines()
        .find(|l| l.starts_with("WARN tls"))
        .unwrap_or_else(|| panic!("no tls warning:\n{}", out.stdout));
    assert!(
        tls.contains(&format!(
            "off: not encrypted, to {ip}, which is not this machine"
        )) && tls.contains("sslmode=verify-full"),
        "{tls}"
    );
    assert!(
        out.stdout.ends_with("all checks passed (1 warning)\n"),
        "{}",
        out.stdout
    );
    let out = store.cli_at(&remote, &["check", "--format", "json"]);
    assert_eq!(out.code, 0, "{}", out.all());
    let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!((&v["ok"], &v["warnings"]), (&true.into(), &1.into()), "{v}");
    let finding = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "tls")
        .unwrap();
    assert_eq!(
        (&finding["ok"], &finding["warning"]),
        (&true.into(), &true.into()),
        "{finding}"
    );
    // The same server over loopback: no warning.
    let out = store.cli(&["check"]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(!out.stdout.contains("WARN"), "{}", out.stdout);
    assert!(
        out.stdout.ends_with("all checks passed\n"),
        "{}",
        out.stdout
    );
}
