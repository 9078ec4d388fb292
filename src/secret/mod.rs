//! Connection strings carry passwords; this module keeps them out of every
//! `Debug`, `Display`, log line, metric and error message.
//!
//! It also reads them, one parser per form: [`libpq`] key/value, [`url`],
//! and [`ado`] (Npgsql's and SqlClient's `;`-separated pairs), with
//! [`form`] choosing among them. The parsers' errors are built from our
//! own words, key names from our own tables and positions (`pair 3 (of
//! 5)`), never from text of the string, so no message needs a password
//! masked out of it. Redaction reads the string with the same parsers and
//! masks values where they are written.
//!
//! Architecture invariant: the only way to read the raw string is
//! [`ConnectionString::expose`], and its callers hand the result to a
//! parser here, whose values go straight to a database driver.

use std::fmt;

pub mod ado;
pub mod form;
pub mod libpq;
pub mod url;

use form::Reading;

const MASK: &str = "***";

/// What [`redact`] shows of a string no syntax reads.
const UNREADABLE: &str = "*** (not shown: no connection-string syntax reads it)";

/// What [`ConnectionString::scrub`] shows instead of a message that
/// repeats the whole connection string.
const WITHHELD: &str = "(the driver's message is not shown: it repeats the connection string)";

/// A host name (or socket directory) as a message may show it, or `None`
/// when it is not one (a name no server has, such as one holding `;` or
/// `=`: better not shown than shown with a piece of something else).
pub fn shown_host(host: &str) -> Option<&str> {
    let plain = |c: char| c.is_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '%' | '/');
    (!host.is_empty() && host.len() <= 255 && host.chars().all(plain)).then_some(host)
}

#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionString(String);

impl ConnectionString {
    pub fn new(raw: impl Into<String>) -> Self {
        ConnectionString(raw.into())
    }

    /// The raw string, password included. Only for handing to a parser
    /// here, whose values go to a driver.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.trim().is_empty()
    }

    /// The string with every secret replaced by `***` ([`redact`]).
    pub fn redacted(&self) -> String {
        redact(&self.0)
    }

    /// A driver's or server's message as it may be shown: unchanged, or,
    /// when it repeats this whole connection string (a driver that echoes
    /// its input), a fixed sentence instead. Never a masked copy: masking
    /// the pieces of a password that a message holds garbles the message
    /// and tells the reader which pieces they were. The drivers are only
    /// ever handed parsed values, and PostgreSQL and SQL Server never
    /// repeat a password, so this is a backstop, not the guarantee.
    pub fn scrub(&self, message: &str) -> String {
        let raw = self.0.trim();
        if raw.chars().count() >= 8 && message.contains(raw) {
            WITHHELD.to_string()
        } else {
            message.to_string()
        }
    }
}

impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConnectionString({:?})", self.redacted())
    }
}

impl fmt::Display for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Whether a value that is no secret may be shown: one holding `=` or `;`
/// may have swallowed the pair after it (`user=app;password=x`, read by
/// libpq as one user name), so it is masked too.
fn plain_value(value: &str) -> bool {
    !value.contains(['=', ';'])
}

/// `raw` with each of `masked` (byte ranges, in any order, not
/// overlapping) replaced by `***`.
fn mask(raw: &str, mut masked: Vec<std::ops::Range<usize>>) -> String {
    masked.sort_by_key(|r| r.start);
    let mut out = String::with_capacity(raw.len());
    let mut at = 0;
    for range in masked {
        if range.start < at {
            continue;
        }
        out.push_str(&raw[at..range.start]);
        out.push_str(MASK);
        at = range.end;
    }
    out.push_str(&raw[at..]);
    out
}

/// `raw` as it may be shown: read by the same parsers the engines use
/// ([`form::for_display`]), every secret value masked where it is written
/// (`password=***`, `Pwd=***`, `postgres://user:***@...`), and so is every
/// pair whose key neither libpq, Npgsql nor SqlClient has (it may be the
/// rest of a password holding a space or a `;`) and every value holding
/// `=` or `;`. A string no syntax reads is not shown at all.
pub fn redact(raw: &str) -> String {
    let masked =
        match form::for_display(raw) {
            None => return UNREADABLE.to_string(),
            Some(Reading::Libpq(pairs)) => pairs
                .into_iter()
                .filter_map(|p| match libpq::keyword(&p.key) {
                    None => Some(p.whole),
                    Some(k) if libpq::SECRET_KEYWORDS.contains(&k) => Some(p.span),
                    Some(_) => (!plain_value(&p.value)).then_some(p.span),
                })
                .collect(),
            Some(Reading::Ado(pairs)) => pairs
                .into_iter()
                .filter_map(|p| {
                    if !ado::is_known_key(&p.key) {
                        Some(p.whole)
                    } else if ado::is_secret_key(&p.key) || !plain_value(&p.value) {
                        Some(p.span)
                    } else {
                        None
                    }
                })
                .collect(),
            Some(Reading::Url(url)) => {
                let parts = [&url.user, &url.hosts, &url.dbname];
                let mut masked: Vec<_> = parts
                    .into_iter()
                    .flatten()
                    .filter(|p| !plain_value(&p.value))
                    .map(|p| p.span.clone())
                    .collect();
                masked.extend(url.password.map(|p| p.span));
                masked.extend(url.params.into_iter().filter_map(|p| {
                    match libpq::keyword(&p.key) {
                        None => Some(p.whole),
                        Some(k) if libpq::SECRET_KEYWORDS.contains(&k) => Some(p.span),
                        Some(_) => (!plain_value(&p.value)).then_some(p.span),
                    }
                }));
                masked
            }
        };
    mask(raw, masked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn redacts_ado_net() {
        let cs = ConnectionString::new(
            "Server=tcp:db,1433;Database=es;User Id=app;Password=s3cr3t;Encrypt=true",
        );
        assert_eq!(
            cs.redacted(),
            "Server=tcp:db,1433;Database=es;User Id=app;Password=***;Encrypt=true"
        );
        assert!(!format!("{cs:?}").contains("s3cr3t"));
        assert!(!format!("{cs}").contains("s3cr3t"));
    }

    #[test]
    fn redacts_quoted_values_with_separators() {
        for (raw, secret) in [
            ("Server=db;Password='a;b=c''d';User Id=x", "a;b=c''d"),
            ("Server=db;Pwd=\"x;y\";Database=z", "x;y"),
            ("Server=db;PASSWORD = {p;w=d}}};Database=z", "p;w=d}"),
            ("Server=db;Password=pässwörd☃;Database=z", "pässwörd☃"),
        ] {
            let out = redact(raw);
            assert!(!out.contains(secret), "{raw} -> {out}");
            assert!(
                out.contains("Database") || out.contains("User Id"),
                "{raw} -> {out}"
            );
        }
    }

    #[test]
    fn redacts_libpq_and_url() {
        assert_eq!(
            redact("host=127.0.0.1 user=postgres password=hunter2 dbname=test"),
            "host=127.0.0.1 user=postgres password=*** dbname=test"
        );
        assert_eq!(
            redact("postgres://app:hunter2@db:5432/es?sslmode=require&password=x"),
            "postgres://app:***@db:5432/es?sslmode=require&password=***"
        );
        assert_eq!(redact("postgres://app@db/es"), "postgres://app@db/es");
        assert_eq!(redact("host=db user=app"), "host=db user=app");
    }

    #[test]
    fn only_plain_host_names_are_shown() {
        for host in [
            "db",
            "db-1.example.net",
            "10.0.0.1",
            "::1",
            "fe80::1%eth0",
            "/run/postgresql",
            "événements.example",
        ] {
            assert_eq!(shown_host(host), Some(host));
        }
        for host in ["", "db password=***", "db;x=y", "db'", "a\tb", "h{x}"] {
            assert_eq!(shown_host(host), None, "{host}");
        }
    }

    #[test]
    fn key_must_be_whole() {
        // `NoPassword=` is no key either driver has: masked whole, as the
        // rest of a password would be; the real one masked too.
        assert_eq!(redact("NoPassword=1;Password=x"), "***;Password=***");
        assert_eq!(
            redact("Server=db;Password=ab;cd=ef;Database=es"),
            "Server=db;Password=***;***;Database=es"
        );
    }

    /// Issue 27: masking replaced every occurrence of a password's piece in
    /// a message (`U***rname`), garbling it and saying what the piece was.
    /// A message is shown as it is, or, when it repeats the whole string,
    /// not at all.
    #[test]
    fn scrub_never_masks_pieces() {
        let cs = ConnectionString::new("Host=db;Username=app;Password=se");
        let msg = "check the user and password (Username, User ID)";
        assert_eq!(cs.scrub(msg), msg);
        let cs = ConnectionString::new("Server=db;Password=hunter2;User Id=sa");
        let echoed = "login failed for sa on Server=db;Password=hunter2;User Id=sa";
        assert_eq!(cs.scrub(echoed), WITHHELD);
    }

    #[test]
    fn redaction_masks_values_that_may_hold_another_pair() {
        for (raw, shown) in [
            ("host=db passwd=Zq7Secret", "host=db ***"),
            (
                "host=db password=Zq7 Secret9x=y",
                "host=db password=*** ***",
            ),
            ("host=db user=app;password=Zq7Secret", "host=db user=***"),
            (
                "host=db;username=app;password=Zq7Secret",
                "host=db;username=app;password=***",
            ),
            ("Host=db password=Zq7Secret;Port=5", "Host=***;Port=5"),
            (
                "postgres://u:Zq7Secret@db/es?sslmode=require&Zq7Secret=x",
                "postgres://u:***@db/es?sslmode=require&***",
            ),
            (
                "postgres://u@db/es?password=Zq7Secret",
                "postgres://u@db/es?password=***",
            ),
            ("a b;Zq7Secret", UNREADABLE),
        ] {
            assert_eq!(redact(raw), shown, "{raw}");
        }
    }

    proptest! {
        #[test]
        fn password_never_survives(pw in "[^\\x00]{3,24}", prefix in "(Server=db;|host=db )", quote in 0..3u8) {
            prop_assume!(!pw.trim().is_empty());
            let value = match quote {
                0 if !pw.contains([';', ' ', '\'', '"', '{', '\t', '\n', '\r']) => pw.clone(),
                1 => format!("'{}'", pw.replace('\'', "''")),
                _ => format!("{{{}}}", pw.replace('}', "}}")),
            };
            let raw = format!("{prefix}Password={value};User Id=app");
            let cs = ConnectionString::new(raw.clone());
            let shown = format!("{cs} {cs:?} {}", cs.scrub(&raw));
            prop_assert!(!shown.contains(&value), "{} -> {}", raw, shown);
        }
    }
}
