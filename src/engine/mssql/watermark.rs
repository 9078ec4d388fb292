//! The published contiguous watermark on SQL Server: one row per store in
//! the table `watermark_table` names (`sql/mssql/watermark_*.sql`), and
//! what `check` says about that table.
//!
//! Invariant: the row's position never decreases (the update only raises
//! it; the first insert of a store is serialised by a key-range lock), so a
//! reader that bounds its `GlobalPosition > @last` query by it never skips
//! an event that commits late.

use super::{get, get_integer, MssqlEngine};
use crate::engine::check::watermark_verdict;
use crate::engine::profile::Tombstone;
use crate::engine::{Check, DbError, DbResult, Finding, QualifiedName};

use super::sql::{
    WATERMARK_CHECK as CHECK, WATERMARK_PUBLISH as PUBLISH, WATERMARK_READ as READ,
    WATERMARK_TABLE as TABLE,
};

/// The columns gap-healer writes, as `check` reads them: the first form is
/// the one the DDL creates.
const COLUMNS: [&[&str]; 4] = [
    &["store nvarchar", "store varchar"],
    &["position bigint"],
    &[
        "updated_at datetime2",
        "updated_at datetimeoffset",
        "updated_at datetime",
    ],
    &["healed_table nvarchar", "healed_table varchar"],
];

/// The table's DDL and grants for `gap-healer sql`.
pub fn watermark_sql(table: &QualifiedName) -> String {
    format!(
        "\nGO\n\n{}",
        TABLE
            .replace("__watermark_schema__", table.schema.tsql_bare())
            .replace("__watermark__", &table.tsql_bare())
    )
}

impl MssqlEngine {
    fn watermark_statement(&self, sql: &str) -> DbResult<String> {
        let table = self
            .settings
            .watermark_table
            .as_ref()
            .ok_or_else(|| DbError::permanent("no watermark_table is configured"))?;
        Ok(sql.replace("__watermark__", &table.tsql_bare()))
    }

    /// The healed table as the watermark row names it (without the
    /// database, which the statements put in front).
    fn healed_table(&self) -> String {
        let table = match self.settings.profile.tombstone {
            Tombstone::EventuousStream => "Messages",
            _ => self.settings.profile.table.as_str(),
        };
        format!("{}.{table}", self.settings.schema.as_str())
    }

    pub(super) async fn read_watermark_row(&self, store: &str) -> DbResult<Option<i64>> {
        let sql = self.watermark_statement(READ)?;
        let rows = self
            .read_first(&sql, &[&store, &self.healed_table()])
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let owner = get::<&str>(row, "owner")?;
        let mine = get::<&str>(row, "mine")?.unwrap_or_default();
        self.owned_by_this_table(store, owner, mine)?;
        get_integer(row, "position")
    }

    pub(super) async fn publish_watermark_row(&self, store: &str, position: i64) -> DbResult<()> {
        let sql = self.watermark_statement(PUBLISH)?;
        let sets = self
            .read(&sql, &[&store, &position, &self.healed_table()])
            .await?;
        let Some(row) = sets.last().and_then(|rows| rows.first()) else {
            return Err(DbError::transient(
                "publishing the watermark returned no answer",
            ));
        };
        if get::<bool>(row, "existed")?.unwrap_or(false) {
            let owner = get::<&str>(row, "owner")?;
            let mine = get::<&str>(row, "mine")?.unwrap_or_default();
            self.owned_by_this_table(store, owner, mine)?;
        }
        Ok(())
    }

    fn owned_by_this_table(&self, store: &str, owner: Option<&str>, mine: &str) -> DbResult<()> {
        let table = self
            .settings
            .watermark_table
            .as_ref()
            .map(QualifiedName::name);
        crate::engine::check::watermark_owner(&table.unwrap_or_default(), store, owner, mine)
    }

    /// The watermark finding of `check`; `None` without a watermark table.
    pub(super) async fn watermark_finding(&self) -> Option<Finding> {
        let table = self.settings.watermark_table.as_ref()?.name();
        let table = table.as_str();
        let sets = match self.read(CHECK, &[&table]).await {
            Ok(sets) => sets,
            Err(e) => return Some(Finding::fail(Check::Watermark, e.message)),
        };
        // A result set without rows may not come back at all: no columns.
        let columns = sets.get(1).map(Vec::as_slice).unwrap_or_default();
        let Some(facts) = sets.first().and_then(|s| s.first()) else {
            return Some(Finding::fail(
                Check::Watermark,
                "unexpected answer from the watermark table check",
            ));
        };
        let flag = |c: &str| get::<bool>(facts, c).ok().flatten().unwrap_or(false);
        let login = get::<&str>(facts, "login").ok().flatten();
        let schema = self.settings.schema.as_str();
        let fix = crate::engine::check::watermark_fix("mssql", schema, table, login);
        let columns: Vec<String> = columns
            .iter()
            .filter_map(|r| {
                get::<&str>(r, "column_type")
                    .ok()
                    .flatten()
                    .map(String::from)
            })
            .collect();
        Some(watermark_verdict(
            table,
            flag("table_exists"),
            &columns,
            &COLUMNS,
            flag("store_is_unique"),
            flag("writable"),
            &fix,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sql_names_the_table_and_its_schema() {
        let name = |s: &str| crate::engine::Ident::parse(s).unwrap();
        let sql = watermark_sql(&QualifiedName::new(name("gap_healer"), name("watermarks")));
        assert!(sql.contains("IF OBJECT_ID(N'gap_healer.watermarks', N'U') IS NULL"));
        assert!(sql.contains("EXEC (N'CREATE SCHEMA gap_healer');"));
        assert!(sql.contains(
            "GRANT SELECT, INSERT, UPDATE ON OBJECT::gap_healer.watermarks TO __healer_role__;"
        ));
        assert!(!sql.contains("__watermark"), "{sql}");
    }

    #[test]
    fn sql_server_types_are_accepted() {
        let cols: Vec<String> = [
            "store nvarchar",
            "position bigint",
            "updated_at datetime2",
            "healed_table nvarchar",
        ]
        .map(String::from)
        .to_vec();
        assert!(watermark_verdict("g.w", true, &cols, &COLUMNS, true, true, "fix").ok);
        let wrong = watermark_verdict("g.w", true, &cols[..2], &COLUMNS, true, true, "fix");
        assert!(
            !wrong.ok && wrong.detail.contains("updated_at datetime2"),
            "{wrong:?}"
        );
    }
}
