//! `gap-healer check` for SQL Server: what `sql/mssql/preflight.sql` returns,
//! and what the engine learnt about the installed fill procedure
//! ([`ProcedureState`], also how the engine picks its fill mode), turned into
//! findings. Pure functions, so every verdict has a unit test.

use tiberius::Row;

use super::sql::quote_ident;
use super::{run, MssqlEngine};
use crate::engine::{Check, DbResult, Finding, Ident};

/// The login's rights, as HAS_PERMS_BY_NAME answers them (NULL = no).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rights {
    pub messages_select: bool,
    pub messages_insert: bool,
    pub messages_alter: bool,
    pub streams_select: bool,
    pub streams_insert: bool,
    pub streams_update: bool,
    pub checkpoints_select: bool,
}

/// The first result set of `preflight.sql`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Facts {
    pub product_version: String,
    pub edition: String,
    pub engine_edition: Option<i32>,
    pub database: String,
    pub login: String,
    pub user: String,
    pub schema_exists: bool,
    pub messages_exists: bool,
    pub streams_exists: bool,
    pub checkpoints_exists: bool,
    /// `None`: absent, or the login may not read its definition.
    pub procedure_current: Option<bool>,
    pub global_position_clustered_pk: bool,
    /// A unique index keyed exactly on GlobalPosition, without IGNORE_DUP_KEY.
    pub global_position_unique: bool,
    /// `Some("Babelfish 4.2.0")` on Babelfish (from the engine, not the query).
    pub babelfish: Option<String>,
    pub identity_seed: Option<i64>,
    pub identity_increment: Option<i64>,
    pub identity_current: Option<i64>,
    pub read_committed_snapshot: Option<bool>,
    pub identity_cache: Option<i32>,
    /// `DATABASEPROPERTYEX(DB_NAME(), 'Updateability')`: READ_WRITE or READ_ONLY.
    pub updateability: Option<String>,
    /// `DATABASEPROPERTYEX(DB_NAME(), 'IsOptimizedLockingOn')`; `None` where
    /// the server does not know the property (before SQL Server 2025).
    pub optimized_locking: Option<i32>,
    /// `sys.databases.is_accelerated_database_recovery_on`; `None` where the
    /// column does not exist (before SQL Server 2019).
    pub accelerated_recovery: Option<bool>,
    pub rights: Rights,
}

/// A row of the second result set of `preflight.sql`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Column {
    pub table: String,
    pub name: String,
    pub type_name: String,
    pub identity: bool,
    /// Whether an insert must give it a value: NOT NULL, no default, not
    /// computed, not the identity.
    pub required: bool,
}

fn text(row: &Row, col: &str) -> tiberius::Result<String> {
    Ok(row.try_get::<&str, _>(col)?.unwrap_or_default().to_string())
}

fn flag(row: &Row, col: &str) -> tiberius::Result<bool> {
    Ok(row.try_get::<bool, _>(col)?.unwrap_or(false))
}

fn perm(row: &Row, col: &str) -> tiberius::Result<bool> {
    Ok(row.try_get::<i32, _>(col)? == Some(1))
}

impl Facts {
    pub(crate) fn from_row(row: &Row) -> tiberius::Result<Facts> {
        Ok(Facts {
            product_version: text(row, "product_version")?,
            edition: text(row, "edition")?,
            engine_edition: row.try_get::<i32, _>("engine_edition")?,
            database: text(row, "database_name")?,
            login: text(row, "login_name")?,
            user: text(row, "user_name")?,
            schema_exists: flag(row, "schema_exists")?,
            messages_exists: flag(row, "messages_exists")?,
            streams_exists: flag(row, "streams_exists")?,
            checkpoints_exists: flag(row, "checkpoints_exists")?,
            procedure_current: row.try_get::<bool, _>("procedure_current")?,
            global_position_clustered_pk: flag(row, "global_position_clustered_pk")?,
            global_position_unique: flag(row, "global_position_unique")?,
            babelfish: None,
            identity_seed: row.try_get::<i64, _>("identity_seed")?,
            identity_increment: row.try_get::<i64, _>("identity_increment")?,
            identity_current: row.try_get::<i64, _>("identity_current")?,
            read_committed_snapshot: row.try_get::<bool, _>("read_committed_snapshot")?,
            identity_cache: row.try_get::<i32, _>("identity_cache")?,
            updateability: row.try_get::<&str, _>("updateability")?.map(str::to_string),
            optimized_locking: row.try_get::<i32, _>("optimized_locking")?,
            accelerated_recovery: row.try_get::<bool, _>("accelerated_recovery")?,
            rights: Rights {
                messages_select: perm(row, "messages_select")?,
                messages_insert: perm(row, "messages_insert")?,
                messages_alter: perm(row, "messages_alter")?,
                streams_select: perm(row, "streams_select")?,
                streams_insert: perm(row, "streams_insert")?,
                streams_update: perm(row, "streams_update")?,
                checkpoints_select: perm(row, "checkpoints_select")?,
            },
        })
    }
}

impl Column {
    pub(crate) fn from_row(row: &Row) -> tiberius::Result<Column> {
        Ok(Column {
            table: text(row, "table_name")?,
            name: text(row, "column_name")?,
            type_name: text(row, "type_name")?,
            identity: flag(row, "is_identity")?,
            required: !flag(row, "is_nullable")?
                && !flag(row, "is_identity")?
                && !flag(row, "is_computed")?
                && !flag(row, "has_default")?,
        })
    }
}

/// The installed fill procedure, as this login and this configuration see it
/// (`sql/mssql/fill_mode.sql`, then a describing call of the procedure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ProcedureState {
    /// Not installed, or invisible to the login.
    Absent,
    /// Installed, but the login may not EXECUTE it.
    NoExecute,
    /// Another parameter list than this version's procedure: an older
    /// gap-healer's (which took the tombstone stream and type as parameters)
    /// or something else of that name.
    OtherInterface {
        parameters: Vec<String>,
        expected: Vec<String>,
    },
    /// Made for another tombstone stream or type than this configuration's.
    OtherTombstones { stream: String, kind: String },
    /// The describing call failed or answered something unexpected.
    Unanswered(String),
    /// This version's procedure, for this configuration's tombstones.
    Usable,
    /// The server cannot run the procedure as its owner (Babelfish has no
    /// `EXECUTE AS OWNER`): direct mode only.
    Unsupported(String),
    /// Installed and executable, but SQL Server refuses to run it as its
    /// owner (error 15517): the database's owner (dbo) maps to no login of
    /// this server (a database restored from another one), or the owner is
    /// a role. `message` is the server's.
    CannotImpersonate { database: String, message: String },
}

/// Cannot execute as the database principal (`EXECUTE AS OWNER` whose owner
/// cannot be impersonated).
pub(crate) const CANNOT_IMPERSONATE: &str = "15517";

/// What makes `EXECUTE AS OWNER` work again after error 15517.
pub(crate) fn impersonation_fix(database: &str, procedure: &str) -> String {
    format!(
        "give the database an owner this server knows: ALTER AUTHORIZATION ON DATABASE::{} TO [sa]; \
         (or another login of this server; a database restored from another server keeps a dbo whose \
         SID maps to no login here), or, when the procedure's owner is a role (the schema is owned by \
         one), ALTER AUTHORIZATION ON OBJECT::{procedure} TO [dbo];",
        quote_ident(database)
    )
}

impl ProcedureState {
    /// From fill_mode.sql's answer alone; `None` when the procedure has the
    /// expected parameters and must be asked for its tombstones.
    pub(crate) fn from_catalog(
        exists: bool,
        execute: bool,
        parameters: &[String],
        expected: &[String],
    ) -> Option<ProcedureState> {
        if !exists {
            Some(ProcedureState::Absent)
        } else if !execute {
            Some(ProcedureState::NoExecute)
        } else if !parameters
            .iter()
            .map(|p| p.to_lowercase())
            .eq(expected.iter().map(|p| p.to_lowercase()))
        {
            Some(ProcedureState::OtherInterface {
                parameters: parameters.to_vec(),
                expected: expected.to_vec(),
            })
        } else {
            None
        }
    }

    /// From the tombstones the procedure says it writes. Compared exactly:
    /// the stream's row is found by `StreamName = @stream_name` under the
    /// column's collation, but the healer's own checks and its users compare
    /// the configured text.
    pub(crate) fn from_description(
        stream: &str,
        kind: &str,
        want_stream: &str,
        want_kind: &str,
    ) -> ProcedureState {
        if stream == want_stream && kind == want_kind {
            ProcedureState::Usable
        } else {
            ProcedureState::OtherTombstones {
                stream: stream.to_string(),
                kind: kind.to_string(),
            }
        }
    }

    pub(crate) fn usable(&self) -> bool {
        *self == ProcedureState::Usable
    }

    /// Why an installed procedure is not used, or `None` (usable, absent, or
    /// not executable: nothing wrong with the procedure itself).
    pub(crate) fn problem(
        &self,
        procedure: &str,
        want_stream: &str,
        want_kind: &str,
    ) -> Option<String> {
        let fix = "procedure mode is not used until it is created again for this configuration: run \
                   `gap-healer install` (or the script of `gap-healer sql --engine mssql`) with this \
                   schema, tombstone stream and tombstone type";
        match self {
            ProcedureState::OtherInterface {
                parameters,
                expected,
            } => {
                let has = |name: &str| parameters.iter().any(|p| p.eq_ignore_ascii_case(name));
                let what = if has("@stream_name") {
                    "an older gap-healer's procedure, which let its caller choose the tombstone stream \
                     and type"
                } else if has("@start") {
                    "an older gap-healer's procedure, which filled one range per call"
                } else {
                    "not this gap-healer version's procedure"
                };
                Some(format!(
                    "{procedure} has the parameters ({}), not ({}): {what}; {fix}",
                    parameters.join(", "),
                    expected.join(", "),
                ))
            }
            ProcedureState::OtherTombstones { stream, kind } => Some(format!(
                "{procedure} writes tombstones of type {kind:?} into stream {stream:?}, but this \
                 configuration's are type {want_kind:?} in stream {want_stream:?}; {fix}"
            )),
            ProcedureState::Unanswered(why) => Some(format!(
                "{procedure} did not say which tombstones it writes ({why}); {fix}"
            )),
            ProcedureState::CannotImpersonate { database, message } => Some(format!(
                "{procedure} cannot run as its owner (error 15517: {message}): procedure mode cannot \
                 fill; {}",
                impersonation_fix(database, procedure)
            )),
            ProcedureState::Absent
            | ProcedureState::NoExecute
            | ProcedureState::Usable
            | ProcedureState::Unsupported(_) => None,
        }
    }
}

/// The tombstone stream and type this configuration wants.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tombstones<'a> {
    pub stream: &'a str,
    pub kind: &'a str,
}

/// (column, type) of the Eventuous tables gap-healer relies on.
const MESSAGES: [(&str, &str); 8] = [
    ("MessageId", "uniqueidentifier"),
    ("MessageType", "nvarchar"),
    ("StreamId", "int"),
    ("StreamPosition", "int"),
    ("GlobalPosition", "bigint"),
    ("JsonData", "nvarchar"),
    ("JsonMetadata", "nvarchar"),
    ("Created", "datetime2"),
];
const STREAMS: [(&str, &str); 3] = [
    ("StreamId", "int"),
    ("StreamName", "nvarchar"),
    ("Version", "int"),
];
const CHECKPOINTS: [(&str, &str); 2] = [("Id", "nvarchar"), ("Position", "bigint")];

/// Columns of `table` that are missing or of another type, as text.
pub(crate) fn shape_problems(
    table: &str,
    expected: &[(&str, &str)],
    columns: &[Column],
) -> Vec<String> {
    expected
        .iter()
        .filter_map(|(name, ty)| {
            match columns
                .iter()
                .find(|c| c.table.eq_ignore_ascii_case(table) && c.name.eq_ignore_ascii_case(name))
            {
                None => Some(format!("no column {name}")),
                Some(c) if !c.type_name.eq_ignore_ascii_case(ty) => {
                    Some(format!("{name} is {} (expected {ty})", c.type_name))
                }
                Some(_) => None,
            }
        })
        .collect()
}

pub(crate) fn identity_of<'a>(
    table: &str,
    column: &str,
    columns: &'a [Column],
) -> Option<&'a Column> {
    columns.iter().find(|c| {
        c.table.eq_ignore_ascii_case(table) && c.name.eq_ignore_ascii_case(column) && c.identity
    })
}

/// One GRANT line per table for what is missing.
pub(crate) fn grant(what: &[(&str, bool)], object: &str, user: &str) -> Option<String> {
    let missing: Vec<&str> = what
        .iter()
        .filter(|(_, has)| !has)
        .map(|(p, _)| *p)
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "GRANT {} ON OBJECT::{object} TO {user};",
            missing.join(", ")
        )
    })
}

/// The database options `check` shows: updateability (a failure when the
/// database is read-only: every fill would fail with 3906), RCSI, optimized
/// locking and accelerated database recovery (facts the safety argument in
/// docs/sqlserver.md names; what Babelfish lacks is said to be unknown there).
pub(crate) fn database_options(f: &Facts) -> Vec<Finding> {
    let on_babelfish = f.babelfish.is_some();
    let unknown_on_babelfish = |what: &str| format!("unknown on Babelfish ({what})");
    let mut out = Vec::new();
    out.push(match f.updateability.as_deref() {
        Some(u) if u.eq_ignore_ascii_case("READ_ONLY") => Finding::fail(
            Check::Updateability,
            format!(
                "READ_ONLY: database {} cannot be written (a readable secondary replica, or set READ_ONLY), \
                 so every fill fails with 3906; connect gap-healer to the primary (the availability group \
                 listener without ApplicationIntent=ReadOnly) or make the database READ_WRITE",
                f.database
            ),
        ),
        Some(u) => Finding::pass(Check::Updateability, u.to_string()),
        None if on_babelfish => Finding::pass(
            Check::Updateability,
            unknown_on_babelfish("no DATABASEPROPERTYEX Updateability was asked; fills say so if they fail"),
        ),
        None => Finding::pass(Check::Updateability, "unknown (DATABASEPROPERTYEX answered NULL)"),
    });
    out.push(Finding::pass(
        Check::ReadCommittedSnapshot,
        match (f.read_committed_snapshot, on_babelfish) {
            (_, true) => unknown_on_babelfish(
                "no READ_COMMITTED_SNAPSHOT switch: PostgreSQL's reads are snapshots, and gap-healer's \
                 READPAST reads skip what open appends hold",
            ),
            (Some(true), false) => "on: readers see row versions; gap-healer reads with READCOMMITTEDLOCK + READPAST, correct either way".into(),
            (Some(false), false) => "off: locking read committed; gap-healer's reads skip rows of open appends (READPAST) instead of waiting".into(),
            (None, false) => "unknown (sys.databases not readable); gap-healer's reads are correct either way".into(),
        },
    ));
    out.push(Finding::pass(
        Check::OptimizedLocking,
        match (f.optimized_locking, on_babelfish) {
            (_, true) => unknown_on_babelfish("no optimized locking: PostgreSQL's row locks"),
            (Some(1), false) => "on: an open append holds an X lock on its transaction id to its end, not on its \
                                 keys; Microsoft documents that other transactions take an S lock on that id to \
                                 check it is still active, not that a duplicate-key check does (the SQL Server 2025 \
                                 workflow's lock cases test it): see docs/sqlserver.md, optimized locking"
                .into(),
            (Some(_), false) => "off: key locks as always".into(),
            (None, false) => "not available (SQL Server before 2025): key locks as always".into(),
        },
    ));
    out.push(Finding::pass(
        Check::AcceleratedDatabaseRecovery,
        match (f.accelerated_recovery, on_babelfish) {
            (_, true) => unknown_on_babelfish("PostgreSQL's MVCC has no such switch"),
            (Some(true), false) => "on: rollbacks are instant (aborted rows are cleaned up later; a NOLOCK \
                                    read may show them meanwhile, which gap-healer treats as advice only)"
                .into(),
            (Some(false), false) => "off".into(),
            (None, false) => "not available (SQL Server before 2019)".into(),
        },
    ));
    out
}

/// The names `check` shows and grants on, quoted for T-SQL.
struct Names {
    schema: String,
    user: String,
    messages: String,
    streams: String,
    checkpoints: String,
    procedure: String,
}

impl Names {
    fn of(schema: &Ident, f: &Facts) -> Names {
        let s = schema.tsql();
        Names {
            user: quote_ident(if f.user.is_empty() {
                "gap_healer"
            } else {
                &f.user
            }),
            messages: format!("{s}.[Messages]"),
            streams: format!("{s}.[Streams]"),
            checkpoints: format!("{s}.[Checkpoints]"),
            procedure: format!("{s}.[gap_healer_fill]"),
            schema: s,
        }
    }
}

/// Every finding of `gap-healer check` for SQL Server.
pub(crate) fn findings(
    schema: &Ident,
    f: &Facts,
    columns: &[Column],
    state: &ProcedureState,
    want: Tombstones<'_>,
) -> Vec<Finding> {
    let names = Names::of(schema, f);
    let mut out = connection_and_schema(f, &names.schema);
    if !f.schema_exists {
        return out;
    }

    messages_table(&names, f, columns, &mut out);
    streams_table(&names, f, columns, &mut out);
    checkpoints_table(&names, f, columns, &mut out);
    out.extend(database_options(f));
    identity_cache(f, &mut out);
    fill_rights(&names, f, state, want, &mut out);
    out
}

/// The connection's findings and the schema's (`s`, bracketed): a failed
/// schema is the last finding (the caller stops when `!f.schema_exists`).
pub(crate) fn connection_and_schema(f: &Facts, s: &str) -> Vec<Finding> {
    let mut out = Vec::new();
    connection(f, &mut out);
    out.push(if f.schema_exists {
        Finding::pass(Check::Schema, format!("{s} exists"))
    } else {
        Finding::fail(
            Check::Schema,
            format!(
                "schema {s} not found in database {} (or the login may not see it)",
                f.database
            ),
        )
    });
    out
}

/// The server, database and login.
fn connection(f: &Facts, out: &mut Vec<Finding>) {
    let platform = match f.engine_edition {
        Some(5) => " (Azure SQL Database)",
        Some(8) => " (Azure SQL Managed Instance)",
        _ => "",
    };
    let server = match &f.babelfish {
        Some(b) => format!(
            "{b} (Babelfish for PostgreSQL, not SQL Server: SQL Server {} compatible)",
            f.product_version
        ),
        None => format!("SQL Server {} {}{platform}", f.product_version, f.edition),
    };
    out.push(Finding::pass(
        Check::Connection,
        format!(
            "{server}; database {}, login {} as user {}",
            f.database, f.login, f.user
        ),
    ));
}

/// Messages: the shape the scan, the probe and the fill rely on.
fn messages_table(n: &Names, f: &Facts, columns: &[Column], out: &mut Vec<Finding>) {
    let messages = &n.messages;
    if !f.messages_exists {
        out.push(Finding::fail(
            Check::MessagesTable,
            format!("{messages} not found (or the login may not see it)"),
        ));
    } else {
        let mut problems = shape_problems("Messages", &MESSAGES, columns);
        if identity_of("Messages", "GlobalPosition", columns).is_none() {
            problems.push("GlobalPosition is not an IDENTITY column".into());
        }
        if f.identity_increment.is_some_and(|i| i != 1) {
            problems.push(format!(
                "the identity increment is {} (expected 1)",
                f.identity_increment.unwrap_or(0)
            ));
        }
        if !f.global_position_unique {
            problems.push(
                "no unique index keyed exactly on (GlobalPosition) without IGNORE_DUP_KEY: a fill would \
                 neither wait on an open append's key nor fail on a committed one, so it could take a \
                 slow append's position"
                    .into(),
            );
        } else if !f.global_position_clustered_pk && f.babelfish.is_none() {
            problems.push(
                "the clustered primary key is not (GlobalPosition): scans would not be index range reads, \
                 and an append would write its (GlobalPosition) key only after the clustered index, so it \
                 could wait on another unique key with its position drawn and no key for a tombstone to \
                 wait on (Eventuous's table clusters on GlobalPosition)"
                    .into(),
            );
        }
        if problems.is_empty() {
            out.push(Finding::pass(
                Check::MessagesTable,
                format!(
                    "GlobalPosition BIGINT IDENTITY({}, 1), clustered primary key; current identity {}",
                    f.identity_seed.map_or("?".into(), |v| v.to_string()),
                    f.identity_current.map_or("?".into(), |v| v.to_string()),
                ),
            ));
        } else {
            out.push(Finding::fail(
                Check::MessagesTable,
                format!("{messages}: {}", problems.join("; ")),
            ));
        }
    }
}

/// Streams: the tombstone stream's row.
fn streams_table(n: &Names, f: &Facts, columns: &[Column], out: &mut Vec<Finding>) {
    let streams = &n.streams;
    if !f.streams_exists {
        out.push(Finding::fail(
            Check::StreamsTable,
            format!("{streams} not found (or the login may not see it)"),
        ));
    } else {
        let mut problems = shape_problems("Streams", &STREAMS, columns);
        if identity_of("Streams", "StreamId", columns).is_none() {
            problems.push("StreamId is not an IDENTITY column".into());
        }
        if problems.is_empty() {
            out.push(Finding::pass(
                Check::StreamsTable,
                "StreamId, StreamName, Version as Eventuous creates them",
            ));
        } else {
            out.push(Finding::fail(
                Check::StreamsTable,
                format!("{streams}: {}", problems.join("; ")),
            ));
        }
    }
}

/// Checkpoints: optional, read by `--start-from checkpoints`.
fn checkpoints_table(n: &Names, f: &Facts, columns: &[Column], out: &mut Vec<Finding>) {
    let (checkpoints, user) = (&n.checkpoints, &n.user);
    if !f.checkpoints_exists {
        out.push(Finding::pass(
            Check::Checkpoints,
            format!(
                "{checkpoints} absent: fine (subscriptions may keep checkpoints elsewhere); \
                 start with --start-from head or a position"
            ),
        ));
    } else {
        let problems = shape_problems("Checkpoints", &CHECKPOINTS, columns);
        if !problems.is_empty() {
            out.push(Finding::fail(
                Check::Checkpoints,
                format!("{checkpoints}: {}", problems.join("; ")),
            ));
        } else if !f.rights.checkpoints_select {
            out.push(Finding::fail(
                Check::Checkpoints,
                format!("no SELECT on {checkpoints} (needed by --start-from checkpoints): GRANT SELECT ON OBJECT::{checkpoints} TO {user};"),
            ));
        } else {
            out.push(Finding::pass(
                Check::Checkpoints,
                format!("{checkpoints} present and readable"),
            ));
        }
    }
}

/// What the identity cache can skip.
pub(crate) fn identity_cache(f: &Facts, out: &mut Vec<Finding>) {
    out.push(Finding::pass(
        Check::IdentityCache,
        match f.identity_cache {
            Some(0) => "IDENTITY_CACHE = OFF: restarts and failovers do not skip positions".to_string(),
            Some(_) => "IDENTITY_CACHE = ON (the default): an unclean shutdown or failover can skip up to 10,000 \
                        positions at once; gap-healer fills such a jump in transactions of at most 4,000 rows. \
                        ALTER DATABASE SCOPED CONFIGURATION SET IDENTITY_CACHE = OFF prevents the jumps"
                .to_string(),
            None => "unknown (no IDENTITY_CACHE option before SQL Server 2017: the cache is always on)".to_string(),
        },
    ));
}

/// The read rights, and the fill mode the login can use (procedure or direct), or what each mode lacks.
fn fill_rights(
    n: &Names,
    f: &Facts,
    state: &ProcedureState,
    want: Tombstones<'_>,
    out: &mut Vec<Finding>,
) {
    let (messages, procedure, user) = (&n.messages, &n.procedure, &n.user);
    let r = &f.rights;
    if !r.messages_select {
        out.push(Finding::fail(
            Check::ReadRights,
            format!("no SELECT on {messages}: scans need it. GRANT SELECT ON OBJECT::{messages} TO {user};"),
        ));
    } else {
        out.push(Finding::pass(
            Check::ReadRights,
            format!("SELECT on {messages}"),
        ));
    }

    let direct_missing = direct_grants_missing(n, r);
    let direct_ok = direct_missing.is_empty();

    if let Some(problem) = state.problem(procedure, want.stream, want.kind) {
        out.push(Finding::fail(Check::FillProcedure, problem));
    }
    if state.usable() {
        out.push(Finding::pass(
            Check::FillMode,
            format!(
                "procedure mode: EXECUTE on {procedure}, which runs as its owner (no ALTER needed) and \
                 writes tombstones of type {:?} into stream {:?} only",
                want.kind, want.stream
            ),
        ));
        if f.procedure_current == Some(false) {
            out.push(Finding::fail(
                Check::FillProcedure,
                format!("{procedure} is from another gap-healer version: run `gap-healer install`"),
            ));
        }
    } else if direct_ok {
        let why = match state {
            ProcedureState::Absent => format!("{procedure} is not installed"),
            ProcedureState::NoExecute => {
                format!("{procedure} exists but the login may not EXECUTE it")
            }
            ProcedureState::Unsupported(why) => format!("direct mode only on {why}"),
            _ => format!("{procedure} is not used: see \"fill procedure\""),
        };
        out.push(Finding::pass(
            Check::FillMode,
            format!("direct mode: ALTER, INSERT, SELECT on Messages; SELECT, INSERT, UPDATE on Streams ({why})"),
        ));
    } else {
        let procedure_missing = procedure_missing(state, procedure, user);
        out.push(Finding::fail(
            Check::FillMode,
            format!(
                "the login can fill in neither mode. Procedure mode needs {procedure_missing} \
                 Direct mode needs {}",
                direct_missing.join(" ")
            ),
        ));
    }
}

/// The grants direct mode lacks, as statements.
fn direct_grants_missing(n: &Names, r: &Rights) -> Vec<String> {
    let (messages, streams, user) = (&n.messages, &n.streams, &n.user);
    [
        grant(
            &[
                ("SELECT", r.messages_select),
                ("INSERT", r.messages_insert),
                ("ALTER", r.messages_alter),
            ],
            messages,
            user,
        ),
        grant(
            &[
                ("SELECT", r.streams_select),
                ("INSERT", r.streams_insert),
                ("UPDATE", r.streams_update),
            ],
            streams,
            user,
        ),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// What procedure mode needs that it lacks, in words.
fn procedure_missing(state: &ProcedureState, procedure: &str, user: &str) -> String {
    match state {
        ProcedureState::Absent => {
            "the procedure: run `gap-healer install` (or the script of `gap-healer sql \
             --engine mssql`), then GRANT EXECUTE on it"
                .to_string()
        }
        ProcedureState::NoExecute => format!("GRANT EXECUTE ON OBJECT::{procedure} TO {user};"),
        ProcedureState::Unsupported(why) => {
            format!("a server that can run it (direct mode only on {why}).")
        }
        ProcedureState::CannotImpersonate { database, .. } => format!(
            "an owner SQL Server can impersonate (error 15517): {}",
            impersonation_fix(database, procedure)
        ),
        _ => "the procedure created again for this configuration (see \"fill procedure\")"
            .to_string(),
    }
}

impl MssqlEngine {
    /// The query step of `check`: `preflight.sql`'s two result sets and the
    /// fill procedure's state, judged by [`findings`].
    pub(crate) async fn preflight_findings(&self) -> DbResult<Vec<Finding>> {
        let (facts, columns) = match self.preflight_facts().await? {
            Ok(read) => read,
            Err(findings) => return Ok(findings),
        };
        let procedure = self
            .procedure_state()
            .await
            .unwrap_or_else(|e| ProcedureState::Unanswered(e.message));
        Ok(findings(
            &self.settings.schema,
            &facts,
            &columns,
            &procedure,
            Tombstones {
                stream: &self.settings.tombstone_stream,
                kind: &self.settings.tombstone_type,
            },
        ))
    }

    /// `preflight.sql`'s two result sets read (for a described table, the
    /// statement renamed for it): its facts and its columns, or the
    /// findings that say why they could not be read. `Err` only when
    /// nothing could be checked (no connection).
    pub(crate) async fn preflight_facts(
        &self,
    ) -> DbResult<Result<(Facts, Vec<Column>), Vec<Finding>>> {
        let schema: &str = self.settings.schema.as_str();
        let mut session = self.checkout().await?;
        let result = run(&mut session.client, &self.sql.preflight, &[&schema]).await;
        if matches!(result, Ok(_) | Err(tiberius::error::Error::Server(_))) {
            session.clean = true;
        }
        drop(session);
        let sets = match result {
            Ok(sets) => sets,
            Err(e) => {
                return Ok(Err(vec![
                    Finding::pass(Check::Connection, "connected"),
                    Finding::fail(Check::Preflight, self.driver_error(&e).message),
                ]))
            }
        };
        let mut sets = sets.into_iter();
        let facts_rows = sets.next().unwrap_or_default();
        let column_rows = sets.next().unwrap_or_default();
        let Some(first) = facts_rows.first() else {
            return Ok(Err(vec![Finding::fail(
                Check::Preflight,
                "the preflight query returned no row",
            )]));
        };
        let mut facts = Facts::from_row(first).map_err(|e| self.driver_error(&e))?;
        facts.babelfish = self.server().await?.babelfish;
        let columns = column_rows
            .iter()
            .map(Column::from_row)
            .collect::<tiberius::Result<Vec<_>>>()
            .map_err(|e| self.driver_error(&e))?;
        Ok(Ok((facts, columns)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eventuous() -> Ident {
        Ident::parse("eventuous").unwrap()
    }

    fn col(table: &str, name: &str, ty: &str, identity: bool) -> Column {
        Column {
            table: table.into(),
            name: name.into(),
            type_name: ty.into(),
            identity,
            required: false,
        }
    }

    fn eventuous_columns() -> Vec<Column> {
        let mut cols: Vec<Column> = MESSAGES
            .iter()
            .map(|(n, t)| col("Messages", n, t, *n == "GlobalPosition"))
            .collect();
        cols.extend(
            STREAMS
                .iter()
                .map(|(n, t)| col("Streams", n, t, *n == "StreamId")),
        );
        cols.extend(
            CHECKPOINTS
                .iter()
                .map(|(n, t)| col("Checkpoints", n, t, false)),
        );
        cols
    }

    fn healthy() -> Facts {
        Facts {
            product_version: "16.0.4135.4".into(),
            edition: "Developer Edition (64-bit)".into(),
            engine_edition: Some(3),
            database: "orders".into(),
            login: "healer".into(),
            user: "healer".into(),
            schema_exists: true,
            messages_exists: true,
            streams_exists: true,
            checkpoints_exists: true,
            procedure_current: None,
            global_position_clustered_pk: true,
            global_position_unique: true,
            babelfish: None,
            identity_seed: Some(0),
            identity_increment: Some(1),
            identity_current: Some(41),
            read_committed_snapshot: Some(false),
            identity_cache: Some(1),
            updateability: Some("READ_WRITE".into()),
            optimized_locking: None,
            accelerated_recovery: Some(false),
            rights: Rights {
                messages_select: true,
                messages_insert: true,
                messages_alter: true,
                streams_select: true,
                streams_insert: true,
                streams_update: true,
                checkpoints_select: true,
            },
        }
    }

    const WANT: Tombstones<'static> = Tombstones {
        stream: "__tombstones__",
        kind: "$tombstone",
    };

    /// The findings for a store without the procedure.
    fn check(f: &Facts, columns: &[Column]) -> Vec<Finding> {
        findings(&eventuous(), f, columns, &ProcedureState::Absent, WANT)
    }

    fn expected() -> Vec<String> {
        [
            "@ranges",
            "@lock_timeout_ms",
            "@stream_lock_timeout_ms",
            "@leader_fence",
        ]
        .map(String::from)
        .to_vec()
    }

    fn v1() -> Vec<String> {
        [
            "@start",
            "@end",
            "@stream_name",
            "@message_type",
            "@lock_timeout_ms",
            "@stream_lock_timeout_ms",
        ]
        .map(String::from)
        .to_vec()
    }

    fn find(out: &[Finding], what: Check) -> &Finding {
        out.iter()
            .find(|f| f.check == what)
            .unwrap_or_else(|| panic!("no finding {what}: {out:#?}"))
    }

    #[test]
    fn healthy_store_in_direct_mode() {
        let out = check(&healthy(), &eventuous_columns());
        assert!(out.iter().all(|f| f.ok), "{out:#?}");
        assert!(find(&out, Check::FillMode)
            .detail
            .starts_with("direct mode"));
        assert!(find(&out, Check::IdentityCache)
            .detail
            .contains("IDENTITY_CACHE = OFF prevents"));
        assert!(find(&out, Check::Connection).detail.contains("16.0.4135.4"));
    }

    #[test]
    fn procedure_mode_with_exactly_its_rights() {
        let mut f = healthy();
        f.procedure_current = None; // EXECUTE does not let the login read the definition
        f.rights = Rights {
            messages_select: true,
            streams_select: true,
            checkpoints_select: true,
            ..Rights::default()
        };
        let usable = ProcedureState::Usable;
        let out = findings(&eventuous(), &f, &eventuous_columns(), &usable, WANT);
        assert!(out.iter().all(|f| f.ok), "{out:#?}");
        let mode = find(&out, Check::FillMode);
        assert!(mode.detail.starts_with("procedure mode"), "{mode:?}");
        assert!(mode.detail.contains("\"__tombstones__\""), "{mode:?}");

        f.procedure_current = Some(false);
        let out = findings(&eventuous(), &f, &eventuous_columns(), &usable, WANT);
        assert!(!find(&out, Check::FillProcedure).ok);
    }

    #[test]
    fn procedure_states_from_the_catalog_and_the_description() {
        let want = expected();
        assert_eq!(
            ProcedureState::from_catalog(false, false, &[], &want),
            Some(ProcedureState::Absent)
        );
        assert_eq!(
            ProcedureState::from_catalog(true, false, &want, &want),
            Some(ProcedureState::NoExecute)
        );
        // This version's parameters (sys.parameters may spell them in any case).
        assert_eq!(ProcedureState::from_catalog(true, true, &want, &want), None);
        let upper: Vec<String> = want.iter().map(|p| p.to_uppercase()).collect();
        assert_eq!(
            ProcedureState::from_catalog(true, true, &upper, &want),
            None
        );
        // Version 1: the caller chose the stream and type.
        let old = ProcedureState::from_catalog(true, true, &v1(), &want).unwrap();
        assert!(
            matches!(old, ProcedureState::OtherInterface { .. }),
            "{old:?}"
        );
        assert!(!old.usable());
        let why = old
            .problem("[eventuous].[gap_healer_fill]", "s", "t")
            .unwrap();
        assert!(why.contains("older gap-healer's procedure"), "{why}");
        assert!(
            why.contains("@stream_name") && why.contains("@leader_fence"),
            "{why}"
        );
        assert!(why.contains("gap-healer install"), "{why}");
        // Fewer, more, reordered or no parameters: another interface too.
        let more = [want.clone(), vec!["@x".to_string()]].concat();
        let mut swapped = want.clone();
        swapped.swap(0, 1);
        for other in [&want[..3], &more[..], &swapped[..], &[]] {
            assert!(
                matches!(
                    ProcedureState::from_catalog(true, true, other, &want),
                    Some(ProcedureState::OtherInterface { .. })
                ),
                "{other:?}"
            );
        }
        let why = ProcedureState::from_catalog(true, true, &more, &want)
            .unwrap()
            .problem("p", "s", "t")
            .unwrap();
        assert!(why.contains("not this gap-healer version's"), "{why}");

        assert_eq!(
            ProcedureState::from_description(
                "__tombstones__",
                "$tombstone",
                "__tombstones__",
                "$tombstone"
            ),
            ProcedureState::Usable
        );
        for (stream, kind) in [
            ("orders-1", "$tombstone"),
            ("__tombstones__", "Other"),
            ("__TOMBSTONES__", "$tombstone"),
        ] {
            let state =
                ProcedureState::from_description(stream, kind, "__tombstones__", "$tombstone");
            assert_eq!(
                state,
                ProcedureState::OtherTombstones {
                    stream: stream.into(),
                    kind: kind.into()
                }
            );
            let why = state
                .problem(
                    "[eventuous].[gap_healer_fill]",
                    "__tombstones__",
                    "$tombstone",
                )
                .unwrap();
            assert!(why.contains(&format!("{stream:?}")), "{why}");
            assert!(why.contains("procedure mode is not used"), "{why}");
        }
        for quiet in [
            ProcedureState::Absent,
            ProcedureState::NoExecute,
            ProcedureState::Usable,
        ] {
            assert_eq!(quiet.problem("p", "s", "t"), None);
        }
    }

    #[test]
    fn an_unusable_procedure_fails_check_and_falls_back_to_direct_mode() {
        let other = ProcedureState::OtherTombstones {
            stream: "orders-1".into(),
            kind: "$tombstone".into(),
        };
        let old = ProcedureState::from_catalog(true, true, &v1(), &expected()).unwrap();
        let unanswered = ProcedureState::Unanswered("error 229".into());
        for state in [&other, &old, &unanswered] {
            // With direct-mode rights: direct mode, and the procedure flagged.
            let out = findings(&eventuous(), &healthy(), &eventuous_columns(), state, WANT);
            let procedure = find(&out, Check::FillProcedure);
            assert!(!procedure.ok, "{state:?}");
            assert!(
                procedure.detail.contains("gap-healer install"),
                "{procedure:?}"
            );
            let mode = find(&out, Check::FillMode);
            assert!(
                mode.ok && mode.detail.starts_with("direct mode"),
                "{mode:?}"
            );
            assert!(mode.detail.contains("is not used"), "{mode:?}");

            // With procedure-mode rights only: neither mode.
            let mut f = healthy();
            f.rights = Rights {
                messages_select: true,
                streams_select: true,
                checkpoints_select: true,
                ..Rights::default()
            };
            let out = findings(&eventuous(), &f, &eventuous_columns(), state, WANT);
            let mode = find(&out, Check::FillMode);
            assert!(!mode.ok, "{mode:?}");
            assert!(
                mode.detail.contains("created again for this configuration"),
                "{mode:?}"
            );
        }
        let out = findings(&eventuous(), &healthy(), &eventuous_columns(), &other, WANT);
        assert!(find(&out, Check::FillProcedure)
            .detail
            .contains("\"orders-1\""));
    }

    /// Review finding F4: a procedure SQL Server cannot run as its owner
    /// (15517) fails `check` with the ALTER AUTHORIZATION fix, whether or
    /// not direct mode can fill instead.
    #[test]
    fn a_procedure_that_cannot_run_as_its_owner_is_named_with_the_fix() {
        let state = ProcedureState::CannotImpersonate {
            database: "orders".into(),
            message: "Cannot execute as the database principal because the principal \"dbo\" does not exist".into(),
        };
        assert!(!state.usable());
        let out = findings(&eventuous(), &healthy(), &eventuous_columns(), &state, WANT);
        let procedure = find(&out, Check::FillProcedure);
        assert!(!procedure.ok);
        for part in [
            "error 15517",
            "ALTER AUTHORIZATION ON DATABASE::[orders] TO [sa];",
            "ALTER AUTHORIZATION ON OBJECT::[eventuous].[gap_healer_fill] TO [dbo];",
        ] {
            assert!(procedure.detail.contains(part), "{part}: {procedure:?}");
        }
        let mode = find(&out, Check::FillMode);
        assert!(
            mode.ok && mode.detail.starts_with("direct mode"),
            "{mode:?}"
        );

        let mut f = healthy();
        f.rights.messages_alter = false;
        let out = findings(&eventuous(), &f, &eventuous_columns(), &state, WANT);
        let mode = find(&out, Check::FillMode);
        assert!(!mode.ok);
        assert!(
            mode.detail
                .contains("ALTER AUTHORIZATION ON DATABASE::[orders] TO [sa];"),
            "{mode:?}"
        );
    }

    #[test]
    fn neither_mode_names_the_missing_grants() {
        let mut f = healthy();
        f.rights = Rights {
            messages_select: true,
            streams_select: true,
            checkpoints_select: true,
            ..Rights::default()
        };
        let out = check(&f, &eventuous_columns());
        let mode = find(&out, Check::FillMode);
        assert!(!mode.ok);
        assert!(
            mode.detail
                .contains("GRANT INSERT, ALTER ON OBJECT::[eventuous].[Messages] TO [healer];"),
            "{}",
            mode.detail
        );
        assert!(
            mode.detail
                .contains("GRANT INSERT, UPDATE ON OBJECT::[eventuous].[Streams] TO [healer];"),
            "{}",
            mode.detail
        );
        assert!(
            mode.detail.contains("gap-healer install"),
            "{}",
            mode.detail
        );

        let out = findings(
            &eventuous(),
            &f,
            &eventuous_columns(),
            &ProcedureState::NoExecute,
            WANT,
        );
        assert!(find(&out, Check::FillMode)
            .detail
            .contains("GRANT EXECUTE ON OBJECT::[eventuous].[gap_healer_fill] TO [healer];"));
    }

    #[test]
    fn shape_problems_are_reported() {
        let mut cols = eventuous_columns();
        cols.retain(|c| !(c.table == "Messages" && c.name == "Created"));
        for c in cols.iter_mut().filter(|c| c.name == "GlobalPosition") {
            c.type_name = "int".into();
        }
        let mut f = healthy();
        f.global_position_clustered_pk = false;
        let out = check(&f, &cols);
        let m = find(&out, Check::MessagesTable);
        assert!(!m.ok);
        assert!(m.detail.contains("no column Created"), "{}", m.detail);
        assert!(
            m.detail.contains("GlobalPosition is int (expected bigint)"),
            "{}",
            m.detail
        );
        assert!(m.detail.contains("clustered primary key"), "{}", m.detail);
        assert!(m.detail.contains("no key for a tombstone"), "{}", m.detail);
    }

    #[test]
    fn absent_checkpoints_is_fine_and_missing_schema_stops() {
        let mut f = healthy();
        f.checkpoints_exists = false;
        f.rights.checkpoints_select = false;
        let cols: Vec<Column> = eventuous_columns()
            .into_iter()
            .filter(|c| c.table != "Checkpoints")
            .collect();
        let out = check(&f, &cols);
        let c = find(&out, Check::Checkpoints);
        assert!(c.ok && c.detail.contains("absent"), "{c:?}");

        f.schema_exists = false;
        let out = check(&f, &cols);
        assert_eq!(out.len(), 2);
        assert!(!find(&out, Check::Schema).ok);
    }

    #[test]
    fn reports_rcsi_and_identity_cache_states() {
        for (rcsi, word) in [
            (Some(true), "on:"),
            (Some(false), "off:"),
            (None, "unknown"),
        ] {
            let mut f = healthy();
            f.read_committed_snapshot = rcsi;
            let out = check(&f, &eventuous_columns());
            assert!(find(&out, Check::ReadCommittedSnapshot)
                .detail
                .starts_with(word));
        }
        let mut f = healthy();
        f.identity_cache = Some(0);
        let out = check(&f, &eventuous_columns());
        assert!(find(&out, Check::IdentityCache)
            .detail
            .starts_with("IDENTITY_CACHE = OFF"));
    }

    /// Review finding F6 and issue 11 item 4: `check` shows whether the
    /// database can be written, and the options the safety argument names,
    /// on every server generation.
    #[test]
    fn reports_updateability_optimized_locking_and_recovery() {
        let detail = |f: &Facts, c: Check| {
            let out = check(f, &eventuous_columns());
            let found = find(&out, c).clone();
            (found.ok, found.detail)
        };
        let mut f = healthy();
        assert_eq!(
            detail(&f, Check::Updateability),
            (true, "READ_WRITE".into())
        );
        f.updateability = Some("READ_ONLY".into());
        let (ok, why) = detail(&f, Check::Updateability);
        assert!(
            !ok && why.contains("3906") && why.contains("primary"),
            "{why}"
        );
        assert!(crate::engine::check::shape_verdict(&check(&f, &eventuous_columns())).is_ok());

        let f = healthy(); // SQL Server 2022: no optimized locking property
        assert!(detail(&f, Check::OptimizedLocking)
            .1
            .starts_with("not available"));
        assert_eq!(detail(&f, Check::AcceleratedDatabaseRecovery).1, "off");
        let mut f = healthy(); // SQL Server 2025 with optimized locking, ADR
        f.optimized_locking = Some(1);
        f.accelerated_recovery = Some(true);
        assert!(detail(&f, Check::OptimizedLocking).1.starts_with("on:"));
        assert!(detail(&f, Check::AcceleratedDatabaseRecovery)
            .1
            .starts_with("on:"));
        f.optimized_locking = Some(0);
        assert!(detail(&f, Check::OptimizedLocking).1.starts_with("off"));
        let mut f = healthy(); // SQL Server 2017
        f.accelerated_recovery = None;
        assert!(detail(&f, Check::AcceleratedDatabaseRecovery)
            .1
            .starts_with("not available"));

        let mut f = healthy();
        f.babelfish = Some("Babelfish 4.2.0".into());
        f.updateability = None;
        f.read_committed_snapshot = Some(false);
        for c in [
            Check::Updateability,
            Check::ReadCommittedSnapshot,
            Check::OptimizedLocking,
            Check::AcceleratedDatabaseRecovery,
        ] {
            let (ok, why) = detail(&f, c);
            assert!(ok && why.starts_with("unknown on Babelfish"), "{c}: {why}");
        }
    }

    /// Review finding F1: without a unique index keyed exactly on
    /// GlobalPosition (or with IGNORE_DUP_KEY) the store's shape is refused,
    /// so `run` never heals it; on Babelfish a non-clustered key is fine.
    #[test]
    fn a_position_without_a_unique_key_is_refused_as_shape() {
        let mut f = healthy();
        f.global_position_unique = false;
        let out = check(&f, &eventuous_columns());
        let why = crate::engine::check::shape_verdict(&out).unwrap_err();
        assert!(
            why.contains("no unique index keyed exactly on (GlobalPosition)"),
            "{why}"
        );

        let mut f = healthy();
        f.global_position_clustered_pk = false;
        f.babelfish = Some("Babelfish 4.2.0".into());
        let out = check(&f, &eventuous_columns());
        assert_eq!(crate::engine::check::shape_verdict(&out), Ok(()));
        assert!(find(&out, Check::Connection)
            .detail
            .starts_with("Babelfish 4.2.0 (Babelfish for PostgreSQL, not SQL Server"));
    }
}
