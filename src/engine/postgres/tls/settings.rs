//! The libpq keys, what gap-healer does with each, and the driver's
//! `Config` they make. Every form is read into [`Setting`]s first (libpq
//! key/value and URL directly, Npgsql through [`super::super::npgsql`]),
//! so one table decides for all three.
//!
//! Each key libpq has is honoured, accepted without effect (where libpq
//! itself would change nothing for this driver: no GSSAPI, no client
//! certificate asked for), or refused saying why (where honouring it is
//! not possible and ignoring it would do something else than the string
//! says: client certificates, password files, service files). A refusal
//! or a bad value names the key from our table and where it was written,
//! never the value.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use tokio_postgres::config::{
    ChannelBinding, LoadBalanceHosts, SslNegotiation, TargetSessionAttrs,
};
use tokio_postgres::Config;

/// One libpq key's value, from any form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Setting {
    /// The libpq key it sets, as [`crate::secret::libpq::KEYWORDS`] spells it.
    pub key: &'static str,
    pub value: String,
    /// The key and where it was written, in our words, for messages:
    /// `"port" (pair 3)`, `Npgsql's "Port" (pair 3)`, `the URL's port`.
    pub said: String,
}

/// libpq's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS the string asks for, for [`super::parse`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TlsWanted {
    /// `None`: not given (libpq's default is prefer).
    pub mode: Option<SslMode>,
    pub rootcert: Option<String>,
    /// `sslsni=0`: no server name in the handshake.
    pub no_sni: bool,
    pub only_tls13: bool,
    pub only_tls12: bool,
    /// `sslnegotiation=direct`.
    pub direct: bool,
}

/// The keys libpq has that this driver cannot honour, and why. Given an
/// empty value, each is as if not given.
const REFUSED: &[(&[&str], &str)] = &[
    (
        &["sslcert", "sslkey", "sslpassword"],
        "client certificates are not supported: the login is user and password",
    ),
    (
        &["sslcrl", "sslcrldir"],
        "certificate revocation lists are not read",
    ),
    (&["sslkeylogfile"], "TLS keys are never written to a file"),
    (
        &["passfile"],
        "password files are not read: give password, or keep the whole connection string in a \
         file (connection_string_file)",
    ),
    (&["service"], "service files are not read"),
    (
        &["require_auth", "requirepeer"],
        "the driver cannot restrict the server's authentication",
    ),
    (
        &[
            "oauth_issuer",
            "oauth_client_id",
            "oauth_client_secret",
            "oauth_scope",
            "scram_client_key",
            "scram_server_key",
        ],
        "the login is user and password",
    ),
];

/// What the keys that take a value from a list take, for messages.
fn expected(key: &str) -> &'static str {
    match key {
        "host" => "host names, IP addresses or socket directories, separated by commas",
        "hostaddr" => "IP addresses, separated by commas",
        "port" => "port numbers from 1 to 65535, separated by commas",
        "connect_timeout" | "keepalives_idle" | "keepalives_interval" => "whole seconds",
        "tcp_user_timeout" => "whole milliseconds",
        "keepalives" | "sslsni" | "sslcompression" | "gssdelegation" => "1 or 0",
        "keepalives_count" | "keepalives_retries" => "a whole number",
        "sslmode" => "disable, allow, prefer, require, verify-ca or verify-full",
        "sslnegotiation" => "postgres or direct",
        "requiressl" => "1 or 0",
        "target_session_attrs" => {
            "any, read-write or primary (gap-healer writes tombstones, so read-only, standby \
             and prefer-standby cannot serve it)"
        }
        "channel_binding" => "disable, prefer or require",
        "load_balance_hosts" => "disable or random",
        "client_encoding" => "UTF8 or auto (the driver speaks UTF8)",
        "gssencmode" => "disable or prefer (the driver has no GSSAPI)",
        "sslcertmode" => "disable or allow (the driver sends no client certificate)",
        "ssl_min_protocol_version" | "ssl_max_protocol_version" => {
            "TLSv1.2 or TLSv1.3 (rustls has no older TLS)"
        }
        "min_protocol_version" => "3.0 (the driver speaks protocol 3.0)",
        "max_protocol_version" => "3.0, 3.2 or latest",
        "replication" => {
            "0, false, off or no (a replication session cannot run the healer's statements)"
        }
        _ => "a valid value",
    }
}

fn invalid(s: &Setting) -> String {
    format!(
        "the value of {} is not valid: expected {}",
        s.said,
        expected(s.key)
    )
}

/// A whole number no larger than `max`, or the refusal naming `s`.
fn number(s: &Setting, max: i64) -> Result<i64, String> {
    s.value
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|n| *n <= max)
        .ok_or_else(|| invalid(s))
}

/// A duration in `unit`s, libpq's way: zero or less means none.
fn duration(s: &Setting, unit: fn(u64) -> Duration) -> Result<Option<Duration>, String> {
    let n = number(s, i64::from(u32::MAX))?;
    Ok(u64::try_from(n).ok().filter(|n| *n > 0).map(unit))
}

fn one_of<'a>(s: &Setting, values: &[&'a str]) -> Result<&'a str, String> {
    values
        .iter()
        .copied()
        .find(|v| *v == s.value)
        .ok_or_else(|| invalid(s))
}

/// The `Config` and TLS wishes of `settings`: later settings of a key win,
/// as in libpq; `requiressl` is read as the `sslmode` it stands for.
pub(crate) fn apply(settings: &[Setting]) -> Result<(Config, TlsWanted), String> {
    let mut last: BTreeMap<&'static str, Setting> = BTreeMap::new();
    for s in settings {
        let s = if s.key == "requiressl" {
            let mode = match s.value.as_str() {
                "1" => "require",
                "0" => "prefer",
                _ => return Err(invalid(s)),
            };
            Setting {
                key: "sslmode",
                value: mode.into(),
                said: s.said.clone(),
            }
        } else {
            s.clone()
        };
        last.insert(s.key, s);
    }
    let mut config = Config::new();
    let mut tls = TlsWanted::default();
    for s in last.values() {
        if let Some((_, why)) = REFUSED.iter().find(|(keys, _)| keys.contains(&s.key)) {
            if !s.value.is_empty() {
                return Err(format!("{} is not supported ({why})", s.said));
            }
            continue;
        }
        if !connection(&mut config, s)? && !session(&mut config, s)? {
            tls_setting(&mut tls, s)?;
        }
    }
    if config.get_application_name().is_none() {
        if let Some(s) = last
            .get("fallback_application_name")
            .filter(|s| !s.value.is_empty())
        {
            config.application_name(&s.value);
        }
    }
    // libpq names the server by host for TLS; given only addresses, it
    // names them by address: so does the driver's handshake here.
    if config.get_hosts().is_empty() {
        let addrs: Vec<IpAddr> = config.get_hostaddrs().to_vec();
        for addr in addrs {
            config.host(addr.to_string());
        }
    }
    Ok((config, tls))
}

/// Where and as whom: host, hostaddr, port, user, password, dbname.
/// Whether `s` was one of them.
fn connection(config: &mut Config, s: &Setting) -> Result<bool, String> {
    let value = s.value.as_str();
    match s.key {
        "host" => {
            for host in value.split(',') {
                if host.is_empty() {
                    return Err(format!(
                        "{} has an empty host in its list: gap-healer does not assume libpq's \
                         default socket directory, name it",
                        s.said
                    ));
                }
                config.host(host);
            }
        }
        "hostaddr" => {
            for addr in value.split(',') {
                config.hostaddr(addr.trim().parse::<IpAddr>().map_err(|_| invalid(s))?);
            }
        }
        "port" => {
            for port in value.split(',') {
                let port = match port.trim() {
                    "" => 5432,
                    p => p
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| invalid(s))?,
                };
                config.port(port);
            }
        }
        "user" if !value.is_empty() => {
            config.user(value);
        }
        "password" if !value.is_empty() => {
            config.password(value);
        }
        "dbname" if !value.is_empty() => {
            config.dbname(value);
        }
        "user" | "password" | "dbname" => {}
        _ => return Ok(false),
    }
    Ok(true)
}

/// The session's own settings: names, options, timeouts, keepalive.
/// Whether `s` was one of them.
fn session(config: &mut Config, s: &Setting) -> Result<bool, String> {
    let value = s.value.as_str();
    match s.key {
        "options" if !value.is_empty() => {
            config.options(value);
        }
        "application_name" if !value.is_empty() => {
            config.application_name(value);
        }
        "options" | "application_name" | "fallback_application_name" => {}
        "connect_timeout" => {
            if let Some(d) = duration(s, Duration::from_secs)? {
                config.connect_timeout(d);
            }
        }
        "tcp_user_timeout" => {
            if let Some(d) = duration(s, Duration::from_millis)? {
                config.tcp_user_timeout(d);
            }
        }
        "keepalives" => {
            config.keepalives(number(s, i64::MAX)? != 0);
        }
        "keepalives_idle" => {
            if let Some(d) = duration(s, Duration::from_secs)? {
                config.keepalives_idle(d);
            }
        }
        "keepalives_interval" => {
            if let Some(d) = duration(s, Duration::from_secs)? {
                config.keepalives_interval(d);
            }
        }
        "keepalives_count" | "keepalives_retries" => {
            let n = u32::try_from(number(s, i64::from(u32::MAX))?).map_err(|_| invalid(s))?;
            config.keepalives_retries(n);
        }
        _ => return server(config, s),
    }
    Ok(true)
}

/// Which server, and what of it: session attributes, channel binding,
/// load balancing, and the keys that change nothing for this driver but
/// must hold a value it can honour. Whether `s` was one of them.
fn server(config: &mut Config, s: &Setting) -> Result<bool, String> {
    let value = s.value.as_str();
    match s.key {
        "target_session_attrs" => {
            config.target_session_attrs(
                match one_of(
                    s,
                    &[
                        "any",
                        "read-write",
                        "primary",
                        "read-only",
                        "standby",
                        "prefer-standby",
                    ],
                )? {
                    "any" => TargetSessionAttrs::Any,
                    "read-write" | "primary" => TargetSessionAttrs::ReadWrite,
                    _ => {
                        return Err(format!(
                            "{} asks for a server that takes no writes, and gap-healer writes \
                             tombstones: give read-write, primary or any",
                            s.said
                        ))
                    }
                },
            );
        }
        "channel_binding" => {
            config.channel_binding(match one_of(s, &["disable", "prefer", "require"])? {
                "disable" => ChannelBinding::Disable,
                "prefer" => ChannelBinding::Prefer,
                _ => ChannelBinding::Require,
            });
        }
        "load_balance_hosts" => {
            config.load_balance_hosts(match one_of(s, &["disable", "random"])? {
                "random" => LoadBalanceHosts::Random,
                _ => LoadBalanceHosts::Disable,
            });
        }
        "client_encoding" => {
            let v = value.to_ascii_lowercase().replace(['-', '_'], "");
            if !matches!(v.as_str(), "utf8" | "unicode" | "auto") {
                return Err(invalid(s));
            }
        }
        "gssencmode" => {
            one_of(s, &["disable", "prefer"])?;
        }
        "replication" => {
            one_of(s, &["0", "false", "off", "no"])?;
        }
        "min_protocol_version" => {
            one_of(s, &["3.0"])?;
        }
        "max_protocol_version" => {
            one_of(s, &["3.0", "3.2", "latest"])?;
        }
        // Only with GSSAPI or SSPI, which the driver does not have: a
        // server that asks for them refuses the login either way.
        "krbsrvname" | "gsslib" => {}
        "gssdelegation" => {
            one_of(s, &["0", "1"])?;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The TLS keys, into `tls`.
fn tls_setting(tls: &mut TlsWanted, s: &Setting) -> Result<(), String> {
    match s.key {
        "sslmode" => {
            tls.mode = Some(
                match one_of(
                    s,
                    &[
                        "disable",
                        "allow",
                        "prefer",
                        "require",
                        "verify-ca",
                        "verify-full",
                    ],
                )? {
                    "disable" => SslMode::Disable,
                    "allow" => SslMode::Allow,
                    "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    _ => SslMode::VerifyFull,
                },
            );
        }
        "sslrootcert" => tls.rootcert = Some(s.value.clone()).filter(|v| !v.is_empty()),
        "sslnegotiation" => tls.direct = one_of(s, &["postgres", "direct"])? == "direct",
        "sslsni" => tls.no_sni = one_of(s, &["0", "1"])? == "0",
        // rustls never compresses; libpq 14+ no longer does either.
        "sslcompression" => {
            one_of(s, &["0", "1"])?;
        }
        "sslcertmode" => {
            one_of(s, &["disable", "allow"])?;
        }
        "ssl_min_protocol_version" => {
            tls.only_tls13 =
                one_of(s, &["TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3", ""])? == "TLSv1.3";
        }
        "ssl_max_protocol_version" => {
            tls.only_tls12 = one_of(s, &["TLSv1.2", "TLSv1.3", ""])? == "TLSv1.2";
        }
        // The form's reading admits only libpq's keys, and every other one
        // is taken above.
        _ => return Err(format!("{} is not a key gap-healer reads", s.said)),
    }
    Ok(())
}

/// The negotiation a TLS mode allows: libpq refuses `sslnegotiation=direct`
/// with a mode that may fall back to plain.
pub(crate) fn negotiation(tls: &TlsWanted, mode: SslMode) -> Result<SslNegotiation, String> {
    match (tls.direct, mode) {
        (false, _) => Ok(SslNegotiation::Postgres),
        (true, SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull) => {
            Ok(SslNegotiation::Direct)
        }
        (true, _) => Err(
            "sslnegotiation=direct needs sslmode require, verify-ca or verify-full (a direct \
             TLS handshake cannot fall back to plain), as in libpq"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(pairs: &[(&'static str, &str)]) -> Vec<Setting> {
        pairs
            .iter()
            .enumerate()
            .map(|(i, (key, value))| Setting {
                key,
                value: value.to_string(),
                said: format!("\"{key}\" (pair {})", i + 1),
            })
            .collect()
    }

    #[test]
    fn later_settings_win_and_requiressl_is_an_sslmode() {
        let (config, tls) = apply(&set(&[
            ("host", "a"),
            ("host", "b,c"),
            ("port", "1,"),
            ("sslmode", "disable"),
            ("requiressl", "1"),
        ]))
        .unwrap();
        assert_eq!(config.get_hosts().len(), 2);
        assert_eq!(config.get_ports(), [1, 5432]);
        assert_eq!(tls.mode, Some(SslMode::Require));
    }

    #[test]
    fn libpq_units_and_defaults() {
        let (config, _) = apply(&set(&[
            ("tcp_user_timeout", "1500"),
            ("connect_timeout", "0"),
            ("keepalives_count", "4"),
            ("fallback_application_name", "orders"),
            ("target_session_attrs", "primary"),
            ("client_encoding", "UTF-8"),
            ("gssencmode", "disable"),
            ("hostaddr", "10.0.0.1"),
        ]))
        .unwrap();
        assert_eq!(
            config.get_tcp_user_timeout(),
            Some(&Duration::from_millis(1500))
        );
        assert_eq!(config.get_connect_timeout(), None);
        assert_eq!(config.get_keepalives_retries(), Some(4));
        assert_eq!(config.get_application_name(), Some("orders"));
        assert_eq!(
            config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        // Only an address: the handshake names the server by it.
        assert_eq!(config.get_hosts().len(), 1);
    }

    #[test]
    fn refusals_name_the_key_and_where_never_the_value() {
        for (pairs, said) in [
            (
                vec![("port", "Zq7Secret")],
                "the value of \"port\" (pair 1) is not valid: expected port numbers",
            ),
            (
                vec![("host", "db"), ("sslcert", "/Zq7Secret")],
                "\"sslcert\" (pair 2) is not supported (client certificates",
            ),
            (
                vec![("target_session_attrs", "standby")],
                "\"target_session_attrs\" (pair 1) asks for a server that takes no writes",
            ),
            (
                vec![("sslmode", "Zq7Secret")],
                "the value of \"sslmode\" (pair 1) is not valid: expected disable, allow",
            ),
            (
                vec![("client_encoding", "LATIN1")],
                "the value of \"client_encoding\" (pair 1) is not valid",
            ),
            (
                vec![("host", "a,,b")],
                "\"host\" (pair 1) has an empty host in its list",
            ),
            (
                vec![("hostaddr", "Zq7Secret")],
                "the value of \"hostaddr\" (pair 1) is not valid",
            ),
            (
                vec![("requiressl", "Zq7Secret")],
                "the value of \"requiressl\" (pair 1) is not valid",
            ),
        ] {
            let e = apply(&set(&pairs)).unwrap_err();
            assert!(e.starts_with(said), "{pairs:?}: {e}");
            assert!(!e.contains("Zq7Secret"), "{e}");
        }
        // An empty value of a refused key is as if not given.
        assert!(apply(&set(&[("sslcert", "")])).is_ok());
    }

    #[test]
    fn direct_negotiation_needs_a_mode_that_never_falls_back() {
        let tls = TlsWanted {
            direct: true,
            ..TlsWanted::default()
        };
        assert!(negotiation(&tls, SslMode::Prefer).is_err());
        assert_eq!(
            negotiation(&tls, SslMode::Require),
            Ok(SslNegotiation::Direct)
        );
        assert_eq!(
            negotiation(&TlsWanted::default(), SslMode::Prefer),
            Ok(SslNegotiation::Postgres)
        );
    }
}
