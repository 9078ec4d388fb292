//! gap-healer's test kit: every scenario helper that more than one of the
//! integration tests (`tests/integration/`), the chaos run (`tests/chaos/`)
//! and the bench harness (`benches/harness/`) needs, written once.
//!
//! - [`pg`]: the local PostgreSQL (or `GAP_HEALER_TEST_PG`), one schema per
//!   test built from `tests/fixtures/eventuous_postgres.sql` ([`pg::Store`]),
//!   and throwaway clusters of a test's own ([`pg::Throwaway`]);
//! - [`mssql`]: SQL Server (`GAP_HEALER_TEST_MSSQL` or a testcontainers
//!   server), one database per test ([`mssql::TestDb`]);
//!
//! Every schema, database and login a test makes through the kit is taken
//! away by a guard when its value goes out of scope, also when the test fails
//! or panics ([`pg::Guard`], [`mssql::TestDb`]): a test need not drop them.
//! - [`eventuous`]: appends the way Eventuous writes them, on both engines;
//! - [`ledger`]: seed 003's ledger-core table and its appends;
//! - [`sqlstreamstore`]: SQLStreamStore's PostgreSQL tables and its
//!   appends, statement by statement;
//! - [`subscriber`]: Eventuous 0.17's all-stream subscription rules;
//! - [`bin`]: the real `gap-healer` binary, run to completion or in the
//!   background;
//! - [`logs`]: the healers' JSON logs read back as leadership and fills;
//! - [`engine`]: the one place that builds engines and in-process healers;
//! - [`wait`]: polling until something holds, retrying until it works.
//!
//! It is a dev-only crate of the workspace (`publish = false`): a library
//! rather than a module each test binary includes, so it is compiled once
//! for every test and bench binary, declares what it depends on, and needs no
//! `allow(dead_code)` for the parts a binary does not use.

pub mod bin;
mod cleanup;
pub mod engine;
pub mod eventuous;
pub mod ledger;
pub mod logs;
pub mod mssql;
pub mod pg;
pub mod sqlstreamstore;
pub mod subscriber;
pub mod wait;

/// 12345678 -> "12,345,678".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
