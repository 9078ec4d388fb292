//! Every statement of the PostgreSQL engine, from `sql/postgres/*.sql`, with
//! the store's schema, table and position column spliced in once (validated
//! identifiers; every value is a bind parameter). The table profiles' fill
//! and version statements are written here from the profile's columns.

use std::sync::LazyLock;

use crate::engine::ident::Ident;
use crate::engine::profile::{
    ColumnValue, TableShape, Tombstone, SQLSTREAMSTORE_STREAM_COLUMN, SQLSTREAMSTORE_VERSION_COLUMN,
};

/// The engine's statements for one schema.
pub(crate) struct Queries {
    pub scan: String,
    pub probe: String,
    pub fill: String,
    pub head: String,
    pub checkpoints: String,
    pub lock_stream: String,
    pub create_stream: String,
    pub bump_stream: String,
    pub tombstone_stream: String,
    /// The healed table's ROW EXCLUSIVE lock, which every fill takes first.
    pub lock_table: String,
    /// The table profiles' statements; `None` for Eventuous.
    pub table: Option<TableQueries>,
}

/// The fill of a table profile, and its tombstone stream's version.
pub(crate) struct TableQueries {
    /// `$1`, `$2`: the ranges' starts and ends; `$3`: the literal columns
    /// as JSON text; `$4`: the stream's version before the fill (only when
    /// a column is `next_version`); for a stream row's message, `$4` the
    /// row's `id_internal` and `$5` its `version` before the fill.
    pub fill: String,
    /// The highest version of the tombstone stream (`$1`: the literals).
    pub version: Option<String>,
    /// Converts the literals (`$1`) to the table's row type, as the fill
    /// will: `check`'s test of them.
    pub literals: String,
    /// The tombstone stream's row, for a stream row's message
    /// (SQLStreamStore's `streams`).
    pub stream: Option<StreamQueries>,
}

/// The statements on the tombstone stream's row in SQLStreamStore's
/// `streams` (`sql/postgres/sqlstreamstore_*.sql`).
pub(crate) struct StreamQueries {
    /// Locks the row for the fill: `$1` its `id`; `id_internal`, `version`.
    pub lock: String,
    /// Makes it, empty, on the first fill: `$1` its `id`, `$2` its name.
    pub create: String,
    /// Raises its version by the rows inserted and its position to the
    /// highest one: `$1` its `id_internal`, `$2` the rows, `$3` the highest
    /// position inserted.
    pub bump: String,
    /// `check`: the row beside its messages (`$1` its `id`).
    pub check: String,
}

/// Statements that name no table of the store.
pub(crate) const IDENTITY: &str = include_str!("../../../sql/postgres/identity.sql");
pub(crate) const TABLE_EXISTS: &str = include_str!("../../../sql/postgres/table_exists.sql");
pub(crate) const POSITION_KEYS: &str = include_str!("../../../sql/postgres/position_keys.sql");
pub(crate) const PREFLIGHT: &str = include_str!("../../../sql/postgres/preflight.sql");
pub(crate) const PREFLIGHT_TABLE: &str = include_str!("../../../sql/postgres/preflight_table.sql");
/// `check`, sqlstreamstore: the catalog's facts about `streams` (`$1` the schema).
pub(crate) const SQLSTREAMSTORE_STREAMS: &str =
    include_str!("../../../sql/postgres/sqlstreamstore_streams.sql");
pub(crate) const LEADER_LOCK: &str = include_str!("../../../sql/postgres/leader_lock.sql");
pub(crate) const DATABASES: &str = include_str!("../../../sql/postgres/databases.sql");
pub(crate) const LEADER_CHECK: &str = include_str!("../../../sql/postgres/leader_check.sql");
pub(crate) const ROLL_JOIN: &str = include_str!("../../../sql/postgres/roll_join.sql");
pub(crate) const ROLL: &str = include_str!("../../../sql/postgres/roll.sql");
pub(crate) const SHARED_CHECKPOINTS: &str =
    include_str!("../../../sql/postgres/shared_checkpoints.sql");
pub(crate) const SEQUENCE: &str = include_str!("../../../sql/postgres/sequence.sql");
pub(crate) const HANDED: &str = include_str!("../../../sql/postgres/handed_out.sql");
pub(crate) const IDENTITY_SEQUENCE: &str =
    include_str!("../../../sql/postgres/identity_sequence.sql");
/// One store's part of the first statement of a reading of open
/// transactions ([`super::transactions`]), as sent.
pub(crate) static HANDED_OUT: LazyLock<String> = LazyLock::new(|| without_comments(HANDED));
/// The second statement of a reading of open transactions, as sent.
pub(crate) static TRANSACTIONS: LazyLock<String> =
    LazyLock::new(|| without_comments(include_str!("../../../sql/postgres/transactions.sql")));
/// One store's part of the head reading its pool's stores share
/// ([`super::heads`]): an expression, not a statement.
pub(crate) const SHARED_HEAD: &str = include_str!("../../../sql/postgres/shared_head.sql");
/// The reading itself, around one [`SHARED_HEAD`] per store.
pub(crate) const SHARED_HEADS: &str = include_str!("../../../sql/postgres/shared_heads.sql");
const GRANTS: &str = include_str!("../../../sql/postgres/grants.sql");

/// A statement without its whole-line comments and blank lines: each
/// store keeps its own copies (500 stores, 2 MB with the comments) and
/// sends them every poll.
pub(crate) fn without_comments(sql: &str) -> String {
    let lines: Vec<&str> = sql
        .lines()
        .filter(|l| {
            let l = l.trim();
            !l.is_empty() && !l.starts_with("--")
        })
        .collect();
    lines.join("\n")
}

/// One of `sql/postgres/*.sql` as a store keeps and sends it: rendered
/// ([`render`]) and without its comment lines.
pub(crate) fn statement(sql: &str, schema: &Ident, shape: &TableShape) -> String {
    without_comments(&render(sql, schema, shape))
}

impl Queries {
    pub(crate) fn new(schema: &Ident, shape: &TableShape) -> Self {
        let s = |sql: &str| statement(sql, schema, shape);
        Queries {
            scan: s(include_str!("../../../sql/postgres/scan.sql")),
            probe: s(include_str!("../../../sql/postgres/probe.sql")),
            fill: s(include_str!("../../../sql/postgres/fill.sql")),
            head: s(include_str!("../../../sql/postgres/head.sql")),
            checkpoints: s(include_str!("../../../sql/postgres/checkpoints.sql")),
            lock_stream: s(include_str!("../../../sql/postgres/lock_stream.sql")),
            create_stream: s(include_str!("../../../sql/postgres/create_stream.sql")),
            bump_stream: s(include_str!("../../../sql/postgres/bump_stream.sql")),
            tombstone_stream: s(include_str!("../../../sql/postgres/tombstone_stream.sql")),
            lock_table: s("LOCK TABLE __table__ IN ROW EXCLUSIVE MODE"),
            table: match &shape.tombstone {
                Tombstone::EventuousStream => None,
                Tombstone::Columns(_) | Tombstone::StreamRow { .. } => {
                    Some(TableQueries::new(schema, shape))
                }
            },
        }
    }

    #[cfg(test)]
    fn all(&self) -> [&str; 10] {
        [
            &self.scan,
            &self.probe,
            &self.fill,
            &self.head,
            &self.checkpoints,
            &self.lock_stream,
            &self.create_stream,
            &self.bump_stream,
            &self.tombstone_stream,
            &self.lock_table,
        ]
    }
}

/// One of `sql/postgres/*.sql` with the store's schema, table and position
/// column spliced in, as the engine runs it: quoted or bare as the shape
/// names them ([`TableShape::quoted_names`]).
pub fn render(sql: &str, schema: &Ident, shape: &TableShape) -> String {
    let table = shape.qualified(schema);
    let (table, position) = if shape.quoted_names() {
        (table.pg_quoted(), shape.position.pg_quoted())
    } else {
        (table.pg(), shape.position.pg().to_string())
    };
    sql.replace("__table__", &table)
        .replace("__position__", &position)
        .replace("__schema__", schema.pg())
}

impl TableQueries {
    fn new(schema: &Ident, t: &TableShape) -> Self {
        let table = t.qualified(schema).pg_quoted();
        let literals = format!("JSONB_POPULATE_RECORD(NULL::{table}, $3::text::jsonb)");
        let mut names = vec![t.position.pg_quoted()];
        let mut values = vec!["g.p".to_string()];
        if let Tombstone::StreamRow { .. } = t.tombstone {
            // The stream row's id_internal and the versions after its own.
            for (name, value) in [
                (SQLSTREAMSTORE_STREAM_COLUMN, "$4::int"),
                (
                    SQLSTREAMSTORE_VERSION_COLUMN,
                    "$5::int + (ROW_NUMBER() OVER (ORDER BY g.p))::int",
                ),
            ] {
                names.push(format!("\"{name}\""));
                values.push(value.into());
            }
        }
        for c in t.columns() {
            names.push(c.name.pg_quoted());
            values.push(match &c.value {
                ColumnValue::Literal(_) => format!("lit.{}", c.name.pg_quoted()),
                ColumnValue::Uuid => "GEN_RANDOM_UUID()".into(),
                ColumnValue::Now => "NOW()".into(),
                ColumnValue::NowUtc => "(NOW() AT TIME ZONE 'utc')".into(),
                ColumnValue::NextVersion { .. } => {
                    "$4::bigint + ROW_NUMBER() OVER (ORDER BY g.p)".into()
                }
            });
        }
        let fill = format!(
            "INSERT INTO {table} ({names})\n\
             OVERRIDING SYSTEM VALUE\n\
             SELECT {values}\n\
             FROM UNNEST($1::bigint [], $2::bigint []) AS r (a, b)\n\
             CROSS JOIN LATERAL GENERATE_SERIES(r.a, r.b) AS g (p)\n\
             CROSS JOIN {literals} AS lit",
            names = names.join(", "),
            values = values.join(", "),
        );
        let version = t.version().map(|(column, stream)| {
            let matches: Vec<String> = stream
                .iter()
                .map(|c| format!("t.{c} = lit.{c}", c = c.pg_quoted()))
                .collect();
            format!(
                "SELECT COALESCE(MAX(t.{column}), 0)::bigint AS version\n\
                 FROM {table} AS t\n\
                 CROSS JOIN JSONB_POPULATE_RECORD(NULL::{table}, $1::text::jsonb) AS lit\n\
                 WHERE {}",
                matches.join(" AND "),
                column = column.pg_quoted(),
            )
        });
        let literals =
            format!("SELECT 1 FROM JSONB_POPULATE_RECORD(NULL::{table}, $1::text::jsonb) AS lit");
        let stream = match t.tombstone {
            Tombstone::StreamRow { .. } => {
                let s = |sql: &str| statement(sql, schema, t);
                Some(StreamQueries {
                    lock: s(include_str!(
                        "../../../sql/postgres/sqlstreamstore_lock_stream.sql"
                    )),
                    create: s(include_str!(
                        "../../../sql/postgres/sqlstreamstore_create_stream.sql"
                    )),
                    bump: s(include_str!(
                        "../../../sql/postgres/sqlstreamstore_bump_stream.sql"
                    )),
                    check: s(include_str!(
                        "../../../sql/postgres/sqlstreamstore_tombstone_stream.sql"
                    )),
                })
            }
            _ => None,
        };
        TableQueries {
            fill,
            version,
            literals,
            stream,
        }
    }
}

/// What `gap-healer sql --engine postgres` prints.
pub fn setup_sql(schema: &Ident, shape: &TableShape) -> String {
    let schema = schema.pg();
    match shape.tombstone {
        Tombstone::EventuousStream => GRANTS.replace("__schema__", schema),
        Tombstone::Columns(_) => format!(
            "-- What the healer's role needs to heal {schema}.{table} ({kind} profile),\n\
             -- run by the schema's owner.\n\
             GRANT USAGE ON SCHEMA {schema} TO {role};\n\
             GRANT SELECT, INSERT ON {schema}.{table} TO {role};\n\
             -- The identity's sequence, read by the transaction-end proof (its name is\n\
             -- what pg_get_serial_sequence('{schema}.{table}', '{position}') gives).\n\
             GRANT SELECT ON SEQUENCE {schema}.{sequence} TO {role};\n",
            role = crate::engine::HEALER_ROLE,
            table = shape.table.pg(),
            position = shape.position.pg(),
            kind = shape.kind,
            sequence = default_sequence(shape.table.as_str(), shape.position.as_str()),
        ),
        Tombstone::StreamRow { .. } => format!(
            "-- What the healer's role needs to heal {schema}.{table} ({kind} profile),\n\
             -- run by the schema's owner.\n\
             GRANT USAGE ON SCHEMA {schema} TO {role};\n\
             GRANT SELECT, INSERT ON {schema}.{table} TO {role};\n\
             -- The tombstone stream's own row: made on the first fill (its id_internal\n\
             -- drawn from streams_seq), locked by every fill, its version and position\n\
             -- raised by the rows the fill inserts.\n\
             GRANT SELECT, INSERT (id, id_original), UPDATE (version, position) ON {schema}.streams TO {role};\n\
             GRANT USAGE ON SEQUENCE {schema}.streams_seq TO {role};\n\
             -- The position's sequence, read by the transaction-end proof.\n\
             GRANT SELECT ON SEQUENCE {schema}.messages_seq TO {role};\n",
            role = crate::engine::HEALER_ROLE,
            table = shape.table.pg(),
            kind = shape.kind,
        ),
    }
}

/// The name PostgreSQL gives an identity column's sequence,
/// `<table>_<column>_seq`, quoted when it must be.
fn default_sequence(table: &str, column: &str) -> String {
    let name = format!("{table}_{column}_seq");
    if name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
    {
        name
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_1() -> Ident {
        Ident::parse("store_1").unwrap()
    }

    #[test]
    fn comments_are_left_out_and_lines_kept() {
        let sql = "-- what it does\nSELECT a, -- inline\n\n    b\n  -- more\nFROM t;\n";
        assert_eq!(without_comments(sql), "SELECT a, -- inline\n    b\nFROM t;");
        let q = Queries::new(&store_1(), &TableShape::eventuous());
        assert!(q
            .all()
            .iter()
            .all(|sql| !sql.trim_start().starts_with("--")));
    }

    #[test]
    fn sql_uses_the_schema_and_no_placeholder_survives() {
        let q = Queries::new(&store_1(), &TableShape::eventuous());
        for sql in q.all() {
            assert!(!sql.contains("__schema__"), "{sql}");
            assert!(sql.contains("store_1."), "{sql}");
            assert!(
                !sql.contains("__table__") && !sql.contains("__position__"),
                "{sql}"
            );
        }
        for sql in [
            IDENTITY,
            TABLE_EXISTS,
            POSITION_KEYS,
            PREFLIGHT,
            PREFLIGHT_TABLE,
            LEADER_LOCK,
            LEADER_CHECK,
            ROLL_JOIN,
            ROLL,
        ] {
            assert!(!sql.contains("__schema__"), "{sql}");
        }
        assert!(setup_sql(&store_1(), &TableShape::eventuous())
            .contains("GRANT SELECT, INSERT ON store_1.messages TO __healer_role__;"));
    }
}
