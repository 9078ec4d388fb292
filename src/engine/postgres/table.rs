//! The table profiles (`ledger-core`, `sqlstreamstore`, `custom`): their
//! fill transactions and what `check` says about their table.
//!
//! Order inside the fill's transaction: when a column is `next_version`,
//! take the table's tombstone lock (a transaction advisory lock: every
//! healer of the table serialises on it, under a short lock timeout, else
//! `Busy`); check the leader fence; read the tombstone stream's highest
//! version; insert every position with `OVERRIDING SYSTEM VALUE` under the
//! caller's lock timeout, the literals converted to their columns' types by
//! `jsonb_populate_record`, versions following on in position order; commit.
//! As for Eventuous, the insert must check the position's unique key, so it
//! waits on an open append's key and the database decides (55P03 held,
//! 23505 committed, success rolled back). The stream's unique key (seed
//! 003's `(stream_category, stream_id, version)`) is the backstop if
//! something else writes the tombstone stream.
//!
//! SQLStreamStore's fill (`sqlstreamstore`) keeps its stream in a row of its
//! own, as Eventuous's does: lock the tombstone stream's row in `streams`
//! (`FOR UPDATE`, making it on the first fill) under a short lock timeout,
//! else `Busy`; check the fence; insert every position as a message of that
//! stream (`stream_id_internal` the row's `id_internal`, `stream_version`
//! following the row's `version` in position order) under the caller's
//! lock timeout; raise the row's `version` by the rows inserted and its
//! `position` to the highest filled; commit. SQLStreamStore's readers of the
//! stream see its row and its messages agree at every commit. The unique
//! key `(stream_id_internal, stream_version)` is the backstop.

use std::time::Duration;

use tokio_postgres::Row;

use super::errors::{describe, get, Stage};
use super::fill::{at, bounds, set_lock_timeout, Failed, STREAM_LOCK_TIMEOUT};
use super::leader::advisory_key;
use super::preflight::{quote_role, session, Session};
use super::sql::{PREFLIGHT_TABLE, SQLSTREAMSTORE_STREAMS};
use super::tls::TlsMode;
use super::PostgresEngine;
use crate::engine::ident::Ident;
use crate::engine::profile::{ColumnValue, StreamRow, TableShape};
use crate::engine::{Check, DbError, DbResult, Fence, FillOutcome, Finding};
use crate::gaps::PosRange;

/// The advisory lock that serialises the healers of one table's tombstone
/// stream.
pub(super) fn tombstone_lock(schema: &str, table: &str) -> i64 {
    advisory_key(&format!("gap-healer:tombstones:{schema}.{table}"))
}

impl PostgresEngine {
    pub(super) async fn fill_table(
        &self,
        client: &mut tokio_postgres::Client,
        shape: &TableShape,
        ranges: &[PosRange],
        lock_timeout: Duration,
        fence: &Fence,
    ) -> Result<FillOutcome, Failed> {
        let Some(q) = &self.sql.table else {
            return Err(DbError::permanent("table profile without its statements").into());
        };
        let literals = shape.literals().to_string();
        let tx = client.transaction().await.map_err(at(Stage::Begin))?;
        set_lock_timeout(&tx, STREAM_LOCK_TIMEOUT, Stage::Begin).await?;
        if q.version.is_some() {
            let key = tombstone_lock(self.schema.as_str(), shape.table.as_str());
            tx.execute("SELECT PG_ADVISORY_XACT_LOCK($1::bigint)", &[&key])
                .await
                .map_err(at(Stage::Stream))?;
        }
        if !self.fence_holds(&tx, fence).await? {
            return Ok(FillOutcome::Busy);
        }
        let version: Option<i64> = match &q.version {
            Some(sql) => {
                let row = tx
                    .query_one(sql, &[&literals])
                    .await
                    .map_err(at(Stage::Stream))?;
                Some(get(&row, "version")?)
            }
            None => None,
        };
        let (starts, ends) = bounds(ranges);
        set_lock_timeout(&tx, lock_timeout, Stage::Insert).await?;
        self.lock_table(&tx).await?;
        let inserted = match &version {
            Some(v) => tx.execute(&q.fill, &[&starts, &ends, &literals, v]).await,
            None => tx.execute(&q.fill, &[&starts, &ends, &literals]).await,
        }
        .map_err(at(Stage::Insert))?;
        tx.commit().await.map_err(at(Stage::Commit))?;
        Ok(FillOutcome::Filled { rows: inserted })
    }

    /// sqlstreamstore's fill transaction (the module's doc says its order).
    pub(super) async fn fill_stream_row(
        &self,
        client: &mut tokio_postgres::Client,
        stream: &StreamRow,
        ranges: &[PosRange],
        lock_timeout: Duration,
        fence: &Fence,
    ) -> Result<FillOutcome, Failed> {
        let Some((q, s)) = self
            .sql
            .table
            .as_ref()
            .and_then(|q| q.stream.as_ref().map(|s| (q, s)))
        else {
            return Err(DbError::permanent("stream row profile without its statements").into());
        };
        let literals = self.profile.literals().to_string();
        let tx = client.transaction().await.map_err(at(Stage::Begin))?;
        set_lock_timeout(&tx, STREAM_LOCK_TIMEOUT, Stage::Begin).await?;
        let locked = self
            .lock_stream_row(
                &tx,
                (&s.lock, &[&stream.id]),
                (&s.create, &[&stream.id, &stream.name]),
                fence,
            )
            .await?;
        let Some(row) = locked else {
            return Ok(FillOutcome::Busy);
        };
        let id: i32 = get(&row, "id_internal")?;
        let version: i32 = get(&row, "version")?;
        let (starts, ends) = bounds(ranges);
        let highest = ends.iter().copied().max().unwrap_or(-1);
        set_lock_timeout(&tx, lock_timeout, Stage::Insert).await?;
        self.lock_table(&tx).await?;
        let inserted = tx
            .execute(&q.fill, &[&starts, &ends, &literals, &id, &version])
            .await
            .map_err(at(Stage::Insert))?;
        let moved = i32::try_from(inserted).map_err(|_| {
            DbError::permanent(format!(
                "fill inserted {inserted} rows: more than the tombstone stream's version can count"
            ))
        })?;
        // The insert wrote every position or failed: the highest is the
        // last range's end.
        tx.execute(&s.bump, &[&id, &moved, &highest])
            .await
            .map_err(at(Stage::Stream))?;
        tx.commit().await.map_err(at(Stage::Commit))?;
        Ok(FillOutcome::Filled { rows: inserted })
    }

    /// What `check` reads about SQLStreamStore's `streams` and the
    /// tombstone stream's row in it.
    async fn stream_facts(
        &self,
        conn: &tokio_postgres::Client,
        stream: &StreamRow,
    ) -> DbResult<StreamFacts> {
        let row = conn
            .query_one(SQLSTREAMSTORE_STREAMS, &[&self.schema.as_str()])
            .await
            .map_err(|e| self.error(&e, "preflight"))?;
        let mut facts = StreamFacts::from_row(&row)?;
        let readable = facts.select == Some(true) && facts.has_columns();
        if let (true, Some(s)) = (
            readable,
            self.sql.table.as_ref().and_then(|q| q.stream.as_ref()),
        ) {
            facts.state = Some(match conn.query_opt(&s.check, &[&stream.id]).await {
                Ok(None) => Ok(None),
                Ok(Some(r)) => Ok(Some(StreamState {
                    version: get(&r, "version")?,
                    position: get(&r, "position")?,
                    rows: get(&r, "rows")?,
                    min_version: get(&r, "min_version")?,
                    max_version: get(&r, "max_version")?,
                    max_position: get(&r, "max_position")?,
                })),
                Err(e) => Err(self.target.cs.scrub(&describe(&e))),
            });
        }
        Ok(facts)
    }

    /// `check` for a table profile.
    pub(super) async fn table_findings(&self, shape: &TableShape) -> DbResult<Vec<Finding>> {
        let conn = self.pool.checkout().await?;
        let row = conn
            .query_one(
                PREFLIGHT_TABLE,
                &[
                    &self.schema.as_str(),
                    &shape.table.as_str(),
                    &shape.position.as_str(),
                ],
            )
            .await
            .map_err(|e| self.error(&e, "preflight"))?;
        let mut facts = TableFacts::from_row(&row)?;
        if facts.table_exists && facts.schema_usage == Some(true) {
            // The literals, converted by the database as the fill will.
            let literals = shape.literals().to_string();
            let Some(q) = &self.sql.table else {
                return Err(DbError::permanent("table profile without its statements"));
            };
            facts.literals = Some(
                conn.query_one(&q.literals, &[&literals])
                    .await
                    .map(|_| ())
                    .map_err(|e| self.target.cs.scrub(&describe(&e))),
            );
            if let (Some(sql), Some(true)) = (
                &self.sql.table.as_ref().and_then(|q| q.version.as_ref()),
                facts.select,
            ) {
                facts.stream_version = Some(
                    conn.query_one(sql.as_str(), &[&literals])
                        .await
                        .map_err(|e| self.target.cs.scrub(&describe(&e)))
                        .and_then(|r| get::<i64>(&r, "version").map_err(|e| e.message)),
                );
            }
        }
        if let (Some(stream), Some(true)) = (shape.stream_row(), facts.schema_usage) {
            facts.stream = Some(self.stream_facts(&conn, stream).await?);
        }
        Ok(table_findings(
            &facts,
            shape,
            &self.schema,
            &self.target.mode,
        ))
    }
}

/// One column of the healed table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TableColumn {
    pub name: String,
    pub data_type: String,
    pub not_null: bool,
    pub has_default: bool,
    pub identity: bool,
    pub generated: bool,
}

/// What `check` reads about a table profile's table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TableFacts {
    pub session: Session,
    pub schema_usage: Option<bool>,
    pub table_exists: bool,
    pub columns: Vec<TableColumn>,
    /// The sequence behind the position (identity or serial), if any.
    pub position_sequence: Option<String>,
    /// Unique indexes without a predicate: name and key columns.
    pub unique: Vec<(String, Vec<String>)>,
    pub select: Option<bool>,
    pub insert: Option<bool>,
    /// Whether the database takes the literals for their columns.
    pub literals: Option<Result<(), String>>,
    /// The tombstone stream's highest version now.
    pub stream_version: Option<Result<i64, String>>,
    /// A stream row's table of streams (sqlstreamstore); `None` for the
    /// other profiles, or when the schema cannot be read.
    pub stream: Option<StreamFacts>,
}

/// The columns of SQLStreamStore's `streams` the fill uses.
const STREAM_ROW_COLUMNS: [&str; 5] = ["id", "id_original", "id_internal", "version", "position"];

/// What `check` reads about SQLStreamStore's `streams`
/// (`sql/postgres/sqlstreamstore_streams.sql`) and the tombstone stream's
/// row in it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamFacts {
    pub exists: bool,
    pub columns: Vec<String>,
    /// NOT NULL columns without a default.
    pub required: Vec<String>,
    /// A unique key on exactly `id` (the row is made `ON CONFLICT (id)`).
    pub id_unique: bool,
    /// The sequence `id_internal`'s default draws from.
    pub id_sequence: Option<String>,
    pub sequence_usage: Option<bool>,
    pub select: Option<bool>,
    /// INSERT on `id` and `id_original`.
    pub insert: Option<bool>,
    /// UPDATE on `version` and `position`.
    pub update: Option<bool>,
    /// The tombstone stream's row now: `Ok(None)` not made yet; `None`
    /// unread.
    pub state: Option<Result<Option<StreamState>, String>>,
}

/// The tombstone stream's row beside its messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StreamState {
    pub version: i64,
    pub position: i64,
    pub rows: i64,
    pub min_version: i64,
    pub max_version: i64,
    pub max_position: i64,
}

impl StreamFacts {
    fn from_row(row: &Row) -> DbResult<Self> {
        Ok(StreamFacts {
            exists: get(row, "streams_exists")?,
            columns: get(row, "column_names")?,
            required: get(row, "required")?,
            id_unique: get(row, "id_unique")?,
            id_sequence: get(row, "id_sequence")?,
            sequence_usage: get(row, "sequence_usage")?,
            select: get(row, "streams_select")?,
            insert: get(row, "streams_insert")?,
            update: get(row, "streams_update")?,
            state: None,
        })
    }

    fn has_columns(&self) -> bool {
        STREAM_ROW_COLUMNS
            .iter()
            .all(|c| self.columns.iter().any(|have| have == c))
    }
}

impl TableFacts {
    fn from_row(row: &Row) -> DbResult<Self> {
        let names: Vec<String> = get(row, "column_names")?;
        let types: Vec<String> = get(row, "column_types")?;
        let not_null: Vec<bool> = get(row, "column_not_null")?;
        let default: Vec<bool> = get(row, "column_default")?;
        let identity: Vec<bool> = get(row, "column_identity")?;
        let generated: Vec<bool> = get(row, "column_generated")?;
        let columns = (0..names.len())
            .map(|i| TableColumn {
                name: names[i].clone(),
                data_type: types[i].clone(),
                not_null: not_null[i],
                has_default: default[i],
                identity: identity[i],
                generated: generated[i],
            })
            .collect();
        let unique_names: Vec<String> = get(row, "unique_names")?;
        let unique_columns: Vec<String> = get(row, "unique_columns")?;
        Ok(TableFacts {
            session: Session::from_row(row)?,
            schema_usage: get(row, "schema_usage")?,
            table_exists: get(row, "table_exists")?,
            columns,
            position_sequence: get(row, "position_sequence")?,
            unique: unique_names
                .into_iter()
                .zip(unique_columns)
                .map(|(n, c)| (n, c.split(',').map(String::from).collect()))
                .collect(),
            select: get(row, "table_select")?,
            insert: get(row, "table_insert")?,
            literals: None,
            stream_version: None,
            stream: None,
        })
    }

    fn column(&self, name: &str) -> Option<&TableColumn> {
        self.columns.iter().find(|c| c.name == name)
    }
}

const INTEGER_TYPES: [&str; 4] = ["bigint", "integer", "smallint", "numeric"];

/// The verdicts on a table profile's table, in `check`'s order. Pure.
pub(crate) fn table_findings(
    f: &TableFacts,
    shape: &TableShape,
    schema: &Ident,
    tls: &TlsMode,
) -> Vec<Finding> {
    let table = shape.qualified(schema).pg();
    let schema = schema.pg();
    let mut out = session(&f.session, tls, schema);
    if !f.session.schema_exists {
        return out;
    }
    if !f.table_exists {
        out.push(Finding::fail(
            Check::Table,
            format!("{table} does not exist ({} profile)", shape.kind),
        ));
        out.push(rights(f, schema, &table));
        return out;
    }
    out.push(Finding::pass(
        Check::Table,
        format!("{table} exists ({} profile)", shape.kind),
    ));
    out.push(position(f, shape, &table));
    out.push(columns(f, shape));
    if let (Some(row), Some(s)) = (shape.stream_row(), &f.stream) {
        out.extend(streams_table(s, schema));
        out.push(Finding::pass(
            Check::Checkpoints,
            "none for this profile: start_from = checkpoints starts `lookback` below the head (never below the sequence's start, 0 for SQLStreamStore); start_from = 0 examines the whole table",
        ));
        out.push(rights(f, schema, &table));
        out.push(stream_row(f, s, shape, row, schema));
        return out;
    }
    out.push(Finding::pass(
        Check::Checkpoints,
        "none for this profile: start_from = checkpoints starts `lookback` below the head (never below the identity's seed); start_from = 0 examines the whole table",
    ));
    out.push(rights(f, schema, &table));
    if let Some(finding) = version_key(f, shape) {
        out.push(finding);
    }
    out
}

/// SQLStreamStore's `streams`, where the tombstone stream's row is made:
/// there, with the columns the fill uses, the row makeable (a unique key on
/// exactly `id`, `id_internal` drawn by its default, no other required
/// column).
fn streams_table(s: &StreamFacts, schema: &str) -> Vec<Finding> {
    let streams = format!("{schema}.streams");
    if !s.exists {
        return vec![Finding::fail(
            Check::StreamsTable,
            format!("{streams} does not exist: the tombstone stream's row lives there (sqlstreamstore profile)"),
        )];
    }
    let mut problems = Vec::new();
    let missing: Vec<&str> = STREAM_ROW_COLUMNS
        .iter()
        .copied()
        .filter(|c| !s.columns.iter().any(|have| have == c))
        .collect();
    if !missing.is_empty() {
        problems.push(format!("missing {}", missing.join(", ")));
    }
    if !s.id_unique && s.columns.iter().any(|c| c == "id") {
        problems.push(
            "no unique key on exactly id: the tombstone stream's row is made ON CONFLICT (id)"
                .to_string(),
        );
    }
    if s.columns.iter().any(|c| c == "id_internal") && s.id_sequence.is_none() {
        problems.push("id_internal draws from no sequence: the row could not be made".into());
    }
    let required: Vec<&str> = s
        .required
        .iter()
        .map(String::as_str)
        .filter(|c| !["id", "id_original"].contains(c))
        .collect();
    if !required.is_empty() {
        problems.push(format!(
            "NOT NULL without a default, and not set by the row's insert: {}",
            required.join(", ")
        ));
    }
    let columns = if problems.is_empty() {
        Finding::pass(
            Check::StreamsColumns,
            format!(
                "{} (id unique, id_internal from {})",
                STREAM_ROW_COLUMNS.join(", "),
                s.id_sequence.as_deref().unwrap_or("its sequence")
            ),
        )
    } else {
        Finding::fail(
            Check::StreamsColumns,
            format!("{streams}: {}", problems.join("; ")),
        )
    };
    vec![
        Finding::pass(
            Check::StreamsTable,
            format!("{streams} exists (the tombstone stream's row)"),
        ),
        columns,
    ]
}

/// The tombstone stream's row beside its messages: versions 0..n-1, the
/// row's version n-1 and position the highest of its messages'; and the
/// unique key `(stream_id_internal, stream_version)` that backs the
/// versions.
fn stream_row(
    f: &TableFacts,
    s: &StreamFacts,
    shape: &TableShape,
    row: &StreamRow,
    schema: &str,
) -> Finding {
    let [stream_column, version_column] = [
        crate::engine::profile::SQLSTREAMSTORE_STREAM_COLUMN,
        crate::engine::profile::SQLSTREAMSTORE_VERSION_COLUMN,
    ];
    let backed = f.unique.iter().find(|(_, cols)| {
        cols.len() == 2
            && cols.iter().any(|c| c == stream_column)
            && cols.iter().any(|c| c == version_column)
    });
    let key = match backed {
        Some((name, _)) => {
            format!("unique key {name} backs ({stream_column}, {version_column})")
        }
        None => format!(
            "no unique key on ({stream_column}, {version_column}): healers serialise on the stream's row, but nothing stops another writer from reusing a version"
        ),
    };
    let name = &row.name;
    let literal = format!("'{}'", row.id.replace('\'', "''"));
    let table = shape.table.as_str();
    let (ok, now) = match &s.state {
        None => (true, "not read".to_string()),
        Some(Err(why)) => (false, format!("cannot read it: {why}")),
        Some(Ok(None)) => (
            true,
            format!("{name} not made yet (made on the first fill)"),
        ),
        Some(Ok(Some(t))) => {
            let contiguous = t.min_version == 0 && t.max_version == t.rows - 1;
            let head = t.version == t.rows - 1 && t.position == t.max_position;
            if contiguous && head {
                (
                    true,
                    format!(
                        "{name}: {} tombstones, version {}, position {}",
                        t.rows, t.version, t.position
                    ),
                )
            } else {
                let repair = format!(
                    "UPDATE {schema}.streams AS s SET version = (SELECT COALESCE(MAX(m.stream_version), -1) FROM {schema}.{table} AS m WHERE m.stream_id_internal = s.id_internal), \"position\" = (SELECT COALESCE(MAX(m.\"position\"), -1) FROM {schema}.{table} AS m WHERE m.stream_id_internal = s.id_internal) WHERE s.id = {literal};"
                );
                let advice = if contiguous {
                    format!("the versions are 0..{} but the row says version {}, position {}; with the healers stopped, run: {repair}", t.rows - 1, t.version, t.position)
                } else {
                    format!("the versions are not 0..{}: something other than gap-healer writes this stream; stop the healers and give them a new tombstone_stream (for example {name}-2; the old stream stays as it is)", t.rows - 1)
                };
                (
                    false,
                    format!(
                        "{name} inconsistent: {} messages, versions {}..{}, highest position {}, row version {} position {}: {advice}",
                        t.rows, t.min_version, t.max_version, t.max_position, t.version, t.position
                    ),
                )
            }
        }
    };
    let detail = format!("{now}; {key}");
    if ok && backed.is_some() {
        Finding::pass(Check::TombstoneStream, detail)
    } else {
        Finding::fail(Check::TombstoneStream, detail)
    }
}

/// The position: an integer column fed by a sequence (identity or serial),
/// and a unique key on exactly it (the fill waits on it and the database
/// decides).
fn position(f: &TableFacts, shape: &TableShape, table: &str) -> Finding {
    let name = shape.position.as_str();
    let Some(col) = f.column(name) else {
        return Finding::fail(
            Check::GlobalPosition,
            format!("{table}.{name}: column missing"),
        );
    };
    if !matches!(col.data_type.as_str(), "bigint" | "integer") {
        return Finding::fail(
            Check::GlobalPosition,
            format!(
                "{table}.{name}: expected bigint (or integer), found {}",
                col.data_type
            ),
        );
    }
    let Some(sequence) = &f.position_sequence else {
        return Finding::fail(
            Check::GlobalPosition,
            format!("{table}.{name}: not an identity or serial column: positions that are not handed out by a sequence are not holes gap-healer can judge"),
        );
    };
    let keys: Vec<&str> = f
        .unique
        .iter()
        .filter(|(_, cols)| cols.len() == 1 && cols[0] == *name)
        .map(|(n, _)| n.as_str())
        .collect();
    if keys.is_empty() {
        return Finding::fail(
            Check::GlobalPosition,
            format!("{table}.{name}: no unique key on exactly it: a fill could not wait on a slow append's position, so holes cannot be filled safely"),
        );
    }
    Finding::pass(
        Check::GlobalPosition,
        format!(
            "{table}.{name}: {}{}, sequence {sequence}, unique key {}",
            col.data_type,
            if col.identity { " identity" } else { "" },
            keys.join(", ")
        ),
    )
}

/// The tombstone row: every named column exists and can be written, the
/// database takes every literal, the version column holds integers, and no
/// NOT NULL column without a default is left out.
fn columns(f: &TableFacts, shape: &TableShape) -> Finding {
    let mut problems = Vec::new();
    for c in shape.columns() {
        let name = c.name.as_str();
        match f.column(name) {
            None => problems.push(format!("{name}: no such column")),
            Some(col) if col.generated => {
                problems.push(format!("{name}: a generated column cannot be written"))
            }
            Some(col) if col.identity => problems.push(format!(
                "{name}: an identity column other than the position",
            )),
            Some(col) => {
                if let ColumnValue::NextVersion { .. } = c.value {
                    if !INTEGER_TYPES.contains(&col.data_type.as_str()) {
                        problems.push(format!(
                            "{name}: next_version needs an integer column, found {}",
                            col.data_type
                        ));
                    }
                }
            }
        }
    }
    for name in shape.stream_columns() {
        match f.column(name) {
            None => problems.push(format!("{name}: no such column")),
            Some(col) if !INTEGER_TYPES.contains(&col.data_type.as_str()) => {
                problems.push(format!(
                    "{name}: the stream row gives an integer, found {}",
                    col.data_type
                ))
            }
            Some(_) => {}
        }
    }
    let missing: Vec<&str> = f
        .columns
        .iter()
        .filter(|col| {
            col.not_null
                && !col.has_default
                && !col.generated
                && col.name != shape.position.as_str()
                && !shape.columns().iter().any(|c| c.name.as_str() == col.name)
                && !shape.stream_columns().contains(&col.name.as_str())
        })
        .map(|col| col.name.as_str())
        .collect();
    if !missing.is_empty() {
        problems.push(format!(
            "NOT NULL without a default, and not in the tombstone row: {}",
            missing.join(", ")
        ));
    }
    if let Some(Err(why)) = &f.literals {
        problems.push(format!("the literals do not fit their columns: {why}"));
    }
    if problems.is_empty() {
        let names: Vec<&str> = shape
            .stream_columns()
            .iter()
            .copied()
            .chain(shape.columns().iter().map(|c| c.name.as_str()))
            .collect();
        Finding::pass(
            Check::TombstoneColumns,
            format!("the tombstone row fills {}", names.join(", ")),
        )
    } else {
        Finding::fail(Check::TombstoneColumns, problems.join("; "))
    }
}

/// SELECT and INSERT on the table, USAGE on the schema, with the GRANTs.
fn rights(f: &TableFacts, schema: &str, table: &str) -> Finding {
    let to = quote_role(&f.session.login);
    let mut missing = Vec::new();
    let mut grants = Vec::new();
    if f.schema_usage == Some(false) {
        missing.push(format!("USAGE on schema {schema}"));
        grants.push(format!("GRANT USAGE ON SCHEMA {schema} TO {to};"));
    }
    let lacking: Vec<&str> = [(f.select, "SELECT"), (f.insert, "INSERT")]
        .into_iter()
        .filter(|(granted, _)| *granted == Some(false))
        .map(|(_, right)| right)
        .collect();
    if !lacking.is_empty() {
        missing.extend(lacking.iter().map(|r| format!("{r} on {table}")));
        grants.push(format!("GRANT {} ON {table} TO {to};", lacking.join(", ")));
    }
    let mut have = format!("USAGE on the schema; SELECT, INSERT on {table}");
    if let Some(s) = &f.stream {
        // The tombstone stream's row, in the order `sql` grants them.
        let streams = format!("{schema}.streams");
        let lacking: Vec<&str> = [
            (s.select, "SELECT"),
            (s.insert, "INSERT (id, id_original)"),
            (s.update, "UPDATE (version, position)"),
        ]
        .into_iter()
        .filter(|(granted, _)| *granted == Some(false))
        .map(|(_, right)| right)
        .collect();
        if !lacking.is_empty() {
            missing.extend(lacking.iter().map(|r| format!("{r} on {streams}")));
            grants.push(format!(
                "GRANT {} ON {streams} TO {to};",
                lacking.join(", ")
            ));
        }
        if let (Some(sequence), Some(false)) = (&s.id_sequence, s.sequence_usage) {
            missing.push(format!("USAGE on sequence {sequence}"));
            grants.push(format!("GRANT USAGE ON SEQUENCE {sequence} TO {to};"));
        }
        have.push_str(&format!(
            "; SELECT, INSERT (id, id_original), UPDATE (version, position) on {streams} and USAGE on its sequence"
        ));
    }
    if missing.is_empty() {
        Finding::pass(Check::Rights, have)
    } else {
        Finding::fail(
            Check::Rights,
            format!(
                "missing {}; as the table's owner, run: {}",
                missing.join(", "),
                grants.join(" ")
            ),
        )
    }
}

/// The tombstone stream's version: backed by a unique key over the stream's
/// columns and the version (else only the healers' lock keeps versions
/// apart), and where it stands now.
fn version_key(f: &TableFacts, shape: &TableShape) -> Option<Finding> {
    let (column, stream) = shape.version()?;
    let column = column.as_str();
    let backed = f.unique.iter().find(|(_, cols)| {
        cols.iter().any(|c| c == column)
            && stream.iter().all(|s| cols.iter().any(|c| c == s.as_str()))
            && cols.len() == stream.len() + 1
    });
    let stream_key = stream
        .iter()
        .map(Ident::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    let now = match &f.stream_version {
        Some(Ok(0)) => "no tombstones yet".to_string(),
        Some(Ok(v)) => format!("at version {v}"),
        Some(Err(why)) => format!("version unread: {why}"),
        None => "version unread".to_string(),
    };
    Some(match backed {
        Some((name, _)) => Finding::pass(
            Check::TombstoneStream,
            format!("{now}; unique key {name} backs ({stream_key}, {column})"),
        ),
        None => Finding::fail(
            Check::TombstoneStream,
            format!(
                "{now}; no unique key on ({stream_key}, {column}): healers serialise on their own lock, but nothing stops another writer from reusing a version",
            ),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::check::shape_verdict;
    use crate::engine::profile::NIL_UUID;

    fn col(name: &str, data_type: &str, not_null: bool, has_default: bool) -> TableColumn {
        TableColumn {
            name: name.into(),
            data_type: data_type.into(),
            not_null,
            has_default,
            ..TableColumn::default()
        }
    }

    fn ledger() -> TableShape {
        TableShape::ledger_core(
            Ident::parse("events").unwrap(),
            Ident::parse("position").unwrap(),
            "$gap",
            NIL_UUID,
            "$tombstone",
        )
    }

    /// seed 003's table as the catalog shows it.
    fn seed_003() -> TableFacts {
        let mut position = col("position", "bigint", true, true);
        position.identity = true;
        TableFacts {
            session: Session {
                version: "15.20".into(),
                version_num: 150_020,
                encrypted: Some(false),
                login: "healer".into(),
                schema_exists: true,
            },
            schema_usage: Some(true),
            table_exists: true,
            columns: vec![
                position,
                col("stream_category", "text", true, false),
                col("stream_id", "uuid", true, false),
                col("version", "bigint", true, false),
                col("event_type", "text", true, false),
                col("data", "jsonb", true, false),
                col("recorded_at", "timestamp with time zone", true, true),
            ],
            position_sequence: Some("ledger.events_position_seq".into()),
            unique: vec![
                ("events_pkey".into(), vec!["position".into()]),
                (
                    "events_stream_version_key".into(),
                    vec![
                        "stream_category".into(),
                        "stream_id".into(),
                        "version".into(),
                    ],
                ),
            ],
            select: Some(true),
            insert: Some(true),
            literals: Some(Ok(())),
            stream_version: Some(Ok(0)),
            stream: None,
        }
    }

    fn verdicts(f: &TableFacts) -> Vec<Finding> {
        table_findings(
            f,
            &ledger(),
            &Ident::parse("ledger").unwrap(),
            &TlsMode::Off,
        )
    }

    #[test]
    fn seed_003_passes_every_check() {
        let out = verdicts(&seed_003());
        assert!(out.iter().all(|f| f.ok), "{out:#?}");
        assert_eq!(shape_verdict(&out), Ok(()));
        let position = out
            .iter()
            .find(|f| f.check == Check::GlobalPosition)
            .unwrap();
        assert!(
            position.detail.contains("unique key events_pkey"),
            "{position:?}"
        );
    }

    #[test]
    fn a_position_without_a_unique_key_or_sequence_refuses_the_store() {
        let mut f = seed_003();
        f.unique.remove(0);
        let err = shape_verdict(&verdicts(&f)).unwrap_err();
        assert!(err.contains("no unique key on exactly it"), "{err}");
        let mut f = seed_003();
        f.position_sequence = None;
        let err = shape_verdict(&verdicts(&f)).unwrap_err();
        assert!(err.contains("not an identity or serial column"), "{err}");
    }

    #[test]
    fn the_tombstone_row_must_fill_every_required_column() {
        let mut f = seed_003();
        f.columns.push(col("tenant", "text", true, false));
        f.columns.retain(|c| c.name != "event_type");
        f.literals = Some(Err("22P02: invalid input syntax for type uuid".into()));
        let err = shape_verdict(&verdicts(&f)).unwrap_err();
        assert!(err.contains("event_type: no such column"), "{err}");
        assert!(err.contains("not in the tombstone row: tenant"), "{err}");
        assert!(err.contains("invalid input syntax for type uuid"), "{err}");
    }

    #[test]
    fn missing_rights_come_with_their_grants_and_a_missing_version_key_is_named() {
        let mut f = seed_003();
        f.insert = Some(false);
        f.unique.pop();
        let out = verdicts(&f);
        let rights = out.iter().find(|f| f.check == Check::Rights).unwrap();
        assert!(!rights.ok);
        assert!(
            rights
                .detail
                .contains("GRANT INSERT ON ledger.events TO healer;"),
            "{rights:?}"
        );
        let stream = out
            .iter()
            .find(|f| f.check == Check::TombstoneStream)
            .unwrap();
        assert!(
            !stream.ok
                && stream
                    .detail
                    .contains("no unique key on (stream_category, stream_id, version)")
        );
        // Neither refuses the store: check reports them, run starts.
        assert_eq!(shape_verdict(&out), Ok(()));
    }

    fn sss() -> TableShape {
        TableShape::sqlstreamstore("$gap-healer-tombstones", "$gap-healer-tombstone")
    }

    /// SQLStreamStore's tables as the catalog shows them
    /// (`tests/fixtures/sqlstreamstore_postgres.sql`).
    fn sqlstreamstore() -> TableFacts {
        let position = col("position", "bigint", true, true);
        let mut f = seed_003();
        f.columns = vec![
            col("stream_id_internal", "integer", true, false),
            col("stream_version", "integer", true, false),
            position,
            col("message_id", "uuid", true, false),
            col("created_utc", "timestamp without time zone", true, false),
            col("type", "character varying(128)", true, false),
            col("json_data", "jsonb", true, false),
            col("json_metadata", "jsonb", false, false),
        ];
        f.position_sequence = Some("sss.messages_seq".into());
        f.unique = vec![
            ("pk_messages".into(), vec!["position".into()]),
            (
                "uq_messages_stream_id_internal_and_stream_version".into(),
                vec!["stream_id_internal".into(), "stream_version".into()],
            ),
            (
                "uq_stream_id_internal_and_message_id".into(),
                vec!["stream_id_internal".into(), "message_id".into()],
            ),
        ];
        f.stream_version = None;
        f.stream = Some(StreamFacts {
            exists: true,
            columns: [
                "id",
                "id_original",
                "id_internal",
                "version",
                "position",
                "max_age",
                "max_count",
            ]
            .map(String::from)
            .to_vec(),
            required: vec!["id".into(), "id_original".into()],
            id_unique: true,
            id_sequence: Some("sss.streams_seq".into()),
            sequence_usage: Some(true),
            select: Some(true),
            insert: Some(true),
            update: Some(true),
            state: Some(Ok(None)),
        });
        f
    }

    fn sss_verdicts(f: &TableFacts) -> Vec<Finding> {
        table_findings(f, &sss(), &Ident::parse("sss").unwrap(), &TlsMode::Off)
    }

    fn finding(out: &[Finding], check: Check) -> &Finding {
        out.iter()
            .find(|f| f.check == check)
            .unwrap_or_else(|| panic!("no {check:?} in {out:#?}"))
    }

    #[test]
    fn sqlstreamstores_tables_pass_every_check() {
        let out = sss_verdicts(&sqlstreamstore());
        assert!(out.iter().all(|f| f.ok), "{out:#?}");
        assert_eq!(shape_verdict(&out), Ok(()));
        let columns = &finding(&out, Check::TombstoneColumns).detail;
        assert!(
            columns.contains("stream_id_internal, stream_version, message_id, created_utc"),
            "{columns}"
        );
        let stream = &finding(&out, Check::TombstoneStream).detail;
        assert!(stream.contains("not made yet"), "{stream}");
        assert!(
            stream.contains("uq_messages_stream_id_internal_and_stream_version backs"),
            "{stream}"
        );
    }

    #[test]
    fn a_streams_table_the_row_cannot_be_made_in_refuses_the_store() {
        let mut f = sqlstreamstore();
        f.stream.as_mut().unwrap().exists = false;
        let err = shape_verdict(&sss_verdicts(&f)).unwrap_err();
        assert!(err.contains("sss.streams does not exist"), "{err}");
        let mut f = sqlstreamstore();
        let s = f.stream.as_mut().unwrap();
        s.columns.retain(|c| c != "position");
        s.id_unique = false;
        s.id_sequence = None;
        s.required.push("tenant".into());
        let err = shape_verdict(&sss_verdicts(&f)).unwrap_err();
        for needle in [
            "missing position",
            "no unique key on exactly id",
            "id_internal draws from no sequence",
            "not set by the row's insert: tenant",
        ] {
            assert!(err.contains(needle), "{needle}: {err}");
        }
        // The message's columns the stream row gives must be there.
        let mut f = sqlstreamstore();
        f.columns.retain(|c| c.name != "stream_version");
        let err = shape_verdict(&sss_verdicts(&f)).unwrap_err();
        assert!(err.contains("stream_version: no such column"), "{err}");
    }

    /// Each right `check` asks of a login that has none is one `sql`
    /// prints for the profile.
    #[test]
    fn every_grant_check_asks_for_sqlstreamstore_is_one_sql_prints() {
        let mut f = sqlstreamstore();
        f.schema_usage = Some(false);
        f.select = Some(false);
        f.insert = Some(false);
        let s = f.stream.as_mut().unwrap();
        s.select = Some(false);
        s.insert = Some(false);
        s.update = Some(false);
        s.sequence_usage = Some(false);
        let rights = finding(&sss_verdicts(&f), Check::Rights).detail.clone();
        let asked: Vec<&str> = rights
            .match_indices("GRANT ")
            .filter_map(|(i, _)| rights[i..].find(';').map(|end| &rights[i..=i + end]))
            .collect();
        assert_eq!(asked.len(), 4, "{rights}");
        let sql = super::super::sql::setup_sql(&Ident::parse("sss").unwrap(), &sss())
            .replace(crate::engine::HEALER_ROLE, "healer");
        for grant in asked {
            assert!(sql.contains(grant), "{grant} is not in `sql`:\n{sql}");
        }
        // The proof's sequence is granted too (its finding asks for it).
        assert!(sql.contains("GRANT SELECT ON SEQUENCE sss.messages_seq TO healer;"));
    }

    #[test]
    fn a_tombstone_stream_row_that_disagrees_with_its_messages_names_the_repair() {
        let state = |version, position, rows, max_version, max_position| StreamState {
            version,
            position,
            rows,
            min_version: 0,
            max_version,
            max_position,
        };
        let mut f = sqlstreamstore();
        f.stream.as_mut().unwrap().state = Some(Ok(Some(state(2, 40, 3, 2, 40))));
        let out = sss_verdicts(&f);
        let t = finding(&out, Check::TombstoneStream);
        assert!(
            t.ok && t.detail.contains("3 tombstones, version 2, position 40"),
            "{t:?}"
        );
        // The row's position behind its messages': repaired by an UPDATE.
        f.stream.as_mut().unwrap().state = Some(Ok(Some(state(2, 30, 3, 2, 40))));
        let out = sss_verdicts(&f);
        let t = finding(&out, Check::TombstoneStream);
        assert!(
            !t.ok && t.detail.contains("UPDATE sss.streams AS s SET version"),
            "{t:?}"
        );
        // Versions with holes: another writer; a new stream is the way out.
        f.stream.as_mut().unwrap().state = Some(Ok(Some(state(3, 40, 3, 3, 40))));
        let t = finding(&sss_verdicts(&f), Check::TombstoneStream).clone();
        assert!(
            !t.ok && t.detail.contains("something other than gap-healer"),
            "{t:?}"
        );
        // Neither refuses the store.
        assert_eq!(shape_verdict(&out), Ok(()));
    }
}
