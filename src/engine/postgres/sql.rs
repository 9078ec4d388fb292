//! Every statement of the PostgreSQL engine, from `sql/postgres/*.sql`, with
//! the store's schema spliced in once (it is a validated identifier; every
//! value is a bind parameter).

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
}

/// Statements that name no table of the store.
pub(crate) const IDENTITY: &str = include_str!("../../../sql/postgres/identity.sql");
pub(crate) const TABLE_EXISTS: &str = include_str!("../../../sql/postgres/table_exists.sql");
pub(crate) const PRIMARY_KEY: &str = include_str!("../../../sql/postgres/primary_key.sql");
pub(crate) const PREFLIGHT: &str = include_str!("../../../sql/postgres/preflight.sql");
pub(crate) const LEADER_LOCK: &str = include_str!("../../../sql/postgres/leader_lock.sql");
pub(crate) const DATABASES: &str = include_str!("../../../sql/postgres/databases.sql");
pub(crate) const LEADER_CHECK: &str = include_str!("../../../sql/postgres/leader_check.sql");
const GRANTS: &str = include_str!("../../../sql/postgres/grants.sql");

impl Queries {
    pub(crate) fn new(schema: &str) -> Self {
        let s = |sql: &str| sql.replace("__schema__", schema);
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
        }
    }

    #[cfg(test)]
    fn all(&self) -> [&str; 9] {
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
        ]
    }
}

/// What `gap-healer sql --engine postgres` prints.
pub fn setup_sql(schema: &str) -> String {
    GRANTS.replace("__schema__", schema)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_uses_the_schema_and_no_placeholder_survives() {
        let q = Queries::new("store_1");
        for sql in q.all() {
            assert!(!sql.contains("__schema__"), "{sql}");
            assert!(sql.contains("store_1."), "{sql}");
        }
        for sql in [
            IDENTITY,
            TABLE_EXISTS,
            PRIMARY_KEY,
            PREFLIGHT,
            LEADER_LOCK,
            LEADER_CHECK,
        ] {
            assert!(!sql.contains("__schema__"), "{sql}");
        }
        assert!(setup_sql("store_1")
            .contains("GRANT SELECT, INSERT ON store_1.messages TO gap_healer;"));
    }
}
