//! Described tables on SQL Server (profiles `custom` and `sqlstreamstore`):
//! the engine's statements renamed for the table, the fill that writes its
//! tombstone rows, what `check` says about the table, and the grants `sql`
//! prints.
//!
//! - Reads (head, scan, probe, identity, the transaction-end proof, the
//!   instance-wide heads) are Eventuous's statements with the table and
//!   position put in ([`rename`]): each reads only the position's key.
//! - The fill is `fill.sql` with its Eventuous stages replaced by
//!   `fill_table.sql`'s ([`fill_text`]): the same parameters, range checks,
//!   lock budget, CATCH block and result row, so one reader of the answer
//!   serves both. Order inside the transaction: the tombstone lock (an
//!   application lock, when a column is `next_version`) or the stream's row
//!   (`sqlstreamstore`, made once, then `UPDLOCK`), the leader fence, the
//!   table's intent lock, the head check, the stream's next version, one
//!   insert of every position with `IDENTITY_INSERT` under the caller's lock
//!   timeout (the position's unique key decides: 2627/2601 committed, 1222
//!   held), the stream's row moved on, commit.
//! - Direct mode only: a described table has no fill procedure, so the
//!   login needs ALTER on the table for `SET IDENTITY_INSERT`.
//!
//! Architecture invariant: nothing is spliced into these statements but
//! the validated schema, table and column names and the engine's own
//! numbers; every literal of the tombstone row is a bound parameter.

use serde_json::Value;

use super::preflight::{
    connection_and_schema, database_options, grant, identity_cache, identity_of, Column, Facts,
};
use super::sql::{quote_ident, render, Bound, Sql, TableFill, FILL, FILL_TABLE};
use super::MssqlEngine;
use crate::engine::profile::{ColumnValue, TableShape, Tombstone};
use crate::engine::{Check, DbResult, Finding, Ident};

/// Where `fill.sql`'s Eventuous stages begin and end.
const STAGES_BEGIN: &str = "    -- BEGIN EVENTUOUS STAGES\n";
const STAGES_END: &str = "    -- END EVENTUOUS STAGES\n";
/// Where `fill_table.sql`'s stages begin (its header comment is left out:
/// it names the placeholders).
const TABLE_STAGES_BEGIN: &str = "    DECLARE @stream_key";

/// The first parameter of the tombstone row's literals (`@P7` is the
/// stream row's key).
const FIRST_LITERAL: usize = 8;

/// Whether `shape` is a described table (not Eventuous's own).
pub(crate) fn described(shape: &TableShape) -> bool {
    !matches!(shape.tombstone, Tombstone::EventuousStream)
}

/// The statements for `shape`'s table: Eventuous's as they are, a
/// described table's reads renamed for it ([`rename`]) and its own fill
/// ([`fill_text`]).
pub(crate) fn for_table(mut sql: Sql, schema: &Ident, shape: &TableShape) -> Sql {
    if !described(shape) {
        return sql;
    }
    for text in [
        &mut sql.head,
        &mut sql.scan,
        &mut sql.probe,
        &mut sql.identity,
        &mut sql.preflight,
        &mut sql.table_locks,
        &mut sql.reset_session,
        &mut sql.open_transactions,
        &mut sql.open_transactions_babelfish,
    ] {
        *text = rename(text, shape);
    }
    sql.table = Some(fill_text(schema, shape));
    sql
}

/// One of Eventuous's statements for `shape`'s table: `[Messages]` and
/// `GlobalPosition` become the table and its position, in literals that
/// name them too (`N'Messages'`, `N'GlobalPosition'`). Eventuous's own
/// statements are returned as they are.
pub(crate) fn rename(text: &str, shape: &TableShape) -> String {
    if !described(shape) {
        return text.to_string();
    }
    let (table, position) = (&shape.table, &shape.position);
    text.replace("N'Messages'", &format!("N'{}'", table.tsql_bare()))
        .replace("N'GlobalPosition'", &format!("N'{}'", position.tsql_bare()))
        .replace("[Messages]", &table.tsql())
        .replace("GlobalPosition", &position.tsql())
}

/// What one column of the row gets, as T-SQL over `r` (the range) and
/// `nb` (the number inside it), and the literal bound for it.
fn value_of(value: &ColumnValue, first_uuid: &mut bool, literals: &mut Vec<Bound>) -> String {
    let mut bind = |b: Bound| {
        literals.push(b);
        format!("@P{}", FIRST_LITERAL + literals.len() - 1)
    };
    match value {
        ColumnValue::Literal(Value::Null) => "NULL".into(),
        ColumnValue::Literal(Value::String(s)) => bind(Bound::Text(s.clone())),
        ColumnValue::Literal(Value::Bool(b)) => bind(Bound::Bit(*b)),
        ColumnValue::Literal(Value::Number(n)) => match n.as_i64() {
            Some(i) => bind(Bound::Int(i)),
            None => bind(Bound::Float(n.as_f64().unwrap_or_default())),
        },
        // A table or an array: its JSON text, for an NVARCHAR column.
        ColumnValue::Literal(other) => bind(Bound::Text(other.to_string())),
        // The first uuid column takes fill.sql's adjacent ids (one random
        // base per fill, the row's number in its first four bytes), so a
        // fill's rows share a few leaf pages of an index on it; any other
        // a NEWID() of its own.
        ColumnValue::Uuid if std::mem::take(first_uuid) => ADJACENT_ID.into(),
        ColumnValue::Uuid => "NEWID()".into(),
        ColumnValue::Now => "SYSDATETIMEOFFSET()".into(),
        ColumnValue::NowUtc => "SYSUTCDATETIME()".into(),
        ColumnValue::NextVersion { .. } => NEXT_VERSION.into(),
    }
}

/// fill.sql's message id expression (see its `@message_id_base`).
const ADJACENT_ID: &str = "CAST(\
N'00000' \
+ SUBSTRING(N'0123456789ABCDEF', CAST((r.first_row + nb.n) / 256 % 16 AS INT) + 1, 1) \
+ SUBSTRING(N'0123456789ABCDEF', CAST((r.first_row + nb.n) / 16 % 16 AS INT) + 1, 1) \
+ SUBSTRING(N'0123456789ABCDEF', CAST((r.first_row + nb.n) % 16 AS INT) + 1, 1) \
+ SUBSTRING(@message_id_base, 9, 28) AS UNIQUEIDENTIFIER)";

/// The tombstone stream's version of a row: the next one, in position order.
const NEXT_VERSION: &str = "@next_version + r.first_row + nb.n";

/// `text` without the lines from `-- BEGIN {section}` to `-- END {section}`
/// (`keep` false), or without only those two lines (`keep` true).
fn section(text: &str, name: &str, keep: bool) -> String {
    let (begin, end) = (format!("-- BEGIN {name}"), format!("-- END {name}"));
    let mut out = String::with_capacity(text.len());
    let mut inside = false;
    for line in text.split_inclusive('\n') {
        let t = line.trim();
        if t == begin {
            inside = true;
        } else if t == end {
            inside = false;
        } else if keep || !inside {
            out.push_str(line);
        }
    }
    out
}

/// The fill batch for `shape` in `schema` (a described table): fill.sql
/// around fill_table.sql's stages, every name put in.
pub(crate) fn fill_text(schema: &Ident, shape: &TableShape) -> TableFill {
    let (before, rest) = FILL
        .split_once(STAGES_BEGIN)
        .expect("fill.sql marks its Eventuous stages");
    let (_, after) = rest
        .split_once(STAGES_END)
        .expect("fill.sql marks the end of its Eventuous stages");
    let at = FILL_TABLE
        .find(TABLE_STAGES_BEGIN)
        .expect("fill_table.sql declares its stream key first");
    let stages = section(
        &section(&FILL_TABLE[at..], "NEXT VERSION", shape.version().is_some()),
        "STREAM ROW",
        shape.stream_row().is_some(),
    );

    let mut names = Vec::new();
    let mut values = Vec::new();
    let mut literals = Vec::new();
    let mut first_uuid = true;
    if let [stream, version] = shape.stream_columns() {
        names.push(quote_ident(stream));
        values.push("@stream_id".to_string());
        names.push(quote_ident(version));
        values.push(NEXT_VERSION.to_string());
    }
    let mut literal_at = Vec::new();
    for c in shape.columns() {
        names.push(c.name.tsql());
        let before = literals.len();
        values.push(value_of(&c.value, &mut first_uuid, &mut literals));
        literal_at.push((c.name.clone(), (literals.len() > before).then_some(before)));
    }
    // The next_version column's stream: each of its literals' columns,
    // compared with that literal's parameter.
    let (version_column, stream_match) = match shape.version() {
        Some((column, stream)) => {
            let matches: Vec<String> = stream
                .iter()
                .map(|s| {
                    match literal_at
                        .iter()
                        .find(|(n, _)| n == s)
                        .and_then(|(_, at)| *at)
                    {
                        Some(i) => format!("m.{} = @P{}", s.tsql(), FIRST_LITERAL + i),
                        None => format!("m.{} IS NULL", s.tsql()),
                    }
                })
                .collect();
            (column.tsql(), matches.join(" AND "))
        }
        None => (String::new(), "1 = 1".into()),
    };
    let lock = format!(
        "N'gap-healer:tombstones:{}.{}'",
        schema.tsql_bare(),
        shape.table.tsql_bare()
    );
    let indent = ",\n        ";
    let text = format!("{before}{stages}{after}")
        .replace("__stream_match__ = 1", &stream_match)
        .replace("__version__", &version_column)
        .replace("__tombstone_lock__", &lock)
        .replace("__columns__", &names.join(indent))
        .replace("__values__", &values.join(indent))
        .replace("__table__", &shape.table.tsql())
        .replace("__position__", &shape.position.tsql());
    TableFill {
        text: rename(&render(&text, schema), shape),
        literals,
        stream_key: shape.stream_row().map(|r| r.id.clone()).unwrap_or_default(),
    }
}

impl MssqlEngine {
    /// The query step of `check` for a described table: `preflight.sql`
    /// renamed for it, judged by [`findings`].
    pub(crate) async fn table_findings(&self) -> DbResult<Vec<Finding>> {
        Ok(match self.preflight_facts().await? {
            Ok((facts, columns)) => findings(
                &self.settings.schema,
                &self.settings.profile,
                &facts,
                &columns,
            ),
            Err(findings) => findings,
        })
    }
}

/// The columns of SQLStreamStore's `Streams` the fill uses.
const STREAMS_COLUMNS: [&str; 5] = ["Id", "IdOriginal", "IdInternal", "Version", "Position"];

/// Every finding of `check` for a described table: the connection, the
/// schema, the table and its position, the tombstone row's columns, the
/// stream row's `Streams`, the database options and the rights of direct
/// mode. `f` and `columns` are `preflight.sql`'s, renamed for the table.
pub(crate) fn findings(
    schema: &Ident,
    shape: &TableShape,
    f: &Facts,
    columns: &[Column],
) -> Vec<Finding> {
    let s = schema.tsql();
    let table = format!("{s}.{}", shape.table.tsql());
    let streams = format!("{s}.[Streams]");
    let user = quote_ident(if f.user.is_empty() {
        "gap_healer"
    } else {
        &f.user
    });
    let mut out = connection_and_schema(f, &s);
    if !f.schema_exists {
        return out;
    }
    if !f.messages_exists {
        out.push(Finding::fail(
            Check::Table,
            format!(
                "{table} not found ({} profile), or the login may not see it",
                shape.kind
            ),
        ));
        return out;
    }
    out.push(Finding::pass(
        Check::Table,
        format!("{table} exists ({} profile)", shape.kind),
    ));
    out.push(position(shape, f, columns));
    out.push(tombstone_columns(shape, columns));
    if shape.stream_row().is_some() {
        out.push(streams_table(&streams, f, columns));
    }
    out.push(Finding::pass(
        Check::Checkpoints,
        "none for this profile: start_from = checkpoints starts `lookback` below the head (never below the identity's seed); start_from = 0 examines the whole table",
    ));
    out.extend(database_options(f));
    identity_cache(f, &mut out);
    out.extend(rights(shape, f, &table, &streams, &user));
    out
}

/// The position: an IDENTITY with increment 1, and a unique index keyed on
/// it alone; the exposure when that index is not the clustered one.
fn position(shape: &TableShape, f: &Facts, columns: &[Column]) -> Finding {
    let (table, position) = (shape.table.as_str(), shape.position.as_str());
    let mut problems = Vec::new();
    match identity_of(table, position, columns) {
        Some(c) if !["bigint", "int"].contains(&c.type_name.to_ascii_lowercase().as_str()) => {
            problems.push(format!(
                "{position} is {} (expected bigint or int)",
                c.type_name
            ));
        }
        Some(_) => {}
        None => problems.push(format!("{position} is not an IDENTITY column of {table}")),
    }
    if f.identity_increment.is_some_and(|i| i != 1) {
        problems.push(format!(
            "the identity increment is {} (expected 1)",
            f.identity_increment.unwrap_or(0)
        ));
    }
    if !f.global_position_unique {
        problems.push(format!(
            "no unique index keyed exactly on ({position}) without IGNORE_DUP_KEY: a fill would neither \
             wait on an open append's key nor fail on a committed one, so it could take a slow append's position"
        ));
    }
    if !problems.is_empty() {
        return Finding::fail(Check::GlobalPosition, problems.join("; "));
    }
    let seed = f.identity_seed.map_or("?".into(), |v| v.to_string());
    if f.babelfish.is_some() {
        return Finding::pass(
            Check::GlobalPosition,
            format!(
                "{position} IDENTITY({seed}, 1) with a unique index (Babelfish keeps every table as a heap: \
                 no index is clustered)"
            ),
        );
    }
    if f.global_position_clustered_pk {
        return Finding::pass(
            Check::GlobalPosition,
            format!("{position} IDENTITY({seed}, 1), the clustered primary key"),
        );
    }
    Finding::warn(
        Check::GlobalPosition,
        format!(
            "{position} IDENTITY({seed}, 1) has a unique index, but not the clustered primary key: an insert \
             writes the clustered index first, so an append can wait there (on another unique key, a \
             constraint) with its position drawn and no key of it for a tombstone to wait on. Only the \
             transaction-end proof (see \"transaction proof\") covers that window; scans read the unique index"
        ),
    )
}

/// The tombstone row's columns exist, and no required column is left out.
fn tombstone_columns(shape: &TableShape, columns: &[Column]) -> Finding {
    let table = shape.table.as_str();
    let of_table: Vec<&Column> = columns
        .iter()
        .filter(|c| c.table.eq_ignore_ascii_case(table))
        .collect();
    let given: Vec<&str> = shape
        .stream_columns()
        .iter()
        .copied()
        .chain(shape.columns().iter().map(|c| c.name.as_str()))
        .chain([shape.position.as_str()])
        .collect();
    let mut problems: Vec<String> = given
        .iter()
        .filter(|name| !of_table.iter().any(|c| c.name.eq_ignore_ascii_case(name)))
        .map(|name| format!("no column {name}"))
        .collect();
    let left_out: Vec<&str> = of_table
        .iter()
        .filter(|c| c.required && !given.iter().any(|g| c.name.eq_ignore_ascii_case(g)))
        .map(|c| c.name.as_str())
        .collect();
    if !left_out.is_empty() {
        problems.push(format!(
            "required (NOT NULL, no default) but not given: {}",
            left_out.join(", ")
        ));
    }
    if problems.is_empty() {
        Finding::pass(
            Check::TombstoneColumns,
            format!("the tombstone row sets {}", given.join(", ")),
        )
    } else {
        Finding::fail(Check::TombstoneColumns, problems.join("; "))
    }
}

/// SQLStreamStore's Streams, where the tombstone stream's row is made.
fn streams_table(streams: &str, f: &Facts, columns: &[Column]) -> Finding {
    if !f.streams_exists {
        return Finding::fail(
            Check::StreamsTable,
            format!("{streams} not found: the tombstone stream's row is made there"),
        );
    }
    let missing: Vec<&str> = STREAMS_COLUMNS
        .iter()
        .copied()
        .filter(|name| {
            !columns.iter().any(|c| {
                c.table.eq_ignore_ascii_case("Streams") && c.name.eq_ignore_ascii_case(name)
            })
        })
        .collect();
    if missing.is_empty() {
        Finding::pass(
            Check::StreamsTable,
            format!("{streams} has {}", STREAMS_COLUMNS.join(", ")),
        )
    } else {
        Finding::fail(
            Check::StreamsTable,
            format!("{streams} lacks {}", missing.join(", ")),
        )
    }
}

/// Direct mode's rights: SELECT, INSERT, ALTER on the table; SELECT,
/// INSERT, UPDATE on Streams for a stream row.
fn rights(shape: &TableShape, f: &Facts, table: &str, streams: &str, user: &str) -> Vec<Finding> {
    let r = &f.rights;
    let mut missing: Vec<String> = grant(
        &[
            ("SELECT", r.messages_select),
            ("INSERT", r.messages_insert),
            ("ALTER", r.messages_alter),
        ],
        table,
        user,
    )
    .into_iter()
    .collect();
    if shape.stream_row().is_some() {
        missing.extend(grant(
            &[
                ("SELECT", r.streams_select),
                ("INSERT", r.streams_insert),
                ("UPDATE", r.streams_update),
            ],
            streams,
            user,
        ));
    }
    let read = if r.messages_select {
        Finding::pass(Check::ReadRights, format!("SELECT on {table}"))
    } else {
        Finding::fail(
            Check::ReadRights,
            format!(
                "no SELECT on {table}: scans need it. GRANT SELECT ON OBJECT::{table} TO {user};"
            ),
        )
    };
    let mode = if missing.is_empty() {
        Finding::pass(
            Check::FillMode,
            "direct mode (a described table has no fill procedure): SET IDENTITY_INSERT needs the ALTER the login has",
        )
    } else {
        Finding::fail(
            Check::FillMode,
            format!(
                "direct mode (a described table has no fill procedure) needs {}",
                missing.join(" ")
            ),
        )
    };
    vec![read, mode]
}

/// What `gap-healer sql --engine mssql` prints for a described table: the
/// grants of direct mode and of the transaction-end proof.
pub(crate) fn setup_script(schema: &Ident, shape: &TableShape) -> String {
    let s = schema.tsql();
    let table = format!("{s}.{}", shape.table.tsql());
    let mut text = format!(
        "-- gap-healer, SQL Server: rights for the healer's database user, {kind} profile.\n\
         -- The grantee is the database user of the healer's login ([<healer_role>] without --role).\n\
         -- A described table fills in direct mode (there is no fill procedure for it):\n\
         -- SET IDENTITY_INSERT needs ALTER on the table.\n\
         GRANT SELECT, INSERT, ALTER ON OBJECT::{table} TO __healer_role__;\n",
        kind = shape.kind
    );
    if shape.stream_row().is_some() {
        text += &format!(
            "-- The tombstone stream's row in Streams: made once, then moved on by every fill.\n\
             GRANT SELECT, INSERT, UPDATE ON OBJECT::{s}.[Streams] TO __healer_role__;\n"
        );
    }
    text += "\n-- The transaction-end proof reads sys.dm_tran_locks (which transactions hold the\n\
             -- table open for writing), a server-level right of the LOGIN, granted in master:\n\
             --   GRANT VIEW SERVER STATE TO __healer_role__;\n\
             -- On Azure SQL Database, in the store's database instead:\n\
             --   GRANT VIEW DATABASE STATE TO __healer_role__;\n";
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::profile::{parse_columns, ProfileKind};

    fn name(s: &str) -> Ident {
        Ident::parse(s).unwrap()
    }

    fn outbox() -> TableShape {
        let columns = parse_columns(
            r#"{ id = "uuid", stream = { literal = "$gap" }, version = { next_version = ["stream"] }, kind = { literal = "tombstone" }, payload = { literal = {} }, at = "now_utc", n = { literal = 7 }, ok = { literal = true } }"#,
            |s| Ident::parse(s).map_err(|e| e.to_string()),
        )
        .unwrap();
        TableShape {
            kind: ProfileKind::Custom,
            table: name("outbox"),
            position: name("seq"),
            tombstone: Tombstone::Columns(columns),
        }
    }

    #[test]
    fn a_described_fill_is_fill_sql_around_the_table_stages() {
        let fill = fill_text(&name("app"), &outbox());
        let t = &fill.text;
        assert!(!t.contains("__"), "a placeholder is left: {t}");
        assert!(
            !t.contains("[Messages]") && !t.contains("GlobalPosition"),
            "{t}"
        );
        assert!(!t.contains("[Streams]"), "no stream row for a custom table");
        assert!(t.contains("SET IDENTITY_INSERT [app].[outbox] ON;"), "{t}");
        assert!(t.contains("SET IDENTITY_INSERT [app].[outbox] OFF;"), "{t}");
        assert!(
            t.contains("@Resource = N'gap-healer:tombstones:app.outbox'"),
            "{t}"
        );
        assert!(
            t.contains("SELECT @next_version = ISNULL(MAX(m.[version]), 0) + 1"),
            "{t}"
        );
        // The literals are bound, in column order (TOML's: by name), from @P8.
        assert_eq!(
            fill.literals,
            vec![
                Bound::Text("tombstone".into()),
                Bound::Int(7),
                Bound::Bit(true),
                Bound::Text("{}".into()),
                Bound::Text("$gap".into()),
            ]
        );
        assert!(t.contains("WHERE m.[stream] = @P12;"), "{t}");
        assert!(
            t.contains("[seq],\n        [at],\n        [id],\n        [kind],\n        [n],\n        [ok],\n        [payload],\n        [stream],\n        [version]\n"),
            "{t}"
        );
        assert!(
            t.contains("r.range_start + nb.n,\n        SYSUTCDATETIME(),\n        CAST(N'00000' "),
            "{t}"
        );
        assert!(
            t.contains("+ SUBSTRING(@message_id_base, 9, 28) AS UNIQUEIDENTIFIER),\n        @P8,\n        @P9,\n        @P10,\n        @P11,\n        @P12,\n        @next_version + r.first_row + nb.n\n"),
            "{t}"
        );
        // fill.sql's stage markers, which the engine finds its stages by,
        // and its fence texts, which Babelfish's fill replaces.
        for needle in [
            "SET @stage = N'table';",
            "SET @stage = N'messages';",
            "SET LOCK_TIMEOUT @stream_lock_timeout_ms;",
            "SET LOCK_TIMEOUT @lock_timeout_ms;",
            "APPLOCK_TEST(N'public', @leader_fence, N'Exclusive', N'Transaction') = 1",
        ] {
            assert!(t.contains(needle), "{needle}");
        }
        assert_eq!(t.matches("BEGIN TRANSACTION;").count(), 1);
        assert_eq!(t.matches("COMMIT TRANSACTION;").count(), 1);
        assert!(fill.stream_key.is_empty());
    }

    #[test]
    fn sqlstreamstores_fill_moves_its_stream_row_with_its_messages() {
        let shape =
            TableShape::sqlstreamstore_mssql("$gap-healer-tombstones", "$gap-healer-tombstone");
        let fill = fill_text(&name("dbo"), &shape);
        let t = &fill.text;
        assert!(!t.contains("__"), "a placeholder is left: {t}");
        assert!(
            !t.contains("sp_getapplock"),
            "no next_version column: no tombstone lock"
        );
        assert!(
            t.contains("FROM [dbo].[Streams] AS s WITH (UPDLOCK, ROWLOCK)"),
            "{t}"
        );
        assert!(
            t.contains("INSERT INTO [dbo].[Streams] (Id, IdOriginal)"),
            "{t}"
        );
        assert!(t.contains("APPLOCK_TEST(N'public', @leader_fence, N'Exclusive', N'Session') = 1"));
        assert!(t.contains("[Position],\n        [StreamIdInternal],\n        [StreamVersion],\n        [Id],\n        [Created],\n        [Type],\n        [JsonData]"), "{t}");
        assert!(
            t.contains("@stream_id,\n        @next_version + r.first_row + nb.n,"),
            "{t}"
        );
        assert!(t.contains("SET IDENTITY_INSERT [dbo].[Messages] OFF;"));
        assert_eq!(fill.stream_key, "2056A7F6E7A4800404073D412399CEB358530D73");
        assert_eq!(
            fill.literals,
            vec![
                Bound::Text("$gap-healer-tombstone".into()),
                Bound::Text("{}".into())
            ]
        );
    }

    #[test]
    fn eventuous_statements_are_renamed_only_for_a_described_table() {
        let head = render(super::super::sql::HEAD, &name("s"));
        assert_eq!(rename(&head, &TableShape::eventuous()), head);
        let renamed = rename(&head, &outbox());
        assert!(renamed.contains("FROM [s].[outbox] AS m WITH (READCOMMITTEDLOCK, READPAST)"));
        assert!(renamed.contains("SELECT TOP (1) m.[seq]"));
        assert!(!renamed.contains("Messages") && !renamed.contains("GlobalPosition"));
    }

    fn col(table: &str, name: &str, ty: &str, identity: bool, required: bool) -> Column {
        Column {
            table: table.into(),
            name: name.into(),
            type_name: ty.into(),
            identity,
            required,
        }
    }

    fn outbox_facts() -> (Facts, Vec<Column>) {
        let mut f = Facts {
            schema_exists: true,
            messages_exists: true,
            global_position_unique: true,
            global_position_clustered_pk: true,
            identity_seed: Some(1),
            identity_increment: Some(1),
            user: "healer".into(),
            ..Facts::default()
        };
        f.rights.messages_select = true;
        f.rights.messages_insert = true;
        f.rights.messages_alter = true;
        let columns = vec![
            col("outbox", "seq", "bigint", true, false),
            col("outbox", "id", "uniqueidentifier", false, true),
            col("outbox", "stream", "nvarchar", false, true),
            col("outbox", "version", "bigint", false, true),
            col("outbox", "kind", "nvarchar", false, true),
            col("outbox", "payload", "nvarchar", false, true),
            col("outbox", "at", "datetime2", false, false),
            col("outbox", "n", "int", false, false),
            col("outbox", "ok", "bit", false, false),
        ];
        (f, columns)
    }

    fn verdict(out: &[Finding], check: Check) -> &Finding {
        out.iter().find(|f| f.check == check).unwrap()
    }

    #[test]
    fn a_healthy_described_table_passes_and_each_fault_is_named() {
        let schema = name("app");
        let (f, columns) = outbox_facts();
        let out = findings(&schema, &outbox(), &f, &columns);
        assert!(out.iter().all(|x| x.ok), "{out:#?}");

        let mut unclustered = f.clone();
        unclustered.global_position_clustered_pk = false;
        let out = findings(&schema, &outbox(), &unclustered, &columns);
        let p = verdict(&out, Check::GlobalPosition);
        assert!(
            p.ok && p.detail.contains("not the clustered primary key"),
            "{p:?}"
        );

        let mut no_key = f.clone();
        no_key.global_position_unique = false;
        let out = findings(&schema, &outbox(), &no_key, &columns);
        assert!(!verdict(&out, Check::GlobalPosition).ok);

        let mut more = columns.clone();
        more.push(col("outbox", "tenant", "int", false, true));
        let out = findings(&schema, &outbox(), &f, &more);
        let c = verdict(&out, Check::TombstoneColumns);
        assert!(!c.ok && c.detail.contains("not given: tenant"), "{c:?}");

        let mut no_alter = f.clone();
        no_alter.rights.messages_alter = false;
        let out = findings(&schema, &outbox(), &no_alter, &columns);
        let m = verdict(&out, Check::FillMode);
        assert!(
            !m.ok
                && m.detail
                    .contains("GRANT ALTER ON OBJECT::[app].[outbox] TO [healer];"),
            "{m:?}"
        );
    }

    #[test]
    fn the_setup_script_grants_what_direct_mode_needs() {
        let shape = TableShape::sqlstreamstore_mssql("$gap-healer-tombstones", "t");
        let text = setup_script(&name("dbo"), &shape);
        assert!(text.contains(
            "GRANT SELECT, INSERT, ALTER ON OBJECT::[dbo].[Messages] TO __healer_role__;"
        ));
        assert!(text.contains(
            "GRANT SELECT, INSERT, UPDATE ON OBJECT::[dbo].[Streams] TO __healer_role__;"
        ));
        let custom = setup_script(&name("app"), &outbox());
        assert!(!custom.contains("Streams"));
    }
}
