//! SQL Server engine (placeholder: replaced by the SQL Server work, issue 3).
