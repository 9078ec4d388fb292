//! SQL names as values that can only be made valid: [`Ident`] (a schema,
//! table or column) and [`QualifiedName`] (`schema.table`).
//!
//! Schema, table and column names are the one kind of configured text the
//! engines splice into statements instead of binding. Each is checked once,
//! where it is made ([`Ident::parse`]), against a character set that holds
//! no quote, bracket, dot, space or comment, so that no statement renderer
//! has to trust a comment saying "validated".
//!
//! Rendering into SQL text goes through the methods named for their engine
//! and quoting ([`Ident::pg`], [`Ident::pg_quoted`], [`Ident::tsql`], ...),
//! which only the engines' statement renderers call; there is no `Display`.
//! [`Ident::as_str`] is the name as text, for messages, log fields and bind
//! parameters (catalog look-ups), never for statement text.

use std::fmt;

/// Why a text is not an [`Ident`]; the configuration's wording.
pub const NOT_AN_IDENTIFIER: &str =
    "expected a plain identifier: a letter or _, then letters, digits or _, at most 128 characters";

/// A plain SQL identifier: `[A-Za-z_][A-Za-z0-9_]*`, at most 128 characters.
///
/// Invariant: every value was checked by [`Ident::parse`] (or derived from
/// one that was, by [`Ident::to_lowercase`]), so it is safe to splice into a
/// statement quoted or not.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ident(String);

impl Ident {
    /// Checks `text` against the identifier rule.
    pub fn parse(text: &str) -> Result<Ident, String> {
        let mut chars = text.chars();
        let first = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if first && text.len() <= 128 && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            Ok(Ident(text.to_string()))
        } else {
            Err(NOT_AN_IDENTIFIER.into())
        }
    }

    /// The name as text: for messages, log fields and bind parameters.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The same name in lower case (what PostgreSQL folds an unquoted name to).
    pub fn to_lowercase(&self) -> Ident {
        Ident(self.0.to_ascii_lowercase())
    }

    /// PostgreSQL, unquoted: folded to lower case by the server, as the
    /// Eventuous statements have always named the schema.
    pub fn pg(&self) -> &str {
        &self.0
    }

    /// PostgreSQL, double-quoted, so that a name that is also a keyword
    /// works (the table profiles' tables and columns, lower case already).
    pub fn pg_quoted(&self) -> String {
        format!("\"{}\"", self.0)
    }

    /// T-SQL, bracketed (`[name]`); no `]` to double, by the invariant.
    pub fn tsql(&self) -> String {
        format!("[{}]", self.0)
    }

    /// T-SQL, unbracketed: inside an `N'..'` literal naming an object, or
    /// where the statements have always named it bare.
    pub fn tsql_bare(&self) -> &str {
        &self.0
    }
}

/// Shows the name in quotes, like a string: never SQL text.
impl fmt::Debug for Ident {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// `schema.table`: a table named with its schema, both [`Ident`]s.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct QualifiedName {
    pub schema: Ident,
    pub table: Ident,
}

impl QualifiedName {
    pub fn new(schema: Ident, table: Ident) -> Self {
        QualifiedName { schema, table }
    }

    /// Checks `schema.table`: one dot, an [`Ident`] either side.
    pub fn parse(text: &str) -> Result<QualifiedName, String> {
        let (schema, table) = text
            .split_once('.')
            .ok_or("expected schema.table, e.g. gap_healer.watermarks")?;
        Ok(QualifiedName::new(
            Ident::parse(schema)?,
            Ident::parse(table)?,
        ))
    }

    /// The same name in lower case.
    pub fn to_lowercase(&self) -> QualifiedName {
        QualifiedName::new(self.schema.to_lowercase(), self.table.to_lowercase())
    }

    /// `schema.table` as text, as the catalog and messages name it (and as
    /// a bind parameter, e.g. a `regclass`).
    pub fn name(&self) -> String {
        format!("{}.{}", self.schema.0, self.table.0)
    }

    /// PostgreSQL, unquoted: `schema.table`.
    pub fn pg(&self) -> String {
        self.name()
    }

    /// PostgreSQL, quoted: `"schema"."table"`.
    pub fn pg_quoted(&self) -> String {
        format!("{}.{}", self.schema.pg_quoted(), self.table.pg_quoted())
    }

    /// T-SQL, bracketed: `[schema].[table]`.
    pub fn tsql(&self) -> String {
        format!("{}.{}", self.schema.tsql(), self.table.tsql())
    }

    /// T-SQL, unbracketed: `schema.table` (inside `OBJECT_ID(N'..')`, say).
    pub fn tsql_bare(&self) -> String {
        self.name()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn renderings() {
        let name = QualifiedName::new(
            Ident::parse("Bank").unwrap(),
            Ident::parse("events").unwrap(),
        );
        assert_eq!(name.name(), "Bank.events");
        assert_eq!(name.pg_quoted(), "\"Bank\".\"events\"");
        assert_eq!(name.tsql(), "[Bank].[events]");
        assert_eq!(name.schema.to_lowercase().pg(), "bank");
        assert_eq!(format!("{:?}", name.table), "\"events\"");
    }

    proptest! {
        /// Nothing that can end a quoted name, a literal or a statement
        /// survives the rule.
        #[test]
        fn a_valid_name_holds_nothing_that_ends_a_quote(s in "\\PC{0,140}") {
            if let Ok(ident) = Ident::parse(&s) {
                prop_assert!(!ident.as_str().contains(['"', ']', '\'', '.', ';', '-', ' ']));
                prop_assert!(!ident.as_str().is_empty() && ident.as_str().len() <= 128);
            }
        }
    }
}
