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

/// Parses a libpq key/value string or URL. Errors never contain a value.
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
    let mut config = Config::from_str(&rest)
        .map_err(|e| format!("invalid PostgreSQL connection string: {e}"))?;
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

/// Removes `sslmode` and `sslrootcert` from a key/value string or a URL's
/// query, returning the rest for tokio-postgres and the two values.
fn take_tls_options(raw: &str) -> Result<(String, TlsOptions), String> {
    let mut options = TlsOptions::default();
    if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
        let Some((base, query)) = raw.split_once('?') else {
            return Ok((raw.to_string(), options));
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
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
    for (key, raw_value, value) in key_values(raw)? {
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
