//! The T-SQL the engine runs, from `sql/mssql/*.sql`, with the schema put in.
//!
//! The only text ever spliced into SQL is the schema, which the config layer
//! validated as a plain identifier and which is bracketed here (`]` doubled,
//! as QUOTENAME does). Positions, the tombstone stream's name and type and the
//! lock timeouts are bound parameters (`@P1`, `@P2`, ...), and so is the
//! leader lock's name.
//!
//! One text is not a file: the fill procedure, which [`fill_procedure`]
//! builds from `fill.sql` (its DECLAREs become the parameters, the text
//! between its body markers the body), so the two fill modes cannot drift.

use crate::engine::{DbError, DbResult};

/// Placeholder for the bracketed schema in the SQL files.
pub(crate) const SCHEMA_PLACEHOLDER: &str = "__schema__";

pub(crate) const HEAD: &str = include_str!("../../../sql/mssql/head.sql");
pub(crate) const SCAN: &str = include_str!("../../../sql/mssql/scan.sql");
pub(crate) const PROBE: &str = include_str!("../../../sql/mssql/probe.sql");
pub(crate) const CHECKPOINTS: &str = include_str!("../../../sql/mssql/checkpoints.sql");
pub(crate) const IDENTITY: &str = include_str!("../../../sql/mssql/identity.sql");
/// The fill: run as it is in direct mode, and the source of the procedure
/// ([`fill_procedure`]).
pub(crate) const FILL: &str = include_str!("../../../sql/mssql/fill.sql");
pub(crate) const FILL_CALL: &str = include_str!("../../../sql/mssql/fill_call.sql");
pub(crate) const FILL_MODE: &str = include_str!("../../../sql/mssql/fill_mode.sql");
pub(crate) const GRANTS: &str = include_str!("../../../sql/mssql/grants.sql");
pub(crate) const PREFLIGHT: &str = include_str!("../../../sql/mssql/preflight.sql");
pub(crate) const SESSION_STATE: &str = include_str!("../../../sql/mssql/session_state.sql");
/// Takes the leader lock on a dedicated session. Names no schema: an
/// application lock belongs to the database, and its name is `@P1`.
pub(crate) const LEADER_LOCK: &str = include_str!("../../../sql/mssql/leader_lock.sql");
/// Whether the dedicated session still holds the leader lock named `@P1`.
pub(crate) const LEADER_CHECK: &str = include_str!("../../../sql/mssql/leader_check.sql");

/// The one VALUES row of `probe.sql` that [`Sql::probe`] repeats.
const PROBE_ROW: &str = "(VALUES (@P1, @P2))";

/// Ranges per probe query: 2 parameters each, below SQL Server's 2,100.
pub(crate) const PROBE_CHUNK: usize = 1024;
const _: () = assert!(
    2 * PROBE_CHUNK < 2100,
    "SQL Server takes at most 2,100 parameters"
);

/// The marker comment in the procedure that `preflight.sql` looks for.
pub(crate) const PROCEDURE_INTERFACE: &str = "gap-healer fill procedure, interface version 1";

/// The lines of `fill.sql` that delimit the procedure's body.
const BODY_BEGIN: &str = "-- BEGIN FILL BODY";
const BODY_END: &str = "-- END FILL BODY";

/// What the procedure says about itself, before `CREATE OR ALTER`.
const PROCEDURE_COMMENT: &str = "\
-- gap-healer, SQL Server: the fill procedure (procedure mode).
--
-- Created by `gap-healer install` (CREATE OR ALTER) and printed by
-- `gap-healer sql --engine mssql`. Built from sql/mssql/fill.sql: its
-- parameters are that file's DECLAREs and its body is that file's fill body,
-- so it does exactly what a direct-mode fill does, WITH EXECUTE AS OWNER:
-- SET IDENTITY_INSERT needs ALTER on Messages (or its ownership), which the
-- owner has, so the healer's login needs only EXECUTE on this procedure and
-- SELECT on the tables.
--
-- Result: one row (rows_filled, error_number, error_stage, error_message,
-- open_transactions); see the end of the body.
";
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
            fill_procedure: render(&fill_procedure(), schema),
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

/// The fill body of `fill.sql`: the lines strictly between the markers,
/// without blank lines at either end.
fn fill_body(fill: &str) -> Vec<&str> {
    let mut body: Vec<&str> = fill
        .lines()
        .skip_while(|line| line.trim_end() != BODY_BEGIN)
        .skip(1)
        .take_while(|line| line.trim_end() != BODY_END)
        .skip_while(|line| line.trim().is_empty())
        .collect();
    while body.last().is_some_and(|line| line.trim().is_empty()) {
        body.pop();
    }
    body
}

/// `(name, type, marker)` of each `DECLARE @name TYPE = @Pn;` line of
/// `fill.sql` before its body: the procedure's parameters, in order.
fn fill_parameters(fill: &str) -> Vec<(&str, &str, &str)> {
    fill.lines()
        .take_while(|line| line.trim_end() != BODY_BEGIN)
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("DECLARE @")?.strip_suffix(';')?;
            let (declaration, marker) = rest.rsplit_once(" = ")?;
            let (name, kind) = declaration.split_once(' ')?;
            marker
                .starts_with("@P")
                .then_some((name, kind.trim(), marker))
        })
        .collect()
}

/// `CREATE OR ALTER PROCEDURE __schema__.[gap_healer_fill]`, built from
/// `fill.sql` (see its header): one body for both modes, nothing to keep in
/// step by hand. The body is indented by four spaces; `fill.sql` keeps every
/// string literal on one line, so that changes no literal.
pub(crate) fn fill_procedure() -> String {
    let parameters: Vec<String> = fill_parameters(FILL)
        .iter()
        .map(|(name, kind, _)| format!("    @{name} {kind}"))
        .collect();
    let body: Vec<String> = fill_body(FILL)
        .iter()
        .map(|line| {
            if line.trim().is_empty() {
                String::new()
            } else {
                format!("    {line}")
            }
        })
        .collect();
    format!(
        "{PROCEDURE_COMMENT}\
         CREATE OR ALTER PROCEDURE {SCHEMA_PLACEHOLDER}.[gap_healer_fill]\n\
         {parameters}\n\
         WITH EXECUTE AS OWNER\n\
         AS\n\
         BEGIN\n    \
         -- {PROCEDURE_INTERFACE}\n\
         \n\
         {body}\n\
         END;\n",
        parameters = parameters.join(",\n"),
        body = body.join("\n"),
    )
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
        procedure = render(&fill_procedure(), schema),
        grants = render(GRANTS, schema),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file in sql/mssql (the procedure is built, not a file).
    const ALL: [(&str, &str); 13] = [
        ("head", HEAD),
        ("scan", SCAN),
        ("probe", PROBE),
        ("checkpoints", CHECKPOINTS),
        ("identity", IDENTITY),
        ("fill", FILL),
        ("fill_call", FILL_CALL),
        ("fill_mode", FILL_MODE),
        ("grants", GRANTS),
        ("preflight", PREFLIGHT),
        ("session_state", SESSION_STATE),
        ("leader_lock", LEADER_LOCK),
        ("leader_check", LEADER_CHECK),
    ];

    /// Files that name no schema: the session's own state, and the leader
    /// lock (an application lock of the database, named by `@P1`).
    const SCHEMALESS: [&str; 3] = ["session_state", "leader_lock", "leader_check"];

    #[test]
    fn every_sql_file_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/mssql");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".sql"))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = ALL.iter().map(|(n, _)| format!("{n}.sql")).collect();
        listed.sort();
        assert_eq!(on_disk, listed);
    }

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
            if SCHEMALESS.contains(&name) {
                assert!(!text.contains(SCHEMA_PLACEHOLDER), "{name}.sql");
            } else {
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
    fn the_procedure_is_the_fill_body_with_the_fill_parameters() {
        let procedure = fill_procedure();
        let body = fill_body(FILL);
        assert!(body.len() > 100, "the markers enclose the body");
        assert!(body.iter().any(|l| l.contains("SET IDENTITY_INSERT")));
        assert!(body
            .iter()
            .any(|l| l.contains("@@TRANCOUNT AS open_transactions")));
        // Every body line, in order, indented by four spaces.
        let lines: Vec<&str> = procedure.lines().collect();
        let first = lines
            .iter()
            .position(|l| *l == format!("    {}", body[0]))
            .expect("the body's first line");
        for (i, line) in body.iter().enumerate() {
            let want = if line.trim().is_empty() {
                String::new()
            } else {
                format!("    {line}")
            };
            assert_eq!(lines[first + i], want, "body line {i}");
        }
        assert_eq!(lines.last(), Some(&"END;"));
        // The direct batch's DECLAREs, and nothing else, are the parameters.
        let parameters = fill_parameters(FILL);
        assert_eq!(
            parameters,
            vec![
                ("start", "BIGINT", "@P1"),
                ("end", "BIGINT", "@P2"),
                ("stream_name", "NVARCHAR(850)", "@P3"),
                ("message_type", "NVARCHAR(128)", "@P4"),
                ("lock_timeout_ms", "INT", "@P5"),
                ("stream_lock_timeout_ms", "INT", "@P6"),
            ]
        );
        assert!(procedure.contains(
            "CREATE OR ALTER PROCEDURE __schema__.[gap_healer_fill]\n    @start BIGINT,\n    @end BIGINT,\n    \
             @stream_name NVARCHAR(850),\n    @message_type NVARCHAR(128),\n    @lock_timeout_ms INT,\n    \
             @stream_lock_timeout_ms INT\nWITH EXECUTE AS OWNER\nAS\nBEGIN\n"
        ));
        // The procedure is called with the same names bound to the same markers.
        for (name, _, marker) in &parameters {
            assert!(
                FILL_CALL.contains(&format!("@{name} = {marker}")),
                "fill_call.sql binds @{name} = {marker}"
            );
        }
        // Nothing of the direct batch's preamble leaks into the procedure.
        assert!(!procedure.contains("= @P"));
        assert!(!procedure.contains(BODY_BEGIN) && !procedure.contains(BODY_END));
        // preflight.sql recognises this procedure by its marker.
        assert!(procedure.contains(PROCEDURE_INTERFACE));
        assert!(PREFLIGHT.contains(PROCEDURE_INTERFACE));
    }

    #[test]
    fn indenting_the_body_changes_no_string_literal() {
        // A literal that spans lines would get the indentation inside it.
        // Comments may hold apostrophes; code lines must close every quote.
        for (i, line) in fill_body(FILL).iter().enumerate() {
            let code = line.split("--").next().unwrap_or_default();
            assert!(
                code.matches('\'').count() % 2 == 0,
                "fill.sql body line {i} opens a literal it does not close: {line}"
            );
        }
    }

    #[test]
    fn leader_lock_sql_binds_only_the_key() {
        for (name, text) in [("leader_lock", LEADER_LOCK), ("leader_check", LEADER_CHECK)] {
            assert!(text.contains("@P1"), "{name}.sql binds the key");
            assert!(!text.contains("@P2"), "{name}.sql binds nothing else");
            assert!(text.contains("'Session'"), "{name}.sql: session-owned");
            assert!(
                text.contains("'public'"),
                "{name}.sql: the public principal"
            );
        }
        let code: String = LEADER_LOCK
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        for part in [
            "EXEC @lock_result = sp_getapplock",
            "@Resource = @P1",
            "@LockMode = 'Exclusive'",
            "@LockOwner = 'Session'",
            "@LockTimeout = 0",
            "@lock_result AS lock_result",
            "@@SPID AS session_id",
        ] {
            assert!(code.contains(part), "leader_lock.sql: {part}");
        }
        assert!(LEADER_CHECK.contains("APPLOCK_MODE('public', @P1, 'Session') AS lock_mode"));
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
