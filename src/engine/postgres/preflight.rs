//! `gap-healer check` for PostgreSQL: one query step that gathers [`Facts`]
//! (`sql/postgres/preflight.sql`, then the tombstone stream's rows when the
//! login may read them), and a pure function from facts to findings, so every
//! verdict has a unit test.

use tokio_postgres::Row;

use super::errors::{describe, get};
use super::tls::TlsMode;
use super::PostgresEngine;
use crate::engine::{Check, DbResult, Finding, Ident};

/// Columns the fill writes or Eventuous needs, by table.
const MESSAGES_COLUMNS: [&str; 7] = [
    "message_id",
    "message_type",
    "stream_id",
    "stream_position",
    "json_data",
    "json_metadata",
    "created",
];
const STREAMS_COLUMNS: [&str; 3] = ["stream_id", "stream_name", "version"];

/// A column of messages, streams or checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Column {
    pub table: String,
    pub name: String,
    pub data_type: String,
    pub identity: bool,
}

/// The login's rights; `None` when the schema or table does not exist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Rights {
    pub schema_usage: Option<bool>,
    pub messages_select: Option<bool>,
    pub messages_insert: Option<bool>,
    pub streams_select: Option<bool>,
    pub streams_insert: Option<bool>,
    pub streams_update: Option<bool>,
    pub checkpoints_select: Option<bool>,
    /// The identity's sequence (as the catalog names it) and SELECT on it,
    /// which the transaction-end proof reads; `None`: no sequence found.
    pub sequence: Option<(String, bool)>,
}

/// The tombstone stream's Version beside its rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TombstoneStats {
    pub version: i64,
    pub rows: i64,
    pub min_position: i64,
    pub max_position: i64,
}

/// What the tombstone stream looks like, or why it was not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Tombstones {
    /// Not read: a table is missing or the login may not read it.
    Unread,
    /// The stream's row does not exist yet.
    Absent,
    Present(TombstoneStats),
    /// Reading it failed (the error's text, secret-free).
    Failed(String),
}

/// What every profile's preflight reads about the server, the session and
/// the schema (the first columns of `preflight.sql` and
/// `preflight_table.sql`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Session {
    pub version: String,
    pub version_num: i32,
    /// Whether this session is encrypted (`pg_stat_ssl`); `None` if unknown.
    pub encrypted: Option<bool>,
    /// The role the session runs as (`CURRENT_USER`): whom a GRANT names.
    pub login: String,
    pub schema_exists: bool,
}

impl Session {
    pub(super) fn from_row(row: &Row) -> DbResult<Session> {
        Ok(Session {
            version: get(row, "server_version")?,
            version_num: get(row, "server_version_num")?,
            encrypted: get(row, "encrypted")?,
            login: get(row, "login")?,
            schema_exists: get(row, "schema_exists")?,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Facts {
    pub session: Session,
    pub columns: Vec<Column>,
    pub pkey_name: Option<String>,
    pub pkey_columns: Vec<String>,
    pub rights: Rights,
    pub tombstones: Tombstones,
}

impl Facts {
    fn from_row(row: &Row) -> DbResult<Facts> {
        let tables: Vec<String> = get(row, "column_tables")?;
        let names: Vec<String> = get(row, "column_names")?;
        let types: Vec<String> = get(row, "column_types")?;
        let identity: Vec<bool> = get(row, "column_identity")?;
        let columns = tables
            .into_iter()
            .zip(names)
            .zip(types)
            .zip(identity)
            .map(|(((table, name), data_type), identity)| Column {
                table,
                name,
                data_type,
                identity,
            })
            .collect();
        Ok(Facts {
            session: Session::from_row(row)?,
            columns,
            pkey_name: get(row, "pkey_name")?,
            pkey_columns: get(row, "pkey_columns")?,
            rights: Rights {
                schema_usage: get(row, "schema_usage")?,
                messages_select: get(row, "messages_select")?,
                messages_insert: get(row, "messages_insert")?,
                streams_select: get(row, "streams_select")?,
                streams_insert: get(row, "streams_insert")?,
                streams_update: get(row, "streams_update")?,
                checkpoints_select: get(row, "checkpoints_select")?,
                sequence: get::<Option<String>>(row, "sequence_name")?
                    .zip(get::<Option<bool>>(row, "sequence_select")?),
            },
            tombstones: Tombstones::Unread,
        })
    }

    fn has_table(&self, table: &str) -> bool {
        self.columns.iter().any(|c| c.table == table)
    }

    fn column(&self, table: &str, name: &str) -> Option<&Column> {
        self.columns
            .iter()
            .find(|c| c.table == table && c.name == name)
    }
}

impl PostgresEngine {
    /// The query step: every fact `check` judges, from the database.
    pub(crate) async fn preflight_facts(&self) -> DbResult<Facts> {
        let conn = self.pool.checkout().await?;
        let row = conn
            .query_one(super::sql::PREFLIGHT, &[&self.schema.as_str()])
            .await
            .map_err(|e| self.error(&e, "preflight"))?;
        let mut facts = Facts::from_row(&row)?;
        let r = &facts.rights;
        let readable = r.schema_usage == Some(true)
            && r.messages_select == Some(true)
            && r.streams_select == Some(true);
        if readable && facts.has_table("messages") && facts.has_table("streams") {
            facts.tombstones = match conn
                .query_opt(&self.sql.tombstone_stream, &[&self.tombstone_stream])
                .await
            {
                Ok(None) => Tombstones::Absent,
                Ok(Some(r)) => Tombstones::Present(TombstoneStats {
                    version: get(&r, "version")?,
                    rows: get(&r, "rows")?,
                    min_position: get(&r, "min_position")?,
                    max_position: get(&r, "max_position")?,
                }),
                Err(e) => Tombstones::Failed(
                    self.target
                        .cs
                        .scrub(&format!("cannot read it: {}", describe(&e))),
                ),
            };
        }
        Ok(facts)
    }
}

/// The sequence that hands out the positions (`sql/postgres/sequence.sql`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Sequence {
    pub name: String,
    pub start: i64,
    pub increment: i64,
    pub cache: i64,
    /// Its last value handed out; `None` when it has handed out none or
    /// the login may not read it (`readable`).
    pub last_value: Option<i64>,
    pub readable: bool,
    /// Other tables that draw from it or own it.
    pub other_tables: Vec<String>,
}

impl Sequence {
    pub(super) fn from_row(row: &Row) -> DbResult<Sequence> {
        Ok(Sequence {
            name: get(row, "name")?,
            start: get(row, "start")?,
            increment: get(row, "increment")?,
            cache: get(row, "cache")?,
            last_value: None,
            readable: get(row, "readable")?,
            other_tables: get(row, "other_tables")?,
        })
    }
}

impl PostgresEngine {
    /// The identity sequence's finding, for every profile: `None` when the
    /// position has no sequence (the position's own check says so); when
    /// the facts cannot be read, a failed preflight finding that says why.
    pub(super) async fn sequence_finding(&self) -> Option<Finding> {
        self.sequence_facts().await.unwrap_or_else(|e| {
            // A missing right is the rights finding's to name.
            (e.code.as_deref() != Some("42501"))
                .then(|| Finding::fail(Check::Preflight, format!("identity sequence: {e}")))
        })
    }

    async fn sequence_facts(&self) -> DbResult<Option<Finding>> {
        let conn = self.pool.checkout().await?;
        // The head first: every row committed by then was drawn before, so
        // a sequence read afterwards stands at least as high unless rows
        // were written above it (read the other way round, an append
        // between the two reads looks like exactly that).
        let head = conn
            .query_one(&self.sql.head, &[])
            .await
            .map_err(|e| self.error(&e, "head"))?;
        let head: Option<i64> = get(&head, "head")?;
        let row = conn
            .query_opt(
                super::sql::SEQUENCE,
                &[&self.table_name(), &self.position_column()],
            )
            .await
            .map_err(|e| self.error(&e, "identity sequence"))?;
        let Some(row) = row else { return Ok(None) };
        let mut seq = Sequence::from_row(&row)?;
        if seq.readable {
            // From the relation: pg_sequence_last_value() would take the
            // lock the transaction-end proof reads as a writer's.
            let read = super::sql::HANDED_OUT
                .replace("__n__", "0")
                .replace("__sequence__", &seq.name);
            let row = conn
                .query_one(&read, &[])
                .await
                .map_err(|e| self.error(&e, "identity sequence"))?;
            seq.last_value = Some(get::<i64>(&row, "h")?).filter(|v| *v >= seq.start);
        }
        let login = self.login(&conn).await?;
        Ok(Some(sequence(&seq, head, &login)))
    }

    async fn login(&self, conn: &tokio_postgres::Client) -> DbResult<String> {
        conn.query_one("SELECT CURRENT_USER::text AS login", &[])
            .await
            .map_err(|e| self.error(&e, "login"))
            .and_then(|r| get(&r, "login"))
    }

    /// The unique keys on exactly the position: a failed position finding
    /// when each is DEFERRABLE (checked at commit, so a fill would not wait
    /// for an open append's key as it inserts, and would end in a
    /// commit-time lock timeout); `None` when one is checked as rows go in,
    /// or there is none (the position's own finding says so).
    pub(super) async fn position_key_finding(&self) -> Option<Finding> {
        let conn = self.pool.checkout().await.ok()?;
        let rows = conn
            .query(
                super::sql::POSITION_KEYS,
                &[&self.table_name(), &self.position_column()],
            )
            .await
            .ok()?;
        let keys: Vec<(String, bool)> = rows
            .iter()
            .filter_map(|r| Some((get(r, "name").ok()?, get(r, "immediate").ok()?)))
            .collect();
        deferrable_keys(&self.table_name(), &self.position_column(), &keys)
    }

    /// Which proof that a drawn position's transaction has ended is in
    /// force: PostgreSQL always has one (`pg_locks` is readable by every
    /// login); the sequence's last value, where the login may read it,
    /// covers each hole at once instead of once a scan has examined a row
    /// above it, and notices rows written above the identity.
    pub(super) async fn proof_finding(&self) -> Option<Finding> {
        let conn = self.pool.checkout().await.ok()?;
        let row = conn
            .query_opt(
                super::sql::IDENTITY_SEQUENCE,
                &[&self.table_name(), &self.position_column()],
            )
            .await
            .ok()??;
        let name: String = get(&row, "name").ok()?;
        let readable: bool = get(&row, "readable").ok()?;
        let login = self.login(&conn).await.ok()?;
        Some(proof(&name, readable, &login))
    }
}

/// The transaction-end proof's finding. Pure.
pub(crate) fn proof(sequence: &str, readable: bool, login: &str) -> Finding {
    let base = "in force: a hole is filled only once every transaction holding the identity's \
                sequence when it was read has ended (pg_locks, readable by every login)";
    if readable {
        Finding::pass(
            Check::TransactionProof,
            format!("{base}; how far {sequence} has handed out is read (SELECT on it)"),
        )
    } else {
        Finding::warn(
            Check::TransactionProof,
            format!(
                "{base}; {sequence}'s last value is not readable, so a hole is covered only once a \
                 scan has read a row above it, and rows written above the identity go unnoticed \
                 (the rights finding names the grant: SELECT on it for {})",
                quote_role(login)
            ),
        )
    }
}

/// A failed position finding when every unique key on the position is
/// DEFERRABLE. Pure.
pub(crate) fn deferrable_keys(
    table: &str,
    column: &str,
    keys: &[(String, bool)],
) -> Option<Finding> {
    if keys.is_empty() || keys.iter().any(|(_, immediate)| *immediate) {
        return None;
    }
    let names: Vec<&str> = keys.iter().map(|(n, _)| n.as_str()).collect();
    Some(Finding::fail(
        Check::GlobalPosition,
        format!(
            "{table}.{column}: its unique key ({}) is DEFERRABLE: checked at commit, a tombstone \
             would not wait for an open append's key as it goes in; make it NOT DEFERRABLE \
             (ALTER TABLE {table} ALTER CONSTRAINT ... NOT DEFERRABLE, or a non-deferrable \
             unique index on {column})",
            names.join(", ")
        ),
    ))
}

/// The identity sequence's verdict. Pure. Positions must be drawn by the
/// inserting statement itself, one at a time, from a sequence this table
/// alone draws from (the abandonment proof in ARCHITECTURE.md rests on
/// it), and nothing may lie above what it has handed out.
pub(crate) fn sequence(seq: &Sequence, head: Option<i64>, login: &str) -> Finding {
    let name = &seq.name;
    let mut wrong = Vec::new();
    if seq.cache > 1 {
        wrong.push(format!(
            "CACHE {}: each session pre-allocates {} values, so a hole may be a position another \
             session has drawn and will still insert (a tombstone there makes that insert fail, \
             or vanish under ON CONFLICT DO NOTHING); run ALTER SEQUENCE {name} CACHE 1",
            seq.cache, seq.cache
        ));
    }
    if seq.increment != 1 {
        wrong.push(format!(
            "INCREMENT {}: positions are not handed out one after another; gap-healer needs INCREMENT 1",
            seq.increment
        ));
    }
    if !seq.other_tables.is_empty() {
        wrong.push(format!(
            "also drawn from by {}: a hole may be a value another table took",
            seq.other_tables.join(", ")
        ));
    }
    if let (true, Some(head)) = (seq.readable, head) {
        let last = seq.last_value.unwrap_or(seq.start - 1);
        if last < head {
            wrong.push(format!(
                "its last value {last} lies below the table's highest position {head}: rows were \
                 written above what the identity has handed out (OVERRIDING SYSTEM VALUE without \
                 setval), so positions up to {head} will still be handed out and must not be \
                 filled; run SELECT setval('{name}', {head})"
            ));
        }
    }
    if !wrong.is_empty() {
        return Finding::fail(
            Check::IdentitySequence,
            format!("{name}: {}", wrong.join("; ")),
        );
    }
    let current = match (seq.readable, seq.last_value) {
        (true, Some(v)) => format!("last value {v}"),
        (true, None) => "no value handed out yet".into(),
        (false, _) => format!(
            "its last value is not readable, so a sequence behind the head goes unnoticed \
             (GRANT SELECT ON SEQUENCE {name} TO {};)",
            quote_role(login)
        ),
    };
    Finding::pass(
        Check::IdentitySequence,
        format!("{name}: INCREMENT 1, CACHE 1, drawn from by this table alone, {current}"),
    )
}

/// What the configuration says, beside the facts.
pub(crate) struct Expected<'a> {
    pub schema: &'a Ident,
    pub tombstone_stream: &'a str,
    pub tls: &'a TlsMode,
}

/// The verdicts, in the order `check` prints them. Pure.
pub(crate) fn findings(f: &Facts, want: &Expected<'_>) -> Vec<Finding> {
    let schema = want.schema.pg();
    let mut out = session(&f.session, want.tls, schema);
    if !f.session.schema_exists {
        return out;
    }

    for (check, table) in [
        (Check::MessagesTable, "messages"),
        (Check::StreamsTable, "streams"),
    ] {
        if !f.has_table(table) {
            out.push(Finding::fail(
                check,
                format!("{schema}.{table} does not exist"),
            ));
        }
    }
    if f.has_table("messages") {
        out.push(position(f));
        let missing: Vec<&str> = MESSAGES_COLUMNS
            .into_iter()
            .filter(|c| f.column("messages", c).is_none())
            .collect();
        out.push(if missing.is_empty() {
            Finding::pass(Check::MessagesColumns, "all Eventuous columns present")
        } else {
            Finding::fail(
                Check::MessagesColumns,
                format!("missing: {}", missing.join(", ")),
            )
        });
    }
    if f.has_table("streams") {
        let missing: Vec<&str> = STREAMS_COLUMNS
            .into_iter()
            .filter(|c| f.column("streams", c).is_none())
            .collect();
        out.push(if missing.is_empty() {
            Finding::pass(
                Check::StreamsColumns,
                "stream_id, stream_name, version present",
            )
        } else {
            Finding::fail(
                Check::StreamsColumns,
                format!("missing: {}", missing.join(", ")),
            )
        });
    }
    out.push(if f.has_table("checkpoints") {
        Finding::pass(
            Check::Checkpoints,
            "table present: start_from = checkpoints and lag metrics use it",
        )
    } else {
        Finding::pass(
            Check::Checkpoints,
            "table absent: start_from = checkpoints falls back to lookback below the head",
        )
    });
    out.push(rights(f, schema));
    if let Some(finding) = tombstone_stream(&f.tombstones, schema, want.tombstone_stream) {
        out.push(finding);
    }
    out
}

/// The server's version, the session's encryption and whether `schema`
/// exists, for every profile (the checks after these need the schema).
pub(super) fn session(s: &Session, tls: &TlsMode, schema: &str) -> Vec<Finding> {
    let version = &s.version;
    let connection = if s.version_num >= 130_000 {
        Finding::pass(Check::Connection, format!("PostgreSQL {version}"))
    } else {
        Finding::fail(
            Check::Connection,
            format!("PostgreSQL {version}: 13 or later is needed (gen_random_uuid)"),
        )
    };
    let tls = match (tls, s.encrypted) {
        (TlsMode::Off, _) => Finding::pass(
            Check::Tls,
            "off: not encrypted (sslmode=require or verify-full, with sslrootcert=FILE for a private CA, turns it on)",
        ),
        (TlsMode::Encrypted, Some(true)) => Finding::pass(
            Check::Tls,
            "on, server certificate NOT verified (sslmode=require): use verify-full with sslrootcert=FILE to know whom gap-healer writes to",
        ),
        (TlsMode::Allow | TlsMode::Prefer, Some(true)) => Finding::pass(
            Check::Tls,
            format!("on, server certificate NOT verified ({}): use verify-full with sslrootcert=FILE to know whom gap-healer writes to", tls.as_attempted(true)),
        ),
        (TlsMode::Allow | TlsMode::Prefer, _) => Finding::pass(
            Check::Tls,
            format!("off: not encrypted ({}): sslmode=require or verify-full refuses a server without TLS", tls.as_attempted(false)),
        ),
        (TlsMode::Verified { roots }, Some(true)) => Finding::pass(
            Check::Tls,
            format!("on, server certificate verified against {roots}"),
        ),
        (TlsMode::Encrypted | TlsMode::Verified { .. }, _) => Finding::fail(
            Check::Tls,
            "TLS was asked for but this session is not encrypted",
        ),
    };
    let schema = if s.schema_exists {
        Finding::pass(Check::Schema, format!("schema {schema} exists"))
    } else {
        Finding::fail(Check::Schema, format!("schema {schema} does not exist"))
    };
    vec![connection, tls, schema]
}

/// The fix [`plaintext_warning`] names.
const TLS_FIX: &str =
    "sslmode=verify-full (with sslrootcert=FILE for a private CA) encrypts and verifies the server";

/// Without TLS to a server on another machine (`remote`), the `tls`
/// finding is a warning instead of a pass: never a failure, since a
/// private network may be trusted on purpose.
pub(super) fn plaintext_warning(findings: &mut [Finding], tls: &TlsMode, remote: Option<&str>) {
    let (TlsMode::Off | TlsMode::Allow | TlsMode::Prefer, Some(host)) = (tls, remote) else {
        return;
    };
    for f in findings
        .iter_mut()
        .filter(|f| f.check == Check::Tls && f.ok && f.detail.starts_with("off"))
    {
        *f = crate::engine::check::plaintext_to(host, TLS_FIX);
    }
}

/// messages.global_position: bigint identity, and the primary key on exactly it.
fn position(f: &Facts) -> Finding {
    let Some(col) = f.column("messages", "global_position") else {
        return Finding::fail(
            Check::GlobalPosition,
            "messages.global_position: column missing",
        );
    };
    if col.data_type != "bigint" || !col.identity {
        return Finding::fail(
            Check::GlobalPosition,
            format!(
                "messages.global_position: expected bigint identity, found {}{}",
                col.data_type,
                if col.identity {
                    " identity"
                } else {
                    " without identity"
                }
            ),
        );
    }
    let pk = f.pkey_name.as_deref().unwrap_or_default();
    if f.pkey_columns == ["global_position"] {
        Finding::pass(
            Check::GlobalPosition,
            format!("messages.global_position: bigint identity, primary key {pk}"),
        )
    } else {
        Finding::fail(
            Check::GlobalPosition,
            format!(
                "messages.global_position: the primary key is on ({}), not (global_position): holes cannot be filled safely",
                f.pkey_columns.join(", ")
            ),
        )
    }
}

/// The rights the fill needs (those of `sql/postgres/grants.sql`), and the
/// GRANT statements that give the missing ones to this login.
fn rights(f: &Facts, schema: &str) -> Finding {
    let r = &f.rights;
    let to = quote_role(&f.session.login);
    let mut missing = Vec::new();
    let mut grants = Vec::new();
    if r.schema_usage == Some(false) {
        missing.push(format!("USAGE on schema {schema}"));
        grants.push(format!("GRANT USAGE ON SCHEMA {schema} TO {to};"));
    }
    for (table, wanted) in [
        (
            "messages",
            &[(r.messages_select, "SELECT"), (r.messages_insert, "INSERT")][..],
        ),
        (
            "streams",
            &[
                (r.streams_select, "SELECT"),
                (r.streams_insert, "INSERT (stream_name, version)"),
                (r.streams_update, "UPDATE (version)"),
            ],
        ),
        // Optional: without the table, nothing to grant (None).
        ("checkpoints", &[(r.checkpoints_select, "SELECT")]),
    ] {
        let lacking: Vec<&str> = wanted
            .iter()
            .filter(|(granted, _)| *granted == Some(false))
            .map(|(_, right)| *right)
            .collect();
        if lacking.is_empty() {
            continue;
        }
        missing.extend(
            lacking
                .iter()
                .map(|right| format!("{right} on {schema}.{table}")),
        );
        grants.push(format!(
            "GRANT {} ON {schema}.{table} TO {to};",
            lacking.join(", ")
        ));
    }
    if let Some((sequence, false)) = &r.sequence {
        missing.push(format!("SELECT on sequence {sequence}"));
        grants.push(format!("GRANT SELECT ON SEQUENCE {sequence} TO {to};"));
    }
    if missing.is_empty() {
        Finding::pass(
            Check::Rights,
            "USAGE on the schema; SELECT, INSERT on messages; SELECT, INSERT, UPDATE on streams; SELECT on checkpoints and on the identity's sequence",
        )
    } else {
        Finding::fail(
            Check::Rights,
            format!(
                "missing {}; as the schema's owner, run: {} (every grant the healer needs: `gap-healer sql --engine postgres --schema {schema}`)",
                missing.join(", "),
                grants.join(" ")
            ),
        )
    }
}

/// A role's name as a GRANT takes it: bare when it is a plain lower-case
/// identifier, else double-quoted.
pub(crate) fn quote_role(role: &str) -> String {
    let plain = role
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && role
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        role.to_string()
    } else {
        format!("\"{}\"", role.replace('"', "\"\""))
    }
}

/// The tombstone stream, if it exists, must be consistent: positions
/// 0..n-1, version n-1. When it is not, the finding says how to repair it.
fn tombstone_stream(t: &Tombstones, schema: &str, stream: &str) -> Option<Finding> {
    Some(match t {
        Tombstones::Unread => return None,
        Tombstones::Absent => Finding::pass(
            Check::TombstoneStream,
            format!("{stream} not created yet (made on the first fill)"),
        ),
        Tombstones::Failed(why) => Finding::fail(Check::TombstoneStream, why.clone()),
        Tombstones::Present(s) => {
            let contiguous = s.max_position == s.rows - 1 && s.min_position == 0;
            if s.version == s.rows - 1 && contiguous {
                Finding::pass(
                    Check::TombstoneStream,
                    format!("{} tombstones, version {}", s.rows, s.version),
                )
            } else {
                let literal = format!("'{}'", stream.replace('\'', "''"));
                let repair = if contiguous {
                    // Only the Version is off (Eventuous's own gap tombstones
                    // bump it without a row): set it to the last position.
                    format!(
                        "the positions are 0..{} but the version is {}; with the healers stopped, run: UPDATE {schema}.streams AS s SET version = (SELECT MAX(m.stream_position) FROM {schema}.messages AS m WHERE m.stream_id = s.stream_id) WHERE s.stream_name = {literal}; (and turn off Eventuous's GapHandlingTimeoutMs tombstones, which bump the version without a row)",
                        s.max_position, s.version
                    )
                } else {
                    // Positions with gaps: something else writes this stream.
                    format!(
                        "the positions are not 0..{}: something other than gap-healer writes this stream; stop the healers and give them a new tombstone_stream (for example {stream}_2; the old stream stays as it is), or, if the version alone is ahead of the last position, run: UPDATE {schema}.streams AS s SET version = (SELECT MAX(m.stream_position) FROM {schema}.messages AS m WHERE m.stream_id = s.stream_id) WHERE s.stream_name = {literal};",
                        s.rows - 1
                    )
                };
                Finding::fail(
                    Check::TombstoneStream,
                    format!(
                        "inconsistent: {} rows, positions {}..{}, version {}: {repair}",
                        s.rows, s.min_position, s.max_position, s.version
                    ),
                )
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::check::shape_verdict;

    fn col(table: &str, name: &str, data_type: &str, identity: bool) -> Column {
        Column {
            table: table.into(),
            name: name.into(),
            data_type: data_type.into(),
            identity,
        }
    }

    fn healthy() -> Facts {
        let mut columns = vec![col("messages", "global_position", "bigint", true)];
        columns.extend(
            MESSAGES_COLUMNS
                .iter()
                .map(|c| col("messages", c, "text", false)),
        );
        columns.extend(
            STREAMS_COLUMNS
                .iter()
                .map(|c| col("streams", c, "integer", false)),
        );
        columns.push(col("checkpoints", "id", "text", false));
        let yes = Some(true);
        Facts {
            session: Session {
                version: "15.19".into(),
                version_num: 150_019,
                encrypted: Some(false),
                login: "gap_healer".into(),
                schema_exists: true,
            },
            columns,
            pkey_name: Some("messages_pkey".into()),
            pkey_columns: vec!["global_position".into()],
            rights: Rights {
                schema_usage: yes,
                messages_select: yes,
                messages_insert: yes,
                streams_select: yes,
                streams_insert: yes,
                streams_update: yes,
                checkpoints_select: yes,
                sequence: Some(("eventuous.messages_global_position_seq".into(), true)),
            },
            tombstones: Tombstones::Absent,
        }
    }

    fn judge(f: &Facts) -> Vec<Finding> {
        findings(
            f,
            &Expected {
                schema: &Ident::parse("eventuous").unwrap(),
                tombstone_stream: "__tombstones__",
                tls: &TlsMode::Off,
            },
        )
    }

    fn find(out: &[Finding], check: Check) -> &Finding {
        out.iter()
            .find(|f| f.check == check)
            .unwrap_or_else(|| panic!("no {check} finding in {out:?}"))
    }

    #[test]
    fn a_healthy_store_passes_every_check() {
        let out = judge(&healthy());
        assert!(out.iter().all(|f| f.ok), "{out:?}");
        assert_eq!(shape_verdict(&out), Ok(()));
        assert_eq!(
            find(&out, Check::TombstoneStream).detail,
            "__tombstones__ not created yet (made on the first fill)"
        );
    }

    #[test]
    fn an_old_server_fails_connection() {
        let mut f = healthy();
        f.session.version_num = 120_010;
        assert!(!find(&judge(&f), Check::Connection).ok);
    }

    #[test]
    fn a_missing_schema_stops_the_checks() {
        let mut f = healthy();
        f.session.schema_exists = false;
        let out = judge(&f);
        assert_eq!(out.last().unwrap().check, Check::Schema);
        assert!(shape_verdict(&out).is_err());
    }

    #[test]
    fn wrong_position_shapes_are_refused() {
        let mut f = healthy();
        f.pkey_columns = vec!["message_id".into()];
        let out = judge(&f);
        let why = shape_verdict(&out).unwrap_err();
        assert!(why.contains("primary key is on (message_id)"), "{why}");

        let mut f = healthy();
        f.columns[0].data_type = "integer".into();
        let why = shape_verdict(&judge(&f)).unwrap_err();
        assert!(
            why.contains("expected bigint identity, found integer identity"),
            "{why}"
        );

        let mut f = healthy();
        f.columns[0].identity = false;
        let why = shape_verdict(&judge(&f)).unwrap_err();
        assert!(why.contains("without identity"), "{why}");

        let mut f = healthy();
        f.columns.retain(|c| c.name != "global_position");
        let why = shape_verdict(&judge(&f)).unwrap_err();
        assert!(why.contains("column missing"), "{why}");
    }

    #[test]
    fn missing_tables_and_columns_are_refused() {
        let mut f = healthy();
        f.columns.retain(|c| c.table != "streams");
        let why = shape_verdict(&judge(&f)).unwrap_err();
        assert!(why.contains("eventuous.streams does not exist"), "{why}");

        let mut f = healthy();
        f.columns.retain(|c| c.name != "created");
        let why = shape_verdict(&judge(&f)).unwrap_err();
        assert!(why.contains("missing: created"), "{why}");
    }

    #[test]
    fn missing_rights_name_the_grant_and_are_not_shape() {
        let mut f = healthy();
        f.rights.messages_select = Some(false);
        f.rights.streams_update = Some(false);
        let out = judge(&f);
        let rights = find(&out, Check::Rights);
        assert!(!rights.ok);
        assert!(
            rights.detail.starts_with(
                "missing SELECT on eventuous.messages, UPDATE (version) on eventuous.streams; \
                 as the schema's owner, run: GRANT SELECT ON eventuous.messages TO gap_healer; \
                 GRANT UPDATE (version) ON eventuous.streams TO gap_healer;"
            ),
            "{}",
            rights.detail
        );
        assert_eq!(shape_verdict(&out), Ok(()));

        // Nothing at all: every grant of grants.sql, each statement valid as it is.
        let mut f = healthy();
        f.session.login = "App User".into();
        f.rights = Rights {
            schema_usage: Some(false),
            messages_select: Some(false),
            messages_insert: Some(false),
            streams_select: Some(false),
            streams_insert: Some(false),
            streams_update: Some(false),
            checkpoints_select: Some(false),
            sequence: Some(("eventuous.messages_global_position_seq".into(), false)),
        };
        let detail = find(&judge(&f), Check::Rights).detail.clone();
        for grant in [
            "GRANT USAGE ON SCHEMA eventuous TO \"App User\";",
            "GRANT SELECT, INSERT ON eventuous.messages TO \"App User\";",
            "GRANT SELECT, INSERT (stream_name, version), UPDATE (version) ON eventuous.streams TO \"App User\";",
            "GRANT SELECT ON eventuous.checkpoints TO \"App User\";",
        ] {
            assert!(detail.contains(grant), "{grant} not in {detail}");
        }
        // No checkpoints table: nothing to grant on it.
        f.rights.checkpoints_select = None;
        let detail = find(&judge(&f), Check::Rights).detail.clone();
        assert!(!detail.contains("checkpoints"), "{detail}");
    }

    /// Each `GRANT ...;` statement of a text.
    fn grants_in(text: &str) -> Vec<String> {
        text.match_indices("GRANT ")
            .filter_map(|(i, _)| text[i..].find(';').map(|end| text[i..=i + end].to_string()))
            .collect()
    }

    /// Issue 27: `check` advised `GRANT SELECT ON SEQUENCE`, which `sql`
    /// did not print. Every grant `check` can ask of a login that has
    /// nothing is one that `sql` prints for it.
    #[test]
    fn every_grant_check_can_ask_for_is_one_sql_prints() {
        let mut f = healthy();
        f.rights = Rights {
            schema_usage: Some(false),
            messages_select: Some(false),
            messages_insert: Some(false),
            streams_select: Some(false),
            streams_insert: Some(false),
            streams_update: Some(false),
            checkpoints_select: Some(false),
            sequence: Some(("eventuous.messages_global_position_seq".into(), false)),
        };
        let name = "eventuous.messages_global_position_seq";
        let unreadable = Sequence {
            name: name.into(),
            readable: false,
            last_value: None,
            ..seq()
        };
        let mut advised: std::collections::BTreeSet<String> =
            grants_in(&find(&judge(&f), Check::Rights).detail)
                .into_iter()
                .collect();
        advised.extend(grants_in(
            &sequence(&unreadable, Some(1), "gap_healer").detail,
        ));
        advised.extend(grants_in(&proof(name, false, "gap_healer").detail));
        assert_eq!(advised.len(), 5, "{advised:?}");
        let sql = super::super::sql::setup_sql(
            &Ident::parse("eventuous").unwrap(),
            &crate::engine::profile::TableShape::eventuous(),
        )
        .replace(crate::engine::HEALER_ROLE, "gap_healer");
        for grant in advised {
            assert!(sql.contains(&grant), "{grant} is not in `sql`:\n{sql}");
        }
    }

    #[test]
    fn a_deferrable_position_key_is_refused() {
        let keys = |k: &[(&str, bool)]| -> Vec<(String, bool)> {
            k.iter().map(|(n, i)| (n.to_string(), *i)).collect()
        };
        let f = deferrable_keys(
            "es.messages",
            "global_position",
            &keys(&[("messages_pkey", false)]),
        )
        .expect("refused");
        assert!(!f.ok && f.check.is_shape(), "{f:?}");
        assert!(f.detail.contains("DEFERRABLE"), "{}", f.detail);
        // One key checked as rows go in is enough: that one makes the fill wait.
        assert_eq!(
            deferrable_keys(
                "es.messages",
                "global_position",
                &keys(&[("messages_pkey", false), ("messages_position_key", true)])
            ),
            None
        );
        assert_eq!(deferrable_keys("es.messages", "global_position", &[]), None);
    }

    #[test]
    fn roles_are_quoted_when_they_must_be() {
        assert_eq!(quote_role("gap_healer"), "gap_healer");
        assert_eq!(quote_role("Healer"), "\"Healer\"");
        assert_eq!(quote_role("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_role("1x"), "\"1x\"");
    }

    #[test]
    fn tombstone_stream_consistency() {
        let mut f = healthy();
        f.tombstones = Tombstones::Present(TombstoneStats {
            version: 2,
            rows: 3,
            min_position: 0,
            max_position: 2,
        });
        assert!(find(&judge(&f), Check::TombstoneStream).ok);
        f.tombstones = Tombstones::Present(TombstoneStats {
            version: 5,
            rows: 3,
            min_position: 0,
            max_position: 2,
        });
        let out = judge(&f);
        let t = find(&out, Check::TombstoneStream);
        assert!(!t.ok);
        assert!(
            t.detail.starts_with(
                "inconsistent: 3 rows, positions 0..2, version 5: the positions are 0..2 but the version is 5; \
                 with the healers stopped, run: UPDATE eventuous.streams AS s SET version = \
                 (SELECT MAX(m.stream_position) FROM eventuous.messages AS m WHERE m.stream_id = s.stream_id) \
                 WHERE s.stream_name = '__tombstones__';"
            ),
            "{}",
            t.detail
        );
        f.tombstones = Tombstones::Present(TombstoneStats {
            version: 3,
            rows: 3,
            min_position: 0,
            max_position: 3,
        });
        let t = find(&judge(&f), Check::TombstoneStream).detail.clone();
        assert!(t.contains("new tombstone_stream"), "{t}");
        f.tombstones = Tombstones::Unread;
        assert!(judge(&f).iter().all(|x| x.check != Check::TombstoneStream));
    }

    #[test]
    fn no_tls_to_another_machine_is_a_warning_not_a_failure() {
        let mut out = judge(&healthy());
        plaintext_warning(&mut out, &TlsMode::Off, None);
        assert!(!find(&out, Check::Tls).warning, "a local server");
        plaintext_warning(&mut out, &TlsMode::Encrypted, Some("db.example.com"));
        assert!(!find(&out, Check::Tls).warning, "encrypted");
        plaintext_warning(&mut out, &TlsMode::Off, Some("db.example.com"));
        let tls = find(&out, Check::Tls);
        assert!(tls.ok && tls.warning, "{tls:?}");
        assert!(
            tls.detail.contains("to db.example.com") && tls.detail.contains("sslmode=verify-full"),
            "{tls:?}"
        );
    }

    #[test]
    fn tls_asked_for_but_not_encrypted_fails() {
        let f = healthy();
        let tls = TlsMode::Verified {
            roots: "system roots".into(),
        };
        let out = findings(
            &f,
            &Expected {
                schema: &Ident::parse("eventuous").unwrap(),
                tombstone_stream: "t",
                tls: &tls,
            },
        );
        assert!(!find(&out, Check::Tls).ok);
    }

    fn seq() -> Sequence {
        Sequence {
            name: "es.messages_global_position_seq".into(),
            start: 1,
            increment: 1,
            cache: 1,
            last_value: Some(10),
            readable: true,
            other_tables: vec![],
        }
    }

    #[test]
    fn a_sequence_drawn_one_by_one_by_this_table_alone_passes() {
        let f = sequence(&seq(), Some(10), "healer");
        assert!(f.ok, "{}", f.detail);
        assert!(f.detail.contains("last value 10"), "{}", f.detail);
        assert!(Check::IdentitySequence.is_shape());
        // Unreadable: passes, and says what it cannot see and which grant shows it.
        let f = sequence(
            &Sequence {
                readable: false,
                last_value: None,
                ..seq()
            },
            Some(10),
            "healer",
        );
        assert!(f.ok);
        assert!(
            f.detail
                .contains("GRANT SELECT ON SEQUENCE es.messages_global_position_seq TO healer"),
            "{}",
            f.detail
        );
        // An empty table whose sequence handed out nothing yet.
        assert!(
            sequence(
                &Sequence {
                    last_value: None,
                    ..seq()
                },
                None,
                "h"
            )
            .ok
        );
    }

    #[test]
    fn cache_increment_other_tables_and_a_sequence_behind_the_head_each_fail_and_say_why() {
        let f = sequence(&Sequence { cache: 20, ..seq() }, Some(10), "h");
        assert!(!f.ok);
        assert!(f.detail.contains("CACHE 20"), "{}", f.detail);
        assert!(f
            .detail
            .contains("ALTER SEQUENCE es.messages_global_position_seq CACHE 1"));
        let f = sequence(
            &Sequence {
                increment: 5,
                ..seq()
            },
            Some(10),
            "h",
        );
        assert!(!f.ok && f.detail.contains("INCREMENT 5"), "{}", f.detail);
        let f = sequence(
            &Sequence {
                other_tables: vec!["es.audit".into()],
                ..seq()
            },
            Some(10),
            "h",
        );
        assert!(
            !f.ok && f.detail.contains("also drawn from by es.audit"),
            "{}",
            f.detail
        );
        let f = sequence(&seq(), Some(100), "h");
        assert!(!f.ok);
        assert!(
            f.detail
                .contains("last value 10 lies below the table's highest position 100"),
            "{}",
            f.detail
        );
        assert!(f
            .detail
            .contains("setval('es.messages_global_position_seq', 100)"));
        // Never called, yet rows exist (all written with OVERRIDING SYSTEM VALUE).
        let f = sequence(
            &Sequence {
                last_value: None,
                ..seq()
            },
            Some(3),
            "h",
        );
        assert!(!f.ok && f.detail.contains("last value 0"), "{}", f.detail);
        // Several reasons at once, all named.
        let f = sequence(
            &Sequence {
                cache: 2,
                increment: 2,
                ..seq()
            },
            Some(10),
            "h",
        );
        assert!(f.detail.contains("CACHE 2") && f.detail.contains("INCREMENT 2"));
    }
}
