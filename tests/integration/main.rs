//! The integration tests: one binary, one module per area; what they share
//! is the test kit (tests/kit). What every engine must show is written once,
//! generic over the engine, in `contract` (run as `contract::pg::*` and
//! `contract::mssql::*`); the engines' own modules keep what only they have. PostgreSQL tests use GAP_HEALER_TEST_PG, else
//! the local server (127.0.0.1:5432), else a throwaway cluster the kit starts
//! (see `pg::pg_url`), and fail when none can be had; SQL Server
//! tests are ignored unless a server is given (see the kit's `mssql` module).

mod cli;
mod contract;
mod docs;
mod explorer;
mod faults;
mod fleet;
mod hostile;
mod leader;
mod mssql;
mod passwords;
mod pg;
mod profiles;
mod proof;
mod replicas;
mod sequence;
mod tls;
mod watermark;
