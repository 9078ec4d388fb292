//! Table profiles: which table a store's holes are in, and what a tombstone
//! row holds.
//!
//! - `eventuous` (the default, both engines): Eventuous's `messages` with its
//!   `streams` row for the tombstone stream; the engines' own statements.
//! - `ledger-core` (PostgreSQL): seed 003's `events` table. A tombstone is a
//!   row of stream (`tombstone_stream`, `tombstone_stream_id`) at that
//!   stream's next version, typed `tombstone_type`, data `{}`.
//! - `sqlstreamstore` (both engines): SQLStreamStore's `messages`,
//!   positioned by `position` (on PostgreSQL a `bigint` whose default draws
//!   from `messages_seq`; on SQL Server `Messages.Position`, a
//!   `BIGINT IDENTITY(0,1)`, [`TableShape::sqlstreamstore_mssql`]). A
//!   tombstone is a message of the tombstone stream, which has a row of its
//!   own in the schema's `streams` ([`Tombstone::StreamRow`]): its
//!   `id_internal` and next `stream_version` come from that row, the rest
//!   of the message is described as a custom table's columns are.
//! - `custom` (both engines): any table with an identity position, its
//!   tombstone row described column by column ([`ColumnValue`]).
//!
//! Every profile ends as a [`TableShape`]: `eventuous`, `ledger-core` and
//! `sqlstreamstore` are presets, `custom` is described by its keys. The
//! shape's fields name the table and position for every profile alike; only
//! how a tombstone row is written ([`Tombstone`]) tells Eventuous's own row
//! from a described one, and one set of statements serves every described
//! table (a stream row's message adds its stream's two columns).

use std::fmt;

use super::ident::{Ident, QualifiedName};

/// The nil UUID: ledger-core's default tombstone stream id.
pub const NIL_UUID: &str = "00000000-0000-0000-0000-000000000000";
/// ledger-core's default tombstone stream (its `stream_category`).
pub const LEDGER_CORE_TOMBSTONE_STREAM: &str = "$gap";
/// sqlstreamstore's default tombstone stream (its `streams.id_original`):
/// `$`-prefixed like SQLStreamStore's own `$deleted`, so readers that pass
/// over system streams pass over it.
pub const SQLSTREAMSTORE_TOMBSTONE_STREAM: &str = "$gap-healer-tombstones";
/// sqlstreamstore's default tombstone message type.
pub const SQLSTREAMSTORE_TOMBSTONE_TYPE: &str = "$gap-healer-tombstone";
/// The columns of SQLStreamStore's `messages` that a tombstone's stream row
/// gives: the stream's `id_internal` and the message's version in it
/// (PostgreSQL's names; SQL Server's are `StreamIdInternal` and
/// `StreamVersion`).
pub const SQLSTREAMSTORE_STREAM_COLUMN: &str = "stream_id_internal";
pub const SQLSTREAMSTORE_VERSION_COLUMN: &str = "stream_version";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ProfileKind {
    #[default]
    Eventuous,
    LedgerCore,
    SqlStreamStore,
    Custom,
}

impl ProfileKind {
    pub const NAMES: [&'static str; 4] = ["eventuous", "ledger-core", "sqlstreamstore", "custom"];

    pub fn parse(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "eventuous" => Ok(ProfileKind::Eventuous),
            "ledger-core" | "ledger_core" => Ok(ProfileKind::LedgerCore),
            "sqlstreamstore" => Ok(ProfileKind::SqlStreamStore),
            "custom" => Ok(ProfileKind::Custom),
            _ => Err(format!("expected one of {}", Self::NAMES.join(", "))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ProfileKind::Eventuous => "eventuous",
            ProfileKind::LedgerCore => "ledger-core",
            ProfileKind::SqlStreamStore => "sqlstreamstore",
            ProfileKind::Custom => "custom",
        }
    }

    /// The table a profile heals when `table` is not set (`None`: custom
    /// has none and needs it).
    pub fn default_table(self) -> Option<&'static str> {
        match self {
            ProfileKind::Eventuous => Some("messages"),
            ProfileKind::LedgerCore => Some("events"),
            ProfileKind::SqlStreamStore => Some("messages"),
            ProfileKind::Custom => None,
        }
    }

    /// The position column when `position_column` is not set.
    pub fn default_position(self) -> Option<&'static str> {
        match self {
            ProfileKind::Eventuous => Some("global_position"),
            ProfileKind::LedgerCore | ProfileKind::SqlStreamStore => Some("position"),
            ProfileKind::Custom => None,
        }
    }
}

impl fmt::Display for ProfileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one column of a tombstone row gets.
#[derive(Clone, Debug, PartialEq)]
pub enum ColumnValue {
    /// This value, converted to the column's type by the database
    /// (`jsonb_populate_record`): a TOML string, number, boolean, or (for a
    /// json/jsonb column) a table or array.
    Literal(serde_json::Value),
    /// A fresh random UUID per row.
    Uuid,
    /// The transaction's time.
    Now,
    /// The transaction's time in UTC, without a time zone (for a
    /// `timestamp` column that holds UTC, whatever the session's TimeZone).
    NowUtc,
    /// The tombstone stream's next version: one more than the highest
    /// version of the rows whose `stream` columns hold the tombstone's
    /// literals (1 for the first), allocated under a lock that serialises
    /// every healer of the table.
    NextVersion { stream: Vec<Ident> },
}

/// One column of the tombstone row.
#[derive(Clone, Debug, PartialEq)]
pub struct TombstoneColumn {
    /// Lower case.
    pub name: Ident,
    pub value: ColumnValue,
}

/// Eventuous's table and position column, as the PostgreSQL catalog names them.
const EVENTUOUS_TABLE: &str = "messages";
const EVENTUOUS_POSITION: &str = "global_position";

/// A name this module fixes, checked like any other.
fn preset(name: &str) -> Ident {
    Ident::parse(name).expect("a preset name is a plain identifier")
}

/// What a store's healed table is: its name, its position column, and how a
/// tombstone row is written. Every profile is one: `eventuous` and
/// `ledger-core` are presets ([`TableShape::eventuous`],
/// [`TableShape::ledger_core`]), `custom` is described by its keys.
#[derive(Clone, Debug, PartialEq)]
pub struct TableShape {
    pub kind: ProfileKind,
    /// Lower case.
    pub table: Ident,
    pub position: Ident,
    pub tombstone: Tombstone,
}

/// How a tombstone row is written.
#[derive(Clone, Debug, PartialEq)]
pub enum Tombstone {
    /// Eventuous's own row: a message of the tombstone stream, whose
    /// `streams` row the engine's own statements (`sql/postgres/fill.sql`
    /// and its neighbours, `sql/mssql/*`) create and bump: a stream version
    /// the column description cannot express.
    EventuousStream,
    /// A row described column by column (ledger-core, custom): every column
    /// the tombstone row sets besides the position, in order.
    Columns(Vec<TombstoneColumn>),
    /// A message of a stream with a row of its own in the schema's
    /// `streams` (SQLStreamStore's): the row made once, locked first in
    /// each fill, its `id_internal` the messages' `stream_id_internal`,
    /// its `version` plus the message's number in position order their
    /// `stream_version` (0 for the first), and its `version` and `position`
    /// raised in the same transaction. `columns` are the message's other
    /// columns, described as a custom table's.
    StreamRow {
        stream: StreamRow,
        columns: Vec<TombstoneColumn>,
    },
}

/// The tombstone stream's row in SQLStreamStore's `streams`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamRow {
    /// `streams.id`, what SQLStreamStore finds a stream by: the SHA-1 of
    /// its name in upper-case hex ([`sqlstreamstore_stream_id`]).
    pub id: String,
    /// `streams.id_original`: the stream's name.
    pub name: String,
    /// The message's columns the row gives, its stream's internal id and
    /// its version in the stream, as the engine's SQLStreamStore names them.
    pub message_columns: [&'static str; 2],
}

/// The `streams.id` SQLStreamStore's PostgreSQL store gives the stream
/// `name`: the SHA-1 of its UTF-8 bytes in upper-case hex (40 characters
/// of its `char(42)`). A name .NET reads as a GUID would be kept as it is
/// instead; configuration refuses such a name ([`looks_like_dotnet_guid`]).
pub fn sqlstreamstore_stream_id(name: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, name.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02X}")).collect()
}

/// Whether .NET's `Guid.TryParse` could read `s` as a GUID (its N, D, B and
/// P forms; anything starting like its X form, `{0x`, counts too):
/// SQLStreamStore keeps such a stream name as its `streams.id` unhashed.
pub fn looks_like_dotnet_guid(s: &str) -> bool {
    let s = s.trim();
    let hex = |t: &str| t.chars().all(|c| c.is_ascii_hexdigit());
    let dashed = |t: &str| {
        let parts: Vec<&str> = t.split('-').collect();
        parts.len() == 5
            && parts
                .iter()
                .zip([8, 4, 4, 4, 12])
                .all(|(p, n)| p.len() == n && hex(p))
    };
    let within = |open: char, close: char| {
        s.strip_prefix(open)
            .and_then(|t| t.strip_suffix(close))
            .is_some_and(dashed)
    };
    (s.len() == 32 && hex(s))
        || dashed(s)
        || within('{', '}')
        || within('(', ')')
        || s.to_ascii_lowercase().starts_with("{0x")
}

impl Default for TableShape {
    /// Eventuous's, the default profile.
    fn default() -> Self {
        TableShape::eventuous()
    }
}

impl TableShape {
    /// Eventuous's `messages`, positioned by `global_position`, its
    /// tombstones messages of the tombstone stream.
    pub fn eventuous() -> Self {
        TableShape {
            kind: ProfileKind::Eventuous,
            table: preset(EVENTUOUS_TABLE),
            position: preset(EVENTUOUS_POSITION),
            tombstone: Tombstone::EventuousStream,
        }
    }

    /// seed 003's `events` table with its tombstone row.
    pub fn ledger_core(
        table: Ident,
        position: Ident,
        stream: &str,
        stream_id: &str,
        event_type: &str,
    ) -> Self {
        let literal = |name: &str, v: serde_json::Value| TombstoneColumn {
            name: preset(name),
            value: ColumnValue::Literal(v),
        };
        TableShape {
            kind: ProfileKind::LedgerCore,
            table,
            position,
            tombstone: Tombstone::Columns(vec![
                literal("stream_category", stream.into()),
                literal("stream_id", stream_id.into()),
                TombstoneColumn {
                    name: preset("version"),
                    value: ColumnValue::NextVersion {
                        stream: vec![preset("stream_category"), preset("stream_id")],
                    },
                },
                literal("event_type", event_type.into()),
                literal("data", serde_json::json!({})),
                TombstoneColumn {
                    name: preset("recorded_at"),
                    value: ColumnValue::Now,
                },
            ]),
        }
    }

    /// SQLStreamStore's `messages`, positioned by `position`; a tombstone is
    /// a message of `stream` (its own `streams` row), typed `message_type`,
    /// with a new message id, `{}` as its data and no metadata, created now
    /// in UTC (`created_utc` is a `timestamp` without time zone).
    pub fn sqlstreamstore(stream: &str, message_type: &str) -> Self {
        Self::sqlstreamstore_named(
            ["messages", "position"],
            [SQLSTREAMSTORE_STREAM_COLUMN, SQLSTREAMSTORE_VERSION_COLUMN],
            ["message_id", "created_utc", "type", "json_data"],
            stream,
            message_type,
        )
    }

    /// SQLStreamStore's SQL Server tables (its `ScriptsV3/CreateSchema.sql`):
    /// `Messages.Position` a `BIGINT IDENTITY(0,1)` under the clustered
    /// primary key, a message's `Id` a `UNIQUEIDENTIFIER`, `Created` a
    /// `DATETIME` in UTC, `[Type]` and `JsonData` its type and data; the
    /// stream row in `Streams` (`Id`, `IdOriginal`, `IdInternal`,
    /// `[Version]`, `Position`) as on PostgreSQL.
    pub fn sqlstreamstore_mssql(stream: &str, message_type: &str) -> Self {
        Self::sqlstreamstore_named(
            ["Messages", "Position"],
            ["StreamIdInternal", "StreamVersion"],
            ["Id", "Created", "Type", "JsonData"],
            stream,
            message_type,
        )
    }

    /// SQLStreamStore's tables by an engine's names: `[table, position]`,
    /// the two columns the stream row gives, and `[id, created, type,
    /// data]`.
    fn sqlstreamstore_named(
        [table, position]: [&str; 2],
        message_columns: [&'static str; 2],
        [id, created, kind, data]: [&str; 4],
        stream: &str,
        message_type: &str,
    ) -> Self {
        let column = |name: &str, value: ColumnValue| TombstoneColumn {
            name: preset(name),
            value,
        };
        TableShape {
            kind: ProfileKind::SqlStreamStore,
            table: preset(table),
            position: preset(position),
            tombstone: Tombstone::StreamRow {
                stream: StreamRow {
                    id: sqlstreamstore_stream_id(stream),
                    name: stream.to_string(),
                    message_columns,
                },
                columns: vec![
                    column(id, ColumnValue::Uuid),
                    column(created, ColumnValue::NowUtc),
                    column(kind, ColumnValue::Literal(message_type.into())),
                    column(data, ColumnValue::Literal(serde_json::json!({}))),
                ],
            },
        }
    }

    /// The tombstone row's described columns; none for Eventuous's own row,
    /// which the engine's statements write. A stream row's message has two
    /// more, [`TableShape::stream_columns`].
    pub fn columns(&self) -> &[TombstoneColumn] {
        match &self.tombstone {
            Tombstone::EventuousStream => &[],
            Tombstone::Columns(columns) | Tombstone::StreamRow { columns, .. } => columns,
        }
    }

    /// The columns a stream row's message takes from that row: its stream
    /// and its version; none for the other tombstones.
    pub fn stream_columns(&self) -> &[&'static str] {
        match &self.tombstone {
            Tombstone::StreamRow { stream, .. } => &stream.message_columns,
            _ => &[],
        }
    }

    /// The tombstone stream's row, for a stream row's message.
    pub fn stream_row(&self) -> Option<&StreamRow> {
        match &self.tombstone {
            Tombstone::StreamRow { stream, .. } => Some(stream),
            _ => None,
        }
    }

    /// Whether the statements name the table and position column quoted.
    /// A described table's are (lower case already: the same name unquoted
    /// would fold to), so that a column named like a keyword works;
    /// Eventuous's statements have always named its table bare, schema and
    /// all, and a mixed-case schema folds the same way in each of them.
    pub fn quoted_names(&self) -> bool {
        match self.tombstone {
            Tombstone::EventuousStream => false,
            Tombstone::Columns(_) | Tombstone::StreamRow { .. } => true,
        }
    }

    /// What the healers sharing one leader lock by default heal: the
    /// schema for Eventuous (its tombstone stream's row is in the schema's
    /// `streams`, whichever table is healed), `schema.table` for a
    /// described table (SQLStreamStore's included: one `messages` a schema).
    pub fn leader_scope(&self, schema: &Ident) -> String {
        match self.tombstone {
            Tombstone::EventuousStream => schema.as_str().to_string(),
            Tombstone::Columns(_) | Tombstone::StreamRow { .. } => self.qualified(schema).name(),
        }
    }

    /// Whether the store's readers keep their positions in the schema's
    /// `checkpoints` table: Eventuous's do; a described table's readers
    /// (SQLStreamStore's too) keep them elsewhere.
    pub fn has_checkpoints(&self) -> bool {
        match self.tombstone {
            Tombstone::EventuousStream => true,
            Tombstone::Columns(_) | Tombstone::StreamRow { .. } => false,
        }
    }

    /// The literal columns as one JSON object (what the statements bind).
    pub fn literals(&self) -> serde_json::Value {
        let map = self
            .columns()
            .iter()
            .filter_map(|c| match &c.value {
                ColumnValue::Literal(v) => Some((c.name.as_str().to_string(), v.clone())),
                _ => None,
            })
            .collect();
        serde_json::Value::Object(map)
    }

    /// The next-version column and the columns naming its stream.
    pub fn version(&self) -> Option<(&Ident, &[Ident])> {
        self.columns().iter().find_map(|c| match &c.value {
            ColumnValue::NextVersion { stream } => Some((&c.name, stream.as_slice())),
            _ => None,
        })
    }

    /// The table in `schema`.
    pub fn qualified(&self, schema: &Ident) -> QualifiedName {
        QualifiedName::new(schema.clone(), self.table.clone())
    }
}

/// Parses `columns`, a TOML table: each key a column, each value `"uuid"`,
/// `"now"`, `"now_utc"`, `{ literal = V }` or `{ next_version = ["col", ...] }`.
/// `identifier` validates a column name. Every mistake is reported at once.
pub fn parse_columns(
    text: &str,
    identifier: impl Fn(&str) -> Result<Ident, String>,
) -> Result<Vec<TombstoneColumn>, String> {
    let doc: toml::Table = toml::from_str(&format!("columns = {text}"))
        .map_err(|e| format!("expected a table of column = value: {}", e.message()))?;
    let Some(toml::Value::Table(table)) = doc.get("columns") else {
        return Err("expected a table of column = value".into());
    };
    let mut columns = Vec::new();
    let mut errors = Vec::new();
    for (name, value) in table {
        let name = match identifier(name) {
            Ok(n) => n.to_lowercase(),
            Err(e) => {
                errors.push(format!("column {name:?}: {e}"));
                continue;
            }
        };
        match column_value(value, &identifier) {
            Ok(value) => columns.push(TombstoneColumn { name, value }),
            Err(e) => errors.push(format!("column {}: {e}", name.as_str())),
        }
    }
    let versions: Vec<&TombstoneColumn> = columns
        .iter()
        .filter(|c| matches!(c.value, ColumnValue::NextVersion { .. }))
        .collect();
    if versions.len() > 1 {
        errors.push("at most one column may be next_version".into());
    }
    if let Some(TombstoneColumn {
        name,
        value: ColumnValue::NextVersion { stream },
    }) = versions.first()
    {
        for s in stream {
            let literal = columns
                .iter()
                .any(|c| &c.name == s && matches!(c.value, ColumnValue::Literal(_)));
            if !literal {
                errors.push(format!(
                    "column {}: next_version names {}, which must be a column given a literal (the tombstone stream's key)",
                    name.as_str(),
                    s.as_str()
                ));
            }
        }
    }
    if columns.is_empty() && errors.is_empty() {
        errors.push("name at least the columns a row needs".into());
    }
    if errors.is_empty() {
        Ok(columns)
    } else {
        Err(errors.join("; "))
    }
}

const VALUE_FORMS: &str = r#"expected "uuid", "now", "now_utc", { literal = VALUE } or { next_version = ["column", ...] }"#;

fn column_value(
    value: &toml::Value,
    identifier: &impl Fn(&str) -> Result<Ident, String>,
) -> Result<ColumnValue, String> {
    match value {
        toml::Value::String(s) if s == "uuid" => Ok(ColumnValue::Uuid),
        toml::Value::String(s) if s == "now" => Ok(ColumnValue::Now),
        toml::Value::String(s) if s == "now_utc" => Ok(ColumnValue::NowUtc),
        toml::Value::Table(t) if t.len() == 1 => {
            if let Some(v) = t.get("literal") {
                let json = serde_json::to_value(v).map_err(|e| format!("literal: {e}"))?;
                return Ok(ColumnValue::Literal(json));
            }
            if let Some(v) = t.get("next_version") {
                let toml::Value::Array(cols) = v else {
                    return Err("next_version: expected a list of the stream's key columns".into());
                };
                let stream = cols
                    .iter()
                    .map(|c| match c {
                        toml::Value::String(s) => identifier(s).map(|s| s.to_lowercase()),
                        other => Err(format!("{other} is not a column name")),
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("next_version: {e}"))?;
                if stream.is_empty() {
                    return Err("next_version: name the stream's key columns".into());
                }
                return Ok(ColumnValue::NextVersion { stream });
            }
            Err(VALUE_FORMS.into())
        }
        _ => Err(VALUE_FORMS.into()),
    }
}

/// `columns` as TOML text that [`parse_columns`] reads back.
pub fn render_columns(columns: &[TombstoneColumn]) -> String {
    let mut table = toml::Table::new();
    for c in columns {
        let value = match &c.value {
            ColumnValue::Uuid => toml::Value::String("uuid".into()),
            ColumnValue::Now => toml::Value::String("now".into()),
            ColumnValue::NowUtc => toml::Value::String("now_utc".into()),
            ColumnValue::Literal(v) => {
                let mut t = toml::Table::new();
                t.insert("literal".into(), json_to_toml(v));
                toml::Value::Table(t)
            }
            ColumnValue::NextVersion { stream } => {
                let mut t = toml::Table::new();
                let cols = stream
                    .iter()
                    .map(|s| toml::Value::String(s.as_str().into()));
                t.insert("next_version".into(), toml::Value::Array(cols.collect()));
                toml::Value::Table(t)
            }
        };
        table.insert(c.name.as_str().into(), value);
    }
    toml::Value::Table(table).to_string()
}

fn json_to_toml(v: &serde_json::Value) -> toml::Value {
    use serde_json::Value as J;
    match v {
        J::Null => toml::Value::String(String::new()),
        J::Bool(b) => toml::Value::Boolean(*b),
        J::Number(n) => n
            .as_i64()
            .map(toml::Value::Integer)
            .unwrap_or_else(|| toml::Value::Float(n.as_f64().unwrap_or_default())),
        J::String(s) => toml::Value::String(s.clone()),
        J::Array(a) => toml::Value::Array(a.iter().map(json_to_toml).collect()),
        J::Object(o) => toml::Value::Table(
            o.iter()
                .map(|(k, v)| (k.clone(), json_to_toml(v)))
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(s: &str) -> Result<Ident, String> {
        Ident::parse(s).map_err(|_| "not an identifier".into())
    }

    fn names(idents: &[Ident]) -> Vec<&str> {
        idents.iter().map(Ident::as_str).collect()
    }

    #[test]
    fn every_value_form_parses_and_renders_back() {
        let text = r#"{ id = "uuid", at = "now", utc = "now_utc", kind = { literal = "$gap" }, n = { literal = 7 }, data = { literal = {} }, v = { next_version = ["kind"] } }"#;
        let cols = parse_columns(text, ident).unwrap();
        let v = |n: &str| {
            cols.iter()
                .find(|c| c.name.as_str() == n)
                .unwrap()
                .value
                .clone()
        };
        assert_eq!(v("id"), ColumnValue::Uuid);
        assert_eq!(v("at"), ColumnValue::Now);
        assert_eq!(v("utc"), ColumnValue::NowUtc);
        assert_eq!(v("kind"), ColumnValue::Literal("$gap".into()));
        assert_eq!(v("n"), ColumnValue::Literal(7.into()));
        assert_eq!(v("data"), ColumnValue::Literal(serde_json::json!({})));
        assert_eq!(
            v("v"),
            ColumnValue::NextVersion {
                stream: vec![ident("kind").unwrap()]
            }
        );
        assert_eq!(parse_columns(&render_columns(&cols), ident).unwrap(), cols);
    }

    #[test]
    fn mistakes_are_named_all_at_once() {
        let err = parse_columns(
            r#"{ "bad name" = "uuid", a = "today", v = { next_version = ["a"] }, w = { next_version = ["b"] } }"#,
            ident,
        )
        .unwrap_err();
        assert!(
            err.contains("column \"bad name\": not an identifier"),
            "{err}"
        );
        assert!(err.contains("column a: expected \"uuid\""), "{err}");
        assert!(
            err.contains("at most one column may be next_version"),
            "{err}"
        );
        assert!(
            err.contains("names a, which must be a column given a literal"),
            "{err}"
        );
        assert!(parse_columns("{}", ident).unwrap_err().contains("at least"));
        assert!(parse_columns("7", ident).is_err());
    }

    #[test]
    fn ledger_core_is_a_preset_of_custom() {
        let shape = TableShape::ledger_core(
            preset("events"),
            preset("position"),
            "$gap",
            NIL_UUID,
            "$tombstone",
        );
        assert_eq!(
            shape.literals(),
            serde_json::json!({"stream_category": "$gap", "stream_id": NIL_UUID, "event_type": "$tombstone", "data": {}})
        );
        assert_eq!(
            shape.version().map(|(c, s)| (c.as_str(), names(s))),
            Some(("version", vec!["stream_category", "stream_id"]))
        );
        let text = render_columns(shape.columns());
        let by_name = |mut c: Vec<TombstoneColumn>| {
            c.sort_by(|a, b| a.name.cmp(&b.name));
            c
        };
        assert_eq!(
            by_name(parse_columns(&text, ident).unwrap()),
            by_name(shape.columns().to_vec())
        );
    }

    #[test]
    fn sqlstreamstore_names_its_stream_as_sqlstreamstore_does() {
        // SHA-1 of the UTF-8 bytes, upper-case hex: what its PostgreSQL
        // store puts in streams.id for a name that is not a GUID (the
        // vectors from `printf %s NAME | sha1sum`).
        assert_eq!(
            sqlstreamstore_stream_id("abc"),
            "A9993E364706816ABA3E25717850C26C9CD0D89D"
        );
        assert_eq!(
            sqlstreamstore_stream_id(SQLSTREAMSTORE_TOMBSTONE_STREAM),
            "2056A7F6E7A4800404073D412399CEB358530D73"
        );
        let shape = TableShape::sqlstreamstore(
            SQLSTREAMSTORE_TOMBSTONE_STREAM,
            SQLSTREAMSTORE_TOMBSTONE_TYPE,
        );
        let row = shape.stream_row().unwrap();
        assert_eq!(row.name, SQLSTREAMSTORE_TOMBSTONE_STREAM);
        assert_eq!(row.id.len(), 40);
        assert_eq!(
            shape.literals(),
            serde_json::json!({"type": SQLSTREAMSTORE_TOMBSTONE_TYPE, "json_data": {}})
        );
        assert_eq!(
            shape.stream_columns(),
            ["stream_id_internal", "stream_version"]
        );
        assert!(shape.version().is_none() && !shape.has_checkpoints());
        assert_eq!(shape.leader_scope(&preset("store")), "store.messages");
    }

    #[test]
    fn names_dotnet_reads_as_guids_are_told_apart() {
        for guid in [
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            "0F8FAD5BD9CB469FA16570867728950E",
            "{0f8fad5b-d9cb-469f-a165-70867728950e}",
            "(0f8fad5b-d9cb-469f-a165-70867728950e)",
            " 0f8fad5b-d9cb-469f-a165-70867728950e ",
            "{0x0f8fad5b,0xd9cb,0x469f,{0xa1,0x65,0x70,0x86,0x77,0x28,0x95,0x0e}}",
        ] {
            assert!(looks_like_dotnet_guid(guid), "{guid}");
        }
        for name in [
            "$gap-healer-tombstones",
            "0f8fad5b-d9cb-469f-a165",
            "{abc}",
            "",
        ] {
            assert!(!looks_like_dotnet_guid(name), "{name}");
        }
    }
}
