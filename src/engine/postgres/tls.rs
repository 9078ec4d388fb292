//! TLS for PostgreSQL, from the libpq options users already have in their
//! connection strings.
//!
//! tokio-postgres knows `sslmode=disable|prefer|require` and rejects
//! `verify-ca`, `verify-full` and `sslrootcert`. This module takes those out
//! before tokio-postgres parses the string and decides:
//! - `disable`, `allow`, `prefer` (the default): no TLS;
//! - `require`: TLS without verifying the server's certificate, as libpq and
//!   Npgsql mean it (the usual cloud setting): encrypted, but it does not
//!   prove whom it talks to, which `check` says; with `sslrootcert` given it
//!   verifies, as libpq does;
//! - `verify-ca`, `verify-full`: TLS with the server's certificate verified
//!   (chain and host name, so `verify-ca` is as strict as `verify-full`)
//!   against `sslrootcert` when given, else the system's roots.
//!
//! Npgsql strings (`Host=..;SSL Mode=Require`) are turned into the libpq
//! form first ([`super::npgsql`]).
//!
//! [`parse`] is also where a string is refused: a key tokio-postgres does
//! not take is named before it parses (its own refusal reads only "invalid
//! connection string"), with the keys it does take; a value it cannot read
//! is named by its key. Never by the value: it may be a password.

use std::str::FromStr;
use std::sync::Arc;

use tokio_postgres::config::SslMode;
use tokio_postgres::Config;
use tokio_postgres_rustls::MakeRustlsConnect;

/// Whether connections use TLS, for `check` and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsMode {
    Off,
    /// Encrypted, the server's certificate not verified (`sslmode=require`).
    Encrypted,
    Verified {
        roots: String,
    },
}

pub struct Target {
    pub config: Config,
    pub tls: MakeRustlsConnect,
    pub mode: TlsMode,
}

/// The libpq keys gap-healer takes, and what each takes (for the message
/// when a value is refused): tokio-postgres's own (its `Config::param`)
/// and the two this module takes out before it parses.
const KEYS: &[(&str, &str)] = &[
    (
        "host",
        "host names, IP addresses or socket directories, separated by commas",
    ),
    ("hostaddr", "IP addresses, separated by commas"),
    ("port", "port numbers up to 65535, separated by commas"),
    ("user", "a role name"),
    ("password", "a password"),
    ("dbname", "a database name"),
    ("options", "server settings (-c name=value)"),
    ("application_name", "a name"),
    (
        "sslmode",
        "disable, allow, prefer, require, verify-ca or verify-full",
    ),
    ("sslrootcert", "a file of PEM certificates"),
    ("sslnegotiation", "postgres or direct"),
    ("connect_timeout", "whole seconds"),
    ("tcp_user_timeout", "whole seconds"),
    ("keepalives", "1 or 0"),
    ("keepalives_idle", "whole seconds"),
    ("keepalives_interval", "whole seconds"),
    ("keepalives_retries", "a whole number"),
    (
        "target_session_attrs",
        "any or read-write (read-write connects only to a server that takes writes, which \
         gap-healer needs; the driver has no primary, standby or prefer-standby)",
    ),
    ("channel_binding", "disable, prefer or require"),
    ("load_balance_hosts", "disable or random"),
];

/// libpq keys the driver has no use for, and why: "unknown" would mislead
/// for a key the operator read in libpq's manual.
const UNSUPPORTED: &[(&[&str], &str)] = &[
    (
        &["sslcert", "sslkey", "sslpassword", "sslcertmode"],
        "client certificates are not supported: the login is user and password",
    ),
    (
        &["sslcrl", "sslcrldir"],
        "certificate revocation lists are not read",
    ),
    (
        &[
            "sslcompression",
            "sslsni",
            "ssl_min_protocol_version",
            "ssl_max_protocol_version",
            "requiressl",
        ],
        "TLS is set by sslmode and sslrootcert alone",
    ),
    (
        &["passfile"],
        "password files are not read: give password, or keep the whole connection string in a file (connection_string_file)",
    ),
    (&["service"], "service files are not read"),
    (
        &["gssencmode", "krbsrvname", "gsslib", "gssdelegation"],
        "Kerberos and GSSAPI are not supported: the login is user and password",
    ),
    (
        &["require_auth", "requirepeer"],
        "the driver does not restrict the server's authentication",
    ),
    (
        &["client_encoding"],
        "the driver always speaks UTF8",
    ),
    (
        &["fallback_application_name"],
        "give application_name",
    ),
    (
        &["replication"],
        "a replication session cannot run the healer's statements",
    ),
];

/// A refusal of a PostgreSQL connection string, as configuration checks and
/// the engine both report it.
pub fn refusal(e: &str) -> String {
    format!(
        "not a PostgreSQL connection string: {e} ({})",
        super::npgsql::ACCEPTED_FORMS
    )
}

/// The libpq keys gap-healer takes, for a refusal.
fn accepted_keys(url: bool) -> String {
    let keys: Vec<&str> = KEYS.iter().map(|(k, _)| *k).collect();
    if url {
        format!(
            "the query parameters gap-healer takes are the libpq keys {}",
            keys.join(", ")
        )
    } else {
        format!("the keys gap-healer takes are {}", keys.join(", "))
    }
}

/// Refuses a key gap-healer does not take, naming it, never its value:
/// pair `n` of a key/value string or query parameter `n` of a URL.
/// `follows_password`: it comes right after an unquoted password, so it
/// may be the rest of that password (`password=ab cd=ef`), and is not named
/// unless it is a libpq key.
fn check_key(
    n: usize,
    key: &str,
    value: &str,
    follows_password: bool,
    url: bool,
) -> Result<(), String> {
    if KEYS.iter().any(|(k, _)| *k == key) {
        if key == "target_session_attrs" && value == "read-only" {
            return Err(
                "target_session_attrs=read-only connects only to a server that takes no writes, \
                 and gap-healer writes tombstones: give read-write or any"
                    .into(),
            );
        }
        return Ok(());
    }
    let accepted = accepted_keys(url);
    let what = if url { "URL query parameter" } else { "key" };
    // A libpq key by name is no fragment of a password: always named.
    if let Some((_, why)) = UNSUPPORTED.iter().find(|(keys, _)| keys.contains(&key)) {
        return Err(format!(
            "libpq {what} {key:?} is not supported ({why}); {accepted}"
        ));
    }
    if follows_password {
        return Err(if url {
            format!(
                "query parameter {n}, right after password, is not one gap-healer takes (not \
                 shown: it may be the rest of a password that holds a `&`; percent-encode it, \
                 %26); {accepted}"
            )
        } else {
            format!(
                "the key of pair {n}, right after an unquoted password, is not one gap-healer \
                 takes (not shown: it may be the rest of a password that holds a space; quote \
                 the password, password='...'); {accepted}"
            )
        });
    }
    let close = KEYS
        .iter()
        .map(|(k, _)| (strsim::levenshtein(key, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| format!(" (did you mean {k:?}?)"))
        .unwrap_or_default();
    Err(format!("unknown {what} {key:?}{close}; {accepted}"))
}

/// tokio-postgres's refusal of what the checks above let through (a value
/// it cannot read: `port=abc`, a URL's `db:abc`) as a message naming the
/// key. Its causes name keys only (``invalid value for option `port` ``),
/// except the key/value parser's "unexpected character", which names a
/// character of the string: only the known shapes are passed on.
fn driver_refusal(e: &tokio_postgres::Error, url: bool) -> String {
    let cause = std::error::Error::source(e)
        .map(|c| c.to_string())
        .unwrap_or_default();
    let named = |prefix: &str| {
        cause
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix('`'))
            .map(str::to_string)
    };
    if let Some(key) = named("invalid value for option `") {
        return match (url, key.as_str()) {
            (true, "port") => "the port in the URL is not valid: expected a number up to 65535, \
                               as in postgres://app@db:5432/es"
                .into(),
            (true, "host") => "the host in the URL is not valid: expected a name, an IP \
                               address, or an IPv6 address in brackets (postgres://app@[::1]:5432/es)"
                .into(),
            _ => {
                let expected = KEYS.iter().find(|(k, _)| *k == key).map_or("", |(_, x)| *x);
                format!("the value of {key:?} is not valid: expected {expected}")
            }
        };
    }
    if let Some(key) = named("unknown option `") {
        return check_key(1, &key, "", false, url)
            .err()
            .unwrap_or_else(|| format!("the driver does not take the key {key:?}"));
    }
    let fixed = [
        "unterminated parameter",
        "unexpected EOF",
        "unterminated quoted connection parameter value",
    ];
    if fixed.contains(&cause.as_str()) || cause.contains("utf-8") {
        format!("{e}: {cause}")
    } else {
        e.to_string()
    }
}

/// Parses a libpq key/value string or URL. Errors name keys, never a value.
pub fn parse(raw: &str) -> Result<Target, String> {
    let converted;
    let url = raw.starts_with("postgres://") || raw.starts_with("postgresql://");
    let libpq = if url { None } else { key_values(raw).ok() };
    let raw = if !url && super::npgsql::is_npgsql(raw, libpq.as_deref()) {
        converted = super::npgsql::to_libpq(raw)?;
        converted.as_str()
    } else {
        raw
    };
    let (rest, options) = take_tls_options(raw)?;
    let mut config = Config::from_str(&rest).map_err(|e| driver_refusal(&e, url))?;
    let verify = match options.sslmode.as_deref() {
        None | Some("disable" | "allow" | "prefer") => false,
        // As in libpq: with a root certificate given, require verifies.
        Some("require") if options.sslrootcert.is_some() => true,
        Some("require") => {
            config.ssl_mode(SslMode::Require);
            let tls = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS setup: {e}"))?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unverified(provider())))
                .with_no_client_auth();
            return Ok(Target {
                config,
                tls: MakeRustlsConnect::new(tls),
                mode: TlsMode::Encrypted,
            });
        }
        Some("verify-ca" | "verify-full") => true,
        Some(_) => return Err(
            "invalid sslmode: expected disable, allow, prefer, require, verify-ca or verify-full"
                .into(),
        ),
    };
    let (tls_config, mode) = if verify {
        config.ssl_mode(SslMode::Require);
        let (roots, described) = roots(options.sslrootcert.as_deref())?;
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        (tls, TlsMode::Verified { roots: described })
    } else {
        config.ssl_mode(SslMode::Disable);
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup: {e}"))?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        (tls, TlsMode::Off)
    };
    Ok(Target {
        config,
        tls: MakeRustlsConnect::new(tls_config),
        mode,
    })
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `sslmode=require`: any certificate is accepted, but the handshake's
/// signatures are still checked, so the session is encrypted to whoever
/// holds the key of the certificate the server sent.
#[derive(Debug)]
struct Unverified(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn roots(file: Option<&str>) -> Result<(rustls::RootCertStore, String), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut store = rustls::RootCertStore::empty();
    match file {
        Some(path) => {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("sslrootcert {path}: {e}"))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("sslrootcert {path}: {e}"))?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!("sslrootcert {path}: no certificate in it"));
            }
            Ok((store, format!("{added} certificate(s) from {path}")))
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err("sslmode asks for TLS but the system has no root certificates: give sslrootcert=FILE".into());
            }
            Ok((store, format!("{added} system root certificate(s)")))
        }
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
struct TlsOptions {
    sslmode: Option<String>,
    sslrootcert: Option<String>,
}

/// Where a URL's query begins: at the first `?` after the credentials,
/// which end at the first `@` (as tokio-postgres reads them), so a `?` in a
/// password is not taken for the query.
fn url_query(raw: &str) -> Option<usize> {
    let after_scheme = raw.find("://")? + 3;
    let from = raw[after_scheme..]
        .find('@')
        .map_or(after_scheme, |at| after_scheme + at + 1);
    raw[from..].find('?').map(|q| from + q)
}

/// Removes `sslmode` and `sslrootcert` from a key/value string or a URL's
/// query, returning the rest for tokio-postgres and the two values, and
/// refuses any key gap-healer does not take ([`check_key`]).
fn take_tls_options(raw: &str) -> Result<(String, TlsOptions), String> {
    let mut options = TlsOptions::default();
    if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
        let Some(q) = url_query(raw) else {
            return Ok((raw.to_string(), options));
        };
        let (base, query) = (&raw[..q], &raw[q + 1..]);
        let mut kept = Vec::new();
        let mut follows_password = false;
        for (n, pair) in query.split('&').enumerate() {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = percent_decode(k);
            check_key(n + 1, &key, &percent_decode(v), follows_password, true)?;
            follows_password = key == "password";
            match key.as_str() {
                "sslmode" => options.sslmode = Some(percent_decode(v)),
                "sslrootcert" => options.sslrootcert = Some(percent_decode(v)),
                _ => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, options));
    }
    let mut kept = Vec::new();
    let mut follows_password = false;
    for (n, (key, raw_value, value)) in key_values(raw)?.into_iter().enumerate() {
        check_key(n + 1, &key, &value, follows_password, false)?;
        follows_password = key == "password" && !raw_value.starts_with('\'');
        if raw_value.is_empty() {
            // tokio-postgres would say only "unexpected EOF".
            return Err(format!(
                "key {key:?} has no value: give one, or quote an empty one ({key}='')"
            ));
        }
        match key.as_str() {
            "sslmode" => options.sslmode = Some(value),
            "sslrootcert" => options.sslrootcert = Some(value),
            _ => kept.push(format!("{key}={raw_value}")),
        }
    }
    Ok((kept.join(" "), options))
}

/// libpq key/value pairs: `key = value`, values bare or single-quoted with
/// backslash escapes. Returns (key, value as written, value unescaped).
fn key_values(raw: &str) -> Result<Vec<(String, String, String)>, String> {
    let chars: Vec<char> = raw.chars().collect();
    let mut i = 0;
    let mut out = Vec::new();
    let skip_ws = |i: &mut usize| {
        while *i < chars.len() && chars[*i].is_whitespace() {
            *i += 1;
        }
    };
    loop {
        skip_ws(&mut i);
        if i >= chars.len() {
            return Ok(out);
        }
        let key_start = i;
        while i < chars.len() && chars[i] != '=' && !chars[i].is_whitespace() {
            i += 1;
        }
        let key: String = chars[key_start..i].iter().collect();
        skip_ws(&mut i);
        if i >= chars.len() || chars[i] != '=' {
            // Position only: a malformed string may be all password.
            return Err(format!(
                "expected `key=value` at character {}",
                key_start + 1
            ));
        }
        i += 1;
        skip_ws(&mut i);
        let value_start = i;
        let mut value = String::new();
        if i < chars.len() && chars[i] == '\'' {
            i += 1;
            loop {
                match chars.get(i) {
                    None => {
                        return Err(format!(
                            "unterminated quoted value starting at character {}",
                            value_start + 1
                        ))
                    }
                    Some('\\') => {
                        if let Some(c) = chars.get(i + 1) {
                            value.push(*c);
                        }
                        i += 2;
                    }
                    Some('\'') => {
                        i += 1;
                        break;
                    }
                    Some(c) => {
                        value.push(*c);
                        i += 1;
                    }
                }
            }
        } else {
            while i < chars.len() && !chars[i].is_whitespace() {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    i += 1;
                }
                value.push(chars[i]);
                i += 1;
            }
        }
        let raw_value: String = chars[value_start..i].iter().collect();
        out.push((key, raw_value, value));
    }
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_are_taken_out_of_key_values() {
        let (rest, o) =
            take_tls_options("host=db sslmode=verify-full sslrootcert='/etc/ca dir/ca.pem' password='a\\'b c' user=app")
                .unwrap();
        assert_eq!(rest, "host=db password='a\\'b c' user=app");
        assert_eq!(o.sslmode.as_deref(), Some("verify-full"));
        assert_eq!(o.sslrootcert.as_deref(), Some("/etc/ca dir/ca.pem"));
        assert!(Config::from_str(&rest).is_ok());
    }

    #[test]
    fn tls_options_are_taken_out_of_urls() {
        let (rest, o) = take_tls_options(
            "postgres://app:pw@db:5432/es?sslmode=require&sslrootcert=%2Fca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(rest, "postgres://app:pw@db:5432/es?application_name=x");
        assert_eq!(
            o,
            TlsOptions {
                sslmode: Some("require".into()),
                sslrootcert: Some("/ca.pem".into())
            }
        );
    }

    #[test]
    fn modes() {
        assert_eq!(parse("host=db user=app").unwrap().mode, TlsMode::Off);
        assert_eq!(parse("host=db sslmode=prefer").unwrap().mode, TlsMode::Off);
        assert_eq!(
            parse("host=db sslmode=require").unwrap().mode,
            TlsMode::Encrypted
        );
        assert_eq!(
            parse("Host=db;Username=app;SSL Mode=Require;Trust Server Certificate=true")
                .unwrap()
                .mode,
            TlsMode::Encrypted
        );
        assert!(matches!(
            parse("host=db sslmode=verify-full").map(|t| t.mode),
            Ok(TlsMode::Verified { .. }) | Err(_)
        ));
        let e = parse("host=db sslmode=sometimes password=hunter2")
            .err()
            .unwrap();
        assert!(e.contains("sslmode") && !e.contains("hunter2"), "{e}");
        let e = parse("host=db sslmode=require sslrootcert=/nonexistent.pem")
            .err()
            .unwrap();
        assert!(e.contains("/nonexistent.pem"), "{e}");
        assert!(key_values("host=db password='open").is_err());
        for malformed in ["Zq71;o", "host=db Secret9x", "host=db password='Secret9x"] {
            let e = parse(malformed).err().unwrap();
            assert!(!e.contains("Zq71") && !e.contains("Secret9x"), "{e}");
        }
    }

    /// Issue 20: unknown and unsupported libpq keys, URL query parameters
    /// and bad values all read "invalid connection string", naming no key.
    /// Each refusal names the key, never the value, and lists the keys
    /// taken.
    #[test]
    fn refusals_name_the_key_never_the_value_and_list_the_keys_taken() {
        let list = "the keys gap-healer takes are host, hostaddr, port, user, password, dbname";
        let url_list = "the query parameters gap-healer takes are the libpq keys host, hostaddr";
        for (raw, said, listed) in [
            (
                "host=db usr=Zq7Secret password=Zq7Secret",
                "unknown key \"usr\" (did you mean \"user\"?)",
                list,
            ),
            (
                "host=db sslcert=/Zq7Secret.pem password=Zq7Secret",
                "libpq key \"sslcert\" is not supported (client certificates",
                list,
            ),
            (
                "host=db passfile=/Zq7Secret",
                "libpq key \"passfile\" is not supported (password files are not read",
                list,
            ),
            (
                "postgres://app:Zq7Secret@db/es?sslmode=require&usr=Zq7Secret",
                "unknown URL query parameter \"usr\" (did you mean \"user\"?)",
                url_list,
            ),
            (
                "postgres://app:Zq7Secret@db/es?sslkey=/Zq7Secret",
                "libpq URL query parameter \"sslkey\" is not supported",
                url_list,
            ),
            (
                "host=db port=Zq7Secret password=Zq7Secret",
                "the value of \"port\" is not valid: expected port numbers",
                "",
            ),
            (
                "host=db keepalives_idle=Zq7Secret",
                "the value of \"keepalives_idle\" is not valid: expected whole seconds",
                "",
            ),
            (
                "postgres://app:Zq7Secret@db:Zq7Secret/es",
                "the port in the URL is not valid: expected a number up to 65535",
                "",
            ),
            (
                "postgres://app:Zq7Secret@db/es?connect_timeout=Zq7Secret",
                "the value of \"connect_timeout\" is not valid: expected whole seconds",
                "",
            ),
            (
                "host=db target_session_attrs=primary password=Zq7Secret",
                "the value of \"target_session_attrs\" is not valid: expected any or read-write",
                "",
            ),
            (
                "host=db target_session_attrs=read-only",
                "target_session_attrs=read-only connects only to a server that takes no writes",
                "",
            ),
            (
                "host=db password=Zq7Secret dbname=",
                "key \"dbname\" has no value",
                "",
            ),
        ] {
            let e = parse(raw).err().unwrap_or_else(|| panic!("{raw} parsed"));
            assert!(e.starts_with(said), "{raw}: {e}");
            assert!(e.contains(listed), "{raw}: {e}");
            assert!(!e.contains("Zq7Secret"), "{raw}: {e}");
            // One prefix, as configuration checks and the engine both say it.
            let shown = refusal(&e);
            assert_eq!(
                shown.matches("PostgreSQL connection string").count(),
                1,
                "{shown}"
            );
            assert!(!shown.contains("invalid connection string"), "{shown}");
            assert!(shown.contains("accepted forms: libpq key/value"), "{shown}");
        }
        assert!(parse("host=db target_session_attrs=read-write").is_ok());
        assert!(parse("host=db target_session_attrs=any").is_ok());
    }

    /// A "key" right after an unquoted password may be the rest of a
    /// password holding a space (or an `&` in a URL's query): refused
    /// without being named.
    #[test]
    fn a_key_after_an_unquoted_password_is_not_named() {
        let e = parse("host=db password=Zq7 secretx=y").err().unwrap();
        assert!(!e.contains("secretx"), "{e}");
        assert!(
            e.contains("pair 3, right after an unquoted password"),
            "{e}"
        );
        let e = parse("postgres://db/es?password=Zq7&Secret9x=y")
            .err()
            .unwrap();
        assert!(!e.contains("Secret9x"), "{e}");
        assert!(e.contains("query parameter 2, right after password"), "{e}");
        // Quoted, it cannot run on: the next key is named.
        let e = parse("host=db password='Zq7 x' colour=y").err().unwrap();
        assert!(e.starts_with("unknown key \"colour\""), "{e}");
        // A libpq key by name is no fragment of a password: named.
        let e = parse("host=db password=Zq7 sslcert=/c.pem").err().unwrap();
        assert!(
            e.starts_with("libpq key \"sslcert\" is not supported"),
            "{e}"
        );
    }

    /// A `?` in a URL's password is not the start of its query: its rest is
    /// never read (nor named) as a query parameter.
    #[test]
    fn a_question_mark_in_a_url_password_is_not_the_query() {
        let t = parse("postgres://app:Zq7?Secret9x=y@db/es?sslmode=require").unwrap();
        assert_eq!(t.mode, TlsMode::Encrypted);
        assert_eq!(t.config.get_password(), Some(&b"Zq7?Secret9x=y"[..]));
        assert_eq!(url_query("postgres://db/es?a=b"), Some(16));
        assert_eq!(url_query("postgres://a:b?c@db/es"), None);
    }

    /// A `%` followed by a multi-byte character used to panic (a `&str`
    /// sliced inside a character), crashing the process with exit 101.
    #[test]
    fn percent_decoding_never_panics() {
        assert_eq!(percent_decode("%aé"), "%aé");
        assert_eq!(percent_decode("%2Fca%20dir"), "/ca dir");
        assert_eq!(percent_decode("%e2%82%ac"), "€");
        assert_eq!(percent_decode("%"), "%");
        let (_, o) =
            take_tls_options("postgres://app@db/es?sslmode=require&sslrootcert=%a\u{e9}x").unwrap();
        assert!(o.sslrootcert.is_some());
        let e = parse("postgres://app@db/es?sslmode=require&sslrootcert=%aé")
            .err()
            .unwrap();
        assert!(e.contains("sslrootcert") || e.contains("%aé"), "{e}");
    }
}
