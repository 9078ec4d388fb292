//! A configuration problem, and every problem found, reported together.

use std::fmt;

use super::read::Given;

/// One configuration problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub key: String,
    /// The offending value as shown to the user (`None` when missing or secret).
    pub value: Option<String>,
    /// "config file x.toml", "environment variable GAP_HEALER_X", "flag --x", "default".
    pub origin: String,
    pub message: String,
    /// The store whose key it is, when the file lists `[[stores]]`.
    pub store: Option<String>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(store) = &self.store {
            write!(f, "[store {store}] ")?;
        }
        match &self.value {
            Some(v) => write!(
                f,
                "{} = {:?} (from {}): {}",
                self.key, v, self.origin, self.message
            ),
            None => write!(f, "{} (from {}): {}", self.key, self.origin, self.message),
        }
    }
}

/// Every problem found, reported together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "invalid configuration ({n} problem{}):",
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  - {p}")?;
        }
        Ok(())
    }
}

/// A problem of a key every store reads (a bad flag) is said once.
pub(super) fn said_once(problems: Vec<Problem>) -> Vec<Problem> {
    let mut unique: Vec<Problem> = Vec::new();
    for p in problems {
        let same = |q: &Problem| {
            q.key == p.key && q.value == p.value && q.origin == p.origin && q.message == p.message
        };
        if !unique.iter().any(same) {
            unique.push(p);
        }
    }
    unique
}

/// The problems found in one scope, the daemon's keys or one store's, each
/// naming the store.
pub(super) struct Problems {
    /// The store named in problems (`None`: the daemon's keys, or the one
    /// default store).
    store: Option<String>,
    pub(super) list: Vec<Problem>,
}

impl Problems {
    pub(super) fn new(store: Option<&str>) -> Self {
        Problems {
            store: store.map(String::from),
            list: Vec::new(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// A problem of `key` that shows no value (missing, secret, or a rule's).
    pub(super) fn say(&mut self, key: &str, origin: &str, message: impl Into<String>) {
        self.list.push(Problem {
            key: key.into(),
            value: None,
            origin: origin.into(),
            message: message.into(),
            store: self.store.clone(),
        });
    }

    /// A problem of the text `given` for a key.
    pub(super) fn refuse_text(&mut self, given: &Given, message: impl Into<String>) {
        self.list.push(Problem {
            key: given.key.into(),
            value: Some(given.text.clone()),
            origin: given.origin.clone(),
            message: message.into(),
            store: self.store.clone(),
        });
    }

    /// A problem of a key a layer set, named with its origin, its value
    /// not shown (a rule's: the key is not read here, or contradicts another).
    pub(super) fn refuse(&mut self, given: &Given, message: impl Into<String>) {
        self.say(given.key, &given.origin, message);
    }
}
