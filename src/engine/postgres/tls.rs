//! The PostgreSQL connection string, read into the driver's `Config`, and
//! TLS as libpq's `sslmode` means it.
//!
//! [`parse`] reads any of the three forms ([`crate::secret::form::postgres`]
//! chooses), turns each into libpq [`settings::Setting`]s (Npgsql through
//! [`super::npgsql`]) and builds the `Config` from them with the driver's
//! setters: the driver's own parser never sees the string, so none of its
//! messages can repeat a piece of it. Every refusal names a key of our
//! tables and where it was written, never a value.
//!
//! `sslmode`, as libpq:
//! - `disable`: no TLS;
//! - `allow`: plain first; if the server refuses that session (a
//!   `hostssl`-only `pg_hba.conf`, or any refusal of the login), once more
//!   with TLS, the server's certificate not verified;
//! - `prefer` (the default, also Npgsql's): TLS first, not verified; plain
//!   if the server has no TLS (it answers the SSL request with `N`), the
//!   handshake fails, or the server refuses the encrypted session (a
//!   `hostnossl` entry, or any refusal of the login);
//! - `require`: TLS, not verified (with `sslrootcert` given, verified as
//!   `verify-ca`, as libpq does);
//! - `verify-ca`: TLS, the certificate chain verified against `sslrootcert`
//!   (or, with `sslrootcert=system` or none, the system's roots), the host
//!   name not checked;
//! - `verify-full`: the chain and the host name verified.
//!
//! [`TlsMode`] says which applies; which one a session of `allow` or
//! `prefer` got is the server's to say (`check` asks `pg_stat_ssl`).
//! `sslrootcert=system` asks for `verify-full`, as in libpq 16. TLS is
//! never tried over a Unix socket (the server answers `N` there).

use std::sync::Arc;

use tokio_postgres::config::SslMode as DriverMode;
use tokio_postgres::Config;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::secret::form::{self, Reading};
use crate::secret::{libpq, url};

pub(crate) mod settings;

use settings::{Setting, SslMode, TlsWanted};

/// Which TLS a connection string asks for, for `check` and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// `sslmode=disable`.
    Off,
    /// `sslmode=allow`: plain, or TLS (not verified) if the server refuses
    /// a plain session.
    Allow,
    /// `sslmode=prefer`, the default: TLS (not verified), or plain if the
    /// server has none or refuses an encrypted session.
    Prefer,
    /// Encrypted, the server's certificate not verified (`sslmode=require`).
    Encrypted,
    Verified {
        /// What the chain is verified against, and, for `verify-ca`, that
        /// the host name is not.
        roots: String,
    },
}

impl TlsMode {
    /// The driver's mode for a session's first attempt: `prefer`'s is the
    /// driver's prefer (TLS, or plain on the same connection when the
    /// server answers `N`); [`super::conn::Target`] retries `allow` and
    /// `prefer` the other way.
    pub(crate) fn first_attempt(&self) -> DriverMode {
        match self {
            TlsMode::Off | TlsMode::Allow => DriverMode::Disable,
            TlsMode::Prefer => DriverMode::Prefer,
            TlsMode::Encrypted | TlsMode::Verified { .. } => DriverMode::Require,
        }
    }
}

impl TlsMode {
    /// For `allow` and `prefer`, how the session came to be encrypted or
    /// not, for `check` (which asks the server whether it is).
    pub(crate) fn as_attempted(&self, encrypted: bool) -> &'static str {
        match (self, encrypted) {
            (TlsMode::Prefer, true) => "sslmode=prefer: TLS is tried first, and the server took it",
            (TlsMode::Prefer, false) => {
                "sslmode=prefer: the server refused TLS, so the session is plain, as libpq's \
                 would be"
            }
            (TlsMode::Allow, true) => {
                "sslmode=allow: the server refused a plain session, so TLS was tried next"
            }
            (TlsMode::Allow, false) => {
                "sslmode=allow: plain is tried first, and the server took it"
            }
            _ => "",
        }
    }
}

pub struct Target {
    pub config: Config,
    pub tls: MakeRustlsConnect,
    pub mode: TlsMode,
}

/// A refusal of a PostgreSQL connection string, as configuration checks and
/// the engine both report it.
pub fn refusal(e: &str) -> String {
    format!(
        "not a PostgreSQL connection string: {e} ({})",
        super::npgsql::ACCEPTED_FORMS
    )
}

/// The string's settings, whichever form it is in.
fn read(raw: &str) -> Result<Vec<Setting>, String> {
    let setting = |key, value: &str, said: String| Setting {
        key,
        value: value.to_string(),
        said,
    };
    match form::postgres(raw)? {
        Reading::Libpq(pairs) => Ok(pairs
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                let key = libpq::keyword(&p.key)?;
                Some(setting(
                    key,
                    &p.value,
                    format!("\"{key}\" (pair {})", i + 1),
                ))
            })
            .collect()),
        Reading::Url(u) => {
            if let Some(e) = url::first_unknown(&u) {
                return Err(e);
            }
            let parts = [
                ("user", &u.user, "the URL's user name"),
                ("password", &u.password, "the URL's password"),
                ("host", &u.hosts, "the URL's host"),
                ("port", &u.ports, "the URL's port"),
                ("dbname", &u.dbname, "the URL's database name"),
            ];
            let mut out: Vec<Setting> = parts
                .into_iter()
                .filter_map(|(key, part, said)| {
                    part.as_ref()
                        .map(|p| setting(key, &p.value, said.to_string()))
                })
                .collect();
            out.extend(u.params.iter().enumerate().filter_map(|(i, p)| {
                let key = libpq::keyword(&p.key)?;
                let said = format!("\"{key}\" (query parameter {} of the URL)", i + 1);
                Some(setting(key, &p.value, said))
            }));
            Ok(out)
        }
        Reading::Ado(pairs) => super::npgsql::settings(&pairs),
    }
}

/// Reads a connection string in any of its forms into the driver's
/// `Config` and the TLS it asks for. Errors name keys and positions, never
/// a value.
pub fn parse(raw: &str) -> Result<Target, String> {
    let (mut config, wanted) = settings::apply(&read(raw)?)?;
    let (tls, mode) = tls(&wanted)?;
    config.ssl_mode(mode.first_attempt());
    config.ssl_negotiation(settings::negotiation(
        &wanted,
        wanted.mode.unwrap_or(SslMode::Prefer),
    )?);
    Ok(Target {
        config,
        tls: MakeRustlsConnect::new(tls),
        mode,
    })
}

/// The rustls configuration and the [`TlsMode`] of what the string asks for.
fn tls(wanted: &TlsWanted) -> Result<(rustls::ClientConfig, TlsMode), String> {
    let system = wanted.rootcert.as_deref() == Some("system");
    let mode =
        match (wanted.mode, system) {
            (None, true) => SslMode::VerifyFull,
            (Some(m), true) if m != SslMode::VerifyFull => return Err(
                "sslrootcert=system needs sslmode=verify-full (libpq's rule: the system's roots \
                 vouch for names, so the name is checked)"
                    .into(),
            ),
            (m, _) => m.unwrap_or(SslMode::Prefer),
        };
    let versions: &[&rustls::SupportedProtocolVersion] = match (
        wanted.only_tls13,
        wanted.only_tls12,
    ) {
        (true, true) => return Err(
            "ssl_min_protocol_version is above ssl_max_protocol_version: no TLS version is left"
                .into(),
        ),
        (true, false) => &[&rustls::version::TLS13],
        (false, true) => &[&rustls::version::TLS12],
        (false, false) => rustls::ALL_VERSIONS,
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(|e| format!("TLS setup: {e}"))?;
    let file = wanted.rootcert.as_deref().filter(|_| !system);
    let verify_ca = mode == SslMode::VerifyCa || (mode == SslMode::Require && file.is_some());
    let (mut config, mode) = if verify_ca || mode == SslMode::VerifyFull {
        let (roots, described) = roots(file)?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            provider(),
        )
        .build()
        .map_err(|e| format!("TLS setup: {e}"))?;
        let (verifier, roots): (Arc<dyn rustls::client::danger::ServerCertVerifier>, String) =
            if verify_ca {
                (
                    Arc::new(ChainOnly(verifier)),
                    format!("{described}, the host name not checked (sslmode=verify-ca)"),
                )
            } else {
                (verifier, described)
            };
        (
            builder
                .dangerous()
                .with_custom_certificate_verifier(verifier)
                .with_no_client_auth(),
            TlsMode::Verified { roots },
        )
    } else {
        let unverified = builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider())))
            .with_no_client_auth();
        let mode = match mode {
            SslMode::Disable => TlsMode::Off,
            SslMode::Allow => TlsMode::Allow,
            SslMode::Prefer => TlsMode::Prefer,
            _ => TlsMode::Encrypted,
        };
        (unverified, mode)
    };
    config.enable_sni = !wanted.no_sni;
    Ok((config, mode))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// `sslmode=verify-ca`: the chain verified as for `verify-full`, a
/// certificate for another name accepted (webpki checks the chain first,
/// so a name mismatch means the chain held).
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError::{NotValidForName, NotValidForNameContext};
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                NotValidForName | NotValidForNameContext { .. },
            )) => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
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

/// The roots a verifying mode checks against: the PEM certificates of
/// `file`, or the system's. An error names `sslrootcert` and the file's
/// trouble, not its path (the path is text of the string).
fn roots(file: Option<&str>) -> Result<(rustls::RootCertStore, String), String> {
    use rustls::pki_types::pem::{self, PemObject};
    use rustls::pki_types::CertificateDer;
    let mut store = rustls::RootCertStore::empty();
    match file {
        Some(path) => {
            let unreadable = |e: pem::Error| match e {
                pem::Error::Io(io) => {
                    format!("the file sslrootcert names cannot be read: {}", io.kind())
                }
                _ => "the file sslrootcert names holds no PEM certificate that can be read".into(),
            };
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(unreadable)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(unreadable)?;
            let (added, _) = store.add_parsable_certificates(certs);
            if added == 0 {
                return Err("the file sslrootcert names holds no certificate".into());
            }
            Ok((store, format!("{added} certificate(s) from {path}")))
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = store.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err("sslmode asks for a verified server but the system has no root certificates: give sslrootcert=FILE".into());
            }
            Ok((store, format!("{added} system root certificate(s)")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(raw: &str) -> TlsMode {
        parse(raw).unwrap_or_else(|e| panic!("{raw}: {e}")).mode
    }

    /// Issue 27: a valid libpq string whose password holds `;` and `=` was
    /// refused as Npgsql, naming a piece of the password as a key.
    #[test]
    fn the_issues_string_is_libpq_and_its_password_whole() {
        let t =
            parse("host=127.0.0.1 user=u dbname=store password=Tr0ub4dor;horse=staple").unwrap();
        assert_eq!(
            t.config.get_password(),
            Some(&b"Tr0ub4dor;horse=staple"[..])
        );
        assert_eq!(t.config.get_user(), Some("u"));
        assert_eq!(t.config.get_dbname(), Some("store"));
        let t = parse("postgres://u:p%40ss;w=rd@db/es").unwrap();
        assert_eq!(t.config.get_password(), Some(&b"p@ss;w=rd"[..]));
        let t = parse("Host=db;Username=u;Password='a;b=c''d'").unwrap();
        assert_eq!(t.config.get_password(), Some(&b"a;b=c'd"[..]));
    }

    #[test]
    fn modes_are_libpqs() {
        assert_eq!(mode("host=db user=app"), TlsMode::Prefer);
        assert_eq!(mode("host=db sslmode=prefer"), TlsMode::Prefer);
        assert_eq!(mode("host=db sslmode=allow"), TlsMode::Allow);
        assert_eq!(mode("host=db sslmode=disable"), TlsMode::Off);
        assert_eq!(mode("host=db requiressl=1"), TlsMode::Encrypted);
        assert_eq!(mode("postgres://db/es?ssl=true"), TlsMode::Encrypted);
        assert_eq!(mode("host=db sslmode=require"), TlsMode::Encrypted);
        assert_eq!(
            mode("Host=db;Username=app;SSL Mode=Require;Trust Server Certificate=true"),
            TlsMode::Encrypted
        );
        assert_eq!(mode("Host=db;Username=app"), TlsMode::Prefer);
        for (raw, first) in [
            ("host=db", DriverMode::Prefer),
            ("host=db sslmode=allow", DriverMode::Disable),
            ("host=db sslmode=disable", DriverMode::Disable),
            ("host=db sslmode=require", DriverMode::Require),
        ] {
            assert_eq!(parse(raw).unwrap().config.get_ssl_mode(), first, "{raw}");
        }
        assert!(matches!(
            parse("host=db sslmode=verify-full").map(|t| t.mode),
            Ok(TlsMode::Verified { .. }) | Err(_)
        ));
        // As in libpq: require with a root certificate verifies as verify-ca.
        let ca = "/etc/ssl/certs/ssl-cert-snakeoil.pem";
        if std::path::Path::new(ca).is_file() {
            for raw in [
                format!("host=db sslmode=require sslrootcert={ca}"),
                format!("host=db sslmode=verify-ca sslrootcert={ca}"),
            ] {
                let TlsMode::Verified { roots } = mode(&raw) else {
                    panic!("{raw}")
                };
                assert!(
                    roots.ends_with("the host name not checked (sslmode=verify-ca)"),
                    "{roots}"
                );
            }
            let TlsMode::Verified { roots } =
                mode(&format!("host=db sslmode=verify-full sslrootcert={ca}"))
            else {
                panic!("verify-full")
            };
            assert_eq!(roots, format!("1 certificate(s) from {ca}"));
        }
        let e = parse("host=db sslmode=require sslrootcert=system")
            .err()
            .unwrap();
        assert!(
            e.starts_with("sslrootcert=system needs sslmode=verify-full"),
            "{e}"
        );
        assert!(matches!(
            parse("host=db sslrootcert=system").map(|t| t.mode),
            Ok(TlsMode::Verified { .. }) | Err(_)
        ));
        let e = parse("host=db sslnegotiation=direct").err().unwrap();
        assert!(
            e.starts_with("sslnegotiation=direct needs sslmode require"),
            "{e}"
        );
        let e = parse("host=db ssl_min_protocol_version=TLSv1.3 ssl_max_protocol_version=TLSv1.2")
            .err()
            .unwrap();
        assert!(e.contains("no TLS version is left"), "{e}");
    }

    /// A missing CA file is named by its key, not its path.
    #[test]
    fn a_missing_root_certificate_file_is_named_by_its_key() {
        let e = parse("host=db sslmode=verify-full sslrootcert=/nonexistent/Zq7Secret.pem")
            .err()
            .unwrap();
        assert_eq!(
            e,
            "the file sslrootcert names cannot be read: entity not found"
        );
    }

    /// Each refusal names the key by our tables' spelling and where it
    /// was written, never a value, never a key that is not in a table.
    #[test]
    fn refusals_name_keys_of_our_tables_and_positions_never_text() {
        for (raw, said) in [
            ("host=db usr=Zq7Secret password=Zq7Secret", "an unknown key at pair 2 (of 3)"),
            (
                "host=db sslcert=/Zq7Secret.pem password=Zq7Secret",
                "\"sslcert\" (pair 2) is not supported (client certificates",
            ),
            ("host=db passfile=/Zq7Secret", "\"passfile\" (pair 2) is not supported (password files"),
            (
                "postgres://app:Zq7Secret@db/es?sslmode=require&usr=Zq7Secret",
                "query parameter 2 (of 2) of the URL is not a libpq key",
            ),
            (
                "postgres://app:Zq7Secret@db/es?sslkey=/Zq7Secret",
                "\"sslkey\" (query parameter 1 of the URL) is not supported",
            ),
            (
                "host=db port=Zq7Secret password=Zq7Secret",
                "the value of \"port\" (pair 2) is not valid: expected port numbers",
            ),
            (
                "host=db keepalives_idle=Zq7Secret",
                "the value of \"keepalives_idle\" (pair 2) is not valid: expected whole seconds",
            ),
            (
                "postgres://app:Zq7Secret@db:Zq7Secret/es",
                "the value of the URL's port is not valid: expected port numbers",
            ),
            (
                "postgres://app:Zq7Secret@db/es?connect_timeout=Zq7Secret",
                "the value of \"connect_timeout\" (query parameter 1 of the URL) is not valid",
            ),
            (
                "host=db target_session_attrs=Zq7Secret password=Zq7Secret",
                "the value of \"target_session_attrs\" (pair 2) is not valid: expected any, read-write or primary",
            ),
            (
                "host=db target_session_attrs=read-only",
                "\"target_session_attrs\" (pair 2) asks for a server that takes no writes",
            ),
            ("host=db sslmode=Zq7Secret password=Zq7Secret", "the value of \"sslmode\" (pair 2)"),
            ("Host=db;Colour=blue;Password=Zq7Secret", "an unknown Npgsql key at pair 2 (of 3)"),
            (
                "Host=db;Password=Zq7Secret;Zq7Secret=x",
                "an unknown Npgsql key at pair 3 (of 3), right after an unquoted Password",
            ),
            ("Host=db;Port=Zq7Secret", "the value of Npgsql's \"Port\" (pair 2) is not valid"),
        ] {
            let e = parse(raw).err().unwrap_or_else(|| panic!("{raw} parsed"));
            assert!(e.starts_with(said), "{raw}: {e}");
            assert!(!e.contains("Zq7Secret") && !e.contains("usr") && !e.contains("lour"), "{raw}: {e}");
            // One prefix, as configuration checks and the engine both say it.
            let shown = refusal(&e);
            assert_eq!(shown.matches("PostgreSQL connection string").count(), 1, "{shown}");
            assert!(shown.contains("accepted forms: libpq key/value"), "{shown}");
        }
        assert!(parse("host=db target_session_attrs=read-write").is_ok());
        assert!(parse("host=db target_session_attrs=any").is_ok());
    }

    /// Every key libpq has is taken, ignored or refused by name: none is
    /// "unknown", and none is silently dropped.
    #[test]
    fn every_libpq_key_is_decided() {
        for key in libpq::KEYWORDS {
            let raw = format!("host=db {key}=''");
            match parse(&raw) {
                Ok(_) => {}
                Err(e) => assert!(e.contains(&format!("\"{key}\" (pair 2)")), "{key}: {e}"),
            }
        }
    }

    /// A `?` in a URL's password is not the start of its query: its rest is
    /// never read (nor named) as a query parameter.
    #[test]
    fn a_question_mark_in_a_url_password_is_not_the_query() {
        let t = parse("postgres://app:Zq7?Secret9x=y@db/es?sslmode=require").unwrap();
        assert_eq!(t.mode, TlsMode::Encrypted);
        assert_eq!(t.config.get_password(), Some(&b"Zq7?Secret9x=y"[..]));
    }

    /// A `%` followed by a multi-byte character used to panic (a `&str`
    /// sliced inside a character), crashing the process with exit 101.
    #[test]
    fn percent_decoding_never_panics() {
        let e = parse("postgres://app@db/es?sslmode=require&sslrootcert=%aé")
            .err()
            .unwrap();
        assert!(e.starts_with("a `%` in the URL's query parameter 2"), "{e}");
        let t = parse("postgres://app@db/es?sslmode=require&application_name=%e2%82%ac").unwrap();
        assert_eq!(t.config.get_application_name(), Some("€"));
    }

    /// `check` says which one an `allow` or `prefer` session got, from the
    /// server's answer (`pg_stat_ssl`), and warns only of a plain one to
    /// another machine.
    #[test]
    fn check_says_which_one_the_session_got() {
        use super::super::preflight::{plaintext_warning, session, Session};
        use crate::engine::Check;
        let facts = |encrypted| Session {
            version: "15".into(),
            version_num: 150_000,
            encrypted: Some(encrypted),
            login: "app".into(),
            schema_exists: true,
        };
        for (mode, encrypted, said) in [
            (
                TlsMode::Prefer,
                true,
                "on, server certificate NOT verified (sslmode=prefer: TLS is tried first, and the server took it)",
            ),
            (
                TlsMode::Prefer,
                false,
                "off: not encrypted (sslmode=prefer: the server refused TLS, so the session is plain",
            ),
            (
                TlsMode::Allow,
                false,
                "off: not encrypted (sslmode=allow: plain is tried first, and the server took it)",
            ),
            (
                TlsMode::Allow,
                true,
                "on, server certificate NOT verified (sslmode=allow: the server refused a plain session",
            ),
        ] {
            let mut findings = session(&facts(encrypted), &mode, "es");
            let tls = |f: &[crate::engine::Finding]| {
                f.iter().find(|f| f.check == Check::Tls).cloned().unwrap()
            };
            let found = tls(&findings);
            assert!(found.ok && found.detail.starts_with(said), "{mode:?}: {}", found.detail);
            plaintext_warning(&mut findings, &mode, Some("db.example.com"));
            assert_eq!(tls(&findings).warning, !encrypted, "{mode:?} {encrypted}");
        }
    }
}
