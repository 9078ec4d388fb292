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
//! 3. a string libpq's syntax reads whose first key is libpq's but a later
//!    one is not is a libpq string with an unknown key (an error);
//! 4. anything else that the ADO.NET syntax reads is Npgsql.
//!
//! SQL Server takes only ADO.NET strings ([`super::ado`]).
//!
//! Every error is a parser's: positions and key names of our own tables.

use super::{ado, libpq, url};

/// A connection string as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    Libpq(Vec<libpq::Pair>),
    Url(url::Url),
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

/// How the PostgreSQL engine reads `raw`, by the rules above. An `Ado`
/// reading is Npgsql's, its keys not yet checked.
pub fn postgres(raw: &str) -> Result<Reading, String> {
    if url::is_url(raw) {
        return url::parse(raw).map(Reading::Url);
    }
    match libpq::split(raw) {
        Ok(pairs) if runs_on(&pairs) => npgsql(raw),
        Ok(pairs) => match libpq::first_unknown(&pairs) {
            None => Ok(Reading::Libpq(pairs)),
            Some(e) if libpq::keyword(&pairs[0].key).is_some() => Err(e),
            Some(_) => npgsql(raw),
        },
        Err(libpq_error) => match ado::pairs(raw) {
            Ok(pairs)
                if raw.contains(';')
                    || pairs
                        .first()
                        .is_some_and(|p| libpq::keyword(&p.key).is_none()) =>
            {
                Ok(Reading::Ado(pairs))
            }
            Err(ado::AdoError(e)) if raw.contains(';') => Err(format!(
                "neither form reads it: as libpq key/value, {libpq_error}; as Npgsql, {e}"
            )),
            _ => Err(libpq_error),
        },
    }
}

/// How `raw` is read to be shown (redacted), whatever its engine: as
/// [`postgres`] reads it where that works, else by whichever syntax reads
/// it, keys unchecked (a SQL Server string, a string with a wrong key);
/// `None` when no syntax does.
pub fn for_display(raw: &str) -> Option<Reading> {
    if url::is_url(raw) {
        return url::parse(raw).ok().map(Reading::Url);
    }
    if let Ok(pairs) = libpq::split(raw) {
        let libpq_first = pairs
            .first()
            .is_none_or(|p| libpq::keyword(&p.key).is_some());
        if libpq_first && !runs_on(&pairs) {
            return Some(Reading::Libpq(pairs));
        }
    }
    if let Ok(pairs) = ado::pairs(raw) {
        return Some(Reading::Ado(pairs));
    }
    libpq::split(raw).ok().map(Reading::Libpq)
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
        assert!(e.starts_with("neither form reads it"), "{e}");
        assert!(!e.contains("Zq7"), "{e}");
    }

    #[test]
    fn display_reads_what_the_engines_read_and_the_rest_by_syntax() {
        let libpq = |raw: &str| matches!(for_display(raw), Some(Reading::Libpq(_)));
        let ado = |raw: &str| matches!(for_display(raw), Some(Reading::Ado(_)));
        assert!(libpq("host=db passwd=Zq7"));
        assert!(libpq("host=db password=a;b"));
        assert!(ado("Server=db;User Id=app;Password=x"));
        assert!(ado("host=db;username=app;password=x"));
        assert!(ado("password=x;server=db;user id=a") || libpq("password=x;server=db;user id=a"));
        assert_eq!(for_display("a b;c"), None);
    }
}
