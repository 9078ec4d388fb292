//! The T-SQL the engine runs, from `sql/mssql/*.sql`, with the schema put in.
//!
//! The only text ever spliced into SQL is the schema, which the config layer
//! validated as a plain identifier and which is bracketed here (`]` doubled,
//! as QUOTENAME does). Positions, the tombstone stream's name and type and the
//! lock timeouts are bound parameters (`@P1`, `@P2`, ...).

use crate::engine::{DbError, DbResult};

/// Placeholder for the bracketed schema in the SQL files.
pub(crate) const SCHEMA_PLACEHOLDER: &str = "__schema__";

pub(crate) const HEAD: &str = include_str!("../../../sql/mssql/head.sql");
pub(crate) const SCAN: &str = include_str!("../../../sql/mssql/scan.sql");
pub(crate) const PROBE: &str = include_str!("../../../sql/mssql/probe.sql");
pub(crate) const CHECKPOINTS: &str = include_str!("../../../sql/mssql/checkpoints.sql");
pub(crate) const IDENTITY: &str = include_str!("../../../sql/mssql/identity.sql");
pub(crate) const FILL: &str = include_str!("../../../sql/mssql/fill.sql");
pub(crate) const FILL_PROCEDURE: &str = include_str!("../../../sql/mssql/fill_procedure.sql");
pub(crate) const FILL_CALL: &str = include_str!("../../../sql/mssql/fill_call.sql");
pub(crate) const FILL_MODE: &str = include_str!("../../../sql/mssql/fill_mode.sql");
pub(crate) const GRANTS: &str = include_str!("../../../sql/mssql/grants.sql");
pub(crate) const PREFLIGHT: &str = include_str!("../../../sql/mssql/preflight.sql");
pub(crate) const SESSION_STATE: &str = include_str!("../../../sql/mssql/session_state.sql");

/// The one VALUES row of `probe.sql` that [`Sql::probe`] repeats.
const PROBE_ROW: &str = "(VALUES (@P1, @P2))";

/// Ranges per probe query: 2 parameters each, below SQL Server's 2,100.
pub(crate) const PROBE_CHUNK: usize = 1024;
const _: () = assert!(
    2 * PROBE_CHUNK < 2100,
    "SQL Server takes at most 2,100 parameters"
);

/// The marker comment in the procedure that `preflight.sql` looks for.
#[cfg(test)]
pub(crate) const PROCEDURE_INTERFACE: &str = "gap-healer fill procedure, interface version 1";

/// `[name]`, with `]` doubled as QUOTENAME does.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("[{}]", name.replace(']', "]]"))
}

/// Whether `name` is the plain identifier the config layer promises
/// (`[A-Za-z_][A-Za-z0-9_]{0,127}`).
pub(crate) fn is_plain_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 128
}

/// A SQL file with the schema put in.
pub(crate) fn render(template: &str, schema: &str) -> String {
    template.replace(SCHEMA_PLACEHOLDER, &quote_ident(schema))
}

/// Every statement of the engine, rendered once for one schema.
#[derive(Clone, Debug)]
pub(crate) struct Sql {
    pub(crate) head: String,
    pub(crate) scan: String,
    probe: String,
    pub(crate) checkpoints: String,
    pub(crate) identity: String,
    pub(crate) fill: String,
    pub(crate) fill_procedure: String,
    pub(crate) fill_call: String,
    pub(crate) fill_mode: String,
    pub(crate) preflight: String,
    pub(crate) session_state: String,
}

impl Sql {
    pub(crate) fn new(schema: &str) -> DbResult<Sql> {
        if !is_plain_identifier(schema) {
            return Err(DbError::permanent(format!(
                "schema {schema:?} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 128 characters)"
            )));
        }
        Ok(Sql {
            head: render(HEAD, schema),
            scan: render(SCAN, schema),
            probe: render(PROBE, schema),
            checkpoints: render(CHECKPOINTS, schema),
            identity: render(IDENTITY, schema),
            fill: render(FILL, schema),
            fill_procedure: render(FILL_PROCEDURE, schema),
            fill_call: render(FILL_CALL, schema),
            fill_mode: render(FILL_MODE, schema),
            preflight: render(PREFLIGHT, schema),
            session_state: render(SESSION_STATE, schema),
        })
    }

    /// The probe for `ranges` ranges (1..=[`PROBE_CHUNK`]): the VALUES row
    /// repeated with parameter markers numbered here. Nothing but `@P<n>`
    /// markers is added.
    pub(crate) fn probe(&self, ranges: usize) -> String {
        let ranges = ranges.clamp(1, PROBE_CHUNK);
        let rows: Vec<String> = (0..ranges)
            .map(|i| format!("(@P{}, @P{})", 2 * i + 1, 2 * i + 2))
            .collect();
        self.probe
            .replacen(PROBE_ROW, &format!("(VALUES {})", rows.join(", ")), 1)
    }
}

/// What `gap-healer sql --engine mssql` prints: the fill procedure and the
/// grants for a placeholder user, as one sqlcmd/SSMS script.
pub(crate) fn setup_script(schema: &str) -> String {
    format!(
        "-- gap-healer {version}: SQL Server setup for schema {quoted}.\n\
         -- Run it in the event store's database (sqlcmd or SSMS) as a user who may\n\
         -- create procedures in the schema and grant rights on it (db_owner, say).\n\
         -- It creates the fill procedure (procedure mode), then grants a placeholder\n\
         -- user [gap_healer] what procedure mode needs. `gap-healer install` runs\n\
         -- the first part only.\n\
         \n\
         {procedure}GO\n\
         \n\
         {grants}",
        version = env!("CARGO_PKG_VERSION"),
        quoted = quote_ident(schema),
        procedure = render(FILL_PROCEDURE, schema),
        grants = render(GRANTS, schema),
    )
}

/// The text between the fill-body markers, each line trimmed, for the test
/// that keeps `fill.sql` and `fill_procedure.sql` identical.
#[cfg(test)]
fn fill_body(sql: &str) -> Vec<&str> {
    let start = sql.find("-- BEGIN FILL BODY").expect("begin marker");
    let end = sql.find("-- END FILL BODY").expect("end marker");
    let mut lines: Vec<&str> = sql[start..end].lines().map(str::trim).collect();
    while lines.last() == Some(&"") {
        lines.pop();
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [(&str, &str); 12] = [
        ("head", HEAD),
        ("scan", SCAN),
        ("probe", PROBE),
        ("checkpoints", CHECKPOINTS),
        ("identity", IDENTITY),
        ("fill", FILL),
        ("fill_procedure", FILL_PROCEDURE),
        ("fill_call", FILL_CALL),
        ("fill_mode", FILL_MODE),
        ("grants", GRANTS),
        ("preflight", PREFLIGHT),
        ("session_state", SESSION_STATE),
    ];

    #[test]
    fn schema_is_bracketed_everywhere() {
        let sql = Sql::new("eventuous").unwrap();
        for text in [
            &sql.head,
            &sql.scan,
            &sql.probe(3),
            &sql.checkpoints,
            &sql.identity,
            &sql.fill,
            &sql.fill_procedure,
            &sql.fill_call,
            &sql.fill_mode,
            &sql.preflight,
            &sql.session_state,
        ] {
            assert!(!text.contains(SCHEMA_PLACEHOLDER), "{text}");
        }
        assert!(sql.head.contains("[eventuous].[Messages]"));
        assert!(sql
            .fill
            .contains("SET IDENTITY_INSERT [eventuous].[Messages] ON"));
        assert!(sql
            .fill_procedure
            .contains("CREATE OR ALTER PROCEDURE [eventuous].[gap_healer_fill]"));
        assert!(sql.preflight.contains("N'[eventuous].[Messages]'"));
        let script = setup_script("Store_2");
        assert!(
            script.contains("GRANT EXECUTE ON OBJECT::[Store_2].[gap_healer_fill] TO [gap_healer]")
        );
        assert!(!script.contains(SCHEMA_PLACEHOLDER));
    }

    #[test]
    fn every_file_uses_the_placeholder_or_needs_none() {
        for (name, text) in ALL {
            if name != "session_state" {
                assert!(
                    text.contains(SCHEMA_PLACEHOLDER),
                    "{name}.sql never names the schema"
                );
            }
        }
    }

    #[test]
    fn rejects_schemas_that_are_not_plain_identifiers() {
        for bad in [
            "",
            "1abc",
            "a-b",
            "a]b",
            "a;DROP TABLE x",
            "ä",
            "a b",
            &"x".repeat(129),
        ] {
            assert!(Sql::new(bad).is_err(), "{bad:?}");
        }
        for good in ["eventuous", "_x", "Store_2", &"x".repeat(128)] {
            assert!(Sql::new(good).is_ok(), "{good:?}");
        }
        assert_eq!(quote_ident("a]b"), "[a]]b]");
    }

    #[test]
    fn no_user_value_is_ever_spliced() {
        // The tombstone stream, type, positions and timeouts are parameters:
        // the fill texts do not depend on them at all.
        let sql = Sql::new("eventuous").unwrap();
        for marker in ["@P1", "@P2", "@P3", "@P4", "@P5", "@P6"] {
            assert!(sql.fill.contains(marker), "fill.sql binds {marker}");
            assert!(
                sql.fill_call.contains(marker),
                "fill_call.sql binds {marker}"
            );
        }
        assert!(!sql.fill.contains("@P7"));
        assert!(!sql.fill.contains("__tombstones__") && !sql.fill.contains("$tombstone"));
        assert!(sql.scan.contains("@P1") && sql.scan.contains("@P2") && !sql.scan.contains("@P3"));
    }

    #[test]
    fn probe_repeats_only_numbered_markers() {
        let sql = Sql::new("eventuous").unwrap();
        assert!(
            PROBE.matches(PROBE_ROW).count() == 1,
            "probe.sql has exactly one VALUES row"
        );
        let one = sql.probe(1);
        assert!(one.contains("(VALUES (@P1, @P2))"));
        let four = sql.probe(4);
        assert!(
            four.contains("(VALUES (@P1, @P2), (@P3, @P4), (@P5, @P6), (@P7, @P8))"),
            "{four}"
        );
        let max = sql.probe(PROBE_CHUNK + 10);
        assert!(max.contains(&format!("@P{}", 2 * PROBE_CHUNK)));
        assert!(!max.contains(&format!("@P{}", 2 * PROBE_CHUNK + 1)));
    }

    #[test]
    fn fill_batch_and_procedure_share_one_body() {
        assert_eq!(fill_body(FILL), fill_body(FILL_PROCEDURE));
        assert!(FILL_PROCEDURE.contains(PROCEDURE_INTERFACE));
        assert!(PREFLIGHT.contains(PROCEDURE_INTERFACE));
        assert!(FILL_PROCEDURE.contains("WITH EXECUTE AS OWNER"));
    }

    #[test]
    fn fill_never_uses_generate_series_and_stays_below_lock_escalation() {
        for (name, text) in ALL {
            assert!(
                !text.to_uppercase().contains("GENERATE_SERIES("),
                "{name}.sql"
            );
        }
        assert!(FILL.contains("@end - @start >= 4000"));
        assert_eq!(super::super::MAX_FILL_ROWS, 4000);
    }
}
