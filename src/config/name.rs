//! [`StoreName`]: the one type a store's name has once it is read.

use std::fmt;

/// A store's name: the `store` label of its series, the span of its log
/// lines, the key of its row in the watermark table, a `--store` choice.
/// Made only here, so every one is either a `[[stores]]`/`[[store_sets]]`
/// entry's name (`[a-z0-9_-]{1,63}`), [`StoreName::default`], or a set's
/// store `<set>/<database>` whose database is `[A-Za-z0-9_.-]{1,63}`: never
/// a string a caller assembled.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StoreName(String);

/// The name of the one store the top-level keys define when the file has
/// no `[[stores]]`.
pub const DEFAULT_STORE: &str = "default";

impl StoreName {
    /// An entry's name: `[a-z0-9_-]{1,63}` (a metric label and part of a
    /// path), or why not, in our words.
    pub fn parse(name: &str) -> Result<StoreName, String> {
        let ok = (1..=63).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if ok {
            Ok(StoreName(name.to_string()))
        } else {
            Err("a store's name is 1 to 63 of a-z, 0-9, _ and -".into())
        }
    }

    /// The store of `set` for `database`, `<set>/<database>`, when the
    /// database's name can go into a connection string and a store name as
    /// it is: `[A-Za-z0-9_.-]`, at most 63 characters.
    pub fn in_set(set: &StoreName, database: &str) -> Option<StoreName> {
        let ok = (1..=63).contains(&database.len())
            && database
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        ok.then(|| StoreName(format!("{}/{database}", set.0)))
    }

    /// Whether this is a store of `set` ([`StoreName::in_set`]).
    pub fn is_in(&self, set: &StoreName) -> bool {
        self.0
            .strip_prefix(set.as_str())
            .is_some_and(|rest| rest.starts_with('/'))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for StoreName {
    /// [`DEFAULT_STORE`].
    fn default() -> Self {
        StoreName(DEFAULT_STORE.to_string())
    }
}

impl fmt::Display for StoreName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for StoreName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for StoreName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for StoreName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl serde::Serialize for StoreName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_where_they_are_made() {
        assert_eq!(StoreName::parse("orders-eu_1").unwrap(), "orders-eu_1");
        for bad in ["", "Orders", "a/b", "a b", &"x".repeat(64)] {
            assert!(StoreName::parse(bad).is_err(), "{bad:?}");
        }
        let set = StoreName::parse("tenants").unwrap();
        assert_eq!(
            StoreName::in_set(&set, "Tenant_7.eu").unwrap(),
            "tenants/Tenant_7.eu"
        );
        for bad in ["", "a b", "a;b", "a'b", &"x".repeat(64)] {
            assert!(StoreName::in_set(&set, bad).is_none(), "{bad:?}");
        }
        let store = StoreName::in_set(&set, "t1").unwrap();
        assert!(store.is_in(&set));
        assert!(!store.is_in(&StoreName::parse("tenant").unwrap()));
        assert!(!set.is_in(&set));
        assert_eq!(StoreName::default(), DEFAULT_STORE);
    }
}
