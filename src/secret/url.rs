//! libpq's URL form, `postgres[ql]://[user[:password]@][host[:port][,...]][/dbname][?key=value&...]`,
//! read as libpq's `conninfo_uri_parse_options` reads it:
//!
//! - the credentials end at the first `@` that comes before any `/`, the
//!   user name at the first `:`; so a password may hold `:`, `?`, `#` or
//!   `&` as they are, and must percent-encode `@` and `/`;
//! - hosts are separated by `,`, each a name or an IPv6 address in
//!   brackets, each with an optional `:port`;
//! - the database name runs from the `/` to the `?`;
//! - query parameters are `key=value` separated by `&` (a second `=` in one
//!   is an error), keys libpq's own, `ssl=true` standing for
//!   `sslmode=require`;
//! - every part is percent-decoded (`%` and two hexadecimal digits; `%00`
//!   is refused).
//!
//! Errors name the part (the password, host 2's port, query parameter 3),
//! never its text.

use std::ops::Range;

use super::libpq;

/// A part of the URL: its value, percent-decoded, and where it is written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Part {
    pub value: String,
    pub span: Range<usize>,
}

/// One query parameter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// The key, percent-decoded (`ssl=true` reads as `sslmode=require`).
    pub key: String,
    pub value: String,
    /// Where the value is written.
    pub span: Range<usize>,
    /// Where the whole `key=value` is written.
    pub whole: Range<usize>,
}

/// A URL's parts, each only when given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Url {
    pub user: Option<Part>,
    pub password: Option<Part>,
    /// libpq's `host`: the hosts separated by `,` (IPv6 without brackets).
    pub hosts: Option<Part>,
    /// libpq's `port`: one per host, separated by `,` (empty for a host
    /// without one).
    pub ports: Option<Part>,
    pub dbname: Option<Part>,
    pub params: Vec<Param>,
    /// Whether the URL holds an `@` other than the one that ends its
    /// credentials: a password or user name that did not percent-encode
    /// an `@` or a `/`, whose rest libpq reads as hosts, a database name
    /// or query parameters (or, rarely, an `@` of a query value).
    pub stray_at: bool,
}

/// The schemes libpq reads as a URL.
const SCHEMES: [&str; 2] = ["postgresql://", "postgres://"];

/// Whether `raw` is a URL (as libpq decides: by its prefix; leading
/// whitespace, which a file may add, is skipped).
pub fn is_url(raw: &str) -> bool {
    SCHEMES.iter().any(|s| raw.trim_start().starts_with(s))
}

/// Percent-decodes `raw[range]`; `what` names the part for an error.
fn decode(raw: &str, range: Range<usize>, what: &str) -> Result<String, String> {
    let bytes = &raw.as_bytes()[range];
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    let hex = |b: Option<&u8>| b.and_then(|&b| (b as char).to_digit(16));
    while let Some(&b) = bytes.get(i) {
        if b != b'%' {
            out.push(b);
            i += 1;
            continue;
        }
        let (Some(hi), Some(lo)) = (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) else {
            return Err(format!(
                "a `%` in the URL's {what} is not followed by two hexadecimal digits \
                 (write a `%` itself as %25)"
            ));
        };
        let decoded = (hi * 16 + lo) as u8;
        if decoded == 0 {
            return Err(format!("the URL's {what} holds %00, which libpq refuses"));
        }
        out.push(decoded);
        i += 3;
    }
    String::from_utf8(out).map_err(|_| format!("the URL's {what} is not UTF-8 once decoded"))
}

fn part(raw: &str, range: Range<usize>, what: &str) -> Result<Part, String> {
    Ok(Part {
        value: decode(raw, range.clone(), what)?,
        span: range,
    })
}

/// Reads a URL ([`is_url`] must hold). Spans are offsets into `raw`;
/// whitespace around the URL is not part of it.
pub fn parse(raw: &str) -> Result<Url, String> {
    let raw = raw.trim_end();
    let lead = raw.len() - raw.trim_start().len();
    let start = SCHEMES
        .iter()
        .find(|s| raw[lead..].starts_with(*s))
        .map(|s| lead + s.len())
        .ok_or_else(|| "not a postgres:// or postgresql:// URL".to_string())?;
    let bytes = raw.as_bytes();
    let mut url = Url::default();
    let mut at = start;
    while bytes.get(at).is_some_and(|&b| b != b'@' && b != b'/') {
        at += 1;
    }
    let mut p = start;
    if bytes.get(at) == Some(&b'@') {
        let colon = raw[start..at].find(':').map(|c| start + c);
        let user_end = colon.unwrap_or(at);
        if user_end > start {
            url.user = Some(part(raw, start..user_end, "user name")?);
        }
        if let Some(colon) = colon.filter(|c| c + 1 < at) {
            url.password = Some(part(raw, colon + 1..at, "password")?);
        }
        p = at + 1;
    }
    let credentials = usize::from(bytes.get(at) == Some(&b'@'));
    url.stray_at = raw.matches('@').count() > credentials;
    let (hosts, ports, next) = netlocs(raw, p)?;
    p = next;
    if !hosts.value.is_empty() {
        url.hosts = Some(hosts);
    }
    if !ports.value.is_empty() {
        url.ports = Some(ports);
    }
    let mut ended = bytes.get(p).copied();
    if ended == Some(b'/') {
        let db_start = p + 1;
        p = db_start;
        while bytes.get(p).is_some_and(|&b| b != b'?') {
            p += 1;
        }
        if p > db_start {
            url.dbname = Some(part(raw, db_start..p, "database name")?);
        }
        ended = bytes.get(p).copied();
    }
    if ended.is_some() {
        url.params = params(raw, p + 1)?;
    }
    Ok(url)
}

/// The hosts and ports from `from` on, as libpq joins them (one `,` between
/// hosts, one between ports), and where they end.
fn netlocs(raw: &str, from: usize) -> Result<(Part, Part, usize), String> {
    let bytes = raw.as_bytes();
    let mut p = from;
    let (mut hosts, mut ports) = (String::new(), String::new());
    let mut n = 0;
    loop {
        n += 1;
        let what = format!("host {n}");
        if bytes.get(p) == Some(&b'[') {
            let h = p + 1;
            p = h;
            while bytes.get(p).is_some_and(|&b| b != b']') {
                p += 1;
            }
            if p >= bytes.len() {
                return Err(format!("the URL's {what} opens `[` and never closes it"));
            }
            if p == h {
                return Err(format!("the URL's {what} is an empty IPv6 address, `[]`"));
            }
            hosts.push_str(&decode(raw, h..p, &what)?);
            p += 1;
            if bytes
                .get(p)
                .is_some_and(|b| !matches!(b, b':' | b'/' | b'?' | b','))
            {
                return Err(format!(
                    "the URL's {what} goes on after its `]` (expected `:`, `/`, `?` or `,`)"
                ));
            }
        } else {
            let h = p;
            while bytes
                .get(p)
                .is_some_and(|b| !matches!(b, b':' | b'/' | b'?' | b','))
            {
                p += 1;
            }
            hosts.push_str(&decode(raw, h..p, &what)?);
        }
        if bytes.get(p) == Some(&b':') {
            let port = p + 1;
            p = port;
            while bytes
                .get(p)
                .is_some_and(|b| !matches!(b, b'/' | b'?' | b','))
            {
                p += 1;
            }
            ports.push_str(&decode(raw, port..p, &format!("port of host {n}"))?);
        }
        if bytes.get(p) != Some(&b',') {
            break;
        }
        p += 1;
        hosts.push(',');
        ports.push(',');
    }
    let span = from..p;
    Ok((
        Part {
            value: hosts,
            span: span.clone(),
        },
        Part { value: ports, span },
        p,
    ))
}

/// The query parameters from `from` on.
fn params(raw: &str, from: usize) -> Result<Vec<Param>, String> {
    let bytes = raw.as_bytes();
    let mut out = Vec::new();
    let mut p = from;
    while p < bytes.len() {
        let n = out.len() + 1;
        let start = p;
        let mut eq = None;
        while let Some(&b) = bytes.get(p) {
            match b {
                b'&' => break,
                b'=' if eq.is_some() => {
                    return Err(format!(
                        "query parameter {n} of the URL has a second `=` (write it %3D)"
                    ))
                }
                b'=' => eq = Some(p),
                _ => {}
            }
            p += 1;
        }
        let end = p;
        p += 1;
        let Some(eq) = eq else {
            return Err(format!("query parameter {n} of the URL has no `=`"));
        };
        let what = format!("query parameter {n}");
        let mut key = decode(raw, start..eq, &what)?;
        let mut value = decode(raw, eq + 1..end, &what)?;
        if key == "ssl" && value == "true" {
            key = "sslmode".into();
            value = "require".into();
        }
        out.push(Param {
            key,
            value,
            span: eq + 1..end,
            whole: start..end,
        });
    }
    Ok(out)
}

/// The first query parameter whose key libpq does not have, as an error
/// that does not name it; `None` when all are libpq's.
pub fn first_unknown(url: &Url) -> Option<String> {
    let at = url
        .params
        .iter()
        .position(|p| libpq::keyword(&p.key).is_none())?;
    let after_password = at > 0 && url.params[at - 1].key == "password";
    let hint = if after_password {
        ", right after password: a password holding `&` must percent-encode it (%26)"
    } else {
        ""
    };
    Some(format!(
        "query parameter {} (of {}) of the URL is not a libpq key{hint}; libpq's keys, \
         case-sensitive, are {}",
        at + 1,
        url.params.len(),
        libpq::KEYWORDS.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(p: &Option<Part>) -> Option<&str> {
        p.as_ref().map(|p| p.value.as_str())
    }

    #[test]
    fn parts_are_read_as_libpq_reads_them() {
        let raw = "postgresql://app:p%40ss:w?rd#x@db1:5433,[::1],db3:7/es%20db?sslmode=require&application_name=a%26b&ssl=true";
        let url = parse(raw).unwrap();
        assert_eq!(value(&url.user), Some("app"));
        // `:`, `?` and `#` are the password's own; `@` is percent-encoded.
        assert_eq!(value(&url.password), Some("p@ss:w?rd#x"));
        assert_eq!(
            &raw[url.password.as_ref().unwrap().span.clone()],
            "p%40ss:w?rd#x"
        );
        assert_eq!(value(&url.hosts), Some("db1,::1,db3"));
        assert_eq!(value(&url.ports), Some("5433,,7"));
        assert_eq!(value(&url.dbname), Some("es db"));
        let params: Vec<(&str, &str)> = url
            .params
            .iter()
            .map(|p| (p.key.as_str(), p.value.as_str()))
            .collect();
        assert_eq!(
            params,
            [
                ("sslmode", "require"),
                ("application_name", "a&b"),
                ("sslmode", "require")
            ]
        );
        let url = parse("postgres://db").unwrap();
        assert_eq!((value(&url.hosts), value(&url.user)), (Some("db"), None));
        let url = parse("postgres:///es?host=%2Fvar%2Frun%2Fpostgresql").unwrap();
        assert_eq!((value(&url.hosts), value(&url.dbname)), (None, Some("es")));
        assert_eq!(url.params[0].value, "/var/run/postgresql");
        assert_eq!(parse("postgres://").unwrap(), Url::default());
        // `user:` gives an empty password: none, as libpq stores none.
        assert_eq!(parse("postgres://u:@db").unwrap().password, None);
        assert!(is_url("postgres://x") && !is_url(" host=db") && !is_url("Postgres://x"));
    }

    #[test]
    fn errors_name_the_part_never_its_text() {
        for (raw, said) in [
            (
                "postgres://u:Zq7%zzSecret@db",
                "a `%` in the URL's password",
            ),
            (
                "postgres://u:Zq7%00Secret@db",
                "the URL's password holds %00",
            ),
            ("postgres://[::1/db", "the URL's host 1 opens `[`"),
            (
                "postgres://a,[]/db",
                "the URL's host 2 is an empty IPv6 address",
            ),
            (
                "postgres://[::1]Zq7Secret/db",
                "the URL's host 1 goes on after its `]`",
            ),
            (
                "postgres://db/es?sslmode",
                "query parameter 1 of the URL has no `=`",
            ),
            (
                "postgres://db/es?a=b&options=-c%20x=Zq7Secret",
                "query parameter 2 of the URL has a second `=`",
            ),
            ("postgres://db:5%zz/es", "a `%` in the URL's port of host 1"),
        ] {
            let e = parse(raw).unwrap_err();
            assert!(e.starts_with(said), "{raw}: {e}");
            assert!(!e.contains("Zq7") && !e.contains("Secret"), "{raw}: {e}");
        }
        let url = parse("postgres://db/es?password=Zq7&Secret9x=y").unwrap();
        let e = first_unknown(&url).unwrap();
        assert!(
            e.starts_with(
                "query parameter 2 (of 2) of the URL is not a libpq key, right after password"
            ),
            "{e}"
        );
        assert!(!e.contains("Secret9x"), "{e}");
        assert_eq!(
            first_unknown(&parse("postgres://db/?sslmode=require").unwrap()),
            None
        );
    }
}
