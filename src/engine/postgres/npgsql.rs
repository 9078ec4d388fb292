//! Npgsql connection strings (`Host=db;Port=5432;Username=app;Password=..;
//! Database=es;SSL Mode=Require`), the form Eventuous's .NET applications
//! hold, turned into the libpq key/value form the rest of the engine reads.
//!
//! Keys are case- and space-insensitive; values may be quoted as ADO.NET
//! quotes them ([`crate::engine::keywords::split_ado`]). Errors name keys,
//! never values.

use crate::engine::keywords::{split_ado, AdoError};

/// The forms a PostgreSQL connection string may take, for error messages.
pub const ACCEPTED_FORMS: &str =
    "accepted forms: libpq key/value (host=db port=5432 user=app dbname=es), \
     a URL (postgres://app@db:5432/es), or Npgsql (Host=db;Port=5432;Username=app;Database=es)";

/// Npgsql's keys (lower case, inner spaces single) and the libpq key each becomes.
const KEYS: &[(&[&str], Target)] = &[
    (&["host", "server"], Target::Libpq("host")),
    (&["port"], Target::Libpq("port")),
    (
        &["username", "user name", "user id", "userid", "user", "uid"],
        Target::Libpq("user"),
    ),
    (&["password", "pwd", "psw"], Target::Libpq("password")),
    (&["database", "db"], Target::Libpq("dbname")),
    (&["ssl mode", "sslmode"], Target::SslMode),
    (
        &["root certificate", "rootcertificate"],
        Target::Libpq("sslrootcert"),
    ),
    (&["timeout"], Target::Libpq("connect_timeout")),
    (
        &["application name", "applicationname"],
        Target::Libpq("application_name"),
    ),
    (
        &["command timeout", "commandtimeout"],
        Target::Setting("statement_timeout", "s"),
    ),
    (
        &["search path", "searchpath"],
        Target::Setting("search_path", ""),
    ),
    (
        &["trust server certificate", "trustservercertificate"],
        Target::Ignored,
    ),
    // Npgsql's own client behaviour (its pool, error detail, prepared
    // statements, buffers): meaningful to the application, not to the healer.
    (
        &[
            "include error detail",
            "includeerrordetail",
            "pooling",
            "minimum pool size",
            "maximum pool size",
            "connection idle lifetime",
            "connection pruning interval",
            "connection lifetime",
            "enlist",
            "no reset on close",
            "log parameters",
            "multiplexing",
            "max auto prepare",
            "auto prepare min usages",
            "keepalive",
            "tcp keepalive",
            "read buffer size",
            "write buffer size",
        ],
        Target::Ignored,
    ),
];

#[derive(Clone, Copy)]
enum Target {
    Libpq(&'static str),
    SslMode,
    /// A server setting passed in `options` (`-c name=value<unit>`).
    Setting(&'static str, &'static str),
    /// Accepted and without effect: `Trust Server Certificate` (`SSL
    /// Mode=Require` already skips certificate verification, as Npgsql 6+
    /// does) and Npgsql's own client-side behaviour.
    Ignored,
}

/// Whether `raw`, already read as libpq key/value pairs (`(key, value as
/// written, value)`, or `None` when it is not that form), is an Npgsql
/// string instead: a key that is not libpq's (libpq keys are lower case,
/// no spaces) or an unquoted value that runs across a `;` into another
/// `key=value` (`host=db;username=app`; a bare libpq password may hold a
/// `;` of its own).
pub fn is_npgsql(raw: &str, libpq: Option<&[(String, String, String)]>) -> bool {
    let raw = raw.trim();
    if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
        return false;
    }
    match libpq {
        Some(pairs) => pairs.iter().any(|(key, written, _)| {
            !key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                || (!written.starts_with('\'')
                    && written
                        .split_once(';')
                        .is_some_and(|(_, rest)| rest.contains('=')))
        }),
        None => {
            let first_key = raw.split('=').next().unwrap_or_default().trim();
            let npgsql_like = raw.contains(';')
                || first_key
                    .chars()
                    .any(|c| c.is_ascii_uppercase() || c.is_whitespace());
            npgsql_like && split_ado(raw).is_ok_and(|pairs| !pairs.is_empty())
        }
    }
}

/// The libpq key/value string an Npgsql string stands for.
pub fn to_libpq(raw: &str) -> Result<String, String> {
    let pairs =
        split_ado(raw).map_err(|AdoError(e)| format!("invalid Npgsql connection string: {e}"))?;
    let mut out: Vec<String> = Vec::new();
    let mut settings: Vec<String> = Vec::new();
    for (key, value) in &pairs {
        let Some((_, target)) = KEYS.iter().find(|(names, _)| names.contains(&key.as_str())) else {
            return Err(format!(
                "unknown Npgsql connection string key {key:?} (known: Host, Server, Port, Username, User ID, \
                 Password, Database, SSL Mode, Trust Server Certificate, Root Certificate, Timeout, \
                 Command Timeout, Application Name, Search Path)"
            ));
        };
        match target {
            Target::Libpq(name) => out.push(format!("{name}={}", quote(value))),
            Target::SslMode => out.push(format!("sslmode={}", ssl_mode(value)?)),
            Target::Setting(name, unit) => {
                if value.contains(|c: char| c.is_whitespace() || c == '\\' || c == '\'') {
                    return Err(format!(
                        "Npgsql key {key:?}: the value may not contain spaces or quotes"
                    ));
                }
                settings.push(format!("-c {name}={value}{unit}"));
            }
            Target::Ignored => {}
        }
    }
    if !settings.is_empty() {
        out.push(format!("options={}", quote(&settings.join(" "))));
    }
    Ok(out.join(" "))
}

/// Npgsql's SSL Mode names as libpq's.
fn ssl_mode(value: &str) -> Result<&'static str, String> {
    let v: String = value
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    Ok(match v.as_str() {
        "disable" => "disable",
        "allow" => "allow",
        "prefer" => "prefer",
        "require" => "require",
        "verifyca" => "verify-ca",
        "verifyfull" => "verify-full",
        _ => return Err(
            "invalid SSL Mode: expected Disable, Allow, Prefer, Require, VerifyCA or VerifyFull"
                .into(),
        ),
    })
}

/// A libpq value, single-quoted with `\` and `'` escaped.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventuous_sample_strings_are_npgsql() {
        // The shape of the connection strings in Eventuous's samples.
        let s = "Host=localhost;Username=postgres;Password=secret;Database=eventuous;Include Error Detail=true";
        assert!(is_npgsql(s, None));
        assert_eq!(
            to_libpq(s).unwrap(),
            "host='localhost' user='postgres' password='secret' dbname='eventuous'"
        );
        // A key we do not know is named, its value never shown.
        let e = to_libpq("Host=db;Password=secret;Colour=blue").unwrap_err();
        assert!(e.contains("\"colour\""), "{e}");
        assert!(!e.contains("secret") && !e.contains("blue"), "{e}");

        let s = "Host=db.internal;Port=5433;Username=gap_healer;Password='p;w''d';Database=es;\
                 SSL Mode=Require;Trust Server Certificate=true;Timeout=7;Command Timeout=30;\
                 Application Name=orders healer;Search Path=eventuous";
        assert_eq!(
            to_libpq(s).unwrap(),
            "host='db.internal' port='5433' user='gap_healer' password='p;w\\'d' dbname='es' \
             sslmode=require connect_timeout='7' application_name='orders healer' \
             options='-c statement_timeout=30s -c search_path=eventuous'"
        );
    }

    #[test]
    fn keys_are_case_and_space_insensitive() {
        let a =
            to_libpq("HOST=db;user id=app;SSLMODE=verifyfull;ROOT CERTIFICATE=/ca.pem").unwrap();
        assert_eq!(
            a,
            "host='db' user='app' sslmode=verify-full sslrootcert='/ca.pem'"
        );
        assert_eq!(
            to_libpq("Server=db;User Name=app;SSL Mode=Verify-CA").unwrap(),
            "host='db' user='app' sslmode=verify-ca"
        );
    }

    #[test]
    fn libpq_strings_and_urls_are_not_npgsql() {
        let kv = |k: &str, w: &str| (k.to_string(), w.to_string(), w.to_string());
        let libpq = [
            kv("host", "db"),
            kv("password", "'a;b'"),
            kv("user", "p;w'x"),
        ];
        assert!(!is_npgsql("host=db password='a;b'", Some(&libpq)));
        assert!(!is_npgsql("postgres://app:pw@db/es?sslmode=require", None));
        assert!(!is_npgsql("postgresql://db/es", None));
        assert!(is_npgsql("Host=db", Some(&[kv("Host", "db")])));
        assert!(is_npgsql(
            "host=db;username=app",
            Some(&[kv("host", "db;username=app")])
        ));
        assert!(is_npgsql("Host=db; Username=app", None));
        assert!(!is_npgsql("", None));
    }

    #[test]
    fn bad_values_are_named_never_shown() {
        let e = to_libpq("Host=db;Password=Zq7Secret;SSL Mode=Sometimes").unwrap_err();
        assert!(e.contains("SSL Mode") && !e.contains("Zq7Secret"), "{e}");
        let e = to_libpq("Host=db;Password='Zq7Secret").unwrap_err();
        assert!(!e.contains("Zq7Secret"), "{e}");
        let e = to_libpq("Host=db;Search Path='a b'").unwrap_err();
        assert!(e.contains("search path"), "{e}");
    }
}
