//! The published contiguous watermark: one row per store in the table
//! `watermark_table` names (`sql/postgres/watermark_*.sql`), and what
//! `check` says about that table.
//!
//! Invariant: the row's position never decreases (the upsert only raises
//! it), so a reader that bounds its `global_position > last` query by it
//! never skips an event that commits late.

use super::errors::get;
use super::PostgresEngine;
use crate::engine::check::watermark_verdict;
use crate::engine::{Check, DbResult, Finding, QualifiedName};

const READ: &str = include_str!("../../../sql/postgres/watermark_read.sql");
const PUBLISH: &str = include_str!("../../../sql/postgres/watermark_publish.sql");
const CHECK: &str = include_str!("../../../sql/postgres/watermark_check.sql");
const TABLE: &str = include_str!("../../../sql/postgres/watermark_table.sql");

/// The columns gap-healer writes, as `format_type` names them.
const COLUMNS: [&str; 4] = [
    "store text",
    "position bigint",
    "updated_at timestamp with time zone",
    "healed_table text",
];

/// The table's DDL and grants for `gap-healer sql`.
pub fn watermark_sql(table: &QualifiedName) -> String {
    TABLE
        .replace("__watermark_schema__", table.schema.pg())
        .replace("__watermark__", &table.pg())
}

impl PostgresEngine {
    fn watermark_statement(&self, sql: &str) -> DbResult<String> {
        let table = self
            .watermark_table
            .as_ref()
            .ok_or_else(|| crate::engine::DbError::permanent("no watermark_table is configured"))?;
        Ok(sql.replace("__watermark__", &table.pg()))
    }

    /// The healed table as the watermark row names it (without the
    /// database, which the statements put in front).
    fn healed_table(&self) -> String {
        self.table_name()
    }

    pub(super) async fn read_watermark_row(&self, store: &str) -> DbResult<Option<i64>> {
        let sql = self.watermark_statement(READ)?;
        let conn = self.pool.checkout().await?;
        let row = conn
            .query_opt(&sql, &[&store, &self.healed_table()])
            .await
            .map_err(|e| self.error(&e, "read the watermark"))?;
        let Some(row) = row else { return Ok(None) };
        let owner: Option<String> = get(&row, "owner")?;
        let mine: String = get(&row, "mine")?;
        self.owned_by_this_table(store, owner.as_deref(), &mine)?;
        Ok(Some(get(&row, "position")?))
    }

    pub(super) async fn publish_watermark_row(&self, store: &str, position: i64) -> DbResult<()> {
        let sql = self.watermark_statement(PUBLISH)?;
        let conn = self.pool.checkout().await?;
        let row = conn
            .query_one(&sql, &[&store, &position, &self.healed_table()])
            .await
            .map_err(|e| self.error(&e, "publish the watermark"))?;
        if get::<bool>(&row, "existed")? {
            let owner: Option<String> = get(&row, "owner")?;
            let mine: String = get(&row, "mine")?;
            self.owned_by_this_table(store, owner.as_deref(), &mine)?;
        }
        Ok(())
    }

    fn owned_by_this_table(&self, store: &str, owner: Option<&str>, mine: &str) -> DbResult<()> {
        let table = self.watermark_table.as_ref().map(QualifiedName::name);
        crate::engine::check::watermark_owner(&table.unwrap_or_default(), store, owner, mine)
    }

    /// The watermark finding of `check`; `None` without a watermark table.
    pub(super) async fn watermark_finding(&self) -> Option<Finding> {
        let table = self.watermark_table.as_ref()?.name();
        let table = table.as_str();
        let conn = match self.pool.checkout().await {
            Ok(conn) => conn,
            Err(e) => return Some(Finding::fail(Check::Watermark, e.message)),
        };
        let row = match conn.query_one(CHECK, &[&table]).await {
            Ok(row) => row,
            Err(e) => {
                let e = self.error(&e, "check the watermark table");
                return Some(Finding::fail(Check::Watermark, e.message));
            }
        };
        let login = get::<String>(&row, "login").ok();
        let fix = crate::engine::check::watermark_fix(
            "postgres",
            self.schema.as_str(),
            table,
            login.as_deref(),
        );
        let facts = (
            get::<bool>(&row, "table_exists"),
            get::<Vec<String>>(&row, "columns"),
            get::<bool>(&row, "store_is_unique"),
            get::<bool>(&row, "writable"),
        );
        let (Ok(exists), Ok(columns), Ok(unique), Ok(writable)) = facts else {
            return Some(Finding::fail(
                Check::Watermark,
                "unexpected answer from the watermark table check",
            ));
        };
        Some(verdict(table, exists, &columns, unique, writable, &fix))
    }
}

/// The watermark table's finding, from the facts.
fn verdict(
    table: &str,
    exists: bool,
    columns: &[String],
    store_is_unique: bool,
    writable: bool,
    fix: &str,
) -> Finding {
    let expected = COLUMNS.map(|c| [c]);
    let expected: Vec<&[&str]> = expected.iter().map(|c| &c[..]).collect();
    watermark_verdict(
        table,
        exists,
        columns,
        &expected,
        store_is_unique,
        writable,
        fix,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols() -> Vec<String> {
        COLUMNS.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn verdicts() {
        let ok = verdict("g.w", true, &cols(), true, true, "fix");
        assert!(ok.ok, "{ok:?}");
        let absent = verdict("g.w", false, &[], false, false, "fix");
        assert!(!absent.ok && absent.detail.contains("does not exist"));
        let short = verdict("g.w", true, &cols()[..2], true, true, "fix");
        assert!(
            short.detail.contains("updated_at timestamp with time zone"),
            "{short:?}"
        );
        assert!(!verdict("g.w", true, &cols(), false, true, "fix").ok);
        let ro = verdict("g.w", true, &cols(), true, false, "fix");
        assert!(
            !ro.ok
                && ro
                    .detail
                    .contains("may not SELECT, INSERT and UPDATE g.w: fix"),
            "{ro:?}"
        );
    }

    #[test]
    fn the_sql_names_the_table_and_its_schema() {
        let name = |s: &str| crate::engine::Ident::parse(s).unwrap();
        let sql = watermark_sql(&QualifiedName::new(name("gap_healer"), name("watermarks")));
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS gap_healer.watermarks ("));
        assert!(sql.contains("CREATE SCHEMA IF NOT EXISTS gap_healer;"));
        assert!(sql.contains("GRANT USAGE ON SCHEMA gap_healer TO __healer_role__;"));
        assert!(!sql.contains("__watermark"), "{sql}");
    }
}
