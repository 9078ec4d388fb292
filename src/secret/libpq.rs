//! libpq's keyword/value form (`host=db port=5432 password='a b'`), read
//! as libpq's own `conninfo_parse` reads it:
//!
//! - pairs are separated by whitespace (C's `isspace`: space, tab, newline,
//!   vertical tab, form feed, carriage return), and whitespace may surround
//!   the `=`;
//! - a value is either single-quoted, with `\'` and `\\` (a backslash
//!   before any character stands for that character), or unquoted, ending
//!   at the first whitespace that no backslash escapes: so `;`, `=`, `"`
//!   and a `'` that does not open the value are ordinary characters of it
//!   (`password=Tr0ub4dor;horse=staple` is one password);
//! - a closing quote ends the value even without whitespace after it;
//! - keys are case-sensitive and must be libpq's ([`KEYWORDS`]); a later
//!   duplicate wins.
//!
//! Errors name pair positions and keys of [`KEYWORDS`], never text of the
//! string: any key that is not libpq's may be a piece of a password
//! (`password=ab cd=ef`, a password holding a space, unquoted).

use std::ops::Range;

/// One `key=value` pair as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    /// The key as written: shown only when [`keyword`] knows it (and then in
    /// the table's spelling).
    pub key: String,
    /// The value, quotes and escapes removed.
    pub value: String,
    /// Where the value is written, quotes included (byte offsets).
    pub span: Range<usize>,
    /// Where the whole pair is written, key to value.
    pub whole: Range<usize>,
    pub quoted: bool,
}

/// libpq's keywords (PostgreSQL 18's `PQconninfoOptions`, with
/// `requiressl`, which older servers' libpq took) and `keepalives_retries`,
/// the name tokio-postgres gives libpq's `keepalives_count` (accepted
/// before this table existed). Which of them gap-healer honours, ignores or
/// refuses is the engine's table; every one of them makes a string libpq.
pub const KEYWORDS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "require_auth",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "keepalives_retries",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "sslnegotiation",
    "requiressl",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslkeylogfile",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "min_protocol_version",
    "max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "scram_client_key",
    "scram_server_key",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
    "oauth_issuer",
    "oauth_client_id",
    "oauth_client_secret",
    "oauth_scope",
];

/// Keys whose values are secrets: masked by redaction.
pub const SECRET_KEYWORDS: &[&str] = &[
    "password",
    "sslpassword",
    "oauth_client_secret",
    "scram_client_key",
    "scram_server_key",
];

/// `key` as [`KEYWORDS`] spells it, or `None` when libpq has no such key.
pub fn keyword(key: &str) -> Option<&'static str> {
    KEYWORDS.iter().copied().find(|k| *k == key)
}

/// Whether a value of `key` can never hold a `;`: host names (not socket
/// directories), addresses, ports, numbers and modes. A `;` in one means
/// the string was written for Npgsql (`host=db;username=app`): libpq would
/// read a host `db;username=app`, which no server has.
pub fn never_holds_semicolon(key: &str, value: &str) -> bool {
    match key {
        "host" => !value
            .split(',')
            .any(|h| h.starts_with('/') || h.starts_with('@')),
        "hostaddr"
        | "port"
        | "sslmode"
        | "sslnegotiation"
        | "requiressl"
        | "connect_timeout"
        | "keepalives"
        | "keepalives_idle"
        | "keepalives_interval"
        | "keepalives_count"
        | "keepalives_retries"
        | "tcp_user_timeout"
        | "target_session_attrs"
        | "channel_binding"
        | "load_balance_hosts"
        | "gssencmode"
        | "sslcompression"
        | "sslsni"
        | "sslcertmode"
        | "ssl_min_protocol_version"
        | "ssl_max_protocol_version"
        | "min_protocol_version"
        | "max_protocol_version"
        | "gssdelegation"
        | "replication" => true,
        _ => false,
    }
}

/// C's `isspace` in the C locale.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// A cursor over the string's bytes (every delimiter is ASCII, so a value
/// cut at one stays valid UTF-8).
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_spaces(&mut self) {
        while self.peek().is_some_and(is_space) {
            self.at += 1;
        }
    }

    /// A quoted value, the opening quote at the cursor: `\` takes the next
    /// byte as it is, `'` ends it. `None` when the string ends first.
    fn quoted(&mut self) -> Option<Vec<u8>> {
        let mut value = Vec::new();
        self.at += 1;
        loop {
            match self.peek()? {
                b'\\' => {
                    self.at += 1;
                    if let Some(c) = self.peek() {
                        value.push(c);
                        self.at += 1;
                    }
                }
                b'\'' => {
                    self.at += 1;
                    return Some(value);
                }
                c => {
                    value.push(c);
                    self.at += 1;
                }
            }
        }
    }

    /// An unquoted value: up to whitespace, `\` taking the next byte as it
    /// is (an escaped space too).
    fn plain(&mut self) -> Vec<u8> {
        let mut value = Vec::new();
        while let Some(c) = self.peek() {
            if is_space(c) {
                break;
            }
            self.at += 1;
            if c == b'\\' {
                if let Some(next) = self.peek() {
                    value.push(next);
                    self.at += 1;
                }
            } else {
                value.push(c);
            }
        }
        value
    }
}

/// The pairs of a key/value string, by libpq's syntax alone (any key).
/// Errors name the pair, never its text.
pub fn split(raw: &str) -> Result<Vec<Pair>, String> {
    match split_partial(raw) {
        (pairs, None) => Ok(pairs),
        (_, Some(e)) => Err(e),
    }
}

/// [`split`], with the pairs read before an error: what the string began
/// as tells which form it was written in ([`super::form`]).
pub fn split_partial(raw: &str) -> (Vec<Pair>, Option<String>) {
    let mut c = Cursor {
        bytes: raw.as_bytes(),
        at: 0,
    };
    let mut pairs = Vec::new();
    loop {
        c.skip_spaces();
        let Some(_) = c.peek() else {
            return (pairs, None);
        };
        match next_pair(raw, &mut c, pairs.len() + 1) {
            Ok(pair) => pairs.push(pair),
            Err(e) => return (pairs, Some(e)),
        }
    }
}

/// Pair `n`, from the cursor on.
fn next_pair(raw: &str, c: &mut Cursor<'_>, n: usize) -> Result<Pair, String> {
    let key_start = c.at;
    while c.peek().is_some_and(|b| b != b'=' && !is_space(b)) {
        c.at += 1;
    }
    let key = raw[key_start..c.at].to_string();
    c.skip_spaces();
    if c.peek() != Some(b'=') {
        return Err(format!(
            "pair {n} has no `=` after its key (libpq key/value pairs are separated by \
             spaces: quote a value that holds one, key='a b')"
        ));
    }
    c.at += 1;
    c.skip_spaces();
    let value_start = c.at;
    let quoted = c.peek() == Some(b'\'');
    let value = if quoted {
        c.quoted().ok_or_else(|| {
            format!(
                "the quoted value of pair {n} has no closing `'` (a `'` inside a quoted \
                 value is written \\')"
            )
        })?
    } else {
        c.plain()
    };
    Ok(Pair {
        key,
        value: String::from_utf8(value)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
        span: value_start..c.at,
        whole: key_start..c.at,
        quoted,
    })
}

/// The refusal of a string whose pair `n` (of `of`) has a key libpq does
/// not have, not naming it (it may be a piece of a password). `after_password`:
/// it follows an unquoted password, so a password holding a space is the
/// likely cause.
pub fn unknown_key(n: usize, of: usize, after_password: bool) -> String {
    let hint = if after_password {
        ", right after an unquoted password: a password holding a space must be quoted \
         (password='...', with \\' and \\\\ inside)"
    } else {
        ""
    };
    format!(
        "an unknown key at pair {n} (of {of}){hint}; libpq's keys, case-sensitive, are {}",
        KEYWORDS.join(", ")
    )
}

/// The first pair whose key libpq does not have, as [`unknown_key`] says it.
pub fn first_unknown(pairs: &[Pair]) -> Option<String> {
    let at = pairs.iter().position(|p| keyword(&p.key).is_none())?;
    let after_password = at > 0 && pairs[at - 1].key == "password" && !pairs[at - 1].quoted;
    Some(unknown_key(at + 1, pairs.len(), after_password))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(raw: &str) -> Vec<(String, String)> {
        split(raw)
            .unwrap()
            .into_iter()
            .map(|p| (p.key, p.value))
            .collect()
    }

    fn kv(k: &str, v: &str) -> (String, String) {
        (k.to_string(), v.to_string())
    }

    /// The string: psql logs in with it, the password holding `;`
    /// and `=`.
    #[test]
    fn an_unquoted_value_runs_to_whitespace() {
        assert_eq!(
            read("host=127.0.0.1 user=u dbname=store password=Tr0ub4dor;horse=staple"),
            [
                kv("host", "127.0.0.1"),
                kv("user", "u"),
                kv("dbname", "store"),
                kv("password", "Tr0ub4dor;horse=staple"),
            ]
        );
        assert_eq!(read("password=a'b\"c"), [kv("password", "a'b\"c")]);
        assert_eq!(read("password=a\\ b\\\\c"), [kv("password", "a b\\c")]);
    }

    #[test]
    fn quoting_and_whitespace_are_libpqs() {
        assert_eq!(
            read("  host = db\tpassword = 'a b\\'c\\\\d'  dbname=x "),
            [
                kv("host", "db"),
                kv("password", "a b'c\\d"),
                kv("dbname", "x")
            ]
        );
        // The closing quote ends the value: the next pair may follow at once.
        assert_eq!(read("a='x'b=c"), [kv("a", "x"), kv("b", "c")]);
        // An empty value, quoted or at the end.
        assert_eq!(
            read("password='' dbname="),
            [kv("password", ""), kv("dbname", "")]
        );
        // After `=`, whitespace is skipped: `host= port=5` is host "port=5".
        assert_eq!(read("host= port=5"), [kv("host", "port=5")]);
        assert_eq!(read("password=пароль☃"), [kv("password", "пароль☃")]);
        assert_eq!(read(""), []);
    }

    #[test]
    fn spans_cover_the_value_as_written() {
        let raw = "host=db password='a b' user=u";
        let pairs = split(raw).unwrap();
        assert_eq!(&raw[pairs[1].span.clone()], "'a b'");
        assert_eq!(&raw[pairs[1].whole.clone()], "password='a b'");
        assert!(pairs[1].quoted && !pairs[0].quoted);
    }

    #[test]
    fn errors_name_the_pair_never_its_text() {
        let e = split("host=db Zq7Secret").unwrap_err();
        assert!(e.starts_with("pair 2 has no `=`"), "{e}");
        let e = split("host=db password='Zq7Secret").unwrap_err();
        assert!(
            e.starts_with("the quoted value of pair 2 has no closing"),
            "{e}"
        );
        assert!(split("password='x\\'").is_err());
        let pairs = split("host=db password=Zq7 Secret9x=y").unwrap();
        let e = first_unknown(&pairs).unwrap();
        assert!(
            e.starts_with("an unknown key at pair 3 (of 3), right after an unquoted password"),
            "{e}"
        );
        assert!(!e.contains("Zq7") && !e.contains("Secret9x"), "{e}");
        assert_eq!(
            first_unknown(&split("host=db sslmode=require").unwrap()),
            None
        );
        // Keys are case-sensitive, as in libpq.
        assert!(first_unknown(&split("Host=db").unwrap()).is_some());
    }
}
