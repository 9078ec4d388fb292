//! Defaults, layers, origins and every problem at once, for one store.

use super::*;
use proptest::prelude::*;
use std::time::Duration;

#[test]
fn defaults_apply() {
    let s = load(&args(), env(&[]), Need::Connection).unwrap();
    assert_eq!(s.stores[0].gap_timeout, Duration::from_secs(5));
    assert_eq!(s.stores[0].store.schema.as_str(), "eventuous");
    assert_eq!(s.stores[0].start_from, StartFrom::Checkpoints);
    assert!(s.stores[0].election.is_on());
    assert!(!s.stores[0].dry_run);
    assert_eq!(
        s.stores[0].give_up_after, None,
        "never gives up unless configured"
    );
    assert_eq!(s.stores[0].election.key(), Some("gap-healer:eventuous"));
    assert_eq!(s.daemon.log_level, "info");
}

#[test]
fn give_up_after_is_a_duration_or_never() {
    let with = |v: &str| {
        load(
            &args(),
            env(&[("GAP_HEALER_GIVE_UP_AFTER", v)]),
            Need::Connection,
        )
    };
    assert_eq!(
        with("90s").unwrap().stores[0].give_up_after,
        Some(Duration::from_secs(90))
    );
    assert_eq!(with("NEVER").unwrap().stores[0].give_up_after, None);
    for (bad, why) in [
        ("0s", "at least 1s"),
        ("soon", "or never"),
        ("-1m", "negative"),
    ] {
        let text = with(bad).unwrap_err().to_string();
        assert!(
            text.contains(&format!(
                "give_up_after = \"{bad}\" (from environment variable GAP_HEALER_GIVE_UP_AFTER)"
            )) && text.contains(why),
            "{text}"
        );
    }
}

#[test]
fn precedence_file_env_flags() {
    let dir = temp_dir("prec");
    let file = dir.join("a.toml");
    std::fs::write(
        &file,
        "gap_timeout = \"7s\"\npoll_interval = \"1s\"\nlock_timeout = \"3s\"\n",
    )
    .unwrap();
    let mut a = args();
    a.config = Some(file.clone());
    a.set("lock_timeout", "4s");
    let s = load(
        &a,
        env(&[
            ("GAP_HEALER_POLL_INTERVAL", "2s"),
            ("GAP_HEALER_LOCK_TIMEOUT", "9s"),
        ]),
        Need::Connection,
    )
    .unwrap();
    assert_eq!(s.stores[0].gap_timeout, Duration::from_secs(7));
    assert_eq!(s.stores[0].poll_interval, Duration::from_secs(2));
    assert_eq!(s.stores[0].lock_timeout, Duration::from_secs(4));
    let toml = s.to_toml();
    assert!(
        toml.contains("# environment variable GAP_HEALER_POLL_INTERVAL"),
        "{toml}"
    );
    assert!(toml.contains("# flag --lock-timeout"), "{toml}");
    assert!(
        toml.contains(&format!("# config file {}", file.display())),
        "{toml}"
    );
    assert!(!toml.contains("pw\""), "{toml}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn all_problems_reported_at_once_with_key_value_origin() {
    let dir = temp_dir("bad");
    let file = dir.join("bad.toml");
    std::fs::write(&file, "gap_timout = \"5s\"\nschema = \"x; drop table y\"\n").unwrap();
    let mut a = ConfigArgs::default()
        .with("engine", "oracle")
        .with("poll_interval", "-1s");
    a.config = Some(file.clone());
    let err = load(
        &a,
        env(&[("GAP_HEALER_LOCK_TIMEOUT", "soon")]),
        Need::Connection,
    )
    .unwrap_err();
    let text = err.to_string();
    for needle in [
        "gap_timout",
        "did you mean `gap_timeout`",
        "engine = \"oracle\" (from flag --engine): unknown engine",
        "schema = \"x; drop table y\"",
        "poll_interval = \"-1s\" (from flag --poll-interval): must not be negative",
        "lock_timeout = \"soon\" (from environment variable GAP_HEALER_LOCK_TIMEOUT)",
        "connection_string (from nowhere): required",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    assert_eq!(err.problems.len(), 6, "{text}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn unknown_env_vars_are_ignored() {
    let s = load(
        &args(),
        env(&[
            ("GAP_HEALER_SERVICE_HOST", "10.0.0.1"),
            ("GAP_HEALER_PORT", "tcp://x"),
        ]),
        Need::Connection,
    );
    assert!(s.is_ok());
}

#[test]
fn bad_connection_string_never_echoes_password() {
    let a = args().with(
        "connection_string",
        "Server=tcp:db,notaport;Password=hunter2secret;User Id=sa",
    );
    if let Err(e) = load(&a.with("engine", "mssql"), env(&[]), Need::Connection) {
        assert!(!e.to_string().contains("hunter2secret"), "{e}");
    }
    let a = args().with(
        "connection_string",
        "host=db port=notaport password=hunter2secret",
    );
    let e = load(&a, env(&[]), Need::Connection).unwrap_err();
    assert!(!e.to_string().contains("hunter2secret"), "{e}");
    assert!(e.to_string().contains("connection_string"), "{e}");
}

#[test]
fn connection_string_from_a_file_and_not_both() {
    let dir = temp_dir("cs");
    let secret = dir.join("cs");
    std::fs::write(&secret, "host=db password=FromFile1\n").unwrap();
    let path = secret.to_str().unwrap();
    let a = ConfigArgs::default()
        .with("engine", "postgres")
        .with("connection_string_file", path);
    let s = load(&a, env(&[]), Need::Connection).unwrap();
    assert_eq!(
        s.stores[0].store.connection_string.expose(),
        "host=db password=FromFile1"
    );
    let toml = s.to_toml();
    assert!(
        toml.contains(&format!(
            "# file {path} named by flag --connection-string-file"
        )),
        "{toml}"
    );
    assert!(!toml.contains("connection_string_file ="), "{toml}");
    assert!(!toml.contains("FromFile1"), "{toml}");
    // The higher layer wins: the flag's file over the environment's string,
    let s = load(
        &a,
        env(&[("GAP_HEALER_CONNECTION_STRING", "host=x")]),
        Need::Connection,
    )
    .unwrap();
    assert_eq!(
        s.stores[0].store.connection_string.expose(),
        "host=db password=FromFile1"
    );
    // the environment's string over the config file's file,
    let file = dir.join("a.toml");
    std::fs::write(
        &file,
        format!("engine = \"postgres\"\nconnection_string_file = {path:?}\n"),
    )
    .unwrap();
    let mut from_file = ConfigArgs::default();
    from_file.config = Some(file.clone());
    let s = load(
        &from_file,
        env(&[("GAP_HEALER_CONNECTION_STRING", "host=x")]),
        Need::Connection,
    )
    .unwrap();
    assert_eq!(s.stores[0].store.connection_string.expose(), "host=x");
    // and both in one layer is a mistake.
    std::fs::write(
        &file,
        format!("engine = \"postgres\"\nconnection_string = \"host=y\"\nconnection_string_file = {path:?}\n"),
    )
    .unwrap();
    let err = load(&from_file, env(&[]), Need::Connection).unwrap_err();
    assert_eq!(err.problems.len(), 1, "{err}");
    assert!(err.to_string().contains("not both"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

/// Issue 20 item 5: `config` named the wrong origin. With
/// GAP_HEALER_CONNECTION_STRING set and --connection-string-file given,
/// it printed the file's value labelled `# environment variable
/// GAP_HEALER_CONNECTION_STRING`. Every combination of where the string
/// and where a file of it is set: the higher layer's value wins, and the
/// printed origin is that value's.
#[test]
fn the_connection_strings_origin_for_every_layer_combination() {
    #[derive(Clone, Copy, PartialEq, Debug)]
    enum L {
        File,
        Env,
        Flag,
    }
    let rank = |l: L| match l {
        L::File => 1,
        L::Env => 3,
        L::Flag => 4,
    };
    let dir = temp_dir("cs-origins");
    let secret = dir.join("secret");
    std::fs::write(&secret, "host=fromsecret\n").unwrap();
    let secret = secret.to_str().unwrap().to_string();
    let config = dir.join("c.toml");
    let layers = [None, Some(L::File), Some(L::Env), Some(L::Flag)];
    for inline in layers {
        for file in layers {
            let mut toml = String::from("engine = \"postgres\"\n");
            let mut vars = Vec::new();
            let mut args = ConfigArgs::default();
            args.config = Some(config.clone());
            match inline {
                Some(L::File) => toml += "connection_string = \"host=fromtoml\"\n",
                Some(L::Env) => vars.push(("GAP_HEALER_CONNECTION_STRING", "host=fromenv")),
                Some(L::Flag) => args = args.with("connection_string", "host=fromflag"),
                None => {}
            }
            match file {
                Some(L::File) => toml += &format!("connection_string_file = {secret:?}\n"),
                Some(L::Env) => vars.push(("GAP_HEALER_CONNECTION_STRING_FILE", secret.as_str())),
                Some(L::Flag) => args = args.with("connection_string_file", secret.clone()),
                None => {}
            }
            std::fs::write(&config, &toml).unwrap();
            let loaded = load(&args, env(&vars), Need::Connection);
            let case = format!("string {inline:?}, file {file:?}");
            let (value, origin) = match (inline, file) {
                (None, None) => {
                    let err = loaded.unwrap_err().to_string();
                    assert!(err.contains("required"), "{case}: {err}");
                    continue;
                }
                (Some(i), Some(f)) if rank(i) == rank(f) => {
                    let err = loaded.unwrap_err().to_string();
                    assert!(err.contains("not both"), "{case}: {err}");
                    continue;
                }
                (Some(i), f) if f.is_none_or(|f| rank(i) > rank(f)) => match i {
                    L::File => ("host=fromtoml", format!("config file {}", config.display())),
                    L::Env => (
                        "host=fromenv",
                        "environment variable GAP_HEALER_CONNECTION_STRING".into(),
                    ),
                    L::Flag => ("host=fromflag", "flag --connection-string".into()),
                },
                (_, Some(f)) => {
                    let named = match f {
                        L::File => format!("config file {}", config.display()),
                        L::Env => "environment variable GAP_HEALER_CONNECTION_STRING_FILE".into(),
                        L::Flag => "flag --connection-string-file".into(),
                    };
                    ("host=fromsecret", format!("file {secret} named by {named}"))
                }
                (Some(_), None) => unreachable!(),
            };
            let s = loaded.unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(
                s.stores[0].store.connection_string.expose(),
                value,
                "{case}"
            );
            let shown = s.to_toml();
            let row = shown
                .lines()
                .find(|l| l.starts_with("connection_string ="))
                .unwrap_or_else(|| panic!("{case}: {shown}"));
            assert!(row.ends_with(&format!("# {origin}")), "{case}: {row}");
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

/// Any other key set in several layers is shown with the origin of the
/// layer whose value wins (flag over environment over file over default).
#[test]
fn a_keys_origin_is_the_winning_layers_for_every_combination() {
    let dir = temp_dir("origins");
    let config = dir.join("c.toml");
    for mask in 0..8u8 {
        let (in_file, in_env, in_flag) = (mask & 1 != 0, mask & 2 != 0, mask & 4 != 0);
        let mut toml = String::from("engine = \"postgres\"\nconnection_string = \"host=db\"\n");
        if in_file {
            toml += "gap_timeout = \"7s\"\n";
        }
        std::fs::write(&config, &toml).unwrap();
        let mut args = ConfigArgs::default();
        args.config = Some(config.clone());
        if in_flag {
            args = args.with("gap_timeout", "9s");
        }
        let vars: Vec<(&str, &str)> = if in_env {
            vec![("GAP_HEALER_GAP_TIMEOUT", "8s")]
        } else {
            vec![]
        };
        let s = load(&args, env(&vars), Need::Connection).unwrap();
        let (value, origin) = if in_flag {
            ("9s", "flag --gap-timeout".to_string())
        } else if in_env {
            (
                "8s",
                "environment variable GAP_HEALER_GAP_TIMEOUT".to_string(),
            )
        } else if in_file {
            ("7s", format!("config file {}", config.display()))
        } else {
            ("5s", "default".to_string())
        };
        let shown = s.to_toml();
        let row = shown
            .lines()
            .find(|l| l.starts_with("gap_timeout ="))
            .unwrap_or_else(|| panic!("{mask}: {shown}"));
        assert!(row.contains(&format!("\"{value}\"")), "{mask}: {row}");
        assert!(row.ends_with(&format!("# {origin}")), "{mask}: {row}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn engine_only_needs_no_connection_string() {
    let a = ConfigArgs::default().with("engine", "mssql");
    assert!(load(&a, env(&[]), Need::EngineOnly).is_ok());
    let err = load(&ConfigArgs::default(), env(&[]), Need::EngineOnly).unwrap_err();
    assert_eq!(err.problems.len(), 1, "{err}");
    assert!(
        err.to_string()
            .contains("engine (from nowhere): required: set --engine, GAP_HEALER_ENGINE"),
        "{err}"
    );
}

/// Each key, set through each layer, lands in the settings and is shown
/// by `gap-healer config` with that layer as its origin.
#[test]
fn every_key_by_env_file_and_flag() {
    let dir = temp_dir("every");
    let secret = dir.join("secret");
    std::fs::write(&secret, "host=db").unwrap();
    let secret = secret.to_str().unwrap().to_string();
    // A valid value other than the default, for each key.
    let value = |key: &Key| match key.name {
        "engine" => "mssql".to_string(),
        "connection_string" => "Server=tcp:db,1433;User Id=sa;Password=x".into(),
        "connection_string_file" => secret.clone(),
        "schema" | "tombstone_stream" | "tombstone_type" | "leader_key" => "other".into(),
        "metrics_addr" => "127.0.0.1:1".into(),
        "start_from" => "head".into(),
        "lookback" | "scan_page_size" => "123".into(),
        "dry_run" => "true".into(),
        "leader_election" => "false".into(),
        "log_format" => "json".into(),
        "log_level" => "debug".into(),
        "watermark_table" => "gap_healer.watermarks".into(),
        "profile" => "ledger-core".into(),
        "table" | "position_column" => "other".into(),
        "tombstone_stream_id" => "00000000-0000-0000-0000-000000000001".into(),
        "columns" => r#"{ kind = { literal = "$gap" }, v = { next_version = ["kind"] } }"#.into(),
        _ => "7s".into(),
    };
    for key in KEYS {
        // The connection string and its file exclude each other, and the
        // engine must match the string.
        let base: Vec<(&str, String)> = match key.name {
            "engine" => vec![(
                "connection_string",
                value(Key::find("connection_string").unwrap()),
            )],
            "connection_string" => vec![("engine", "mssql".into())],
            "connection_string_file" => vec![("engine", "postgres".into())],
            "table" | "position_column" | "tombstone_stream_id" => vec![
                ("engine", "postgres".into()),
                ("connection_string", "host=db".into()),
                ("profile", "ledger-core".into()),
            ],
            "columns" => vec![
                ("engine", "postgres".into()),
                ("connection_string", "host=db".into()),
                ("profile", "custom".into()),
                ("table", "t".into()),
                ("position_column", "p".into()),
            ],
            _ => vec![
                ("engine", "postgres".into()),
                ("connection_string", "host=db".into()),
            ],
        };
        let flag_origin = format!("flag --{}", key.long());
        let env_origin = format!("environment variable {}", key.env());
        let file = dir.join(format!("{}.toml", key.name));
        std::fs::write(
            &file,
            format!("{} = {}\n", key.name, toml::Value::String(value(key))),
        )
        .unwrap();
        let file_origin = format!("config file {}", file.display());
        for layer in 0..3 {
            let mut a = ConfigArgs::default();
            for (k, v) in &base {
                a.set(k, v.clone());
            }
            let mut e = Vec::new();
            let origin = match layer {
                0 => {
                    a.set(key.name, value(key));
                    &flag_origin
                }
                1 => {
                    e.push((key.env(), value(key)));
                    &env_origin
                }
                _ => {
                    a.config = Some(file.clone());
                    &file_origin
                }
            };
            let s = load(&a, e, Need::Connection)
                .unwrap_or_else(|err| panic!("{} by {origin}: {err}", key.name));
            let toml = s.to_toml();
            // A file's connection string is shown as connection_string,
            // from the file the key named.
            let (shown, origin) = match key.name {
                "connection_string_file" => (
                    "connection_string",
                    format!("file {} named by {origin}", value(key)),
                ),
                name => (name, origin.to_string()),
            };
            let line = toml
                .lines()
                .find(|l| l.starts_with(&format!("{shown} = ")))
                .unwrap_or_else(|| panic!("{shown} not in\n{toml}"));
            assert!(line.ends_with(&format!("# {origin}")), "{line}");
            if key.show(&s.daemon, Some(&s.stores[0].config)).is_some() {
                let def = load(&args(), vec![], Need::Connection).unwrap();
                assert_ne!(
                    key.show(&s.daemon, Some(&s.stores[0].config)),
                    key.show(&def.daemon, Some(&def.stores[0].config)),
                    "{} by {origin} changed nothing",
                    key.name
                );
            }
        }
    }
    std::fs::remove_dir_all(dir).ok();
}

/// The example file names every key and loads as it is.
#[test]
fn the_example_file_has_every_key() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/gap-healer.toml");
    let text = std::fs::read_to_string(path).unwrap();
    for key in KEYS {
        assert!(
            text.lines().any(|l| l
                .trim_start_matches("# ")
                .starts_with(&format!("{} = ", key.name))),
            "{} missing from {path}",
            key.name
        );
    }
    let mut a = ConfigArgs::default().with("connection_string", "host=db");
    a.config = Some(path.into());
    let s = load(&a, vec![], Need::Connection).unwrap();
    assert!(s.stores[0]
        .origins
        .iter()
        .chain(&s.daemon_origins)
        .any(|(_, o)| o.starts_with("config file")));
}

/// The example file sets each key it does not comment out to its
/// default: the file, `--help` and the defaults (written once, in what
/// was read's `Default`) say the same.
#[test]
fn the_example_file_states_the_defaults() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/gap-healer.toml");
    let mut a = ConfigArgs::default().with("connection_string", "host=db");
    a.config = Some(path.into());
    let example = load(&a, vec![], Need::Connection).unwrap();
    let defaults = load(&args(), vec![], Need::Connection).unwrap();
    let mut from_file = 0;
    for key in KEYS.iter().filter(|k| k.unset == Unset::Default) {
        let shown = |s: &Settings| key.show(&s.daemon, Some(&s.stores[0].config));
        assert_eq!(shown(&example), shown(&defaults), "{} in {path}", key.name);
        let origins = [&example.daemon_origins[..], &example.stores[0].origins[..]].concat();
        from_file += origins.iter().filter(|(k, _)| k == &key.name).count();
    }
    assert!(from_file > 10, "{from_file} defaults set in {path}");
}

#[test]
fn log_level_typos_are_refused() {
    let err = load(&args().with("log_level", "wran"), vec![], Need::Connection).unwrap_err();
    assert!(
        err.to_string().contains(
            "log_level = \"wran\" (from flag --log-level): `wran` is not a level (did you mean `warn`?)"
        ),
        "{err}"
    );
}

proptest! {
    /// Any text in any key, from any layer: never a panic, and either valid
    /// settings or problems that each name a key.
    #[test]
    fn never_panics(
        key in proptest::sample::select(KEYS.iter().map(|k| k.name).collect::<Vec<_>>()),
        value in "\\PC{0,30}",
        layer in 0..2u8,
    ) {
        let mut a = args();
        let mut e = Vec::new();
        if layer == 0 {
            e.push((format!("GAP_HEALER_{}", key.to_ascii_uppercase()), value.clone()));
        } else {
            a.set(key, value.clone());
        }
        if let Err(err) = load(&a, e, Need::Connection) {
            prop_assert!(!err.problems.is_empty());
            prop_assert!(err.problems.iter().all(|p| !p.key.is_empty()));
        }
    }
}
