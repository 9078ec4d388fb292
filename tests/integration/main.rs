//! The integration tests: one binary, one module per area, shared support.
//! PostgreSQL tests need the local server (127.0.0.1:5432, or
//! GAP_HEALER_TEST_PG) and fail without it; SQL Server tests are ignored
//! unless a server is given (see mssql_support.rs).

mod cli;
mod faults;
mod hostile;
mod leader;
mod mssql;
mod mssql_support;
mod pg;
mod support;
