//! What `gap-healer check` reports, in one vocabulary for every engine.
//!
//! Each engine's preflight is one query step that gathers facts and a pure
//! function from those facts to [`Finding`]s, each about one [`Check`]. The
//! checks that describe the store's shape ([`Check::is_shape`]) are what
//! `run`, `scan` and `heal` refuse to work without
//! ([`crate::engine::Engine::verify_shape`]): a table the healer cannot fill
//! safely is never healed.

use std::fmt;

/// One thing `check` looks at. The label is what the output shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Check {
    /// The configuration itself (a connection string the driver refuses).
    Configuration,
    /// Connecting and logging in; the server and its version.
    Connection,
    /// Whether the session is encrypted, and how the server was verified.
    Tls,
    /// The store's schema exists.
    Schema,
    /// The messages table exists (and its columns, on SQL Server).
    MessagesTable,
    /// The streams table exists (and its columns, on SQL Server).
    StreamsTable,
    /// A table profile's table exists.
    Table,
    /// A table profile's tombstone row: its columns exist, take their
    /// values, and leave no required column empty.
    TombstoneColumns,
    /// The global position: a bigint identity with a unique key on exactly it.
    GlobalPosition,
    /// The messages columns a tombstone fills.
    MessagesColumns,
    /// The streams columns the tombstone stream needs.
    StreamsColumns,
    /// The checkpoints table: present, absent, readable.
    Checkpoints,
    /// The rights a fill needs.
    Rights,
    /// The rights a read-only command needs.
    ReadRights,
    /// The tombstone stream's rows and Version agree.
    TombstoneStream,
    /// How fills reach the table (SQL Server: direct or procedure).
    FillMode,
    /// The installed fill procedure (SQL Server).
    FillProcedure,
    /// The identity cache (SQL Server: `IDENTITY_CACHE`).
    IdentityCache,
    /// The sequence behind the position (PostgreSQL): CACHE 1, INCREMENT 1,
    /// drawn from by this table alone, not behind the table's head.
    IdentitySequence,
    /// Which proof that a drawn position's transaction has ended is in
    /// force, and what it may read.
    TransactionProof,
    /// Read committed snapshot isolation (SQL Server).
    ReadCommittedSnapshot,
    /// The table the contiguous watermark is published in.
    Watermark,
    /// Optimized locking (SQL Server 2025, Azure SQL).
    OptimizedLocking,
    /// Accelerated database recovery (SQL Server 2019 and later, Azure SQL).
    AcceleratedDatabaseRecovery,
    /// Whether the database can be written (not a readable secondary).
    Updateability,
    /// The preflight itself could not run to the end.
    Preflight,
}

impl Check {
    /// The checks without which a fill is unsafe or impossible: the healer
    /// refuses to start on a store that fails one.
    pub fn is_shape(self) -> bool {
        matches!(
            self,
            Check::Schema
                | Check::MessagesTable
                | Check::StreamsTable
                | Check::Table
                | Check::TombstoneColumns
                | Check::GlobalPosition
                | Check::MessagesColumns
                | Check::StreamsColumns
                | Check::IdentitySequence
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            Check::Configuration => "configuration",
            Check::Connection => "connection",
            Check::Tls => "tls",
            Check::Schema => "schema",
            Check::MessagesTable => "messages table",
            Check::StreamsTable => "streams table",
            Check::Table => "table",
            Check::TombstoneColumns => "tombstone columns",
            Check::GlobalPosition => "global position",
            Check::MessagesColumns => "messages columns",
            Check::StreamsColumns => "streams columns",
            Check::Checkpoints => "checkpoints table",
            Check::Watermark => "watermark table",
            Check::Rights => "rights",
            Check::ReadRights => "read rights",
            Check::TombstoneStream => "tombstone stream",
            Check::FillMode => "fill mode",
            Check::FillProcedure => "fill procedure",
            Check::IdentityCache => "identity cache",
            Check::IdentitySequence => "identity sequence",
            Check::TransactionProof => "transaction-end proof",
            Check::ReadCommittedSnapshot => "READ_COMMITTED_SNAPSHOT",
            Check::OptimizedLocking => "optimized locking",
            Check::AcceleratedDatabaseRecovery => "accelerated database recovery",
            Check::Updateability => "updateability",
            Check::Preflight => "preflight",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// One line of `gap-healer check`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// Not a failure (a warning is `ok`).
    pub ok: bool,
    /// Passed, but something deserves a look (`WARN`): never a failure.
    pub warning: bool,
    pub check: Check,
    /// The check's label, kept beside it for the JSON output.
    pub what: &'static str,
    pub detail: String,
}

impl Finding {
    pub fn pass(check: Check, detail: impl Into<String>) -> Self {
        Finding {
            ok: true,
            warning: false,
            check,
            what: check.label(),
            detail: detail.into(),
        }
    }

    pub fn fail(check: Check, detail: impl Into<String>) -> Self {
        Finding {
            ok: false,
            warning: false,
            check,
            what: check.label(),
            detail: detail.into(),
        }
    }

    /// Passed, with a warning: `check` still exits 0.
    pub fn warn(check: Check, detail: impl Into<String>) -> Self {
        Finding {
            warning: true,
            ..Finding::pass(check, detail)
        }
    }
}

/// Whether `host`, as a connection string names it, is this machine: a Unix
/// socket (a path), `localhost` (or a name under `.localhost`), a loopback
/// address (127.0.0.0/8, ::1), or SQL Server's `.` and `(local)`. Names are
/// not resolved: any other name counts as another machine.
pub fn is_local_host(host: &str) -> bool {
    let host = host.trim();
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let name = bare.trim_end_matches('.').to_ascii_lowercase();
    host.starts_with('/')
        || host.starts_with('@')
        || name == "localhost"
        || name.ends_with(".localhost")
        || host == "."
        || name == "(local)"
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The `tls` finding for a session sent in the clear to `host`, another
/// machine: a warning (anyone on the path reads the events and can act as
/// the server), never a failure. `fix` says how to turn TLS on.
pub fn plaintext_to(host: &str, fix: &str) -> Finding {
    Finding::warn(
        Check::Tls,
        format!(
            "off: not encrypted, to {host}, which is not this machine: whoever is on the network path reads every event and could answer as the server; {fix}"
        ),
    )
}

/// The shape verdict over a preflight's findings: `Err` names every shape
/// check that failed, with its detail.
pub fn shape_verdict(findings: &[Finding]) -> Result<(), String> {
    let differs: Vec<String> = findings
        .iter()
        .filter(|f| !f.ok && f.check.is_shape())
        .map(|f| format!("{}: {}", f.what, f.detail))
        .collect();
    if differs.is_empty() {
        Ok(())
    } else {
        Err(differs.join("; "))
    }
}

/// The watermark table's finding, from the facts. `expected` lists, for
/// each column gap-healer writes, the `name type` forms the engine accepts
/// (the first is the one its DDL creates and the message names).
/// What `check` tells a user to run for a missing or unreadable watermark
/// table: the exact `gap-healer sql` command for this store and login.
pub fn watermark_fix(engine: &str, schema: &str, table: &str, login: Option<&str>) -> String {
    let role = login.map_or_else(|| "<healer_role>".to_string(), str::to_string);
    format!(
        "as the owner of {schema}, run what `gap-healer sql --engine {engine} --schema {schema} \
         --watermark-table {table} --role {role}` prints (it creates the table, and its schema if needed)"
    )
}

pub fn watermark_verdict(
    table: &str,
    exists: bool,
    columns: &[String],
    expected: &[&[&str]],
    store_is_unique: bool,
    writable: bool,
    fix: &str,
) -> Finding {
    if !exists {
        return Finding::fail(Check::Watermark, format!("{table} does not exist: {fix}"));
    }
    let missing: Vec<&str> = expected
        .iter()
        .filter(|forms| !columns.iter().any(|have| forms.contains(&have.as_str())))
        .map(|forms| forms[0])
        .collect();
    if !missing.is_empty() {
        return Finding::fail(
            Check::Watermark,
            format!(
                "{table} lacks the column(s) {} (it has {}): {fix}",
                missing.join(", "),
                columns.join(", ")
            ),
        );
    }
    if !store_is_unique {
        return Finding::fail(
            Check::Watermark,
            format!("{table} has no unique key on store alone (the upsert needs it): {fix}"),
        );
    }
    if !writable {
        return Finding::fail(
            Check::Watermark,
            format!("this login may not SELECT, INSERT and UPDATE {table}: {fix}"),
        );
    }
    Finding::pass(
        Check::Watermark,
        format!("{table}: published here, one row per store"),
    )
}

/// A watermark row describes one table (`mine`, database.schema.table):
/// refuses a row of another (`owner`) or of none, naming both and the way
/// out. `table` is the watermark table, `store` the row's store name.
pub fn watermark_owner(
    table: &str,
    store: &str,
    owner: Option<&str>,
    mine: &str,
) -> crate::engine::DbResult<()> {
    match owner {
        Some(owner) if owner == mine => Ok(()),
        Some(owner) => Err(crate::engine::DbError::permanent(format!(
            "the watermark row of store '{store}' in {table} describes {owner}, not {mine}: \
             another healer's store of that name publishes there; give the stores distinct \
             names (`name` of a [[stores]] entry) or their own watermark tables"
        ))),
        None => Err(crate::engine::DbError::permanent(format!(
            "the watermark row of store '{store}' in {table} names no healed table (made by an \
             older gap-healer): if it is this store's, run UPDATE {table} SET healed_table = \
             '{mine}' WHERE store = '{store}'"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failed_shape_checks_refuse_the_store() {
        let findings = [
            Finding::pass(Check::Connection, "PostgreSQL 15"),
            Finding::fail(Check::Rights, "missing INSERT"),
            Finding::fail(Check::TombstoneStream, "inconsistent"),
        ];
        assert_eq!(shape_verdict(&findings), Ok(()));
        let findings = [
            Finding::pass(Check::Schema, "exists"),
            Finding::fail(Check::GlobalPosition, "no unique key on it"),
            Finding::fail(Check::MessagesColumns, "missing: created"),
        ];
        assert_eq!(
            shape_verdict(&findings),
            Err("global position: no unique key on it; messages columns: missing: created".into())
        );
    }

    #[test]
    fn local_hosts_are_this_machine_and_the_others_are_not() {
        for local in [
            "localhost",
            "LOCALHOST",
            "localhost.",
            "db.localhost",
            "127.0.0.1",
            "127.1.2.3",
            "::1",
            "[::1]",
            "/var/run/postgresql",
            "@abstract",
            ".",
            "(local)",
        ] {
            assert!(is_local_host(local), "{local}");
        }
        for remote in [
            "db",
            "db.example.com",
            "10.0.0.5",
            "192.0.2.2",
            "[2001:db8::1]",
            "localhost.example.com",
            "0.0.0.0",
        ] {
            assert!(!is_local_host(remote), "{remote}");
        }
        let w = plaintext_to("db.example.com", "set sslmode=verify-full");
        assert!(w.ok && w.warning && w.check == Check::Tls, "{w:?}");
        assert!(
            w.detail.contains("db.example.com") && w.detail.ends_with("set sslmode=verify-full")
        );
    }

    #[test]
    fn labels_are_distinct() {
        let all = [
            Check::Configuration,
            Check::Connection,
            Check::Tls,
            Check::Schema,
            Check::MessagesTable,
            Check::StreamsTable,
            Check::Table,
            Check::TombstoneColumns,
            Check::GlobalPosition,
            Check::MessagesColumns,
            Check::StreamsColumns,
            Check::Checkpoints,
            Check::Rights,
            Check::ReadRights,
            Check::TombstoneStream,
            Check::FillMode,
            Check::FillProcedure,
            Check::IdentityCache,
            Check::ReadCommittedSnapshot,
            Check::OptimizedLocking,
            Check::AcceleratedDatabaseRecovery,
            Check::Updateability,
            Check::Preflight,
        ];
        let labels: std::collections::HashSet<_> = all.iter().map(|c| c.label()).collect();
        assert_eq!(labels.len(), all.len());
    }

    #[test]
    fn a_watermark_row_of_another_table_or_of_none_is_refused_with_the_way_out() {
        assert!(watermark_owner("g.w", "default", Some("db.a.messages"), "db.a.messages").is_ok());
        let other = watermark_owner("g.w", "default", Some("db.a.messages"), "db.b.messages")
            .unwrap_err()
            .message;
        assert!(
            other.contains("describes db.a.messages, not db.b.messages"),
            "{other}"
        );
        assert!(other.contains("distinct names"), "{other}");
        let none = watermark_owner("g.w", "default", None, "db.b.messages")
            .unwrap_err()
            .message;
        assert!(
            none.contains("UPDATE g.w SET healed_table = 'db.b.messages' WHERE store = 'default'"),
            "{none}"
        );
    }
}
