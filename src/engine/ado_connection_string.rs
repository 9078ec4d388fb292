//! The ADO.NET connection-string syntax both engines accept (SqlClient and
//! Npgsql strings). It lives in [`crate::secret::ado`], beside the other
//! forms, because redaction reads strings with the same parsers the
//! engines use; this module names it for the engines.

pub use crate::secret::ado::{last, pairs, split_ado, AdoError, Pair};

/// [`pairs`] as `(key, value, quoted)`.
pub fn split_ado_marked(raw: &str) -> Result<Vec<(String, String, bool)>, AdoError> {
    Ok(pairs(raw)?
        .into_iter()
        .map(|p| (p.key, p.value, p.quoted))
        .collect())
}
