//! The ADO.NET connection-string syntax both engines accept (SqlClient and
//! Npgsql strings). It lives in [`crate::secret::ado`], beside the other
//! forms, because redaction reads strings with the same parsers the
//! engines use; this module names it for the engines.

pub use crate::secret::ado::{last, pairs, split_ado, AdoError, Pair};
