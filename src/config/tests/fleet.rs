//! A fleet file's `[[stores]]`: each store over the top level, its
//! mistakes named with it, `--store` selection.

use super::*;
use std::time::Duration;

#[test]
fn a_fleet_is_a_list_of_stores_over_top_level_defaults() {
    let (dir, a) = fleet_file("fleet", FLEET);
    let s = load(
        &a,
        env(&[("GAP_HEALER_POLL_INTERVAL", "1s")]),
        Need::Connection,
    )
    .unwrap();
    assert!(s.fleet);
    let names: Vec<&str> = s.stores.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["orders", "billing"]);
    let (orders, billing) = (&s.stores[0], &s.stores[1]);
    assert_eq!(orders.gap_timeout, Duration::from_secs(2), "its own value");
    assert_eq!(
        billing.gap_timeout,
        Duration::from_secs(5),
        "the top-level default"
    );
    assert_eq!(
        billing.poll_interval,
        Duration::from_secs(1),
        "the environment's"
    );
    assert!(billing.dry_run && !orders.dry_run);
    assert_eq!(billing.election.key(), Some("gap-healer:billing"));
    let toml = s.to_toml();
    assert!(toml.contains("[[stores]]\nname = \"orders\"\n"), "{toml}");
    let line = toml
        .lines()
        .find(|l| l.starts_with("gap_timeout = \"2s\""))
        .unwrap();
    assert!(line.ends_with("[[stores]] orders"), "{line}");
    assert!(!toml.contains("Pw1secret"), "{toml}");
    // `config` output is a file that loads to the same stores.
    let (dir2, mut b) = fleet_file(
        "fleet-again",
        &toml.replace("\"host=db1 password=***\"", "\"host=db1\""),
    );
    b.set("log_level", "info");
    let again = load(&b, env(&[]), Need::Connection).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    assert_eq!(again.stores.len(), 2);
    assert!(again.stores[1].dry_run);
    // A flag applies to every store (a dry run is a dry run everywhere).
    let s = load(
        &a.clone().with("dry_run", "true"),
        env(&[]),
        Need::Connection,
    )
    .unwrap();
    assert!(s.stores.iter().all(|s| s.dry_run));
    std::fs::remove_dir_all(dir).ok();
    std::fs::remove_dir_all(dir2).ok();
}

#[test]
fn fleet_mistakes_are_named_with_their_store() {
    let (dir, a) = fleet_file(
        "fleet-bad",
        r#"
engine = "postgres"
[[stores]]
name = "Orders!"
connection_string = "host=a"
[[stores]]
name = "a"
connection_string = "host=a"
gap_timout = "1s"
metrics_addr = "0.0.0.0:1"
lock_timeout = "soon"
[[stores]]
name = "a"
connection_string = "host=b"
[[stores]]
connection_string = "host=c"
[[stores]]
name = "b"
connection_string = "host=a"
schema = "eventuous"
"#,
    );
    let err = load(&a, env(&[("GAP_HEALER_SCHEMA", "x")]), Need::Connection).unwrap_err();
    let text = err.to_string();
    for needle in [
        "name = \"Orders!\"",
        "1 to 63 of a-z",
        "[store a] gap_timout",
        "did you mean `gap_timeout`",
        "[store a] metrics_addr",
        "daemon-wide key",
        "[store a] lock_timeout = \"soon\"",
        "name = \"a\"",
        "two [[stores]] entries have this name",
        "[store #4] name",
        "required: every [[stores]] entry has a name",
        "schema (from environment variable GAP_HEALER_SCHEMA): the file lists [[stores]]",
        "stores a and b are in one database with one leader lock",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn store_selection() {
    let (dir, a) = fleet_file("fleet-select", FLEET);
    let mut s = load(&a, env(&[]), Need::Connection).unwrap();
    let err = s.select(&["ordrs".into()]).unwrap_err().to_string();
    assert!(
        err.contains("store = \"ordrs\" (from flag --store): no such store (did you mean `orders`?); stores: orders, billing"),
        "{err}"
    );
    s.select(&["billing".into()]).unwrap();
    assert_eq!(s.stores.len(), 1);
    assert_eq!(s.stores[0].name, "billing");
    let mut one = load(&args(), env(&[]), Need::Connection).unwrap();
    assert!(!one.fleet);
    assert_eq!(one.stores[0].name, DEFAULT_STORE);
    one.select(&["default".into()]).unwrap();
    std::fs::remove_dir_all(dir).ok();
}
