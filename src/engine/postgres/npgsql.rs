//! Npgsql connection strings (`Host=db;Port=5432;Username=app;Password=..;
//! Database=es;SSL Mode=Require`), the form Eventuous's .NET applications
//! hold, turned into the libpq key/value form the rest of the engine reads.
//!
//! Keys are case- and space-insensitive; values may be quoted as ADO.NET
//! quotes them ([`crate::engine::ado_connection_string::split_ado`]). Errors name keys,
//! never values.

use crate::engine::ado_connection_string::{split_ado, split_ado_marked, AdoError};

/// The forms a PostgreSQL connection string may take, for error messages.
pub const ACCEPTED_FORMS: &str =
    "accepted forms: libpq key/value (host=db port=5432 user=app dbname=es), \
     a URL (postgres://app@db:5432/es), or Npgsql (Host=db;Port=5432;Username=app;Database=es)";

/// The Npgsql keys gap-healer takes, each with its spellings as Npgsql's
/// documentation writes them (matched ignoring case and spaces: `SSL Mode`,
/// `sslmode`, `SslMode`), and what each becomes. A refusal lists these
/// names, so what the message says is accepted is what is accepted.
const KEYS: &[(&[&str], Target)] = &[
    (&["Host", "Server"], Target::Libpq("host")),
    (&["Port"], Target::Number("port", u16::MAX as u64)),
    (
        &["Username", "User ID", "User", "UID"],
        Target::Libpq("user"),
    ),
    (&["Password", "PWD", "PSW"], Target::Libpq("password")),
    (&["Database", "DB"], Target::Libpq("dbname")),
    (&["SSL Mode"], Target::SslMode),
    (&["Trust Server Certificate"], Target::Ignored),
    (&["Root Certificate"], Target::Libpq("sslrootcert")),
    (
        &["Timeout"],
        Target::Number("connect_timeout", u32::MAX as u64),
    ),
    (
        &["Command Timeout"],
        Target::Setting("statement_timeout", "s"),
    ),
    (&["Application Name"], Target::Libpq("application_name")),
    (&["Search Path"], Target::Setting("search_path", "")),
    (&["Target Session Attributes"], Target::SessionAttributes),
    // Npgsql's own client behaviour (its pool, error detail, prepared
    // statements, buffers, keepalive): meaningful to the application, not
    // to the healer, which keeps its own pool and its leader session's
    // keepalive.
    (&["Include Error Detail"], Target::ClientSide),
    (&["Pooling"], Target::ClientSide),
    (&["Minimum Pool Size"], Target::ClientSide),
    (&["Maximum Pool Size"], Target::ClientSide),
    (&["Connection Idle Lifetime"], Target::ClientSide),
    (&["Connection Pruning Interval"], Target::ClientSide),
    (&["Connection Lifetime"], Target::ClientSide),
    (&["Enlist"], Target::ClientSide),
    (&["No Reset On Close"], Target::ClientSide),
    (&["Log Parameters"], Target::ClientSide),
    (&["Multiplexing"], Target::ClientSide),
    (&["Max Auto Prepare"], Target::ClientSide),
    (&["Auto Prepare Min Usages"], Target::ClientSide),
    (&["Keepalive"], Target::ClientSide),
    (&["TCP Keepalive"], Target::ClientSide),
    (&["Read Buffer Size"], Target::ClientSide),
    (&["Write Buffer Size"], Target::ClientSide),
];

/// Npgsql keys the driver cannot honour, and why: "unknown" would mislead
/// for a key the operator read in Npgsql's documentation.
const UNSUPPORTED: &[(&[&str], &str)] = &[
    (
        &[
            "Client Certificate",
            "Client Certificate Key",
            "SSL Certificate",
            "SSL Key",
            "SSL Password",
        ],
        "client certificates are not supported: the login is Username and Password",
    ),
    (
        &["Passfile"],
        "password files are not read: give Password, or keep the whole connection string in a file (connection_string_file)",
    ),
    (
        &[
            "Integrated Security",
            "Kerberos Service Name",
            "Include Realm",
            "GSS Encryption Mode",
        ],
        "Kerberos, GSSAPI and SSPI are not supported: the login is Username and Password",
    ),
];

#[derive(Clone, Copy)]
enum Target {
    Libpq(&'static str),
    /// A libpq key whose value is a whole number no larger than this.
    Number(&'static str, u64),
    SslMode,
    /// libpq's `target_session_attrs`, as far as the driver has it.
    SessionAttributes,
    /// A server setting passed in `options` (`-c name=value<unit>`); with a
    /// unit, the value is a whole number.
    Setting(&'static str, &'static str),
    /// Accepted and without effect: `Trust Server Certificate` (`SSL
    /// Mode=Require` already skips certificate verification, as Npgsql 6+
    /// does).
    Ignored,
    /// Npgsql's own client-side behaviour: accepted, without effect.
    ClientSide,
}

/// A key as the tables are matched: lower case, no spaces.
fn normal(key: &str) -> String {
    key.chars()
        .filter(|c| !c.is_whitespace())
        .flat_map(char::to_lowercase)
        .collect()
}

fn find<'a, T>(
    table: &'a [(&[&'static str], T)],
    key: &str,
) -> Option<&'a (&'a [&'static str], T)> {
    let key = normal(key);
    table
        .iter()
        .find(|(names, _)| names.iter().any(|name| normal(name) == key))
}

/// The Npgsql keys gap-healer takes, for a refusal: the ones that mean
/// something to it, then the ones it accepts and ignores.
pub fn accepted_keys() -> String {
    let group = |names: &[&str]| match names {
        [one] => one.to_string(),
        [first, rest @ ..] => format!("{first} (or {})", rest.join(", ")),
        [] => String::new(),
    };
    let used: Vec<String> = KEYS
        .iter()
        .filter(|(_, t)| !matches!(t, Target::ClientSide))
        .map(|(names, _)| group(names))
        .collect();
    let ignored: Vec<String> = KEYS
        .iter()
        .filter(|(_, t)| matches!(t, Target::ClientSide))
        .map(|(names, _)| group(names))
        .collect();
    format!(
        "the Npgsql keys gap-healer takes are {}, and, without effect on the healer, {}",
        used.join(", "),
        ignored.join(", ")
    )
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

/// The libpq key/value string an Npgsql string stands for. A refusal names
/// the key (never its value) and lists the keys taken.
pub fn to_libpq(raw: &str) -> Result<String, String> {
    let pairs = split_ado_marked(raw).map_err(|AdoError(e)| format!("read as Npgsql, {e}"))?;
    let mut out: Vec<String> = Vec::new();
    let mut settings: Vec<String> = Vec::new();
    let mut after_bare_password = false;
    for (n, (key, value, quoted)) in pairs.iter().enumerate() {
        let follows_password = std::mem::replace(
            &mut after_bare_password,
            !quoted && find(KEYS, key).is_some_and(|(_, t)| matches!(t, Target::Libpq("password"))),
        );
        let Some((names, target)) = find(KEYS, key) else {
            return Err(unknown_key(n + 1, key, follows_password));
        };
        let name = names[0];
        match target {
            Target::Libpq(libpq) => out.push(format!("{libpq}={}", quote(value))),
            Target::Number(libpq, max) => {
                if !value.parse::<u64>().is_ok_and(|v| v <= *max) {
                    return Err(format!(
                        "invalid {name}: expected a whole number no larger than {max}"
                    ));
                }
                out.push(format!("{libpq}={}", quote(value)));
            }
            Target::SslMode => out.push(format!("sslmode={}", ssl_mode(value)?)),
            Target::SessionAttributes => out.push(format!(
                "target_session_attrs={}",
                session_attributes(value)?
            )),
            Target::Setting(setting, unit) => {
                let whole = !value.is_empty() && value.chars().all(|c| c.is_ascii_digit());
                if !unit.is_empty() && !whole {
                    return Err(format!("invalid {name}: expected whole seconds"));
                }
                if value.contains(|c: char| c.is_whitespace() || c == '\\' || c == '\'') {
                    return Err(format!(
                        "invalid {name}: the value may not contain spaces or quotes"
                    ));
                }
                settings.push(format!("-c {setting}={value}{unit}"));
            }
            Target::Ignored | Target::ClientSide => {}
        }
    }
    if !settings.is_empty() {
        out.push(format!("options={}", quote(&settings.join(" "))));
    }
    Ok(out.join(" "))
}

/// The refusal of pair `n`'s key: named unless it may be the rest of a
/// password (it follows an unquoted one, `Password=ab;cd=ef`, and is no
/// key Npgsql has).
fn unknown_key(n: usize, key: &str, follows_password: bool) -> String {
    let accepted = accepted_keys();
    // An Npgsql key by name is no fragment of a password: always named.
    if let Some((_, why)) = find(UNSUPPORTED, key) {
        return format!("Npgsql key {key:?} is not supported ({why}); {accepted}");
    }
    if follows_password {
        return format!(
            "the key of pair {n}, right after an unquoted Password, is not one gap-healer takes \
             (not shown: it may be the rest of a password that holds a `;`; quote the password, \
             Password='...'); {accepted}"
        );
    }
    let close = KEYS
        .iter()
        .flat_map(|(names, _)| names.iter())
        .map(|name| (strsim::levenshtein(&normal(key), &normal(name)), *name))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, name)| format!(" (did you mean {name:?}?)"))
        .unwrap_or_default();
    format!("unknown Npgsql key {key:?}{close}; {accepted}")
}

/// Npgsql's Target Session Attributes as libpq's, where the driver has
/// them. gap-healer writes tombstones, so only a server that takes writes
/// can serve it: ReadOnly, Standby and PreferStandby would connect where no
/// fill can run, and the driver has no Primary or PreferPrimary (ReadWrite
/// connects only to a server that takes writes, which is what is needed).
fn session_attributes(value: &str) -> Result<&'static str, String> {
    match normal(value).replace('-', "").as_str() {
        "any" => Ok("any"),
        "readwrite" => Ok("read-write"),
        _ => Err(
            "invalid Target Session Attributes: expected Any or ReadWrite (gap-healer \
                  writes tombstones, so ReadOnly, Standby and PreferStandby cannot serve it; the \
                  driver has no Primary or PreferPrimary, and ReadWrite connects only to a server \
                  that takes writes)"
                .into(),
        ),
    }
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
        let e = to_libpq("Host=db;Colour=blue;Password=secret").unwrap_err();
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
        assert!(e.contains("Search Path"), "{e}");
        for (raw, key) in [
            ("Host=db;Port=Zq7Secret", "Port"),
            ("Host=db;Timeout=Zq7Secret", "Timeout"),
            ("Host=db;Command Timeout=Zq7Secret", "Command Timeout"),
            (
                "Host=db;Target Session Attributes=Zq7Secret",
                "Target Session Attributes",
            ),
        ] {
            let e = to_libpq(raw).unwrap_err();
            assert!(
                e.contains(&format!("invalid {key}: expected")),
                "{raw}: {e}"
            );
            assert!(!e.contains("Zq7Secret"), "{raw}: {e}");
        }
    }

    /// Issue 20: the refusal's list of keys left out keys that were
    /// accepted (Pooling, Maximum Pool Size, Keepalive, Include Error
    /// Detail). Every key listed is accepted, and every key accepted is
    /// listed: the list is the table.
    #[test]
    fn the_keys_listed_are_the_keys_accepted() {
        let listed = accepted_keys();
        for (names, target) in KEYS {
            let value = match target {
                Target::SslMode => "Require",
                Target::SessionAttributes => "ReadWrite",
                Target::Number(..) => "5",
                Target::Setting(_, unit) if !unit.is_empty() => "30",
                _ => "x",
            };
            for name in *names {
                assert!(listed.contains(name), "{name} not listed in {listed}");
                let raw = format!("Host=db;{name}={value}");
                assert!(to_libpq(&raw).is_ok(), "{raw}: {:?}", to_libpq(&raw));
            }
        }
        for name in [
            "Pooling",
            "Maximum Pool Size",
            "Keepalive",
            "Include Error Detail",
            "Target Session Attributes",
        ] {
            assert!(listed.contains(name), "{name} not in {listed}");
        }
        let e = to_libpq("Host=db;Colour=blue").unwrap_err();
        assert!(e.contains(&listed), "{e}");
    }

    /// Target Session Attributes is tokio-postgres's target_session_attrs,
    /// as far as the driver has it and the healer can use it.
    #[test]
    fn target_session_attributes_become_libpq_target_session_attrs() {
        assert_eq!(
            to_libpq("Host=db;Target Session Attributes=ReadWrite").unwrap(),
            "host='db' target_session_attrs=read-write"
        );
        assert_eq!(
            to_libpq("Host=db;TargetSessionAttributes=any").unwrap(),
            "host='db' target_session_attrs=any"
        );
        for refused in [
            "Primary",
            "PreferPrimary",
            "Standby",
            "PreferStandby",
            "ReadOnly",
        ] {
            let e = to_libpq(&format!("Host=db;Target Session Attributes={refused}")).unwrap_err();
            assert!(
                e.contains("Target Session Attributes: expected Any or ReadWrite"),
                "{refused}: {e}"
            );
        }
    }

    /// Each refusal of a key names it, never its value, and lists the keys
    /// taken; a key the driver cannot honour says why.
    #[test]
    fn refused_keys_are_named_with_the_keys_accepted() {
        let e = to_libpq("Host=db;Usrname=Zq7Secret;Password=Zq7Secret").unwrap_err();
        assert!(e.starts_with("unknown Npgsql key \"usrname\" (did you mean \"Username\"?); the Npgsql keys gap-healer takes are Host (or Server), Port"), "{e}");
        assert!(!e.contains("Zq7Secret"), "{e}");
        let e = to_libpq("Host=db;Client Certificate=/Zq7Secret.pem").unwrap_err();
        assert!(
            e.starts_with(
                "Npgsql key \"client certificate\" is not supported (client certificates"
            ),
            "{e}"
        );
        assert!(e.contains("the Npgsql keys gap-healer takes are"), "{e}");
        assert!(!e.contains("Zq7Secret"), "{e}");
    }

    /// A "key" right after an unquoted password may be the rest of it (a
    /// password holding `;`): it is refused without being named.
    #[test]
    fn a_key_after_an_unquoted_password_is_not_named() {
        let e = to_libpq("Host=db;Password=Zq7a;Secret9x=b").unwrap_err();
        assert!(
            !e.contains("Secret9x") && !e.to_lowercase().contains("secret9x"),
            "{e}"
        );
        assert!(
            e.contains("pair 3, right after an unquoted Password"),
            "{e}"
        );
        assert!(e.contains("the Npgsql keys gap-healer takes are"), "{e}");
        // Quoted, the password cannot run on: the next key is named.
        let e = to_libpq("Host=db;Password='Zq7a';Colour=b").unwrap_err();
        assert!(e.contains("\"colour\""), "{e}");
    }
}
