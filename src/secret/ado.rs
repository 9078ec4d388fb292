//! Connection strings of `key=value` pairs separated by `;`, as ADO.NET
//! writes them: SQL Server's SqlClient strings and PostgreSQL's Npgsql
//! strings (what Eventuous's .NET applications hold) share the syntax.
//!
//! Errors name pair positions, never text of the string; [`is_known_key`]
//! lists the keys either driver has, so that redaction can mask any other
//! "key" (the rest of a password holding a `;`, unquoted: `Password=ab;cd=ef`).

use std::ops::Range;

/// A parse failure. Its text names positions only, never a key or value
/// (a mis-quoted password could otherwise leak into a log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdoError(pub String);

/// One `key=value` pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    /// Lower case, inner whitespace collapsed, `==` read as `=`.
    pub key: String,
    /// Unquoted; an unquoted value trimmed.
    pub value: String,
    /// Where the value is written, quotes included (byte offsets).
    pub span: Range<usize>,
    /// Where the whole pair is written, key to value.
    pub whole: Range<usize>,
    pub quoted: bool,
}

/// Splits an ADO.NET connection string into pairs by the SqlClient rules:
/// `key=value` pairs separated by `;`; keys are case-insensitive (returned
/// lower-case, inner whitespace collapsed) and `==` in a key stands for
/// `=`; a value may be quoted with `'` or `"` (the quote doubled inside
/// stands for itself) or, as tiberius also accepts, with `{}` (`}}` inside
/// stands for `}`); unquoted values end at `;` and are trimmed. Later
/// duplicates win, as in SqlClient (callers take the last).
pub fn pairs(raw: &str) -> Result<Vec<Pair>, AdoError> {
    let mut reader = Reader {
        chars: raw.char_indices().collect(),
        len: raw.len(),
        at: 0,
        pair: 0,
        value_end: 0,
    };
    let mut pairs = Vec::new();
    while reader.next_pair() {
        let start = reader.offset();
        let key = reader.key()?;
        reader.skip_blanks();
        let value_start = reader.offset();
        let (value, quoted) = match reader.peek() {
            Some(quote @ ('\'' | '"' | '{')) => (reader.quoted_value(quote)?, true),
            _ => (reader.plain_value(), false),
        };
        let end = reader.value_end;
        pairs.push(Pair {
            key,
            value,
            span: value_start..end,
            whole: start..end,
            quoted,
        });
    }
    Ok(pairs)
}

/// [`pairs`] as `(key, value)`.
pub fn split_ado(raw: &str) -> Result<Vec<(String, String)>, AdoError> {
    Ok(pairs(raw)?.into_iter().map(|p| (p.key, p.value)).collect())
}

/// A cursor over a connection string, one pair at a time; `pair` counts
/// the pairs begun, for errors (which name positions, never values).
struct Reader {
    chars: Vec<(usize, char)>,
    len: usize,
    at: usize,
    pair: usize,
    /// Where the last value read ends (byte offset; a quoted value's
    /// closing quote included).
    value_end: usize,
}

impl Reader {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).map(|&(_, c)| c)
    }

    /// The byte offset of the cursor.
    fn offset(&self) -> usize {
        self.chars.get(self.at).map_or(self.len, |&(i, _)| i)
    }

    /// Whether the character after the current one is `c` (a doubled quote
    /// or `==`).
    fn doubled(&self, c: char) -> bool {
        self.chars.get(self.at + 1).map(|&(_, d)| d) == Some(c)
    }

    /// Skips separators and whitespace; whether another pair begins.
    fn next_pair(&mut self) -> bool {
        while matches!(self.peek(), Some(c) if c == ';' || c.is_whitespace()) {
            self.at += 1;
        }
        let more = self.peek().is_some();
        self.pair += usize::from(more);
        more
    }

    /// Skips whitespace up to the next `;`.
    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(c) if c != ';' && c.is_whitespace()) {
            self.at += 1;
        }
    }

    /// The key, up to a single `=` (`==` is a literal `=`), lower-case with
    /// inner whitespace collapsed.
    fn key(&mut self) -> Result<String, AdoError> {
        let n = self.pair;
        let mut key = String::new();
        loop {
            match self.peek() {
                None | Some(';') => {
                    return Err(AdoError(format!(
                        "pair {n} has no `=` (quote values that contain `;`)"
                    )))
                }
                Some('=') if self.doubled('=') => {
                    key.push('=');
                    self.at += 2;
                }
                Some('=') => {
                    self.at += 1;
                    break;
                }
                Some(c) => {
                    key.push(c);
                    self.at += 1;
                }
            }
        }
        let key = key
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase();
        if key.is_empty() {
            return Err(AdoError(format!("pair {n} has an empty key")));
        }
        Ok(key)
    }

    /// A value quoted with `'`, `"` or `{}` (the closing quote doubled
    /// stands for itself); only whitespace may follow it before `;`.
    fn quoted_value(&mut self, quote: char) -> Result<String, AdoError> {
        let n = self.pair;
        let close = if quote == '{' { '}' } else { quote };
        self.at += 1;
        let mut value = String::new();
        loop {
            match self.peek() {
                None => {
                    return Err(AdoError(format!(
                        "the value of pair {n} has no closing {close}"
                    )))
                }
                Some(c) if c == close && self.doubled(close) => {
                    value.push(close);
                    self.at += 2;
                }
                Some(c) if c == close => {
                    self.at += 1;
                    break;
                }
                Some(c) => {
                    value.push(c);
                    self.at += 1;
                }
            }
        }
        self.value_end = self.offset();
        self.skip_blanks();
        if self.peek().is_some_and(|c| c != ';') {
            return Err(AdoError(format!(
                "unexpected text after the quoted value of pair {n}"
            )));
        }
        Ok(value)
    }

    /// An unquoted value: up to `;`, trimmed.
    fn plain_value(&mut self) -> String {
        let start = self.at;
        while self.peek().is_some_and(|c| c != ';') {
            self.at += 1;
        }
        self.value_end = self.offset();
        self.chars[start..self.at]
            .iter()
            .map(|&(_, c)| c)
            .collect::<String>()
            .trim()
            .to_string()
    }
}

/// The value of the last of `keys` present (later duplicates win).
pub fn last<'a>(pairs: &'a [(String, String)], keys: &[&str]) -> Option<&'a str> {
    pairs
        .iter()
        .rev()
        .find(|(k, _)| keys.contains(&k.as_str()))
        .map(|(_, v)| v.as_str())
}

/// A key as the tables below are matched: lower case, no whitespace.
pub fn normal(key: &str) -> String {
    key.chars()
        .filter(|c| !c.is_whitespace())
        .flat_map(char::to_lowercase)
        .collect()
}

/// Keys whose values are secrets, [`normal`]ised: masked by redaction.
const SECRET_KEYS: &[&str] = &["password", "pwd", "psw", "sslpassword"];

/// Every key Npgsql (8) and SqlClient (Microsoft.Data.SqlClient 5, and
/// tiberius's `TrustServerCertificateCA`) document, [`normal`]ised. Which
/// of them each engine honours is its own table (each checks, in a test,
/// that its keys are here); this list only tells a key from what may be
/// the rest of a password.
const KNOWN_KEYS: &[&str] = &[
    // Npgsql
    "host",
    "server",
    "port",
    "database",
    "db",
    "username",
    "username",
    "userid",
    "user",
    "uid",
    "password",
    "pwd",
    "psw",
    "passfile",
    "applicationname",
    "enlist",
    "searchpath",
    "clientencoding",
    "encoding",
    "timezone",
    "sslmode",
    "trustservercertificate",
    "sslcertificate",
    "sslkey",
    "sslpassword",
    "rootcertificate",
    "checkcertificaterevocation",
    "sslnegotiation",
    "integratedsecurity",
    "kerberosservicename",
    "includerealm",
    "persistsecurityinfo",
    "logparameters",
    "includeerrordetail",
    "channelbinding",
    "pooling",
    "minimumpoolsize",
    "minpoolsize",
    "maximumpoolsize",
    "maxpoolsize",
    "connectionidlelifetime",
    "connectionpruninginterval",
    "connectionlifetime",
    "timeout",
    "commandtimeout",
    "cancellationtimeout",
    "targetsessionattributes",
    "loadbalancehosts",
    "hostrecheckseconds",
    "keepalive",
    "tcpkeepalive",
    "tcpkeepalivetime",
    "tcpkeepaliveinterval",
    "readbuffersize",
    "writebuffersize",
    "socketreceivebuffersize",
    "socketsendbuffersize",
    "maxautoprepare",
    "autoprepareminusages",
    "noresetonclose",
    "options",
    "servercompatibilitymode",
    "arraynullabilitymode",
    "multiplexing",
    "writecoalescingbufferthresholdbytes",
    "loadtablecomposites",
    "internalcommandtimeout",
    "clientcertificate",
    "clientcertificatekey",
    "gssencryptionmode",
    "requireauth",
    // SqlClient
    "datasource",
    "address",
    "addr",
    "networkaddress",
    "initialcatalog",
    "databasename",
    "userid",
    "app",
    "applicationintent",
    "attachdbfilename",
    "extendedproperties",
    "initialfilename",
    "authentication",
    "columnencryptionsetting",
    "connectretrycount",
    "connectretryinterval",
    "connecttimeout",
    "connectiontimeout",
    "currentlanguage",
    "language",
    "encrypt",
    "failoverpartner",
    "failoverpartnerspn",
    "hostnameincertificate",
    "servercertificate",
    "serverspn",
    "ipaddresspreference",
    "loadbalancetimeout",
    "multipleactiveresultsets",
    "multisubnetfailover",
    "networklibrary",
    "network",
    "net",
    "packetsize",
    "poolblockingperiod",
    "replication",
    "transactionbinding",
    "trustservercertificateca",
    "typesystemversion",
    "userinstance",
    "workstationid",
    "wsid",
    "trusted_connection",
    "attestationprotocol",
    "enclaveattestationurl",
];

/// Whether `key` (any spelling) is a key of Npgsql or SqlClient.
pub fn is_known_key(key: &str) -> bool {
    KNOWN_KEYS.contains(&normal(key).as_str())
}

/// Whether `key` (any spelling) holds a secret.
pub fn is_secret_key(key: &str) -> bool {
    SECRET_KEYS.contains(&normal(key).as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_by_ado_rules() {
        let split =
            split_ado("Server=tcp:db,1433; Database = es ;User  ID=app;Password=x;Encrypt=true;")
                .unwrap();
        assert_eq!(
            split,
            vec![
                ("server".into(), "tcp:db,1433".into()),
                ("database".into(), "es".into()),
                ("user id".into(), "app".into()),
                ("password".into(), "x".into()),
                ("encrypt".into(), "true".into()),
            ]
        );
        assert_eq!(split_ado("").unwrap(), vec![]);
        assert_eq!(split_ado(";;  ;").unwrap(), vec![]);
        assert_eq!(
            split_ado("a==b=c").unwrap(),
            vec![("a=b".into(), "c".into())]
        );
        let marked = pairs("a=1;b='2';c={3};d=\"4\"").unwrap();
        let quoted: Vec<bool> = marked.iter().map(|p| p.quoted).collect();
        assert_eq!(quoted, [false, true, true, true]);
    }

    #[test]
    fn spans_cover_the_value_as_written() {
        let raw = "Host=db; Password = 'p;w''d' ;Username=é ";
        let read = pairs(raw).unwrap();
        assert_eq!(&raw[read[1].span.clone()], "'p;w''d'");
        assert_eq!(read[1].value, "p;w'd");
        assert_eq!(&raw[read[1].whole.clone()], "Password = 'p;w''d'");
        assert_eq!(&raw[read[2].span.clone()], "é ");
        assert_eq!(read[2].value, "é");
    }

    #[test]
    fn errors_name_positions_never_text() {
        for (raw, said) in [
            ("Host=db;Zq7Secret", "pair 2 has no `=`"),
            ("Host=db;=Zq7Secret", "pair 2 has an empty key"),
            (
                "Host=db;Password='Zq7Secret",
                "the value of pair 2 has no closing '",
            ),
            (
                "Host=db;Password='Zq7'Secret",
                "unexpected text after the quoted value of pair 2",
            ),
        ] {
            let AdoError(e) = pairs(raw).unwrap_err();
            assert!(e.starts_with(said), "{raw}: {e}");
            assert!(!e.contains("Zq7") && !e.contains("Secret"), "{raw}: {e}");
        }
    }

    #[test]
    fn known_and_secret_keys_ignore_case_and_spaces() {
        assert!(is_known_key("SSL Mode") && is_known_key("user id") && is_known_key("Data Source"));
        assert!(!is_known_key("horse") && !is_known_key("cd"));
        assert!(is_secret_key("PWD") && is_secret_key("SSL Password") && !is_secret_key("user"));
    }
}
