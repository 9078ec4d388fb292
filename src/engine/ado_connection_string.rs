//! Connection strings of `key=value` pairs separated by `;`, as ADO.NET
//! writes them: SQL Server's SqlClient strings and PostgreSQL's Npgsql
//! strings (what Eventuous's .NET applications hold) share the syntax.

/// A parse failure. Its text names positions and well-known keys only, never
/// a value (a mis-quoted password could otherwise leak into a log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdoError(pub String);

/// Splits an ADO.NET connection string into `(key, value)` pairs by the
/// SqlClient rules: `key=value` pairs separated by `;`; keys are
/// case-insensitive (returned lower-case, inner whitespace collapsed) and `==`
/// in a key stands for `=`; a value may be quoted with `'` or `"` (the quote
/// doubled inside stands for itself) or, as tiberius also accepts, with `{}`
/// (`}}` inside stands for `}`); unquoted values end at `;` and are trimmed.
/// Later duplicates win, as in SqlClient (callers take the last).
pub fn split_ado(raw: &str) -> Result<Vec<(String, String)>, AdoError> {
    Ok(split_ado_marked(raw)?
        .into_iter()
        .map(|(key, value, _)| (key, value))
        .collect())
}

/// [`split_ado`], each pair marked with whether its value was quoted: a
/// "key" right after an unquoted password may be the rest of that password
/// (`Password=ab;cd=ef`), so an error must not name it.
pub fn split_ado_marked(raw: &str) -> Result<Vec<(String, String, bool)>, AdoError> {
    let mut reader = Reader {
        chars: raw.chars().collect(),
        at: 0,
        pair: 0,
    };
    let mut pairs = Vec::new();
    while reader.next_pair() {
        let key = reader.key()?;
        reader.skip_blanks();
        let (value, quoted) = match reader.peek() {
            Some(quote @ ('\'' | '"' | '{')) => (reader.quoted_value(quote)?, true),
            _ => (reader.plain_value(), false),
        };
        pairs.push((key, value, quoted));
    }
    Ok(pairs)
}

/// A cursor over a connection string, one pair at a time; `pair` counts
/// the pairs begun, for errors (which name positions, never values).
struct Reader {
    chars: Vec<char>,
    at: usize,
    pair: usize,
}

impl Reader {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    /// Whether the character after the current one is `c` (a doubled quote
    /// or `==`).
    fn doubled(&self, c: char) -> bool {
        self.chars.get(self.at + 1) == Some(&c)
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
        self.chars[start..self.at]
            .iter()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_by_ado_rules() {
        let pairs =
            split_ado("Server=tcp:db,1433; Database = es ;User  ID=app;Password=x;Encrypt=true;")
                .unwrap();
        assert_eq!(
            pairs,
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
        let marked = split_ado_marked("a=1;b='2';c={3};d=\"4\"").unwrap();
        let quoted: Vec<bool> = marked.iter().map(|p| p.2).collect();
        assert_eq!(quoted, [false, true, true, true]);
    }
}
