//! The rules that span several keys of one store, read after the table:
//! the connection string (from exactly one of `connection_string` and
//! `connection_string_file`, checked by the engine's parser), the table
//! profile (each key only where its profile reads it), the tombstone
//! stream's and type's defaults per profile, and the leader key's default.
//! Each reads the typed fields of what was read ([`StoreKeys`]) and says
//! every problem it finds; what they make ([`Resolved`]) goes with the keys
//! into the store's settings ([`super::settings`]).

use crate::engine::profile::{
    looks_like_dotnet_guid, ProfileKind, TableShape, Tombstone, TombstoneColumn,
    LEDGER_CORE_TOMBSTONE_STREAM, SQLSTREAMSTORE_TOMBSTONE_STREAM, SQLSTREAMSTORE_TOMBSTONE_TYPE,
};
use crate::engine::{EngineKind, Ident};
use crate::secret::ConnectionString;

use super::problem::Problems;
use super::read::{Read, StoreKeys};

/// What a subcommand needs from the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Everything, including a connection string (run, scan, heal, check, install, config).
    Connection,
    /// Engine and schema only (sql).
    EngineOnly,
}

/// What the rules that span several keys make of them.
pub(super) struct Resolved {
    pub(super) connection_string: ConnectionString,
    pub(super) profile: TableShape,
    /// `tombstone_stream`, or the profile's own default when not given.
    pub(super) tombstone_stream: String,
    /// `tombstone_type`, or the profile's own default when not given.
    pub(super) tombstone_type: String,
    pub(super) leader_key: String,
}

/// The rules over one store's keys, saying their problems to `problems`.
pub(super) struct Rules<'a> {
    pub(super) keys: &'a StoreKeys,
    pub(super) problems: &'a mut Problems,
    /// Where each key's value came from, for `gap-healer config`: a
    /// connection string read from a file is shown with the file's origin.
    pub(super) origins: &'a mut Vec<(&'static str, String)>,
}

impl Rules<'_> {
    /// The connection string, the table profile and the leader key's
    /// default. `Err`: the key of a rule that refused (each says why; all
    /// are checked).
    pub(super) fn resolve(&mut self, need: Need) -> Result<Resolved, &'static str> {
        let k = self.keys;
        let engine = k.engine.get();
        let connection_string = self.connection_string(engine, need);
        let tombstone_stream = tombstone_stream(k);
        let tombstone_type = tombstone_type(k);
        let profile = self.profile(
            engine,
            tombstone_stream.as_deref().ok(),
            tombstone_type.as_deref().ok(),
        );
        let connection_string = connection_string.ok_or("connection_string")?;
        let (profile, tombstone_stream, tombstone_type) = (
            profile.ok_or("profile")?,
            tombstone_stream?,
            tombstone_type?,
        );
        let leader_key = match k.leader_key.get() {
            Some(key) => key,
            None => {
                let schema = k.schema.value().ok_or("schema")?;
                format!("gap-healer:{}", profile.leader_scope(schema))
            }
        };
        Ok(Resolved {
            connection_string,
            profile,
            tombstone_stream,
            tombstone_type,
            leader_key,
        })
    }

    /// A problem of a key a layer set, where it was set (a key no layer set
    /// has nothing to refuse).
    fn refuse<T>(&mut self, read: &Read<T>, why: String) {
        if let Some(given) = read.given() {
            self.problems.refuse(given, why);
        }
    }

    /// The store's table profile from `profile`, `table`, `position_column`,
    /// `columns` and `tombstone_stream_id`: each key only where its profile
    /// reads it, and what a profile needs present. `stream` and `kind_of`:
    /// the resolved `tombstone_stream` and `tombstone_type` (`None` when
    /// refused), which ledger-core's and sqlstreamstore's rows name.
    fn profile(
        &mut self,
        engine: Option<EngineKind>,
        stream: Option<&str>,
        kind_of: Option<&str>,
    ) -> Option<TableShape> {
        let k = self.keys;
        let kind = k.profile.get()?;
        if kind != ProfileKind::Eventuous
            && engine.is_some_and(|e| !crate::engine::heals_table_profiles(e))
        {
            self.refuse(
                &k.profile,
                format!("{kind}: not healed by this engine (it heals Eventuous's table)"),
            );
            return None;
        }
        let mssql = engine == Some(EngineKind::Mssql);
        if kind == ProfileKind::LedgerCore && mssql {
            self.refuse(
                &k.profile,
                "ledger-core: PostgreSQL only (seed 003's events table is a PostgreSQL schema); describe a SQL Server table with profile = \"custom\"".into(),
            );
            return None;
        }
        match kind {
            ProfileKind::Eventuous => self.eventuous_profile(),
            ProfileKind::LedgerCore => self.ledger_core_profile(stream),
            ProfileKind::SqlStreamStore => self.sqlstreamstore_profile(stream, kind_of, mssql),
            ProfileKind::Custom => self.custom_profile(),
        }
    }

    /// Eventuous's own tables: `table` and `position_column` only as its
    /// names, no tombstone columns.
    fn eventuous_profile(&mut self) -> Option<TableShape> {
        let k = self.keys;
        let shape = TableShape::eventuous();
        for (read, fixed) in [
            (&k.table, &shape.table),
            (&k.position_column, &shape.position),
        ] {
            let fixed = fixed.as_str();
            if read.value().is_some_and(|v| v.as_str() != fixed) {
                self.refuse(read, format!("the eventuous profile heals {fixed}; to heal another table, set profile = \"ledger-core\" or \"custom\""));
            }
        }
        let why = "not read by the eventuous profile (its tombstone is Eventuous's own row); set profile = \"custom\" to describe another table";
        self.refuse(&k.columns, why.into());
        self.refuse(&k.tombstone_stream_id, why.into());
        Some(shape)
    }

    /// Seed 003's `events` table: its fixed tombstone row, its default names.
    fn ledger_core_profile(&mut self, stream: Option<&str>) -> Option<TableShape> {
        let k = self.keys;
        let kind = ProfileKind::LedgerCore;
        self.refuse(&k.columns, "the ledger-core profile's tombstone row is fixed; set profile = \"custom\" to describe your own".into());
        let preset =
            |name: Option<&str>| Ident::parse(name.unwrap_or_default()).expect("a preset name");
        let table = k
            .table
            .get()
            .unwrap_or_else(|| preset(kind.default_table()));
        let position = k
            .position_column
            .get()
            .unwrap_or_else(|| preset(kind.default_position()));
        let stream_id = k.tombstone_stream_id.value()?;
        let event_type = k.tombstone_type.value()?;
        Some(TableShape::ledger_core(
            table, position, stream?, stream_id, event_type,
        ))
    }

    /// SQLStreamStore's `messages` and `streams`: `table` and
    /// `position_column` only as its names (SQLStreamStore names its
    /// tables itself), no tombstone columns; a tombstone stream name
    /// SQLStreamStore would take as a stream id of its own (no whitespace,
    /// not a GUID, which it would keep unhashed).
    fn sqlstreamstore_profile(
        &mut self,
        stream: Option<&str>,
        kind_of: Option<&str>,
        mssql: bool,
    ) -> Option<TableShape> {
        let k = self.keys;
        let kind = ProfileKind::SqlStreamStore;
        for (read, name) in [
            (&k.table, kind.default_table()),
            (&k.position_column, kind.default_position()),
        ] {
            if read.value().is_some_and(|v| Some(v.as_str()) != name) {
                self.refuse(read, "the sqlstreamstore profile heals SQLStreamStore's messages.position (SQLStreamStore names its tables itself; `schema` says where they are); to heal another table, set profile = \"custom\"".to_string());
            }
        }
        let why = "not read by the sqlstreamstore profile (its tombstone is a message of tombstone_stream, typed tombstone_type)";
        self.refuse(&k.columns, why.into());
        self.refuse(&k.tombstone_stream_id, why.into());
        let stream = stream?;
        if stream.chars().any(char::is_whitespace) {
            self.refuse(
                &k.tombstone_stream,
                "SQLStreamStore refuses a stream id with whitespace".into(),
            );
            return None;
        }
        if looks_like_dotnet_guid(stream) {
            self.refuse(&k.tombstone_stream, "SQLStreamStore keeps a stream id that reads as a GUID unhashed, a key its own streams may use: name the tombstone stream otherwise".into());
            return None;
        }
        Some(if mssql {
            TableShape::sqlstreamstore_mssql(stream, kind_of?)
        } else {
            TableShape::sqlstreamstore(stream, kind_of?)
        })
    }

    /// A table described by `table`, `position_column` and `columns`, all required.
    fn custom_profile(&mut self) -> Option<TableShape> {
        let k = self.keys;
        let why = "not read by the custom profile: its tombstone row is `columns`";
        self.refuse(&k.tombstone_stream, why.into());
        self.refuse(&k.tombstone_type, why.into());
        self.refuse(&k.tombstone_stream_id, why.into());
        let table: Option<Ident> = k.table.get();
        let position: Option<Ident> = k.position_column.get();
        let columns: Option<Vec<TombstoneColumn>> = k.columns.get();
        for (key, value, given) in [
            ("table", table.is_some(), k.table.is_given()),
            (
                "position_column",
                position.is_some(),
                k.position_column.is_given(),
            ),
            ("columns", columns.is_some(), k.columns.is_given()),
        ] {
            // A key that was set but invalid has its own problem already.
            if !value && !given {
                self.problems
                    .say(key, "nowhere", "required by profile = \"custom\"");
            }
        }
        let (table, position, columns) = (table?, position?, columns?);
        if columns.iter().any(|c| c.name == position) {
            self.refuse(
                &k.columns,
                format!(
                    "{} is the position column: the fill writes it",
                    position.as_str()
                ),
            );
            return None;
        }
        Some(TableShape {
            kind: ProfileKind::Custom,
            table,
            position,
            tombstone: Tombstone::Columns(columns),
        })
    }

    /// The connection string from `connection_string` or `connection_string_file`,
    /// checked by the engine's own parser. Never echoes the value. When both
    /// are set, the one from the higher layer wins (`GAP_HEALER_CONNECTION_STRING`
    /// over a file's `connection_string_file`); both in one layer is a problem.
    fn connection_string(
        &mut self,
        engine: Option<EngineKind>,
        need: Need,
    ) -> Option<ConnectionString> {
        let k = self.keys;
        let (text, origin) = match (
            k.connection_string.given(),
            k.connection_string_file.given(),
        ) {
            (Some(inline), Some(file)) if inline.rank > file.rank => {
                (inline.text.clone(), inline.origin.clone())
            }
            (Some(inline), Some(file)) if inline.rank == file.rank => {
                self.problems.say(
                    "connection_string",
                    &format!("{} and {}", inline.origin, file.origin),
                    "set connection_string or connection_string_file, not both",
                );
                return None;
            }
            (Some(inline), None) => (inline.text.clone(), inline.origin.clone()),
            (_, Some(file)) => match read_small(&file.text) {
                Ok(text) => {
                    // The value shown as connection_string is the file's: so
                    // is its origin (the key's own, read first, lost).
                    let origin = format!("file {} named by {}", file.text, file.origin);
                    self.origins.retain(|(k, _)| *k != "connection_string");
                    self.origins.push(("connection_string", origin.clone()));
                    (text.trim_end_matches(['\r', '\n']).to_string(), origin)
                }
                Err(e) => {
                    self.problems
                        .refuse_text(file, format!("cannot read the file: {e}"));
                    return None;
                }
            },
            (None, None) => {
                return match need {
                    Need::EngineOnly => Some(ConnectionString::new("")),
                    Need::Connection => {
                        self.problems.say(
                            "connection_string",
                            "nowhere",
                            "required: set GAP_HEALER_CONNECTION_STRING, connection_string_file, or --connection-string",
                        );
                        None
                    }
                };
            }
        };
        let cs = ConnectionString::new(text);
        if cs.is_empty() {
            if need == Need::Connection {
                self.problems.say("connection_string", &origin, "is empty");
                return None;
            }
            return Some(cs);
        }
        if let Some(engine) = engine {
            if let Err(message) = crate::engine::check_connection_string(engine, &cs) {
                self.problems.say("connection_string", &origin, message);
                return None;
            }
        }
        Some(cs)
    }
}

/// `tombstone_stream` as given, else the profile's default (`$gap` for
/// ledger-core, `$gap-healer-tombstones` for sqlstreamstore, Eventuous's
/// for the others).
fn tombstone_stream(k: &StoreKeys) -> Result<String, &'static str> {
    let own = match k.profile.get() {
        Some(ProfileKind::LedgerCore) => Some(LEDGER_CORE_TOMBSTONE_STREAM),
        Some(ProfileKind::SqlStreamStore) => Some(SQLSTREAMSTORE_TOMBSTONE_STREAM),
        _ => None,
    };
    match own.filter(|_| !k.tombstone_stream.is_given()) {
        Some(name) => Ok(name.into()),
        None => k.tombstone_stream.get().ok_or("tombstone_stream"),
    }
}

/// `tombstone_type` as given, else the profile's default
/// (`$gap-healer-tombstone` for sqlstreamstore, Eventuous's `$tombstone`
/// for the others).
fn tombstone_type(k: &StoreKeys) -> Result<String, &'static str> {
    let sqlstreamstore = k.profile.get() == Some(ProfileKind::SqlStreamStore);
    match sqlstreamstore && !k.tombstone_type.is_given() {
        true => Ok(SQLSTREAMSTORE_TOMBSTONE_TYPE.into()),
        false => k.tombstone_type.get().ok_or("tombstone_type"),
    }
}

/// A secret file of at most 64 KiB (a connection string, not `/dev/zero`).
fn read_small(path: &str) -> std::io::Result<String> {
    use std::io::Read;
    const MAX: u64 = 64 * 1024;
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX {
        return Err(std::io::Error::other(
            "larger than 64 KiB: not a connection string",
        ));
    }
    Ok(text)
}
