//! The table profiles: each takes its keys and refuses the others.

use super::*;
use crate::engine::profile::{TableShape, Tombstone};

#[test]
fn profiles_take_their_keys_and_refuse_the_others() {
    let (dir, a) = fleet_file(
        "profiles",
        r#"
engine = "postgres"
connection_string = "host=db"
[[stores]]
name = "ledger"
schema = "bank"
profile = "ledger-core"
[[stores]]
name = "journal"
profile = "custom"
table = "Journal"
position_column = "seq"
[stores.columns]
id = "uuid"
kind = { literal = "$gap" }
n = { next_version = ["kind"] }
[[stores]]
name = "plain"
[[stores]]
name = "sss"
schema = "sss"
profile = "sqlstreamstore"
"#,
    );
    let s = load(&a, vec![], Need::Connection).unwrap();
    let ledger = &s.stores[0];
    assert_eq!(ledger.store.tombstone_stream, "$gap");
    assert_eq!(ledger.election.key(), Some("gap-healer:bank.events"));
    let shape = &ledger.store.profile;
    let Tombstone::Columns(_) = shape.tombstone else {
        panic!("ledger-core is a table profile");
    };
    assert_eq!(
        (shape.table.as_str(), shape.position.as_str()),
        ("events", "position")
    );
    let journal = &s.stores[1].store.profile;
    let Tombstone::Columns(_) = journal.tombstone else {
        panic!("custom is a table profile");
    };
    assert_eq!(journal.table.as_str(), "journal");
    assert_eq!(journal.version().unwrap().0.as_str(), "n");
    assert_eq!(s.stores[2].store.profile, TableShape::eventuous());
    assert_eq!(s.stores[2].election.key(), Some("gap-healer:eventuous"));
    // SQLStreamStore's messages, its own tombstone stream and type.
    let sss = &s.stores[3];
    assert_eq!(
        (
            sss.store.tombstone_stream.as_str(),
            sss.store.tombstone_type.as_str()
        ),
        ("$gap-healer-tombstones", "$gap-healer-tombstone")
    );
    assert_eq!(sss.election.key(), Some("gap-healer:sss.messages"));
    assert_eq!(
        sss.store.profile,
        TableShape::sqlstreamstore("$gap-healer-tombstones", "$gap-healer-tombstone")
    );
    // The printed configuration loads back to the same profiles.
    let again = dir.join("again.toml");
    std::fs::write(&again, s.to_toml().replace("(redacted)", "host=db")).unwrap();
    let mut b = ConfigArgs::default();
    b.config = Some(again);
    let back =
        load(&b, vec![], Need::Connection).unwrap_or_else(|e| panic!("{e}\n{}", s.to_toml()));
    for (x, y) in s.stores.iter().zip(&back.stores) {
        assert_eq!(x.store.profile, y.store.profile, "{}", s.to_toml());
    }

    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
    let cases: [Case; 7] = [
        (
            &[("columns", r#"{ a = "uuid" }"#), ("table", "events")],
            &[
                "columns (from flag --columns)",
                "table (from flag --table)",
                "the eventuous profile heals messages",
            ],
        ),
        (
            &[("profile", "custom")],
            &[
                "table (from nowhere): required by profile = \"custom\"",
                "position_column",
                "columns",
            ],
        ),
        (
            &[
                ("profile", "custom"),
                ("table", "t"),
                ("position_column", "p"),
                ("columns", r#"{ p = "now" }"#),
                ("tombstone_stream", "x"),
            ],
            &[
                "p is the position column",
                "tombstone_stream",
                "not read by the custom profile",
            ],
        ),
        (
            &[
                ("profile", "ledger-core"),
                ("columns", r#"{ a = "uuid" }"#),
                ("tombstone_stream_id", "nope"),
            ],
            &[
                "the ledger-core profile's tombstone row is fixed",
                "expected a UUID",
            ],
        ),
        (
            &[("profile", "ledger"), ("table", "bad name")],
            &[
                "expected one of eventuous, ledger-core, sqlstreamstore, custom",
                "expected a plain identifier",
            ],
        ),
        (
            &[
                ("profile", "sqlstreamstore"),
                ("table", "events"),
                ("columns", r#"{ a = "uuid" }"#),
                ("tombstone_stream_id", "00000000-0000-0000-0000-000000000000"),
            ],
            &[
                "table (from flag --table)",
                "the sqlstreamstore profile heals SQLStreamStore's messages.position",
                "columns (from flag --columns)",
                "tombstone_stream_id (from flag --tombstone-stream-id): not read by the sqlstreamstore profile",
            ],
        ),
        (
            &[
                ("profile", "sqlstreamstore"),
                ("tombstone_stream", "{0f8fad5b-d9cb-469f-a165-70867728950e}"),
            ],
            &["keeps a stream id that reads as a GUID unhashed"],
        ),
    ];
    for (flags, needles) in cases {
        let mut a = args();
        for (k, v) in flags {
            a.set(k, v.to_string());
        }
        let err = load(&a, vec![], Need::Connection).unwrap_err().to_string();
        for needle in needles {
            assert!(err.contains(needle), "{needle} not in {err}");
        }
    }
    let err = load(
        &args()
            .with("engine", "mssql")
            .with("connection_string", "Server=db;User Id=a;Password=b")
            .with("profile", "ledger-core"),
        vec![],
        Need::Connection,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("ledger-core: PostgreSQL only") && err.contains("profile = \"custom\""),
        "{err}"
    );
    std::fs::remove_dir_all(dir).ok();
}
