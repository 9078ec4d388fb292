//! The table profiles (`ledger-core`, `custom`): their fill transaction and
//! what `check` says about their table.
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

use std::time::Duration;

use tokio_postgres::Row;

use super::errors::{describe, get, Stage};
use super::fill::{at, bounds, set_lock_timeout, Failed, STREAM_LOCK_TIMEOUT};
use super::leader::advisory_key;
use super::preflight::{quote_role, session, Session};
use super::sql::PREFLIGHT_TABLE;
use super::tls::TlsMode;
use super::PostgresEngine;
use crate::engine::ident::Ident;
use crate::engine::profile::{ColumnValue, TableShape};
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
    let missing: Vec<&str> = f
        .columns
        .iter()
        .filter(|col| {
            col.not_null
                && !col.has_default
                && !col.generated
                && col.name != shape.position.as_str()
                && !shape.columns().iter().any(|c| c.name.as_str() == col.name)
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
        let names: Vec<&str> = shape.columns().iter().map(|c| c.name.as_str()).collect();
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
    if missing.is_empty() {
        Finding::pass(
            Check::Rights,
            format!("USAGE on the schema; SELECT, INSERT on {table}"),
        )
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
}
