//! `gap-healer sql`: the setup script a DBA runs (objects and grants), for
//! every selected store and store set, without connecting.

use super::{print_out, Failure};
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

/// Prints the setup script of every store and store set `settings`
/// selects, for `role` (a placeholder without one).
pub(super) fn print(settings: &Settings, role: Option<&str>) -> Result<u8, Failure> {
    let many = settings.stores.len() + settings.sets.len() > 1;
    print_out(setup_sql(settings, role, many).as_bytes())
}

/// `sql`'s setup statements for every selected store and store set, each
/// led by a comment naming it when there are many.
fn setup_sql(settings: &Settings, role: Option<&str>, many: bool) -> String {
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
