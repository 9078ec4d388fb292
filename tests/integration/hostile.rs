//! Hostile input: injection attempts in every string that reaches SQL,
//! passwords full of separators and quotes, tables of the wrong shape, and a
//! property test of the configuration layer over arbitrary TOML, environment
//! and flag values.

use std::path::PathBuf;
use std::time::Duration;

use gap_healer::config::{self, ConfigArgs, Need, KEYS};
use gap_healer_testkit::bin::{cli, timing, Daemon};
use gap_healer_testkit::pg::{pg_url, Store, Throwaway};
use proptest::prelude::*;
use uuid::Uuid;

/// Every subcommand, as argv prefixes.
const SUBCOMMANDS: &[&[&str]] = &[
    &["run"],
    &["scan"],
    &["heal", "--once"],
    &["check"],
    &["sql"],
    &["config"],
    &["install"],
];

fn argv<'a>(sub: &[&'a str], rest: &[&'a str]) -> Vec<&'a str> {
    sub.iter().chain(rest).copied().collect()
}

/// A store with holes at 2 and 4.
async fn store_with_holes(tag: &str) -> Store {
    Store::with_holes(tag, &[1, 1]).await
}

async fn table_exists(store: &Store, table: &str) -> bool {
    let name: Option<String> = store
        .client
        .query_one(
            "SELECT to_regclass($1)::text",
            &[&format!("{}.{table}", store.schema)],
        )
        .await
        .unwrap()
        .get(0);
    name.is_some()
}

#[test]
fn schema_injection_is_refused_by_every_subcommand_before_connecting() {
    let url = pg_url();
    for schema in [
        "eventuous; DROP TABLE eventuous.messages --",
        "x\"; DROP SCHEMA public CASCADE; --",
        "public.messages",
        "a b",
        "schéma",
        "1abc",
        "",
    ] {
        for sub in SUBCOMMANDS {
            let args = argv(
                sub,
                &[
                    "--engine",
                    "postgres",
                    "--connection-string",
                    &url,
                    "--schema",
                    schema,
                ],
            );
            let out = cli(&args, &[]);
            assert_eq!(out.code, 2, "{args:?}: {}", out.all());
            assert!(
                out.stderr.contains(&format!("schema = {schema:?}")),
                "{args:?}: {}",
                out.stderr
            );
            assert!(out.stderr.contains("plain identifier"), "{}", out.stderr);
        }
        // The same from the environment.
        let out = cli(
            &["scan", "--engine", "postgres"],
            &[
                ("GAP_HEALER_SCHEMA", schema),
                ("GAP_HEALER_CONNECTION_STRING", &url),
            ],
        );
        assert_eq!(out.code, 2, "{}", out.all());
        assert!(out.stderr.contains("GAP_HEALER_SCHEMA"), "{}", out.stderr);
    }
}

#[tokio::test]
async fn tombstone_stream_and_type_are_bound_as_parameters() {
    let store = store_with_holes("hostile_tomb").await;
    let s = store.schema.clone();
    let stream = format!("x'); DROP TABLE {s}.checkpoints; --");
    let kind = format!("t'; DROP TABLE {s}.streams CASCADE; -- \"ü\" %s $1 \\");
    let out = store.heal_once(
        "0s",
        &["--tombstone-stream", &stream, "--tombstone-type", &kind],
    );
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(table_exists(&store, "checkpoints").await);
    assert!(table_exists(&store, "streams").await);
    let rows = store.rows().await;
    let tombstones: Vec<_> = rows.iter().filter(|r| r.1 == stream).collect();
    assert_eq!(tombstones.len(), 2, "{rows:?}");
    assert!(tombstones.iter().all(|r| r.2 == kind), "{rows:?}");
    assert!(store.missing().await.is_empty());
    // `check` binds the same names when it checks the stream's consistency.
    let out = store.cli(&["check", "--tombstone-stream", &stream]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(
        out.stdout.contains("2 tombstones, version 1"),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_ids_are_bound_and_exported_escaped() {
    let store = store_with_holes("hostile_ckpt").await;
    let s = store.schema.clone();
    let injection = format!("x'); DROP TABLE {s}.messages; --");
    let awkward = "q\"uo\\te\nnew line ü";
    store.set_checkpoint(&injection, Some(1)).await;
    store.set_checkpoint(awkward, None).await;
    // heal --once starts from the checkpoints, which it reads as data.
    let out = store.cli(&["heal", "--once", "--gap-timeout", "0s"]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(store.missing().await.is_empty(), "{}", out.all());
    assert!(table_exists(&store, "messages").await);

    // The daemon exports them as label values, escaped: one sample each.
    let d = Daemon::start(&store, &["--gap-timeout", "0s", "--poll-interval", "100ms"]);
    let mut body = String::new();
    for _ in 0..100 {
        body = d.get("/metrics").await.1;
        if body
            .matches("\ngap_healer_checkpoint_lag_positions{")
            .count()
            == 2
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let samples: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("gap_healer_checkpoint_lag_positions{"))
        .collect();
    assert_eq!(samples.len(), 2, "{body}");
    assert!(
        samples
            .iter()
            .any(|l| l.contains(&format!("checkpoint=\"{injection}\",store=\"default\"}} 4"))),
        "{samples:?}"
    );
    assert!(
        samples
            .iter()
            .any(|l| l.contains("checkpoint=\"q\\\"uo\\\\te\\nnew line ü\",store=\"default\"} 5")),
        "{samples:?}"
    );
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert!(table_exists(&store, "messages").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_key_is_never_spliced_into_sql() {
    let store = store_with_holes("hostile_leader").await;
    let key = format!(
        "k'); SELECT pg_terminate_backend(pg_backend_pid()); DROP TABLE {}.messages; --",
        store.schema
    );
    let d = Daemon::start(&store, &timing("0s", "100ms", &["--leader-key", &key]));
    for _ in 0..100 {
        if store.missing().await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(store.missing().await.is_empty());
    assert_eq!(d.metric("gap_healer_leader").await, Some(1.0));
    let (code, _, log) = d.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert!(log.contains("became the leader"), "{log}");
    assert!(table_exists(&store, "messages").await);
}

/// A password with every separator and quote the connection string syntaxes
/// use, a backslash, a space and non-ASCII characters.
const PASSWORD: &str = "Pw'1;x=y ü€\\z\"q";
/// Pieces of it that would betray a leak even when partly escaped or encoded.
const PIECES: &[&str] = &["Pw'1", "Pw\\'1", "Pw%27", "x=y", "ü€", "1;x", "Pw"];

/// libpq key/value quoting: single quotes, `\'` and `\\` inside.
fn libpq_quote(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
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

fn assert_no_password(what: &str, text: &str) {
    for piece in PIECES {
        assert!(!text.contains(piece), "{what}: {piece:?} shows in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_with_separators_quotes_and_unicode_parse_and_never_show() {
    // A server that checks passwords over TCP (SCRAM), so a connection that
    // works proves the password was parsed exactly.
    let pg = Throwaway::started("pw", "scram-sha-256");
    pg.admin("postgres")
        .await
        .batch_execute(&format!(
            "ALTER ROLE postgres PASSWORD '{}'",
            PASSWORD.replace('\'', "''")
        ))
        .await
        .unwrap();
    let store = pg.store("postgres").await;
    store.append_holes(&[1]).await;

    let kv = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres password={}",
        pg.port,
        libpq_quote(PASSWORD)
    );
    let url = format!(
        "postgresql://postgres:{}@127.0.0.1:{}/postgres",
        percent_encode(PASSWORD),
        pg.port
    );
    let dir = std::env::temp_dir().join(format!("gh-hostile-pw-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    for (form, cs) in [("key/value", &kv), ("URL", &url)] {
        let file = dir.join("cs");
        std::fs::write(&file, format!("{cs}\n")).unwrap();
        let file = file.to_str().unwrap().to_string();
        // The same string from each place a connection string may come from.
        type Source<'a> = (&'a str, Vec<&'a str>, Vec<(&'a str, &'a str)>);
        let sources: [Source; 3] = [
            ("flag", vec!["--connection-string", cs], vec![]),
            (
                "environment",
                vec![],
                vec![("GAP_HEALER_CONNECTION_STRING", cs.as_str())],
            ),
            ("file", vec!["--connection-string-file", &file], vec![]),
        ];
        for (source, flags, env) in &sources {
            let common = [&["--engine", "postgres", "--schema", "store"][..], flags].concat();
            let what = |sub: &str| format!("{form} from the {source}: {sub}");
            let out = cli(&argv(&["config"], &common), env);
            assert_eq!(out.code, 0, "{}", out.all());
            assert!(out.stdout.contains("***"), "{}", out.stdout);
            assert_no_password(&what("config"), &out.all());
            let out = cli(&argv(&["sql"], &common), env);
            assert_eq!(out.code, 0, "{}", out.all());
            assert_no_password(&what("sql"), &out.all());
            let out = cli(&argv(&["check"], &common), env);
            assert_eq!(out.code, 0, "{}: {}", what("check"), out.all());
            assert_no_password(&what("check"), &out.all());
            let out = cli(&argv(&["check", "--format", "json"], &common), env);
            assert_eq!(out.code, 0, "{}", out.all());
            assert_no_password(&what("check json"), &out.all());
            let out = cli(&argv(&["scan", "--start-from", "0"], &common), env);
            assert!(matches!(out.code, 0 | 1), "{}: {}", what("scan"), out.all());
            assert_no_password(&what("scan"), &out.all());
            let out = cli(
                &argv(
                    &["heal", "--once", "--start-from", "0", "--gap-timeout", "0s"],
                    &common,
                ),
                env,
            );
            assert_eq!(out.code, 0, "{}: {}", what("heal"), out.all());
            assert_no_password(&what("heal"), &out.all());
            let out = cli(&argv(&["install"], &common), env);
            assert_eq!(out.code, 0, "{}", out.all());
            assert_no_password(&what("install"), &out.all());
            // Bad usage next to the password: the errors never echo it.
            let out = cli(&argv(&["scan", "--gap-timeout", "soon"], &common), env);
            assert_eq!(out.code, 2, "{}", out.all());
            assert_no_password(&what("bad usage"), &out.all());
            // The SQL Server parser given a PostgreSQL string.
            let mssql = [&["--engine", "mssql"][..], flags].concat();
            let out = cli(&argv(&["check"], &mssql), env);
            assert!(matches!(out.code, 2 | 3), "{}", out.all());
            assert_no_password(&what("mssql parser"), &out.all());
        }
        // The daemon: logs (text and JSON), metrics, health endpoints.
        for format in ["json", "text"] {
            let d = Daemon::with_connection_string(
                cs,
                "store",
                &timing(
                    "0s",
                    "100ms",
                    &["--log-format", format, "--log-level", "debug"],
                ),
            );
            let mut ready = 0;
            for _ in 0..100 {
                ready = d.get("/readyz").await.0;
                if ready == 200 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(ready, 200, "{form}: the daemon could not connect");
            let metrics = d.get("/metrics").await.1;
            assert_no_password(&format!("{form}: /metrics"), &metrics);
            let (code, _, log) = d.terminate();
            assert_eq!(code, Some(0), "{log}");
            assert_no_password(&format!("{form}: run log ({format})"), &log);
        }
    }
    assert!(store.missing().await.is_empty());

    // A wrong password: refused with exit 3, neither password shown.
    let wrong = kv.replace(&libpq_quote(PASSWORD), &libpq_quote("Pw'1;x=y wrong"));
    for sub in [&["check"][..], &["scan"], &["heal", "--once"]] {
        let out = cli(
            &argv(
                sub,
                &[
                    "--engine",
                    "postgres",
                    "--schema",
                    "store",
                    "--connect-timeout",
                    "2s",
                ],
            ),
            &[("GAP_HEALER_CONNECTION_STRING", &wrong)],
        );
        assert_eq!(out.code, 3, "{sub:?}: {}", out.all());
        assert_no_password(&format!("wrong password, {sub:?}"), &out.all());
    }
    std::fs::remove_dir_all(dir).ok();
    drop(store);
    drop(pg);
}

/// A wrong password is an authentication failure, and the commands should
/// say so (exit 3), not that the database is unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_reported_as_an_authentication_failure() {
    let pg = Throwaway::started("wrongpw", "scram-sha-256");
    pg.admin("postgres")
        .await
        .batch_execute("ALTER ROLE postgres PASSWORD 'right'")
        .await
        .unwrap();
    let cs = format!("{} password=Zq7wrong", pg.url("postgres"));
    let mut said = Vec::new();
    for sub in [&["check"][..], &["scan"], &["heal", "--once"]] {
        let out = cli(
            &argv(sub, &["--engine", "postgres", "--connect-timeout", "2s"]),
            &[("GAP_HEALER_CONNECTION_STRING", &cs)],
        );
        assert_eq!(out.code, 3, "{}", out.all());
        assert!(!out.all().contains("Zq7wrong"), "{}", out.all());
        let all = out.all();
        if !all.contains("login refused: check the user and password")
            || !all.contains("password authentication failed")
            || all.contains("unreachable")
        {
            said.push(format!("{sub:?}: {all}"));
        }
    }
    assert!(said.is_empty(), "{}", said.join("\n"));
}

/// The Eventuous tables with `messages` changed by `alter`, and rows at 1 and 3.
async fn wrong_shape(tag: &str, alter: &str) -> Store {
    let store = Store::new(tag).await;
    let s = &store.schema;
    store
        .client
        .batch_execute(&alter.replace("__schema__", s))
        .await
        .unwrap();
    store
        .client
        .batch_execute(&format!(
            "INSERT INTO {s}.streams (stream_name, version) VALUES ('A', 1);
             INSERT INTO {s}.messages (message_id, message_type, stream_id, stream_position, global_position, json_data, created)
             OVERRIDING SYSTEM VALUE VALUES
               (gen_random_uuid(), 'E', 1, 0, 1, '{{}}', now()), (gen_random_uuid(), 'E', 1, 1, 3, '{{}}', now());
             SELECT setval(pg_get_serial_sequence('{s}.messages', 'global_position'), 3);"
        ))
        .await
        .unwrap();
    store
}

/// The shapes, what `check` must say about each.
const SHAPES: &[(&str, &str, &str)] = &[
    (
        "no_identity",
        "ALTER TABLE __schema__.messages ALTER COLUMN global_position DROP IDENTITY",
        "found bigint without identity",
    ),
    (
        "no_pkey",
        "ALTER TABLE __schema__.messages DROP CONSTRAINT messages_pkey",
        "primary key",
    ),
    (
        "int_position",
        "DROP TABLE __schema__.messages;
         CREATE TABLE __schema__.messages (
            message_id uuid NOT NULL, message_type varchar NOT NULL,
            stream_id int NOT NULL REFERENCES __schema__.streams (stream_id),
            stream_position int NOT NULL, global_position int GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            json_data jsonb NOT NULL, json_metadata jsonb, created timestamp NOT NULL)",
        "found integer identity",
    ),
    (
        "old_version",
        "ALTER TABLE __schema__.messages DROP COLUMN json_metadata",
        "missing: json_metadata",
    ),
];

#[tokio::test]
async fn check_refuses_tables_of_the_wrong_shape_and_says_what_differs() {
    for (tag, alter, says) in SHAPES {
        let store = wrong_shape(&format!("shape_{tag}"), alter).await;
        let out = store.cli(&["check"]);
        assert_eq!(out.code, 3, "{tag}: {}", out.all());
        assert!(
            out.stdout.contains(says),
            "{tag}: expected {says:?} in\n{}",
            out.stdout
        );
        println!(
            "check on {tag}: {}",
            out.stdout
                .lines()
                .find(|l| l.starts_with("FAIL"))
                .unwrap_or("")
        );
    }
}

/// `scan` (and so `heal` and `run`) on the same shapes: it must refuse with
/// exit 3 and say what differs, rather than report or fill holes in a table
/// it cannot heal safely (no identity: the positions are not identity values;
/// no primary key: the fill's insert would not wait on an open append's key;
/// an int position; a different schema version).
#[tokio::test]
async fn scan_refuses_tables_of_the_wrong_shape_and_says_what_differs() {
    let mut wrong = Vec::new();
    for (tag, alter, says) in SHAPES {
        let store = wrong_shape(&format!("scanshape_{tag}"), alter).await;
        let out = store.cli(&["scan", "--start-from", "0"]);
        if out.code != 3 || !out.all().contains(says) {
            wrong.push(format!("{tag}: exit {}:\n{}", out.code, out.all()));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A config file whose connection_string line is not valid TOML (a missing
/// quote, trailing junk, the password as a bare key): the error must not
/// quote the line.
#[test]
fn a_malformed_config_file_never_echoes_the_password() {
    let dir = fuzz_dir();
    let mut leaks = Vec::new();
    for line in [
        "connection_string = \"host=db password=Zq7Hidden'1",
        "connection_string = 'host=db password=Zq7Hidden1' junk",
        "connection_string = \"Server=db;Password=Zq7Hidden1\" = 2",
        "Zq7Hidden1 = 1 2",
        "[Zq7Hidden1",
        "connection_string = \"host=db password=Zq7Hidden1\"\nconnection_string = \"host=db password=Zq7Hidden1\"",
    ] {
        let path = dir.join("gap-healer.toml");
        std::fs::write(&path, format!("engine = \"postgres\"\n{line}\n")).unwrap();
        let out = cli(&["config", "--config", path.to_str().unwrap()], &[]);
        assert_eq!(out.code, 2, "{}", out.all());
        if out.all().contains("Zq7Hidden") {
            leaks.push(out.stderr);
        }
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        leaks.is_empty(),
        "the password shows in:\n{}",
        leaks.join("\n")
    );
}

// ---- The configuration layer, fuzzed. ----

/// A password that nothing else in a generated case can contain by chance.
fn password() -> impl Strategy<Value = String> {
    "[A-Za-z0-9;'= \"\\\\{}üé€]{3,10}".prop_map(|core| format!("Zq7{core}"))
}

/// Ways to write a connection string around the password, some well formed.
fn connection_string(pw: String) -> impl Strategy<Value = String> {
    let forms = vec![
        format!("host=db user=u password={} dbname=x", libpq_quote(&pw)),
        format!("host=db password={pw} port=5432"),
        format!("host=db port=notaport password={}", libpq_quote(&pw)),
        format!(
            "host=db password={}",
            libpq_quote(&pw).trim_end_matches('\'')
        ),
        format!("postgres://u:{}@db:5432/x", percent_encode(&pw)),
        format!("postgres://u:{pw}@db/x"),
        format!("postgres://u:{}@db:port/x", percent_encode(&pw)),
        format!(
            "Server=tcp:db,1433;User Id=sa;Password='{}';Encrypt=true",
            pw.replace('\'', "''")
        ),
        format!("Server=tcp:db,notaport;Password={pw};User Id=sa"),
        format!("Server=db;Pwd={{{}}};Database=x", pw.replace('}', "}}")),
        format!("password={pw}"),
        pw.clone(),
    ];
    proptest::sample::select(forms)
}

/// A value for a key: plausible, or anything.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(vec![
            "postgres",
            "mssql",
            "5s",
            "250ms",
            "-1s",
            "0s",
            "8 days",
            "1",
            "true",
            "no",
            "json",
            "head",
            "checkpoints",
            "-5",
            "99999999999999999999",
            "0.0.0.0:9477",
            "[::1]:0",
            "x; DROP TABLE y",
            "debug,tokio=off",
            "info[",
            "",
            " ",
            "\u{0}",
            "é",
        ])
        .prop_map(String::from),
        "\\PC{0,24}",
        any::<String>().prop_map(|s| s.chars().take(24).collect()),
    ]
}

#[derive(Clone, Debug)]
enum Layer {
    File,
    Env,
    Flag,
}

fn layer() -> impl Strategy<Value = Layer> {
    prop_oneof![Just(Layer::File), Just(Layer::Env), Just(Layer::Flag)]
}

#[derive(Clone, Debug)]
struct Case {
    pw: String,
    cs: String,
    cs_layer: Layer,
    cs_in_file: bool,
    values: Vec<(&'static str, String, Layer)>,
    /// TOML lines added as they are (junk, tables, unknown keys).
    junk: Vec<String>,
    /// Replace the whole file with this text.
    raw_file: Option<String>,
}

fn case() -> impl Strategy<Value = Case> {
    password().prop_flat_map(|pw| {
        (
            Just(pw.clone()),
            connection_string(pw.clone()),
            layer(),
            any::<bool>(),
            proptest::collection::vec(
                (
                    proptest::sample::select(
                        KEYS.iter()
                            .map(|k| k.name)
                            .filter(|k| !k.starts_with("connection_string"))
                            .collect::<Vec<_>>(),
                    ),
                    value(),
                    layer(),
                ),
                0..8,
            ),
            proptest::collection::vec(
                prop_oneof![
                    "\\PC{0,40}",
                    Just("[engine]\nx = 1".to_string()),
                    Just("schema = 5".to_string()),
                    Just("gap_timeout = [1, 2]".to_string()),
                    Just("dry_run = \"maybe\"".to_string()),
                    Just("gap_timout = \"5s\"".to_string()),
                ],
                0..3,
            ),
            proptest::option::weighted(0.1, "\\PC{0,120}"),
        )
            .prop_map(
                |(pw, cs, cs_layer, cs_in_file, values, junk, raw_file)| Case {
                    pw,
                    cs,
                    cs_layer,
                    cs_in_file,
                    values,
                    junk,
                    raw_file,
                },
            )
    })
}

fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Builds the three layers of a case in `dir` and loads them.
fn load_case(c: &Case, dir: &std::path::Path) -> Result<config::Settings, config::ConfigError> {
    let mut args = ConfigArgs::default();
    let mut env = Vec::new();
    let mut toml = String::new();
    let mut put =
        |key: &str, value: String, layer: &Layer, args: &mut ConfigArgs, toml: &mut String| {
            match layer {
                Layer::File => toml.push_str(&format!("{key} = {}\n", toml_string(&value))),
                Layer::Env => env.push((format!("GAP_HEALER_{}", key.to_ascii_uppercase()), value)),
                Layer::Flag => {
                    args.set(key, value);
                }
            }
        };
    let (cs_key, cs_value) = if c.cs_in_file {
        let path = dir.join("secret");
        std::fs::write(&path, format!("{}\n", c.cs)).unwrap();
        ("connection_string_file", path.to_str().unwrap().to_string())
    } else {
        ("connection_string", c.cs.clone())
    };
    put(cs_key, cs_value, &c.cs_layer, &mut args, &mut toml);
    for (key, value, layer) in &c.values {
        put(key, value.clone(), layer, &mut args, &mut toml);
    }
    for line in &c.junk {
        toml.push_str(line);
        toml.push('\n');
    }
    if let Some(raw) = &c.raw_file {
        toml = raw.clone();
    }
    if !toml.is_empty() {
        let path = dir.join("gap-healer.toml");
        std::fs::write(&path, &toml).unwrap();
        args.config = Some(path);
    }
    config::load(&args, env, Need::Connection)
}

fn fuzz_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gh-fuzz-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Any TOML text, environment and flag values: `config::load` never
    /// panics; every problem names a key; the password shows in no error, no
    /// effective configuration and no Debug output.
    #[test]
    fn config_load_never_panics_names_keys_and_hides_the_password(c in case()) {
        let dir = fuzz_dir();
        let result = load_case(&c, &dir);
        std::fs::remove_dir_all(&dir).ok();
        match result {
            Err(err) => {
                prop_assert!(!err.problems.is_empty());
                let text = err.to_string();
                for p in &err.problems {
                    prop_assert!(!p.key.trim().is_empty(), "a problem without a key: {:?}", p);
                    prop_assert!(text.contains(&p.key), "{}", text);
                }
                let shown = format!("{text}\n{err:?}");
                prop_assert!(!shown.contains(&c.pw), "the password {:?} shows in:\n{}", c.pw, shown);
            }
            Ok(settings) => {
                let shown = format!("{}\n{settings:?}", settings.to_toml());
                prop_assert!(!shown.contains(&c.pw), "the password {:?} shows in:\n{}", c.pw, shown);
            }
        }
    }
}
