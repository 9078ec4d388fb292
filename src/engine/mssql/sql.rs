//! The T-SQL the engine runs, from `sql/mssql/*.sql`, with the schema put in.
//!
//! The schema is spliced into every statement: the config layer validated it
//! as a plain identifier, and it is bracketed here (`]` doubled, as QUOTENAME
//! does). Positions, the lock timeouts, the leader lock's name and the leader
//! fence are bound parameters (`@P1`, `@P2`, ...), and so are the tombstone
//! stream's name and type in every statement the engine runs as the login.
//!
//! One text is not a file: the fill procedure, which [`fill_procedure`]
//! builds from `fill.sql` (its DECLAREs become the parameters, the text
//! between its body markers the body), so the two fill modes cannot drift.
//! The procedure is the one text with values in it: the tombstone stream and
//! type are constants there ([`nvarchar_literal`]), fixed when it is created,
//! so that a login with only EXECUTE on it cannot make it write into any
//! other stream.
//!
//! On Babelfish a few texts are rewritten before they are sent: the leader
//! lock's and the fence's questions about application locks become looks
//! at PostgreSQL's lock manager: the leader lock's with its key (integers
//! the engine computed) spliced in ([`babelfish_applock_held_by_another`]),
//! the fence's with the leader's session and key bound in `@leader_fence`
//! ([`babelfish_fence_held`]).

use tiberius::ToSql;

use crate::engine::{DbError, DbResult, Ident};

/// Placeholder for the bracketed schema in the SQL files.
pub(crate) const SCHEMA_PLACEHOLDER: &str = "__schema__";

pub(crate) const HEAD: &str = include_str!("../../../sql/mssql/head.sql");
/// The heads of many stores of one instance (`super::heads`); names each
/// store's table itself, by three-part names.
pub(crate) const SHARED_HEADS: &str = include_str!("../../../sql/mssql/shared_heads.sql");
/// The checkpoints of many stores of one instance (`super::checkpoints`);
/// names each store's table itself, by three-part names.
pub(crate) const SHARED_CHECKPOINTS: &str =
    include_str!("../../../sql/mssql/shared_checkpoints.sql");
pub(crate) const SCAN: &str = include_str!("../../../sql/mssql/scan.sql");
pub(crate) const PROBE: &str = include_str!("../../../sql/mssql/probe.sql");
pub(crate) const CHECKPOINTS: &str = include_str!("../../../sql/mssql/checkpoints.sql");
pub(crate) const IDENTITY: &str = include_str!("../../../sql/mssql/identity.sql");
/// The fill: run as it is in direct mode, and the source of the procedure
/// ([`fill_procedure`]).
pub(crate) const FILL: &str = include_str!("../../../sql/mssql/fill.sql");
/// A described table's fill stages, in place of fill.sql's Eventuous ones
/// (`table.rs`).
pub(crate) const FILL_TABLE: &str = include_str!("../../../sql/mssql/fill_table.sql");
pub(crate) const FILL_CALL: &str = include_str!("../../../sql/mssql/fill_call.sql");
pub(crate) const FILL_MODE: &str = include_str!("../../../sql/mssql/fill_mode.sql");
pub(crate) const GRANTS: &str = include_str!("../../../sql/mssql/grants.sql");
pub(crate) const PREFLIGHT: &str = include_str!("../../../sql/mssql/preflight.sql");
pub(crate) const SERVER: &str = include_str!("../../../sql/mssql/server.sql");
pub(crate) const DATABASES: &str = include_str!("../../../sql/mssql/databases.sql");
/// The published watermark's statements: they name `__watermark__`, the
/// configured `schema.table`, not the store's schema.
pub(crate) const WATERMARK_READ: &str = include_str!("../../../sql/mssql/watermark_read.sql");
pub(crate) const WATERMARK_PUBLISH: &str = include_str!("../../../sql/mssql/watermark_publish.sql");
pub(crate) const WATERMARK_CHECK: &str = include_str!("../../../sql/mssql/watermark_check.sql");
pub(crate) const WATERMARK_TABLE: &str = include_str!("../../../sql/mssql/watermark_table.sql");
pub(crate) const SESSION_STATE: &str = include_str!("../../../sql/mssql/session_state.sql");
/// Babelfish only: a session after a fill batch a lock timeout ended, made
/// fit for the pool again.
pub(crate) const RESET_SESSION: &str = include_str!("../../../sql/mssql/reset_session.sql");
/// Babelfish only: other sessions' locks on Messages that block writers.
pub(crate) const TABLE_LOCKS: &str = include_str!("../../../sql/mssql/table_locks.sql");
/// The transactions that hold Messages open for writing (SQL Server).
pub(crate) const OPEN_TRANSACTIONS: &str = include_str!("../../../sql/mssql/open_transactions.sql");
/// The same on Babelfish, from PostgreSQL's `pg_locks`.
pub(crate) const OPEN_TRANSACTIONS_BABELFISH: &str =
    include_str!("../../../sql/mssql/open_transactions_babelfish.sql");
/// Takes the leader lock on a dedicated session. Names no schema: an
/// application lock belongs to the database, and its name is `@P1`.
pub(crate) const LEADER_LOCK: &str = include_str!("../../../sql/mssql/leader_lock.sql");
/// Whether the dedicated session still holds the leader lock named `@P1`.
pub(crate) const LEADER_CHECK: &str = include_str!("../../../sql/mssql/leader_check.sql");
/// Gives up the leader lock `@P1` and its fence `@P2`, keeping the session.
pub(crate) const LEADER_RELEASE: &str = include_str!("../../../sql/mssql/leader_release.sql");
/// Babelfish only: whether the leader's lock session holds what the engine
/// computed for its two application locks (see [`babelfish_applock_held_by_another`]).
pub(crate) const LEADER_KEYS_BABELFISH: &str =
    include_str!("../../../sql/mssql/leader_keys_babelfish.sql");

/// The one VALUES row of `probe.sql` that [`Sql::probe`] repeats.
const PROBE_ROW: &str = "(VALUES (@P1, @P2))";

/// Ranges per probe query: 2 parameters each, below SQL Server's 2,100.
pub(crate) const PROBE_CHUNK: usize = 1024;
const _: () = assert!(
    2 * PROBE_CHUNK < 2100,
    "SQL Server takes at most 2,100 parameters"
);

/// The marker comment in the procedure that `preflight.sql` looks for.
/// Version 2: the tombstone stream and type are constants of the procedure,
/// and it takes the leader fence. Version 3: it takes up to 1,000 ranges
/// (`@ranges`) instead of one (`@start`, `@end`).
pub(crate) const PROCEDURE_INTERFACE: &str = "gap-healer fill procedure, interface version 3";

/// The DECLAREs of `fill.sql` that are constants of the procedure, not its
/// parameters: the tombstone stream and type, fixed by `gap-healer install`.
pub(crate) const PROCEDURE_CONSTANTS: [&str; 2] = ["stream_name", "message_type"];

/// Longest tombstone stream name and type, in UTF-16 code units: the
/// NVARCHAR(850) and NVARCHAR(128) of fill.sql (and of Eventuous's
/// StreamName and MessageType), which would silently cut longer values.
pub(crate) const MAX_STREAM_UNITS: usize = 850;
pub(crate) const MAX_TYPE_UNITS: usize = 128;

/// The lines of `fill.sql` that delimit the procedure's body.
const BODY_BEGIN: &str = "-- BEGIN FILL BODY";
const BODY_END: &str = "-- END FILL BODY";

/// What the procedure says about itself, before `CREATE OR ALTER`.
const PROCEDURE_COMMENT: &str = "\
-- gap-healer, SQL Server: the fill procedure (procedure mode).
--
-- Created by `gap-healer install` (CREATE OR ALTER) and printed by
-- `gap-healer sql --engine mssql`. Built from sql/mssql/fill.sql: its
-- parameters are that file's DECLAREs but two (below) and its body is that
-- file's fill body, so it does exactly what a direct-mode fill does, WITH
-- EXECUTE AS OWNER:
-- SET IDENTITY_INSERT needs ALTER on Messages (or its ownership), which the
-- owner has, so the healer's login needs only EXECUTE on this procedure and
-- SELECT on the tables.
--
-- The tombstone stream and message type are NOT parameters: they are the
-- constants at the top of the body, fixed when the procedure is created
-- (gap-healer's configured tombstone_stream and tombstone_type). Whoever may
-- execute it can fill holes of Messages with tombstones of that one stream,
-- nothing else. To change them, create the procedure again.
--
-- Result: one row (rows_filled, error_number, error_stage, error_message,
-- open_transactions, stream_name, message_type); see the end of the body.
";
/// `[name]`, with `]` doubled as QUOTENAME does.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("[{}]", name.replace(']', "]]"))
}

/// A SQL file with the schema put in, bracketed.
pub(crate) fn render(template: &str, schema: &Ident) -> String {
    template.replace(SCHEMA_PLACEHOLDER, &schema.tsql())
}

/// A literal of the tombstone row, bound as its own parameter.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Bound {
    Text(String),
    Int(i64),
    Float(f64),
    Bit(bool),
}

impl Bound {
    pub(crate) fn as_sql(&self) -> &dyn ToSql {
        match self {
            Bound::Text(v) => v,
            Bound::Int(v) => v,
            Bound::Float(v) => v,
            Bound::Bit(v) => v,
        }
    }
}

/// A described table's fill batch and the literals it binds from
/// `@P8` on.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TableFill {
    pub text: String,
    pub literals: Vec<Bound>,
    /// `@P7`: the tombstone stream's `Streams.Id`, or '' without a row.
    pub stream_key: String,
}

/// Every statement of the engine, rendered once for one schema (and, in the
/// procedure, one tombstone stream and type).
#[derive(Clone, Debug)]
pub(crate) struct Sql {
    pub(crate) head: String,
    pub(crate) scan: String,
    pub(crate) probe: String,
    pub(crate) checkpoints: String,
    pub(crate) identity: String,
    pub(crate) fill: String,
    pub(crate) fill_procedure: String,
    /// The procedure's parameter names as sys.parameters lists them (`@ranges`, ...).
    pub(crate) procedure_parameters: Vec<String>,
    pub(crate) fill_call: String,
    pub(crate) fill_mode: String,
    pub(crate) preflight: String,
    pub(crate) session_state: String,
    pub(crate) reset_session: String,
    pub(crate) table_locks: String,
    pub(crate) open_transactions: String,
    pub(crate) open_transactions_babelfish: String,
    /// A described table's fill (profiles custom and sqlstreamstore), which
    /// runs in place of `fill` in direct mode; `None` for Eventuous's.
    pub(crate) table: Option<TableFill>,
}

impl Sql {
    pub(crate) fn new(
        schema: &Ident,
        tombstone_stream: &str,
        tombstone_type: &str,
    ) -> DbResult<Sql> {
        check_name("tombstone stream", tombstone_stream, MAX_STREAM_UNITS)?;
        check_name("tombstone type", tombstone_type, MAX_TYPE_UNITS)?;
        Ok(Sql {
            head: render(HEAD, schema),
            scan: render(SCAN, schema),
            probe: render(PROBE, schema),
            checkpoints: render(CHECKPOINTS, schema),
            identity: render(IDENTITY, schema),
            fill: render(FILL, schema),
            fill_procedure: render(&fill_procedure(tombstone_stream, tombstone_type), schema),
            procedure_parameters: procedure_parameters(FILL)
                .iter()
                .map(|(name, _, _)| format!("@{name}"))
                .collect(),
            fill_call: render(FILL_CALL, schema),
            fill_mode: render(FILL_MODE, schema),
            preflight: render(PREFLIGHT, schema),
            session_state: render(SESSION_STATE, schema),
            reset_session: render(RESET_SESSION, schema),
            table_locks: render(TABLE_LOCKS, schema),
            open_transactions: render(OPEN_TRANSACTIONS, schema),
            open_transactions_babelfish: render(OPEN_TRANSACTIONS_BABELFISH, schema),
            table: None,
        })
    }

    /// The direct-mode fill batch as it is sent.
    ///
    /// Its two lock timeouts are literals: `SET LOCK_TIMEOUT @variable` is
    /// T-SQL that Babelfish refuses ("invalid value for parameter"); a
    /// literal works on both servers. On Babelfish (`babelfish`), the
    /// leader fence asks PostgreSQL's lock manager whether the session
    /// that `@leader_fence` names still holds the fence lock whose key it
    /// names ([`babelfish_fence_held`], [`babelfish_fence_param`]) instead
    /// of `APPLOCK_TEST`, each of which leaves an entry on the session's
    /// error stack there when it finds the lock held, the fifth crashing
    /// the server. It tests the lock, not the session: a backend on its way
    /// out has released its locks before PostgreSQL stops listing it, and
    /// pids are reused. The session and key are a parameter, not text, so
    /// that the batch is one text whoever leads: Babelfish compiles a batch
    /// once per session and text (1.9-2.0 s for this one, measured; 22-31
    /// ms once compiled), and [`MssqlEngine::prepare_fills`] compiles it
    /// before the first hole is due.
    ///
    /// [`MssqlEngine::prepare_fills`]: crate::engine::Engine::prepare_fills
    pub(crate) fn direct_fill(&self, key_ms: i32, stream_ms: i32, babelfish: bool) -> String {
        // A described table's fill, or Eventuous's.
        let fill = self.table.as_ref().map_or(&self.fill, |t| &t.text);
        let mut text = fill
            .replace(
                "SET LOCK_TIMEOUT @stream_lock_timeout_ms;",
                &format!("SET LOCK_TIMEOUT {stream_ms};"),
            )
            .replace(
                "SET LOCK_TIMEOUT @lock_timeout_ms;",
                &format!("SET LOCK_TIMEOUT {key_ms};"),
            );
        if babelfish {
            let gone = format!("NOT {}", babelfish_fence_held());
            for owner in ["Session", "Transaction"] {
                text = text.replace(
                    &format!(
                        "APPLOCK_TEST(N'public', @leader_fence, N'Exclusive', N'{owner}') = 1"
                    ),
                    &gone,
                );
            }
        }
        text
    }

    /// The probe for `ranges` ranges (1..=[`PROBE_CHUNK`]): the VALUES row
    /// repeated with parameter markers numbered here. Nothing but `@P<n>`
    /// markers is added.
    pub(crate) fn probe(&self, ranges: usize) -> String {
        let ranges = ranges.clamp(1, PROBE_CHUNK);
        let rows: Vec<String> = (0..ranges)
            .map(|i| format!("(@P{}, @P{})", 2 * i + 1, 2 * i + 2))
            .collect();
        self.probe
            .replacen(PROBE_ROW, &format!("(VALUES {})", rows.join(", ")), 1)
    }
}

/// Where Babelfish keeps the application lock of a name: PostgreSQL's
/// advisory lock key, as `pg_catalog.pg_locks` shows it (classid the high
/// 32 bits, objid the low 32 bits, objsubid 2, in the database's own row).
///
/// Babelfish 4.2 hashes the name's bytes as the server stores them (UTF-8;
/// at most 255 bytes, cut before a character that does not fit) into a
/// 63-bit key: a polynomial of base 31 modulo 2^63 - 1 whose coefficients
/// are the bytes read as signed chars less 96, summed in wrapping 64-bit
/// arithmetic. Checked against the server for ASCII names, accented,
/// Cyrillic and astral characters, and names cut at 255 bytes
/// (`tests::app_lock_keys_are_babelfishs`). Should another held name
/// hash to the same key (about 1 in 2^63), Babelfish moves on to the next
/// free key: the session that takes the lock checks in `pg_locks` that it
/// holds the keys computed here (`sql/mssql/leader_keys_babelfish.sql`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AppLockKey {
    pub(crate) classid: u32,
    pub(crate) objid: u32,
}

impl AppLockKey {
    /// The most bytes of a name Babelfish keeps (its buffer, less the NUL).
    const MAX_BYTES: usize = 255;

    pub(crate) fn of(name: &str) -> AppLockKey {
        const MODULUS: i64 = i64::MAX;
        let mut end = name.len().min(Self::MAX_BYTES);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        let (mut key, mut power) = (0_u64, 1_i64);
        for &byte in &name.as_bytes()[..end] {
            // A C char is signed here: bytes above 127 count negative.
            let coefficient = i64::from(byte as i8) - 96;
            key = key.wrapping_add(coefficient.wrapping_mul(power) as u64) % MODULUS as u64;
            power = power.wrapping_mul(31) % MODULUS;
        }
        AppLockKey {
            classid: (key >> 32) as u32,
            objid: key as u32,
        }
    }
}

/// Babelfish only: a T-SQL condition, true while PostgreSQL's lock manager
/// shows the application lock whose key is bound as `@P2` (its classid) and
/// `@P3` (its objid) granted in this database to a session other than the
/// one asking. Babelfish keeps an application lock as an advisory lock:
/// `pg_catalog.pg_locks` (readable by every login) lists it with locktype
/// 'advisory', the key's high and low 32 bits as classid and objid, and
/// objsubid 2. Reading it leaves nothing behind on the session, unlike an
/// `APPLOCK_TEST` or `sp_getapplock` that finds the lock held. The key is
/// bound, not spliced: Babelfish compiles a batch once per session and
/// text, and one lock session serves every store of an instance.
pub(crate) fn babelfish_applock_held_by_another() -> String {
    advisory_lock_held("@P2", "@P3", "l.pid <> @@SPID")
}

/// The width of each number in a Babelfish fence parameter.
const FENCE_NUMBER: usize = 21;

/// Babelfish only: the fill's `@leader_fence` for the leader session
/// `session_id` and its fence lock's `key`: three signed 21-character
/// numbers (the session's pid, the key's classid and objid), as the fill's
/// ranges are written.
pub(crate) fn babelfish_fence_param(session_id: i64, key: AppLockKey) -> String {
    format!("{session_id:+021}{:+021}{:+021}", key.classid, key.objid)
}

/// Babelfish only: a T-SQL condition, true while the session that the
/// fill's `@leader_fence` names ([`babelfish_fence_param`]) holds the
/// fence lock whose key it names. The same text for every leader.
pub(crate) fn babelfish_fence_held() -> String {
    let number = |i: usize| {
        format!(
            "CAST(SUBSTRING(@leader_fence, {}, {FENCE_NUMBER}) AS BIGINT)",
            FENCE_NUMBER * i + 1
        )
    };
    advisory_lock_held(&number(1), &number(2), &format!("l.pid = {}", number(0)))
}

/// An `EXISTS` over `pg_locks`: the advisory lock of this database with
/// key `classid`/`objid` (T-SQL expressions), granted to whom `holder`
/// says.
fn advisory_lock_held(classid: &str, objid: &str, holder: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l WHERE l.locktype = 'advisory' \
         AND l.[database] = (SELECT d.oid FROM pg_catalog.pg_database AS d \
         WHERE d.datname = pg_catalog.current_database()) \
         AND CAST(l.classid AS BIGINT) = {classid} AND CAST(l.objid AS BIGINT) = {objid} \
         AND l.objsubid = 2 AND l.granted = 'true' AND {holder})"
    )
}

/// Babelfish only: `leader_lock.sql` with its two `APPLOCK_TEST`s of the
/// leader lock (is it held by another session?) replaced by
/// [`babelfish_applock_held_by_another`], the lock's key bound as `@P2` and
/// `@P3` ([`AppLockKey`]). So a follower that finds the lock held has asked
/// nothing of Babelfish's application locks and keeps its session; only
/// when the lock is taken between that look and `sp_getapplock` does the
/// batch report `refused`. The same text for every key.
pub(crate) fn babelfish_leader_lock() -> String {
    LEADER_LOCK.replace(
        "APPLOCK_TEST(N'public', @resource, N'Exclusive', N'Session') = 0",
        &babelfish_applock_held_by_another(),
    )
}

/// `batch` (whose parameters `@P1`..`@Pn` are declared by `declared`) run
/// in the database named by one more parameter, `@P{n+1}`, through that
/// database's `sp_executesql`: so one session, whatever database it is in,
/// takes and tests application locks (which SQL Server scopes to the
/// current database) in the database of each store it serves. The text is
/// the same for every database, which is bound.
pub(crate) fn in_database(batch: &str, declared: &str, n: usize) -> String {
    let args: Vec<String> = (1..=n).map(|i| format!("@P{i} = @P{i}")).collect();
    format!(
        "DECLARE @gap_healer_in_database NVARCHAR(300) = QUOTENAME(@P{db}) + N'.sys.sp_executesql';\n\
         EXEC @gap_healer_in_database\n    @stmt = N'{stmt}',\n    @params = N'{declared}',\n    {args};",
        db = n + 1,
        stmt = batch.replace('\'', "''"),
        declared = declared.replace('\'', "''"),
        args = args.join(", "),
    )
}

/// A tombstone stream name or type must fit its NVARCHAR column whole
/// (counted in UTF-16 code units, as NVARCHAR counts) and not be empty.
fn check_name(what: &str, value: &str, max_units: usize) -> DbResult<()> {
    let units = value.encode_utf16().count();
    if units == 0 || units > max_units {
        return Err(DbError::permanent(format!(
            "the {what} must be 1 to {max_units} UTF-16 code units for SQL Server; it has {units}"
        )));
    }
    Ok(())
}

/// `text` as a T-SQL NVARCHAR expression that evaluates to exactly `text`:
/// `N'...'` literals with every `'` doubled. So that the printed setup
/// script survives sqlcmd and SSMS unchanged, too: control and line
/// separator characters become `NCHAR(n)` (no literal spans lines, and none
/// of them is outside the BMP), and a literal never contains `$(` (sqlcmd
/// would take it for a scripting variable), the two characters going into
/// two literals. The pieces are joined with `+`; `N''` for an empty text.
pub(crate) fn nvarchar_literal(text: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut run = String::new();
    let flush = |run: &mut String, parts: &mut Vec<String>| {
        if !run.is_empty() {
            parts.push(format!("N'{run}'"));
            run.clear();
        }
    };
    for c in text.chars() {
        if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
            flush(&mut run, &mut parts);
            parts.push(format!("NCHAR({})", u32::from(c)));
            continue;
        }
        if c == '(' && run.ends_with('$') {
            flush(&mut run, &mut parts);
        }
        if c == '\'' {
            run.push_str("''");
        } else {
            run.push(c);
        }
    }
    flush(&mut run, &mut parts);
    if parts.is_empty() {
        "N''".to_string()
    } else {
        parts.join(" + ")
    }
}

/// The fill body of `fill.sql`: the lines strictly between the markers,
/// without blank lines at either end.
fn fill_body(fill: &str) -> Vec<&str> {
    let mut body: Vec<&str> = fill
        .lines()
        .skip_while(|line| line.trim_end() != BODY_BEGIN)
        .skip(1)
        .take_while(|line| line.trim_end() != BODY_END)
        .skip_while(|line| line.trim().is_empty())
        .collect();
    while body.last().is_some_and(|line| line.trim().is_empty()) {
        body.pop();
    }
    body
}

/// `(name, type, marker)` of each `DECLARE @name TYPE = @Pn;` line of
/// `fill.sql` before its body, in order: the direct batch's parameters, and
/// the procedure's parameters and constants.
fn fill_parameters(fill: &str) -> Vec<(&str, &str, &str)> {
    fill.lines()
        .take_while(|line| line.trim_end() != BODY_BEGIN)
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("DECLARE @")?.strip_suffix(';')?;
            let (declaration, marker) = rest.rsplit_once(" = ")?;
            let (name, kind) = declaration.split_once(' ')?;
            marker
                .starts_with("@P")
                .then_some((name, kind.trim(), marker))
        })
        .collect()
}

/// The DECLAREs of `fill.sql` that are the procedure's parameters: all but
/// [`PROCEDURE_CONSTANTS`], in order.
fn procedure_parameters(fill: &str) -> Vec<(&str, &str, &str)> {
    fill_parameters(fill)
        .into_iter()
        .filter(|(name, _, _)| !PROCEDURE_CONSTANTS.contains(name))
        .collect()
}

/// `CREATE OR ALTER PROCEDURE __schema__.[gap_healer_fill]` for one
/// tombstone stream and type, built from `fill.sql` (see its header): one
/// body for both modes, nothing to keep in step by hand. Its parameters are
/// fill.sql's DECLAREs but [`PROCEDURE_CONSTANTS`], which are DECLAREd at the
/// top of the body with `tombstone_stream` and `tombstone_type` as literals
/// ([`nvarchar_literal`]). The body is indented by four spaces; `fill.sql`
/// keeps every string literal on one line, so that changes no literal.
pub(crate) fn fill_procedure(tombstone_stream: &str, tombstone_type: &str) -> String {
    let declared = fill_parameters(FILL);
    let parameters: Vec<String> = procedure_parameters(FILL)
        .iter()
        .map(|(name, kind, _)| format!("    @{name} {kind}"))
        .collect();
    let constants: Vec<String> = PROCEDURE_CONSTANTS
        .iter()
        .map(|constant| {
            let kind = declared
                .iter()
                .find(|(name, _, _)| name == constant)
                .map_or("NVARCHAR(850)", |(_, kind, _)| kind);
            let value = if *constant == "stream_name" {
                tombstone_stream
            } else {
                tombstone_type
            };
            format!(
                "    DECLARE @{constant} {kind} = {};",
                nvarchar_literal(value)
            )
        })
        .collect();
    let body: Vec<String> = fill_body(FILL)
        .iter()
        .map(|line| {
            if line.trim().is_empty() {
                String::new()
            } else {
                format!("    {line}")
            }
        })
        .collect();
    format!(
        "{PROCEDURE_COMMENT}\
         CREATE OR ALTER PROCEDURE {SCHEMA_PLACEHOLDER}.[gap_healer_fill]\n\
         {parameters}\n\
         WITH EXECUTE AS OWNER\n\
         AS\n\
         BEGIN\n    \
         -- {PROCEDURE_INTERFACE}\n\
         \n    \
         -- The tombstone stream and type, fixed when this procedure was created.\n\
         {constants}\n\
         \n\
         {body}\n\
         END;\n",
        parameters = parameters.join(",\n"),
        constants = constants.join("\n"),
        body = body.join("\n"),
    )
}

/// What `gap-healer sql --engine mssql` prints: the fill procedure for one
/// tombstone stream and type, and the grants for a placeholder user, as one
/// sqlcmd/SSMS script.
pub(crate) fn setup_script(schema: &Ident, tombstone_stream: &str, tombstone_type: &str) -> String {
    format!(
        "-- gap-healer {version}: SQL Server setup for schema {quoted}.\n\
         -- Run it in the event store's database (sqlcmd or SSMS) as a user who may\n\
         -- create procedures in the schema and grant rights on it (db_owner, say).\n\
         -- It creates the fill procedure (procedure mode) for the tombstone stream\n\
         -- and type configured when this was printed (the constants at the top of\n\
         -- its body), then grants the healer's database user what procedure\n\
         -- mode needs. `gap-healer install` runs the first part only.\n\
         \n\
         {procedure}GO\n\
         \n\
         {grants}",
        version = env!("CARGO_PKG_VERSION"),
        quoted = schema.tsql(),
        procedure = render(&fill_procedure(tombstone_stream, tombstone_type), schema),
        grants = render(GRANTS, schema),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On Babelfish both of the fill's fence checks ask whether the
    /// leader's session (by its pid) still holds the fence lock's key in
    /// `pg_locks`; neither asks `APPLOCK_TEST`, nor only whether the session
    /// exists.
    #[test]
    fn the_babelfish_fence_asks_whether_the_leader_session_holds_its_fence_lock() {
        let key = AppLockKey {
            classid: 7,
            objid: 4_000_000_000,
        };
        let fenced = sql("eventuous").unwrap().direct_fill(2000, 5000, true);
        assert!(
            !fenced.contains("APPLOCK_TEST(N'public', @leader_fence"),
            "{fenced}"
        );
        assert!(!fenced.contains("pg_stat_activity"), "{fenced}");
        let gone = format!("NOT {}", babelfish_fence_held());
        assert_eq!(fenced.matches(&gone).count(), 2, "{fenced}");
        for part in [
            "NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l WHERE l.locktype = 'advisory' AND l.[database] = ",
            "CAST(l.classid AS BIGINT) = CAST(SUBSTRING(@leader_fence, 22, 21) AS BIGINT) AND CAST(l.objid AS BIGINT) = CAST(SUBSTRING(@leader_fence, 43, 21) AS BIGINT)",
            "l.objsubid = 2 AND l.granted = 'true' AND l.pid = CAST(SUBSTRING(@leader_fence, 1, 21) AS BIGINT))",
        ] {
            assert!(gone.contains(part), "{part}\nnot in {gone}");
        }
        // The parameter names the session and the key, 21 characters each;
        // the text is the same for every leader.
        let param = babelfish_fence_param(40_123, key);
        assert_eq!(param.len(), 63);
        assert_eq!(&param[..21], "+00000000000000040123");
        assert_eq!(&param[21..42], "+00000000000000000007");
        assert_eq!(&param[42..], "+00000000004000000000");
        assert!(!fenced.contains("40123") && !fenced.contains("4000000000"));
        // What the leader lock's batch asks is the same condition, of
        // another session.
        assert!(babelfish_applock_held_by_another().contains(
            "CAST(l.classid AS BIGINT) = @P2 AND CAST(l.objid AS BIGINT) = @P3 AND l.objsubid = 2 AND l.granted = 'true' AND l.pid <> @@SPID)"
        ));
    }

    #[test]
    fn direct_fills_set_their_lock_timeouts_as_literals() {
        let fill = sql("eventuous").unwrap().direct_fill(2000, 5000, false);
        assert!(
            fill.contains("APPLOCK_TEST(N'public', @leader_fence"),
            "{fill}"
        );
        assert!(fill.contains("SET LOCK_TIMEOUT 5000;"), "{fill}");
        assert!(fill.contains("SET LOCK_TIMEOUT 2000;"), "{fill}");
        assert!(!fill.contains("SET LOCK_TIMEOUT @"), "{fill}");
        assert!(fill.contains("SET LOCK_TIMEOUT -1;"), "{fill}");
    }

    const STREAM: &str = "__tombstones__";
    const TYPE: &str = "$tombstone";

    fn name(text: &str) -> Ident {
        Ident::parse(text).unwrap()
    }

    /// The statements for `schema`, refused as the configuration refuses it.
    fn sql(schema: &str) -> DbResult<Sql> {
        let schema = Ident::parse(schema).map_err(DbError::permanent)?;
        Sql::new(&schema, STREAM, TYPE)
    }

    /// Evaluates what [`nvarchar_literal`] produces: `N'..'` literals
    /// (doubled quotes) and `NCHAR(n)` joined by ` + `. Panics on anything else.
    fn eval_nvarchar(expr: &str) -> String {
        let mut out = String::new();
        let mut rest = expr;
        loop {
            if let Some(r) = rest.strip_prefix("N'") {
                let mut chars = r.char_indices().peekable();
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    if c == '\'' {
                        if matches!(chars.peek(), Some((_, '\''))) {
                            chars.next();
                            out.push('\'');
                        } else {
                            end = Some(i);
                            break;
                        }
                    } else {
                        out.push(c);
                    }
                }
                let end = end.expect("a closed literal");
                rest = &r[end + 1..];
            } else if let Some(r) = rest.strip_prefix("NCHAR(") {
                let close = r.find(')').expect("NCHAR(n)");
                let n: u32 = r[..close].parse().expect("a number");
                out.push(char::from_u32(n).expect("a character"));
                rest = &r[close + 1..];
            } else {
                panic!("unexpected text in {expr:?} at {rest:?}");
            }
            if rest.is_empty() {
                return out;
            }
            rest = rest.strip_prefix(" + ").expect("pieces joined by +");
        }
    }

    /// Every file in sql/mssql (the procedure is built, not a file).
    const ALL: [(&str, &str); 28] = [
        ("head", HEAD),
        ("reset_session", RESET_SESSION),
        ("fill_table", FILL_TABLE),
        ("shared_heads", SHARED_HEADS),
        ("scan", SCAN),
        ("probe", PROBE),
        ("checkpoints", CHECKPOINTS),
        ("shared_checkpoints", SHARED_CHECKPOINTS),
        ("identity", IDENTITY),
        ("fill", FILL),
        ("fill_call", FILL_CALL),
        ("fill_mode", FILL_MODE),
        ("grants", GRANTS),
        ("preflight", PREFLIGHT),
        ("session_state", SESSION_STATE),
        ("leader_lock", LEADER_LOCK),
        ("leader_check", LEADER_CHECK),
        ("leader_release", LEADER_RELEASE),
        ("leader_keys_babelfish", LEADER_KEYS_BABELFISH),
        ("server", SERVER),
        ("databases", DATABASES),
        ("watermark_read", WATERMARK_READ),
        ("watermark_publish", WATERMARK_PUBLISH),
        ("watermark_check", WATERMARK_CHECK),
        ("watermark_table", WATERMARK_TABLE),
        ("table_locks", TABLE_LOCKS),
        ("open_transactions", OPEN_TRANSACTIONS),
        ("open_transactions_babelfish", OPEN_TRANSACTIONS_BABELFISH),
    ];

    /// Files that name no schema of their own (the shared heads and
    /// checkpoints name each store's table by three parts), the session's
    /// own state, the leader lock (an application lock of the database,
    /// named by `@P1`), the server and its databases.
    const SCHEMALESS: [&str; 13] = [
        "shared_heads",
        "shared_checkpoints",
        "session_state",
        "leader_lock",
        "leader_check",
        "leader_release",
        "leader_keys_babelfish",
        "server",
        "databases",
        "watermark_read",
        "watermark_publish",
        "watermark_check",
        "watermark_table",
    ];

    #[test]
    fn every_sql_file_is_listed() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/sql/mssql");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".sql"))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = ALL.iter().map(|(n, _)| format!("{n}.sql")).collect();
        listed.sort();
        assert_eq!(on_disk, listed);
    }

    #[test]
    fn schema_is_bracketed_everywhere() {
        let sql = sql("eventuous").unwrap();
        for text in [
            &sql.head,
            &sql.scan,
            &sql.probe(3),
            &sql.checkpoints,
            &sql.identity,
            &sql.fill,
            &sql.fill_procedure,
            &sql.fill_call,
            &sql.fill_mode,
            &sql.preflight,
            &sql.session_state,
            &sql.table_locks,
            &sql.open_transactions,
            &sql.open_transactions_babelfish,
        ] {
            assert!(!text.contains(SCHEMA_PLACEHOLDER), "{text}");
        }
        assert!(sql.head.contains("[eventuous].[Messages]"));
        assert!(sql
            .fill
            .contains("SET IDENTITY_INSERT [eventuous].[Messages] ON"));
        assert!(sql
            .fill_procedure
            .contains("CREATE OR ALTER PROCEDURE [eventuous].[gap_healer_fill]"));
        assert!(sql.preflight.contains("N'[eventuous].[Messages]'"));
        let script = setup_script(&name("Store_2"), STREAM, TYPE);
        assert!(script
            .contains("GRANT EXECUTE ON OBJECT::[Store_2].[gap_healer_fill] TO __healer_role__"));
        assert!(!script.contains(SCHEMA_PLACEHOLDER));
    }

    #[test]
    fn every_file_uses_the_placeholder_or_needs_none() {
        for (name, text) in ALL {
            if SCHEMALESS.contains(&name) {
                assert!(!text.contains(SCHEMA_PLACEHOLDER), "{name}.sql");
            } else {
                assert!(
                    text.contains(SCHEMA_PLACEHOLDER),
                    "{name}.sql never names the schema"
                );
            }
        }
    }

    #[test]
    fn rejects_schemas_that_are_not_plain_identifiers() {
        for bad in [
            "",
            "1abc",
            "a-b",
            "a]b",
            "a;DROP TABLE x",
            "ä",
            "a b",
            &"x".repeat(129),
        ] {
            assert!(sql(bad).is_err(), "{bad:?}");
        }
        for good in ["eventuous", "_x", "Store_2", &"x".repeat(128)] {
            assert!(sql(good).is_ok(), "{good:?}");
        }
        assert_eq!(quote_ident("a]b"), "[a]]b]");
    }

    #[test]
    fn no_user_value_is_spliced_into_what_the_login_runs() {
        // The tombstone stream, type, positions, timeouts and the fence are
        // parameters of the direct batch and the procedure call: those texts
        // do not depend on them at all.
        let sql = Sql::new(&name("eventuous"), "it's $(x)", "o'type").unwrap();
        for marker in ["@P1", "@P2", "@P3", "@P4", "@P5", "@P6"] {
            assert!(sql.fill.contains(marker), "fill.sql binds {marker}");
        }
        assert!(!sql.fill.contains("@P7"));
        for marker in ["@P1", "@P2", "@P3", "@P4"] {
            assert!(
                sql.fill_call.contains(marker),
                "fill_call.sql binds {marker}"
            );
        }
        assert!(!sql.fill_call.contains("@P5"));
        assert_eq!(
            sql.fill,
            Sql::new(&name("eventuous"), STREAM, TYPE).unwrap().fill
        );
        assert_eq!(sql.fill_call, render(FILL_CALL, &name("eventuous")));
        for text in [&sql.fill, &sql.fill_call] {
            assert!(!text.contains("__tombstones__") && !text.contains("$tombstone"));
            assert!(!text.contains("it''s") && !text.contains("o''type"));
        }
        assert!(sql.scan.contains("@P1") && sql.scan.contains("@P2") && !sql.scan.contains("@P3"));
        // The procedure alone has them, as literals.
        assert!(sql
            .fill_procedure
            .contains("DECLARE @stream_name NVARCHAR(850) = N'it''s $' + N'(x)';"));
        assert!(sql
            .fill_procedure
            .contains("DECLARE @message_type NVARCHAR(128) = N'o''type';"));
    }

    #[test]
    fn literals_evaluate_to_the_text_and_survive_sqlcmd() {
        for text in [
            "__tombstones__",
            "$tombstone",
            "o'brien's",
            "'",
            "''",
            "'; DROP TABLE x; --",
            "N'",
            "a$(b)c",
            "$$((",
            "$",
            "(",
            "tab\there",
            "line\nbreak\r\u{0}\u{7f}\u{85}",
            "sep\u{2028}para\u{2029}",
            "ünï ç😀de",
            "GO",
            "]",
        ] {
            let expr = nvarchar_literal(text);
            assert_eq!(eval_nvarchar(&expr), text, "{expr}");
            assert!(!expr.contains("$("), "{expr}");
            assert!(
                !expr.contains(|c: char| c.is_control() || c == '\u{2028}' || c == '\u{2029}'),
                "{expr:?}"
            );
            // Outside the pieces' quotes there is nothing but ` + ` and NCHAR(n).
            let stripped: String = expr.split(" + ").filter(|p| !p.starts_with("N'")).collect();
            assert!(
                stripped.chars().all(|c| "NCHAR()0123456789".contains(c)),
                "{expr}"
            );
        }
        assert_eq!(nvarchar_literal(""), "N''");
        assert_eq!(nvarchar_literal("o'brien"), "N'o''brien'");
        assert_eq!(nvarchar_literal("a$(b)"), "N'a$' + N'(b)'");
        assert_eq!(nvarchar_literal("a\nb"), "N'a' + NCHAR(10) + N'b'");
    }

    #[test]
    fn tombstone_names_must_fit_their_columns() {
        assert!(Sql::new(&name("eventuous"), &"s".repeat(850), &"t".repeat(128)).is_ok());
        // Counted in UTF-16 units, as NVARCHAR counts: the emoji is two.
        let astral = format!("{}😀", "s".repeat(849));
        let err = Sql::new(&name("eventuous"), &astral, TYPE).unwrap_err();
        assert!(err.message.contains("tombstone stream"), "{}", err.message);
        assert!(Sql::new(&name("eventuous"), &"s".repeat(851), TYPE).is_err());
        assert!(Sql::new(&name("eventuous"), STREAM, &"t".repeat(129)).is_err());
        assert!(Sql::new(&name("eventuous"), "", TYPE).is_err());
        assert!(Sql::new(&name("eventuous"), STREAM, "").is_err());
    }

    #[test]
    fn setup_script_bakes_in_a_quoted_stream_name() {
        let script = setup_script(&name("eventuous"), "Bob's tombstones", "it's a $(type)");
        assert!(
            script.contains("    DECLARE @stream_name NVARCHAR(850) = N'Bob''s tombstones';\n"),
            "{script}"
        );
        assert!(
            script
                .contains("    DECLARE @message_type NVARCHAR(128) = N'it''s a $' + N'(type)';\n"),
            "{script}"
        );
        // Neither is a parameter, and the call cannot pass one.
        let create = script
            .find("CREATE OR ALTER PROCEDURE [eventuous].[gap_healer_fill]")
            .unwrap();
        let as_ = create + script[create..].find("\nAS\n").unwrap();
        let signature = &script[create..as_];
        assert!(!signature.contains("@stream_name") && !signature.contains("@message_type"));
        assert!(!FILL_CALL.contains("@stream_name") && !FILL_CALL.contains("@message_type"));
        // No line of the script holds an odd number of quotes outside a
        // comment, so no literal spans lines (and sqlcmd's GO stays a GO).
        for line in script.lines() {
            let code = line.split("--").next().unwrap_or_default();
            assert!(code.matches('\'').count() % 2 == 0, "{line}");
        }
        assert!(!script.contains("$("), "sqlcmd would substitute it");
    }

    #[test]
    fn probe_repeats_only_numbered_markers() {
        let sql = sql("eventuous").unwrap();
        assert!(
            PROBE.matches(PROBE_ROW).count() == 1,
            "probe.sql has exactly one VALUES row"
        );
        let one = sql.probe(1);
        assert!(one.contains("(VALUES (@P1, @P2))"));
        let four = sql.probe(4);
        assert!(
            four.contains("(VALUES (@P1, @P2), (@P3, @P4), (@P5, @P6), (@P7, @P8))"),
            "{four}"
        );
        let max = sql.probe(PROBE_CHUNK + 10);
        assert!(max.contains(&format!("@P{}", 2 * PROBE_CHUNK)));
        assert!(!max.contains(&format!("@P{}", 2 * PROBE_CHUNK + 1)));
    }

    #[test]
    fn the_procedure_is_the_fill_body_with_the_fill_parameters() {
        let procedure = fill_procedure(STREAM, TYPE);
        let body = fill_body(FILL);
        assert!(body.len() > 100, "the markers enclose the body");
        assert!(body.iter().any(|l| l.contains("SET IDENTITY_INSERT")));
        assert!(body
            .iter()
            .any(|l| l.contains("@@TRANCOUNT AS open_transactions")));
        // Every body line, in order, indented by four spaces.
        let lines: Vec<&str> = procedure.lines().collect();
        let first = lines
            .iter()
            .position(|l| *l == format!("    {}", body[0]))
            .expect("the body's first line");
        for (i, line) in body.iter().enumerate() {
            let want = if line.trim().is_empty() {
                String::new()
            } else {
                format!("    {line}")
            };
            assert_eq!(lines[first + i], want, "body line {i}");
        }
        assert_eq!(lines.last(), Some(&"END;"));
        // The direct batch's DECLAREs: the procedure's parameters, and its
        // constants.
        let declared = fill_parameters(FILL);
        assert_eq!(
            declared,
            vec![
                ("ranges", "NVARCHAR(MAX)", "@P1"),
                ("stream_name", "NVARCHAR(850)", "@P2"),
                ("message_type", "NVARCHAR(128)", "@P3"),
                ("lock_timeout_ms", "INT", "@P4"),
                ("stream_lock_timeout_ms", "INT", "@P5"),
                ("leader_fence", "NVARCHAR(255)", "@P6"),
            ]
        );
        let parameters = procedure_parameters(FILL);
        assert_eq!(
            parameters.iter().map(|(n, _, _)| *n).collect::<Vec<_>>(),
            vec![
                "ranges",
                "lock_timeout_ms",
                "stream_lock_timeout_ms",
                "leader_fence"
            ]
        );
        assert!(procedure.contains(
            "CREATE OR ALTER PROCEDURE __schema__.[gap_healer_fill]\n    @ranges NVARCHAR(MAX),\n    \
             @lock_timeout_ms INT,\n    @stream_lock_timeout_ms INT,\n    @leader_fence NVARCHAR(255)\n\
             WITH EXECUTE AS OWNER\nAS\nBEGIN\n"
        ));
        // The constants come before the body, with fill.sql's types.
        let stream = lines
            .iter()
            .position(|l| *l == "    DECLARE @stream_name NVARCHAR(850) = N'__tombstones__';")
            .expect("the stream constant");
        let kind = lines
            .iter()
            .position(|l| *l == "    DECLARE @message_type NVARCHAR(128) = N'$tombstone';")
            .expect("the type constant");
        assert!(stream < first && kind < first);
        // The procedure is called with its parameters' names bound to
        // @P1.. in order, and with nothing else.
        for (i, (name, _, _)) in parameters.iter().enumerate() {
            assert!(
                FILL_CALL.contains(&format!("@{name} = @P{}", i + 1)),
                "fill_call.sql binds @{name} = @P{}",
                i + 1
            );
        }
        assert_eq!(FILL_CALL.matches(" = @P").count(), parameters.len());
        let rendered = Sql::new(&name("eventuous"), STREAM, TYPE).unwrap();
        assert_eq!(
            rendered.procedure_parameters,
            vec![
                "@ranges",
                "@lock_timeout_ms",
                "@stream_lock_timeout_ms",
                "@leader_fence"
            ]
        );
        // Nothing of the direct batch's preamble leaks into the procedure.
        assert!(!procedure.contains("= @P"));
        assert!(!procedure.contains(BODY_BEGIN) && !procedure.contains(BODY_END));
        // preflight.sql recognises this procedure by its marker.
        assert!(procedure.contains(PROCEDURE_INTERFACE));
        assert!(PREFLIGHT.contains(PROCEDURE_INTERFACE));
    }

    #[test]
    fn the_fill_checks_the_leader_fence_after_locking_the_stream_row() {
        let body = fill_body(FILL).join("\n");
        let row_lock = body.find("WITH (UPDLOCK, ROWLOCK)").unwrap();
        let fence = body
            .find("APPLOCK_TEST(N'public', @leader_fence, N'Exclusive', N'Transaction') = 1")
            .expect("the fence inside the transaction");
        let begin = body.find("BEGIN TRANSACTION;").unwrap();
        let insert = body.find("INSERT INTO __schema__.[Messages]").unwrap();
        assert!(begin < row_lock && row_lock < fence && fence < insert);
        // And before the one write outside the transaction (the stream row).
        let early = body
            .find("APPLOCK_TEST(N'public', @leader_fence, N'Exclusive', N'Session') = 1")
            .expect("the fence before creating the stream row");
        let create = body.find("INSERT INTO __schema__.[Streams]").unwrap();
        assert!(early < create && create < begin);
        assert_eq!(body.matches("THROW 50006").count(), 2);
        assert_eq!(
            body.matches("NULLIF(@leader_fence, N'') IS NOT NULL")
                .count(),
            2
        );
        // The stage the engine classifies as Busy.
        assert!(body.contains("SET @stage = N'leader';"));
        // The answer names the tombstones.
        assert!(body.contains("@stream_name AS stream_name,"));
        assert!(body.contains("@message_type AS message_type;"));
    }

    #[test]
    fn indenting_the_body_changes_no_string_literal() {
        // A literal that spans lines would get the indentation inside it.
        // Comments may hold apostrophes; code lines must close every quote.
        for (i, line) in fill_body(FILL).iter().enumerate() {
            let code = line.split("--").next().unwrap_or_default();
            assert!(
                code.matches('\'').count() % 2 == 0,
                "fill.sql body line {i} opens a literal it does not close: {line}"
            );
        }
    }

    #[test]
    fn leader_lock_sql_binds_only_the_key() {
        for (name, text) in [("leader_lock", LEADER_LOCK), ("leader_check", LEADER_CHECK)] {
            assert!(text.contains("@P1"), "{name}.sql binds the key");
            assert!(!text.contains("@P2"), "{name}.sql binds nothing else");
            assert!(text.contains("'Session'"), "{name}.sql: session-owned");
            assert!(
                text.contains("'public'"),
                "{name}.sql: the public principal"
            );
        }
        let code: String = LEADER_LOCK
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        for part in [
            "EXEC @lock_result = sp_getapplock",
            "DECLARE @resource NVARCHAR(255) = @P1;",
            "@Resource = @resource",
            "@LockMode = 'Exclusive'",
            "@LockOwner = 'Session'",
            "@LockTimeout = 0",
            "@lock_result AS lock_result",
            "@@SPID AS session_id",
            // The fence: a second session-owned lock with a fresh name, taken
            // only with the leader lock.
            "IF @lock_result >= 0",
            "CAST(NEWID() AS NVARCHAR(36))",
            "EXEC @fence_result = sp_getapplock",
            "@Resource = @fence",
            "@fence_result AS fence_result",
            "@fence AS fence",
        ] {
            assert!(code.contains(part), "leader_lock.sql: {part}");
        }
        assert_eq!(code.matches("@LockOwner = 'Session'").count(), 2);
        assert_eq!(code.matches("@LockTimeout = 0").count(), 2);
        assert_eq!(code.matches("@DbPrincipal = 'public'").count(), 2);
        assert!(LEADER_CHECK.contains("APPLOCK_MODE('public', @P1, 'Session') AS lock_mode"));
    }

    /// On Babelfish the leader lock batch never asks `APPLOCK_TEST` about
    /// the leader lock: both of its questions (before asking for the lock,
    /// and after a -999) look at the key in `pg_locks`, held by another
    /// session; the rest of the batch is leader_lock.sql's.
    #[test]
    fn the_babelfish_leader_lock_looks_at_pg_locks() {
        let batch = babelfish_leader_lock();
        let code: String = batch
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(!code.contains("APPLOCK_TEST"), "{code}");
        let held = babelfish_applock_held_by_another();
        assert_eq!(code.matches(&held).count(), 2, "{code}");
        // The key is bound, so one text serves every store's lock.
        assert!(held.contains("CAST(l.classid AS BIGINT) = @P2"), "{held}");
        assert!(held.contains("CAST(l.objid AS BIGINT) = @P3"), "{held}");
        assert!(
            held.contains("l.objsubid = 2 AND l.granted = 'true' AND l.pid <> @@SPID)"),
            "{held}"
        );
        assert!(
            code.contains("IF EXISTS (SELECT 1 FROM pg_catalog.pg_locks"),
            "{code}"
        );
        assert!(
            code.contains(
                "IF @lock_result = -999\n    AND EXISTS (SELECT 1 FROM pg_catalog.pg_locks"
            ),
            "{code}"
        );
        assert_eq!(
            batch.replace(
                &held,
                "APPLOCK_TEST(N'public', @resource, N'Exclusive', N'Session') = 0"
            ),
            LEADER_LOCK
        );
        // A follower that found the lock held is not marked refused: only
        // sp_getapplock's own -999 is.
        let pre = code.split("ELSE").next().unwrap();
        assert!(!pre.contains("@refused ="), "{pre}");
    }

    /// A batch run in another database keeps its text whole (quotes
    /// doubled), passes its own parameters on by name, and takes the
    /// database as the next parameter, quoted by the server.
    #[test]
    fn a_batch_runs_in_the_database_bound_after_its_parameters() {
        let wrapped = in_database("SELECT N'a''b', @P1, @P2;", "@P1 INT, @P2 NVARCHAR(9)", 2);
        assert!(
            wrapped.starts_with(
                "DECLARE @gap_healer_in_database NVARCHAR(300) = QUOTENAME(@P3) + N'.sys.sp_executesql';"
            ),
            "{wrapped}"
        );
        assert!(
            wrapped.contains("@stmt = N'SELECT N''a''''b'', @P1, @P2;'"),
            "{wrapped}"
        );
        assert!(
            wrapped.contains("@params = N'@P1 INT, @P2 NVARCHAR(9)'"),
            "{wrapped}"
        );
        assert!(wrapped.ends_with("@P1 = @P1, @P2 = @P2;"), "{wrapped}");
        let release = in_database(LEADER_RELEASE, "@P1 NVARCHAR(255), @P2 NVARCHAR(255)", 2);
        assert_eq!(release.matches("@P3").count(), 1);
    }

    /// Releasing one store's lock drops its fence first, and neither
    /// release is tried for a lock the session does not hold.
    #[test]
    fn a_release_drops_the_fence_before_the_leader_lock() {
        let code: String = LEADER_RELEASE
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        let fence = code.find("@Resource = @fence").unwrap();
        let leader = code.find("@Resource = @resource").unwrap();
        assert!(fence < leader, "{code}");
        assert_eq!(
            code.matches("WHILE APPLOCK_MODE(N'public', ").count(),
            2,
            "{code}"
        );
        assert_eq!(code.matches("@LockOwner = 'Session'").count(), 2);
    }

    /// Review finding F7: a NEWID() per tombstone spreads one fill over as
    /// many leaf pages of UQ_StreamIdAndMessageId as it has rows; the ids of
    /// one fill share 12 random bytes (the ones SQL Server sorts on first)
    /// and differ only in the 4 it sorts on last, so they are adjacent.
    #[test]
    fn one_fill_takes_adjacent_message_ids() {
        let body = fill_body(FILL).join("\n");
        let code: String = body
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(
            code.matches("NEWID()").count(),
            1,
            "one random GUID per fill"
        );
        assert!(code.contains("DECLARE @message_id_base NCHAR(36) = CAST(NEWID() AS NCHAR(36));"));
        // The row's number (below 4,096 = 16^3) as the first eight hex
        // digits, the rest of the base after them.
        assert!(code.contains("            N'00000'\n"));
        for divisor in ["/ 256 % 16", "/ 16 % 16", "% 16"] {
            assert!(
                code.contains(&format!(
                    "CAST((r.first_row + nb.n) {divisor} AS INT) + 1, 1)"
                )),
                "{divisor}"
            );
        }
        assert!(
            code.contains("+ SUBSTRING(@message_id_base, 9, 28)\n            AS UNIQUEIDENTIFIER")
        );
        // The base is taken once, before the insert, not per row.
        assert!(
            code.find("@message_id_base NCHAR(36)").unwrap()
                < code.find("INSERT INTO __schema__.[Messages]").unwrap()
        );
    }

    #[test]
    fn fill_never_uses_generate_series_and_stays_below_lock_escalation() {
        for (name, text) in ALL {
            assert!(
                !text.to_uppercase().contains("GENERATE_SERIES("),
                "{name}.sql"
            );
        }
        assert!(FILL.contains("IF @positions + @range_count - 1 > 4000"));
        assert!(FILL.contains("@range_count > 1000"));
        assert_eq!(super::super::MAX_FILL_RANGES, 1000);
        assert_eq!(super::super::MAX_FILL_ROWS, 4000);
    }
}
