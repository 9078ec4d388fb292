//! `gap-healer sql`: the setup script a DBA runs (objects and grants), for
//! every selected store and store set, without connecting.

use crate::config::{commands, Flags, Settings};
use crate::engine;

type SqlFlags = Flags<{ commands::SQL }>;

#[derive(clap::Args, Debug, Clone)]
pub struct SqlArgs {
    #[command(flatten)]
    pub flags: SqlFlags,
    /// The role (PostgreSQL) or database user (SQL Server) of the
    /// healer's login, to grant to; without it the script says
    /// <healer_role>, to be replaced before it runs.
    #[arg(long, value_name = "ROLE", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub role: Option<String>,
}

/// `sql`'s setup statements for every selected store and store set, each
/// led by a comment naming it when there are many.
pub(super) fn setup_sql(settings: &Settings, role: Option<&str>, many: bool) -> String {
    let mut sql = String::new();
    for store in &settings.stores {
        if many {
            sql.push_str(&format!("-- store {}\n", store.name));
        }
        sql.push_str(&engine::setup_sql(store.engine, &store.store, role));
    }
    for set in &settings.sets {
        sql.push_str(&format!(
            "-- store set {}: in every database LIKE '{}'\n",
            set.name, set.databases
        ));
        sql.push_str(&engine::setup_sql(
            set.template.engine,
            &set.template.store,
            role,
        ));
    }
    sql
}
