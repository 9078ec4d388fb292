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

/// What [`redact`] shows of a URL after its scheme when it has an `@`
/// other than its credentials' ([`url::Url::stray_at`]).
const STRAY_AT: &str = "*** (not shown: it has an `@` that does not end its credentials, so a \
                        password may not have percent-encoded an `@` or a `/`)";

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
/// rest of a password holding a space or a `;`) and every value that may
/// have swallowed a piece of one. A string no syntax reads is not shown.
pub fn redact(raw: &str) -> String {
    let Some((reading, unread)) = form::for_display(raw) else {
        return UNREADABLE.to_string();
    };
    let mut masked: Vec<_> = match reading {
        Reading::Libpq(pairs) => pairs.into_iter().filter_map(libpq_mask).collect(),
        Reading::Ado(pairs) => pairs.into_iter().filter_map(ado_mask).collect(),
        Reading::Url(url) if url.stray_at => {
            let scheme = raw.find("://").map_or(0, |i| i + 3);
            return format!("{}{STRAY_AT}", &raw[..scheme]);
        }
        Reading::Url(url) => url_masks(*url),
    };
    masked.extend(unread.map(|from| from..raw.len()));
    mask(raw, masked)
}

/// What of a libpq pair is masked: the whole pair when libpq has no such
/// key, the value of a secret or of a value holding `=` or `;`.
fn libpq_mask(p: libpq::Pair) -> Option<std::ops::Range<usize>> {
    match libpq::keyword(&p.key) {
        None => Some(p.whole),
        Some(k) if libpq::SECRET_KEYWORDS.contains(&k) => Some(p.span),
        Some(_) => (!plain_value(&p.value)).then_some(p.span),
    }
}

/// What of an ADO.NET pair is masked, as [`libpq_mask`].
fn ado_mask(p: ado::Pair) -> Option<std::ops::Range<usize>> {
    if !ado::is_known_key(&p.key) {
        Some(p.whole)
    } else if ado::is_secret_key(&p.key) || !plain_value(&p.value) {
        Some(p.span)
    } else {
        None
    }
}

/// What of a URL is masked: the password, query parameters as
/// [`libpq_mask`], and the hosts, ports, user and database name unless
/// each is plainly one. An `@` or `/` that a password did not
/// percent-encode ends the credentials early, and the password's rest
/// reads as hosts, ports or a database name.
fn url_masks(url: url::Url) -> Vec<std::ops::Range<usize>> {
    let name = |v: &str| {
        v.chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '.' | '-'))
    };
    let hosts_plain = url
        .hosts
        .iter()
        .flat_map(|h| h.value.split(','))
        .all(|h| h.is_empty() || shown_host(h).is_some());
    let ports_plain = url
        .ports
        .iter()
        .flat_map(|p| p.value.split(','))
        .all(|p| p.chars().all(|c| c.is_ascii_digit()));
    let mut masked = Vec::new();
    for (part, plain) in [
        (&url.user, url.user.as_ref().is_none_or(|p| name(&p.value))),
        (
            &url.dbname,
            url.dbname.as_ref().is_none_or(|p| name(&p.value)),
        ),
        (&url.hosts, hosts_plain && ports_plain),
        (&url.ports, hosts_plain && ports_plain),
    ] {
        if let Some(p) = part.as_ref().filter(|_| !plain) {
            masked.push(p.span.clone());
        }
    }
    masked.extend(url.password.map(|p| p.span));
    masked.extend(url.params.into_iter().filter_map(|p| {
        libpq_mask(libpq::Pair {
            key: p.key,
            value: p.value,
            span: p.span,
            whole: p.whole,
            quoted: false,
        })
    }));
    masked
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
            // A libpq string with a mistake: what follows it is not shown.
            ("host=db password Zq7Secret", "host=db***"),
            ("host=db port=5 password='Zq7Secret", "host=db port=5***"),
            // A password's unencoded `@` or `/` ends the credentials early.
            (
                "postgres://u:Zq7@Secret@db/es",
                &format!("postgres://{STRAY_AT}"),
            ),
            (
                "postgres://u:Zq7/Secret@db/es",
                &format!("postgres://{STRAY_AT}"),
            ),
            ("postgres://Zq7:Secret/db/es", "postgres://***/***"),
            (
                "postgres://app@db1:5432,[::1]:7/es",
                "postgres://app@db1:5432,[::1]:7/es",
            ),
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
