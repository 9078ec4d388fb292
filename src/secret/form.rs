//! Which form a connection string is written in, chosen so that a string
//! libpq reads is always read as libpq reads it.
//!
//! For PostgreSQL ([`postgres`]):
//! 1. a string that begins `postgres://` or `postgresql://` is a URL;
//! 2. a string that libpq's key/value syntax reads with only libpq's keys
//!    is libpq key/value, whatever its values hold: an unquoted `;` is part
//!    of its value (`password=Tr0ub4dor;horse=staple`), never a separator.
//!    One exception, which no working libpq string can meet: an unquoted
//!    value of a key that never holds a `;` (a host name, port, mode or
//!    number: [`libpq::never_holds_semicolon`]) holds one, as in
//!    `host=db;username=app` (libpq would look for a host named
//!    `db;username=app`): the string is Npgsql;
//! 3. a string whose first key is libpq's, but which has a later key that
//!    is not libpq's or a mistake of libpq's syntax, is a libpq string with
//!    that error;
//! 4. anything else is Npgsql (an error is then Npgsql's).
//!
//! What decides is the first key and rule 2's `;`, never what a quoted
//! value holds, so a password written as its form allows never changes
//! how its string is read.
//!
//! SQL Server takes only ADO.NET strings ([`super::ado`]).
//!
//! Every error is a parser's: positions and key names of our own tables.

use super::{ado, libpq, url};

/// A connection string as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    Libpq(Vec<libpq::Pair>),
    Url(Box<url::Url>),
    /// ADO.NET syntax: Npgsql's, or SqlClient's.
    Ado(Vec<ado::Pair>),
}

/// Whether libpq's reading puts a `;` where no working string has one
/// (rule 2's exception).
fn runs_on(pairs: &[libpq::Pair]) -> bool {
    pairs.iter().any(|p| {
        !p.quoted && p.value.contains(';') && libpq::never_holds_semicolon(&p.key, &p.value)
    })
}

/// The string read as Npgsql, or why it cannot be.
fn npgsql(raw: &str) -> Result<Reading, String> {
    ado::pairs(raw)
        .map(Reading::Ado)
        .map_err(|ado::AdoError(e)| format!("read as Npgsql, {e}"))
}

/// Whether the first key, as libpq's syntax reads keys (up to `=` or
/// whitespace), is libpq's; true of a string with no key at all.
fn libpq_first(raw: &str) -> bool {
    let key: String = raw
        .trim_start_matches(|c: char| c.is_ascii_whitespace() || c == '\x0b')
        .chars()
        .take_while(|&c| c != '=' && !c.is_ascii_whitespace() && c != '\x0b')
        .collect();
    key.is_empty() && raw.trim().is_empty() || libpq::keyword(&key).is_some()
}

/// How the PostgreSQL engine reads `raw`, by the rules above. An `Ado`
/// reading is Npgsql's, its keys not yet checked. Which form a string was
/// meant in is told by its first key and the `;` of rule 2's exception,
/// never by what a quoted value holds.
pub fn postgres(raw: &str) -> Result<Reading, String> {
    if url::is_url(raw) {
        return url::parse(raw).map(|u| Reading::Url(Box::new(u)));
    }
    let (pairs, error) = libpq::split_partial(raw);
    if runs_on(&pairs) || !libpq_first(raw) {
        return npgsql(raw);
    }
    match (error, libpq::first_unknown(&pairs)) {
        (None, None) => Ok(Reading::Libpq(pairs)),
        (Some(e), _) | (None, Some(e)) => Err(e),
    }
}

/// How `raw` is read to be shown (redacted), whatever its engine: as
/// [`postgres`] reads it, keys unchecked (a SQL Server string is read as
/// ADO.NET, a string with a wrong key as its form); `None` when its
/// form's syntax does not read it. With it, where the text that was not
/// read begins (a libpq string with a mistake in it: the pairs before the
/// mistake are read, the rest is not shown).
pub fn for_display(raw: &str) -> Option<(Reading, Option<usize>)> {
    if url::is_url(raw) {
        return url::parse(raw)
            .ok()
            .map(|u| (Reading::Url(Box::new(u)), None));
    }
    let (pairs, error) = libpq::split_partial(raw);
    if runs_on(&pairs) || !libpq_first(raw) {
        return ado::pairs(raw)
            .ok()
            .map(|pairs| (Reading::Ado(pairs), None));
    }
    let unread = error.map(|_| pairs.last().map_or(0, |p| p.whole.end));
    Some((Reading::Libpq(pairs), unread))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(raw: &str) -> &'static str {
        match postgres(raw) {
            Ok(Reading::Libpq(_)) => "libpq",
            Ok(Reading::Url(_)) => "url",
            Ok(Reading::Ado(_)) => "npgsql",
            Err(_) => "error",
        }
    }

    #[test]
    fn a_valid_libpq_string_is_libpq_whatever_its_values_hold() {
        for raw in [
            "host=127.0.0.1 user=u dbname=store password=Tr0ub4dor;horse=staple",
            "host=db password=a;b=c;Username=x",
            "password=ab;host=db",
            "host=db user=app;Password=x",
            "host='db;x' port=5",
            "host=/tmp/a;b=c dbname=x",
            "",
            "host=db",
        ] {
            assert_eq!(form(raw), "libpq", "{raw}");
        }
    }

    #[test]
    fn npgsql_urls_and_mistakes() {
        for (raw, want) in [
            ("Host=db;Username=app;Password=x", "npgsql"),
            ("host=db;username=app;password=x", "npgsql"),
            ("host=db;port=5432", "npgsql"),
            ("Server=db;Include Error Detail=true", "npgsql"),
            ("host=db;user id=app;password=x", "npgsql"),
            ("Host=db Username=app", "npgsql"),
            ("postgres://app:pw@db/es", "url"),
            (" postgresql://db", "url"),
            ("host=db passwrd=x", "error"),
            ("host=db password=ab cd=ef", "error"),
            ("host=db password", "error"),
            ("host=db password='abc", "error"),
            ("Host=db;Password='abc", "error"),
            ("host=db;password='abc", "error"),
        ] {
            assert_eq!(form(raw), want, "{raw}: {:?}", postgres(raw));
        }
        let e = postgres("host=db password=Zq7 Secret9x=y").unwrap_err();
        assert!(e.starts_with("an unknown key at pair 3 (of 3)"), "{e}");
        let e = postgres("Host=db;Password='Zq7Secret").unwrap_err();
        assert!(
            e.starts_with("read as Npgsql, the value of pair 2 has no closing"),
            "{e}"
        );
        let e = postgres("a b;Zq7Secret").unwrap_err();
        assert!(e.starts_with("read as Npgsql, pair 1 has no `=`"), "{e}");
        assert!(!e.contains("Zq7"), "{e}");
    }

    #[test]
    fn display_reads_what_the_engines_read_and_the_rest_by_syntax() {
        let libpq = |raw: &str| matches!(for_display(raw), Some((Reading::Libpq(_), _)));
        let ado = |raw: &str| matches!(for_display(raw), Some((Reading::Ado(_), _)));
        assert!(libpq("host=db passwd=Zq7"));
        assert!(libpq("host=db password=a;b"));
        assert!(ado("Server=db;User Id=app;Password=x"));
        assert!(ado("host=db;username=app;password=x"));
        assert!(ado("password=x;server=db;user id=a") || libpq("password=x;server=db;user id=a"));
        assert_eq!(for_display("a b;c"), None);
    }
}
