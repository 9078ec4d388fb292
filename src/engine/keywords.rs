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
    let chars: Vec<char> = raw.chars().collect();
    let mut pairs = Vec::new();
    let mut i = 0;
    let mut n = 0;
    loop {
        // Skip separators and whitespace before a key.
        while i < chars.len() && (chars[i] == ';' || chars[i].is_whitespace()) {
            i += 1;
        }
        if i >= chars.len() {
            break;
        }
        n += 1;
        // The key, up to a single `=` (`==` is a literal `=`).
        let mut key = String::new();
        loop {
            match chars.get(i) {
                None | Some(';') => {
                    return Err(AdoError(format!(
                        "pair {n} has no `=` (quote values that contain `;`)"
                    )))
                }
                Some('=') if chars.get(i + 1) == Some(&'=') => {
                    key.push('=');
                    i += 2;
                }
                Some('=') => {
                    i += 1;
                    break;
                }
                Some(&c) => {
                    key.push(c);
                    i += 1;
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
        while i < chars.len() && chars[i] != ';' && chars[i].is_whitespace() {
            i += 1;
        }
        let quoted = matches!(chars.get(i), Some('\'' | '"' | '{'));
        let value = match chars.get(i) {
            Some(&q @ ('\'' | '"' | '{')) => {
                let close = if q == '{' { '}' } else { q };
                i += 1;
                let mut value = String::new();
                loop {
                    match chars.get(i) {
                        None => {
                            return Err(AdoError(format!(
                                "the value of pair {n} has no closing {close}"
                            )))
                        }
                        Some(&c) if c == close && chars.get(i + 1) == Some(&close) => {
                            value.push(close);
                            i += 2;
                        }
                        Some(&c) if c == close => {
                            i += 1;
                            break;
                        }
                        Some(&c) => {
                            value.push(c);
                            i += 1;
                        }
                    }
                }
                while i < chars.len() && chars[i] != ';' && chars[i].is_whitespace() {
                    i += 1;
                }
                if i < chars.len() && chars[i] != ';' {
                    return Err(AdoError(format!(
                        "unexpected text after the quoted value of pair {n}"
                    )));
                }
                value
            }
            _ => {
                let start = i;
                while i < chars.len() && chars[i] != ';' {
                    i += 1;
                }
                chars[start..i]
                    .iter()
                    .collect::<String>()
                    .trim()
                    .to_string()
            }
        };
        pairs.push((key, value, quoted));
    }
    Ok(pairs)
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
