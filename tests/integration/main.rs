//! The integration tests: one binary, one module per area; what they share
//! is the test kit (tests/kit). PostgreSQL tests need the local server
//! (127.0.0.1:5432, or GAP_HEALER_TEST_PG) and fail without it; SQL Server
//! tests are ignored unless a server is given (see the kit's `mssql` module).

mod cli;
mod faults;
mod fleet;
mod hostile;
mod leader;
mod mssql;
mod pg;
mod watermark;
