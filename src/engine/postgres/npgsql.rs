//! Npgsql connection strings (`Host=db;Port=5432;Username=app;Password=..;
//! Database=es;SSL Mode=Require`), the form Eventuous's .NET applications
//! hold, read into the libpq [`Setting`]s the rest of the engine takes.
//!
//! Keys are case- and space-insensitive; values may be quoted as ADO.NET
//! quotes them ([`crate::secret::ado`]). Errors name keys by this table's
//! spelling and pairs by position: a key that is not in the table is never
//! named (it may be the rest of a password holding a `;`).

use super::tls::settings::Setting;
use crate::secret::ado::{self, Pair};

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
    (&["Options"], Target::Options),
    (&["Timezone"], Target::Setting("TimeZone", "")),
    (&["Channel Binding"], Target::Lower("channel_binding")),
    (&["Load Balance Hosts"], Target::LoadBalance),
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
    (&["Socket Receive Buffer Size"], Target::ClientSide),
    (&["Socket Send Buffer Size"], Target::ClientSide),
    (&["Cancellation Timeout"], Target::ClientSide),
    (&["Internal Command Timeout"], Target::ClientSide),
    (&["Host Recheck Seconds"], Target::ClientSide),
    (&["Server Compatibility Mode"], Target::ClientSide),
    (&["Persist Security Info"], Target::ClientSide),
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
    /// A libpq key whose values are Npgsql's in lower case.
    Lower(&'static str),
    SslMode,
    /// libpq's `target_session_attrs`, as far as the driver has it.
    SessionAttributes,
    /// Npgsql's `true`/`false` as libpq's `load_balance_hosts`.
    LoadBalance,
    /// Server settings as they are (`-c name=value ...`), with those the
    /// keys below add.
    Options,
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

fn find<'a, T>(
    table: &'a [(&[&'static str], T)],
    key: &str,
) -> Option<&'a (&'a [&'static str], T)> {
    let key = ado::normal(key);
    table
        .iter()
        .find(|(names, _)| names.iter().any(|name| ado::normal(name) == key))
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

/// The libpq settings an Npgsql string's pairs stand for. A refusal names
/// the key by this table's spelling and its pair, never a value, and lists
/// the keys taken.
pub(crate) fn settings(pairs: &[Pair]) -> Result<Vec<Setting>, String> {
    let mut out = Vec::new();
    let mut options: Vec<String> = Vec::new();
    for (i, pair) in pairs.iter().enumerate() {
        let Some((names, target)) = find(KEYS, &pair.key) else {
            return Err(refused_key(pairs, i));
        };
        let said = format!("Npgsql's \"{}\" (pair {})", names[0], i + 1);
        let invalid =
            |expected: &str| format!("the value of {said} is not valid: expected {expected}");
        let value = pair.value.as_str();
        let key = match *target {
            Target::Libpq(key) | Target::Lower(key) => key,
            Target::Number(key, max) => {
                if !value.parse::<u64>().is_ok_and(|v| v <= max) {
                    return Err(invalid(&format!("a whole number no larger than {max}")));
                }
                key
            }
            Target::SslMode => "sslmode",
            Target::SessionAttributes => "target_session_attrs",
            Target::LoadBalance => "load_balance_hosts",
            Target::Options => {
                options.insert(0, value.to_string());
                continue;
            }
            Target::Setting(setting, unit) => {
                let whole = !value.is_empty() && value.chars().all(|c| c.is_ascii_digit());
                if !unit.is_empty() && !whole {
                    return Err(invalid("whole seconds"));
                }
                if value.contains(|c: char| c.is_whitespace() || c == '\\' || c == '\'') {
                    return Err(invalid("a value without spaces or quotes"));
                }
                options.push(format!("-c {setting}={value}{unit}"));
                continue;
            }
            Target::Ignored | Target::ClientSide => continue,
        };
        let value = match *target {
            Target::Lower(_) => value.to_ascii_lowercase(),
            Target::SslMode => ssl_mode(value)
                .ok_or_else(|| invalid("Disable, Allow, Prefer, Require, VerifyCA or VerifyFull"))?
                .to_string(),
            Target::SessionAttributes => session_attributes(value)
                .ok_or_else(|| {
                    invalid(
                        "Any or ReadWrite (gap-healer writes tombstones, so ReadOnly, Standby \
                         and PreferStandby cannot serve it; the driver has no Primary or \
                         PreferPrimary, and ReadWrite connects only to a server that takes \
                         writes)",
                    )
                })?
                .to_string(),
            Target::LoadBalance => match value.to_ascii_lowercase().as_str() {
                "true" => "random".to_string(),
                "false" => "disable".to_string(),
                _ => return Err(invalid("true or false")),
            },
            _ => value.to_string(),
        };
        out.push(Setting { key, value, said });
    }
    if !options.is_empty() {
        out.push(Setting {
            key: "options",
            value: options.join(" "),
            said: "the server settings of Npgsql's Options, Command Timeout, \
                   Search Path and Timezone"
                .to_string(),
        });
    }
    Ok(out)
}

/// The refusal of pair `i`'s key: an Npgsql key the driver cannot honour
/// by this table's name and why, any other as unknown, by position only.
fn refused_key(pairs: &[Pair], i: usize) -> String {
    let accepted = accepted_keys();
    let n = i + 1;
    if let Some((names, why)) = find(UNSUPPORTED, &pairs[i].key) {
        return format!(
            "Npgsql's \"{}\" (pair {n}) is not supported ({why}); {accepted}",
            names[0]
        );
    }
    let after_password = i > 0 && !pairs[i - 1].quoted && {
        let before = find(KEYS, &pairs[i - 1].key);
        before.is_some_and(|(_, t)| matches!(t, Target::Libpq("password")))
    };
    let hint = if after_password {
        ", right after an unquoted Password: a password holding `;` must be quoted \
         (Password='...', a `'` inside doubled)"
    } else {
        ""
    };
    format!(
        "an unknown Npgsql key at pair {n} (of {}){hint}; {accepted}",
        pairs.len()
    )
}

/// Npgsql's Target Session Attributes as libpq's, where the driver has
/// them. gap-healer writes tombstones, so only a server that takes writes
/// can serve it: ReadOnly, Standby and PreferStandby would connect where no
/// fill can run, and the driver has no Primary or PreferPrimary (ReadWrite
/// connects only to a server that takes writes, which is what is needed).
fn session_attributes(value: &str) -> Option<&'static str> {
    match ado::normal(value).replace('-', "").as_str() {
        "any" => Some("any"),
        "readwrite" => Some("read-write"),
        _ => None,
    }
}

/// Npgsql's SSL Mode names as libpq's.
fn ssl_mode(value: &str) -> Option<&'static str> {
    let v: String = value
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    Some(match v.as_str() {
        "disable" => "disable",
        "allow" => "allow",
        "prefer" => "prefer",
        "require" => "require",
        "verifyca" => "verify-ca",
        "verifyfull" => "verify-full",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to_libpq(raw: &str) -> Result<Vec<(&'static str, String)>, String> {
        let pairs = ado::pairs(raw).map_err(|e| e.0)?;
        Ok(settings(&pairs)?
            .into_iter()
            .map(|s| (s.key, s.value))
            .collect())
    }

    fn kv(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    #[test]
    fn eventuous_sample_strings_are_npgsql() {
        // The shape of the connection strings in Eventuous's samples.
        let s = "Host=localhost;Username=postgres;Password=secret;Database=eventuous;Include Error Detail=true";
        assert_eq!(
            to_libpq(s).unwrap(),
            kv(&[
                ("host", "localhost"),
                ("user", "postgres"),
                ("password", "secret"),
                ("dbname", "eventuous")
            ])
        );
        let s = "Host=db.internal;Port=5433;Username=gap_healer;Password='p;w''d';Database=es;\
                 SSL Mode=Require;Trust Server Certificate=true;Timeout=7;Command Timeout=30;\
                 Application Name=orders healer;Search Path=eventuous;Options=-c work_mem=4MB";
        assert_eq!(
            to_libpq(s).unwrap(),
            kv(&[
                ("host", "db.internal"),
                ("port", "5433"),
                ("user", "gap_healer"),
                ("password", "p;w'd"),
                ("dbname", "es"),
                ("sslmode", "require"),
                ("connect_timeout", "7"),
                ("application_name", "orders healer"),
                (
                    "options",
                    "-c work_mem=4MB -c statement_timeout=30s -c search_path=eventuous"
                ),
            ])
        );
    }

    #[test]
    fn keys_are_case_and_space_insensitive() {
        assert_eq!(
            to_libpq("HOST=db;user id=app;SSLMODE=verifyfull;ROOT CERTIFICATE=/ca.pem").unwrap(),
            kv(&[
                ("host", "db"),
                ("user", "app"),
                ("sslmode", "verify-full"),
                ("sslrootcert", "/ca.pem")
            ])
        );
        assert_eq!(
            to_libpq("Server=db;User Name=app;SSL Mode=Verify-CA;Load Balance Hosts=true").unwrap(),
            kv(&[
                ("host", "db"),
                ("user", "app"),
                ("sslmode", "verify-ca"),
                ("load_balance_hosts", "random")
            ])
        );
    }

    #[test]
    fn bad_values_are_named_never_shown() {
        let e = to_libpq("Host=db;Password=Zq7Secret;SSL Mode=Sometimes").unwrap_err();
        assert!(
            e.starts_with("the value of Npgsql's \"SSL Mode\" (pair 3) is not valid"),
            "{e}"
        );
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
            ("Host=db;Load Balance Hosts=Zq7Secret", "Load Balance Hosts"),
        ] {
            let e = to_libpq(raw).unwrap_err();
            assert!(
                e.starts_with(&format!(
                    "the value of Npgsql's \"{key}\" (pair 2) is not valid: expected"
                )),
                "{raw}: {e}"
            );
            assert!(!e.contains("Zq7Secret"), "{raw}: {e}");
        }
    }

    /// Issue 20: the refusal's list of keys left out keys that were
    /// accepted. Every key listed is accepted, and every key accepted is
    /// listed: the list is the table. Every key of the table is one the
    /// redaction knows (it masks any other as a possible piece of a
    /// password).
    #[test]
    fn the_keys_listed_are_the_keys_accepted() {
        let listed = accepted_keys();
        for (names, target) in KEYS {
            let value = match target {
                Target::SslMode => "Require",
                Target::SessionAttributes => "ReadWrite",
                Target::LoadBalance => "false",
                Target::Number(..) => "5",
                Target::Setting(_, unit) if !unit.is_empty() => "30",
                Target::Lower(_) => "prefer",
                _ => "x",
            };
            for name in *names {
                assert!(listed.contains(name), "{name} not listed in {listed}");
                let raw = format!("Host=db;{name}={value}");
                assert!(to_libpq(&raw).is_ok(), "{raw}: {:?}", to_libpq(&raw));
                assert!(ado::is_known_key(name), "{name} unknown to secret::ado");
            }
        }
        for (names, _) in UNSUPPORTED {
            for name in *names {
                assert!(ado::is_known_key(name), "{name} unknown to secret::ado");
            }
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
            kv(&[("host", "db"), ("target_session_attrs", "read-write")])
        );
        assert_eq!(
            to_libpq("Host=db;TargetSessionAttributes=any").unwrap(),
            kv(&[("host", "db"), ("target_session_attrs", "any")])
        );
        for refused in [
            "Primary",
            "PreferPrimary",
            "Standby",
            "PreferStandby",
            "ReadOnly",
        ] {
            let e = to_libpq(&format!("Host=db;Target Session Attributes={refused}")).unwrap_err();
            assert!(e.contains("expected Any or ReadWrite"), "{refused}: {e}");
        }
    }

    /// Issue 27: an unknown key was named, with a guess ("did you mean
    /// Host?") that told the reader what a piece of the password looked
    /// like. Unknown keys are refused by position; a key of the table the
    /// driver cannot honour by the table's name.
    #[test]
    fn refused_keys_are_named_only_from_the_table() {
        let e = to_libpq("Host=db;Horse=Zq7Secret;Password=Zq7Secret").unwrap_err();
        assert!(
            e.starts_with("an unknown Npgsql key at pair 2 (of 3); the Npgsql keys gap-healer takes are Host (or Server), Port"),
            "{e}"
        );
        assert!(
            !e.to_lowercase().contains("horse") && !e.contains("did you mean"),
            "{e}"
        );
        let e = to_libpq("Host=db;client certificate=/Zq7Secret.pem").unwrap_err();
        assert!(
            e.starts_with(
                "Npgsql's \"Client Certificate\" (pair 2) is not supported (client certificates"
            ),
            "{e}"
        );
        assert!(!e.contains("Zq7Secret"), "{e}");
        let e = to_libpq("Host=db;Password=Zq7a;Secret9x=b").unwrap_err();
        assert!(
            e.starts_with(
                "an unknown Npgsql key at pair 3 (of 3), right after an unquoted Password"
            ),
            "{e}"
        );
        let e = to_libpq("Host=db;Password='Zq7a';Colour=b").unwrap_err();
        assert!(
            e.starts_with("an unknown Npgsql key at pair 3 (of 3);"),
            "{e}"
        );
    }
}
